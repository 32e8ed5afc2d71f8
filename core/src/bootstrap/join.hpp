// SPDX-License-Identifier: Apache-2.0
// Joining a job, the client side of the bootstrap: reaching the root
// (retrying until the timeout), the challenge-response by which the rank and
// the root prove to each other that they know the job's secret, the hello
// that says who this rank is, and the wait for the welcome that completes
// the rendezvous. The factories only say where the root is: from_unique_id
// (unique_id.cpp) from the id, from_launch_info (join.cpp) from the
// launcher's variables or the rendezvous file.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "bootstrap/bootstrap.hpp"
#include "bootstrap/siphash.hpp"
#include "bootstrap/socket.hpp"

namespace wia::bootstrap {

// Where a joining rank goes: from a unique id, a root address, or a file.
struct Target {
  std::vector<SocketAddress> addresses;  // tried in order
  Secret secret;
  std::string name;  // for messages: "10.0.0.2:29500"
};
// Returns the target, or nullopt with *waiting set to what is still missing
// (try again later). Throws for errors that waiting cannot fix.
using TargetSource = std::function<std::optional<Target>(std::string* waiting)>;

// Builds a Bootstrap (it is Bootstrap's friend).
struct Joiner {
  // Joins the root `source` leads to as `rank` of `size`, and returns once
  // every rank has joined. Asks `source` again after every failed attempt,
  // with a growing pause, until options.timeout (WIA_ERROR_TIMEOUT naming
  // the last problem). `root` is the root this process hosts for the job,
  // which the Bootstrap keeps alive (nullptr when it runs elsewhere). With
  // `retry_refusals` a root that refuses the secret is retried too (a stale
  // rendezvous file may lead to another job's root); without, it is
  // WIA_ERROR_REMOTE at once. A rank or size out of range is
  // WIA_ERROR_INVALID_ARGUMENT; rank >= size is left for the root to refuse,
  // so every rank hears of it.
  static std::unique_ptr<Bootstrap> join(const TargetSource& source, int rank, int size,
                                         const Options& options, std::shared_ptr<RootServer> root,
                                         bool retry_refusals);
};

}  // namespace wia::bootstrap
