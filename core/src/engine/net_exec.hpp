// SPDX-License-Identifier: Apache-2.0
// Executing one rank's program of a schedule over transport connections
// (process-based communicators): the "network engine".
//
// Each peer is reached through one connection of a transport provider
// (shm, tcp, ...). A send step is an isend of its region; a receive lands
// straight in its destination region; a receive-reduce lands in a staging
// slot and is then reduced into its destination by the CPU kernels (a
// chain of them into one region whose messages have all arrived, as in
// the direct all-reduce, in one n-ary pass: extends_chain). All
// receive-reduces are posted at the start (their slots are private), plain
// receives and sends as soon as their dependencies are done, so the
// transport always holds every message the rank can accept: a sender never
// waits for a receive to be posted later, and progress needs no thread of
// its own: the executing thread drives it through test().
//
// Every collective also carries a descriptor (sequence number, collective,
// algorithm, count, dtype, op, root) that each rank sends to its successor
// in rank order and checks against its own: ranks that made different
// calls cannot all agree around the ring, so at least one rank detects any
// mismatch. Whoever fails (mismatch, a lost connection, a timeout) makes it
// an error on every rank through the communicator's abort path
// (ControlChannel), never a hang.
//
// Transport tags: the schedule's tag in the low 32 bits; bit 32 marks the
// descriptor, bit 33 the control channel.
#pragma once

#include <poll.h>
#include <wia/provider.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/exec_plan.hpp"

namespace wia {
class Provider;
}

namespace wia::engine {

inline constexpr std::uint64_t kDescriptorTag = 1ull << 32;
inline constexpr std::uint64_t kControlTag = 1ull << 33;
inline constexpr std::uint32_t kMinTagBits = 34;

// A connection to one peer rank.
struct NetLink {
  const Provider* provider = nullptr;  // nullptr for the rank itself
  wia_conn_t conn = nullptr;
  std::int32_t endpoint = -1;  // of `provider`, that `conn` was made on (reg_mr)
  std::string peer;  // "rank 3 (host b, tcp 10.0.0.2:4000)" for messages
};

// What every rank of a collective must agree on.
struct Descriptor {
  std::uint64_t seq = 0;
  std::uint64_t count = 0;
  std::uint32_t magic = 0x57494143;  // "WIAC"
  std::uint8_t collective = 0;
  std::uint8_t algorithm = 0;
  std::uint8_t dtype = 0;
  std::uint8_t op = 0;
  std::int32_t root = 0;
  std::uint32_t num_chunks = 0;
};
static_assert(sizeof(Descriptor) == 32, "the descriptor is sent as raw bytes");
// "" when equal, else "count 100 vs 99, dtype ..." (mine vs theirs).
std::string describe_difference(const Descriptor& mine, const Descriptor& theirs);

// Checked between steps for failures reported by peers (the communicator's
// control receives). Returns "" or the reason the collective must stop.
class ControlChannel {
 public:
  virtual ~ControlChannel() = default;
  virtual std::string poll() = 0;
  // Called when collective `seq` timed out: asks the peers where they are
  // and returns what it learnt ("rank 2 has not reached it (...)"), so the
  // error names the stuck rank, not only the neighbour waiting for it.
  virtual std::string diagnose(std::uint64_t seq) = 0;
};

struct NetExecOptions {
  std::chrono::steady_clock::time_point deadline;
  std::uint32_t timeout_ms = 0;  // for messages
  bool oversubscribed = false;   // more busy processes than cores: spin less
};

class Backoff;

// dst = srcs[0] op ... op srcs[n-1] over `count` elements of `desc`'s
// dtype, in that order (so ranks that fold in rank order get identical
// bits); arguments were validated when the call was posted. Throws
// Error(WIA_ERROR_INTERNAL) naming `rank`, `what` and the collective.
void reduce_in_order(const Descriptor& desc, wia_reduce_op_t op, void* dst,
                     const std::vector<const void*>& srcs, std::uint64_t count, int rank,
                     const char* what);

// The longest a running collective goes without looking at its control
// channel: well under the heartbeat period (500 ms by default), so
// heartbeats leave on time from a rank inside a long one.
inline constexpr std::chrono::milliseconds kControlEvery{50};

// When an idle waiter looks at its control channel: every 64th round, and
// on the round after kControlEvery passed (a round may sleep a
// millisecond, and a yield on a loaded machine many: 64 of them could
// outlast heartbeat_timeout_ms).
struct ControlPace {
  std::uint32_t rounds = 0;
  bool due = false;
  std::chrono::steady_clock::time_point last{};
};

// One idle round of a rank waiting for its peers: looks at the control
// channel when `pace` says (a peer's failure, or a dead peer its transport
// noticed, becomes Error(WIA_ERROR_REMOTE)); then waits, and on the rounds
// that read the clock says whether `options.deadline` (kTimedOut: the
// caller throws its own timeout message) or `give_up_at` passed.
enum class IdleRound { kAgain, kGiveUp, kTimedOut };
IdleRound idle_round(Backoff& backoff, ControlPace& pace, ControlChannel& control,
                     const NetExecOptions& options,
                     std::chrono::steady_clock::time_point give_up_at);

// Sleeps in poll(2) until a connection of `links` may make progress
// (transport wait_fds) or `until` passes, at most a second; false at once
// when a link's transport cannot say what to wait for (no
// WIA_TRANSPORT_CAP_WAIT_FD, or "do not wait now"). `fds` is scratch.
bool wait_for_links(const std::vector<NetLink>& links,
                    std::chrono::steady_clock::time_point until, std::vector<pollfd>& fds);

// One rank's program of a collective in progress: progress() can be
// called from one thread, then another (the posting thread starts it, a
// stream's worker finishes it when peers were late). Everything passed by
// reference must outlive it.
class NetExecution {
 public:
  NetExecution(const ExecPlan& plan, int rank, const RankBuffers& mine,
               const Descriptor& descriptor, std::vector<NetLink>& links, char* staging,
               ControlChannel& control, const NetExecOptions& options);
  ~NetExecution();
  NetExecution(const NetExecution&) = delete;
  NetExecution& operator=(const NetExecution&) = delete;

  // WIA_SUCCESS when the program finished; WIA_IN_PROGRESS when it gave
  // up waiting for peers at `give_up_at`; a negative status (the
  // collective failed, `error` says why) otherwise.
  wia_status_t progress(std::chrono::steady_clock::time_point give_up_at, std::string& error);

 private:
  class Executor;
  int rank_;
  std::unique_ptr<Executor> executor_;
};

// Runs `rank`'s program to the end. `staging` must hold staging_bytes(plan, rank).
// Returns WIA_SUCCESS, or a negative status with `error` naming the rank,
// the step, the peer and what went wrong. Requests still pending after a
// failure belong to connections the caller must close before reusing
// the buffers.
wia_status_t execute_rank_over_network(const ExecPlan& plan, int rank, const RankBuffers& mine,
                                       const Descriptor& descriptor, std::vector<NetLink>& links,
                                       char* staging, ControlChannel& control,
                                       const NetExecOptions& options, std::string& error);

std::uint64_t staging_bytes(const ExecPlan& plan, int rank);

}  // namespace wia::engine
