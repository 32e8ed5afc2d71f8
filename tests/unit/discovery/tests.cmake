# SPDX-License-Identifier: Apache-2.0
# Discovery (core/src/discovery): what this process finds on its machine.
# The test keeps its name from when discovery lived in topology/.

# Discovery with measured links (tuner.link_file): matched pairs, provider
# figures elsewhere, warnings for files it cannot use.
wia_add_unit_test(topology_discover_link_file
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/link_file_test.cpp LIBS wia::core TIMEOUT 60)
if(TARGET wia-provider-host)
  add_dependencies(test_topology_discover_link_file wia-provider-host)
endif()
