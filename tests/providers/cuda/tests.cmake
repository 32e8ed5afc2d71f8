# SPDX-License-Identifier: Apache-2.0
# Build-time checks of the cuda provider that need parts of the CUDA
# toolkit (none needs a GPU or a driver; the provider itself is tested
# against the driver double in tests/providers/fake-cuda).
#
# cuda_driver_api_matches: providers/cuda/cuda_driver_api.h against the
# toolkit's cuda.h (constants, struct sizes, every entry's parameter
# types). Its checks are static_asserts: a mismatch fails the build of
# test_cuda_driver_api_matches, which ctest then reports as failing.
find_path(WIA_CUDA_H_DIR cuda.h HINTS /usr/local/cuda/include NO_DEFAULT_PATH)
if(WIA_CUDA_H_DIR)
  wia_add_unit_test(cuda_driver_api_matches
    SOURCES ${CMAKE_CURRENT_LIST_DIR}/cuda_driver_api_matches.cpp
    LIBS wia::plugin_api)
  target_include_directories(test_cuda_driver_api_matches PRIVATE
    ${PROJECT_SOURCE_DIR}/providers/cuda ${PROJECT_SOURCE_DIR}/tests)
  # SYSTEM: cuda.h is not ours to keep free of -Wextra warnings.
  target_include_directories(test_cuda_driver_api_matches SYSTEM PRIVATE ${WIA_CUDA_H_DIR})
endif()

# cuda_kernels_ptx_current: the committed PTX (the image of builds without
# nvcc) is what the kernels compile to now.
if(WIA_NVCC AND TARGET wia-cuda-kernels-ptx)
  add_test(NAME cuda_kernels_ptx_current
    COMMAND ${CMAKE_COMMAND}
            -DBUILT=${PROJECT_BINARY_DIR}/providers/cuda/wia_cuda_kernels.ptx
            -DCOMMITTED=${PROJECT_SOURCE_DIR}/providers/cuda/kernels/generated/wia_cuda_kernels.ptx
            -P ${CMAKE_CURRENT_LIST_DIR}/compare_ptx.cmake)
endif()
