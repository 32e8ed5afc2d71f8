# SPDX-License-Identifier: Apache-2.0
# Compression codecs (core/src/compress): pure functions, tested through the
# core's internal archive against references computed in double.
wia_add_unit_test(compress_codecs SOURCES ${CMAKE_CURRENT_LIST_DIR}/codec_test.cpp
  LIBS wia_core_internal TIMEOUT 120)

# The compressed and sparse all-reduce through the public C API on 4
# in-process host devices (a device communicator).
wia_add_unit_test(compress_api SOURCES ${CMAKE_CURRENT_LIST_DIR}/compress_api_test.cpp
  LIBS wia::core TIMEOUT 900)  # 151 s under the sanitizers, 294 s on a loaded machine
if(TARGET wia-provider-host)
  add_dependencies(test_compress_api wia-provider-host)
endif()

# Spec 6.8's snippets as C11 on 2 host devices.
add_executable(test_spec_compression_c ${CMAKE_CURRENT_LIST_DIR}/spec_compression.c)
target_link_libraries(test_spec_compression_c PRIVATE wia::core wia_warnings m)
if(TARGET wia-provider-host)
  add_dependencies(test_spec_compression_c wia-provider-host)
endif()
add_test(NAME spec_compression_c COMMAND test_spec_compression_c)
set_tests_properties(spec_compression_c PROPERTIES TIMEOUT 120
  ENVIRONMENT "WIA_HOST_DEVICES=2;WIA_LOG_LEVEL=warn")

# wia-compress-bench at a small size: it exits 1 when an int8 decoding
# leaves its bound or the baseline and AVX2 copies disagree. Its speeds are
# printed, never asserted.
if(TARGET wia-compress-bench)
  add_test(NAME tool_wia_compress_bench COMMAND wia-compress-bench --size 1M --reps 1)
  set_tests_properties(tool_wia_compress_bench PROPERTIES TIMEOUT 120)
endif()
