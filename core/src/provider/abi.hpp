// SPDX-License-Identifier: Apache-2.0
// ABI negotiation: the exported descriptor symbols the loader knows, newest
// first, and for each one an adapter that validates the provider's
// descriptor and turns it into the single form the rest of the core uses.
// Supporting a new ABI version is one more adapter file (abi_v2.cpp) and one
// more row in abi_versions(); nothing else in the core changes.
#pragma once

#include <wia/provider.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace wia::provider_abi {

// A provider descriptor as the core sees it, whatever version it was built
// for. The tables are zero-padded copies: an entry beyond the provider's
// struct_size reads as NULL, so callers only test caps bits and NULL. String
// and function pointers point into the provider's image, so a Descriptor is
// valid only while its shared object stays loaded.
struct Descriptor {
  std::uint32_t abi_version = 0;  // as announced by the provider
  std::string name;
  std::string version;
  std::uint64_t caps = 0;  // WIA_PROVIDER_CAP_*
  std::uint32_t host_services_version = 0;
  std::vector<wia_param_decl_v1_t> params;  // struct_size normalised to ours
  wia_status_t (*init)(const wia_host_services_v1_t* host, void** ctx) = nullptr;
  wia_status_t (*fini)(void* ctx) = nullptr;
  std::optional<wia_device_ops_v1_t> device;
  std::optional<wia_transport_ops_v1_t> transport;
};

// What the loader knows about the exported symbol before reading it.
struct SymbolInfo {
  const void* address = nullptr;
  // ELF symbol size in bytes, 0 when unknown; lets the adapter refuse a
  // struct_size that claims more than the object really holds instead of
  // reading past it.
  std::size_t size = 0;
};

struct AbiVersion {
  std::uint32_t version;
  const char* symbol;  // "wia_provider_v1"
  // Validates the descriptor at `symbol.address`. Returns the refusal
  // reason, or an empty string when `out` is complete and usable. On
  // refusal `out` still holds whatever could be read safely (name,
  // version, abi_version, caps) so wia-info can show it.
  std::string (*adapt)(const SymbolInfo& symbol, Descriptor* out);
};

// Every version this core accepts, newest first.
std::span<const AbiVersion> abi_versions();

// "[a-z0-9_]+" and at most kMaxNameLength characters: names become file
// names, YAML section names and WIA_<NAME>_<KEY> variable names.
constexpr std::size_t kMaxNameLength = 63;
bool valid_provider_name(const std::string& name);

// The adapter of ABI v1 (abi_v1.cpp).
std::string adapt_v1(const SymbolInfo& symbol, Descriptor* out);

}  // namespace wia::provider_abi
