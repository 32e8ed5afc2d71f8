# SPDX-License-Identifier: Apache-2.0
# Configuration (YAML schema, environment overrides), logging and the
# usable CPU count.
# The sources under test are compiled in directly, so this binary does not
# depend on the rest of the core being buildable.
set(WIA_CONFIG_TEST_SOURCES
  ${CMAKE_CURRENT_LIST_DIR}/config_test.cpp
  ${CMAKE_CURRENT_LIST_DIR}/provider_config_test.cpp
  ${CMAKE_CURRENT_LIST_DIR}/schema_test.cpp
  ${CMAKE_CURRENT_LIST_DIR}/log_test.cpp
  ${CMAKE_CURRENT_LIST_DIR}/cpus_test.cpp
  ${PROJECT_SOURCE_DIR}/core/src/config/config.cpp
  ${PROJECT_SOURCE_DIR}/core/src/config/schema.cpp
  ${PROJECT_SOURCE_DIR}/core/src/config/value.cpp
  ${PROJECT_SOURCE_DIR}/core/src/common/log.cpp
  ${PROJECT_SOURCE_DIR}/core/src/common/error.cpp
  ${PROJECT_SOURCE_DIR}/core/src/common/cpus.cpp)
wia_add_unit_test(config
  SOURCES ${WIA_CONFIG_TEST_SOURCES}
  LIBS yaml-cpp fmt::fmt spdlog::spdlog wia::plugin_api Threads::Threads)
target_include_directories(test_config PRIVATE ${PROJECT_SOURCE_DIR}/core/src)
target_link_libraries(test_config PRIVATE wia_provider_common)  # config/value.cpp

# Logging before configure() must follow WIA_LOG_LEVEL / WIA_LOG_FILE read at
# first use. That needs a fresh process with those variables set, so the
# test case is skipped in the run above and run here on its own.
set(WIA_LOG_ENV_TEST_FILE ${CMAKE_CURRENT_BINARY_DIR}/log_env_test.log)
add_test(NAME config_log_env
  COMMAND test_config --no-skip "--test-case=log: first use honours WIA_LOG_LEVEL and WIA_LOG_FILE")
set_tests_properties(config_log_env PROPERTIES TIMEOUT 60
  ENVIRONMENT "WIA_LOG_LEVEL=debug;WIA_LOG_FILE=${WIA_LOG_ENV_TEST_FILE}")
