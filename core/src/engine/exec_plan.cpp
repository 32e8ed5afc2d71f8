// SPDX-License-Identifier: Apache-2.0
#include "engine/exec_plan.hpp"

#include <cstring>
#include <map>
#include <tuple>

#include <fmt/format.h>

#include "common/error.hpp"
#include "kernels/cpu_reduce.hpp"

namespace wia::engine {

std::shared_ptr<const ExecPlan> make_plan(coll::Schedule schedule, double estimated_ms) {
  auto plan = std::make_shared<ExecPlan>();
  const int p = schedule.nranks;
  plan->match.resize(p);
  // (src, dst, tag) -> index of the send on src; unique per the builders'
  // contract (schedule.hpp, "Message matching").
  std::map<std::tuple<int, int, std::uint32_t>, std::uint32_t> sends;
  for (int r = 0; r < p; ++r) {
    const auto& steps = schedule.programs[r].steps;
    for (std::uint32_t i = 0; i < steps.size(); ++i)
      if (steps[i].is_send()) sends[{r, steps[i].peer, steps[i].tag}] = i;
  }
  for (int r = 0; r < p; ++r) {
    const auto& steps = schedule.programs[r].steps;
    plan->match[r].assign(steps.size(), UINT32_MAX);
    for (std::uint32_t i = 0; i < steps.size(); ++i) {
      if (!steps[i].is_recv()) continue;
      auto it = sends.find({steps[i].peer, r, steps[i].tag});
      if (it == sends.end())
        throw Error(WIA_ERROR_INTERNAL,
                    fmt::format("schedule {}: rank {} step {} receives from rank {} tag {} but "
                                "no such send exists",
                                schedule.describe(), r, i, steps[i].peer, steps[i].tag));
      plan->match[r][i] = it->second;
    }
  }
  plan->schedule = std::move(schedule);
  plan->estimated_ms = estimated_ms;
  return plan;
}

std::string PlanCache::key(const coll::CollArgs& a, coll::Algorithm algorithm) {
  return fmt::format("{}/{}/{}/{}/{}/{}/{}/{}/{}/{}", static_cast<int>(a.collective),
                     static_cast<int>(algorithm), static_cast<int>(a.op),
                     static_cast<int>(a.dtype), a.count, a.nranks, a.root,
                     a.options.in_place ? 1 : 0, a.options.num_chunks, a.options.peer_offset);
}

std::shared_ptr<const ExecPlan> PlanCache::find(const coll::CollArgs& args,
                                                coll::Algorithm algorithm) {
  auto it = index_.find(key(args, algorithm));
  if (it == index_.end()) return nullptr;
  lru_.splice(lru_.begin(), lru_, it->second);
  return it->second->second;
}

void PlanCache::insert(const coll::CollArgs& args, coll::Algorithm algorithm,
                       std::shared_ptr<const ExecPlan> plan) {
  std::string k = key(args, algorithm);
  if (auto it = index_.find(k); it != index_.end()) lru_.erase(it->second);
  lru_.emplace_front(k, std::move(plan));
  index_[k] = lru_.begin();
  if (lru_.size() > kCapacity) {
    index_.erase(lru_.back().first);
    lru_.pop_back();
  }
}

void OpSync::init(const coll::Schedule& s) {
  published.resize(s.nranks);
  consumed.resize(s.nranks);
  for (int r = 0; r < s.nranks; ++r) {
    const std::size_t n = s.programs[r].steps.size();
    published[r].reset(new std::atomic<std::uint8_t>[n]());
    consumed[r].reset(new std::atomic<std::uint8_t>[n]());
  }
}

void OpSync::fail(int status, const std::string& message) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (failed_.load(std::memory_order_relaxed)) return;
    status_ = status;
    message_ = message;
    failed_.store(true, std::memory_order_release);
  }
  signal.notify();
}

int OpSync::status() const {
  std::lock_guard<std::mutex> lock(mu_);
  return status_;
}

std::string OpSync::message() const {
  std::lock_guard<std::mutex> lock(mu_);
  return message_;
}

namespace {

char* region_ptr(const RankBuffers& b, const coll::Region& r, std::size_t es) {
  char* base = nullptr;
  switch (r.kind) {
    case coll::BufferKind::kUserSend: base = b.send; break;
    case coll::BufferKind::kUserRecv: base = b.recv; break;
    case coll::BufferKind::kScratch: base = b.scratch; break;
    case coll::BufferKind::kSendShard: base = b.send_shards[r.shard]; break;
    case coll::BufferKind::kRecvShard: base = b.recv_shards[r.shard]; break;
    case coll::BufferKind::kNone: break;
  }
  return base + r.offset * es;
}

void reduce_into(const coll::Schedule& s, const coll::Step& step, void* dst, const void* a,
                 const void* b) {
  const coll::KernelOp k = coll::kernel_op(s.op, step);
  const void* srcs[2] = {a, b};
  wia_reduce_args_v1_t args{};
  args.struct_size = sizeof(args);
  args.dtype = s.dtype;
  args.op = k.op;
  args.nsrcs = 2;
  args.count = step.count;
  args.divisor = k.divisor;
  args.dst = dst;
  args.srcs = srcs;
  kernels::reduce(args);
}

}  // namespace

int execute_rank(const ExecPlan& plan, int rank, const std::vector<RankBuffers>& all,
                 OpSync& sync, std::chrono::steady_clock::time_point deadline,
                 bool oversubscribed) {
  const coll::Schedule& s = plan.schedule;
  const coll::RankProgram& prog = s.programs[rank];
  const std::size_t es = s.elem_size();
  const RankBuffers& mine = all[rank];
  auto* published = sync.published[rank].get();
  auto* consumed = sync.consumed[rank].get();

  auto wait_for = [&](std::atomic<std::uint8_t>& flag, const char* what, std::uint32_t step,
                      int peer) -> bool {
    const bool ok = sync.signal.wait_until(
        [&] { return flag.load(std::memory_order_acquire) != 0 || sync.failed(); }, deadline,
        oversubscribed);
    if (sync.failed()) return false;
    if (!ok) {
      sync.fail(WIA_ERROR_TIMEOUT,
                fmt::format("{}: rank {} timed out at step {} waiting for rank {} to {} "
                            "(rank {} has not reached this collective, or is stuck)",
                            s.describe(), rank, step, peer, what, peer));
      return false;
    }
    return true;
  };

  for (std::uint32_t i = 0; i < prog.steps.size(); ++i) {
    const coll::Step& step = prog.steps[i];
    // Dependencies on earlier local steps are met by running in list order,
    // except sends: a send is done only once the peer consumed its region.
    const std::uint32_t* deps = prog.deps_of(step);
    for (std::uint32_t d = 0; d < step.dep_count; ++d) {
      const coll::Step& dep = prog.steps[deps[d]];
      if (dep.is_send() && !wait_for(consumed[deps[d]], "consume a sent region", i, dep.peer))
        return sync.status();
    }
    switch (step.kind) {
      case coll::StepKind::kSend:
        published[i].store(1, std::memory_order_release);
        sync.signal.notify();
        break;
      case coll::StepKind::kRecv:
      case coll::StepKind::kRecvReduce: {
        const int peer = step.peer;
        const std::uint32_t j = plan.match[rank][i];
        if (!wait_for(sync.published[peer][j], "send", i, peer)) return sync.status();
        const coll::Step& send = s.programs[peer].steps[j];
        const char* remote = region_ptr(all[peer], send.src, es);
        char* dst = region_ptr(mine, step.dst, es);
        if (step.kind == coll::StepKind::kRecv)
          std::memcpy(dst, remote, step.count * es);
        else
          reduce_into(s, step, dst, region_ptr(mine, step.src, es), remote);
        sync.consumed[peer][j].store(1, std::memory_order_release);
        sync.signal.notify();
        break;
      }
      case coll::StepKind::kCopy:
        std::memmove(region_ptr(mine, step.dst, es), region_ptr(mine, step.src, es),
                     step.count * es);
        break;
      case coll::StepKind::kReduce: {
        char* dst = region_ptr(mine, step.dst, es);
        reduce_into(s, step, dst, dst, region_ptr(mine, step.src, es));
        break;
      }
    }
    if (sync.failed()) return sync.status();
  }
  // Finish only when peers have consumed everything this rank sent, so the
  // caller may reuse (or free) its buffers and our scratch afterwards.
  for (std::uint32_t i = 0; i < prog.steps.size(); ++i)
    if (prog.steps[i].is_send() &&
        !wait_for(consumed[i], "consume a sent region", i, prog.steps[i].peer))
      return sync.status();
  return 0;
}

}  // namespace wia::engine
