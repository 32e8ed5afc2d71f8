// SPDX-License-Identifier: Apache-2.0
// Executing a schedule's rank program on host-addressable memory.
//
// In one process every rank can address every other rank's memory, so a
// matched send/recv pair is a single copy the receiver performs straight
// from the sender's region (a direct peer copy, no staging), and a
// recv-reduce reads the peer's region and the local operand in one pass.
// A send therefore only *publishes* that its region is ready; the receiver
// marks it *consumed* when done, and the sender waits for that before it
// overwrites the region or finishes. Each rank runs its own program on its
// own stream's thread, so ranks proceed in parallel.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include <wia/provider.h>

#include "coll/schedule.hpp"
#include "engine/progress_signal.hpp"

namespace wia::engine {

// Addresses of one rank's buffers for one operation.
struct RankBuffers {
  char* send = nullptr;
  char* recv = nullptr;
  char* scratch = nullptr;
  std::vector<char*> send_shards;  // all-to-all
  std::vector<char*> recv_shards;
};

// Address of a schedule region in one rank's buffers.
inline char* region_ptr(const RankBuffers& b, const coll::Region& r, std::size_t elem_size) {
  char* base = nullptr;
  switch (r.kind) {
    case coll::BufferKind::kUserSend: base = b.send; break;
    case coll::BufferKind::kUserRecv: base = b.recv; break;
    case coll::BufferKind::kScratch: base = b.scratch; break;
    case coll::BufferKind::kSendShard: base = b.send_shards[r.shard]; break;
    case coll::BufferKind::kRecvShard: base = b.recv_shards[r.shard]; break;
    case coll::BufferKind::kNone: break;
  }
  return base + r.offset * elem_size;
}

// The arguments of a two-operand reducing step, dst = a op b, with the
// schedule's (op, divisor) for that step; `srcs` must outlive the use.
inline wia_reduce_args_v1_t step_reduce_args(const coll::Schedule& s, const coll::Step& step,
                                             void* dst, const void* (&srcs)[2]) {
  const coll::KernelOp k = coll::kernel_op(s.op, step);
  wia_reduce_args_v1_t args{};
  args.struct_size = sizeof(args);
  args.dtype = s.dtype;
  args.op = k.op;
  args.nsrcs = 2;
  args.count = step.count;
  args.divisor = k.divisor;
  args.dst = dst;
  args.srcs = srcs;
  return args;
}

// The arguments of a fused chain ending at step `last`: dst = srcs[0] op
// srcs[1] op ..., folded in order (the same bits as the chain's
// two-operand steps), with the last step's (op, divisor). Chains are
// found by coll::extends_chain.
inline wia_reduce_args_v1_t chain_reduce_args(const coll::Schedule& s, const coll::Step& last,
                                              void* dst, const std::vector<const void*>& srcs) {
  const coll::KernelOp k = coll::kernel_op(s.op, last);
  wia_reduce_args_v1_t args{};
  args.struct_size = sizeof(args);
  args.dtype = s.dtype;
  args.op = k.op;
  args.nsrcs = static_cast<std::uint32_t>(srcs.size());
  args.count = last.count;
  args.divisor = k.divisor;
  args.dst = dst;
  args.srcs = srcs.data();
  return args;
}

// A schedule plus what execution needs precomputed: for every receive
// step, the index of the matching send step on the peer.
struct ExecPlan {
  coll::Schedule schedule;
  // [rank][step] -> the matching step on the peer: for a receive its send,
  // for a send its receive.
  std::vector<std::vector<std::uint32_t>> match;
  double estimated_ms = 0;
};

// Builds the match table; throws wia::Error(INTERNAL) for an unmatched
// message (a builder bug).
std::shared_ptr<const ExecPlan> make_plan(coll::Schedule schedule, double estimated_ms);

// Small LRU cache of plans keyed by the arguments that shape a schedule.
class PlanCache {
 public:
  std::shared_ptr<const ExecPlan> find(const coll::CollArgs& args, coll::Algorithm algorithm);
  void insert(const coll::CollArgs& args, coll::Algorithm algorithm,
              std::shared_ptr<const ExecPlan> plan);

 private:
  static std::string key(const coll::CollArgs& args, coll::Algorithm algorithm);
  static constexpr std::size_t kCapacity = 64;
  std::list<std::pair<std::string, std::shared_ptr<const ExecPlan>>> lru_;
  std::unordered_map<std::string, decltype(lru_)::iterator> index_;
};

enum RecvClaim : std::uint8_t { kFree = 0, kPulling = 1, kPushing = 2, kPushed = 3 };

// Shared progress state of one operation across its ranks.
struct OpSync {
  void init(const coll::Schedule& s);
  // First failure wins; wakes every waiter so no rank waits for the timeout.
  void fail(int status, const std::string& message);
  bool failed() const { return failed_.load(std::memory_order_acquire); }
  int status() const;
  std::string message() const;

  std::vector<std::unique_ptr<std::atomic<std::uint8_t>[]>> published;  // [rank][step]
  std::vector<std::unique_ptr<std::atomic<std::uint8_t>[]>> consumed;   // [rank][step]
  // Who copies a plain receive: kFree, then the receiver (kPulling) or the
  // sender pushing it while the data is hot in its cache (kPushing, then
  // kPushed). [rank][step] of the receive.
  std::vector<std::unique_ptr<std::atomic<std::uint8_t>[]>> claim;
  // Steps of each rank that have run (the cursor), for pushers checking
  // that a receive's dependencies are met.
  std::unique_ptr<std::atomic<std::uint32_t>[]> progress;
  ProgressSignal signal;

 private:
  std::atomic<bool> failed_{false};
  mutable std::mutex mu_;
  int status_ = 0;
  std::string message_;
};

// Executes the programs of `ranks` (a subset of the schedule's ranks),
// interleaving them without blocking: a rank waiting for a message or for
// a peer to consume its send yields to the next owned rank. This lets a
// few threads drive many ranks, which matters when ranks outnumber cores.
// `all` holds every rank's buffers; `done[r]` is set (release) when rank
// r's program has finished and everything it sent was consumed. Returns 0,
// or a negative status after calling sync.fail() with a message naming the
// rank, the step and the peer it waited for.
int execute_ranks(const ExecPlan& plan, const std::vector<int>& ranks,
                  const std::vector<RankBuffers>& all, OpSync& sync,
                  std::atomic<std::uint8_t>* done,
                  std::chrono::steady_clock::time_point deadline, bool oversubscribed);

}  // namespace wia::engine
