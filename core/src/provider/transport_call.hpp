// SPDX-License-Identifier: Apache-2.0
// Calling a transport provider entry with uniform error reporting, like
// runtime/device_call.hpp for devices.
#pragma once

#include <string>

#include "provider/registry.hpp"

namespace wia {

// f(ops, ctx) -> wia_status_t. Returns the status when >= 0, throws
// wia::Error "<provider>: <what>: <provider message>" otherwise.
template <typename F>
wia_status_t transport_call(const Provider& p, const std::string& what, F&& f) {
  clear_provider_error();
  const wia_status_t st = f(*p.transport(), p.ctx());
  if (st >= 0) return st;
  return check_provider(p, st, what.c_str());
}

// The same, for hot paths: describe() -> std::string runs only on failure,
// so a call that succeeds formats nothing.
template <typename Describe, typename F>
wia_status_t transport_call_lazy(const Provider& p, Describe&& describe, F&& f) {
  clear_provider_error();
  const wia_status_t st = f(*p.transport(), p.ctx());
  if (st >= 0) return st;
  return check_provider(p, st, describe().c_str());
}

}  // namespace wia
