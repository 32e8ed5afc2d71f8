# SPDX-License-Identifier: Apache-2.0
# The bootstrap root under abuse while a real job bootstraps and all-reduces
# (issue 28 part 4): a flood of 1,000 connections, a silent client, garbage,
# a wrong key and a huge announced length must each be refused and logged
# with the peer's address, the job must complete with correct data within
# the clean run's time + 3 s, and no descriptor or unbounded memory may stay.
# 77: RLIMIT_NOFILE too low for the flood (reported as skipped).
add_executable(test_bootstrap_abuse ${CMAKE_CURRENT_LIST_DIR}/bootstrap_abuse_test.cpp)
target_link_libraries(test_bootstrap_abuse PRIVATE wia_core_internal wia_warnings)
wia_test_loads_providers(test_bootstrap_abuse)
add_test(NAME bootstrap_abuse COMMAND test_bootstrap_abuse)
set_tests_properties(bootstrap_abuse PROPERTIES TIMEOUT 120 SKIP_RETURN_CODE 77
  ENVIRONMENT "WIA_LOG_LEVEL=warn")
