# SPDX-License-Identifier: Apache-2.0
# ze_api_matches: providers/ze/ze_api.h against Level Zero's
# level_zero/ze_api.h (Debian's libze-dev, which scripts/install-deps.sh
# installs for this check only: the provider itself builds without it). Its
# checks are static_asserts: a mismatch fails the build of
# test_ze_api_matches, which ctest then reports as failing.
find_path(WIA_ZE_H_DIR level_zero/ze_api.h)
if(WIA_ZE_H_DIR)
  wia_add_unit_test(ze_api_matches SOURCES ${CMAKE_CURRENT_LIST_DIR}/ze_api_matches.cpp)
  target_include_directories(test_ze_api_matches PRIVATE ${PROJECT_SOURCE_DIR}/providers/ze
    ${PROJECT_SOURCE_DIR}/tests)
  # SYSTEM: Level Zero's headers are not ours to keep free of -Wextra warnings.
  target_include_directories(test_ze_api_matches SYSTEM PRIVATE ${WIA_ZE_H_DIR})
else()
  message(STATUS "ze_api_matches: skipped, level_zero/ze_api.h not found (libze-dev)")
endif()

# Debian's real loader (libze1) without any Level Zero driver, which is what
# Debian ships: zeInit fails, and the provider must be the clean
# UNAVAILABLE with that cause (every conformance test skips, exit 0), not a
# crash; wia-info must show it as absent with the reason, and as loaded on
# the double.
find_library(WIA_ZE_LOADER_SO NAMES libze_loader.so.1)
if(NOT WIA_ZE_LOADER_SO)
  message(STATUS "conformance_ze_debian_loader, wia_info_ze: skipped, libze_loader.so.1 not found (libze1)")
elseif(TARGET wia-provider-ze AND TARGET wia-conformance AND TARGET wia_fake_ze)
  add_test(NAME conformance_ze_debian_loader
    COMMAND /bin/sh -c "\"$0\" --provider \"$1\" --filter L0.init_fini > \"$2\" 2>&1; rc=$?; cat \"$2\"; \
[ $rc -eq 0 ] && grep -q 'provider unavailable here: no Level Zero driver: zeInit (libze_loader.so.1): ZE_RESULT_ERROR_UNINITIALIZED' \"$2\""
      $<TARGET_FILE:wia-conformance> $<TARGET_FILE:wia-provider-ze>
      ${CMAKE_CURRENT_BINARY_DIR}/conformance-ze-debian-loader.log)
  set_tests_properties(conformance_ze_debian_loader PROPERTIES TIMEOUT 60
    ENVIRONMENT "WIA_LOG_LEVEL=warn")
  if(TARGET wia-info)
    add_test(NAME wia_info_ze
      COMMAND /bin/sh -c "set -e; \"$0\" > \"$2.absent\" 2>&1; cat \"$2.absent\"; \
grep -Eq '^ +ze +absent ' \"$2.absent\"; \
grep -q 'reason: no Level Zero driver: zeInit (libze_loader.so.1): ZE_RESULT_ERROR_UNINITIALIZED' \"$2.absent\"; \
WIA_ZE_LIBRARY=\"$1\" \"$0\" > \"$2.fake\" 2>&1; cat \"$2.fake\"; \
grep -Eq '^ +ze +loaded +v[0-9.]+ [(]reduce: host-staged, no SPIR-V kernels[)]' \"$2.fake\"; \
grep -q 'Fake ZE Device 1' \"$2.fake\""
        $<TARGET_FILE:wia-info> ${WIA_FAKE_ZE_FILE} ${CMAKE_CURRENT_BINARY_DIR}/wia-info-ze)
    set_tests_properties(wia_info_ze PROPERTIES TIMEOUT 120 ENVIRONMENT "WIA_LOG_LEVEL=error")
    add_dependencies(wia-info wia-provider-ze wia_fake_ze)
  endif()
endif()
