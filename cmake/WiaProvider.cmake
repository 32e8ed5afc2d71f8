# SPDX-License-Identifier: Apache-2.0
# wia_add_provider(<name> SOURCES <files...> [DEPS <targets...>] [OUTPUT_DIR <dir>])
#
# Builds libwia-provider-<name>.so against the ABI headers only (never the
# core), with hidden visibility so that the wia_provider_v1 symbol is the
# only export. Usable in-tree and, after find_package(wia), out of tree.
set(_WIA_PROVIDER_CMAKE_DIR ${CMAKE_CURRENT_LIST_DIR})

function(wia_add_provider name)
  cmake_parse_arguments(ARG "NO_INSTALL" "OUTPUT_DIR" "SOURCES;DEPS" ${ARGN})
  set(target wia-provider-${name})
  add_library(${target} MODULE ${ARG_SOURCES})
  set_target_properties(${target} PROPERTIES
    PREFIX "lib"
    OUTPUT_NAME "wia-provider-${name}"
    C_VISIBILITY_PRESET hidden
    CXX_VISIBILITY_PRESET hidden
    VISIBILITY_INLINES_HIDDEN ON)
  if(ARG_OUTPUT_DIR)
    set_target_properties(${target} PROPERTIES LIBRARY_OUTPUT_DIRECTORY ${ARG_OUTPUT_DIR})
  elseif(DEFINED WIA_PROVIDER_OUTPUT_DIR)
    set_target_properties(${target} PROPERTIES LIBRARY_OUTPUT_DIRECTORY ${WIA_PROVIDER_OUTPUT_DIR})
  endif()
  if(TARGET wia::plugin_api)
    target_link_libraries(${target} PRIVATE wia::plugin_api)
  endif()
  if(TARGET wia_warnings)
    target_link_libraries(${target} PRIVATE wia_warnings)
  endif()
  if(ARG_DEPS)
    target_link_libraries(${target} PRIVATE ${ARG_DEPS})
  endif()
  # Export the descriptor symbols and nothing else (see the map file).
  set(map ${_WIA_PROVIDER_CMAKE_DIR}/wia_provider_exports.map)
  target_link_options(${target} PRIVATE -Wl,--version-script=${map})
  set_property(TARGET ${target} APPEND PROPERTY LINK_DEPENDS ${map})
  # A provider must resolve every symbol at build time: an unresolved one
  # would only surface as a dlopen failure on a user's machine.
  target_link_options(${target} PRIVATE -Wl,--no-undefined)
  if(NOT ARG_NO_INSTALL AND DEFINED WIA_PROVIDER_SUBDIR)
    install(TARGETS ${target} LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}/${WIA_PROVIDER_SUBDIR})
  endif()
endfunction()
