#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Builds what tests/gpu/run.sh runs, on this (Debian) machine, into a folder
# that can travel to a GPU machine without our Debian build dependencies:
# a Release installation (libwia, the providers, wia-info, wia-conformance,
# wia-cuda-bench, and for the ofi step the ofi provider and
# wia-ofi-hmem-p2p) plus, in lib/deps, every shared library those files need
# that is not part of the C runtime (yaml-cpp, spdlog, fmt, hwloc, ...).
#
#   tests/gpu/bundle.sh [OUT [BUILD]]
# OUT defaults to build/gpu-bundle. BUILD: an existing build tree to take
# the files from (e.g. build/default, already built); without it a Release
# tree is configured and built in build/gpu-release.
#
# The cuda provider's kernels are compiled by nvcc when it is found
# (/usr/local/cuda/bin), else the committed PTX is embedded.
set -euo pipefail
cd "$(dirname "$0")/../.."
out=$(realpath -m "${1:-build/gpu-bundle}")
build=${2:-build/gpu-release}
if [ -z "${2:-}" ]; then
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DWIA_BUILD_TESTS=OFF >/dev/null
fi
cmake --build "$build" -j "$(nproc)" --target wia wia-provider-host wia-provider-cuda \
  wia-provider-shm wia-info wia-conformance wia-cuda-bench
# The ofi provider, where libfabric-dev is installed: it opens libfabric
# with dlopen, so it carries none of libfabric (the GPU machine's own one,
# if any, is what tests/gpu/ofi_hmem.sh uses).
ofi=1
cmake --build "$build" -j "$(nproc)" --target wia-provider-ofi >/dev/null 2>&1 || ofi=0
rm -rf "$out"
# Install only what the GPU run needs.
mkdir -p "$out/bin" "$out/lib/wia/providers" "$out/lib/deps"
cp -L "$build"/lib/libwia.so* "$out/lib/"
for p in host cuda shm; do cp "$build/lib/wia/providers/libwia-provider-$p.so" "$out/lib/wia/providers/"; done
for t in wia-info wia-conformance wia-cuda-bench; do cp "$build/bin/$t" "$out/bin/"; done
if [ "$ofi" = 1 ]; then
  cp "$build/lib/wia/providers/libwia-provider-ofi.so" "$out/lib/wia/providers/"
  # Two processes moving cuda buffers over ofi (FI_HMEM); public API only.
  "${CXX:-c++}" -std=c++17 -O2 -Wall -Icore/include -Iplugin_api/include \
    tests/gpu/ofi_hmem_p2p.cpp -o "$out/bin/wia-ofi-hmem-p2p" -L"$out/lib" -lwia \
    -Wl,-rpath,'$ORIGIN/../lib:$ORIGIN/../lib/deps'
else
  echo "bundle: no ofi provider (libfabric-dev is not installed): the GPU run's ofi step will SKIP"
fi
strip --strip-debug "$out"/bin/* "$out"/lib/*.so* "$out"/lib/wia/providers/*.so
# Every library the dynamic loader resolves for them, except the C runtime,
# which the GPU machine has (a newer glibc runs binaries built against ours).
runtime='^(libc|libm|libdl|librt|libpthread|ld-linux-x86-64|linux-vdso|libresolv)\.so'
for f in "$out"/bin/* "$out"/lib/*.so* "$out"/lib/wia/providers/*.so; do
  LD_LIBRARY_PATH="$out/lib" ldd "$f" | awk '$3 ~ /^\// {print $1, $3}'
done | sort -u | while read -r name path; do
  [[ "$name" =~ $runtime || "$path" == "$out"/* ]] && continue
  cp -L "$path" "$out/lib/deps/$name"
done
echo "bundle: $out ($(du -sh "$out" | cut -f1)); deps: $(ls "$out/lib/deps" | tr '\n' ' ')"
