# SPDX-License-Identifier: Apache-2.0
# The public C API, through libwia.so exactly as applications use it.
wia_add_unit_test(c_api SOURCES ${CMAKE_CURRENT_LIST_DIR}/c_api_test.cpp LIBS wia::core)
if(TARGET wia-provider-host)
  add_dependencies(test_c_api wia-provider-host)
endif()
wia_tsan_test(test_c_api c_api)  # streams, events, host callbacks

# The spec's own snippets, compiled as C11 against wia.h: 6.3 (peer to
# peer) on 2 devices, 6.4 - 6.6 (collectives, communicators) on 8.
function(wia_add_spec_snippet name source devices)
  add_executable(test_${name} ${CMAKE_CURRENT_LIST_DIR}/${source})
  target_link_libraries(test_${name} PRIVATE wia::core wia_warnings)
  if(TARGET wia-provider-host)
    add_dependencies(test_${name} wia-provider-host)
  endif()
  add_test(NAME ${name} COMMAND test_${name})
  set_tests_properties(${name} PROPERTIES TIMEOUT 120 ENVIRONMENT "WIA_HOST_DEVICES=${devices}")
endfunction()
wia_add_spec_snippet(spec_snippets_c spec_snippets.c 2)
wia_add_spec_snippet(spec_collectives_c spec_collectives.c 8)
