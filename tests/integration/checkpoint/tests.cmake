# SPDX-License-Identifier: Apache-2.0
# Checkpoints against real crashes: trainer processes SIGKILLed at random
# moments of their saves, verified by fresh processes (docs/checkpoints.md).
wia_add_unit_test(checkpoint_crash SOURCES ${CMAKE_CURRENT_LIST_DIR}/checkpoint_crash_test.cpp
  LIBS wia::core TIMEOUT 600)
if(TARGET wia-provider-host)
  add_dependencies(test_checkpoint_crash wia-provider-host)
endif()
