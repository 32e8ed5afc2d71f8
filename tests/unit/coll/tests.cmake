# SPDX-License-Identifier: Apache-2.0
# Collectives (core/coll): the schedules, run through the simulated-network
# executor (tests/support), and the collectives through the public C API.
#
# The CI run covers a sampled matrix in well under 30 s. The full matrix
# (every algorithm x nranks 1..8 x counts x int32/float32/bfloat16 x every
# op x in/out of place, plus all 10 dtypes on a sample) runs with
#   WIA_FULL_MATRIX=1 ./build/<dir>/bin/test_coll
wia_add_unit_test(coll
  SOURCES
    ${CMAKE_CURRENT_LIST_DIR}/schedule_test.cpp
    ${CMAKE_CURRENT_LIST_DIR}/matrix_test.cpp
    ${CMAKE_CURRENT_LIST_DIR}/sim_executor_test.cpp
    ${CMAKE_CURRENT_LIST_DIR}/hierarchical_test.cpp
    ${CMAKE_CURRENT_LIST_DIR}/reference.cpp
  LIBS wia_test_support
  TIMEOUT 600)

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
# The in-process engine's fused reduce-and-push, forced on for every size
# (it is taken by default only for results above half an L2), with its
# outputs streamed around the caches (by default only for buffers above
# half the last-level cache).
wia_add_filtered_test(collectives_fused_push test_collectives
  "all-reduce blocks of many slices*")
set_tests_properties(collectives_fused_push PROPERTIES TIMEOUT 300
  ENVIRONMENT "WIA_LOG_LEVEL=warn;WIA_TEST_FUSE_MIN_BYTES=0;WIA_TEST_STREAM_MIN_BYTES=0")
wia_tsan_test(test_collectives collectives_fused_push)
# The same with plain stores (the fused path below the streaming threshold).
wia_add_filtered_test(collectives_fused_push_cached test_collectives
  "all-reduce blocks of many slices*")
set_tests_properties(collectives_fused_push_cached PROPERTIES TIMEOUT 300
  ENVIRONMENT "WIA_LOG_LEVEL=warn;WIA_TEST_FUSE_MIN_BYTES=0;WIA_TEST_STREAM_MIN_BYTES=18446744073709551615")
# Under ThreadSanitizer (scripts/ci-tsan.sh): the inline engine on the host
# provider's streams, and the device engine (its completion thread) without
# the algorithm matrix, which the inline run covers and which took 200 s
# of its 290 under TSan: every algorithm meets the same threads.
wia_tsan_test(test_collectives collectives)
if(WIA_TSAN)
  add_test(NAME collectives_device_engine_tsan COMMAND test_collectives
    "--test-case-exclude=*device engine:*,every collective x algorithm x rank count*")
  set_tests_properties(collectives_device_engine_tsan PROPERTIES TIMEOUT 600
    ENVIRONMENT "WIA_LOG_LEVEL=warn;WIA_COLLECTIVES_ENGINE=device")
  wia_tsan_test(test_collectives collectives_device_engine_tsan)
endif()
