# SPDX-License-Identifier: Apache-2.0
# The Level Zero loader test double (README.md in this folder) and the tests
# of the ze provider against it, all through wia-conformance (the provider
# only through its ABI):
#  - conformance_ze_fake: L0-L3 must pass (L3 includes IPC opened by a
#    forked process, and L3.dmabuf.export through zeMemGetAllocProperties);
#  - conformance_ze_fake_no_dmabuf: a device that cannot export dma-bufs:
#    its allocations are not made exportable and the export is a SKIP with
#    the reason;
#  - conformance_ze_fake_stream_error: a device lost on a stream is
#    reported by the provider's stream_synchronize, naming the call;
#  - conformance_ze_fake_oom: zeMemAllocDevice out of memory is
#    OUT_OF_MEMORY with the call in the message;
#  - conformance_ze_no_library / conformance_ze_fake_no_device /
#    conformance_ze_fake_init_fails: the clean absence (UNAVAILABLE with its
#    cause; every test skips, exit 0).
# The double is built into a folder of its own as libze_loader.so.1 and
# never installed: nothing may find it but a test that names it.
set(WIA_FAKE_ZE_DIR ${PROJECT_BINARY_DIR}/fake-ze)

add_library(wia_fake_ze SHARED ${CMAKE_CURRENT_LIST_DIR}/fake_ze.cpp)
set_target_properties(wia_fake_ze PROPERTIES
  OUTPUT_NAME ze_loader PREFIX "lib" SUFFIX ".so.1"
  LIBRARY_OUTPUT_DIRECTORY ${WIA_FAKE_ZE_DIR}
  CXX_VISIBILITY_PRESET hidden VISIBILITY_INLINES_HIDDEN ON)
target_include_directories(wia_fake_ze SYSTEM PRIVATE ${PROJECT_SOURCE_DIR}/providers/ze)
target_link_libraries(wia_fake_ze PRIVATE wia_warnings Threads::Threads)
target_link_options(wia_fake_ze PRIVATE -Wl,-soname,libze_loader.so.1 -Wl,--no-undefined)
set(WIA_FAKE_ZE_FILE ${WIA_FAKE_ZE_DIR}/libze_loader.so.1)

if(NOT TARGET wia-provider-ze OR NOT TARGET wia-conformance)
  return()
endif()
add_dependencies(wia-conformance wia-provider-ze wia_fake_ze)

# Passes only when wia-conformance exits 0 AND reports L3, the highest
# level of a device provider. The double is named through the provider's
# `library` parameter (wia-conformance reads no environment).
add_test(NAME conformance_ze_fake
  COMMAND /bin/sh -c "\"$0\" --provider \"$1\" --param library=\"$3\" --level 3 \
--junit \"$2\" > \"$2.log\" 2>&1; rc=$?; cat \"$2.log\"; \
[ $rc -eq 0 ] && grep -q 'highest level fully passed: L3' \"$2.log\" && \
grep -q '^PASS  L3.dmabuf.export' \"$2.log\""
    $<TARGET_FILE:wia-conformance> $<TARGET_FILE:wia-provider-ze>
    ${CMAKE_CURRENT_BINARY_DIR}/conformance-ze-fake.xml ${WIA_FAKE_ZE_FILE})
set_tests_properties(conformance_ze_fake PROPERTIES TIMEOUT 600
  ENVIRONMENT "WIA_LOG_LEVEL=warn")

# A device whose external memory properties offer no DMA_BUF export: the
# export is a SKIP with the provider's reason. The double refuses an
# allocation that asks to be exportable there, so the test's own mem_alloc
# would FAIL it if the provider asked anyway.
add_test(NAME conformance_ze_fake_no_dmabuf
  COMMAND /bin/sh -c "\"$0\" --provider \"$1\" --param library=\"$2\" \
--filter L3.dmabuf.export > \"$3\" 2>&1; rc=$?; cat \"$3\"; [ $rc -eq 0 ] && \
grep -q '^SKIP  L3.dmabuf.export .*the device does not export dma-bufs (zeDeviceGetExternalMemoryProperties' \"$3\""
    $<TARGET_FILE:wia-conformance> $<TARGET_FILE:wia-provider-ze> ${WIA_FAKE_ZE_FILE}
    ${CMAKE_CURRENT_BINARY_DIR}/conformance-ze-fake-no-dmabuf.log)
set_tests_properties(conformance_ze_fake_no_dmabuf PROPERTIES TIMEOUT 120
  ENVIRONMENT "WIA_LOG_LEVEL=warn;WIA_FAKE_ZE_FAULT=no_dmabuf")

# The device is lost while a stream runs the staged reduction: the test
# FAILS with the provider's message, neither passing nor hanging.
add_test(NAME conformance_ze_fake_stream_error
  COMMAND /bin/sh -c "\"$0\" --provider \"$1\" --param library=\"$2\" \
--filter L2.reduce.float32 > \"$3\" 2>&1; cat \"$3\"; \
grep -q '^FAIL  L2.reduce.float32' \"$3\" && \
grep -q 'stream_synchronize: zeEventHostSynchronize(fence) on device 0 (Fake ZE Device 0): ZE_RESULT_ERROR_DEVICE_LOST' \"$3\""
    $<TARGET_FILE:wia-conformance> $<TARGET_FILE:wia-provider-ze> ${WIA_FAKE_ZE_FILE}
    ${CMAKE_CURRENT_BINARY_DIR}/conformance-ze-fake-stream-error.log)
set_tests_properties(conformance_ze_fake_stream_error PROPERTIES TIMEOUT 120
  ENVIRONMENT "WIA_LOG_LEVEL=warn;WIA_FAKE_ZE_FAULT=stream_error")

# Device memory exhausted: OUT_OF_MEMORY naming zeMemAllocDevice, not a crash.
add_test(NAME conformance_ze_fake_oom
  COMMAND /bin/sh -c "\"$0\" --provider \"$1\" --param library=\"$2\" \
--filter L1.alloc.sizes > \"$3\" 2>&1; cat \"$3\"; \
grep -q '^FAIL  L1.alloc.sizes' \"$3\" && \
grep -q 'zeMemAllocDevice(0 bytes) on device 0 (Fake ZE Device 0): ZE_RESULT_ERROR_OUT_OF_DEVICE_MEMORY' \"$3\""
    $<TARGET_FILE:wia-conformance> $<TARGET_FILE:wia-provider-ze> ${WIA_FAKE_ZE_FILE}
    ${CMAKE_CURRENT_BINARY_DIR}/conformance-ze-fake-oom.log)
set_tests_properties(conformance_ze_fake_oom PROPERTIES TIMEOUT 120
  ENVIRONMENT "WIA_LOG_LEVEL=warn;WIA_FAKE_ZE_FAULT=oom")

# No loader at all: init is UNAVAILABLE with the dlopen cause, so every
# test skips ("provider unavailable here") and the run exits 0.
add_test(NAME conformance_ze_no_library
  COMMAND /bin/sh -c "\"$0\" --provider \"$1\" --param library=/nonexistent/libze_loader.so.1 \
--filter L0.init_fini > \"$2\" 2>&1; rc=$?; cat \"$2\"; [ $rc -eq 0 ] && \
grep -q 'provider unavailable here: Level Zero loader not found (dlopen /nonexistent/libze_loader.so.1' \"$2\""
    $<TARGET_FILE:wia-conformance> $<TARGET_FILE:wia-provider-ze>
    ${CMAKE_CURRENT_BINARY_DIR}/conformance-ze-no-library.log)
set_tests_properties(conformance_ze_no_library PROPERTIES TIMEOUT 60
  ENVIRONMENT "WIA_LOG_LEVEL=warn")

# A driver without devices: UNAVAILABLE naming zeDeviceGet.
add_test(NAME conformance_ze_fake_no_device
  COMMAND /bin/sh -c "\"$0\" --provider \"$1\" --param library=\"$2\" \
--filter L0.init_fini > \"$3\" 2>&1; rc=$?; cat \"$3\"; [ $rc -eq 0 ] && \
grep -q 'provider unavailable here: no Level Zero device (zeDeviceGet: 0 devices on 1 driver(s))' \"$3\""
    $<TARGET_FILE:wia-conformance> $<TARGET_FILE:wia-provider-ze> ${WIA_FAKE_ZE_FILE}
    ${CMAKE_CURRENT_BINARY_DIR}/conformance-ze-fake-no-device.log)
set_tests_properties(conformance_ze_fake_no_device PROPERTIES TIMEOUT 60
  ENVIRONMENT "WIA_LOG_LEVEL=warn;WIA_FAKE_ZE_DEVICES=0")

# A loader whose zeInit fails (no driver): UNAVAILABLE naming it.
add_test(NAME conformance_ze_fake_init_fails
  COMMAND /bin/sh -c "\"$0\" --provider \"$1\" --param library=\"$2\" \
--filter L0.init_fini > \"$3\" 2>&1; rc=$?; cat \"$3\"; [ $rc -eq 0 ] && \
grep -q 'provider unavailable here: no Level Zero driver: zeInit (.*libze_loader.so.1): ZE_RESULT_ERROR_UNINITIALIZED' \"$3\""
    $<TARGET_FILE:wia-conformance> $<TARGET_FILE:wia-provider-ze> ${WIA_FAKE_ZE_FILE}
    ${CMAKE_CURRENT_BINARY_DIR}/conformance-ze-fake-init-fails.log)
set_tests_properties(conformance_ze_fake_init_fails PROPERTIES TIMEOUT 60
  ENVIRONMENT "WIA_LOG_LEVEL=warn;WIA_FAKE_ZE_FAULT=init")

# The provider through the public C API: devices, an all-reduce over the two
# fake GPUs (host-staged reduce_async), and the absence without a loader.
wia_add_unit_test(provider_ze_fake SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_provider_ze_fake.cpp
  LIBS wia::core Threads::Threads ${CMAKE_DL_LIBS} TIMEOUT 300)
target_compile_definitions(test_provider_ze_fake PRIVATE
  WIA_FAKE_ZE_FILE="${WIA_FAKE_ZE_FILE}"
  WIA_ZE_PROVIDER_FILE="$<TARGET_FILE:wia-provider-ze>")
add_dependencies(test_provider_ze_fake wia-provider-ze wia_fake_ze)
