# SPDX-License-Identifier: Apache-2.0
# The ofi transport provider (libfabric), when this tree builds it:
#  - provider_ofi: through the ABI alone, in one process (registration
#    cache, max_message, an unknown fabric provider, absent by default;
#    device memory on the FI_HMEM double, tests/providers/fake-hmem-fabric);
#  - conformance_ofi_tcp / conformance_ofi_shm: wia-conformance L0-L5 with
#    FI_PROVIDER=tcp;ofi_rxm and FI_PROVIDER=shm (the pattern of
#    tests/faulty-providers/tests.cmake's conformance_<transport>);
#  - process_comm_ofi: every collective across 2, 3 and 4 processes with
#    data checks, ofi forced from YAML (tests/integration/processes);
#  - p2p_ofi_hmem: wia_send/wia_recv of the CUDA double's device buffers
#    over the FI_HMEM double, and staged on the real libfabric.
if(NOT TARGET wia-provider-ofi)
  return()
endif()

wia_add_unit_test(provider_ofi SOURCES ${CMAKE_CURRENT_LIST_DIR}/ofi_test.cpp
  LIBS wia_test_provider_host ${CMAKE_DL_LIBS} TIMEOUT 120)
target_compile_definitions(test_provider_ofi PRIVATE
  WIA_OFI_PROVIDER_FILE="$<TARGET_FILE:wia-provider-ofi>")
add_dependencies(test_provider_ofi wia-provider-ofi)
# The FI_HMEM cases run on the libfabric double that claims it.
if(TARGET wia_fake_hmem_fabric)
  target_compile_definitions(test_provider_ofi PRIVATE
    WIA_FAKE_HMEM_FABRIC_FILE="${WIA_FAKE_HMEM_FABRIC_FILE}")
  add_dependencies(test_provider_ofi wia_fake_hmem_fabric)
endif()

# The test passes only when wia-conformance exits 0 AND reports L5.
# tcp_rendezvous runs rxm in the rendezvous mode shm uses by default
# (framed messages, clear-to-send: docs/transport-ofi.md), so that path is
# also checked on a second fabric.
if(TARGET wia-conformance)
  foreach(variant "tcp|tcp\\;ofi_rxm|auto" "shm|shm|auto" "tcp_rendezvous|tcp\\;ofi_rxm|on")
    string(REPLACE "|" ";" parts "${variant}")
    list(GET parts 0 name)
    list(GET parts 1 fabric)
    list(GET parts 2 rendezvous)
    add_test(NAME conformance_ofi_${name}
      COMMAND /bin/sh -c "\"$0\" --provider \"$1\" --junit \"$2\" > \"$2.log\" 2>&1; rc=$?; \
cat \"$2.log\"; grep -q \"highest level fully passed: L5\" \"$2.log\" && [ $rc -eq 0 ]"
        $<TARGET_FILE:wia-conformance> $<TARGET_FILE:wia-provider-ofi>
        ${CMAKE_CURRENT_BINARY_DIR}/conformance-ofi-${name}.xml)
    set_tests_properties(conformance_ofi_${name} PROPERTIES TIMEOUT 600
      ENVIRONMENT "WIA_LOG_LEVEL=warn;FI_PROVIDER=${fabric};WIA_OFI_RENDEZVOUS=${rendezvous}")
    add_dependencies(wia-conformance wia-provider-ofi)
  endforeach()
  # The same suite with the fabric claiming FI_HMEM (the double over the
  # real tcp;ofi_rxm): the device-memory claims are consistent and host
  # memory goes on as before.
  if(TARGET wia_fake_hmem_fabric)
    add_test(NAME conformance_ofi_tcp_hmem
      COMMAND /bin/sh -c "\"$0\" --provider \"$1\" --param library=\"$2\" --junit \"$3\" \
> \"$3.log\" 2>&1; rc=$?; cat \"$3.log\"; grep -q \"highest level fully passed: L5\" \"$3.log\" && \
[ $rc -eq 0 ]"
        $<TARGET_FILE:wia-conformance> $<TARGET_FILE:wia-provider-ofi> ${WIA_FAKE_HMEM_FABRIC_FILE}
        ${CMAKE_CURRENT_BINARY_DIR}/conformance-ofi-tcp-hmem.xml)
    set_tests_properties(conformance_ofi_tcp_hmem PROPERTIES TIMEOUT 600
      ENVIRONMENT "WIA_LOG_LEVEL=warn;FI_PROVIDER=tcp\;ofi_rxm")
    add_dependencies(wia-conformance wia_fake_hmem_fabric)
  endif()
endif()

if(TARGET test_process_comm)
  wia_add_filtered_test(process_comm_ofi test_process_comm "*over ofi*")
  set_tests_properties(process_comm_ofi PROPERTIES TIMEOUT 600
    ENVIRONMENT "WIA_LOG_LEVEL=warn;WIA_TEST_OFI=1;WIA_COLLECTIVES_HEARTBEAT_TIMEOUT_MS=5000")
  add_dependencies(test_process_comm wia-provider-ofi)
endif()

# Device memory through FI_HMEM (issue 21), end to end: device buffers of
# the CUDA double over tcp;ofi_rxm, loaded through the libfabric double that
# claims FI_HMEM (tests/providers/fake-hmem-fabric), in the default and the
# rendezvous mode; and on the real libfabric, where they are staged.
if(TARGET wia-provider-cuda AND TARGET wia_fake_cuda AND TARGET wia_fake_hmem_fabric)
  wia_add_unit_test(p2p_ofi_hmem SOURCES ${CMAKE_CURRENT_LIST_DIR}/p2p_hmem_test.cpp
    LIBS wia::core ${CMAKE_DL_LIBS} TIMEOUT 300)
  target_include_directories(test_p2p_ofi_hmem PRIVATE
    ${PROJECT_SOURCE_DIR}/tests/integration/processes ${PROJECT_SOURCE_DIR}/tests/integration/p2p)
  wia_test_loads_providers(test_p2p_ofi_hmem)
  add_dependencies(test_p2p_ofi_hmem wia-provider-cuda wia_fake_cuda wia-provider-ofi
                   wia_fake_hmem_fabric)
  target_compile_definitions(test_p2p_ofi_hmem PRIVATE
    WIA_FAKE_CUDA_FILE="${PROJECT_BINARY_DIR}/fake-cuda/libcuda.so.1"
    WIA_FAKE_HMEM_FABRIC_FILE="${WIA_FAKE_HMEM_FABRIC_FILE}")
endif()
