#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Backend "wia" against gloo in the same run (docs/torch.md): all_reduce bus
# bandwidth 1-64 MiB and a DDP step, torchrun with 4 local ranks.
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
# torchrun of torch 1.13 under Python 3.11 needs --redirects/--tee other than 0
# (tests/torch/tests.cmake says why); rank 0's lines are the report.
PYTHONPATH=$build/python OMP_NUM_THREADS=1 WIA_LOG_LEVEL=warn \
  "$python" -W ignore::UserWarning -m torch.distributed.run --standalone --redirects 1 --tee 1 \
  --nproc_per_node="$ranks" python/bench/torch_bench.py "$@" 2>&1 | sed -n 's/^\[default0\]://p'
