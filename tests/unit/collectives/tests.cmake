# SPDX-License-Identifier: Apache-2.0
# Collectives through the public C API on in-process host devices: every
# collective x algorithm x rank count, against an independent reference.
# WIA_FULL_MATRIX=1 widens the sample to every dtype x op x size.
wia_add_unit_test(collectives SOURCES ${CMAKE_CURRENT_LIST_DIR}/collectives_test.cpp
                  LIBS wia::core wia_cpu_kernels TIMEOUT 600)
if(TARGET wia-provider-host)
  add_dependencies(test_collectives wia-provider-host)
endif()

# The same suite through the device engine (provider copies and reductions
# on internal streams, engine/device_exec.hpp), forced on host devices, and
# once more with peer access off so every message is staged through host
# memory. Point-to-point stays in the core (it is not a schedule).
add_test(NAME collectives_device_engine COMMAND test_collectives
  "--test-case-exclude=*device engine:*")
set_tests_properties(collectives_device_engine PROPERTIES TIMEOUT 600
  ENVIRONMENT "WIA_LOG_LEVEL=warn;WIA_COLLECTIVES_ENGINE=device")
add_test(NAME collectives_device_engine_staged COMMAND test_collectives
  "--test-case-exclude=*point-to-point*,*device engine:*")
set_tests_properties(collectives_device_engine_staged PROPERTIES TIMEOUT 600
  ENVIRONMENT "WIA_LOG_LEVEL=warn;WIA_COLLECTIVES_ENGINE=device;WIA_HOST_PEER_ACCESS=false")
