#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The include graph of the core's layers: for each folder of core/src, the
# other folders of core/src its files #include (by the "layer/file.hpp"
# form the core uses), with the number of include lines behind each edge.
# Run it before and after moving code between layers to see that an edge
# went away and no new one came in. Not part of the build.
#
#   tools/layer-deps.sh [--counts] [SRC_DIR]     (SRC_DIR: core/src)
#
# One line per layer: "comm -> api bootstrap coll ..." ("-> (none)" when it
# includes no other layer); with --counts each edge carries its count,
# e.g. "selector -> config(1) topology(1)".
set -euo pipefail
counts=0
if [[ "${1:-}" == "--counts" ]]; then
  counts=1
  shift
fi
src="${1:-$(cd "$(dirname "$0")/.." && pwd)/core/src}"
[[ -d "$src" ]] || { echo "layer-deps: no directory $src" >&2; exit 2; }

layers=()
for d in "$src"/*/; do layers+=("$(basename "$d")"); done

for layer in "${layers[@]}"; do
  # Every "x/..." include in the layer's files, x a layer folder other than this one.
  deps=$(grep -rhoE '^[[:space:]]*#[[:space:]]*include[[:space:]]+"[^"/]+/' "$src/$layer" 2>/dev/null |
    sed -E 's/.*"([^"/]+)\/$/\1/' |
    while read -r dep; do
      [[ "$dep" == "$layer" ]] && continue
      [[ -d "$src/$dep" ]] && echo "$dep"
    done | sort | uniq -c || true)
  line=""
  while read -r n dep; do
    [[ -z "${dep:-}" ]] && continue
    if ((counts)); then line+=" $dep($n)"; else line+=" $dep"; fi
  done <<<"$deps"
  echo "$layer ->${line:- (none)}"
done
