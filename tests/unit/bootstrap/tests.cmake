# SPDX-License-Identifier: Apache-2.0
# The bootstrap (core/bootstrap): real processes (fork), real sockets. The
# sources under test are compiled in directly, so this binary does not
# depend on the rest of the core being buildable.
file(GLOB WIA_BOOTSTRAP_SOURCES CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/core/src/bootstrap/*.cpp)
set(WIA_BOOTSTRAP_DEPS
  ${WIA_BOOTSTRAP_SOURCES}
  ${PROJECT_SOURCE_DIR}/core/src/config/config.cpp
  ${PROJECT_SOURCE_DIR}/core/src/config/schema.cpp
  ${PROJECT_SOURCE_DIR}/core/src/config/value.cpp
  ${PROJECT_SOURCE_DIR}/core/src/common/log.cpp
  ${PROJECT_SOURCE_DIR}/core/src/common/error.cpp)
set(WIA_BOOTSTRAP_LIBS yaml-cpp fmt::fmt spdlog::spdlog wia::plugin_api Threads::Threads wia_provider_common)

wia_add_unit_test(bootstrap
  SOURCES
    ${CMAKE_CURRENT_LIST_DIR}/bootstrap_test.cpp
    ${CMAKE_CURRENT_LIST_DIR}/pure_test.cpp
    ${CMAKE_CURRENT_LIST_DIR}/security_test.cpp
    ${WIA_BOOTSTRAP_DEPS}
  LIBS ${WIA_BOOTSTRAP_LIBS}
  TIMEOUT 600)
target_include_directories(test_bootstrap PRIVATE ${PROJECT_SOURCE_DIR}/core/src)

# The bootstrap under a real Open MPI mpirun (4 ranks, one node: the file
# rendezvous). Skipped, with the reason, where mpirun is not installed
# (scripts/install-deps.sh installs openmpi-bin). --allow-run-as-root is
# needed when CI runs as root; --oversubscribe because 4 > cores here.
add_executable(bootstrap_mpi_probe ${CMAKE_CURRENT_LIST_DIR}/mpi_probe.cpp ${WIA_BOOTSTRAP_DEPS})
target_include_directories(bootstrap_mpi_probe PRIVATE ${PROJECT_SOURCE_DIR}/core/src)
target_link_libraries(bootstrap_mpi_probe PRIVATE wia_warnings ${WIA_BOOTSTRAP_LIBS})
add_test(NAME bootstrap_mpirun
  COMMAND sh -c "command -v mpirun >/dev/null 2>&1 || { echo 'SKIPPED: mpirun is not installed (scripts/install-deps.sh installs openmpi-bin)'; exit 77; }; exec timeout 120 mpirun --oversubscribe --allow-run-as-root -np 4 \"$0\"" $<TARGET_FILE:bootstrap_mpi_probe>)
set_tests_properties(bootstrap_mpirun PROPERTIES TIMEOUT 180 SKIP_RETURN_CODE 77
  ENVIRONMENT "WIA_LOG_LEVEL=warn;WIA_BOOTSTRAP_TIMEOUT_MS=60000")
