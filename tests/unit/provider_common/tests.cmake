# SPDX-License-Identifier: Apache-2.0
# The shared helpers (providers/common): the size grammar that config
# values, provider parameters and tool options all go through, and what the
# accelerator providers share (IPC header, vendor error text, library list,
# the table of their allocations and the dma-buf export's range).
wia_add_unit_test(provider_common
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/text_test.cpp
    ${CMAKE_CURRENT_LIST_DIR}/accelerator_helpers_test.cpp
    ${CMAKE_CURRENT_LIST_DIR}/memory_registry_test.cpp
  LIBS wia_provider_common)
