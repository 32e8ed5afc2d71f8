# SPDX-License-Identifier: Apache-2.0
# The public C API, through libwia.so exactly as applications use it.
wia_add_unit_test(c_api SOURCES ${CMAKE_CURRENT_LIST_DIR}/c_api_test.cpp LIBS wia::core)
if(TARGET wia-provider-host)
  add_dependencies(test_c_api wia-provider-host)
endif()

# The spec's own snippets, compiled as C11 against wia.h.
add_executable(test_spec_snippets_c ${CMAKE_CURRENT_LIST_DIR}/spec_snippets.c)
target_link_libraries(test_spec_snippets_c PRIVATE wia::core wia_warnings)
if(TARGET wia-provider-host)
  add_dependencies(test_spec_snippets_c wia-provider-host)
endif()
add_test(NAME spec_snippets_c COMMAND test_spec_snippets_c)
set_tests_properties(spec_snippets_c PROPERTIES TIMEOUT 60 ENVIRONMENT "WIA_HOST_DEVICES=2")

# Spec 6.4 - 6.6 (collectives, selection, communicators) as C11.
add_executable(test_spec_collectives_c ${CMAKE_CURRENT_LIST_DIR}/spec_collectives.c)
target_link_libraries(test_spec_collectives_c PRIVATE wia::core wia_warnings)
if(TARGET wia-provider-host)
  add_dependencies(test_spec_collectives_c wia-provider-host)
endif()
add_test(NAME spec_collectives_c COMMAND test_spec_collectives_c)
set_tests_properties(spec_collectives_c PROPERTIES TIMEOUT 120 ENVIRONMENT "WIA_HOST_DEVICES=8")
