# SPDX-License-Identifier: Apache-2.0
# Spec 6.10.1 wia_send / wia_recv between real processes, over the real
# bootstrap and the shm and tcp transports (docs/point-to-point.md); device
# buffers through the CUDA test double (tests/providers/fake-cuda), staged
# through pinned host memory.
wia_add_unit_test(p2p_send SOURCES ${CMAKE_CURRENT_LIST_DIR}/p2p_send_test.cpp
                  LIBS wia::core TIMEOUT 600)
target_include_directories(test_p2p_send PRIVATE ${CMAKE_CURRENT_LIST_DIR}/../processes)
wia_test_loads_providers(test_p2p_send)
# The double's path is fixed by tests/providers/fake-cuda/tests.cmake
# (included after this file); the device cases SKIP without the provider.
if(TARGET wia-provider-cuda)
  add_dependencies(test_p2p_send wia-provider-cuda wia_fake_cuda)
  target_compile_definitions(test_p2p_send PRIVATE
    WIA_FAKE_CUDA_FILE="${PROJECT_BINARY_DIR}/fake-cuda/libcuda.so.1")
endif()

# Spec 6.10.1's snippet as C11, run as a one-process job.
add_executable(test_spec_gpudirect_c ${CMAKE_CURRENT_LIST_DIR}/spec_gpudirect.c)
target_link_libraries(test_spec_gpudirect_c PRIVATE wia::core wia_warnings)
add_dependencies(test_spec_gpudirect_c wia-provider-host)
add_test(NAME spec_gpudirect_c COMMAND test_spec_gpudirect_c)
set_tests_properties(spec_gpudirect_c PROPERTIES TIMEOUT 120
  ENVIRONMENT "WIA_HOST_DEVICES=1;WIA_RANK=0;WIA_WORLD_SIZE=1;WIA_LOG_LEVEL=warn")

# The seed's 6.10 example forced onto ofi by YAML (issue 21), when this tree
# builds the ofi provider.
if(TARGET wia-provider-ofi)
  wia_add_filtered_test(p2p_send_ofi test_p2p_send "*forced onto ofi*")
  set_tests_properties(p2p_send_ofi PROPERTIES TIMEOUT 300 ENVIRONMENT "WIA_TEST_OFI=1")
  add_dependencies(test_p2p_send wia-provider-ofi)
endif()

# p2p_dmabuf_test.cpp (device buffers through a dma-buf registration) is
# registered by tests/providers/verbs/tests.cmake, after the doubles it needs.
