#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The recovery story end to end, with real processes on this host:
#   1. 4 ranks train; rank 2 is SIGKILLed at iteration 37; the 3 survivors
#      detect it, shrink to a communicator of 3 in place, restore the latest
#      checkpoint (iteration 30) and finish the 60 iterations;
#   2. a reference job of 3 ranks started from that checkpoint (iteration
#      30's files alone) finishes with bit-identical parameters.
set -euo pipefail
bin=${BUILD_DIR:?}/ft-train
export LD_LIBRARY_PATH="${WIA_PREFIX:?}/lib" WIA_HOST_DEVICES=1 WIA_LOG_LEVEL=${WIA_LOG_LEVEL:-off}
export WIA_COLLECTIVES_TIMEOUT_MS=5000
work=$(mktemp -d /tmp/wia-ft-XXXXXX)
trap 'rm -rf "$work"' EXIT

# job N DIR OUT [VAR=VALUE...]: N ranks, torchrun style; prints each rank's exit status.
job() {
  local n=$1 dir=$2 out=$3; shift 3
  local port=$((20000 + RANDOM % 20000)) pids=() r
  for ((r = 0; r < n; r++)); do
    env "$@" RANK=$r WORLD_SIZE=$n MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
      timeout 120 "$bin" "$dir" 60 "$out" &
    pids+=($!)
  done
  local codes=()
  for p in "${pids[@]}"; do wait "$p" && codes+=(0) || codes+=($?); done
  echo "${codes[*]}"
}

codes=$(job 4 "$work/ckpt" "$work/run.out" KILL_RANK=2 KILL_AT=37)
echo "fault-tolerant-training: 4 ranks, rank 2 killed at iteration 37: exit codes $codes"
[ "$codes" = "0 0 137 0" ] || { echo "expected the 3 survivors to shrink and finish (0 0 137 0)"; exit 1; }
# The checkpoint the survivors went on from: iterations 0, 10, 20, 30 were
# saved by 4 ranks, so the 5th save; the reference starts from it alone.
mkdir -p "$work/ref-ckpt"
cp -r "$work/ckpt/ckpt-00000004" "$work/ref-ckpt/"
printf 'ckpt-00000004' > "$work/ref-ckpt/latest"
codes=$(job 3 "$work/ref-ckpt" "$work/ref.out")
echo "fault-tolerant-training: reference, 3 ranks from iteration 30's checkpoint: exit codes $codes"
[ "$codes" = "0 0 0" ] || exit 1
cmp "$work/run.out" "$work/ref.out"
echo "fault-tolerant-training: final parameters are bit-identical to the reference run"
