# SPDX-License-Identifier: Apache-2.0
# Configuration (YAML schema, environment overrides, provider sections),
# through the core's base archive.
wia_add_unit_test(config
  SOURCES
    ${CMAKE_CURRENT_LIST_DIR}/config_test.cpp
    ${CMAKE_CURRENT_LIST_DIR}/provider_config_test.cpp
    ${CMAKE_CURRENT_LIST_DIR}/schema_test.cpp
  LIBS wia_core_base)
# The example-files case reads each built provider's own parameter table.
foreach(p host shm tcp ofi)
  if(TARGET wia-provider-${p})
    add_dependencies(test_config wia-provider-${p})
  endif()
endforeach()
