#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Long fuzzing (hours): every target, or those named, for
# FUZZ_SECONDS each (default 3600; -max_total_time), FUZZ_JOBS at a time
# (default 2). The corpus each run grows is kept in build/fuzz/long/<input>/
# (seeded from fuzz/corpus/<input>/) so the next long run starts from it;
# crashes go to build/fuzz/long/artifacts/. A crash found becomes a
# regression input in fuzz/corpus/<input>/regress-<what> and a test in
# tests/unit/fuzz_regressions/ (docs/reliability.md).
#   fuzz/run-long.sh                       every target, one hour each
#   FUZZ_SECONDS=28800 fuzz/run-long.sh bootstrap config
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${FUZZ_SECONDS:-3600}
jobs=${FUZZ_JOBS:-2}

cmake --preset fuzz >/dev/null
cmake --build --preset fuzz -j "$jobs"

targets=("$@")
if ((${#targets[@]} == 0)); then
  for src in fuzz/fuzz_*.cpp; do
    t=$(basename "$src" .cpp)
    targets+=("${t#fuzz_}")
  done
fi
long=build/fuzz/long
mkdir -p "$long/artifacts"

export FUZZ_SECONDS=$seconds LONG=$long
run_one() {
  local t=$1
  mkdir -p "$LONG/$t"
  # Same limits as run-smoke.sh (see there why leak checking is off).
  ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
    timeout -s KILL $((FUZZ_SECONDS + 600)) \
    "build/fuzz/bin/fuzz_$t" -max_total_time="$FUZZ_SECONDS" -timeout=10 \
      -rss_limit_mb=0 -malloc_limit_mb=2048 -print_final_stats=1 \
      -artifact_prefix="$LONG/artifacts/$t-" "$LONG/$t" "fuzz/corpus/$t" >"$LONG/$t.log" 2>&1
  local rc=$?
  if ((rc == 0)); then echo "fuzz_$t: ok"; else echo "fuzz_$t: FAILED, see $LONG/$t.log"; fi
  return $rc
}
export -f run_one

status=0
printf '%s\n' "${targets[@]}" | xargs -P "$jobs" -I{} bash -c 'run_one {}' || status=1
ls "$long/artifacts"
exit $status
