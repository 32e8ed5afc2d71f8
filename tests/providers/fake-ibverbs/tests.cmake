# SPDX-License-Identifier: Apache-2.0
# The libibverbs test double (README.md in this folder), built as
# <build>/fake-ibverbs/libibverbs.so.1 with rdma-core's symbol versions and
# never installed: only a test that names it (WIA_VERBS_LIBRARY) loads it.
# Its own test is below; the provider's are in tests/providers/verbs/tests.cmake.
find_path(WIA_FAKE_IBVERBS_INCLUDE_DIR infiniband/verbs.h)
if(NOT WIA_FAKE_IBVERBS_INCLUDE_DIR)
  return()
endif()
set(WIA_FAKE_IBVERBS_DIR ${PROJECT_BINARY_DIR}/fake-ibverbs)
add_library(wia_fake_ibverbs SHARED ${CMAKE_CURRENT_LIST_DIR}/fake_ibverbs.cpp)
set_target_properties(wia_fake_ibverbs PROPERTIES
  OUTPUT_NAME ibverbs PREFIX "lib" SUFFIX ".so.1"
  LIBRARY_OUTPUT_DIRECTORY ${WIA_FAKE_IBVERBS_DIR}
  CXX_VISIBILITY_PRESET hidden VISIBILITY_INLINES_HIDDEN ON)
target_include_directories(wia_fake_ibverbs SYSTEM PRIVATE ${WIA_FAKE_IBVERBS_INCLUDE_DIR})
target_link_libraries(wia_fake_ibverbs PRIVATE wia_warnings Threads::Threads)
set(_map ${CMAKE_CURRENT_LIST_DIR}/fake_ibverbs.map)
target_link_options(wia_fake_ibverbs PRIVATE -Wl,-soname,libibverbs.so.1 -Wl,--no-undefined
  -Wl,--version-script=${_map})
set_property(TARGET wia_fake_ibverbs APPEND PROPERTY LINK_DEPENDS ${_map})
set(WIA_FAKE_IBVERBS_FILE ${WIA_FAKE_IBVERBS_DIR}/libibverbs.so.1)

# The same double without ibv_reg_dmabuf_mr (rdma-core older than 34), for
# the provider's "device memory refused" path:
# <build>/fake-ibverbs-nodmabuf/libibverbs.so.1.
set(WIA_FAKE_IBVERBS_NODMABUF_DIR ${PROJECT_BINARY_DIR}/fake-ibverbs-nodmabuf)
add_library(wia_fake_ibverbs_nodmabuf SHARED ${CMAKE_CURRENT_LIST_DIR}/fake_ibverbs.cpp)
set_target_properties(wia_fake_ibverbs_nodmabuf PROPERTIES
  OUTPUT_NAME ibverbs PREFIX "lib" SUFFIX ".so.1"
  LIBRARY_OUTPUT_DIRECTORY ${WIA_FAKE_IBVERBS_NODMABUF_DIR}
  CXX_VISIBILITY_PRESET hidden VISIBILITY_INLINES_HIDDEN ON)
target_compile_definitions(wia_fake_ibverbs_nodmabuf PRIVATE FAKE_IBV_NO_DMABUF)
target_include_directories(wia_fake_ibverbs_nodmabuf SYSTEM PRIVATE ${WIA_FAKE_IBVERBS_INCLUDE_DIR})
target_link_libraries(wia_fake_ibverbs_nodmabuf PRIVATE wia_warnings Threads::Threads)
target_link_options(wia_fake_ibverbs_nodmabuf PRIVATE -Wl,-soname,libibverbs.so.1
  -Wl,--no-undefined -Wl,--version-script=${_map})
set_property(TARGET wia_fake_ibverbs_nodmabuf APPEND PROPERTY LINK_DEPENDS ${_map})
set(WIA_FAKE_IBVERBS_NODMABUF_FILE ${WIA_FAKE_IBVERBS_NODMABUF_DIR}/libibverbs.so.1)

# The double's own test, linked against it (ctest fake_ibverbs).
wia_add_unit_test(fake_ibverbs SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_fake_ibverbs.cpp
  LIBS wia_fake_ibverbs TIMEOUT 60)
target_include_directories(test_fake_ibverbs SYSTEM PRIVATE ${WIA_FAKE_IBVERBS_INCLUDE_DIR})
