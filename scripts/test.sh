#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The whole test suite on a fresh Debian 12 clone: install what is missing,
# build and test the default preset and the sanitizer preset, install to a
# temporary prefix and build the out-of-tree examples against it, then the
# ThreadSanitizer subset and a short run of every fuzz target.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh

jobs=$(nproc)
status=0

echo "== default preset"
cmake --preset default >/dev/null
cmake --build --preset default -j "$jobs"
ctest --preset default || status=1

echo "== install + out-of-tree build against the installed package"
scripts/check-install.sh build/default || status=1

echo "== sanitize preset (ASan + UBSan)"
cmake --preset sanitize >/dev/null
cmake --build --preset sanitize -j "$jobs"
ctest --preset sanitize || status=1

echo "== tsan preset (ThreadSanitizer subset, docs/reliability.md)"
scripts/ci-tsan.sh || status=1

echo "== fuzz smoke (every fuzz target, 20000 inputs from a fixed seed, docs/reliability.md)"
fuzz/run-smoke.sh || status=1

exit $status
