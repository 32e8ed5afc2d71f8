// SPDX-License-Identifier: Apache-2.0
// The bootstrap: how the processes of one job find each other before any
// transport exists, and the small out-of-band exchanges communicator setup
// needs (transport connection handles, node layout, agreement).
//
// Shape. One process runs the *root* (root.hpp): a thread that listens on
// TCP and serves every rank over one authenticated connection per rank.
// Everything goes through it, like torch's TCPStore: all-gather, barrier,
// point-to-point blobs (forwarded by the root), a key-value store, abort.
// Who runs the root:
//   - create_unique_id() starts it in the calling process (NCCL style); the
//     128-byte id carries its address, port and a random secret, and the
//     application hands the id to every rank by its own means;
//   - from_environment(): rank 0 starts it on the launcher's root address
//     (WIA_ROOT_ADDR, torchrun's MASTER_ADDR) or, for mpirun/srun on one
//     node, on a loopback port it publishes in a 0600 file (launcher.hpp).
// The root thread lives until every rank has closed its Bootstrap (or the
// rendezvous failed or timed out); a process hosting it waits, in its own
// Bootstrap's destructor, for the other ranks to close (bounded by the
// timeout), so it should be the last to finish its bootstrap use, as with
// TCPStore's master.
//
// Security. Every connection to the root proves knowledge of the job's
// 128-bit secret by challenge-response (root nonce, rank nonce, SipHash-2-4
// MACs in both directions), so the secret never crosses the wire and a
// rank also knows it reached its own job's root. Headers are validated
// (magic, version, per-stage length bounds) before any payload is read; a
// stray, malformed or slow client is logged and dropped without blocking
// the job.
//
// Errors are wia::Error. Every wait is bounded by Options::timeout:
//   WIA_ERROR_TIMEOUT            the message names the ranks that did not
//                                arrive ("2 of 4 ranks did not arrive within
//                                30000 ms: ranks 1, 3");
//   WIA_ERROR_INVALID_ARGUMENT   duplicate rank, rank >= size, sizes disagree
//                                (the same message on every rank);
//   WIA_ERROR_MISMATCH           ranks called different collectives;
//   WIA_ERROR_ABORTED            abort() on some rank;
//   WIA_ERROR_REMOTE             a rank died, or the root went away;
//   WIA_ERROR_CONFIG             bad launcher variables, unreachable address.
// Rendezvous and collective failures are fatal: the root fails every rank
// with the same error and each Bootstrap then throws it from every call. A
// recv() or get() timeout is local and leaves the Bootstrap usable.
//
// Threads. One thread at a time may call a Bootstrap's members, except
// abort(), which any thread may call at any time (it wakes the waiter).
//
// Implementation: unique_id.cpp (the id, and joining by it), join.cpp
// (joining: reaching and authenticating to the root, from_launch_info),
// rendezvous_file.cpp (the one-node file), hosted_roots.cpp (the roots this
// process runs), session.cpp (the joined Bootstrap), root.cpp (the root).
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "bootstrap/launcher.hpp"
#include "bootstrap/siphash.hpp"
#include "bootstrap/socket.hpp"
#include "bootstrap/wire.hpp"
#include "config/config.hpp"

namespace wia::bootstrap {

class RootServer;

inline constexpr std::chrono::milliseconds kDefaultTimeout{300000};

struct Options {
  // Bound on every wait (bootstrap.timeout_ms, WIA_BOOTSTRAP_TIMEOUT_MS).
  std::chrono::milliseconds timeout = kDefaultTimeout;
  // A connection must authenticate and say hello within this long, or the
  // root drops it (slow or silent clients).
  std::chrono::milliseconds handshake_timeout{10000};
  // Which local interface a unique id advertises: NCCL_SOCKET_IFNAME
  // syntax (socket.hpp). WIA_SOCKET_IFNAME, else bootstrap.ifname.
  std::string ifname;
  // AF_INET or AF_INET6 to advertise only that family; AF_UNSPEC (0) for
  // either, IPv4 first. WIA_SOCKET_FAMILY = AF_INET | AF_INET6 | 4 | 6.
  int family = 0;
  // torchrun-style launch: the root's port (bootstrap.port,
  // WIA_BOOTSTRAP_PORT); 0 = MASTER_PORT + 1.
  int port = 0;
  // This rank's host identity; empty = WIA_HOSTID, else
  // "<hostname>:<boot_id>". Ranks with equal ids are on one node.
  std::string host_id;

  // From the configuration (bootstrap.*) and WIA_SOCKET_IFNAME /
  // WIA_SOCKET_FAMILY / WIA_HOSTID read through `env`. Throws
  // wia::Error(WIA_ERROR_CONFIG) for a bad WIA_SOCKET_FAMILY.
  static Options from_config(const Config& config, const EnvLookup& env = process_env());
};

// A job's rendezvous ticket, like ncclUniqueId: fixed size, plain bytes
// (copy it with memcpy, send it over MPI, a file or a socket). It holds the
// root's address and the job's secret: whoever has it can join the job.
inline constexpr std::size_t kUniqueIdBytes = 128;
struct UniqueId {
  std::array<std::uint8_t, kUniqueIdBytes> bytes{};
};

// Starts a root in this process: listens on an ephemeral port of the
// interface chosen by options.ifname/family (socket.hpp: choose_interface;
// by default a non-loopback interface, loopback when there is none) and
// returns the id that leads there. The root thread serves until every rank
// that joined has closed, or no rendezvous completes within
// options.timeout of the first rank's arrival (of this call if none
// comes). Throws wia::Error(WIA_ERROR_IO / WIA_ERROR_CONFIG) when no
// address fits or the socket cannot be opened.
UniqueId create_unique_id(const Options& options = {});

// The root address an id leads to, e.g. "10.0.0.2:41235"; throws
// wia::Error(WIA_ERROR_INVALID_ARGUMENT) for bytes that are not an id.
std::string describe_unique_id(const UniqueId& id);

// Which ranks share a node, from each rank's host id. Node indices follow
// the lowest rank on each node; local ranks follow rank order.
struct NodeLayout {
  int nnodes = 0;
  std::vector<int> node_of_rank;        // size = ranks
  std::vector<int> local_rank_of_rank;  // size = ranks
  std::vector<std::vector<int>> ranks_of_node;
};
NodeLayout compute_node_layout(std::span<const std::string> host_ids);

// "<hostname>:<boot_id>", or WIA_HOSTID when set (tests fake hosts with it).
std::string default_host_id();

class Bootstrap {
 public:
  // Joins the job the id leads to as `rank` of `size`. Blocks until every
  // rank has joined (or the timeout; see the errors above).
  static std::unique_ptr<Bootstrap> from_unique_id(const UniqueId& id, int rank, int size,
                                                   const Options& options = {});
  // Joins as the launcher says (launcher.hpp). Rank 0 starts the root.
  static std::unique_ptr<Bootstrap> from_launch_info(const LaunchInfo& launch,
                                                     const Options& options = {});
  // detect_launcher(process_environment(), options.port, geteuid()) and
  // from_launch_info(). Throws wia::Error(WIA_ERROR_CONFIG) when no
  // launcher is found, naming the variables it looked for.
  static std::unique_ptr<Bootstrap> from_environment(const Options& options = {});

  // Sends a clean goodbye; a process that hosts the root first waits (up
  // to the timeout) for the other ranks to close. Never throws.
  ~Bootstrap();
  Bootstrap(const Bootstrap&) = delete;
  Bootstrap& operator=(const Bootstrap&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  // Node layout, from the host ids every rank reported.
  int nnodes() const { return layout_.nnodes; }
  int node() const { return layout_.node_of_rank[static_cast<std::size_t>(rank_)]; }
  int node_of(int rank) const { return layout_.node_of_rank.at(static_cast<std::size_t>(rank)); }
  int local_rank() const { return layout_.local_rank_of_rank[static_cast<std::size_t>(rank_)]; }
  int local_size() const { return static_cast<int>(layout_.ranks_of_node[node()].size()); }
  const NodeLayout& layout() const { return layout_; }
  const std::string& host_id(int rank) const {
    return host_ids_.at(static_cast<std::size_t>(rank));
  }
  std::chrono::milliseconds timeout() const { return timeout_; }
  // "10.0.0.2:41235": where the root is, for messages.
  const std::string& root_address() const { return root_address_; }

  // Every rank contributes `mine` (the same size on every rank, at most
  // 1 MiB); returns size() * mine.size() bytes, rank r's blob at
  // r * mine.size(). Different sizes on different ranks, or a barrier on
  // one and an all-gather on another, is WIA_ERROR_MISMATCH on every rank.
  std::vector<std::uint8_t> all_gather(std::span<const std::uint8_t> mine);
  // Same, into `all` (size() * mine.size() bytes).
  void all_gather(std::span<const std::uint8_t> mine, std::span<std::uint8_t> all);
  // Returns when every rank has called barrier().
  void barrier();

  // Point to point, forwarded by the root. send() returns once the bytes
  // are handed to the socket (it does not wait for the receiver); messages
  // from one sender with one tag arrive in order. recv() waits for the next
  // message from `peer` with `tag`; a recv timeout is WIA_ERROR_TIMEOUT and
  // not fatal. At most 1 MiB per message.
  void send(int peer, std::uint64_t tag, std::span<const std::uint8_t> data);
  std::vector<std::uint8_t> recv(int peer, std::uint64_t tag);

  // Key-value store held by the root. put() replaces; get() waits until
  // some rank has put the key (WIA_ERROR_TIMEOUT, not fatal, if none does).
  // A put followed by a barrier is visible to every rank's get. Keys up to
  // 1024 bytes, values up to 1 MiB.
  void put(std::string_view key, std::span<const std::uint8_t> value);
  std::vector<std::uint8_t> get(std::string_view key);

  // Fails the job's bootstrap on every rank with WIA_ERROR_ABORTED and
  // `reason`, and wakes this process's waiting call at once. Any thread,
  // any time, more than once; never throws, never blocks for long.
  void abort(std::string_view reason) noexcept;

 private:
  Bootstrap() = default;
  friend struct Joiner;

  // Reads and files one frame. Returns false at the deadline; throws on a
  // failure (which it also makes sticky).
  bool pump_one(Deadline deadline);
  // pump_one's steps. Waits until the root's socket is readable; false at
  // the deadline, fails at once after abort().
  bool wait_for_frame(Deadline deadline);
  // Reads a frame header and checks its length against payload_bound().
  wire::Header read_frame_header(Deadline frame_deadline);
  // The longest payload a frame of `type` from the root may have now.
  std::size_t payload_bound(wire::FrameType type) const;
  std::vector<std::uint8_t> read_frame_payload(std::size_t length, Deadline frame_deadline);
  // Files the payload where its waiter looks (a frame the rank does not
  // expect is a protocol failure); one function per frame type.
  void file_frame(wire::FrameType type, std::span<const std::uint8_t> payload);
  void file_welcome(wire::Reader& r);
  void file_gather_result(wire::Reader& r);
  void file_delivery(wire::Reader& r);
  void file_value(wire::Reader& r);
  [[noreturn]] void fail_with_root_error(wire::Reader& r);
  // The sticky failures pump_one and send_frame end in.
  [[noreturn]] void fail_aborted();
  [[noreturn]] void fail_connection_lost(IoResult result, int error);
  [[noreturn]] void fail_malformed_frame(const wire::ProtocolError& e);
  // Pumps until done() or the deadline; false at the deadline.
  template <typename Done>
  bool pump_until(Done done, Deadline deadline);
  void send_frame(const std::vector<std::uint8_t>& frame);
  [[noreturn]] void fail_sticky(wia_status_t status, std::string message);
  void throw_if_failed() const;
  // An all-gather of `kind` (wire::GatherKind) through the root.
  std::vector<std::uint8_t> run_gather(std::uint8_t kind, std::span<const std::uint8_t> mine);
  // Pumps until done(); at the timeout asks the root who is missing
  // (wire::WaitKind `what`, collective `seq`) and fails with its answer.
  template <typename Done>
  void wait_or_report(Done done, std::uint8_t what, std::uint64_t seq,
                      const std::string& waiting_for);
  // wait_or_report() for the welcome that completes the rendezvous.
  void await_welcome();

  int rank_ = -1;
  int size_ = 0;
  std::chrono::milliseconds timeout_ = kDefaultTimeout;
  std::string root_address_;
  NodeLayout layout_;
  std::vector<std::string> host_ids_;

  Fd socket_;
  Fd wake_;             // eventfd; readable once abort() was called
  std::mutex send_mu_;  // one frame at a time; see lock_within (session.cpp)
  std::atomic<bool> aborted_{false};
  std::atomic<bool> stream_broken_{false};  // a send stopped mid-frame
  std::mutex abort_mu_;
  std::string abort_reason_;  // guarded by abort_mu_
  bool failed_ = false;
  wia_status_t failed_status_ = WIA_SUCCESS;
  std::string failed_message_;

  std::uint64_t next_gather_seq_ = 0;
  std::uint64_t next_request_ = 1;
  std::map<std::uint64_t, std::vector<std::uint8_t>> gather_results_;
  std::map<std::uint64_t, std::vector<std::uint8_t>> values_;
  std::map<std::pair<int, std::uint64_t>, std::deque<std::vector<std::uint8_t>>> mailbox_;
  bool welcomed_ = false;
  std::size_t expected_gather_bytes_ = 0;
  std::uint64_t current_get_ = 0;  // request id get() waits for; 0 = none

  std::shared_ptr<RootServer> root_;  // set when this process hosts the root
};

}  // namespace wia::bootstrap
