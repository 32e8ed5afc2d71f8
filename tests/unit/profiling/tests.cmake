# SPDX-License-Identifier: Apache-2.0
# The profiler's counting, sampling and pending ring (core/src/comm/comm_profiler.cpp),
# alone: compiled into the test, so the ThreadSanitizer build of it is small.
wia_add_unit_test(comm_profiler
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/comm_profiler_test.cpp
          ${PROJECT_SOURCE_DIR}/core/src/comm/comm_profiler.cpp
  LIBS wia::plugin_api TIMEOUT 120)
target_include_directories(test_comm_profiler PRIVATE ${PROJECT_SOURCE_DIR}/core/src
                                                      ${PROJECT_SOURCE_DIR}/core/include)
wia_tsan_test(test_comm_profiler comm_profiler)
