# SPDX-License-Identifier: Apache-2.0
# The bootstrap (core/src/bootstrap): real processes (fork), real sockets.
# Linked from the internal archive, which adds only the objects the
# bootstrap reaches (it, configuration, logging).
wia_add_unit_test(bootstrap
  SOURCES
    ${CMAKE_CURRENT_LIST_DIR}/bootstrap_test.cpp
    ${CMAKE_CURRENT_LIST_DIR}/pure_test.cpp
    ${CMAKE_CURRENT_LIST_DIR}/security_test.cpp
  LIBS wia_core_internal
  TIMEOUT 600)
wia_tsan_test(test_bootstrap bootstrap)  # the root's threads (scripts/ci-tsan.sh)

# The bootstrap under a real Open MPI mpirun (4 ranks, one node: the file
# rendezvous). Skipped, with the reason, where mpirun is not installed
# (scripts/install-deps.sh installs openmpi-bin). --allow-run-as-root is
# needed when CI runs as root; --oversubscribe because 4 > cores here.
add_executable(bootstrap_mpi_probe ${CMAKE_CURRENT_LIST_DIR}/mpi_probe.cpp)
target_link_libraries(bootstrap_mpi_probe PRIVATE wia_core_internal wia_warnings)
add_test(NAME bootstrap_mpirun
  COMMAND sh -c "command -v mpirun >/dev/null 2>&1 || { echo 'SKIPPED: mpirun is not installed (scripts/install-deps.sh installs openmpi-bin)'; exit 77; }; exec timeout 120 mpirun --oversubscribe --allow-run-as-root -np 4 \"$0\"" $<TARGET_FILE:bootstrap_mpi_probe>)
set_tests_properties(bootstrap_mpirun PROPERTIES TIMEOUT 180 SKIP_RETURN_CODE 77
  ENVIRONMENT "WIA_LOG_LEVEL=warn;WIA_BOOTSTRAP_TIMEOUT_MS=60000")
