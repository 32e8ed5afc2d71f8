// SPDX-License-Identifier: Apache-2.0
// The bootstrap root: one thread that owns a listening socket and serves
// every rank of one job over one authenticated TCP connection per rank.
// All bootstrap traffic goes through it (a star, like torch's TCPStore):
// rendezvous, all-gathers, point-to-point forwarding and the key-value
// store. A single poll() loop over non-blocking sockets means a stray,
// slow or hostile client can cost a file descriptor and a few bytes of
// buffer until its handshake deadline, but never block a real rank.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "bootstrap/siphash.hpp"
#include "bootstrap/socket.hpp"

namespace wia::bootstrap {

class RootServer {
 public:
  struct Settings {
    Secret secret;
    // The rendezvous must complete within this long of the first rank's
    // arrival (of start() when no rank comes); then the root fails the
    // ranks that came, naming the missing ones, and exits.
    std::chrono::milliseconds timeout{300000};
    // A connection must authenticate and say hello within this long.
    std::chrono::milliseconds handshake_timeout{10000};
    // Ranks in the job; 0 = learned from the first hello (unique-id mode).
    std::uint32_t expected_size = 0;
  };

  // Takes ownership of a listening socket and starts the thread.
  RootServer(Fd listener, Settings settings);
  ~RootServer();  // stop() and join
  RootServer(const RootServer&) = delete;
  RootServer& operator=(const RootServer&) = delete;

  // The address the listener is bound to ("0.0.0.0:29500" for a wildcard).
  const SocketAddress& address() const { return address_; }
  const Secret& secret() const { return settings_.secret; }

  // Ends the thread at once; ranks still connected see the connection close.
  void stop() noexcept;
  // Ends the thread once the job has failed and the failure has been
  // delivered to every connected rank (or after a short linger), instead of
  // serving late ranks until the rendezvous deadline. For a hosting process
  // that is about to go away.
  void drain_and_stop() noexcept;
  // True once the thread has exited: every rank closed, the rendezvous timed
  // out, or stop() was called.
  bool finished() const { return finished_.load(); }
  // Waits until finished() or the deadline; returns finished().
  bool wait_finished(Deadline deadline) const;
  // Connections refused so far (bad authentication, malformed frames,
  // handshake too slow); for tests and diagnostics.
  std::uint64_t rejected_connections() const { return rejected_.load(); }

  // The root's frame handling without sockets or a thread, for fuzz_bootstrap
  // and the tests of what it found. Each chunk is bytes arriving on
  // connection `conn` (opened at its first chunk, challenged with a server
  // nonce of 16 bytes equal to `conn`, so an input can carry a valid
  // authentication). Returns, per connection in order of opening, the bytes
  // the root queued for it and whether it dropped the connection. Anything
  // the handling lets escape escapes (on the serving thread it would stop
  // the root of the whole job).
  struct FeedChunk {
    std::uint8_t conn = 0;
    std::span<const std::uint8_t> bytes;
  };
  struct FeedResult {
    std::vector<std::uint8_t> sent;
    bool dropped = false;
  };
  static std::vector<FeedResult> feed_for_testing(Settings settings,
                                                  std::span<const FeedChunk> chunks);

 private:
  struct Loop;
  struct NoThread {};
  RootServer(Settings settings, NoThread) : settings_(std::move(settings)) {}
  void run() noexcept;

  Settings settings_;
  Fd listener_;
  Fd wake_;  // eventfd: stop()
  SocketAddress address_;
  std::atomic<bool> stop_requested_{false};
  std::atomic<bool> drain_requested_{false};
  std::atomic<bool> finished_{false};
  std::atomic<std::uint64_t> rejected_{0};
  std::thread thread_;
};

}  // namespace wia::bootstrap
