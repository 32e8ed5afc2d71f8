# SPDX-License-Identifier: Apache-2.0
# One test per defect the fuzz targets found (docs/reliability.md, "Fuzzing"),
# so the default and sanitizer suites keep them fixed without the fuzz build.
# Each input is also in the fuzz corpus (fuzz/corpus/<target>/regress-*).
wia_add_unit_test(fuzz_regressions
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/fuzz_regressions_test.cpp
  LIBS wia_core_internal)
# fuzz/fuzz_secret.hpp: the bootstrap secret the fuzz inputs were made with.
target_include_directories(test_fuzz_regressions PRIVATE ${PROJECT_SOURCE_DIR})
