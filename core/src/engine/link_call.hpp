// SPDX-License-Identifier: Apache-2.0
// Calling a transport entry on a link of the network engine.
#pragma once

#include <fmt/format.h>

#include <utility>

#include "engine/net_exec.hpp"
#include "provider/transport_call.hpp"

namespace wia::engine {

// f(ops, ctx) -> wia_status_t. Throws wia::Error naming the provider,
// `what` and the peer when it fails; formats nothing when it succeeds.
template <typename F>
wia_status_t link_call(const NetLink& link, const char* what, F&& f) {
  return wia::transport_call_lazy(
      *link.provider, [&] { return fmt::format("{} with {}", what, link.peer); },
      std::forward<F>(f));
}

}  // namespace wia::engine
