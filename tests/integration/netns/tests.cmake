# SPDX-License-Identifier: Apache-2.0
# Two hosts on one machine: network namespaces joined by a veth pair, two
# ranks in each (two_hosts.sh says what is checked). Needs root and iproute2;
# skipped (exit 77) where namespaces cannot be created.
if(TARGET wia-bench)
  add_test(NAME netns_two_hosts
           COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/two_hosts.sh $<TARGET_FILE_DIR:wia-bench>)
  set_tests_properties(netns_two_hosts PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 150
                       RUN_SERIAL TRUE)
endif()
