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
