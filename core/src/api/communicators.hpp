// SPDX-License-Identifier: Apache-2.0
// The public communicator handle and the set of live ones, shared by the
// device-based (api_coll.cpp) and process-based (api_process.cpp) entry
// points.
#pragma once

#include <wia/wia.h>

#include <memory>

#include <fmt/format.h>

#include "api/guard.hpp"
#include "comm/communicator_base.hpp"
#include "common/error.hpp"
#include "runtime/objects.hpp"

struct wia_communicator_s {
  std::unique_ptr<wia::comm::CommunicatorBase> impl;
};

namespace wia::api {

inline HandleSet<wia_communicator_s>& communicators() {
  static auto* set = new HandleSet<wia_communicator_s>();
  return *set;
}

inline comm::CommunicatorBase& live(wia_communicator_t c) {
  require_non_null(c, "comm");
  if (!communicators().contains(c))
    throw Error(WIA_ERROR_INVALID_HANDLE,
                fmt::format("communicator {} is not live (destroyed, or never created)",
                            static_cast<const void*>(c)));
  return *c->impl;
}

// Registers a new communicator and returns its handle.
inline wia_communicator_t publish(std::unique_ptr<comm::CommunicatorBase> impl) {
  auto c = std::make_unique<wia_communicator_s>();
  c->impl = std::move(impl);
  communicators().add(c.get());
  return c.release();
}

}  // namespace wia::api
