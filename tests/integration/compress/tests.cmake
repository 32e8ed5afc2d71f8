# SPDX-License-Identifier: Apache-2.0
# Compressed and sparse all-reduce across real processes over the shm and
# tcp transport providers (2 and 4 ranks), through the public C API.
wia_add_unit_test(compress_processes SOURCES ${CMAKE_CURRENT_LIST_DIR}/compress_processes_test.cpp
  LIBS wia::core TIMEOUT 300)
wia_test_loads_providers(test_compress_processes)
