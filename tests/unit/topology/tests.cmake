# SPDX-License-Identifier: Apache-2.0
# Topology files and analysis (spec 6.2, 6.2.1) through the public API, which
# also discovers; discovery with measured links is in unit/discovery.
wia_add_unit_test(topology_api SOURCES ${CMAKE_CURRENT_LIST_DIR}/topology_api_test.cpp
  LIBS wia::core)
if(TARGET wia-provider-host)
  add_dependencies(test_topology_api wia-provider-host)
endif()

# Analysis internals (exact vs heuristic bisection).
wia_add_unit_test(topology_analysis SOURCES ${CMAKE_CURRENT_LIST_DIR}/analysis_test.cpp
  LIBS wia_core_internal)

# Spec 6.2 discovery, 6.2.1 analysis and placement, 6.2.2 benchmark, as C11, on 2 host devices.
add_executable(test_topology_spec_c ${CMAKE_CURRENT_LIST_DIR}/spec_topology.c)
target_link_libraries(test_topology_spec_c PRIVATE wia::core wia_warnings)
if(TARGET wia-provider-host)
  add_dependencies(test_topology_spec_c wia-provider-host)
endif()
add_test(NAME topology_spec_c COMMAND test_topology_spec_c)
set_tests_properties(topology_spec_c PROPERTIES TIMEOUT 120
  ENVIRONMENT "WIA_HOST_DEVICES=2;WIA_LOG_LEVEL=warn")

# NUMA/process placement in files, declared-vs-detected diff, measured links
# for the tuner (tuner.link_file).
wia_add_unit_test(topology_links SOURCES ${CMAKE_CURRENT_LIST_DIR}/links_test.cpp
  LIBS wia_core_internal TIMEOUT 120)

