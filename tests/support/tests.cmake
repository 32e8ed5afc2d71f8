# SPDX-License-Identifier: Apache-2.0
# Code tests share, never shipped in libwia.so: the simulated-network
# executor (sim_executor.hpp), the oracle the schedule tests run every
# builder through. Included as "support/<file>.hpp".
add_library(wia_test_support STATIC ${CMAKE_CURRENT_LIST_DIR}/sim_executor.cpp)
target_include_directories(wia_test_support PUBLIC ${PROJECT_SOURCE_DIR}/tests)
target_link_libraries(wia_test_support PUBLIC wia_core_internal PRIVATE wia_warnings)

# Header only, no core: the host services of tests that load a provider
# through the ABI alone (recording_host.hpp).
add_library(wia_test_provider_host INTERFACE)
target_include_directories(wia_test_provider_host INTERFACE ${PROJECT_SOURCE_DIR}/tests)
target_link_libraries(wia_test_provider_host INTERFACE wia::plugin_api)
