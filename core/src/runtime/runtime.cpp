// SPDX-License-Identifier: Apache-2.0
#include "runtime/runtime.hpp"

#include <atomic>
#include <cstdlib>

#include <fmt/format.h>

#include "common/error.hpp"
#include "common/log.hpp"
#include "runtime/objects.hpp"

namespace wia {

namespace {
std::mutex g_runtime_mu;
std::unique_ptr<Runtime> g_runtime;  // guarded by g_runtime_mu for create/destroy
// The same pointer, read without the lock: every API call starts with
// Runtime::get(). Set after construction, cleared before destruction
// (using the library while wia_finalize runs is the caller's error).
std::atomic<Runtime*> g_runtime_fast{nullptr};

}  // namespace

Runtime::Runtime(const std::string& yaml_path) {
  static std::atomic<std::uint64_t> generations{0};
  generation_ = ++generations;
  bump_object_epoch();
  config_ = std::make_unique<Config>(yaml_path.empty() ? Config::load_from_env()
                                                        : Config::load(yaml_path));
  log::Level level = log::Level::warn;
  log::parse_level(config_->get_string("log.level"), &level);
  log::configure(level, config_->get_string("log.file"));
  log::debug("runtime", "configuration from {}",
             config_->file().empty() ? "embedded defaults" : config_->file());

  providers_ = ProviderRegistry::load(*config_);

  for (const auto& provider : providers_->loaded()) {
    const wia_device_ops_v1_t* ops = provider->device();
    if (ops == nullptr) continue;
    clear_provider_error();
    int32_t count = 0;
    if (check_provider(*provider, ops->device_count(provider->ctx(), &count), "device_count") < 0)
      continue;
    for (int32_t i = 0; i < count; ++i) {
      Device d;
      d.id = static_cast<wia_device_t>(devices_.size());
      d.provider = provider.get();
      d.local_index = i;
      d.props.struct_size = sizeof(d.props);
      clear_provider_error();
      check_provider(*provider, ops->device_props(provider->ctx(), i, &d.props), "device_props");
      devices_.push_back(d);
      log::debug("runtime", "device {}: {} ({} #{})", d.id, d.props.name, provider->name(), i);
    }
  }
  log::info("runtime", "{} provider(s) loaded, {} device(s)", providers_->loaded().size(),
            devices_.size());
}

Runtime::~Runtime() { bump_object_epoch(); }

Runtime& Runtime::get() {
  if (Runtime* r = g_runtime_fast.load(std::memory_order_acquire)) return *r;
  std::lock_guard<std::mutex> lock(g_runtime_mu);
  if (!g_runtime) g_runtime.reset(new Runtime(""));
  g_runtime_fast.store(g_runtime.get(), std::memory_order_release);
  return *g_runtime;
}

Runtime& Runtime::init(const std::string& yaml_path) {
  std::lock_guard<std::mutex> lock(g_runtime_mu);
  if (g_runtime)
    throw Error(WIA_ERROR_INVALID_ARGUMENT,
                "libwia is already initialised; call wia_finalize() before initialising again");
  g_runtime.reset(new Runtime(yaml_path));
  g_runtime_fast.store(g_runtime.get(), std::memory_order_release);
  return *g_runtime;
}

void Runtime::finalize() {
  std::lock_guard<std::mutex> lock(g_runtime_mu);
  if (!g_runtime) return;
  release_all_objects(*g_runtime);
  g_runtime_fast.store(nullptr, std::memory_order_release);
  g_runtime.reset();
}

bool Runtime::initialized() {
  std::lock_guard<std::mutex> lock(g_runtime_mu);
  return g_runtime != nullptr;
}

const Device& Runtime::device(wia_device_t id) const {
  if (id < 0 || static_cast<std::size_t>(id) >= devices_.size()) {
    if (devices_.empty())
      throw Error(WIA_ERROR_INVALID_DEVICE,
                  fmt::format("device {} does not exist: no device provider is loaded "
                              "(see `wia-info`)",
                              id));
    throw Error(WIA_ERROR_INVALID_DEVICE,
                fmt::format("device {} does not exist (valid: 0..{})", id, devices_.size() - 1));
  }
  return devices_[static_cast<std::size_t>(id)];
}

}  // namespace wia
