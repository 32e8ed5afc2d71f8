// SPDX-License-Identifier: Apache-2.0
// printf-style messages through the host services (host_messages.hpp).
#include "wia_common/host_messages.hpp"

#include <cstdio>

namespace wia::common {

bool log_enabled(const wia_host_services_v1_t* host, wia_log_level_t level) noexcept {
  if (host == nullptr || host->log == nullptr) return false;
  if (!WIA_ABI_HAS_FIELD(wia_host_services_v1_t, host->struct_size, log_enabled) ||
      host->log_enabled == nullptr)
    return true;
  return host->log_enabled(host->host_ctx, level) != 0;
}

void host_vlog(const wia_host_services_v1_t* host, wia_log_level_t level, const char* fmt,
               va_list ap) noexcept {
  if (host == nullptr || host->log == nullptr) return;
  if (!log_enabled(host, level)) return;
  char buf[1024];
  std::vsnprintf(buf, sizeof(buf), fmt, ap);
  host->log(host->host_ctx, level, buf);
}

void host_verror(const wia_host_services_v1_t* host, const char* fmt, va_list ap) noexcept {
  if (host == nullptr || host->set_error == nullptr) return;
  char buf[1024];
  std::vsnprintf(buf, sizeof(buf), fmt, ap);
  host->set_error(host->host_ctx, buf);
}

void host_vendor_error(const wia_host_services_v1_t* host, std::int32_t dev,
                       const char* device_name, const char* vendor_error, const char* fmt,
                       va_list ap) noexcept {
  if (host == nullptr || host->set_error == nullptr) return;
  char what[512];
  std::vsnprintf(what, sizeof(what), fmt, ap);
  char buf[1024];
  if (device_name != nullptr)
    std::snprintf(buf, sizeof(buf), "%s on device %d (%s): %s", what, static_cast<int>(dev),
                  device_name, vendor_error);
  else
    std::snprintf(buf, sizeof(buf), "%s: %s", what, vendor_error);
  host->set_error(host->host_ctx, buf);
}

}  // namespace wia::common
