#!/usr/bin/env bash
set -euo pipefail
WIA_HOST_DEVICES=2 LD_LIBRARY_PATH="$WIA_PREFIX/lib" "$BUILD_DIR/p2p-copy"
