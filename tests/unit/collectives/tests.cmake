# SPDX-License-Identifier: Apache-2.0
# Collectives through the public C API on in-process host devices: every
# collective x algorithm x rank count, against an independent reference.
# WIA_FULL_MATRIX=1 widens the sample to every dtype x op x size.
wia_add_unit_test(collectives SOURCES ${CMAKE_CURRENT_LIST_DIR}/collectives_test.cpp
                  LIBS wia::core wia_cpu_kernels TIMEOUT 600)
if(TARGET wia-provider-host)
  add_dependencies(test_collectives wia-provider-host)
endif()
