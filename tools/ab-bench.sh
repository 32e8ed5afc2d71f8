#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Compares two builds of libwia on this machine, interleaved: round after
# round, A's wia-bench then B's, with the same arguments, and prints each
# side's times per size (sorted) and their medians. On a shared machine
# whose speed drifts by +-30% between minutes (docs/performance.md), two
# builds measured one after the other compare the drift, not the change;
# interleaving makes each round a fair pair, and alternating which side
# goes first cancels the order effect. Not part of CI.
#
#   tools/ab-bench.sh [-r ROUNDS] BUILD_A BUILD_B [wia-bench arguments...]
#
# BUILD_A/B: build directories (each with bin/wia-bench), e.g. one
# configured at the commit before a change and one at the change:
#   git worktree add /tmp/wia-base HEAD~1 && cmake -S /tmp/wia-base -B /tmp/wia-base/build \
#     -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo && ninja -C /tmp/wia-base/build
#   tools/ab-bench.sh /tmp/wia-base/build build/bench --procs 2 --sizes 8,1M -n 20000
# Reported: the out-of-place time in us (wia-bench's column) per size.
set -euo pipefail
rounds=5
if [ "${1:-}" = "-r" ]; then rounds=$2; shift 2; fi
[ $# -ge 2 ] || { sed -n '11,18p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
a=$1 b=$2
shift 2
for d in "$a" "$b"; do
  [ -x "$d/bin/wia-bench" ] || { echo "ab-bench: $d/bin/wia-bench not found (build it first)" >&2; exit 2; }
done
export WIA_LOG_LEVEL=${WIA_LOG_LEVEL:-error}
out=$(mktemp -d /tmp/wia-ab-XXXXXX)
trap 'rm -rf "$out"' EXIT
# A B, B A, A B, ...: whichever runs second in a pair was measured 15-25%
# slower here even when A and B were the same build.
for ((r = 1; r <= rounds; ++r)); do
  order="A B"; [ $((r % 2)) -eq 0 ] && order="B A"
  for side in $order; do
    dir=$a; [ $side = B ] && dir=$b
    # size and out-of-place time of every data row
    "$dir/bin/wia-bench" "$@" 2>"$out/err" |
      awk -v side=$side -v r=$r '!/^#/ && $1 ~ /^[0-9]+$/ && NF >= 8 {print side, r, $1, $7}' \
      >>"$out/rows" || { echo "ab-bench: $dir/bin/wia-bench failed:" >&2; tail -5 "$out/err" >&2; exit 1; }
  done
done
echo "# time per call (us), out of place; A = $a, B = $b; $rounds interleaved rounds"
sort -k3,3n -k1,1 -k4,4g "$out/rows" | awk '
  {t[$3, $1] = t[$3, $1] " " $4; v[$3, $1, ++n[$3, $1]] = $4; sizes[$3] = 1}
  END {
    for (s in sizes) order[++k] = s + 0
    for (i = 1; i <= k; ++i) for (j = i + 1; j <= k; ++j) if (order[j] < order[i]) {x = order[i]; order[i] = order[j]; order[j] = x}
    for (i = 1; i <= k; ++i) {
      s = order[i]
      ma = v[s, "A", int((n[s, "A"] + 1) / 2)]; mb = v[s, "B", int((n[s, "B"] + 1) / 2)]
      printf "%10d B  A:%s\n%10s    B:%s\n%10s    median A %s, B %s, B/A %.3f\n", s, t[s, "A"], "", t[s, "B"], "", ma, mb, (ma > 0 ? mb / ma : 0)
    }
  }'
