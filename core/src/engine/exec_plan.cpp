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
  for (int r = 0; r < p; ++r) plan->match[r].assign(schedule.programs[r].steps.size(), UINT32_MAX);
  for (int r = 0; r < p; ++r) {
    const auto& steps = schedule.programs[r].steps;
    for (std::uint32_t i = 0; i < steps.size(); ++i) {
      if (!steps[i].is_recv()) continue;
      auto it = sends.find({steps[i].peer, r, steps[i].tag});
      if (it == sends.end())
        throw Error(WIA_ERROR_INTERNAL,
                    fmt::format("schedule {}: rank {} step {} receives from rank {} tag {} but "
                                "no such send exists",
                                schedule.describe(), r, i, steps[i].peer, steps[i].tag));
      plan->match[r][i] = it->second;
      plan->match[steps[i].peer][it->second] = i;
    }
  }
  plan->schedule = std::move(schedule);
  plan->estimated_ms = estimated_ms;
  return plan;
}

std::string PlanCache::key(const coll::CollArgs& a, coll::Algorithm algorithm) {
  return fmt::format("{}/{}/{}/{}/{}/{}/{}/{}/{}/{}/{:x}", static_cast<int>(a.collective),
                     static_cast<int>(algorithm), static_cast<int>(a.op),
                     static_cast<int>(a.dtype), a.count, a.nranks, a.root,
                     a.options.in_place ? 1 : 0, a.options.num_chunks, a.options.peer_offset,
                     coll::rank_groups_fingerprint(a.options.groups));
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
  claim.resize(s.nranks);
  progress.reset(new std::atomic<std::uint32_t>[s.nranks]());
  for (int r = 0; r < s.nranks; ++r) {
    const std::size_t n = s.programs[r].steps.size();
    published[r].reset(new std::atomic<std::uint8_t>[n]());
    consumed[r].reset(new std::atomic<std::uint8_t>[n]());
    claim[r].reset(new std::atomic<std::uint8_t>[n]());
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

// A kernel refusal here is an engine bug (the schedule was validated), but
// it must surface as an error rather than a silently unreduced buffer.
void check_reduce(wia_status_t st, const coll::Schedule& s, std::uint64_t count) {
  if (st != WIA_SUCCESS)
    throw Error(WIA_ERROR_INTERNAL, fmt::format("{}: CPU reduction of {} elements failed: {}",
                                                s.describe(), count, status_name(st)));
}

void reduce_into(const coll::Schedule& s, const coll::Step& step, void* dst, const void* a,
                 const void* b) {
  const void* srcs[2] = {a, b};
  check_reduce(kernels::reduce(step_reduce_args(s, step, dst, srcs)), s, step.count);
}

}  // namespace

namespace {

// Steps i..last (inclusive) of `rank` form a chain the engine may fuse:
// recv-reduces of one count into one region, each after the first reading
// that region as its local operand, with every message already published
// and no other dependency still open. Returns i when there is no chain.
std::uint32_t fusable_chain_end(const ExecPlan& plan, int rank, std::uint32_t i,
                                const OpSync& sync) {
  const coll::RankProgram& prog = plan.schedule.programs[rank];
  const coll::Step& first = prog.steps[i];
  std::uint32_t last = i;
  for (std::uint32_t k = i + 1; k < prog.steps.size(); ++k) {
    const coll::Step& st = prog.steps[k];
    if (!extends_chain(first, prog.steps[last], st)) break;
    bool ready = sync.published[st.peer][plan.match[rank][k]].load(std::memory_order_acquire);
    const std::uint32_t* deps = prog.deps_of(st);
    for (std::uint32_t d = 0; ready && d < st.dep_count; ++d) {
      const std::uint32_t dep = deps[d];
      if (dep >= i) continue;  // inside the chain: satisfied by fusing
      if (prog.steps[dep].is_send() &&
          !sync.consumed[rank][dep].load(std::memory_order_acquire))
        ready = false;
    }
    if (!ready) break;
    last = k;
  }
  if (last > i &&
      !sync.published[first.peer][plan.match[rank][i]].load(std::memory_order_acquire))
    return i;
  return last;
}

void reduce_chain(const ExecPlan& plan, int rank, std::uint32_t i, std::uint32_t last,
                  const std::vector<RankBuffers>& all, OpSync& sync) {
  const coll::Schedule& s = plan.schedule;
  const coll::RankProgram& prog = s.programs[rank];
  const std::size_t es = s.elem_size();
  const coll::Step& first = prog.steps[i];
  std::vector<const void*> srcs;
  srcs.reserve(last - i + 2);
  srcs.push_back(region_ptr(all[rank], first.src, es));
  for (std::uint32_t k = i; k <= last; ++k) {
    const coll::Step& st = prog.steps[k];
    const coll::Step& send = s.programs[st.peer].steps[plan.match[rank][k]];
    srcs.push_back(region_ptr(all[st.peer], send.src, es));
  }
  check_reduce(kernels::reduce(chain_reduce_args(s, prog.steps[last],
                                                 region_ptr(all[rank], first.dst, es), srcs)),
               s, first.count);
  for (std::uint32_t k = i; k <= last; ++k) {
    const coll::Step& st = prog.steps[k];
    sync.consumed[st.peer][plan.match[rank][k]].store(1, std::memory_order_release);
  }
  sync.signal.notify();
}

// After publishing send `i` of `rank`: if the matching receive is a plain
// copy whose dependencies are met, copy into it now, while the data is in
// this core's cache (the receiver would re-read it from memory later).
void try_push(const ExecPlan& plan, int rank, std::uint32_t i,
              const std::vector<RankBuffers>& all, OpSync& sync) {
  const coll::Schedule& s = plan.schedule;
  const coll::Step& send = s.programs[rank].steps[i];
  const int peer = send.peer;
  const std::uint32_t j = plan.match[rank][i];
  const coll::RankProgram& their = s.programs[peer];
  const coll::Step& recv = their.steps[j];
  if (recv.kind != coll::StepKind::kRecv) return;
  const std::uint32_t done = sync.progress[peer].load(std::memory_order_acquire);
  const std::uint32_t* deps = their.deps_of(recv);
  for (std::uint32_t d = 0; d < recv.dep_count; ++d) {
    if (deps[d] >= done) return;
    if (their.steps[deps[d]].is_send() &&
        !sync.consumed[peer][deps[d]].load(std::memory_order_acquire))
      return;
  }
  std::uint8_t expected = kFree;
  if (!sync.claim[peer][j].compare_exchange_strong(expected, kPushing,
                                                   std::memory_order_acq_rel))
    return;
  const std::size_t es = s.elem_size();
  std::memcpy(region_ptr(all[peer], recv.dst, es), region_ptr(all[rank], send.src, es),
              send.count * es);
  sync.claim[peer][j].store(kPushed, std::memory_order_release);
  sync.consumed[rank][i].store(1, std::memory_order_release);
  sync.signal.notify();
}

// Where one rank's program stands.
struct Cursor {
  int rank = 0;
  std::uint32_t next = 0;       // next step to run
  bool draining = false;        // all steps ran; waiting for sends to be consumed
  std::uint32_t drain_next = 0; // next send to check while draining
  bool finished = false;
};

enum class Progress { kBlocked, kAdvanced, kFinished };

// Runs as many steps of `c` as can run without waiting. On kBlocked,
// `why` says what it waits for (for the timeout message).
Progress advance(const ExecPlan& plan, Cursor& c, const std::vector<RankBuffers>& all,
                 OpSync& sync, std::string* why) {
  const coll::Schedule& s = plan.schedule;
  const coll::RankProgram& prog = s.programs[c.rank];
  const std::size_t es = s.elem_size();
  const RankBuffers& mine = all[c.rank];
  auto* published = sync.published[c.rank].get();
  auto* consumed = sync.consumed[c.rank].get();
  bool moved = false;
  while (c.next < prog.steps.size()) {
    const std::uint32_t i = c.next;
    const coll::Step& step = prog.steps[i];
    // Local dependencies are met by running in list order, except sends:
    // a send is done only once the peer consumed its region.
    const std::uint32_t* deps = prog.deps_of(step);
    for (std::uint32_t d = 0; d < step.dep_count; ++d) {
      const coll::Step& dep = prog.steps[deps[d]];
      if (dep.is_send() && !consumed[deps[d]].load(std::memory_order_acquire)) {
        *why = fmt::format("rank {} step {} waits for rank {} to consume step {}", c.rank, i,
                           dep.peer, deps[d]);
        return moved ? Progress::kAdvanced : Progress::kBlocked;
      }
    }
    switch (step.kind) {
      case coll::StepKind::kSend:
        published[i].store(1, std::memory_order_release);
        sync.signal.notify();
        try_push(plan, c.rank, i, all, sync);
        break;
      case coll::StepKind::kRecv:
      case coll::StepKind::kRecvReduce: {
        const int peer = step.peer;
        const std::uint32_t j = plan.match[c.rank][i];
        if (!sync.published[peer][j].load(std::memory_order_acquire)) {
          *why = fmt::format("rank {} step {} waits for a message from rank {}", c.rank, i, peer);
          return moved ? Progress::kAdvanced : Progress::kBlocked;
        }
        if (step.kind == coll::StepKind::kRecv) {
          // The sender may have pushed it (or be pushing it right now).
          std::uint8_t expected = kFree;
          if (!sync.claim[c.rank][i].compare_exchange_strong(expected, kPulling,
                                                             std::memory_order_acq_rel)) {
            if (expected != kPushed) {
              *why = fmt::format("rank {} step {} waits for rank {} to finish pushing", c.rank,
                                 i, peer);
              return moved ? Progress::kAdvanced : Progress::kBlocked;
            }
            break;  // pushed: nothing left to do
          }
        }
        const coll::Step& send = s.programs[peer].steps[j];
        const char* remote = region_ptr(all[peer], send.src, es);
        char* dst = region_ptr(mine, step.dst, es);
        if (step.kind == coll::StepKind::kRecv) {
          std::memcpy(dst, remote, step.count * es);
        } else {
          // A chain of recv-reduces into one region whose messages have all
          // arrived becomes one n-ary reduction: each source is read once and
          // the destination written once, instead of once per message.
          const std::uint32_t last = fusable_chain_end(plan, c.rank, i, sync);
          if (last > i) {
            reduce_chain(plan, c.rank, i, last, all, sync);
            c.next = last;  // the loop's ++c.next moves past the chain
            moved = true;
            break;
          }
          reduce_into(s, step, dst, region_ptr(mine, step.src, es), remote);
        }
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
    ++c.next;
    sync.progress[c.rank].store(c.next, std::memory_order_release);
    moved = true;
  }
  // Finish only when peers have consumed everything this rank sent, so
  // the caller may reuse its buffers (and we our scratch) afterwards.
  for (; c.drain_next < prog.steps.size(); ++c.drain_next) {
    const coll::Step& step = prog.steps[c.drain_next];
    if (step.is_send() && !consumed[c.drain_next].load(std::memory_order_acquire)) {
      *why = fmt::format("rank {} waits for rank {} to consume its step {}", c.rank, step.peer,
                         c.drain_next);
      return moved ? Progress::kAdvanced : Progress::kBlocked;
    }
  }
  c.finished = true;
  return Progress::kFinished;
}

}  // namespace

int execute_ranks(const ExecPlan& plan, const std::vector<int>& ranks,
                  const std::vector<RankBuffers>& all, OpSync& sync,
                  std::atomic<std::uint8_t>* done,
                  std::chrono::steady_clock::time_point deadline, bool oversubscribed) {
  std::vector<Cursor> cursors(ranks.size());
  for (std::size_t k = 0; k < ranks.size(); ++k) cursors[k].rank = ranks[k];
  std::size_t left = ranks.size();
  std::string why;
  while (left > 0) {
    // Read before the pass: a publish during the pass must end the wait.
    const std::uint32_t seen = sync.signal.epoch();
    bool moved = false;
    for (Cursor& c : cursors) {
      if (c.finished) continue;
      const Progress p = advance(plan, c, all, sync, &why);
      if (p == Progress::kFinished) {
        done[c.rank].store(1, std::memory_order_release);
        sync.signal.notify();
        --left;
      }
      moved |= p != Progress::kBlocked;
      if (sync.failed()) return sync.status();
    }
    if (moved || left == 0) continue;
    // Nothing owned can move: wait until a peer publishes or consumes.
    const bool woke = sync.signal.wait_until(
        [&] { return sync.signal.epoch() != seen || sync.failed(); }, deadline, oversubscribed);
    if (sync.failed()) return sync.status();
    if (!woke) {
      sync.fail(WIA_ERROR_TIMEOUT,
                fmt::format("{}: timed out: {} (that rank has not reached this collective, "
                            "or is stuck)",
                            plan.schedule.describe(), why));
      return sync.status();
    }
  }
  return 0;
}

}  // namespace wia::engine
