# SPDX-License-Identifier: Apache-2.0
# Process communicators with real processes, the real bootstrap and the
# real shm and tcp transport providers (docs/processes.md).
wia_add_unit_test(process_comm SOURCES ${CMAKE_CURRENT_LIST_DIR}/process_comm_test.cpp
                  LIBS wia_core_internal TIMEOUT 900)
wia_test_loads_providers(test_process_comm)
# Not a heartbeat test (heartbeat_test is): a 5 s heartbeat timeout keeps a
# rank slowed by ASan on an oversubscribed machine from being declared dead
# (seen 1 run in 3 at load 14 with 1.5 s); its kill test still fails within
# its 15 s collective timeout.
set_tests_properties(process_comm PROPERTIES
  ENVIRONMENT "WIA_LOG_LEVEL=warn;WIA_COLLECTIVES_HEARTBEAT_TIMEOUT_MS=5000")
# The one-shot and node-window all-reduce paths and their fallbacks.
wia_add_unit_test(allreduce_paths SOURCES ${CMAKE_CURRENT_LIST_DIR}/allreduce_paths_test.cpp
                  LIBS wia_core_internal TIMEOUT 900)
wia_test_loads_providers(test_allreduce_paths)

# The flight recorder's dumps and wia-info --analyse (docs/flight-recorder.md).
wia_add_unit_test(flight_recorder SOURCES ${CMAKE_CURRENT_LIST_DIR}/flight_recorder_test.cpp
                  LIBS wia::core TIMEOUT 300)
wia_test_loads_providers(test_flight_recorder)
add_dependencies(test_flight_recorder wia-info)
target_compile_definitions(test_flight_recorder PRIVATE WIA_TEST_WIA_INFO="$<TARGET_FILE:wia-info>")

# Spec 6.9.1: pairs of ranks cross-check their gradients.
wia_add_unit_test(redundancy SOURCES ${CMAKE_CURRENT_LIST_DIR}/redundancy_test.cpp
                  LIBS wia::core TIMEOUT 300)
wia_test_loads_providers(test_redundancy)

# WIA_RECOVERY_INSTANT: a partner's copy stands in for a SIGKILLed rank.
wia_add_unit_test(redundancy_instant SOURCES ${CMAKE_CURRENT_LIST_DIR}/redundancy_instant_test.cpp
                  LIBS wia::core TIMEOUT 300)
wia_test_loads_providers(test_redundancy_instant)

# Spec 6.11 profiling of a process communicator (docs/profiling.md).
wia_add_unit_test(profiling SOURCES ${CMAKE_CURRENT_LIST_DIR}/profiling_test.cpp
                  LIBS wia::core TIMEOUT 300)
wia_test_loads_providers(test_profiling)

# Checkpoints saved and loaded by the ranks of one job (docs/checkpoints.md).
wia_add_unit_test(checkpoint_ranks SOURCES ${CMAKE_CURRENT_LIST_DIR}/checkpoint_ranks_test.cpp
                  LIBS wia::core TIMEOUT 300)
wia_test_loads_providers(test_checkpoint_ranks)
add_dependencies(test_checkpoint_ranks wia-info)
target_compile_definitions(test_checkpoint_ranks PRIVATE WIA_TEST_WIA_INFO="$<TARGET_FILE:wia-info>")

# Spec 6.10's snippet as C11, run as a one-process job.
add_executable(test_spec_distributed_c ${CMAKE_CURRENT_LIST_DIR}/spec_distributed.c)
target_link_libraries(test_spec_distributed_c PRIVATE wia::core wia_warnings)
add_dependencies(test_spec_distributed_c wia-provider-host)
add_test(NAME spec_distributed_c COMMAND test_spec_distributed_c)
set_tests_properties(spec_distributed_c PROPERTIES TIMEOUT 120
  ENVIRONMENT "WIA_HOST_DEVICES=1;WIA_RANK=0;WIA_WORLD_SIZE=1;WIA_LOG_LEVEL=warn")

# Heartbeats: an idle communicator notices a dead rank (docs/fault-tolerance.md).
wia_add_unit_test(heartbeat SOURCES ${CMAKE_CURRENT_LIST_DIR}/heartbeat_test.cpp
                  LIBS wia::core TIMEOUT 300)
wia_test_loads_providers(test_heartbeat)

# Revoke, agree, shrink after a SIGKILL, and the kill-shrink torture
# (docs/fault-tolerance.md, "Revoke, agree, shrink").
wia_add_unit_test(shrink SOURCES ${CMAKE_CURRENT_LIST_DIR}/shrink_test.cpp
                  LIBS wia::core TIMEOUT 600)
wia_test_loads_providers(test_shrink)

# Under ThreadSanitizer (scripts/ci-tsan.sh): every rank's threads of a
# process communicator (the network engine, the control/heartbeat thread,
# the shm and tcp providers' progress, recovery). Not allreduce_paths: its
# subject is memory shared between processes, which TSan (the threads of
# one process) cannot see, and under TSan on a loaded machine its ranks
# went without a heartbeat past even a 5 s timeout.
wia_tsan_test(test_process_comm process_comm)
wia_tsan_test(test_heartbeat heartbeat)
wia_tsan_test(test_shrink shrink)
