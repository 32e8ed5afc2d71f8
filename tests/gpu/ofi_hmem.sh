#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The ofi provider's device-memory path (FI_HMEM, docs/transport-ofi.md) on
# this machine's GPU, when a libfabric here claims FI_HMEM: two processes
# send cuda device buffers to each other over ofi (wia-ofi-hmem-p2p, data
# checked, every transfer "direct" in the profile). Called by
# tests/gpu/run.sh; prints "SKIP: <reason>" and exits 0 when there is no
# such libfabric (Debian's is built without CUDA), 1 when the check fails.
#
#   tests/gpu/ofi_hmem.sh PREFIX
# PREFIX: the folder of tests/gpu/bundle.sh. WIA_OFI_LIBRARY names the
# libfabric to use (default: the first libfabric.so.1 the loader or the
# usual vendor folders have); WIA_OFI_PROVIDER the fabric (default: the
# first that claims FI_HMEM). A dry run on the test doubles:
# WIA_CUDA_LIBRARY=<build>/fake-cuda/libcuda.so.1
# WIA_OFI_LIBRARY=<build>/fake-hmem-fabric/libwia-fake-hmem-fabric.so
# WIA_OFI_PROVIDER="tcp;ofi_rxm".
set -uo pipefail
prefix=$(realpath "${1:?usage: ofi_hmem.sh PREFIX}")
ofi_so="$prefix/lib/wia/providers/libwia-provider-ofi.so"
prog="$prefix/bin/wia-ofi-hmem-p2p"
if [ ! -f "$ofi_so" ] || [ ! -x "$prog" ]; then
  echo "SKIP: $prefix has no ofi provider or wia-ofi-hmem-p2p (made by tests/gpu/bundle.sh where libfabric-dev is installed)"
  exit 0
fi
lib=""
for c in "${WIA_OFI_LIBRARY:-}" $(ldconfig -p 2>/dev/null | awk '/libfabric\.so\.1 /{print $NF}') \
  /opt/amazon/efa/lib/libfabric.so.1 /opt/amazon/efa/lib64/libfabric.so.1 \
  /usr/local/lib/libfabric.so.1 /opt/libfabric/lib/libfabric.so.1; do
  if [ -n "$c" ] && [ -e "$c" ]; then lib=$c; break; fi
done
if [ -z "$lib" ]; then
  echo "SKIP: no libfabric.so.1 on this machine (set WIA_OFI_LIBRARY to one built with CUDA)"
  exit 0
fi
# The provider's own verdict on every fabric that library offers.
verdicts=$(WIA_OFI_ENABLE=on WIA_OFI_LIBRARY="$lib" WIA_OFI_PROVIDER="${WIA_OFI_PROVIDER:-}" \
  WIA_LOG_LEVEL=info timeout 60 "$prefix/bin/wia-info" 2>&1 | grep 'ofi:   ')
fabric=${WIA_OFI_PROVIDER:-$(sed -n 's/.*ofi:   \([^ ]*\) [^ ]* (fabric .*: taken (.*FI_HMEM (device memory registered.*/\1/p' <<<"$verdicts" | head -1)}
if ! grep -q 'taken (.*[^o] FI_HMEM (device memory registered' <<<"$verdicts" || [ -z "$fabric" ]; then
  echo "SKIP: no fabric of $lib claims FI_HMEM (a libfabric built --with-cuda is needed); the provider's verdicts:"
  sed -n 's/.*ofi:   \(.*: taken (.*\)/  \1/p' <<<"$verdicts" | sort -u
  exit 0
fi
echo "ofi FI_HMEM: $lib, fabric $fabric"
config=$(mktemp /tmp/wia-ofi-hmem-XXXXXX.yaml)
trap 'rm -f "$config"' EXIT
cat >"$config" <<YAML
host:
  devices: 1
collectives:
  timeout_ms: 60000
selector:
  transport: ofi
ofi:
  enable: "on"
  provider: "$fabric"
  inter_node: all
  library: "$lib"
YAML
log=$(mktemp /tmp/wia-ofi-hmem-XXXXXX.log)
trap 'rm -f "$config" "$log"' EXIT
WIA_LOG_LEVEL=${WIA_LOG_LEVEL:-info} timeout --kill-after=5 180 "$prog" "$config" >"$log" 2>&1
rc=$?
grep -E 'rank [01]:|p2p: |straight to the transport|staged through' "$log" | sed 's/^\[[^]]*\] //'
if [ $rc -eq 3 ]; then
  # Debian's shm, for one, claims FI_HMEM and refuses every device
  # registration (-FI_ENOSYS): staged, data checked, nothing to test here.
  echo "SKIP: $fabric claims FI_HMEM but did not take this GPU's memory (staged; the reason is above)"
  exit 0
fi
exit $rc
