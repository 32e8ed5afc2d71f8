// SPDX-License-Identifier: Apache-2.0
// Provider loading: search path, dlopen, ABI negotiation, host services,
// init/fini, and the recorded outcome of every candidate for wia-info.
#pragma once

#include <wia/provider.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "config/config.hpp"

namespace wia {

enum class ProviderState {
  loaded,    // initialised and usable
  absent,    // harmless: no driver/hardware here (init said UNAVAILABLE)
  disabled,  // excluded by providers.enable / providers.disable
  refused    // broken: not a shared object, missing symbol, ABI mismatch,
             // missing required entry, init failed, duplicate name
};
const char* provider_state_name(ProviderState state);

// What happened to one candidate file (or one provider asked for by name
// that was not found at all: path empty, state refused).
struct ProviderRecord {
  std::string name;  // from the descriptor, else derived from the file name
  std::string path;  // absolute path of the shared object
  ProviderState state = ProviderState::refused;
  std::string reason;             // why absent/disabled/refused; empty when loaded
  std::uint32_t abi_version = 0;  // announced by the provider, 0 if unknown
  std::string version;            // provider's own version text
  std::uint64_t caps = 0;         // WIA_PROVIDER_CAP_*
};

// One loaded and initialised provider. Non-copyable; fini() and dlclose()
// run in the destructor.
class Provider {
 public:
  virtual ~Provider() = default;
  virtual const std::string& name() const = 0;
  virtual const std::string& path() const = 0;
  virtual void* ctx() const = 0;
  // The tables adapted to the current ABI (NULL when not offered). Entries
  // beyond the provider's struct_size read as NULL, so callers only check
  // caps bits and NULL.
  virtual const wia_device_ops_v1_t* device() const = 0;
  virtual const wia_transport_ops_v1_t* transport() const = 0;
};

// Throws wia::Error(status, "<provider>: <what>: <provider message or
// status description>") when status < 0; returns status otherwise. The
// provider message is what it passed to host services set_error() on this
// thread since the call began.
wia_status_t check_provider(const Provider& provider, wia_status_t status, const char* what);
// Clears this thread's pending provider error text (call before an entry).
void clear_provider_error();

class ProviderRegistry {
 public:
  // Search order: WIA_PROVIDER_PATH (colon separated), then the YAML
  // providers.search_path, then the directory next to libwia
  // (<libdir>/wia/providers; <prefix>/<libdir>/wia/providers when the core
  // is linked into a program in a bin/ directory). An entry may also name a
  // provider file directly. Every libwia-provider-*.so found is a
  // candidate; the first of a given name wins. Never throws for a bad
  // provider: it is recorded as refused and the others still load. Throws
  // wia::Error(WIA_ERROR_UNAVAILABLE) only when a provider named in
  // providers.enable was not loaded, naming it and why.
  // `config` validates each provider's section (declare_provider) and
  // answers its get_param() calls, so it must outlive the registry.
  static std::unique_ptr<ProviderRegistry> load(Config& config);
  // Same, reading WIA_PROVIDER_PATH through `env` (tests inject it).
  static std::unique_ptr<ProviderRegistry> load(Config& config, const EnvLookup& env);

  virtual ~ProviderRegistry() = default;
  virtual const std::vector<std::string>& search_path() const = 0;
  virtual const std::vector<ProviderRecord>& records() const = 0;
  // Loaded providers in load order (search-path order, then file name).
  virtual const std::vector<std::unique_ptr<Provider>>& loaded() const = 0;
  virtual const Provider* find(const std::string& name) const = 0;
};

}  // namespace wia
