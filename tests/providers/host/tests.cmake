# SPDX-License-Identifier: Apache-2.0
# Drives libwia-provider-host.so through the raw ABI only (dlopen), the way
# the core does, with a host-services table implemented by the test.
wia_add_unit_test(host_provider
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_host_provider.cpp
  LIBS wia_cpu_kernels wia::plugin_api Threads::Threads ${CMAKE_DL_LIBS})
add_dependencies(test_host_provider wia-provider-host)
wia_tsan_test(test_host_provider host_provider)  # its stream worker threads
