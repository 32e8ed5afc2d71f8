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

# testnet_<defect>: the reference transport over Unix sockets, one defect
# each (WIA_TESTNET_DEFECT_<DEFECT>); "ok" has none and must pass L4, and
# so must "busy", which only answers "retry" to many posts.
foreach(defect ok nodata reorder tail hang overflow nodeath deaf busy)
  wia_add_provider(testnet_${defect} SOURCES ${CMAKE_CURRENT_LIST_DIR}/testnet.cpp
    OUTPUT_DIR ${WIA_FAULTY_PROVIDER_DIR} NO_INSTALL)
  target_compile_definitions(wia-provider-testnet_${defect} PRIVATE
    WIA_TESTNET_NAME="testnet_${defect}")
  if(NOT defect STREQUAL "ok")
    string(TOUPPER ${defect} upper)
    target_compile_definitions(wia-provider-testnet_${defect} PRIVATE
      WIA_TESTNET_DEFECT_${upper}=1)
  endif()
  add_dependencies(wia_faulty_providers wia-provider-testnet_${defect})
endforeach()

# Also offers a transport without endpoints: L4 skips, L5's transport entry
# is listed as not implemented.
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
  TIMEOUT 900)
add_dependencies(test_conformance_suite wia-conformance wia_faulty_providers wia-provider-host
  wia_test_providers)
target_compile_definitions(test_conformance_suite PRIVATE
  WIA_CONFORMANCE_BIN="$<TARGET_FILE:wia-conformance>"
  WIA_FAULTY_PROVIDER_DIR="${WIA_FAULTY_PROVIDER_DIR}"
  WIA_TEST_BINARY_DIR="${CMAKE_CURRENT_BINARY_DIR}")

# The real transports, when this tree builds them: they must pass L4 and
# L5 (collectives of a process communicator built over them). providers/
# is added before tests/, so the targets are known here.
# The test passes only when wia-conformance exits 0 AND reports L5.
foreach(transport tcp shm)
  if(TARGET wia-provider-${transport})
    add_test(NAME conformance_${transport}
      COMMAND /bin/sh -c "\"$0\" --provider \"$1\" --junit \"$2\" > \"$2.log\" 2>&1; rc=$?; \
cat \"$2.log\"; [ $rc -eq 0 ] && grep -q 'highest level fully passed: L5' \"$2.log\""
        $<TARGET_FILE:wia-conformance> $<TARGET_FILE:wia-provider-${transport}>
        ${CMAKE_CURRENT_BINARY_DIR}/conformance-${transport}.xml)
    set_tests_properties(conformance_${transport} PROPERTIES TIMEOUT 600
      ENVIRONMENT "WIA_LOG_LEVEL=warn")
  endif()
endforeach()
