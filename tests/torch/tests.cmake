# SPDX-License-Identifier: Apache-2.0
# The torch.distributed backend (python/wia_torch, docs/torch.md): real
# processes, compared with gloo in the same processes.
if(NOT WIA_TORCH_PYTHON_FOUND)
  return()
endif()

# launch.py starts the ranks with torchrun's environment (env://); it says
# why the tests do not use Debian 12's torchrun itself.
set(WIA_TORCH_LAUNCH ${WIA_TORCH_PYTHON_FOUND} ${CMAKE_CURRENT_LIST_DIR}/launch.py)
set(WIA_TORCH_TEST_ENV
  "PYTHONPATH=${PROJECT_BINARY_DIR}/python" "OMP_NUM_THREADS=1" "WIA_LOG_LEVEL=warn"
  "PYTHONWARNINGS=ignore::UserWarning")

# These are not heartbeat tests (torch_rank_killed is, and keeps the
# default): a 5 s heartbeat timeout keeps 4 Python ranks on 2 busy cores
# from declaring a slow one dead.
function(wia_add_torch_test name nproc script)
  add_test(NAME ${name}
    COMMAND ${WIA_TORCH_LAUNCH} ${nproc} ${CMAKE_CURRENT_LIST_DIR}/${script} ${ARGN})
  set_tests_properties(${name} PROPERTIES TIMEOUT 300
    ENVIRONMENT "${WIA_TORCH_TEST_ENV};WIA_COLLECTIVES_HEARTBEAT_TIMEOUT_MS=5000"
    # every rank prints its count of passed checks; none printed is a failure
    PASS_REGULAR_EXPRESSION "rank 0: [1-9][0-9]* checks passed"
    FAIL_REGULAR_EXPRESSION "FAIL|Traceback")
endfunction()

wia_add_torch_test(torch_collectives_2 2 collectives.py)
wia_add_torch_test(torch_collectives_4 4 collectives.py)
wia_add_torch_test(torch_ddp_2 2 ddp.py)
wia_add_torch_test(torch_ddp_4 4 ddp.py)

add_test(NAME torch_rank_killed COMMAND ${WIA_TORCH_PYTHON_FOUND} ${CMAKE_CURRENT_LIST_DIR}/kill.py 4)
set_tests_properties(torch_rank_killed PROPERTIES TIMEOUT 300 ENVIRONMENT "${WIA_TORCH_TEST_ENV}"
  PASS_REGULAR_EXPRESSION "all 3 survivors raised within the timeout"
  FAIL_REGULAR_EXPRESSION "FAIL")
wia_add_torch_test(torch_timeout 2 timeout.py)
# A rank that exits with an all_reduce in flight, its tensor dropped: the
# group is shut down at exit (atexit), the peer still gets the sum, and a
# group shut down refuses later calls.
wia_add_torch_test(torch_exit_pending 2 exit_pending.py)
# A rank that exits with a collective its peer never posts: after the
# shutdown grace (2 s here) it aborts instead of waiting for the 300 s
# timeout, and the peer's next call fails naming the abort.
wia_add_torch_test(torch_exit_unmatched 2 exit_unmatched.py)
