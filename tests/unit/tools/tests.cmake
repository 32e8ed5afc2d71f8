# SPDX-License-Identifier: Apache-2.0
# The command-line tools as operators run them; each check greps the output
# for what the tool promises to show.
set(_wia_info $<TARGET_FILE:wia-info>)
set(_wia_bench $<TARGET_FILE:wia-bench>)
set(_topologies ${PROJECT_SOURCE_DIR}/config/topologies)

# Providers: the host provider loads, every broken one is listed with why.
add_test(NAME tool_wia_info_providers COMMAND sh -c "\
  out=$(WIA_PROVIDER_PATH=${PROJECT_BINARY_DIR}/test-providers WIA_HOST_DEVICES=2 ${_wia_info}) || exit 1; \
  echo \"$out\"; \
  echo \"$out\" | grep -Eq 'host +loaded' && \
  echo \"$out\" | grep -q 'built for provider ABI v99, this libwia supports up to v1' && \
  echo \"$out\" | grep -q 'no wia_provider_v1 symbol' && \
  echo \"$out\" | grep -q 'invalid ELF header' && \
  echo \"$out\" | grep -q 'absent' && \
  echo \"$out\" | grep -q 'Devices: 2' && \
  echo \"$out\" | grep -Eq '^ +0 +- +Y'")

# Configuration with sources.
add_test(NAME tool_wia_info_config COMMAND sh -c "\
  out=$(WIA_HOST_DEVICES=3 ${_wia_info} --config) || exit 1; echo \"$out\"; \
  echo \"$out\" | grep -Eq 'host.devices += 3 +\\[env WIA_HOST_DEVICES\\]' && \
  echo \"$out\" | grep -Eq 'log.level += error +\\[env WIA_LOG_LEVEL\\]'")

# Topology matrix and analysis from a shipped file, and Graphviz output.
add_test(NAME tool_wia_info_topology COMMAND sh -c "\
  out=$(${_wia_info} --topology-file ${_topologies}/dgx-8gpu-nvlink.yaml) || exit 1; echo \"$out\"; \
  echo \"$out\" | grep -q 'Analysis: single_node, diameter 1, bisection 4800.0 GB/s' && \
  ${_wia_info} --dot --topology-file ${_topologies}/4node-ib-hdr.yaml | grep -q 'graph wia_topology'")

# A bad option is a usage error, not a crash.
add_test(NAME tool_wia_info_bad_option COMMAND ${_wia_info} --no-such-option)
set_tests_properties(tool_wia_info_bad_option PROPERTIES WILL_FAIL TRUE)

# The benchmark's own data check over a short sweep of every collective.
foreach(op allreduce broadcast reduce allgather reducescatter alltoall)
  add_test(NAME tool_wia_bench_${op} COMMAND sh -c "\
    ${_wia_bench} --op ${op} --ranks 3 -b 8 -e 64K -f 8 -n 2 -w 1 | tee /dev/stderr | grep -q '# ok: 0 wrong'")
endforeach()

set_tests_properties(tool_wia_info_providers tool_wia_info_config tool_wia_info_topology
                     PROPERTIES TIMEOUT 60 ENVIRONMENT "WIA_LOG_LEVEL=error")
