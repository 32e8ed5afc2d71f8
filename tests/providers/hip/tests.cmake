# SPDX-License-Identifier: Apache-2.0
# hip_runtime_api_matches: providers/hip/hip_runtime_api.h against ROCm's
# hip/hip_runtime_api.h (Debian's libamdhip64-dev, which
# scripts/install-deps.sh installs for this check only: the provider itself
# builds without it). Its checks are static_asserts: a mismatch fails the
# build of test_hip_runtime_api_matches, which ctest then reports as failing.
find_path(WIA_HIP_H_DIR hip/hip_runtime_api.h)
if(WIA_HIP_H_DIR)
  wia_add_unit_test(hip_runtime_api_matches
    SOURCES ${CMAKE_CURRENT_LIST_DIR}/hip_runtime_api_matches.cpp)
  target_include_directories(test_hip_runtime_api_matches PRIVATE ${PROJECT_SOURCE_DIR}/providers/hip
    ${PROJECT_SOURCE_DIR}/tests)
  # SYSTEM: ROCm's headers are not ours to keep free of -Wextra warnings.
  target_include_directories(test_hip_runtime_api_matches SYSTEM PRIVATE ${WIA_HIP_H_DIR})
  target_compile_definitions(test_hip_runtime_api_matches PRIVATE __HIP_PLATFORM_AMD__)
else()
  message(STATUS "hip_runtime_api_matches: skipped, hip/hip_runtime_api.h not found (libamdhip64-dev)")
endif()

# Debian's real ROCm 5.2 runtime without a GPU: it exports no
# hipLaunchHostFunc (the provider uses hipStreamAddCallback), so the
# provider gets as far as hipInit and is the clean UNAVAILABLE with that
# cause, not "has no <entry>".
find_library(WIA_HIP_RUNTIME_SO NAMES libamdhip64.so.5)
if(NOT WIA_HIP_RUNTIME_SO)
  message(STATUS "conformance_hip_debian_runtime: skipped, libamdhip64.so.5 not found (libamdhip64-5)")
elseif(TARGET wia-provider-hip AND TARGET wia-conformance)
  add_test(NAME conformance_hip_debian_runtime
    COMMAND /bin/sh -c "\"$0\" --provider \"$1\" --filter L0.init_fini > \"$2\" 2>&1; rc=$?; cat \"$2\"; \
[ $rc -eq 0 ] && grep -q 'provider unavailable here: .*hipInit (libamdhip64.so.5)' \"$2\""
      $<TARGET_FILE:wia-conformance> $<TARGET_FILE:wia-provider-hip>
      ${CMAKE_CURRENT_BINARY_DIR}/conformance-hip-debian-runtime.log)
  set_tests_properties(conformance_hip_debian_runtime PROPERTIES TIMEOUT 60
    ENVIRONMENT "WIA_LOG_LEVEL=warn")
endif()
