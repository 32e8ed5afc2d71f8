# SPDX-License-Identifier: Apache-2.0
# The provider loader against real shared objects (tests/providers and the
# host provider), through the core's base archive: the loader and what it
# calls, without the rest of the runtime.
wia_add_unit_test(loader
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/loader_test.cpp ${CMAKE_CURRENT_LIST_DIR}/abi_v1_test.cpp
  LIBS wia_core_base)
# The binary lands in <build>/bin, so the loader's "next to the core" rule
# resolves to <build>/<libdir>/wia/providers, as for an installed tool.
add_dependencies(test_loader wia_test_providers)
if(TARGET wia-provider-host)
  add_dependencies(test_loader wia-provider-host)
endif()
