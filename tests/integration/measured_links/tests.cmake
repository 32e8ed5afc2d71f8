# SPDX-License-Identifier: Apache-2.0
# Measured links across processes (issue 5): wia-bw --procs writes one
# device per rank over real shm and tcp, and process communicators take
# their cost model's figures from such a file (tuner.link_file) only when
# it has one entry per rank and every rank read the same figures.
if(NOT TARGET wia-bw OR NOT TARGET wia_tool_ranks)
  return()
endif()

wia_add_job_check(test_measured_links_check ${CMAKE_CURRENT_LIST_DIR}/measured_links_check.cpp)

set(_ml_check $<TARGET_FILE:test_measured_links_check>)
set(_ml_bw $<TARGET_FILE:wia-bw>)
set(_ml_data ${CMAKE_CURRENT_LIST_DIR}/data)

# wia-bw across 2 processes, per transport: the printed transport matrix,
# and a file of 2 ranks with positive figures and the transport's link type.
foreach(transport shm tcp)
  add_test(NAME measured_links_wia_bw_procs_${transport} COMMAND sh -c "\
    f=${CMAKE_CURRENT_BINARY_DIR}/wia_bw_procs_${transport}.yaml; rm -f $f; \
    out=$(WIA_TRANSPORT=${transport} ${_ml_bw} --procs 2 --bytes 64K --repeats 3 --output $f) \
      || exit 1; echo \"$out\"; \
    echo \"$out\" | grep -Eq '^ +r0 +- +${transport}$' && \
    echo \"$out\" | grep -Eq '^ +r1 +${transport} +-$' && \
    echo \"$out\" | grep -q 'Unidirectional (GB/s, 64 KiB):' && \
    echo \"$out\" | grep -q 'Latency 1 MiB (us):' && \
    ${_ml_check} file $f ${transport}")
endforeach()

# --bytes and --repeats belong to the process mode: a usage error otherwise.
add_test(NAME measured_links_wia_bw_bytes_needs_procs COMMAND sh -c "\
  WIA_HOST_DEVICES=2 ${_ml_bw} --bytes 64K; test $? -eq 2")

# Runs the check's communicator mode over 2 processes with tuner.link_file
# = FILE at log level LEVEL; ARGN: the mode's arguments (figures expected,
# optional per-rank file). Passes when the output matches PATTERN (grep).
function(_ml_comm_test name file level pattern)
  string(JOIN " " mode_args ${ARGN})
  add_test(NAME ${name} COMMAND sh -c "\
    out=$(${_ml_check} --procs 2 comm ${mode_args} 2>&1) || { echo \"$out\"; exit 1; }; \
    echo \"$out\"; echo \"$out\" | grep -q ${pattern}")
  set_tests_properties(${name} PROPERTIES TIMEOUT 60
    ENVIRONMENT "WIA_TUNER_LINK_FILE=${file};WIA_LOG_LEVEL=${level}")
endfunction()

# A process communicator uses a file with one entry per rank...
_ml_comm_test(measured_links_comm_uses_file ${_ml_data}/two-ranks.yaml info
  "'communicator of 2 ranks: link figures from ${_ml_data}/two-ranks.yaml (tuner.link_file, measured): 45.25..123.5 GB/s, 0.77..3.5 us'"
  measured)
# ...not one with another device count...
_ml_comm_test(measured_links_comm_other_count_keeps_transport_figures
  ${_ml_data}/three-devices.yaml info
  "'tuner.link_file not used: ${_ml_data}/three-devices.yaml has 3 device(s), this communicator has 2 ranks'"
  transport)
# ...nor a malformed one (a warning with file:line:column)...
_ml_comm_test(measured_links_comm_malformed_file_warns ${_ml_data}/malformed.yaml warn
  "\"\\[warn\\] \\[comm\\] .*tuner.link_file not used: ${_ml_data}/malformed.yaml:4:15: key 'links\\[0\\].between'\""
  transport)
# ...and when ranks read different figures, none uses them (the all-reduce
# in the check shows the ranks still agree).
_ml_comm_test(measured_links_comm_ranks_disagree_keep_transport_figures
  ${_ml_data}/two-ranks.yaml warn "'rank 1 read other figures than rank 0'"
  transport ${_ml_data}/two-ranks-other.yaml)

set_tests_properties(measured_links_wia_bw_procs_shm measured_links_wia_bw_procs_tcp
                     measured_links_wia_bw_bytes_needs_procs
                     PROPERTIES TIMEOUT 60 ENVIRONMENT "WIA_LOG_LEVEL=error")
