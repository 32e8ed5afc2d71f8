# SPDX-License-Identifier: Apache-2.0
# wia_check_core_copies(): fails the configure step when one program links
# two copies of the core.
#
# The core is linked three ways (core/CMakeLists.txt): libwia.so, the
# wia_core_base archive and the wia_core_internal archive. Each carries the
# target property WIA_CORE_COPY. A program holding two of them would hold
# two sets of the core's globals and singletons (provider registry,
# configuration, logger): two runtimes that do not see each other, which
# fails in ways far from the cause. Called once, after every directory is
# added; it walks each executable and shared library's link closure.
# In-tree only, not installed.

function(_wia_core_copy_targets dir out)
  get_property(targets DIRECTORY ${dir} PROPERTY BUILDSYSTEM_TARGETS)
  get_property(subdirs DIRECTORY ${dir} PROPERTY SUBDIRECTORIES)
  foreach(sub ${subdirs})
    _wia_core_copy_targets(${sub} more)
    list(APPEND targets ${more})
  endforeach()
  set(${out} ${targets} PARENT_SCOPE)
endfunction()

# The targets <target> links, directly and through interfaces. Generator
# expressions other than $<LINK_ONLY:...> are skipped: none of ours names
# a core copy.
function(_wia_core_copy_closure target out)
  set(seen "")
  set(todo ${target})
  while(todo)
    list(POP_FRONT todo t)
    if(NOT TARGET ${t} OR t IN_LIST seen)
      continue()
    endif()
    get_target_property(aliased ${t} ALIASED_TARGET)
    if(aliased)
      list(APPEND todo ${aliased})
      continue()
    endif()
    list(APPEND seen ${t})
    get_target_property(imported ${t} IMPORTED)
    if(imported)
      continue()
    endif()
    set(links "")
    get_target_property(type ${t} TYPE)
    if(NOT type STREQUAL "INTERFACE_LIBRARY")
      get_target_property(direct ${t} LINK_LIBRARIES)
      if(direct)
        list(APPEND links ${direct})
      endif()
    endif()
    get_target_property(iface ${t} INTERFACE_LINK_LIBRARIES)
    if(iface)
      list(APPEND links ${iface})
    endif()
    foreach(l ${links})
      if(l MATCHES "^\\$<LINK_ONLY:([^$<>]+)>$")
        list(APPEND todo ${CMAKE_MATCH_1})
      elseif(NOT l MATCHES "\\$<")
        list(APPEND todo ${l})
      endif()
    endforeach()
  endwhile()
  set(${out} ${seen} PARENT_SCOPE)
endfunction()

function(wia_check_core_copies)
  _wia_core_copy_targets(${PROJECT_SOURCE_DIR} all)
  foreach(t ${all})
    get_target_property(type ${t} TYPE)
    if(NOT type MATCHES "^(EXECUTABLE|SHARED_LIBRARY|MODULE_LIBRARY)$")
      continue()
    endif()
    _wia_core_copy_closure(${t} closure)
    set(copies "")
    foreach(c ${closure})
      get_target_property(copy ${c} WIA_CORE_COPY)
      if(copy AND NOT c STREQUAL t)
        list(APPEND copies "${c} (${copy})")
      elseif(copy)
        list(APPEND copies "${c} itself (${copy})")
      endif()
    endforeach()
    list(LENGTH copies n)
    if(n GREATER 1)
      list(JOIN copies ", " named)
      message(FATAL_ERROR "${t} links ${n} copies of the core: ${named}. "
        "Link exactly one of wia::core, wia_core_base and wia_core_internal "
        "(core/CMakeLists.txt), or the program holds two sets of the core's globals.")
    endif()
  endforeach()
endfunction()
