# SPDX-License-Identifier: Apache-2.0
# Where the tools' rank spawner (wia-bench --procs, wia-bw --procs) binds
# its ranks: one core each while the cores suffice, as mpirun does.
if(NOT TARGET wia_tool_ranks)
  return()
endif()

wia_add_job_check(test_tool_ranks_binding_check ${CMAKE_CURRENT_LIST_DIR}/binding_check.cpp)
set(_tr_check $<TARGET_FILE:test_tool_ranks_binding_check>)

# 1 and 2 ranks (bound on a machine of 2 cores or more), 3 (unbound on
# this 2-core machine, bound on a bigger one: the check works out which),
# 2 from a spawner restricted to one CPU (1 core for 2 ranks: unbound, on
# that CPU), and 2 with WIA_BIND_TO=none. 77: sysfs does not name the
# cores here (reported as skipped).
add_test(NAME tool_ranks_binding_1 COMMAND ${_tr_check} --procs 1)
add_test(NAME tool_ranks_binding_2 COMMAND ${_tr_check} --procs 2)
add_test(NAME tool_ranks_binding_3 COMMAND ${_tr_check} --procs 3)
add_test(NAME tool_ranks_binding_2_on_one_cpu COMMAND ${_tr_check} --procs 2 --on-first-cpu)
add_test(NAME tool_ranks_binding_2_none COMMAND ${_tr_check} --procs 2)
set_tests_properties(tool_ranks_binding_2_none PROPERTIES ENVIRONMENT "WIA_BIND_TO=none")
# A policy other than core or none: exit status 2 and a message naming it.
add_test(NAME tool_ranks_binding_bad_policy COMMAND sh -c "\
  out=$(WIA_BIND_TO=socket ${_tr_check} --procs 2 2>&1); rc=$?; echo \"$out\"; \
  test $rc -eq 2 && echo \"$out\" | grep -q \"WIA_BIND_TO='socket': expected 'core' or 'none'\"")
set_tests_properties(tool_ranks_binding_1 tool_ranks_binding_2 tool_ranks_binding_3
                     tool_ranks_binding_2_on_one_cpu tool_ranks_binding_2_none
                     tool_ranks_binding_bad_policy PROPERTIES TIMEOUT 60 SKIP_RETURN_CODE 77)

# wia-bench reports how --procs bound its ranks in its header.
if(TARGET wia-bench)
  add_test(NAME tool_ranks_binding_reported_by_wia_bench COMMAND sh -c "\
    out=$(WIA_BIND_TO=none $<TARGET_FILE:wia-bench> --procs 2 --sizes 8 -n 10 -w 1) || exit 1; \
    echo \"$out\" | head -n 3; echo \"$out\" | grep -q '^# ranks (--procs): unbound: WIA_BIND_TO=none$'")
  set_tests_properties(tool_ranks_binding_reported_by_wia_bench PROPERTIES TIMEOUT 60
    ENVIRONMENT "WIA_LOG_LEVEL=error")
endif()
