# SPDX-License-Identifier: Apache-2.0
# The tcp transport provider between forked processes over real loopback
# sockets, loaded through the core's registry. Like the loader test, the
# registry and what it calls are compiled in directly, so this binary does
# not depend on the rest of the core being buildable. The test includes the
# provider's wire header to play hostile clients.
if(NOT TARGET wia-provider-tcp)
  return()
endif()
wia_add_unit_test(provider_tcp
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/tcp_test.cpp
    ${PROJECT_SOURCE_DIR}/core/src/provider/registry.cpp
    ${PROJECT_SOURCE_DIR}/core/src/provider/abi.cpp
    ${PROJECT_SOURCE_DIR}/core/src/provider/abi_v1.cpp
    ${PROJECT_SOURCE_DIR}/core/src/provider/host_services.cpp
    ${PROJECT_SOURCE_DIR}/core/src/config/config.cpp
    ${PROJECT_SOURCE_DIR}/core/src/config/schema.cpp
    ${PROJECT_SOURCE_DIR}/core/src/config/value.cpp
    ${PROJECT_SOURCE_DIR}/core/src/common/log.cpp
    ${PROJECT_SOURCE_DIR}/core/src/common/error.cpp
  LIBS yaml-cpp fmt::fmt spdlog::spdlog wia::plugin_api Threads::Threads ${CMAKE_DL_LIBS}
  TIMEOUT 300)
target_include_directories(test_provider_tcp PRIVATE
  ${PROJECT_SOURCE_DIR}/core/src ${PROJECT_SOURCE_DIR}/providers/tcp)
target_compile_definitions(test_provider_tcp PRIVATE
  WIA_PROVIDER_SUBDIR="${WIA_PROVIDER_SUBDIR}"
  WIA_INSTALL_LIBDIR="${CMAKE_INSTALL_LIBDIR}")
target_link_libraries(test_provider_tcp PRIVATE wia_provider_common)  # config/value.cpp
add_dependencies(test_provider_tcp wia-provider-tcp)
