#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# Regenerates providers/cuda/kernels/generated/wia_cuda_kernels.ptx, the
# PTX the cuda provider embeds when it is built without nvcc. Run it after
# changing anything under providers/cuda/kernels/ and commit the result;
# the ctest cuda_kernels_ptx_current fails while the file is stale.
#
#   scripts/regen-cuda-ptx.sh [OUTPUT]     (NVCC=/path/to/nvcc to choose one)
#
# The flags must stay those of WIA_CUDA_PTX_FLAGS in
# providers/cuda/CMakeLists.txt.
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
kernels="$root/providers/cuda/kernels"
out=${1:-"$kernels/generated/wia_cuda_kernels.ptx"}
nvcc=${NVCC:-}
if [ -z "$nvcc" ]; then
  nvcc=$(command -v nvcc || true)
  [ -n "$nvcc" ] || [ ! -x /usr/local/cuda/bin/nvcc ] || nvcc=/usr/local/cuda/bin/nvcc
fi
if [ -z "$nvcc" ]; then
  echo "regen-cuda-ptx.sh: nvcc not found (install the CUDA toolkit or set NVCC)" >&2
  exit 1
fi
mkdir -p "$(dirname "$out")"
"$nvcc" -std=c++17 -ptx -arch=compute_80 -I"$kernels" -o "$out.tmp" "$kernels/wia_cuda_kernels.cu"
mv "$out.tmp" "$out"
echo "wrote $out ($("$nvcc" --version | tail -n 1))"
