#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Compares the ofi provider's point-to-point figures with libfabric's own
# reference, fi_pingpong (libfabric-bin), on the same fabric provider and
# in the same run, and prints the ratios (docs/transport-ofi.md).
#   scripts/ofi-bench.sh [BUILD_DIR] [FABRIC]     (defaults build/default, "tcp;ofi_rxm")
# Both sides ping-pong: latency = half a round trip of 8 B; bandwidth = a
# 4 MiB message each way, one at a time (fi_pingpong's method), so the two
# numbers are measured alike. wia-transport-bench's streaming bandwidth
# (window 4) is printed too. Then a 64 MiB all-reduce (ring) over 4
# processes of this machine on ofi and on our tcp provider, one after the
# other in the same run (issue 21 asks for the figure, not a target).
set -euo pipefail
build=${1:-build/default}
fabric=${2:-tcp;ofi_rxm}
bench=$build/bin/wia-transport-bench
command -v fi_pingpong >/dev/null || { echo "fi_pingpong not found (apt install libfabric-bin)"; exit 2; }
[ -x "$bench" ] || { echo "$bench not built (cmake --build $build --target wia-transport-bench)"; exit 2; }
addr=$(hostname -I | awk '{print $1}')
port=$((40000 + RANDOM % 20000))

# fi_pingpong SIZE ITERS -> "usec/xfer MB/sec" (MB/sec counts both directions)
pingpong() {
  fi_pingpong -p "$fabric" -e rdm -m tagged -S "$1" -I "$2" -B "$port" >/dev/null 2>&1 &
  local server=$!
  sleep 0.5
  local line
  line=$(timeout 120 fi_pingpong -p "$fabric" -e rdm -m tagged -S "$1" -I "$2" -P "$port" "$addr" | tail -1)
  wait "$server" || true
  port=$((port + 1))
  echo "$line" | awk '{print $7, $6}'
}
read -r ref_lat _ < <(pingpong 8 20000)
read -r ref_big_us ref_big_mbs < <(pingpong 4194304 200)

ours=$("$bench" --provider ofi --param "provider=$fabric" --endpoint 0 --sizes 8:8 --time 0.5 | tail -1)
ours_big=$("$bench" --provider ofi --param "provider=$fabric" --endpoint 0 --sizes 4M:4M --time 1 | tail -1)
our_lat=$(echo "$ours" | awk '{print $3}')
our_big_us=$(echo "$ours_big" | awk '{print $3}')
our_stream=$(echo "$ours_big" | awk '{print $4}')

awk -v rl="$ref_lat" -v ol="$our_lat" -v rb="$ref_big_us" -v ob="$our_big_us" -v os="$our_stream" \
    -v f="$fabric" 'BEGIN {
  rbw = 4194304 / rb / 1000; obw = 4194304 / ob / 1000;
  printf "fabric %s, one run\n", f;
  printf "8 B latency (half round trip): ofi %.2f us, fi_pingpong %.2f us, ratio %.2fx (target <= 1.2x)\n", ol, rl, ol / rl;
  printf "4 MiB ping-pong bandwidth:     ofi %.3f GB/s, fi_pingpong %.3f GB/s, ratio %.2fx (target >= 0.9x)\n", obw, rbw, obw / rbw;
  printf "4 MiB streaming (window 4):    ofi %.3f GB/s (%.2fx fi_pingpong ping-pong)\n", os, os / rbw;
}'

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
