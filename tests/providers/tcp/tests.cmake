# SPDX-License-Identifier: Apache-2.0
# The tcp transport provider between forked processes over real loopback
# sockets, loaded through the core's registry (the base archive: the
# registry and what it calls, not the whole runtime). The test includes the
# provider's wire header to play hostile clients.
if(NOT TARGET wia-provider-tcp)
  return()
endif()
wia_add_unit_test(provider_tcp
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/tcp_test.cpp ${CMAKE_CURRENT_LIST_DIR}/tcp_close_test.cpp
  LIBS wia_core_base
  TIMEOUT 300)
target_include_directories(test_provider_tcp PRIVATE ${PROJECT_SOURCE_DIR}/providers/tcp)
add_dependencies(test_provider_tcp wia-provider-tcp)
# Under ThreadSanitizer (scripts/ci-tsan.sh), less the sizes case: its
# 64 MiB transfers check bytes between processes, beyond TSan (one
# process's threads), and took 34 of the suite's 71 s under it.
if(WIA_TSAN)
  add_test(NAME provider_tcp_tsan COMMAND test_provider_tcp "--test-case-exclude=tcp sizes:*")
  set_tests_properties(provider_tcp_tsan PROPERTIES TIMEOUT 300 ENVIRONMENT "WIA_LOG_LEVEL=warn")
  wia_tsan_test(test_provider_tcp provider_tcp_tsan)
endif()
