# SPDX-License-Identifier: Apache-2.0
# Process communicators with real processes, the real bootstrap and the
# real shm and tcp transport providers (docs/processes.md).
wia_add_unit_test(process_comm SOURCES ${CMAKE_CURRENT_LIST_DIR}/process_comm_test.cpp
                  LIBS wia_core_internal TIMEOUT 900)
foreach(p host shm tcp)
  if(TARGET wia-provider-${p})
    add_dependencies(test_process_comm wia-provider-${p})
  endif()
endforeach()
