# SPDX-License-Identifier: Apache-2.0
# The command-line tools as operators run them; each check greps the output
# for what the tool promises to show.
if(NOT TARGET wia-info OR NOT TARGET wia-bench)
  return()  # configured with WIA_BUILD_TOOLS=OFF
endif()
set(_wia_info $<TARGET_FILE:wia-info>)
set(_wia_bench $<TARGET_FILE:wia-bench>)
set(_topologies ${PROJECT_SOURCE_DIR}/config/topologies)

# Providers: the host provider loads, every broken one is listed with why.
add_test(NAME tool_wia_info_providers COMMAND sh -c "\
  out=$(WIA_PROVIDER_PATH=${PROJECT_BINARY_DIR}/test-providers WIA_HOST_DEVICES=2 ${_wia_info}) || exit 1; \
  echo \"$out\"; \
  echo \"$out\" | grep -Eq 'host +loaded' && \
  echo \"$out\" | grep -q 'built for provider ABI v99, this libwia supports up to v1' && \
  echo \"$out\" | grep -q 'no wia_provider_v1 symbol' && \
  echo \"$out\" | grep -q 'invalid ELF header' && \
  echo \"$out\" | grep -q 'absent' && \
  echo \"$out\" | grep -q 'Devices: 2' && \
  echo \"$out\" | grep -Eq '^ +0 +- +Y'")

# Configuration with sources.
add_test(NAME tool_wia_info_config COMMAND sh -c "\
  out=$(WIA_HOST_DEVICES=3 ${_wia_info} --config) || exit 1; echo \"$out\"; \
  echo \"$out\" | grep -Eq 'host.devices += 3 +\\[env WIA_HOST_DEVICES\\]' && \
  echo \"$out\" | grep -Eq 'log.level += error +\\[env WIA_LOG_LEVEL\\]'")

# Topology matrix and analysis from a shipped file, and Graphviz output.
add_test(NAME tool_wia_info_topology COMMAND sh -c "\
  out=$(${_wia_info} --topology-file ${_topologies}/dgx-8gpu-nvlink.yaml) || exit 1; echo \"$out\"; \
  echo \"$out\" | grep -q 'Analysis: single_node, diameter 1, bisection 4800.0 GB/s' && \
  ${_wia_info} --dot --topology-file ${_topologies}/4node-ib-hdr.yaml | grep -q 'graph wia_topology'")

# A bad option is a usage error, not a crash.
add_test(NAME tool_wia_info_bad_option COMMAND ${_wia_info} --no-such-option)
set_tests_properties(tool_wia_info_bad_option PROPERTIES WILL_FAIL TRUE)

# The benchmark's own data check over a short sweep of every collective.
foreach(op allreduce broadcast reduce allgather reducescatter alltoall)
  add_test(NAME tool_wia_bench_${op} COMMAND sh -c "\
    ${_wia_bench} --op ${op} --ranks 3 -b 8 -e 64K -f 8 -n 2 -w 1 | tee /dev/stderr | grep -q '# ok: 0 wrong'")
endforeach()
# The spec's spellings of the ops name the same collectives (the header
# says which one ran, the check passes); a misspelling still exits 2.
add_test(NAME tool_wia_bench_spec_op_names COMMAND sh -c "\
  for pair in all_reduce:allreduce all_gather:allgather reduce_scatter:reducescatter \
              all_to_all:alltoall broadcast:broadcast reduce:reduce; do \
    op=\${pair%%:*}; name=\${pair#*:}; \
    ${_wia_bench} --op \$op --ranks 2 -b 64 -e 64 -n 1 -w 0 > spec-op.out || exit 1; \
    grep -q \"^# wia-bench: \$name \" spec-op.out && grep -q '# ok: 0 wrong' spec-op.out || \
      { cat spec-op.out; exit 1; }; \
  done; \
  ${_wia_bench} --op all_reducex --ranks 2 2> /dev/null; test \$? -eq 2")

set_tests_properties(tool_wia_info_providers tool_wia_info_config tool_wia_info_topology
                     PROPERTIES TIMEOUT 60 ENVIRONMENT "WIA_LOG_LEVEL=error")

# --- Transport selection, placement, topology diff, bandwidth (issue 5) ---
set(_wia_bw $<TARGET_FILE:wia-bw>)
set(_tool_data ${CMAKE_CURRENT_LIST_DIR}/data)
set(_examples ${PROJECT_SOURCE_DIR}/config/examples)
# No transport provider on purpose: the explanations name why each is passed over.
set(_no_transports "WIA_PROVIDERS_DISABLE=shm,tcp,ofi,verbs")

# Every link with its transport, rule and the reasons earlier choices lost.
add_test(NAME tool_wia_info_explain COMMAND sh -c "\
  out=$(${_no_transports} ${_wia_info} --explain --topology-file ${_topologies}/2socket-pcie.yaml); \
  test $? -eq 2 || exit 1; echo \"$out\"; \
  echo \"$out\" | grep -q 'box/gpu0 <-> box/gpu1  same_numa, peer  -> NONE' && \
  echo \"$out\" | grep -q 'box/gpu1 <-> box/gpu2  cross_numa' && \
  echo \"$out\" | grep -Eq 'passed over shm: provider not loaded: (disabled|no libwia-provider-shm.so)' && \
  out=$(${_wia_info} --explain --summary --assume-all-transports --rules ${_examples}/selector-cluster.yaml \
        --topology-file ${_topologies}/4node-ib-hdr.yaml) || exit 1; echo \"$out\"; \
  echo \"$out\" | grep -Eq 'different_nodes +64  verbs +.*selector-cluster.yaml:27:7 .inside rack0.' && \
  echo \"$out\" | grep -Eq 'same_numa +112  shm'")

# A rule's compress key: per link whether it applies and the estimated gain
# on a 64 MiB all-reduce (2 nodes at 1 Gbit/s: int8 about 2.6x); in the
# summary, the auto estimate.
add_test(NAME tool_wia_info_explain_compress COMMAND sh -c "\
  out=$(${_wia_info} --explain --assume-all-transports --rules ${_tool_data}/selector-compress.yaml \
        --topology-file ${_tool_data}/two-nodes-1gbit.yaml) || exit 1; echo \"$out\"; \
  echo \"$out\" | grep -q 'node0/cpu0 <-> node1/cpu1  different_nodes  -> tcp' && \
  echo \"$out\" | grep -Eq 'compressed int8 when bandwidth < 10 GB/s: this link 0.125 GB/s, so it applies; estimated 2.[0-9]+x on a 64 MiB float32 all-reduce' && \
  test $(echo \"$out\" | grep -c 'compressed int8') -eq 4 && \
  out=$(${_wia_info} --explain --summary --assume-all-transports --rules ${_tool_data}/selector-compress.yaml \
        --topology-file ${_tool_data}/two-nodes-1gbit.yaml) || exit 1; echo \"$out\"; \
  echo \"$out\" | grep -q 'Compression between nodes, 64 MiB float32 all-reduce: 0.125 GB/s between hosts (under 10 GB/s: int8 if it pays)'")

# 1024 ranks: counted per class, selected per link signature (prints its time).
add_test(NAME tool_wia_info_explain_1024 COMMAND sh -c "\
  start=$(date +%s%N); \
  out=$(${_wia_info} --explain --summary --assume-all-transports \
        --topology-file ${_topologies}/128node-ib-1024gpu.yaml) || exit 1; \
  echo \"$out\"; echo \"wall: $(( ($(date +%s%N) - start) / 1000000 )) ms\"; \
  echo \"$out\" | grep -q '3 distinct link signature(s) evaluated for 523776 link(s)' && \
  echo \"$out\" | grep -Eq 'different_nodes +520192  verbs'")

# Lint: warnings exit 1, a malformed rule set exits 2 naming file:line:column.
add_test(NAME tool_wia_info_lint COMMAND sh -c "\
  out=$(${_wia_info} --lint --assume-all-transports --rules ${_tool_data}/selector-lint.yaml \
        --topology-file ${_topologies}/4node-ib-hdr.yaml); test $? -eq 1 || exit 1; echo \"$out\"; \
  echo \"$out\" | grep -q 'selector-lint.yaml:7:7: never reached: shadowed by all remote over tcp' && \
  echo \"$out\" | grep -q 'shm is listed for different_nodes links, but shm only serves links inside one node' && \
  out=$(${_wia_info} --lint --rules ${_tool_data}/selector-bad.yaml 2>&1); test $? -eq 2 || exit 1; \
  echo \"$out\"; echo \"$out\" | grep -q \"selector-bad.yaml:5:27: key 'selector.rules\\[0\\].transports\\[1\\]': unknown transport 'tpc'\" && \
  ${_wia_info} --lint --assume-all-transports --topology-file ${_topologies}/4node-ib-hdr.yaml")

# Declared against measured: a node missing, IB below its declared speed.
add_test(NAME tool_wia_info_topology_diff COMMAND sh -c "\
  out=$(${_wia_info} --topology-diff ${_topologies}/4node-ib-hdr.yaml \
        --topology-file ${_tool_data}/4node-ib-degraded.yaml); test $? -eq 1 || exit 1; echo \"$out\"; \
  echo \"$out\" | grep -q 'Missing: declared, not detected (8): dgx3/gpu0' && \
  echo \"$out\" | grep -q 'bandwidth_gbps 25 declared, 20 detected (-20%): 384 link(s)' && \
  ${_wia_info} --topology-diff ${_topologies}/4node-ib-hdr.yaml --tolerance 0.25 \
        --topology-file ${_tool_data}/4node-ib-degraded.yaml | grep -q 'Missing' && \
  ${_wia_info} --topology-diff ${_topologies}/4node-ib-hdr.yaml \
        --topology-file ${_topologies}/4node-ib-hdr.yaml | grep -q 'same within tolerance'")

# Placement from a model file: each stage's shards on one node.
add_test(NAME tool_wia_info_place COMMAND sh -c "\
  out=$(${_wia_info} --place ${_tool_data}/pipeline-4x8.yaml \
        --topology-file ${_topologies}/4node-ib-hdr.yaml) || exit 1; echo \"$out\"; \
  for s in 0 1 2 3; do \
    n=$(echo \"$out\" | grep -E \"^  s$s\" | sed 's|.*-> ||; s|/.*||' | sort -u | wc -l); \
    test \"$n\" -eq 1 || { echo \"stage $s spans $n nodes\"; exit 1; }; done; \
  echo \"$out\" | grep -q 'cross-node bytes 5.03316e+07'")

# wia-bw: the matrices, and a measured file that wia-info and the tuner read.
add_test(NAME tool_wia_bw COMMAND sh -c "\
  f=${CMAKE_CURRENT_BINARY_DIR}/wia_bw_links.yaml; rm -f $f; \
  out=$(WIA_HOST_DEVICES=2 ${_wia_bw} --output $f) || exit 1; echo \"$out\"; \
  echo \"$out\" | grep -q 'Unidirectional (GB/s, 32 MiB):' && \
  echo \"$out\" | grep -q 'Latency 1 MiB (us):' && \
  WIA_HOST_DEVICES=2 ${_wia_info} --topology-file $f | grep -q 'Topology: 2 device(s)'")

set_tests_properties(tool_wia_info_explain tool_wia_info_explain_1024 tool_wia_info_lint
                     tool_wia_info_topology_diff tool_wia_info_place tool_wia_bw
                     PROPERTIES TIMEOUT 120 ENVIRONMENT "WIA_LOG_LEVEL=error")

# wia-bench across processes: it spawns 2 ranks itself; every rank checks its data.
# --predict (cost model fidelity, docs/collectives.md): AUTO and every
# all-reduce algorithm forced, each with the model's estimate, on a
# recorded link file, in one process and across 2 processes; no timing is
# judged, only that every row and the summary are there and the data is
# right. --predict with another collective is a usage error.
add_test(NAME tool_wia_bench_predict COMMAND sh -c "\
  out=\$(WIA_TUNER_LINK_FILE=${PROJECT_SOURCE_DIR}/tests/data/links-host4.yaml \
        ${_wia_bench} --predict --ranks 3 --sizes 8,64K -n 2 -w 1 --rounds 1) || exit 1; \
  echo \"\$out\"; \
  for want in 'links-host4.yaml' ' auto:' ' ring ' ' tree ' ' binomial ' ' rabenseifner ' \
              ' recursive_doubling ' ' direct ' ' one_shot ' 'auto/best' \
              '# from 64 KiB: predicted/measured' '# ok: 0 wrong'; do \
    echo \"\$out\" | grep -q -- \"\$want\" || { echo \"missing: \$want\"; exit 1; }; done; \
  out=\$(WIA_TUNER_LINK_FILE=${PROJECT_SOURCE_DIR}/tests/data/links-shm2.yaml \
        ${_wia_bench} --predict --procs 2 --sizes 64K -n 2 -w 1 --rounds 1) || exit 1; \
  echo \"\$out\" | grep -q '# ok: 0 wrong' || exit 1; \
  ${_wia_bench} --predict --op allgather 2>/dev/null; test \$? -eq 2")
set_tests_properties(tool_wia_bench_predict PROPERTIES TIMEOUT 120 ENVIRONMENT "WIA_LOG_LEVEL=error")

# --chunks K reaches the calls as num_chunks: the log names the schedule
# with K chunks, and the data is right; a negative count is not a crash.
add_test(NAME tool_wia_bench_chunks COMMAND sh -c "\
  out=\$(WIA_LOG_LEVEL=debug ${_wia_bench} --ranks 4 --sizes 1M --algo direct --chunks 8 -n 2 -w 1 2>&1) \
    || exit 1; \
  echo \"\$out\" | grep -q 'allreduce/direct p=4 .* chunks=8 ' || { echo 'no chunks=8 schedule'; exit 1; }; \
  echo \"\$out\" | grep -q '# ok: 0 wrong'")
set_tests_properties(tool_wia_bench_chunks PROPERTIES TIMEOUT 120)

add_test(NAME tool_wia_bench_procs COMMAND sh -c "\
  ${_wia_bench} --procs 2 -b 8 -e 64K -f 8 -n 2 -w 1 | tee /dev/stderr | grep -q '# ok: 0 wrong'")
set_tests_properties(tool_wia_bench_procs PROPERTIES TIMEOUT 120 ENVIRONMENT "WIA_LOG_LEVEL=error")

# A whole job under a real Open MPI mpirun: 3 ranks find each other from
# OMPI_COMM_WORLD_* (file rendezvous on one node), build the shm mesh and
# check every element of all-reduce and all-gather. Skipped, with the
# reason, where mpirun is not installed.
add_test(NAME tool_wia_bench_mpirun COMMAND sh -c "\
  command -v mpirun >/dev/null 2>&1 || { echo 'SKIPPED: mpirun is not installed (scripts/install-deps.sh installs openmpi-bin)'; exit 77; }; \
  for op in allreduce allgather; do \
    timeout 120 mpirun --oversubscribe --allow-run-as-root -np 3 ${_wia_bench} --procs-from-env --op $op -b 8 -e 1M -f 128 -n 2 -w 1 \
      | tee /dev/stderr | grep -q '# ok: 0 wrong' || exit 1; \
  done")
set_tests_properties(tool_wia_bench_mpirun PROPERTIES TIMEOUT 300 SKIP_RETURN_CODE 77
                     ENVIRONMENT "WIA_LOG_LEVEL=error")

# wia-bench --compress: the wire bytes and the error of one call. fp16 of
# the bench's small integer data is exact (relerr 0) and sends 3 headers + 2 (p - 1) / p of 2 n
# bytes; int8 over 2 processes has a small, non-zero error; a method on a
# collective it does not apply to is refused naming the option.
add_test(NAME tool_wia_bench_compress COMMAND sh -c "\
  ${_wia_bench} --compress fp16 --sizes 64K -n 2 -w 1 | tee /dev/stderr | \
    grep -Eq '^ +65536 +16384 +float32 +49176 +2\\.0 \\| .* 0\\.00e\\+00 \\|' && \
  ${_wia_bench} --procs 2 --compress int8 --sizes 64K -n 2 -w 1 | tee /dev/stderr | \
    grep -Eq '^ +65536 .* [1-9]\\.[0-9]{2}e-0[2-4] \\|' && \
  ${_wia_bench} --compress int8 --op allgather 2>&1 | grep -q 'compress needs --op allreduce'")
set_tests_properties(tool_wia_bench_compress PROPERTIES TIMEOUT 120 ENVIRONMENT "WIA_LOG_LEVEL=error")

# wia-ckpt-bench: a small run prints a row per codec with every ratio.
add_test(NAME tool_wia_ckpt_bench COMMAND sh -c "\
  $<TARGET_FILE:wia-ckpt-bench> --size 8M --reps 1 | tee /dev/stderr > ckpt-bench.out && \
  grep -Eq '^none +[0-9.]+ +[0-9.]+ +[0-9.]+ +[0-9.]+ +[0-9.]+ +[0-9.]+ +[0-9.]+ +1\\.000 ' ckpt-bench.out && \
  grep -Eq '^lz4 ' ckpt-bench.out && grep -Eq '^zstd +.* 0\\.9[0-9]{2} ' ckpt-bench.out")
set_tests_properties(tool_wia_ckpt_bench PROPERTIES TIMEOUT 120 ENVIRONMENT "WIA_LOG_LEVEL=error;WIA_HOST_DEVICES=1")

# wia-bench --profile-overhead: both columns and the difference per size
# over 2 processes; in-process it is refused with the reason.
add_test(NAME tool_wia_bench_profile_overhead COMMAND sh -c "\
  ${_wia_bench} --procs 2 --profile-overhead --sizes 64,64K -n 20 | tee /dev/stderr | \
    grep -Eq '^ +65536 +[0-9.]+ +[0-9.]+ +[0-9.]+ +-?[0-9.]+%$' && \
  ${_wia_bench} --profile-overhead --sizes 64 2>&1 | grep -q 'use --procs N'")
set_tests_properties(tool_wia_bench_profile_overhead PROPERTIES TIMEOUT 120 ENVIRONMENT "WIA_LOG_LEVEL=error")

# wia-bench --rewrite-inputs: the stores to every input line before each
# call keep its values (the checked call is rewritten too), in one process
# and over 2, where the windows read inputs in place.
add_test(NAME tool_wia_bench_rewrite_inputs COMMAND sh -c "\
  ${_wia_bench} --rewrite-inputs --sizes 64K,1M -n 3 -w 1 | tee /dev/stderr | \
    grep -q '^# ok: 0 wrong element' && \
  ${_wia_bench} --procs 2 --rewrite-inputs --sizes 64K,1M -n 3 -w 1 | tee /dev/stderr | \
    grep -q '^# ok: 0 wrong element'")
set_tests_properties(tool_wia_bench_rewrite_inputs PROPERTIES TIMEOUT 120 ENVIRONMENT "WIA_LOG_LEVEL=error")

# wia-bench --trace: each of 2 processes writes FILE.rank<N>, trace JSON with
# an all-reduce event per call, the tool's own small ones included: more
# than the 3 timed calls of 64 KiB, each with its args; in-process it is
# refused with the reason.
add_test(NAME tool_wia_bench_trace COMMAND sh -c "\
  rm -f bench-trace.json.rank0 bench-trace.json.rank1 && \
  ${_wia_bench} --procs 2 --trace bench-trace.json --sizes 64K -n 3 -w 1 > /dev/null && \
  for r in 0 1; do python3 -c 'import json, sys; \
t = json.load(open(sys.argv[1])); \
ev = [e for e in t[\"traceEvents\"] if e[\"ph\"] == \"X\"]; \
big = [e for e in ev if e[\"args\"][\"bytes\"] == 65536]; \
assert len(big) > 3 and all(e[\"name\"] == \"allreduce\" for e in ev), ev; \
assert all(e[\"args\"][\"algorithm\"] and e[\"args\"][\"transport\"] for e in ev), ev; \
assert t[\"otherData\"][\"rank\"] == int(sys.argv[2]), t[\"otherData\"]' \
    bench-trace.json.rank$r $r || exit 1; done && \
  ${_wia_bench} --trace x.json --sizes 64 2>&1 | grep -q 'use --procs N'")
set_tests_properties(tool_wia_bench_trace PROPERTIES TIMEOUT 120 ENVIRONMENT "WIA_LOG_LEVEL=error")

# wia-bench --plot (matplotlib, /usr/bin/python3): two collectives in one
# in-process run, then 2 processes. The PNG is checked by check_plot.py
# (signature, CRCs, IHDR size, decoded by matplotlib, not blank; its
# "wia-series" chunk lists exactly the ops run and its title the
# communicator, ranks and transport), and the script's report names every
# op with all its sizes, busbw and bound alike. Skipped, with the reason,
# where Debian's python3-matplotlib is not installed.
set(_check_plot "/usr/bin/python3 ${CMAKE_CURRENT_LIST_DIR}/check_plot.py")
add_test(NAME tool_wia_bench_plot COMMAND sh -c "\
  /usr/bin/python3 -c 'import matplotlib' 2>/dev/null || { echo 'SKIPPED: /usr/bin/python3 has no matplotlib (scripts/install-deps.sh installs python3-matplotlib)'; exit 77; }; \
  rm -f bench-plot.png bench-plot-procs.png && \
  ${_wia_bench} --op allreduce,all_gather --ranks 2 --sizes 64,4K,64K -n 2 -w 1 --plot bench-plot.png > bench-plot.out; \
  rc=$?; cat bench-plot.out; test $rc -eq 0 || exit 1; \
  grep -q '^# wia-bench: allreduce ' bench-plot.out && grep -q '^# wia-bench: allgather ' bench-plot.out && \
  test $(grep -c '# ok: 0 wrong' bench-plot.out) -eq 2 && \
  grep -q '^# plot: allreduce: busbw 3 points, bound 3 points, 64 B .. 64 KiB$' bench-plot.out && \
  grep -q '^# plot: allgather: busbw 3 points, bound 3 points, 64 B .. 64 KiB$' bench-plot.out && \
  grep -q '^# plot: wrote bench-plot.png (1000 x 600 px, 2 series)' bench-plot.out && \
  ${_check_plot} bench-plot.png allreduce,allgather 'in-process host devices, 2 ranks, transport memory' && \
  ${_wia_bench} --procs 2 --op reducescatter --sizes 64,64K -n 2 -w 1 --plot bench-plot-procs.png > bench-plot.out; \
  rc=$?; cat bench-plot.out; test $rc -eq 0 || exit 1; \
  grep -q '^# plot: reducescatter: busbw 2 points, bound 2 points, 64 B .. 64 KiB$' bench-plot.out && \
  ${_check_plot} bench-plot-procs.png reducescatter 'processes, 1 node(s), 2 ranks, transport '")
set_tests_properties(tool_wia_bench_plot PROPERTIES TIMEOUT 120 SKIP_RETURN_CODE 77
                     ENVIRONMENT "WIA_LOG_LEVEL=error")

# --plot errors, found before the sweep (nothing printed on stdout), one
# line each and exit status 1: a directory that does not exist, a path
# under a regular file, and matplotlib missing (a PYTHONPATH module that
# fails to import stands in for it): the message names the package. A
# file that cannot be written at the end (a directory's name) fails the
# run after the table, also with status 1, leaving no FILE.tmp behind.
add_test(NAME tool_wia_bench_plot_errors COMMAND sh -c "\
  out=$(${_wia_bench} --ranks 2 --sizes 64 --plot /nonexistent-wia-dir/x.png 2>plot-err.txt); rc=$?; \
  cat plot-err.txt; test $rc -eq 1 && test -z \"$out\" || exit 1; \
  grep -q '^wia-bench: --plot /nonexistent-wia-dir/x.png: cannot write into /nonexistent-wia-dir: No such file or directory$' plot-err.txt || exit 1; \
  : > plot-not-a-dir; \
  out=$(${_wia_bench} --ranks 2 --sizes 64 --plot plot-not-a-dir/x.png 2>plot-err.txt); rc=$?; \
  cat plot-err.txt; test $rc -eq 1 && test -z \"$out\" || exit 1; \
  grep -q 'cannot write into plot-not-a-dir: not a directory' plot-err.txt || exit 1; \
  mkdir -p fake-python/matplotlib && \
  echo 'raise ImportError(\"hidden by the test\")' > fake-python/matplotlib/__init__.py && \
  out=$(PYTHONPATH=$PWD/fake-python ${_wia_bench} --ranks 2 --sizes 64 --plot plot-never.png 2>plot-err.txt); rc=$?; \
  cat plot-err.txt; test $rc -eq 1 && test -z \"$out\" && test ! -e plot-never.png || exit 1; \
  grep -q \"python module 'matplotlib' is missing .*install the Debian package python3-matplotlib\" plot-err.txt || exit 1; \
  mkdir -p plot-is-a-dir && \
  ${_wia_bench} --ranks 2 --sizes 64 -n 1 -w 0 --plot plot-is-a-dir > plot-out.txt 2>plot-err.txt; rc=$?; \
  cat plot-out.txt plot-err.txt; test $rc -eq 1 && grep -q '# ok: 0 wrong' plot-out.txt || exit 1; \
  grep -q '^wia-bench --plot: cannot write plot-is-a-dir: Is a directory$' plot-err.txt && \
  grep -q '^wia-bench: --plot plot-is-a-dir: not written$' plot-err.txt && test ! -e plot-is-a-dir.tmp && \
  ${_wia_bench} --compress fp16 --plot x.png 2>&1 | grep -q 'plot draws the plain sweep'")
set_tests_properties(tool_wia_bench_plot_errors PROPERTIES TIMEOUT 60 ENVIRONMENT "WIA_LOG_LEVEL=error")
