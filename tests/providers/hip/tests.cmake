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
