# SPDX-License-Identifier: Apache-2.0
# The CPU reduction kernels (core/kernels) against a scalar reference.
wia_add_unit_test(cpu_kernels
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_cpu_kernels.cpp ${CMAKE_CURRENT_LIST_DIR}/test_cpu_copy.cpp
  LIBS wia_cpu_kernels)
