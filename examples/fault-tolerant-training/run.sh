#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The recovery story end to end, with real processes on this host:
#   1. 4 ranks train; rank 2 is SIGKILLed at iteration 37; the 3 survivors
#      detect it (exit 3); the latest checkpoint is iteration 30;
#   2. the job is relaunched with 3 ranks, resumes from iteration 30, finishes;
#   3. a reference job of 3 ranks started from a copy of that checkpoint
#      finishes with bit-identical parameters.
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
[ "$codes" = "3 3 137 3" ] || { echo "expected the survivors to detect the failure (3 3 137 3)"; exit 1; }
latest=$(cat "$work/ckpt/latest")
echo "fault-tolerant-training: latest checkpoint $latest"
[ "$latest" = "ckpt-00000004" ] || { echo "expected iterations 0, 10, 20, 30 saved"; exit 1; }
cp -r "$work/ckpt" "$work/ref-ckpt"
rm -f "$work/ref-ckpt/LOCK"

codes=$(job 3 "$work/ckpt" "$work/run.out")
echo "fault-tolerant-training: relaunched with 3 ranks: exit codes $codes"
[ "$codes" = "0 0 0" ] || exit 1
codes=$(job 3 "$work/ref-ckpt" "$work/ref.out")
echo "fault-tolerant-training: reference, 3 ranks from the same checkpoint: exit codes $codes"
[ "$codes" = "0 0 0" ] || exit 1
cmp "$work/run.out" "$work/ref.out"
echo "fault-tolerant-training: final parameters are bit-identical to the reference run"
