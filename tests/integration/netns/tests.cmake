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
if(TARGET wia-bench)
  # The link between the two namespaces cut mid-all-reduce, over ofi
  # (tcp;ofi_rxm) and over tcp: every rank fails within the collective
  # timeout (5 s) + 5 s, naming a peer; link_cut.sh says what is checked.
  # Without the ofi provider (no libfabric at configure time) the ofi
  # steps are skipped and the tcp cut still runs.
  if(TARGET wia-provider-ofi)
    set(_wia_link_cut_ofi ofi)
  else()
    set(_wia_link_cut_ofi no-ofi)
  endif()
  add_test(NAME netns_link_cut
           COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/link_cut.sh $<TARGET_FILE_DIR:wia-bench>
                   ${_wia_link_cut_ofi})
  set_tests_properties(netns_link_cut PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 180
                       RUN_SERIAL TRUE)
endif()
