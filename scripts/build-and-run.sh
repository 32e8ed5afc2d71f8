#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The main job on a fresh Debian 12 clone: install what is missing, build,
# and run the benchmark on the embedded default configuration (host
# devices, no configuration file needed). Extra arguments go to the tool.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
cmake --preset default >/dev/null
cmake --build --preset default
if [ -x build/default/bin/wia-bench ]; then
  exec build/default/bin/wia-bench "$@"
fi
exec build/default/bin/wia-info "$@"
