# SPDX-License-Identifier: Apache-2.0
# Placement (spec 6.2.1): brute-force comparison and node-local stages.
wia_add_unit_test(placement SOURCES ${CMAKE_CURRENT_LIST_DIR}/placement_test.cpp
  LIBS wia_core_internal TIMEOUT 300)
