// SPDX-License-Identifier: Apache-2.0
#include "engine/exec_plan.hpp"

#include <algorithm>
#include <cstdlib>
#include <cstddef>
#include <cstring>
#include <map>
#include <tuple>

#include <fmt/format.h>

#include "common/cpus.hpp"
#include "common/error.hpp"
#include "kernels/cpu_copy.hpp"
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
    if (!coll::extends_chain(first, prog.steps[last], st)) break;
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

// Whether the plain receive `j` of `peer` may be written now by the rank
// reducing steps [first, last]: its dependencies ran and every send among
// them was consumed, except sends of `peer` that this very reduction reads
// (an in-place receive overwrites the very input it sent for the
// reduction; the fused kernel reads each element before writing it).
bool receive_ready(const ExecPlan& plan, int rank, std::uint32_t first, std::uint32_t last,
                   int peer, std::uint32_t j, const OpSync& sync) {
  const coll::RankProgram& their = plan.schedule.programs[peer];
  const coll::Step& recv = their.steps[j];
  if (recv.kind != coll::StepKind::kRecv) return false;
  const std::uint32_t done = sync.progress[peer].load(std::memory_order_acquire);
  const std::uint32_t* deps = their.deps_of(recv);
  for (std::uint32_t d = 0; d < recv.dep_count; ++d) {
    if (deps[d] >= done) return false;
    const coll::Step& dep = their.steps[deps[d]];
    if (!dep.is_send() || sync.consumed[peer][deps[d]].load(std::memory_order_acquire)) continue;
    // Read by this reduction, and exactly the region the receive writes:
    // element k is then read before it is overwritten, slice by slice.
    const std::uint32_t reader = plan.match[peer][deps[d]];
    if (dep.peer != rank || reader < first || reader > last || dep.count != recv.count ||
        !coll::same_region(dep.src, recv.dst))
      return false;
  }
  return true;
}

// Bytes reduced per slice of a fused reduce-and-push: small enough that
// the slice is still in L1 when it is copied to the peers' receives.
constexpr std::size_t kFusedSliceBytes = 16 << 10;

// Results up to half this core's L2 are pushed after the reduction
// (try_push), still in L2: fusing them gained nothing measurable (4 ranks,
// 2 and 4 MiB, within the runs' 10-15 % noise) and at 16 MiB (1 MiB
// chunks) was 6-28 % slower in three interleaved rounds. Larger results
// would be read back from L3 or memory by every push, so they are fused
// (64 MiB 0.73 - 0.87, 256 MiB 0.82 - 0.89 of the time, 2026-12-05).
// WIA_TEST_FUSE_MIN_BYTES (tests only) moves the threshold so small
// vectors take the fused path.
std::uint64_t fuse_min_bytes() {
  static const std::uint64_t bytes = [] {
    if (const char* forced = std::getenv("WIA_TEST_FUSE_MIN_BYTES"); forced && *forced)
      return static_cast<std::uint64_t>(std::strtoull(forced, nullptr, 10));
    const std::uint64_t l2 = cpu_cache_bytes(2);
    return (l2 > 0 ? l2 : std::uint64_t{1} << 20) / 2;
  }();
  return bytes;
}

// Whether an all-reduce's outputs are written around the caches: when its
// buffers (every rank's input and output) outgrow half the last-level
// cache they are not read from cache again anyway, and a streaming store
// skips the read for ownership a plain store of a missing line pays.
// WIA_TEST_STREAM_MIN_BYTES (tests, measurements) moves the threshold.
bool stream_outputs(const coll::Schedule& s) {
  static const std::uint64_t min_footprint = [] {
    if (const char* forced = std::getenv("WIA_TEST_STREAM_MIN_BYTES"); forced && *forced)
      return static_cast<std::uint64_t>(std::strtoull(forced, nullptr, 10));
    const std::uint64_t llc = last_level_cache_bytes();
    return (llc > 0 ? llc : std::uint64_t{32} << 20) / 2;
  }();
  return s.count * s.elem_size() * 2 * static_cast<std::uint64_t>(s.nranks) > min_footprint;
}

// Runs the receive-reduces i..last of `rank` (a fused chain, or one step)
// as one n-ary reduction, and writes its result straight into the peers'
// receives of the sends that follow it and re-send the reduced region,
// where those receives may be written now. Each slice of the result is
// reduced and then copied while in L1, instead of being written, evicted
// and read again by every push (an all-reduce's all-gather half then costs
// no second read of the reduced data). Sends whose receives are not ready
// are left to try_push or to the receiver, as before.
void reduce_and_push(const ExecPlan& plan, int rank, std::uint32_t i, std::uint32_t last,
                     const std::vector<RankBuffers>& all, OpSync& sync) {
  const coll::Schedule& s = plan.schedule;
  const coll::RankProgram& prog = s.programs[rank];
  const std::size_t es = s.elem_size();
  const coll::Step& first = prog.steps[i];
  const bool fuse = first.count * es > fuse_min_bytes();
  if (!fuse && i == last) {
    // One small receive-reduce (an 8-byte all-reduce's): the two-operand
    // kernel, with nothing allocated.
    const coll::Step& send = s.programs[first.peer].steps[plan.match[rank][i]];
    reduce_into(s, first, region_ptr(all[rank], first.dst, es),
                region_ptr(all[rank], first.src, es), region_ptr(all[first.peer], send.src, es));
    sync.consumed[first.peer][plan.match[rank][i]].store(1, std::memory_order_release);
    sync.signal.notify();
    return;
  }
  std::vector<const void*> srcs;
  srcs.reserve(last - i + 2);
  srcs.push_back(region_ptr(all[rank], first.src, es));
  for (std::uint32_t k = i; k <= last; ++k) {
    const coll::Step& st = prog.steps[k];
    const coll::Step& send = s.programs[st.peer].steps[plan.match[rank][k]];
    srcs.push_back(region_ptr(all[st.peer], send.src, es));
  }
  // The sends right after the reduction that carry its result.
  struct Push {
    std::uint32_t send;  // step of `rank`
    char* dst;
  };
  std::vector<Push> pushes;
  for (std::uint32_t k = last + 1; fuse && k < prog.steps.size(); ++k) {
    const coll::Step& st = prog.steps[k];
    if (st.kind != coll::StepKind::kSend || st.count != first.count ||
        !coll::same_region(st.src, first.dst))
      break;
    const std::uint32_t j = plan.match[rank][k];
    if (!receive_ready(plan, rank, i, last, st.peer, j, sync)) continue;
    std::uint8_t expected = kFree;
    if (!sync.claim[st.peer][j].compare_exchange_strong(expected, kPushing,
                                                        std::memory_order_acq_rel))
      continue;
    pushes.push_back({k, region_ptr(all[st.peer], s.programs[st.peer].steps[j].dst, es)});
  }
  char* dst = region_ptr(all[rank], first.dst, es);
  const wia_reduce_args_v1_t whole = chain_reduce_args(s, prog.steps[last], dst, srcs);
  if (pushes.empty()) {
    check_reduce(kernels::reduce(whole), s, first.count);
  } else {
    const std::uint64_t slice = std::max<std::uint64_t>(1, kFusedSliceBytes / es);
    // Streaming: each slice is reduced into this thread's L1 buffer and
    // streamed from there to this rank's output and the peers' receives.
    const bool streaming = stream_outputs(s);
    thread_local std::vector<std::max_align_t> l1_slice;
    if (streaming) l1_slice.resize(kFusedSliceBytes / sizeof(std::max_align_t) + 1);
    std::vector<const void*> at(srcs.size());
    for (std::uint64_t off = 0; off < first.count; off += slice) {
      const std::uint64_t n = std::min(slice, first.count - off);
      for (std::size_t k = 0; k < srcs.size(); ++k)
        at[k] = static_cast<const char*>(srcs[k]) + off * es;
      wia_reduce_args_v1_t part = whole;
      part.count = n;
      part.dst = streaming ? static_cast<void*>(l1_slice.data()) : dst + off * es;
      part.srcs = at.data();
      check_reduce(kernels::reduce(part), s, n);
      const char* result = static_cast<const char*>(part.dst);
      if (streaming) kernels::copy_streaming(dst + off * es, result, n * es);
      for (const Push& push : pushes) {
        if (streaming)
          kernels::copy_streaming(push.dst + off * es, result, n * es);
        else
          std::memcpy(push.dst + off * es, result, n * es);
      }
    }
    // The streaming stores are weakly ordered: visible before the flags.
    if (streaming) kernels::streaming_fence();
  }
  for (std::uint32_t k = i; k <= last; ++k) {
    const coll::Step& st = prog.steps[k];
    sync.consumed[st.peer][plan.match[rank][k]].store(1, std::memory_order_release);
  }
  // The sends themselves are published when this rank's program reaches
  // them; their receivers then find the data pushed.
  for (const Push& push : pushes) {
    const coll::Step& st = prog.steps[push.send];
    sync.claim[st.peer][plan.match[rank][push.send]].store(kPushed, std::memory_order_release);
    sync.consumed[rank][push.send].store(1, std::memory_order_release);
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
  const coll::Step& recv = s.programs[peer].steps[j];
  // No reduction of this rank reads any of the peer's sends now: every
  // dependency must be met (an empty [first, last] range).
  if (!receive_ready(plan, rank, 1, 0, peer, j, sync)) return;
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
          // Its result goes straight to the receives of the sends after it.
          const std::uint32_t last = fusable_chain_end(plan, c.rank, i, sync);
          reduce_and_push(plan, c.rank, i, last, all, sync);
          c.next = last;  // the loop's ++c.next moves past the chain
          moved = true;
          break;
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
