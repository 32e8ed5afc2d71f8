#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# CI's fuzz smoke run (docs/reliability.md, "Fuzzing"): builds the fuzz
# preset, then runs every fuzz target on its seed corpus, FUZZ_JOBS
# (default 2) at a time: FUZZ_RUNS inputs (default 20000) from the fixed
# FUZZ_SEED (default 1), the same inputs on every machine, so that a gate
# passed here passes in CI; or, with FUZZ_SECONDS set, for that long with
# a random seed (exploring: fuzz/run-long.sh). Fails on any crash,
# sanitizer report, broken invariant, timeout or out-of-memory; the input
# that did it is kept under build/fuzz/artifacts/ and the run's log tail is
# printed. The seed corpora are only read: what the run finds goes to a
# temporary directory.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=${FUZZ_JOBS:-2}
if [ -n "${FUZZ_SECONDS:-}" ]; then
  limit="-max_total_time=$FUZZ_SECONDS" outer=$((FUZZ_SECONDS + 120))
else
  limit="-runs=${FUZZ_RUNS:-20000} -seed=${FUZZ_SEED:-1}" outer=600
fi

start=$(date +%s)
cmake --preset fuzz >/dev/null
cmake --build --preset fuzz -j "$jobs"
built=$(date +%s)

artifacts=build/fuzz/artifacts
mkdir -p "$artifacts"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# fuzz_<input>.cpp -> <input>: every target, with no list to keep in step.
targets=()
for src in fuzz/fuzz_*.cpp; do
  t=$(basename "$src" .cpp)
  targets+=("${t#fuzz_}")
done

export LIMIT=$limit OUTER=$outer WORK=$work ARTIFACTS=$artifacts
run_one() {
  local t=$1
  mkdir -p "$WORK/$t"
  # Leak checking is off: LeakSanitizer's check at the end of a run stalled
  # one for over ten minutes here (a multi-GB heap on 2 shared cores). The
  # limits: -timeout catches a hang or a slow leak in one input (as the
  # yaml-cpp endless-documents loop was), -malloc_limit_mb one huge
  # allocation; -rss_limit_mb=0 because libFuzzer's RSS handler prints a
  # heap profile that took minutes here. The outer timeout is a last resort.
  # $LIMIT is two words (or one): split on purpose.
  # shellcheck disable=SC2086
  if ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
     timeout -s KILL "$OUTER" \
     "build/fuzz/bin/fuzz_$t" $LIMIT -timeout=10 \
       -rss_limit_mb=0 -malloc_limit_mb=2048 -print_final_stats=1 \
       -artifact_prefix="$ARTIFACTS/$t-" "$WORK/$t" "fuzz/corpus/$t" >"$WORK/$t.log" 2>&1; then
    echo "fuzz_$t: ok ($(grep -Eo 'stat::number_of_executed_units: *[0-9]+' "$WORK/$t.log" |
      grep -Eo '[0-9]+$') runs)"
  else
    echo "fuzz_$t: FAILED (input kept under $ARTIFACTS/)"
    tail -n 60 "$WORK/$t.log"
    return 1
  fi
}
export -f run_one

status=0
printf '%s\n' "${targets[@]}" | xargs -P "$jobs" -I{} bash -c 'run_one {}' || status=1
end=$(date +%s)
echo "fuzz smoke: ${#targets[@]} targets, build $((built - start)) s, runs $((end - built)) s," \
  "total $((end - start)) s"
exit $status
