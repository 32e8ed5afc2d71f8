# SPDX-License-Identifier: Apache-2.0
# Redundancy's shard arithmetic after shrinks (core/src/comm/redundancy_shards.cpp).
wia_add_unit_test(redundancy_shards SOURCES ${CMAKE_CURRENT_LIST_DIR}/redundancy_shards_test.cpp
                  LIBS wia_core_internal TIMEOUT 60)
