// SPDX-License-Identifier: Apache-2.0
// Host services are C callbacks called from provider code, often from the
// provider's own threads: nothing may throw out of them, and none may block
// for long (provider.h promises both).
#include "provider/host_services.hpp"

#include <fmt/format.h>

#include <chrono>
#include <string>

#include "common/error.hpp"
#include "common/hot_tls.hpp"
#include "common/log.hpp"
#include "config/config.hpp"
#include "provider/registry.hpp"

namespace wia {

namespace {

// The message a provider attached to the error it is about to return. One
// per thread, because the entry point and its set_error() call happen on
// the same thread while other threads call other providers.
thread_local std::string t_error;
// Read before every provider call (clear_provider_error).
thread_local bool t_error_set WIA_HOT_TLS = false;

log::Level to_log_level(wia_log_level_t level) {
  // Clamp rather than reject: a provider built against a later header with
  // a finer scale should still be heard.
  switch (level) {
    case WIA_LOG_TRACE:
      return log::Level::trace;
    case WIA_LOG_DEBUG:
      return log::Level::debug;
    case WIA_LOG_INFO:
      return log::Level::info;
    case WIA_LOG_WARN:
      return log::Level::warn;
    case WIA_LOG_ERROR:
      return log::Level::error;
  }
  return static_cast<int>(level) < 0 ? log::Level::trace : log::Level::error;
}

void host_log(void* host_ctx, wia_log_level_t level, const char* message) {
  try {
    const auto* context = static_cast<const provider_host::HostContext*>(host_ctx);
    const log::Level core_level = to_log_level(level);
    if (context == nullptr || !log::enabled(core_level)) return;
    log::write(core_level, context->name, message != nullptr ? message : "(null)");
  } catch (...) {
    // Losing one log line beats unwinding through C frames.
  }
}

int32_t host_log_enabled(void* /*host_ctx*/, wia_log_level_t level) {
  return log::enabled(to_log_level(level)) ? 1 : 0;
}

void host_set_error(void* /*host_ctx*/, const char* message) {
  try {
    t_error = message != nullptr ? message : "";
    t_error_set = true;
  } catch (...) {
    t_error_set = false;
  }
}

const char* host_get_param(void* host_ctx, const char* key) {
  try {
    const auto* context = static_cast<const provider_host::HostContext*>(host_ctx);
    if (context == nullptr || context->config == nullptr || key == nullptr) return nullptr;
    return context->config->provider_param(context->name, key);
  } catch (...) {
    return nullptr;
  }
}

std::uint64_t host_clock_ns(void* /*host_ctx*/) {
  const auto now = std::chrono::steady_clock::now().time_since_epoch();
  return static_cast<std::uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(now).count());
}

}  // namespace

namespace provider_host {

wia_host_services_v1_t make_host_services(HostContext* context) {
  wia_host_services_v1_t table{};
  table.struct_size = sizeof(table);
  table.abi_version = WIA_HOST_SERVICES_VERSION;
  table.host_ctx = context;
  table.log = host_log;
  table.set_error = host_set_error;
  table.get_param = host_get_param;
  table.clock_ns = host_clock_ns;
  table.log_enabled = host_log_enabled;
  return table;
}

std::string take_error() {
  std::string text;
  if (t_error_set) text.swap(t_error);
  t_error.clear();
  t_error_set = false;
  return text;
}

}  // namespace provider_host

void clear_provider_error() {
  if (!t_error_set) return;
  t_error.clear();
  t_error_set = false;
}

wia_status_t check_provider(const Provider& provider, wia_status_t status, const char* what) {
  if (status >= 0) return status;
  std::string detail = provider_host::take_error();
  if (detail.empty()) detail = status_description(status);
  throw Error(status, fmt::format("{}: {}: {}", provider.name(), what, detail));
}

}  // namespace wia
