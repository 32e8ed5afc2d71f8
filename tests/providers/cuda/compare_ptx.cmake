# SPDX-License-Identifier: Apache-2.0
# cmake -DBUILT=<ptx from this build> -DCOMMITTED=<ptx in the tree> -P compare_ptx.cmake
#
# Fails when the committed PTX differs from the one just built. Comment
# lines (// ..., where nvcc writes its own version) are ignored, so a
# different nvcc that emits the same code does not count as stale.
cmake_policy(SET CMP0007 NEW)  # lists keep the blank lines of the files
foreach(var BUILT COMMITTED)
  if(NOT EXISTS "${${var}}")
    message(FATAL_ERROR "compare_ptx.cmake: ${${var}} does not exist (build wia-provider-cuda)")
  endif()
endforeach()
function(read_code path out)
  file(STRINGS "${path}" lines)
  list(FILTER lines EXCLUDE REGEX "^[ \t]*//")
  set(${out} "${lines}" PARENT_SCOPE)
endfunction()
read_code("${BUILT}" built)
read_code("${COMMITTED}" committed)
if(NOT built STREQUAL committed)
  message(FATAL_ERROR "${COMMITTED} is stale: the kernels under providers/cuda/kernels/ "
                      "compile to different PTX now; run scripts/regen-cuda-ptx.sh and commit "
                      "the result")
endif()
message(STATUS "committed PTX is current")
