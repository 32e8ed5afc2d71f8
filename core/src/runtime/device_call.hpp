// SPDX-License-Identifier: Apache-2.0
// Calling a device provider entry with uniform error reporting: the
// provider's own message, its name and the device are in the error text.
#pragma once

#include <string>

#include <fmt/format.h>

#include "provider/registry.hpp"
#include "runtime/runtime.hpp"

namespace wia {

inline const wia_device_ops_v1_t& ops_of(const Device& d) { return *d.provider->device(); }

// f(ops, ctx) -> wia_status_t. Returns the status when >= 0, throws
// wia::Error "<provider>: <what> on device N: <message>" otherwise.
template <typename F>
wia_status_t device_call(const Device& d, const char* what, F&& f) {
  clear_provider_error();
  const wia_status_t st = f(ops_of(d), d.provider->ctx());
  if (st >= 0) return st;
  const std::string label = fmt::format("{} on device {}", what, d.id);
  return check_provider(*d.provider, st, label.c_str());
}

}  // namespace wia
