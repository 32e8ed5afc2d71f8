# SPDX-License-Identifier: Apache-2.0
# The shared text helpers (providers/common): the size grammar that config
# values, provider parameters and tool options all go through.
wia_add_unit_test(provider_common
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/text_test.cpp
  LIBS wia_provider_common)
