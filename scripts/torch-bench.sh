#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Backend "wia" against gloo in the same run (docs/torch.md): all_reduce bus
# bandwidth 1-64 MiB and a DDP step, 4 local ranks (torchrun's environment,
# started by tests/torch/launch.py, which says why not torchrun itself).
#   scripts/torch-bench.sh [BUILD_DIR] [torch_bench.py args...]
set -euo pipefail
cd "$(dirname "$0")/.."
build=build/default
if [ $# -gt 0 ] && [ -d "$1" ]; then build=$1; shift; fi
ranks=${WIA_BENCH_RANKS:-4}
python=/usr/bin/python3
[ -x "$python" ] || python=python3
if ! ls "$build"/python/wia_torch/_C*.so >/dev/null 2>&1; then
  echo "torch-bench: $build/python/wia_torch is not built (docs/torch.md says what it needs)" >&2
  exit 1
fi
# Rank 0's lines are the report.
PYTHONPATH=$build/python OMP_NUM_THREADS=1 WIA_LOG_LEVEL=warn PYTHONWARNINGS=ignore::UserWarning \
  "$python" tests/torch/launch.py --timeout 1800 "$ranks" python/bench/torch_bench.py "$@" 2>&1 |
  sed -n -e 's/^\[0\] //p' -e '/launch: FAIL/p'
