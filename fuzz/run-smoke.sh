#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# CI's fuzz smoke run (docs/reliability.md, "Fuzzing"): builds the fuzz
# preset, then runs every fuzz target on its seed corpus, FUZZ_JOBS
# (default 2) at a time: FUZZ_RUNS inputs (default 20000) from the fixed
# FUZZ_SEED (default 1), the same inputs on every machine, so that a gate
# passed here passes in CI; or, with FUZZ_SECONDS set, for that long with
# a random seed (exploring: fuzz/run-long.sh). Fails on any crash,
# sanitizer report, broken invariant, timeout or out-of-memory; the input
# that did it is kept under <build>/artifacts/ and the run's log tail is
# printed. The seed corpora are only read: what the run finds goes to
# <build>/smoke/<input>/, emptied first. FUZZ_BUILD_DIR (default
# build/fuzz) builds the fuzz preset elsewhere.
#
# The same seed alone did not give the same run (docs/reliability.md,
# "Fuzzing"): libFuzzer's comparison tracing fed values that differ
# between processes (addresses under ASLR, bytes of the environment and
# stack) into the inputs it builds, and a run's mutations followed them.
# A fixed-seed run therefore also turns address randomisation off for the
# target (setarch -R, where the kernel allows it), gives it the same
# environment and arguments on every machine, and does not use comparison
# operands (-use_cmp=0); each target then builds the same inputs in the
# same order, whatever the load (all but fuzz_tcp_frames so far: see the
# docs). Each line names the corpus the target grew (corpus <hash>): two
# runs of the same tree print the same hashes.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=${FUZZ_JOBS:-2}
build=${FUZZ_BUILD_DIR:-build/fuzz}
if [ -n "${FUZZ_SECONDS:-}" ]; then
  limit="-max_total_time=$FUZZ_SECONDS -timeout=10" outer=$((FUZZ_SECONDS + 120)) norandom=""
else
  limit="-runs=${FUZZ_RUNS:-20000} -seed=${FUZZ_SEED:-1} -use_cmp=0 -reload=0 -timeout=30"
  outer=600
  norandom="setarch $(uname -m) -R"
  if ! $norandom true 2>/dev/null; then
    echo "fuzz smoke: setarch -R is refused here (a container's seccomp profile?): runs" \
      "keep address randomisation and may differ from run to run" >&2
    norandom=""
  fi
fi

start=$(date +%s)
if [ "$build" = build/fuzz ]; then
  cmake --preset fuzz >/dev/null
  cmake --build --preset fuzz -j "$jobs"
else
  cmake --preset fuzz -B "$build" >/dev/null
  cmake --build "$build" --target fuzz -j "$jobs"
fi
built=$(date +%s)

artifacts=$build/artifacts
work=$build/smoke
mkdir -p "$artifacts"
rm -rf "$work"
mkdir -p "$work"

# fuzz_<input>.cpp -> <input>: every target, with no list to keep in step.
targets=()
for src in fuzz/fuzz_*.cpp; do
  t=$(basename "$src" .cpp)
  targets+=("${t#fuzz_}")
done

export LIMIT=$limit OUTER=$outer WORK=$work ARTIFACTS=$artifacts BUILD=$build NORANDOM=$norandom
run_one() {
  local t=$1
  mkdir -p "$WORK/$t"
  # Leak checking is off: LeakSanitizer's check at the end of a run stalled
  # one for over ten minutes here (a multi-GB heap on 2 shared cores). The
  # limits: -timeout catches a hang or a slow leak in one input (as the
  # yaml-cpp endless-documents loop was), -malloc_limit_mb one huge
  # allocation; -rss_limit_mb=0 because libFuzzer's RSS handler prints a
  # heap profile that took minutes here. The outer timeout is a last resort.
  # The environment is only what the target needs (env -i): its size moves
  # the stack, whose addresses the run must not depend on.
  # $LIMIT and $NORANDOM are several words (or none): split on purpose.
  # shellcheck disable=SC2086
  if timeout -s KILL "$OUTER" env -i PATH=/usr/local/bin:/usr/bin:/bin \
     ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
     $NORANDOM "$BUILD/bin/fuzz_$t" $LIMIT \
       -rss_limit_mb=0 -malloc_limit_mb=2048 -print_final_stats=1 \
       -artifact_prefix="$ARTIFACTS/$t-" "$WORK/$t" "fuzz/corpus/$t" >"$WORK/$t.log" 2>&1; then
    echo "fuzz_$t: ok ($(grep -Eo 'stat::number_of_executed_units: *[0-9]+' "$WORK/$t.log" |
      grep -Eo '[0-9]+$') runs, corpus $(find "$WORK/$t" -type f -printf '%f\n' | sort | sha1sum |
      cut -c1-12))"
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
