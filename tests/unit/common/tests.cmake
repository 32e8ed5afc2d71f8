# SPDX-License-Identifier: Apache-2.0
# Logging, the usable CPU count and UTF-8 checks (core/src/common), through the core's
# base archive.
wia_add_unit_test(common
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/log_test.cpp ${CMAKE_CURRENT_LIST_DIR}/cpus_test.cpp
          ${CMAKE_CURRENT_LIST_DIR}/utf8_test.cpp
  LIBS wia_core_base PkgConfig::HWLOC)

# Logging before configure() must follow WIA_LOG_LEVEL / WIA_LOG_FILE read at
# first use. That needs a fresh process with those variables set, so the
# test case is skipped in the run above and run here on its own.
set(WIA_LOG_ENV_TEST_FILE ${CMAKE_CURRENT_BINARY_DIR}/log_env_test.log)
wia_add_filtered_test(common_log_env test_common
  "log: first use honours WIA_LOG_LEVEL and WIA_LOG_FILE" --no-skip)
set_tests_properties(common_log_env PROPERTIES TIMEOUT 60
  ENVIRONMENT "WIA_LOG_LEVEL=debug;WIA_LOG_FILE=${WIA_LOG_ENV_TEST_FILE}")
