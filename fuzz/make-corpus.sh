#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Regenerates the binary seeds of fuzz/corpus/ from libwia's own encoders
# (fuzz/make_corpus.cpp), e.g. after a wire format changes. The YAML seeds
# are copies of config/ and the test data (docs/reliability.md lists them).
set -euo pipefail
cd "$(dirname "$0")/.."
cmake --preset fuzz >/dev/null
cmake --build --preset fuzz -j 2 --target fuzz_make_corpus
ASAN_OPTIONS=detect_leaks=0 build/fuzz/bin/fuzz_make_corpus fuzz/corpus
