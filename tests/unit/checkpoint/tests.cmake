# SPDX-License-Identifier: Apache-2.0
# Checkpoints (spec 6.9) through the public C API: round trips, damaged
# files, bad input, full and read-only disks (docs/checkpoints.md).
wia_add_unit_test(checkpoint_api SOURCES ${CMAKE_CURRENT_LIST_DIR}/checkpoint_api_test.cpp
  LIBS wia::core PkgConfig::XXHASH TIMEOUT 300)
if(TARGET wia-provider-host)
  add_dependencies(test_checkpoint_api wia-provider-host)
endif()
wia_tsan_test(test_checkpoint_api checkpoint_api)  # the async save's thread

# Spec 6.9's checkpoint snippet as C11 (the _Generic metadata macros included).
add_executable(test_spec_checkpoint_c ${CMAKE_CURRENT_LIST_DIR}/spec_checkpoint.c)
target_link_libraries(test_spec_checkpoint_c PRIVATE wia::core wia_warnings)
if(TARGET wia-provider-host)
  add_dependencies(test_spec_checkpoint_c wia-provider-host)
endif()
add_test(NAME spec_checkpoint_c COMMAND test_spec_checkpoint_c)
set_tests_properties(spec_checkpoint_c PROPERTIES TIMEOUT 120
  ENVIRONMENT "WIA_HOST_DEVICES=1;WIA_LOG_LEVEL=warn")
