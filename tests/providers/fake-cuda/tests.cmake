# SPDX-License-Identifier: Apache-2.0
# The CUDA driver test double (README.md in this folder) and the tests of
# the cuda provider against it:
#  - fake_cuda: the double's own test, through cuGetProcAddress_v2 only;
#  - conformance_cuda_fake: wia-conformance L0-L3 of libwia-provider-cuda.so
#    on the double (L3 includes IPC opened by a forked process);
#  - conformance_cuda_fake_stream_error: a failed launch reported by the
#    provider's stream_synchronize;
#  - provider_cuda_fake: the provider through the public C API: devices,
#    collectives on a communicator of two cuda devices, injected faults.
# The double is built into a folder of its own as libcuda.so.1 and never
# installed: nothing may find it but a test that names it.
set(WIA_FAKE_CUDA_DIR ${PROJECT_BINARY_DIR}/fake-cuda)
set(WIA_FAKE_CUDA_SRC ${CMAKE_CURRENT_LIST_DIR})

add_library(wia_fake_cuda SHARED
  ${WIA_FAKE_CUDA_SRC}/fake_entry.cpp
  ${WIA_FAKE_CUDA_SRC}/fake_errors.cpp
  ${WIA_FAKE_CUDA_SRC}/fake_memory.cpp
  ${WIA_FAKE_CUDA_SRC}/fake_streams.cpp
  ${WIA_FAKE_CUDA_SRC}/fake_kernels.cpp
  ${WIA_FAKE_CUDA_SRC}/fake_ipc.cpp)
set_target_properties(wia_fake_cuda PROPERTIES
  OUTPUT_NAME cuda PREFIX "lib" SUFFIX ".so.1"
  LIBRARY_OUTPUT_DIRECTORY ${WIA_FAKE_CUDA_DIR}
  CXX_VISIBILITY_PRESET hidden VISIBILITY_INLINES_HIDDEN ON)
# SYSTEM: the provider's headers are checked by the provider's own build;
# the double must not fail on their warnings.
target_include_directories(wia_fake_cuda SYSTEM PRIVATE ${PROJECT_SOURCE_DIR}/providers/cuda)
target_link_libraries(wia_fake_cuda PRIVATE wia_cpu_kernels wia_warnings Threads::Threads)
target_link_options(wia_fake_cuda PRIVATE -Wl,-soname,libcuda.so.1 -Wl,--no-undefined)
set(WIA_FAKE_CUDA_FILE ${WIA_FAKE_CUDA_DIR}/libcuda.so.1)

wia_add_unit_test(fake_cuda SOURCES ${WIA_FAKE_CUDA_SRC}/test_fake_cuda.cpp
  LIBS wia_cpu_kernels Threads::Threads ${CMAKE_DL_LIBS} TIMEOUT 120)
target_include_directories(test_fake_cuda SYSTEM PRIVATE ${PROJECT_SOURCE_DIR}/providers/cuda)
target_compile_definitions(test_fake_cuda PRIVATE WIA_FAKE_CUDA_FILE="${WIA_FAKE_CUDA_FILE}")
add_dependencies(test_fake_cuda wia_fake_cuda)

if(NOT TARGET wia-provider-cuda)
  return()
endif()

if(TARGET wia-conformance)
  # Passes only when wia-conformance exits 0 AND reports L3, the highest
  # level of a device provider. The double is named through the
  # provider's `library` parameter (wia-conformance reads no environment).
  add_test(NAME conformance_cuda_fake
    COMMAND /bin/sh -c "\"$0\" --provider \"$1\" --param library=\"$3\" --level 3 \
--junit \"$2\" > \"$2.log\" 2>&1; rc=$?; cat \"$2.log\"; \
[ $rc -eq 0 ] && grep -q 'highest level fully passed: L3' \"$2.log\""
      $<TARGET_FILE:wia-conformance> $<TARGET_FILE:wia-provider-cuda>
      ${CMAKE_CURRENT_BINARY_DIR}/conformance-cuda-fake.xml ${WIA_FAKE_CUDA_FILE})
  set_tests_properties(conformance_cuda_fake PROPERTIES TIMEOUT 600
    ENVIRONMENT "WIA_LOG_LEVEL=warn")

  # A kernel that fails on the GPU: the provider's stream_synchronize must
  # report it (naming cuStreamSynchronize and CUDA_ERROR_LAUNCH_FAILED),
  # so the reduction test FAILS with that message, neither passing nor
  # crashing or timing out.
  add_test(NAME conformance_cuda_fake_stream_error
    COMMAND /bin/sh -c "\"$0\" --provider \"$1\" --param library=\"$2\" \
--filter L2.reduce.float32 > \"$3\" 2>&1; cat \"$3\"; \
grep -q '^FAIL  L2.reduce.float32' \"$3\" && \
grep -q 'cuStreamSynchronize on device 0 (Fake CUDA Device 0): CUDA_ERROR_LAUNCH_FAILED' \"$3\""
      $<TARGET_FILE:wia-conformance> $<TARGET_FILE:wia-provider-cuda> ${WIA_FAKE_CUDA_FILE}
      ${CMAKE_CURRENT_BINARY_DIR}/conformance-cuda-fake-stream-error.log)
  set_tests_properties(conformance_cuda_fake_stream_error PROPERTIES TIMEOUT 120
    ENVIRONMENT "WIA_LOG_LEVEL=warn;WIA_FAKE_CUDA_FAULT=stream_error")
  add_dependencies(wia-conformance wia-provider-cuda wia_fake_cuda)
endif()

wia_add_unit_test(provider_cuda_fake SOURCES ${WIA_FAKE_CUDA_SRC}/test_provider_cuda_fake.cpp
  LIBS wia::core Threads::Threads TIMEOUT 300)
target_include_directories(test_provider_cuda_fake SYSTEM PRIVATE ${PROJECT_SOURCE_DIR}/providers/cuda)
target_link_libraries(test_provider_cuda_fake PRIVATE ${CMAKE_DL_LIBS})
target_compile_definitions(test_provider_cuda_fake PRIVATE
  WIA_FAKE_CUDA_FILE="${WIA_FAKE_CUDA_FILE}"
  WIA_CUDA_PROVIDER_FILE="$<TARGET_FILE:wia-provider-cuda>")
# Loads nothing but the cuda provider (WIA_PROVIDERS_ENABLE=cuda).
add_dependencies(test_provider_cuda_fake wia-provider-cuda wia_fake_cuda)
set_tests_properties(provider_cuda_fake PROPERTIES
  ENVIRONMENT "WIA_LOG_LEVEL=warn;WIA_CUDA_LIBRARY=${WIA_FAKE_CUDA_FILE}")

# tests/gpu/run.sh's benchmark on the double: one GPU as 4 logical devices
# (cuda.logical_devices_per_gpu), every data check of wia-cuda-bench (copies,
# the provider's reduce kernel through its ABI, a 4-rank all-reduce). The
# figures mean nothing here; the exit status says the data was right.
if(TARGET wia-cuda-bench)
  add_test(NAME tool_wia_cuda_bench_fake
    COMMAND $<TARGET_FILE:wia-cuda-bench> --size 1M --iters 2 --rounds 1 --ranks 4)
  set_tests_properties(tool_wia_cuda_bench_fake PROPERTIES TIMEOUT 120
    PASS_REGULAR_EXPRESSION "all data checks passed"
    ENVIRONMENT "WIA_PROVIDERS_ENABLE=cuda;WIA_CUDA_LIBRARY=${WIA_FAKE_CUDA_FILE};WIA_FAKE_CUDA_DEVICES=1;WIA_CUDA_LOGICAL_DEVICES_PER_GPU=4;WIA_CUDA_BENCH_PROVIDER=$<TARGET_FILE:wia-provider-cuda>;WIA_LOG_LEVEL=warn")
  add_dependencies(wia-cuda-bench wia-provider-cuda wia_fake_cuda)
endif()
