// SPDX-License-Identifier: Apache-2.0
#include "provider/abi.hpp"

namespace wia::provider_abi {

namespace {
// Newest first: a provider exporting several descriptors (to load into old
// and new cores alike) is used through the newest one both sides know. A v2
// adds {2, WIA_PROVIDER_SYMBOL_V2, adapt_v2} above this row.
constexpr AbiVersion kAbiVersions[] = {
    {1, WIA_PROVIDER_SYMBOL_V1, adapt_v1},
};
}  // namespace

std::span<const AbiVersion> abi_versions() { return kAbiVersions; }

bool valid_provider_name(const std::string& name) {
  if (name.empty() || name.size() > kMaxNameLength) return false;
  for (char c : name)
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_')) return false;
  return true;
}

}  // namespace wia::provider_abi
