# SPDX-License-Identifier: Apache-2.0
# The HIP runtime test double (README.md in this folder) and the tests of
# the hip provider against it, all through wia-conformance (the provider
# only through its ABI):
#  - conformance_hip_fake: L0-L3 must pass (L3 includes IPC opened by a
#    forked process, and L3.dmabuf.export through
#    hipMemGetHandleForAddressRange);
#  - conformance_hip_fake_rocm52: the same on ROCm 5.2's exports, where
#    L3.dmabuf.export is a SKIP naming the missing entry;
#  - conformance_hip_fake_stream_error: a device fault on a stream is
#    reported by the provider's stream_synchronize, naming the call;
#  - conformance_hip_fake_oom: hipMalloc out of memory is OUT_OF_MEMORY
#    with the call in the message;
#  - conformance_hip_no_library / conformance_hip_fake_no_device: the clean
#    absence (UNAVAILABLE with its cause; every test skips, exit 0).
# The double is built into a folder of its own as libamdhip64.so.5 and never
# installed: nothing may find it but a test that names it.
set(WIA_FAKE_HIP_DIR ${PROJECT_BINARY_DIR}/fake-hip)

add_library(wia_fake_hip SHARED ${CMAKE_CURRENT_LIST_DIR}/fake_hip.cpp)
set_target_properties(wia_fake_hip PROPERTIES
  OUTPUT_NAME amdhip64 PREFIX "lib" SUFFIX ".so.5"
  LIBRARY_OUTPUT_DIRECTORY ${WIA_FAKE_HIP_DIR}
  CXX_VISIBILITY_PRESET hidden VISIBILITY_INLINES_HIDDEN ON)
target_include_directories(wia_fake_hip SYSTEM PRIVATE ${PROJECT_SOURCE_DIR}/providers/hip)
target_link_libraries(wia_fake_hip PRIVATE wia_warnings Threads::Threads)
target_link_options(wia_fake_hip PRIVATE -Wl,-soname,libamdhip64.so.5 -Wl,--no-undefined)
set(WIA_FAKE_HIP_FILE ${WIA_FAKE_HIP_DIR}/libamdhip64.so.5)

# The same double as Debian's ROCm 5.2 runtime: no hipLaunchHostFunc
# exported, so the provider queues host functions with hipStreamAddCallback.
add_library(wia_fake_hip_rocm52 SHARED ${CMAKE_CURRENT_LIST_DIR}/fake_hip.cpp)
set_target_properties(wia_fake_hip_rocm52 PROPERTIES
  OUTPUT_NAME amdhip64 PREFIX "lib" SUFFIX ".so.5"
  LIBRARY_OUTPUT_DIRECTORY ${WIA_FAKE_HIP_DIR}/rocm52
  CXX_VISIBILITY_PRESET hidden VISIBILITY_INLINES_HIDDEN ON)
target_compile_definitions(wia_fake_hip_rocm52 PRIVATE FAKE_HIP_ROCM52)
target_include_directories(wia_fake_hip_rocm52 SYSTEM PRIVATE ${PROJECT_SOURCE_DIR}/providers/hip)
target_link_libraries(wia_fake_hip_rocm52 PRIVATE wia_warnings Threads::Threads)
target_link_options(wia_fake_hip_rocm52 PRIVATE -Wl,-soname,libamdhip64.so.5 -Wl,--no-undefined)
set(WIA_FAKE_HIP_ROCM52_FILE ${WIA_FAKE_HIP_DIR}/rocm52/libamdhip64.so.5)

if(NOT TARGET wia-provider-hip OR NOT TARGET wia-conformance)
  return()
endif()
add_dependencies(wia-conformance wia-provider-hip wia_fake_hip wia_fake_hip_rocm52)

# Passes only when wia-conformance exits 0 AND reports L3, the highest
# level of a device provider. The double is named through the provider's
# `library` parameter (wia-conformance reads no environment).
add_test(NAME conformance_hip_fake
  COMMAND /bin/sh -c "\"$0\" --provider \"$1\" --param library=\"$3\" --level 3 \
--junit \"$2\" > \"$2.log\" 2>&1; rc=$?; cat \"$2.log\"; \
[ $rc -eq 0 ] && grep -q 'highest level fully passed: L3' \"$2.log\" && \
grep -q '^PASS  L3.dmabuf.export' \"$2.log\""
    $<TARGET_FILE:wia-conformance> $<TARGET_FILE:wia-provider-hip>
    ${CMAKE_CURRENT_BINARY_DIR}/conformance-hip-fake.xml ${WIA_FAKE_HIP_FILE})
set_tests_properties(conformance_hip_fake PROPERTIES TIMEOUT 600
  ENVIRONMENT "WIA_LOG_LEVEL=warn")

# On ROCm 5.2's exports (no hipLaunchHostFunc, no
# hipMemGetHandleForAddressRange): L0-L3 again, host functions and the
# staged reductions through hipStreamAddCallback; the dma-buf export is a
# SKIP that names the missing entry (the provider still claims CAP_DMABUF).
add_test(NAME conformance_hip_fake_rocm52
  COMMAND /bin/sh -c "\"$0\" --provider \"$1\" --param library=\"$3\" --level 3 \
--junit \"$2\" > \"$2.log\" 2>&1; rc=$?; cat \"$2.log\"; \
[ $rc -eq 0 ] && grep -q 'highest level fully passed: L3' \"$2.log\" && \
grep -q '^SKIP  L3.dmabuf.export .*has no hipMemGetHandleForAddressRange' \"$2.log\""
    $<TARGET_FILE:wia-conformance> $<TARGET_FILE:wia-provider-hip>
    ${CMAKE_CURRENT_BINARY_DIR}/conformance-hip-fake-rocm52.xml ${WIA_FAKE_HIP_ROCM52_FILE})
set_tests_properties(conformance_hip_fake_rocm52 PROPERTIES TIMEOUT 600
  ENVIRONMENT "WIA_LOG_LEVEL=warn")

# A fault on the "device" while a stream runs the staged reduction: the
# test FAILS with the provider's message, neither passing nor hanging.
add_test(NAME conformance_hip_fake_stream_error
  COMMAND /bin/sh -c "\"$0\" --provider \"$1\" --param library=\"$2\" \
--filter L2.reduce.float32 > \"$3\" 2>&1; cat \"$3\"; \
grep -q '^FAIL  L2.reduce.float32' \"$3\" && \
grep -q 'hipStreamSynchronize on device 0 (Fake HIP Device 0): hipErrorIllegalAddress' \"$3\""
    $<TARGET_FILE:wia-conformance> $<TARGET_FILE:wia-provider-hip> ${WIA_FAKE_HIP_FILE}
    ${CMAKE_CURRENT_BINARY_DIR}/conformance-hip-fake-stream-error.log)
set_tests_properties(conformance_hip_fake_stream_error PROPERTIES TIMEOUT 120
  ENVIRONMENT "WIA_LOG_LEVEL=warn;WIA_FAKE_HIP_FAULT=stream_error")

# Device memory exhausted: OUT_OF_MEMORY naming hipMalloc, not a crash.
add_test(NAME conformance_hip_fake_oom
  COMMAND /bin/sh -c "\"$0\" --provider \"$1\" --param library=\"$2\" \
--filter L1.alloc.sizes > \"$3\" 2>&1; cat \"$3\"; \
grep -q '^FAIL  L1.alloc.sizes' \"$3\" && \
grep -q 'hipMalloc(0 bytes) on device 0 (Fake HIP Device 0): hipErrorOutOfMemory' \"$3\""
    $<TARGET_FILE:wia-conformance> $<TARGET_FILE:wia-provider-hip> ${WIA_FAKE_HIP_FILE}
    ${CMAKE_CURRENT_BINARY_DIR}/conformance-hip-fake-oom.log)
set_tests_properties(conformance_hip_fake_oom PROPERTIES TIMEOUT 120
  ENVIRONMENT "WIA_LOG_LEVEL=warn;WIA_FAKE_HIP_FAULT=oom")

# No HIP runtime at all: init is UNAVAILABLE with the dlopen cause, so
# every test skips ("provider unavailable here") and the run exits 0.
add_test(NAME conformance_hip_no_library
  COMMAND /bin/sh -c "\"$0\" --provider \"$1\" --param library=/nonexistent/libamdhip64.so.5 \
--filter L0.init_fini > \"$2\" 2>&1; rc=$?; cat \"$2\"; [ $rc -eq 0 ] && \
grep -q 'provider unavailable here: HIP runtime not found (dlopen /nonexistent/libamdhip64.so.5' \"$2\""
    $<TARGET_FILE:wia-conformance> $<TARGET_FILE:wia-provider-hip>
    ${CMAKE_CURRENT_BINARY_DIR}/conformance-hip-no-library.log)
set_tests_properties(conformance_hip_no_library PROPERTIES TIMEOUT 60
  ENVIRONMENT "WIA_LOG_LEVEL=warn")

# A runtime but no GPU: UNAVAILABLE naming hipGetDeviceCount.
add_test(NAME conformance_hip_fake_no_device
  COMMAND /bin/sh -c "\"$0\" --provider \"$1\" --param library=\"$2\" \
--filter L0.init_fini > \"$3\" 2>&1; rc=$?; cat \"$3\"; [ $rc -eq 0 ] && \
grep -q 'provider unavailable here: no HIP device (hipGetDeviceCount: hipErrorNoDevice)' \"$3\""
    $<TARGET_FILE:wia-conformance> $<TARGET_FILE:wia-provider-hip> ${WIA_FAKE_HIP_FILE}
    ${CMAKE_CURRENT_BINARY_DIR}/conformance-hip-fake-no-device.log)
set_tests_properties(conformance_hip_fake_no_device PROPERTIES TIMEOUT 60
  ENVIRONMENT "WIA_LOG_LEVEL=warn;WIA_FAKE_HIP_DEVICES=0")

# The provider through the public C API: devices, an all-reduce over the two
# fake GPUs (host-staged reduce_async), and the absence without a runtime.
wia_add_unit_test(provider_hip_fake SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_provider_hip_fake.cpp
  LIBS wia::core Threads::Threads TIMEOUT 300)
target_compile_definitions(test_provider_hip_fake PRIVATE
  WIA_FAKE_HIP_FILE="${WIA_FAKE_HIP_FILE}"
  WIA_HIP_PROVIDER_FILE="$<TARGET_FILE:wia-provider-hip>")
add_dependencies(test_provider_hip_fake wia-provider-hip wia_fake_hip)

# A runtime whose hipInit fails (no usable driver): UNAVAILABLE naming it.
if(TARGET wia-conformance)
  add_test(NAME conformance_hip_fake_init_fails
    COMMAND /bin/sh -c "\"$0\" --provider \"$1\" --param library=\"$2\" \
--filter L0.init_fini > \"$3\" 2>&1; rc=$?; cat \"$3\"; [ $rc -eq 0 ] && \
grep -q 'provider unavailable here: hipInit (.*libamdhip64.so.5): hipErrorInsufficientDriver' \"$3\""
      $<TARGET_FILE:wia-conformance> $<TARGET_FILE:wia-provider-hip> ${WIA_FAKE_HIP_FILE}
      ${CMAKE_CURRENT_BINARY_DIR}/conformance-hip-fake-init-fails.log)
  set_tests_properties(conformance_hip_fake_init_fails PROPERTIES TIMEOUT 60
    ENVIRONMENT "WIA_LOG_LEVEL=warn;WIA_FAKE_HIP_FAULT=init")
endif()
