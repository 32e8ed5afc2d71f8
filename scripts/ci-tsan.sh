#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# ThreadSanitizer in CI (docs/reliability.md, "ThreadSanitizer"): configures
# the tsan preset (build/tsan), builds only what the tests labelled `tsan`
# run (target wia_tsan_tests: the engine, shm, tcp, bootstrap and
# communicator tests, not the whole tree) and runs them. Every report is
# fatal: TSAN_OPTIONS (the tsan test preset in CMakePresets.json) has
# halt_on_error=1, so a report exits the process with 66 and fails its test.
# tests/tsan.supp may only name code that is not ours; a race in libwia is
# fixed, never suppressed.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh

jobs=${WIA_TSAN_JOBS:-$(nproc)}
start=$(date +%s)
cmake --preset tsan >/dev/null
cmake --build --preset tsan -j "$jobs" --target wia_tsan_tests
built=$(date +%s)

# TSan maps its shadow memory at fixed addresses; a kernel whose ASLR
# places libraries or the stack there makes every program die at start
# ("unexpected memory mapping"). Running without address randomisation
# (setarch -R) is the known fix, used only when the probe needs it.
run=()
probe=build/tsan/bin/test_host_provider
if ! out=$("$probe" --list-test-cases 2>&1) && grep -q "ThreadSanitizer" <<<"$out"; then
  echo "ci-tsan: ThreadSanitizer cannot start here ($(grep -m1 ThreadSanitizer <<<"$out")); running under setarch -R"
  run=(setarch "$(uname -m)" -R)
fi

status=0
"${run[@]}" ctest --preset tsan || status=$?
echo "ci-tsan: build $((built - start)) s, tests $(($(date +%s) - built)) s"
exit $status
