# SPDX-License-Identifier: Apache-2.0
# Collective schedules (core/coll) run through the simulated-network
# executor (tests/support), and the alpha-beta cost model (core/tuner).
#
# The CI run covers a sampled matrix in well under 30 s. The full matrix
# (every algorithm x nranks 1..8 x counts x int32/float32/bfloat16 x every
# op x in/out of place, plus all 10 dtypes on a sample) runs with
#   WIA_FULL_MATRIX=1 ./build/<dir>/bin/test_coll
wia_add_unit_test(coll
  SOURCES
    ${CMAKE_CURRENT_LIST_DIR}/schedule_test.cpp
    ${CMAKE_CURRENT_LIST_DIR}/matrix_test.cpp
    ${CMAKE_CURRENT_LIST_DIR}/sim_executor_test.cpp
    ${CMAKE_CURRENT_LIST_DIR}/cost_model_test.cpp
    ${CMAKE_CURRENT_LIST_DIR}/hierarchical_test.cpp
    ${CMAKE_CURRENT_LIST_DIR}/reference.cpp
  LIBS wia_test_support
  TIMEOUT 600)
