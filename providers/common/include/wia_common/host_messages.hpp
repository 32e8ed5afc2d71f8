// SPDX-License-Identifier: Apache-2.0
// printf-style log lines and error messages through the core's host
// services (wia_host_services_v1_t.log / .set_error), shared by every
// provider: each once wrote its own va_list-and-buffer copy of these.
#pragma once

#include <wia/provider.h>

#include <cstdarg>
#include <cstdint>

namespace wia::common {

// Formats and logs one line under the provider's name; nothing when the
// host offers no log callback. Lines are cut at 1023 bytes.
// Whether a line at `level` would be written (true when the host cannot
// say): checked before formatting, so trace lines cost nothing when off.
bool log_enabled(const wia_host_services_v1_t* host, wia_log_level_t level) noexcept;
void host_vlog(const wia_host_services_v1_t* host, wia_log_level_t level, const char* fmt,
               va_list ap) noexcept;
// Formats and attaches the message to the error the calling thread is about
// to return; nothing when the host offers no set_error callback.
void host_verror(const wia_host_services_v1_t* host, const char* fmt, va_list ap) noexcept;

// The accelerator providers' message for a failed vendor call:
// "<what> on device D (device_name): <vendor_error>", or
// "<what>: <vendor_error>" when device_name is NULL (no valid device).
// `what` is printf-formatted from fmt/ap.
void host_vendor_error(const wia_host_services_v1_t* host, std::int32_t dev,
                       const char* device_name, const char* vendor_error, const char* fmt,
                       va_list ap) noexcept;

}  // namespace wia::common
