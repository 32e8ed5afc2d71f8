#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Compares the ofi provider's point-to-point figures with libfabric's own
# reference, fi_pingpong (libfabric-bin), on the same fabric provider and
# in the same run, and prints the ratios (docs/transport-ofi.md).
#   scripts/ofi-bench.sh [BUILD_DIR] [FABRIC]     (defaults build/default, "tcp;ofi_rxm")
# Environment:
#   RUNS=N        8 B latency runs of each side, interleaved (default 7); the
#                 median and the range are printed, as single runs on a
#                 shared machine vary widely
#   PIN=split     each side's two processes pinned to CPUs 0 and 1 (default);
#       same      both on CPU 0; none: left to the scheduler
#   ALLREDUCE=0   skip the 64 MiB all-reduce
# Both sides ping-pong: latency = half a round trip of 8 B (and of 64 KiB,
# above the 4 KiB where shm's rendezvous mode announces messages);
# bandwidth = a 4 MiB message each way, one at a time (fi_pingpong's method), so the two
# numbers are measured alike, and both sides get the same pinning.
# wia-transport-bench's streaming bandwidth (window 4) is printed too. Then
# a 64 MiB all-reduce (ring) over 4 processes of this machine on ofi and on
# our tcp provider, one after the other in the same run (issue 21 asks for
# the figure, not a target).
set -euo pipefail
build=${1:-build/default}
fabric=${2:-tcp;ofi_rxm}
runs=${RUNS:-7}
pin=${PIN:-split}
bench=$build/bin/wia-transport-bench
command -v fi_pingpong >/dev/null || { echo "fi_pingpong not found (apt install libfabric-bin)"; exit 2; }
[ -x "$bench" ] || { echo "$bench not built (cmake --build $build --target wia-transport-bench)"; exit 2; }
case $pin in
  split) cpu_a=0 cpu_b=1 ;;
  same) cpu_a=0 cpu_b=0 ;;
  none) cpu_a="" cpu_b="" ;;
  *) echo "PIN must be split, same or none"; exit 2 ;;
esac
# Command prefixes that run something on cpu_a / cpu_b (empty: anywhere).
on_a=() on_b=()
[ -n "$cpu_a" ] && on_a=(taskset -c "$cpu_a") && on_b=(taskset -c "$cpu_b")
addr=$(hostname -I | awk '{print $1}')
port=$((40000 + RANDOM % 20000))

# fi_pingpong SIZE ITERS -> "usec/xfer MB/sec" (MB/sec counts both directions);
# the server on cpu_a, the client on cpu_b.
pingpong() {
  "${on_a[@]}" fi_pingpong -p "$fabric" -e rdm -m tagged -S "$1" -I "$2" -B "$port" >/dev/null 2>&1 &
  local server=$!
  sleep 0.5
  local line
  line=$(timeout 120 "${on_b[@]}" fi_pingpong -p "$fabric" -e rdm -m tagged -S "$1" -I "$2" -P "$port" "$addr" | tail -1)
  wait "$server" || true
  port=$((port + 1))
  echo "$line" | awk '{print $7, $6}'
}

# wia-transport-bench ARGS... -> its last line. It forks its second process
# itself and each rank binds itself (--cpus) once its provider is loaded:
# binding the forked rank from outside (taskset -p) was undone by
# libinfinipath's constructor, which libfabric's dlopen runs, and left both
# ranks on cpu_a (docs/transport-ofi.md, run 9).
ours() {
  local cpus=()
  [ -n "$cpu_a" ] && cpus=(--cpus "$cpu_a,$cpu_b")
  "$bench" --provider ofi --param "provider=$fabric" --endpoint 0 "${cpus[@]}" "$@" | tail -1
}

stats() {  # numbers on stdin -> "median min max"
  sort -g | awk '{v[NR] = $1} END {print v[int((NR + 1) / 2)], v[1], v[NR]}'
}

ref_lats=() our_lats=()
for _ in $(seq "$runs"); do
  read -r l _ < <(pingpong 8 20000)
  ref_lats+=("$l")
  our_lats+=("$(ours --sizes 8:8 --time 0.5 | awk '{print $3}')")
done
read -r ref_lat ref_min ref_max < <(printf '%s\n' "${ref_lats[@]}" | stats)
read -r our_lat our_min our_max < <(printf '%s\n' "${our_lats[@]}" | stats)
# 64 KiB: above 4 KiB, so an announced message (header, clear-to-send,
# payload) where the provider runs rendezvous mode (shm).
read -r ref_mid_us _ < <(pingpong 65536 5000)
our_mid_us=$(ours --sizes 64K:64K --time 0.5 | awk '{print $3}')
read -r ref_big_us _ < <(pingpong 4194304 200)
ours_big=$(ours --sizes 4M:4M --time 1)
our_big_us=$(echo "$ours_big" | awk '{print $3}')
our_stream=$(echo "$ours_big" | awk '{print $4}')

echo "8 B runs (us), fi_pingpong: ${ref_lats[*]}"
echo "8 B runs (us), ofi:         ${our_lats[*]}"
awk -v rl="$ref_lat" -v ol="$our_lat" -v rmin="$ref_min" -v rmax="$ref_max" \
    -v omin="$our_min" -v omax="$our_max" -v n="$runs" -v p="$pin" \
    -v rb="$ref_big_us" -v ob="$our_big_us" -v os="$our_stream" -v f="$fabric" \
    -v rm="$ref_mid_us" -v om="$our_mid_us" 'BEGIN {
  rbw = 4194304 / rb / 1000; obw = 4194304 / ob / 1000;
  printf "fabric %s, pinning %s, %d latency runs each\n", f, p, n;
  printf "8 B latency (half round trip), median [min - max]: ofi %.2f [%.2f - %.2f] us, fi_pingpong %.2f [%.2f - %.2f] us, ratio %.2fx (target <= 1.2x)\n", ol, omin, omax, rl, rmin, rmax, ol / rl;
  printf "64 KiB latency (one way):      ofi %.2f us, fi_pingpong %.2f us, ratio %.2fx\n", om, rm, om / rm;
  printf "4 MiB ping-pong bandwidth:     ofi %.3f GB/s, fi_pingpong %.3f GB/s, ratio %.2fx (target >= 0.9x)\n", obw, rbw, obw / rbw;
  printf "4 MiB streaming (window 4):    ofi %.3f GB/s (%.2fx fi_pingpong ping-pong)\n", os, os / rbw;
}'

[ "${ALLREDUCE:-1}" = 0 ] && exit 0
# 64 MiB all-reduce over 4 processes: ring through the transport (no node
# windows: an algorithm is named), ofi on this fabric against tcp.
allreduce() {  # TRANSPORT -> out-of-place busbw GB/s
  env WIA_TRANSPORT="$1" WIA_OFI_PROVIDER="$fabric" WIA_OFI_INTER_NODE=all WIA_LOG_LEVEL=warn \
    timeout 300 "$build/bin/wia-bench" --procs 4 --algo ring --sizes 64M -n 5 -w 1 |
    awk '$1 == 67108864 {if ($10 != 0) exit 1; print $9}'
}
ofi_ar=$(allreduce ofi) || { echo "ofi all-reduce failed or wrong"; exit 1; }
tcp_ar=$(allreduce tcp) || { echo "tcp all-reduce failed or wrong"; exit 1; }
awk -v o="$ofi_ar" -v t="$tcp_ar" 'BEGIN {
  printf "64 MiB all-reduce, 4 processes, ring (busbw): ofi %.2f GB/s, tcp %.2f GB/s, ratio %.2fx\n", o, t, o / t;
}'
