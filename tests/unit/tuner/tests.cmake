# SPDX-License-Identifier: Apache-2.0
# The alpha-beta cost model (core/tuner) over the registered algorithms.
wia_add_unit_test(tuner SOURCES ${CMAKE_CURRENT_LIST_DIR}/cost_model_test.cpp
  LIBS wia_core_internal)
