# SPDX-License-Identifier: Apache-2.0
# The provider loader against real shared objects (tests/providers and the
# host provider). The loader and what it calls are compiled in directly, so
# this binary does not depend on the rest of the core being buildable.
set(WIA_LOADER_TEST_SOURCES
  ${CMAKE_CURRENT_LIST_DIR}/loader_test.cpp
  ${CMAKE_CURRENT_LIST_DIR}/abi_v1_test.cpp
  ${PROJECT_SOURCE_DIR}/core/src/provider/registry.cpp
  ${PROJECT_SOURCE_DIR}/core/src/provider/abi.cpp
  ${PROJECT_SOURCE_DIR}/core/src/provider/abi_v1.cpp
  ${PROJECT_SOURCE_DIR}/core/src/provider/host_services.cpp
  ${PROJECT_SOURCE_DIR}/core/src/config/config.cpp
  ${PROJECT_SOURCE_DIR}/core/src/config/schema.cpp
  ${PROJECT_SOURCE_DIR}/core/src/config/value.cpp
  ${PROJECT_SOURCE_DIR}/core/src/common/log.cpp
  ${PROJECT_SOURCE_DIR}/core/src/common/error.cpp)
wia_add_unit_test(loader
  SOURCES ${WIA_LOADER_TEST_SOURCES}
  LIBS yaml-cpp fmt::fmt spdlog::spdlog wia::plugin_api Threads::Threads ${CMAKE_DL_LIBS})
target_include_directories(test_loader PRIVATE ${PROJECT_SOURCE_DIR}/core/src)
target_link_libraries(test_loader PRIVATE wia_provider_common)  # config/value.cpp
# The binary lands in <build>/bin, so the loader's "next to the core" rule
# resolves to <build>/<libdir>/wia/providers, as for an installed tool.
target_compile_definitions(test_loader PRIVATE
  WIA_PROVIDER_SUBDIR="${WIA_PROVIDER_SUBDIR}"
  WIA_INSTALL_LIBDIR="${CMAKE_INSTALL_LIBDIR}")
add_dependencies(test_loader wia_test_providers)
if(TARGET wia-provider-host)
  add_dependencies(test_loader wia-provider-host)
endif()
