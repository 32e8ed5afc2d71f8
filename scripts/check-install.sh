#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Installs a build tree to a temporary prefix, then builds and runs the
# out-of-tree examples against the installed package only (find_package and
# pkg-config), as a vendor or an application would.
set -euo pipefail
build=${1:-build/default}
root=$(cd "$(dirname "$0")/.." && pwd)
prefix=$(mktemp -d /tmp/wia-install-XXXXXX)
work=$(mktemp -d /tmp/wia-oot-XXXXXX)
trap 'rm -rf "$prefix" "$work"' EXIT

cmake --install "$build" --prefix "$prefix" >/dev/null
for f in include/wia/wia.h include/wia/provider.h include/wia/status.h \
         lib/libwia.so lib/wia/providers/libwia-provider-host.so bin/wia-info bin/wia-conformance \
         lib/pkgconfig/wia.pc lib/cmake/wia/wiaConfig.cmake bin/wia-bench share/wia/wia_plot.py; do
  [ -e "$prefix/$f" ] || { echo "check-install: missing $f in the installed tree"; exit 1; }
done
# The installed tools run from any prefix without LD_LIBRARY_PATH.
env -u LD_LIBRARY_PATH "$prefix/bin/wia-info" --config >/dev/null ||
  { echo "check-install: the installed wia-info does not run"; exit 1; }
env -u LD_LIBRARY_PATH "$prefix/bin/wia-bench" --ranks 2 --sizes 1K -n 1 -w 0 >/dev/null ||
  { echo "check-install: the installed wia-bench does not run"; exit 1; }

failed=0
for ex in "$root"/examples/*/; do
  name=$(basename "$ex")
  [ -f "$ex/CMakeLists.txt" ] || continue
  echo "check-install: building examples/$name against $prefix"
  cmake -S "$ex" -B "$work/$name" -G Ninja -DCMAKE_PREFIX_PATH="$prefix" >/dev/null
  cmake --build "$work/$name" >/dev/null
  if [ -x "$ex/run.sh" ]; then
    if WIA_PREFIX="$prefix" BUILD_DIR="$work/$name" "$ex/run.sh"; then
      echo "check-install: examples/$name passed"
    else
      echo "check-install: examples/$name FAILED"; failed=1
    fi
  fi
done

# pkg-config: a C program compiled by hand against the installed files.
export PKG_CONFIG_PATH="$prefix/lib/pkgconfig"
cat > "$work/pc.c" <<'C'
#include <wia/wia.h>
#include <stdio.h>
int main(void) {
  int n = 0;
  if (wia_get_device_count(&n) != WIA_SUCCESS || n < 1) {
    fprintf(stderr, "pkg-config consumer: %s\n", wia_get_last_error());
    return 1;
  }
  printf("pkg-config consumer: %d device(s)\n", n);
  return wia_finalize() == WIA_SUCCESS ? 0 : 1;
}
C
# shellcheck disable=SC2046
cc -std=c11 -Wall -Werror "$work/pc.c" -o "$work/pc" $(pkg-config --cflags --libs wia) \
  -Wl,-rpath,"$prefix/lib"
"$work/pc" || failed=1

# The torch backend (docs/torch.md), when this build has it: the installed
# package imports from the prefix, finds the installed libwia and providers
# through its RPATH, and runs a collective.
if ls "$build"/python/wia_torch/_C*.so >/dev/null 2>&1; then
  pkg="$prefix/lib/python3/dist-packages"
  python=/usr/bin/python3
  [ -x "$python" ] || python=python3
  if PYTHONPATH="$pkg" PYTHONWARNINGS=ignore "$python" - "$pkg" "$work" <<'PY'
import sys
import torch
import torch.distributed as dist
import wia_torch
assert wia_torch.__file__.startswith(sys.argv[1]), wia_torch.__file__
dist.init_process_group("wia", init_method=f"file://{sys.argv[2]}/store", rank=0, world_size=1)
t = torch.arange(4.0)
dist.all_reduce(t)
assert t.tolist() == [0.0, 1.0, 2.0, 3.0], t
dist.destroy_process_group()
print("check-install: wia_torch from", wia_torch.__file__, "ran an all_reduce")
PY
  then :; else echo "check-install: wia_torch from the installed tree FAILED"; failed=1; fi
fi
exit $failed
