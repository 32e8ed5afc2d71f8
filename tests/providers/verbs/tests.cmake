# SPDX-License-Identifier: Apache-2.0
# The verbs transport provider (libibverbs), when this tree builds it:
#  - conformance_verbs_fake: wia-conformance L0-L5 against the libibverbs
#    double (tests/providers/fake-ibverbs), which must reach L5;
#  - conformance_verbs_no_device: against the real libibverbs.so.1 on a
#    machine without an RDMA device: every transport test SKIPs with
#    "no RDMA device" and the suite exits 0 (with a device, init must work);
#  - provider_verbs_fake: the provider through its ABI alone against the
#    double: registration cache, rendezvous data, injected faults.
if(NOT TARGET wia-provider-verbs OR NOT TARGET wia_fake_ibverbs)
  return()
endif()

if(TARGET wia-conformance)
  # The test passes only when wia-conformance exits 0 AND reports the level.
  add_test(NAME conformance_verbs_fake
    COMMAND /bin/sh -c "\"$0\" --provider \"$1\" --param library=\"$2\" --junit \"$3\" \
> \"$3.log\" 2>&1; rc=$?; cat \"$3.log\"; [ $rc -eq 0 ] && \
grep -q 'highest level fully passed: L5' \"$3.log\""
      $<TARGET_FILE:wia-conformance> $<TARGET_FILE:wia-provider-verbs> ${WIA_FAKE_IBVERBS_FILE}
      ${CMAKE_CURRENT_BINARY_DIR}/conformance-verbs-fake.xml)
  set_tests_properties(conformance_verbs_fake PROPERTIES TIMEOUT 600
    ENVIRONMENT "WIA_LOG_LEVEL=error;WIA_VERBS_LIBRARY=${WIA_FAKE_IBVERBS_FILE}")

  # No device: L4 and L5 SKIP naming the reason, nothing fails. A machine
  # with an RDMA device (/sys/class/infiniband not empty) must instead pass
  # init and the transport tests that apply.
  add_test(NAME conformance_verbs_no_device
    COMMAND /bin/sh -c "\"$0\" --provider \"$1\" > \"$2\" 2>&1; rc=$?; cat \"$2\"; \
[ $rc -eq 0 ] || exit 1; \
if [ -n \"$(ls -A /sys/class/infiniband 2>/dev/null)\" ]; then \
  grep -q 'PASS  L4.endpoint.props' \"$2\"; \
else \
  grep -q 'SKIP  L4.send_recv.basic .*no RDMA device' \"$2\" && \
  grep -q 'SKIP  L5.transport.collectives .*no RDMA device' \"$2\" && \
  ! grep -q '^FAIL' \"$2\"; \
fi"
      $<TARGET_FILE:wia-conformance> $<TARGET_FILE:wia-provider-verbs>
      ${CMAKE_CURRENT_BINARY_DIR}/conformance-verbs-no-device.log)
  set_tests_properties(conformance_verbs_no_device PROPERTIES TIMEOUT 120
    ENVIRONMENT "WIA_LOG_LEVEL=error")
  add_dependencies(wia-conformance wia-provider-verbs wia_fake_ibverbs)
endif()

wia_add_unit_test(provider_verbs_fake SOURCES ${CMAKE_CURRENT_LIST_DIR}/verbs_test.cpp
  LIBS wia_test_provider_host ${CMAKE_DL_LIBS} TIMEOUT 300)
target_compile_definitions(test_provider_verbs_fake PRIVATE
  WIA_VERBS_PROVIDER_FILE="$<TARGET_FILE:wia-provider-verbs>"
  WIA_FAKE_IBVERBS_FILE="${WIA_FAKE_IBVERBS_FILE}"
  WIA_FAKE_IBVERBS_NODMABUF_FILE="${WIA_FAKE_IBVERBS_NODMABUF_FILE}")
add_dependencies(test_provider_verbs_fake wia-provider-verbs wia_fake_ibverbs
  wia_fake_ibverbs_nodmabuf)

# The built-in selector default for different_nodes is "verbs, ofi, tcp":
# with verbs loaded (the double) inter-node links take verbs; without a
# device the selector passes it over, saying why, and falls back.
if(TARGET wia-info)
  add_test(NAME selector_verbs_default
    COMMAND /bin/sh -c "set -e; \
\"$0\" --explain --summary --topology-file \"$1\" > \"$3.absent\" 2>&1; cat \"$3.absent\"; \
grep -q 'passed over verbs: provider not loaded: absent: verbs: no RDMA device' \"$3.absent\"; \
! grep -Eq 'different_nodes +[0-9]+ +verbs' \"$3.absent\"; \
WIA_VERBS_LIBRARY=\"$2\" \"$0\" --explain --summary --topology-file \"$1\" > \"$3.present\" 2>&1; \
cat \"$3.present\"; grep -Eq 'different_nodes +[0-9]+ +verbs +default' \"$3.present\""
      $<TARGET_FILE:wia-info> ${PROJECT_SOURCE_DIR}/config/topologies/4node-ib-hdr.yaml
      ${WIA_FAKE_IBVERBS_FILE} ${CMAKE_CURRENT_BINARY_DIR}/selector-verbs)
  set_tests_properties(selector_verbs_default PROPERTIES TIMEOUT 120
    ENVIRONMENT "WIA_LOG_LEVEL=error;WIA_PROVIDERS_DISABLE=ofi")
  add_dependencies(wia-info wia-provider-verbs wia_fake_ibverbs)
endif()

# GPUDirect RDMA through dma-bufs, end to end (issue 21): device buffers of
# the CUDA double sent with wia_send/wia_recv over this provider on the
# double, registered by the core from the cuda provider's dma-buf export
# (tests/integration/p2p/p2p_dmabuf_test.cpp; here, after both doubles).
if(TARGET wia-provider-cuda AND TARGET wia_fake_cuda)
  wia_add_unit_test(p2p_dmabuf
    SOURCES ${PROJECT_SOURCE_DIR}/tests/integration/p2p/p2p_dmabuf_test.cpp
    LIBS wia::core ${CMAKE_DL_LIBS} TIMEOUT 300)
  target_include_directories(test_p2p_dmabuf PRIVATE ${PROJECT_SOURCE_DIR}/tests/integration/processes)
  wia_test_loads_providers(test_p2p_dmabuf)
  add_dependencies(test_p2p_dmabuf wia-provider-cuda wia_fake_cuda wia-provider-verbs
                   wia_fake_ibverbs)
  target_compile_definitions(test_p2p_dmabuf PRIVATE
    WIA_FAKE_CUDA_FILE="${PROJECT_BINARY_DIR}/fake-cuda/libcuda.so.1"
    WIA_FAKE_IBVERBS_FILE="${WIA_FAKE_IBVERBS_FILE}")
endif()
