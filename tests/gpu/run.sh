#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The cuda provider on a real NVIDIA GPU (reference machine: one H200),
# in under 5 minutes. What it runs, in order, each step under a timeout:
#   1. the GPU and the driver (nvidia-smi), and wia-info: cuda loaded;
#   2. wia-conformance L0-L5 on the real driver, with the GPU as one device
#      and as 4 logical devices (cuda.logical_devices_per_gpu), so that the
#      peer, IPC and 4-rank collective tests run on a single GPU too;
#   3. wia-cuda-bench: copies and the reduce kernel against the driver
#      called directly, a caller's PTX kernel through wia_launch_kernel, and
#      a data-checked 4-rank all-reduce on device memory (posted in a
#      group), as ratios measured in the same run;
#   4. the ofi provider with FI_HMEM (tests/gpu/ofi_hmem.sh): cuda buffers
#      between two processes straight to the fabric, when a libfabric here
#      claims FI_HMEM; otherwise it prints SKIP and the reason.
# Exit status: the number of failed steps (0 = all passed).
#
#   tests/gpu/run.sh [PREFIX]
# PREFIX: a folder made by tests/gpu/bundle.sh (build it on the Debian
# machine and carry it); without one, the script builds here, which needs
# the Debian packages of scripts/install-deps.sh.
set -uo pipefail
cd "$(dirname "$0")/../.."
prefix=${1:-}
if [ -z "$prefix" ]; then
  tests/gpu/bundle.sh build/gpu-bundle || exit 100
  prefix=build/gpu-bundle
fi
prefix=$(realpath "$prefix")
export LD_LIBRARY_PATH="$prefix/lib:$prefix/lib/deps${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export WIA_PROVIDER_PATH="$prefix/lib/wia/providers"
cuda_so="$prefix/lib/wia/providers/libwia-provider-cuda.so"
failures=0
# A dry run on a machine without a GPU: WIA_CUDA_LIBRARY names the driver
# double (build/default/fake-cuda/libcuda.so.1); the tools read the variable
# through libwia, wia-conformance takes it as a parameter.
library_param=()
[ -n "${WIA_CUDA_LIBRARY:-}" ] && library_param=(--param "library=$WIA_CUDA_LIBRARY")

step() { printf '\n== %s\n' "$*"; }
# run SECONDS COMMAND...: a failed or timed-out command counts as a failure.
run() {
  local limit=$1
  shift
  timeout --kill-after=5 "$limit" "$@"
  local rc=$?
  if [ $rc -ne 0 ]; then
    echo "FAILED (exit $rc${rc/124/, timed out}): $*"
    failures=$((failures + 1))
  fi
}

step "GPU and driver"
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv || true
missing=$(for f in "$prefix"/bin/* "$prefix"/lib/wia/providers/*.so; do ldd "$f"; done 2>&1 | grep "not found" | sort -u)
[ -n "$missing" ] && echo "libraries not found: $missing"
step "wia-info (cuda must be loaded)"
run 60 "$prefix/bin/wia-info"
if ! WIA_PROVIDERS_ENABLE=host,cuda "$prefix/bin/wia-info" >/dev/null 2>&1; then
  echo "FAILED: the cuda provider did not load (wia-info above says why)"
  failures=$((failures + 1))
fi

step "conformance L0-L5, the GPU as one device"
run 150 "$prefix/bin/wia-conformance" --provider "$cuda_so" --timeout-scale 2 "${library_param[@]}"
step "conformance L0-L5, the GPU as 4 logical devices"
run 150 "$prefix/bin/wia-conformance" --provider "$cuda_so" --timeout-scale 2 \
  --param logical_devices_per_gpu=4 "${library_param[@]}"

step "wia-cuda-bench (ratios; data checked)"
WIA_CUDA_LOGICAL_DEVICES_PER_GPU=4 WIA_CUDA_BENCH_PROVIDER="$cuda_so" \
  run 120 "$prefix/bin/wia-cuda-bench" --size 64M --iters 20 --rounds 5 --ranks 4
WIA_CUDA_LOGICAL_DEVICES_PER_GPU=4 WIA_CUDA_BENCH_PROVIDER="$cuda_so" \
  run 120 "$prefix/bin/wia-cuda-bench" --size 1G --iters 5 --rounds 3 --ranks 4

step "ofi with FI_HMEM: device buffers straight to the fabric (SKIP without a libfabric that claims it)"
run 240 tests/gpu/ofi_hmem.sh "$prefix"

step "done: $failures failed step(s)"
exit "$failures"
