# SPDX-License-Identifier: Apache-2.0
# A libfabric double that claims FI_HMEM on top of the real libfabric
# (README.md in this folder), built as
# <build>/fake-hmem-fabric/libwia-fake-hmem-fabric.so and never installed:
# only a test that names it (ofi.library, WIA_OFI_LIBRARY) loads it. Its
# users are in tests/providers/ofi/tests.cmake.
find_package(PkgConfig QUIET)
if(PkgConfig_FOUND)
  pkg_check_modules(WIA_FAKE_HMEM_LIBFABRIC QUIET libfabric>=1.17)
endif()
if(NOT WIA_FAKE_HMEM_LIBFABRIC_FOUND)
  return()
endif()
set(WIA_FAKE_HMEM_FABRIC_DIR ${PROJECT_BINARY_DIR}/fake-hmem-fabric)
add_library(wia_fake_hmem_fabric SHARED ${CMAKE_CURRENT_LIST_DIR}/fake_hmem_fabric.cpp)
set_target_properties(wia_fake_hmem_fabric PROPERTIES
  OUTPUT_NAME wia-fake-hmem-fabric PREFIX "lib" SUFFIX ".so"
  LIBRARY_OUTPUT_DIRECTORY ${WIA_FAKE_HMEM_FABRIC_DIR}
  CXX_VISIBILITY_PRESET hidden VISIBILITY_INLINES_HIDDEN ON)
# Not libfabric.so.1: the double opens the real library by that name, which
# must not find the double itself.
target_link_options(wia_fake_hmem_fabric PRIVATE -Wl,-soname,libwia-fake-hmem-fabric.so
  -Wl,--no-undefined)
target_include_directories(wia_fake_hmem_fabric SYSTEM PRIVATE ${WIA_FAKE_HMEM_LIBFABRIC_INCLUDE_DIRS})
target_link_libraries(wia_fake_hmem_fabric PRIVATE wia_warnings ${CMAKE_DL_LIBS})
set(WIA_FAKE_HMEM_FABRIC_FILE ${WIA_FAKE_HMEM_FABRIC_DIR}/libwia-fake-hmem-fabric.so)
