#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Run by scripts/check-install.sh: the freshly built provider must pass
# conformance levels 0-2 with the installed wia-conformance.
set -euo pipefail
"$WIA_PREFIX/bin/wia-conformance" --provider "$BUILD_DIR/libwia-provider-acme.so" --level 2 \
  --junit "$BUILD_DIR/conformance.xml"
