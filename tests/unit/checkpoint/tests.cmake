# SPDX-License-Identifier: Apache-2.0
# Checkpoints (spec 6.9) through the public C API: round trips, damaged
# files, bad input, full and read-only disks (docs/checkpoints.md).
wia_add_unit_test(checkpoint_api SOURCES ${CMAKE_CURRENT_LIST_DIR}/checkpoint_api_test.cpp
  LIBS wia::core TIMEOUT 300)
if(TARGET wia-provider-host)
  add_dependencies(test_checkpoint_api wia-provider-host)
endif()
