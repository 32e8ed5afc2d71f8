# SPDX-License-Identifier: Apache-2.0
# Providers that are broken on purpose, each in one way the loader must
# catch, plus two valid ones with declared parameters. All land in
# ${PROJECT_BINARY_DIR}/test-providers (WIA_TEST_BROKEN_PROVIDER_DIR in the
# unit tests); none is installed. Target `wia_test_providers` builds them
# all.
set(WIA_TEST_PROVIDERS_SRC ${CMAKE_CURRENT_LIST_DIR})
set(WIA_TEST_PROVIDERS_OUT ${PROJECT_BINARY_DIR}/test-providers)
add_custom_target(wia_test_providers)

# wia_add_test_provider(<name> <source> [DEFECT <defect>]): libwia-provider-<name>.so
# built from <source> with WIA_TEST_NAME="<name>" and WIA_TEST_DEFECT_<defect>.
function(wia_add_test_provider name source)
  cmake_parse_arguments(ARG "" "DEFECT" "DEPS" ${ARGN})
  wia_add_provider(${name} SOURCES ${WIA_TEST_PROVIDERS_SRC}/${source}
    OUTPUT_DIR ${WIA_TEST_PROVIDERS_OUT} NO_INSTALL DEPS ${ARG_DEPS})
  target_compile_definitions(wia-provider-${name} PRIVATE WIA_TEST_NAME="${name}")
  if(ARG_DEFECT)
    target_compile_definitions(wia-provider-${name} PRIVATE WIA_TEST_DEFECT_${ARG_DEFECT}=1)
  endif()
  add_dependencies(wia_test_providers wia-provider-${name})
endfunction()

wia_add_test_provider(broken_nosym broken.c DEFECT NOSYM)        # exports `wia_provider`
wia_add_test_provider(broken_abi broken.c DEFECT ABI)            # abi_version 99
wia_add_test_provider(broken_hostsvc broken.c DEFECT HOSTSVC)    # needs host services v99
wia_add_test_provider(broken_size broken.c DEFECT SIZE)          # struct_size 24
wia_add_test_provider(broken_name broken.c DEFECT NAME)          # name "Broken-Name"
wia_add_test_provider(broken_mismatch broken.c DEFECT MISMATCH)  # name "renamed"
wia_add_test_provider(broken_caps broken.c DEFECT CAPS)          # CAP_DEVICE, no table
wia_add_test_provider(broken_tablever broken.c DEFECT TABLEVER)  # device table abi_version 7
wia_add_test_provider(broken_required broken.c DEFECT REQUIRED)  # stream_create NULL
wia_add_test_provider(broken_optional broken.c DEFECT OPTIONAL)  # timing cap, entry NULL
wia_add_test_provider(broken_mustknow broken.c DEFECT MUSTUNDERSTAND)  # unknown must_understand
wia_add_test_provider(broken_initfail broken.c DEFECT INITFAIL)  # init fails with a message
wia_add_test_provider(absent_hw broken.c DEFECT ABSENT)          # "no such hardware"
wia_add_test_provider(test_params params.c)
wia_add_test_provider(test_order params.c)

# A dependency that exists at link time but not where the loader looks:
# built outside every search path, and the provider gets no RPATH to it.
add_library(wia_test_missing_dep SHARED ${WIA_TEST_PROVIDERS_SRC}/missing_dep.c)
set_target_properties(wia_test_missing_dep PROPERTIES
  LIBRARY_OUTPUT_DIRECTORY ${PROJECT_BINARY_DIR}/test-provider-deps)
wia_add_test_provider(broken_dep broken.c DEFECT DEP DEPS wia_test_missing_dep)
set_target_properties(wia-provider-broken_dep PROPERTIES SKIP_BUILD_RPATH ON)

# An undefined symbol needs a build without wia_add_provider's
# --no-undefined, which exists precisely to prevent this defect.
add_library(wia-provider-broken_undef MODULE ${WIA_TEST_PROVIDERS_SRC}/broken.c)
set_target_properties(wia-provider-broken_undef PROPERTIES
  PREFIX "lib" OUTPUT_NAME "wia-provider-broken_undef"
  LIBRARY_OUTPUT_DIRECTORY ${WIA_TEST_PROVIDERS_OUT}
  C_VISIBILITY_PRESET hidden)
target_link_libraries(wia-provider-broken_undef PRIVATE wia::plugin_api wia_warnings)
target_compile_definitions(wia-provider-broken_undef PRIVATE
  WIA_TEST_NAME="broken_undef" WIA_TEST_DEFECT_UNDEF=1)
add_dependencies(wia_test_providers wia-provider-broken_undef)

# Not a shared object at all.
file(WRITE ${WIA_TEST_PROVIDERS_OUT}/libwia-provider-garbage.so
  "This is not an ELF file; the loader must refuse it with dlopen's message.\n")
