# SPDX-License-Identifier: Apache-2.0
# Transport selection rules over the example topologies (docs/selector.md).
wia_add_unit_test(selector SOURCES ${CMAKE_CURRENT_LIST_DIR}/selector_test.cpp
  LIBS wia_core_internal TIMEOUT 120)
