// SPDX-License-Identifier: Apache-2.0
// The one-node rendezvous file. Under mpirun or srun on one node no launcher
// variable names a root address, so rank 0 starts a root on a loopback port
// and publishes it in a file only this user can read (the path comes from
// launcher.hpp: LaunchInfo::rendezvous_file); the other ranks read the file
// until it leads them to that root. One line:
//   "wia-bootstrap 1 <addr:port> <secret as hex> <size>"
// written to a temporary file and renamed into place, so a reader sees all
// of it or none.
#pragma once

#include <optional>
#include <string>

#include "bootstrap/siphash.hpp"
#include "bootstrap/socket.hpp"

namespace wia::bootstrap {

// What rank 0 published: where its root listens, and the job's secret.
struct PublishedRoot {
  SocketAddress address;
  Secret secret;
};

// Rank 0: writes the file at `path` with mode 0600 (replacing a stale one).
// Throws wia::Error(WIA_ERROR_IO) naming the path when it cannot.
void write_rendezvous_file(const std::string& path, const SocketAddress& address,
                           const Secret& secret, int size);

// The other ranks: the root the file at `path` leads to, or nullopt with
// *waiting set to what is still missing (no file yet, a malformed one: try
// again later). Throws wia::Error for what waiting cannot fix: a file that is
// not a 0600 regular file of this user (WIA_ERROR_IO), or one for a job of
// another size than `size` (WIA_ERROR_INVALID_ARGUMENT).
std::optional<PublishedRoot> read_rendezvous_file(const std::string& path, int size,
                                                  std::string* waiting);

}  // namespace wia::bootstrap
