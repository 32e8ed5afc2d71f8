#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Installs the Debian 12 packages libwia builds and tests with. Idempotent:
# does nothing (and needs no network) when everything is already present.
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config ccache
  libyaml-cpp-dev libspdlog-dev libfmt-dev doctest-dev libhwloc-dev
  liblz4-dev libzstd-dev libxxhash-dev  # checkpoints (docs/checkpoints.md)
  iproute2 iperf3 openmpi-bin
  libfabric-dev libfabric-bin  # the ofi provider and fi_pingpong (docs/transport-ofi.md)
  libibverbs-dev  # the verbs provider's headers and its test double (docs/transport-verbs.md)
  python3-torch libtorch-dev pybind11-dev python3-dev  # the torch backend (docs/torch.md)
  libamdhip64-dev  # ROCm's header, to check the hip provider's own declarations (docs/provider-hip.md)
  clang libclang-rt-14-dev  # the fuzz preset: clang 14 and libFuzzer (docs/reliability.md)
  python3-matplotlib  # wia-bench --plot draws its chart with it, run by /usr/bin/python3 (docs/profiling.md)
  libze-dev  # Level Zero's header and loader (libze1), to check the ze provider's declarations and its absence without a driver (docs/provider-ze.md)
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]} == 0)); then
  exit 0
fi

echo "install-deps: installing ${missing[*]}"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
