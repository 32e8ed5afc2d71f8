# SPDX-License-Identifier: Apache-2.0
# The alpha-beta cost model (core/tuner) over the registered algorithms, and
# the choice of compression between hosts it makes (link_codec), and its
# fidelity on recorded links (fidelity_test: tests/data/links-*.yaml), and
# the cost of the node-shared windows' all-reduce (window_cost_test).
wia_add_unit_test(tuner SOURCES ${CMAKE_CURRENT_LIST_DIR}/cost_model_test.cpp
  ${CMAKE_CURRENT_LIST_DIR}/link_codec_test.cpp ${CMAKE_CURRENT_LIST_DIR}/fidelity_test.cpp
  ${CMAKE_CURRENT_LIST_DIR}/window_cost_test.cpp LIBS wia_core_internal)
