// SPDX-License-Identifier: Apache-2.0
// Simulated-network executor: runs a whole Schedule, every rank, in one
// thread over in-memory buffers and per-(src, dst, tag) FIFO message
// queues, reducing with the real CPU kernels. It is the test oracle for
// every builder and a debugging aid for new ones, so it is strict:
//
//  - static checks first (validate_schedule): peers, dependency indices,
//    regions inside the declared buffer sizes (overruns), forbidden
//    aliasing, every send matched by a receive of the same size and vice
//    versa (n-th send a->b with tag t matches the n-th receive on b from a
//    with tag t, in list order), optionally intra-rank races (two steps
//    touching overlapping elements, one writing, with no dependency path
//    between them);
//  - then execution in an order that only respects dependencies and
//    message arrival: FIFO across ranks by default, or a seeded random pick
//    among ready steps, which exposes missing dependencies;
//  - sends are either eager (data copied at send time, send completes
//    immediately) or rendezvous (the send completes only when its receive
//    runs, and the data is read from the sender's buffer at that moment):
//    rendezvous proves the schedule needs no transport buffering and
//    catches a buffer overwritten while a send is in flight;
//  - a state where no step can run while some remain is a deadlock,
//    reported with the blocked steps and what each waits for.
//
// Errors are returned as values (SimResult), never thrown.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "coll/schedule.hpp"

namespace wia::coll {

enum class SimError : std::uint8_t {
  kNone = 0,
  kInvalidSchedule,  // bad peer, dependency, step kind, unbuilt rank, aliasing
  kOutOfBounds,      // a region outside its buffer's declared size
  kUnmatched,        // a send without receive or the reverse, or sizes differ
  kRace,             // unordered conflicting accesses on one rank
  kDeadlock,         // nothing can progress, steps remain
  kReduceFailed,     // the reduction kernel refused the arguments
};
const char* sim_error_name(SimError e) noexcept;

struct SimOptions {
  bool rendezvous = false;
  std::uint64_t seed = 0;    // 0: deterministic FIFO order; else random ready-step order
  bool check_races = false;  // O(steps^2) per rank: for tests of small schedules
};

struct SimResult {
  wia_status_t status = WIA_SUCCESS;  // WIA_ERROR_INTERNAL on any schedule error
  SimError error = SimError::kNone;
  std::string message;
  std::uint64_t steps_executed = 0;
  std::uint64_t messages = 0;
  std::uint64_t bytes_moved = 0;  // payload bytes of all messages

  bool ok() const { return error == SimError::kNone; }
};

// Host memory for every declared buffer of every rank of a schedule.
class SimMemory {
 public:
  explicit SimMemory(const Schedule& schedule);

  // The bytes of one buffer (empty when its declared size is 0).
  std::span<std::byte> buffer(std::int32_t rank, BufferKind kind, std::uint32_t shard = 0);
  std::int32_t nranks() const { return static_cast<std::int32_t>(ranks_.size()); }
  std::size_t elem_size() const { return elem_size_; }

 private:
  struct RankMemory {
    std::vector<std::byte> send, recv, scratch;
    std::vector<std::vector<std::byte>> send_shards, recv_shards;
  };
  std::size_t elem_size_;
  std::vector<RankMemory> ranks_;
};

// Static checks only (no data moves).
SimResult validate_schedule(const Schedule& schedule, bool check_races = false);

// Validates, then executes. `memory` must come from the same schedule.
SimResult simulate(const Schedule& schedule, SimMemory& memory, const SimOptions& options = {});

// "rank 3 step 12 recv_reduce peer=2 tag=5 count=10 src=recv+0 dst=recv+0"
std::string describe_step(const Schedule& schedule, std::int32_t rank, std::uint32_t index);

}  // namespace wia::coll
