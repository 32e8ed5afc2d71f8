# SPDX-License-Identifier: Apache-2.0
# wia-soak in CI (issue 28 part 3): 2,000 random, data-checked operations
# with communicator splits and frees, spread over device-based
# communicators (host devices of one process), shm processes and tcp
# processes, each run also failing on RSS, descriptor or /dev/shm growth
# (tools/wia-soak/wia_soak.cpp). Fixed seeds, so a CI failure replays as
# printed; the long soak (docs/reliability.md) draws fresh ones.
# Sizes go up to 16 MiB here (0 - 64 MiB in the long soak): the warm-up
# runs one operation of each kind at the largest size over every mode, and
# at 64 MiB that alone took half of the ~90 s this may take on 2 cores.
# Under the sanitizers (WIA_SANITIZE) every run does a quarter of the
# operations with sizes up to 4 MiB: ASan's shadow memory and its slower
# copies would otherwise take several minutes, and its allocator keeps
# freed memory in quarantine, so the RSS bound is raised there too.
if(NOT TARGET wia-soak)
  return()
endif()
wia_test_loads_providers(wia-soak)

if(WIA_SANITIZE)
  set(_soak_scale 4)
  set(_soak_extra --max-size 4M --rss-bound 256M)
else()
  set(_soak_scale 1)
  set(_soak_extra --max-size 16M)
endif()
math(EXPR _soak_dev_ops "800 / ${_soak_scale}")
math(EXPR _soak_shm_ops "700 / ${_soak_scale}")
math(EXPR _soak_tcp_ops "500 / ${_soak_scale}")

add_test(NAME soak_devices
  COMMAND wia-soak --ranks 5 --ops ${_soak_dev_ops} --seed 2801 ${_soak_extra})
add_test(NAME soak_shm_processes
  COMMAND wia-soak --procs 4 --transport shm --ops ${_soak_shm_ops} --seed 2802 ${_soak_extra})
add_test(NAME soak_tcp_processes
  COMMAND wia-soak --procs 3 --transport tcp --ops ${_soak_tcp_ops} --seed 2803 ${_soak_extra})
# A 30 s heartbeat timeout: this is not a heartbeat test, and at load 10-14
# on 2 cores a rank checking 64 MiB results went 6 s without being heard.
set_tests_properties(soak_devices soak_shm_processes soak_tcp_processes PROPERTIES
  TIMEOUT 600 ENVIRONMENT "WIA_LOG_LEVEL=warn;WIA_COLLECTIVES_HEARTBEAT_TIMEOUT_MS=30000")

# The tool's own checks can fail: a wrong --transport is refused, and a
# run with a leak bound no run can meet (-1 descriptors) must fail.
add_test(NAME soak_refuses_bad_transport COMMAND sh -c "\
  out=$($<TARGET_FILE:wia-soak> --procs 2 --transport udp 2>&1); rc=$?; echo \"$out\"; \
  test $rc -eq 2 && echo \"$out\" | grep -q 'transport must be shm or tcp'")
add_test(NAME soak_leak_bound_fails_the_run COMMAND sh -c "\
  out=$($<TARGET_FILE:wia-soak> --ranks 2 --ops 20 --seed 7 --max-size 1M --fd-bound -1 2>&1); rc=$?; \
  echo \"$out\"; test $rc -ne 0 && echo \"$out\" | grep -q 'LEAK'")
set_tests_properties(soak_refuses_bad_transport soak_leak_bound_fails_the_run PROPERTIES
  TIMEOUT 120 ENVIRONMENT "WIA_LOG_LEVEL=warn")
# The checker's self-test: one flipped result byte must be reported.
add_test(NAME soak_checker_finds_a_flipped_byte COMMAND sh -c "\
  out=$($<TARGET_FILE:wia-soak> --ranks 3 --ops 12 --seed 11 --max-size 1M --corrupt-op 3 2>&1); rc=$?; \
  echo \"$out\"; test $rc -ne 0 && echo \"$out\" | grep -q 'WRONG: .*wrong element'")
set_tests_properties(soak_checker_finds_a_flipped_byte PROPERTIES
  TIMEOUT 120 ENVIRONMENT "WIA_LOG_LEVEL=warn")

# Regression (wia-soak seed 2 hung at a split with a NOCOLOR rank): splits
# with ranks that have no color or are alone in theirs, beside a group of
# several, complete, and their communicators all-reduce correctly.
wia_add_job_check(test_split_nocolor_check ${CMAKE_CURRENT_LIST_DIR}/split_nocolor_check.cpp)
add_test(NAME split_nocolor_completes COMMAND test_split_nocolor_check --procs 4)
set_tests_properties(split_nocolor_completes PROPERTIES TIMEOUT 120
  ENVIRONMENT "WIA_LOG_LEVEL=warn;WIA_COLLECTIVES_TIMEOUT_MS=20000;WIA_COLLECTIVES_HEARTBEAT_TIMEOUT_MS=10000")
