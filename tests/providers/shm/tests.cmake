# SPDX-License-Identifier: Apache-2.0
# The shm transport between real processes (fork), loaded through the raw
# ABI like the core does, plus a point-to-point benchmark (not a test).
if(NOT TARGET wia-provider-shm)
  return()
endif()

wia_add_unit_test(shm_transport
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_shm_transport.cpp
  LIBS wia::plugin_api Threads::Threads ${CMAKE_DL_LIBS}
  TIMEOUT 300)
add_dependencies(test_shm_transport wia-provider-shm)
# Under ThreadSanitizer (scripts/ci-tsan.sh), less the 0 B - 64 MiB case:
# bytes crossing between processes are beyond TSan (one process's threads),
# and that case took 94 of the suite's 147 s under it.
if(WIA_TSAN)
  add_test(NAME shm_transport_tsan COMMAND test_shm_transport "--test-case-exclude=*0 B to 64 MiB*")
  set_tests_properties(shm_transport_tsan PROPERTIES TIMEOUT 300 ENVIRONMENT "WIA_LOG_LEVEL=warn")
  wia_tsan_test(test_shm_transport shm_transport_tsan)
endif()

# wia-shm-bench: bandwidth and latency of each data path against memcpy
# (docs/transport-shm.md). Built with the tests, never run by ctest.
add_executable(wia-shm-bench ${CMAKE_CURRENT_LIST_DIR}/shm_bench.cpp)
target_link_libraries(wia-shm-bench PRIVATE wia::plugin_api wia_warnings Threads::Threads ${CMAKE_DL_LIBS})
target_compile_definitions(wia-shm-bench PRIVATE WIA_SHM_PROVIDER_DIR="${WIA_PROVIDER_OUTPUT_DIR}")
add_dependencies(wia-shm-bench wia-provider-shm)

# The provider's allocation-free per-tag queues against std::map + deque.
wia_add_unit_test(shm_queues
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_shm_queues.cpp
  TIMEOUT 120)
