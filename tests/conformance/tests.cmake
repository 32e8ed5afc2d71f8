# SPDX-License-Identifier: Apache-2.0
# Self-tests of wia-conformance: "testdev", a small device provider built
# once per injected defect, must be flagged by the right test ids; the host
# provider and the vendor example must pass; bad files must give exit 2.
if(NOT TARGET wia-conformance)
  return()
endif()

set(WIA_FAULTY_PROVIDER_DIR ${PROJECT_BINARY_DIR}/faulty-providers)
add_custom_target(wia_faulty_providers)

# testdev_<defect>: one defect each (WIA_TESTDEV_DEFECT_<DEFECT>); "ok" has none.
foreach(defect ok nocopy lifo tail leak hang crash)
  wia_add_provider(testdev_${defect} SOURCES ${CMAKE_CURRENT_LIST_DIR}/testdev.cpp
    OUTPUT_DIR ${WIA_FAULTY_PROVIDER_DIR} NO_INSTALL DEPS Threads::Threads)
  target_compile_definitions(wia-provider-testdev_${defect} PRIVATE
    WIA_TESTDEV_NAME="testdev_${defect}")
  if(NOT defect STREQUAL "ok")
    string(TOUPPER ${defect} upper)
    target_compile_definitions(wia-provider-testdev_${defect} PRIVATE
      WIA_TESTDEV_DEFECT_${upper}=1)
  endif()
  add_dependencies(wia_faulty_providers wia-provider-testdev_${defect})
endforeach()

# Also offers a (stub) transport: L4/L5 must be listed as not implemented.
wia_add_provider(testdev_transport SOURCES ${CMAKE_CURRENT_LIST_DIR}/testdev.cpp
  OUTPUT_DIR ${WIA_FAULTY_PROVIDER_DIR} NO_INSTALL DEPS Threads::Threads)
target_compile_definitions(wia-provider-testdev_transport PRIVATE
  WIA_TESTDEV_NAME="testdev_transport" WIA_TESTDEV_TRANSPORT=1)
add_dependencies(wia_faulty_providers wia-provider-testdev_transport)

# The vendor example, built in-tree too so that every CI run checks it, not
# only the install check.
wia_add_provider(acme SOURCES ${PROJECT_SOURCE_DIR}/examples/vendor-provider/acme_provider.c
  OUTPUT_DIR ${WIA_FAULTY_PROVIDER_DIR} NO_INSTALL DEPS Threads::Threads)
add_dependencies(wia_faulty_providers wia-provider-acme)

wia_add_unit_test(conformance_suite
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_conformance_suite.cpp
  TIMEOUT 300)
add_dependencies(test_conformance_suite wia-conformance wia_faulty_providers wia-provider-host
  wia_test_providers)
target_compile_definitions(test_conformance_suite PRIVATE
  WIA_CONFORMANCE_BIN="$<TARGET_FILE:wia-conformance>"
  WIA_FAULTY_PROVIDER_DIR="${WIA_FAULTY_PROVIDER_DIR}"
  WIA_TEST_BINARY_DIR="${CMAKE_CURRENT_BINARY_DIR}")
