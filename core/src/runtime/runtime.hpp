// SPDX-License-Identifier: Apache-2.0
// The process-wide runtime behind the C API: configuration, loaded
// providers, the global device table. Created lazily on first use.
#pragma once

#include <wia/provider.h>
#include <wia/wia.h>

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "config/config.hpp"
#include "provider/registry.hpp"

namespace wia {

// One device as the public API numbers it: a device of a loaded provider.
struct Device {
  wia_device_t id = -1;           // global index
  const Provider* provider = nullptr;
  int32_t local_index = -1;       // index inside the provider
  wia_device_props_v1_t props{};  // queried once at start-up
};

class Runtime {
 public:
  // The live runtime, initialising it (from WIA_CONFIG or defaults) on
  // first call. Throws wia::Error if initialisation fails (bad config).
  static Runtime& get();
  // Initialise explicitly from `yaml_path` ("" = WIA_CONFIG / defaults).
  // Throws if already initialised.
  static Runtime& init(const std::string& yaml_path);
  // Tear down (no-op when not initialised).
  static void finalize();
  static bool initialized();

  ~Runtime();
  const Config& config() const { return *config_; }
  const ProviderRegistry& providers() const { return *providers_; }
  const std::vector<Device>& devices() const { return devices_; }
  // Throws wia::Error(WIA_ERROR_INVALID_DEVICE) naming the valid range.
  const Device& device(wia_device_t id) const;
  // Distinct for every initialisation of the process's runtime.
  std::uint64_t generation() const { return generation_; }

 private:
  explicit Runtime(const std::string& yaml_path);
  std::unique_ptr<Config> config_;
  std::unique_ptr<ProviderRegistry> providers_;
  std::vector<Device> devices_;
  std::uint64_t generation_ = 0;
};

}  // namespace wia
