# SPDX-License-Identifier: Apache-2.0
# Configuration (YAML schema, environment overrides, provider sections),
# through the core's base archive.
wia_add_unit_test(config
  SOURCES
    ${CMAKE_CURRENT_LIST_DIR}/config_test.cpp
    ${CMAKE_CURRENT_LIST_DIR}/provider_config_test.cpp
    ${CMAKE_CURRENT_LIST_DIR}/schema_test.cpp
  LIBS wia_core_base)
