// SPDX-License-Identifier: Apache-2.0
#include "engine/net_exec.hpp"

#include <algorithm>
#include <cstring>
#include <set>

#include <fmt/format.h>

#include "common/error.hpp"
#include "engine/backoff.hpp"
#include "engine/link_call.hpp"
#include "kernels/cpu_reduce.hpp"

namespace wia::engine {

std::string describe_difference(const Descriptor& a, const Descriptor& b) {
  std::string diff;
  auto add = [&](const char* field, auto x, auto y) {
    if (x != y) diff += fmt::format("{}{} {} vs {}", diff.empty() ? "" : ", ", field, x, y);
  };
  if (a.magic != b.magic) return "a corrupt descriptor";
  add("sequence number", a.seq, b.seq);
  add("collective", coll::collective_name(static_cast<coll::Collective>(a.collective)),
      coll::collective_name(static_cast<coll::Collective>(b.collective)));
  add("count", a.count, b.count);
  add("datatype", kernels::dtype_name(static_cast<wia_datatype_t>(a.dtype)),
      kernels::dtype_name(static_cast<wia_datatype_t>(b.dtype)));
  add("op", kernels::reduce_op_name(static_cast<wia_reduce_op_t>(a.op)),
      kernels::reduce_op_name(static_cast<wia_reduce_op_t>(b.op)));
  add("root", a.root, b.root);
  add("algorithm", coll::algorithm_name(static_cast<coll::Algorithm>(a.algorithm)),
      coll::algorithm_name(static_cast<coll::Algorithm>(b.algorithm)));
  add("chunks", a.num_chunks, b.num_chunks);
  return diff;
}

void reduce_in_order(const Descriptor& desc, wia_reduce_op_t op, void* dst,
                     const std::vector<const void*>& srcs, std::uint64_t count, int rank,
                     const char* what) {
  wia_reduce_args_v1_t a{};
  a.struct_size = sizeof(a);
  a.dtype = static_cast<wia_datatype_t>(desc.dtype);
  a.op = op;  // AVG with divisor 0 divides by nsrcs
  a.nsrcs = static_cast<std::uint32_t>(srcs.size());
  a.count = count;
  a.dst = dst;
  a.srcs = srcs.data();
  const wia_status_t rc = kernels::reduce_unchecked(a);
  if (rc != WIA_SUCCESS)
    throw Error(WIA_ERROR_INTERNAL,
                fmt::format("rank {}: {} #{}: CPU reduction of {} elements failed: {}", rank, what,
                            desc.seq, count, status_name(rc)));
}

IdleRound idle_round(Backoff& backoff, ControlPace& pace, ControlChannel& control,
                     const NetExecOptions& options,
                     std::chrono::steady_clock::time_point give_up_at) {
  if ((++pace.rounds & 63) == 0 || pace.due) {
    pace.due = false;
    const std::string reason = control.poll();
    if (!reason.empty()) throw Error(WIA_ERROR_REMOTE, reason);
  }
  backoff.wait();
  if (!backoff.read_clock()) return IdleRound::kAgain;
  // The first reading starts the period (a short wait polls no sooner than
  // before); each kControlEvery after it makes the next round poll.
  if (pace.last == std::chrono::steady_clock::time_point{}) {
    pace.last = backoff.now();
  } else if (backoff.now() - pace.last >= kControlEvery) {
    pace.due = true;
    pace.last = backoff.now();
  }
  if (backoff.now() > options.deadline) return IdleRound::kTimedOut;
  return backoff.now() > give_up_at ? IdleRound::kGiveUp : IdleRound::kAgain;
}

bool wait_for_links(const std::vector<NetLink>& links,
                    std::chrono::steady_clock::time_point until, std::vector<pollfd>& fds) {
  fds.clear();
  for (const NetLink& l : links) {
    if (l.provider == nullptr) continue;  // the rank itself
    if ((l.provider->transport()->caps & WIA_TRANSPORT_CAP_WAIT_FD) == 0) return false;
    const std::size_t at = fds.size();
    fds.resize(at + WIA_TRANSPORT_WAIT_FDS_MAX);
    std::uint32_t count = 0;
    const wia_status_t st = link_call(l, "wait_fds", [&](const wia_transport_ops_v1_t& t, void* ctx) {
      return t.wait_fds(ctx, l.conn, fds.data() + at, WIA_TRANSPORT_WAIT_FDS_MAX, &count);
    });
    if (st != WIA_SUCCESS) return false;  // "do not wait now"
    fds.resize(at + std::min<std::uint32_t>(count, WIA_TRANSPORT_WAIT_FDS_MAX));
  }
  const auto left = std::chrono::ceil<std::chrono::milliseconds>(
      until - std::chrono::steady_clock::now());
  if (fds.empty() || left.count() <= 0) return false;
  // EINTR or an error is a wake-up like any other: the caller tests again.
  (void)::poll(fds.data(), fds.size(), static_cast<int>(std::min<std::int64_t>(left.count(), 1000)));
  return true;
}

std::uint64_t staging_bytes(const ExecPlan& plan, int rank) {
  std::uint64_t n = 0;
  for (const coll::Step& st : plan.schedule.programs[rank].steps)
    if (st.kind == coll::StepKind::kRecvReduce) n += st.count;
  return n * plan.schedule.elem_size();
}

class NetExecution::Executor {
 public:
  Executor(const ExecPlan& plan, int rank, const RankBuffers& mine, const Descriptor& descriptor,
           std::vector<NetLink>& links, char* staging, ControlChannel& control,
           const NetExecOptions& options)
      : plan_(plan),
        s_(plan.schedule),
        prog_(plan.schedule.programs[rank]),
        rank_(rank),
        mine_(mine),
        es_(plan.schedule.elem_size()),
        mine_desc_(descriptor),
        links_(links),
        control_(control),
        options_(options) {
    const std::size_t n = prog_.steps.size();
    st_.assign(n, StepState{});
    for (std::size_t k = 0; k < n; ++k)
      if (prog_.steps[k].kind == coll::StepKind::kRecvReduce) {
        st_[k].slot = staging;
        staging += prog_.steps[k].count * es_;
      }
  }

  // Runs until the program is finished (true) or, while waiting for
  // peers, `give_up_at` has passed (false: call again to go on).
  bool progress(std::chrono::steady_clock::time_point give_up_at) {
    try {
      return run_steps(give_up_at);
    } catch (const Error& e) {
      // A lost connection is often a peer that failed first and told us
      // why before closing: its reason is the better message.
      if (e.status() != WIA_ERROR_TIMEOUT) {
        if (const std::string reason = control_.poll(); !reason.empty())
          throw Error(WIA_ERROR_REMOTE, reason);
      }
      // A size mismatch or a lost message is often the symptom of calls
      // that differ: report the descriptor's difference when it shows one.
      if (e.status() == WIA_ERROR_TIMEOUT || !desc_recv_) throw;
      const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(100);
      try {
        while (desc_recv_ && std::chrono::steady_clock::now() < until) advance_descriptor();
      } catch (const Error& mismatch) {
        if (mismatch.status() == WIA_ERROR_MISMATCH) throw;
      }
      throw;
    }
  }

 private:
  bool run_steps(std::chrono::steady_clock::time_point give_up_at) {
    if (!started_) {
      started_ = true;
      const int p = s_.nranks;
      // A peer may have failed (or died) since the last collective.
      if (const std::string reason = control_.poll(); !reason.empty())
        throw Error(WIA_ERROR_REMOTE, reason);
      if (p > 1) {
        next_ = (rank_ + 1) % p;
        prev_ = (rank_ + p - 1) % p;
        post_descriptor();
      }
      for (std::uint32_t k = 0; k < prog_.steps.size(); ++k)
        if (prog_.steps[k].kind == coll::StepKind::kRecvReduce) post(k);
    }
    Backoff backoff(options_.oversubscribed);
    std::uint32_t iteration = 0, idle = 0;
    bool slept = false;
    auto last_control = std::chrono::steady_clock::now();
    while (first_ < prog_.steps.size() || desc_send_ || desc_recv_) {
      bool progressed = false;
      for (std::uint32_t k = first_; k < prog_.steps.size(); ++k)
        if (!st_[k].done) progressed |= advance(k);
      while (first_ < prog_.steps.size() && st_[first_].done) ++first_;
      progressed |= advance_descriptor();
      // The control channel (failures, "where are you?", and this rank's
      // heartbeats) every 32 rounds: polling it costs a test per peer,
      // which on every idle round delayed noticing the message being
      // waited for. Also whenever kControlEvery passed on a round that
      // made progress: such a round may copy or reduce a large chunk, and
      // on a loaded machine 32 of them outlasted heartbeat_timeout_ms, so
      // the neighbours declared a busy rank dead. And after a sleep in
      // poll(2): 32 sleeps of a rank waiting for a late peer are seconds.
      bool control_due = (++iteration & 31) == 0;
      if ((progressed || slept) && !control_due)
        control_due = std::chrono::steady_clock::now() - last_control >= kControlEvery;
      slept = false;
      if (control_due) {
        last_control = std::chrono::steady_clock::now();
        const std::string reason = control_.poll();
        if (!reason.empty()) throw Error(WIA_ERROR_REMOTE, reason);
      }
      if (progressed) {
        backoff.reset();
        idle = 0;
        continue;
      }
      // With more ranks than cores, a rank that polls its sockets holds a
      // core its peers need to move the data it waits for: after a few
      // yields (a message about to land is still caught at once), sleep
      // in poll(2) until a connection is ready. 4 processes over loopback
      // tcp on 2 cores: 64% fewer recv calls, 83% fewer yields, 40% fewer
      // context switches per 64 MiB all-reduce (docs/performance.md).
      if (options_.oversubscribed && ++idle > kYieldsBeforeSleeping) {
        const auto now = std::chrono::steady_clock::now();
        if (now > options_.deadline) throw_timeout();
        if (now > give_up_at) return false;
        // Woken at least every kControlEvery, so that this rank's
        // heartbeats leave and its neighbours are watched while it waits
        // (a late peer kept it in poll(2) past heartbeat_timeout_ms).
        if (wait_for_links(links_, std::min({give_up_at, options_.deadline, now + kControlEvery}),
                           pollfds_)) {
          slept = true;
          continue;
        }
      }
      backoff.wait();
      if (backoff.read_clock()) {
        const auto now = backoff.now();
        if (now > options_.deadline) throw_timeout();
        if (now > give_up_at) return false;
      }
    }
    return true;
  }

  static constexpr std::uint32_t kYieldsBeforeSleeping = 4;

  [[noreturn]] void throw_timeout() {
    const std::string where = control_.diagnose(mine_desc_.seq);
    throw Error(WIA_ERROR_TIMEOUT, timeout_message() + (where.empty() ? "" : "; " + where));
  }

  const NetLink& link(int peer) const { return links_[peer]; }
  char* at(const coll::Region& r) const { return region_ptr(mine_, r, es_); }
  std::uint64_t bytes(const coll::Step& st) const { return st.count * es_; }

  bool deps_done(const coll::Step& st) const {
    const std::uint32_t* deps = prog_.deps_of(st);
    for (std::uint32_t i = 0; i < st.dep_count; ++i)
      if (!st_[deps[i]].done) return false;
    return true;
  }

  // Posts step k's transport request; false when the transport asked us
  // to retry later (no resources now).
  bool post(std::uint32_t k) {
    const coll::Step& st = prog_.steps[k];
    const NetLink& l = link(st.peer);
    wia_request_t r = nullptr;
    if (st.is_send()) {
      link_call(l, "isend", [&](const wia_transport_ops_v1_t& t, void* ctx) {
        return t.isend(ctx, l.conn, at(st.src), bytes(st), st.tag, nullptr, &r);
      });
    } else {
      void* dst = st.kind == coll::StepKind::kRecvReduce ? st_[k].slot : at(st.dst);
      link_call(l, "irecv", [&](const wia_transport_ops_v1_t& t, void* ctx) {
        return t.irecv(ctx, l.conn, dst, bytes(st), st.tag, nullptr, &r);
      });
    }
    if (!r) return false;
    st_[k].req = r;
    st_[k].posted = true;
    return true;
  }

  // Tests step k's request; true once it completed (size checked).
  bool test(std::uint32_t k) {
    const coll::Step& st = prog_.steps[k];
    const NetLink& l = link(st.peer);
    std::int32_t done = 0;
    std::uint64_t size = 0;
    try {
      link_call(l, "test", [&](const wia_transport_ops_v1_t& t, void* ctx) {
        return t.test(ctx, st_[k].req, &done, &size);
      });
    } catch (const Error& e) {
      st_[k].req = nullptr;  // a failed request is released by the provider
      throw Error(e.status(), fmt::format("rank {} step {} ({} of {} B {} rank {}): {}", rank_, k,
                                          st.is_send() ? "send" : "receive", bytes(st),
                                          st.is_send() ? "to" : "from", st.peer, e.what()));
    }
    if (!done) return false;
    st_[k].req = nullptr;
    if (!st.is_send() && size != bytes(st))
      throw Error(WIA_ERROR_MISMATCH,
                  fmt::format("rank {} step {}: received {} B from rank {} where the schedule "
                              "expects {} B (the ranks' calls differ)",
                              rank_, k, size, st.peer, bytes(st)));
    return true;
  }

  bool advance(std::uint32_t k) {
    const coll::Step& st = prog_.steps[k];
    switch (st.kind) {
      case coll::StepKind::kSend:
      case coll::StepKind::kRecv: {
        bool progressed = false;
        if (!st_[k].posted) {
          if (!deps_done(st) || !post(k)) return false;
          progressed = true;
        }
        if (!test(k)) return progressed;
        st_[k].done = true;
        return true;
      }
      case coll::StepKind::kRecvReduce: {
        bool progressed = false;
        if (!st_[k].posted) {
          if (!post(k)) return false;
          progressed = true;
        }
        if (!st_[k].arrived) {
          if (!test(k)) return progressed;
          st_[k].arrived = true;
          progressed = true;
        }
        if (!deps_done(st)) return progressed;
        if (const std::uint32_t last = chain_end(k); last > k) {
          reduce_chain(k, last);
          return true;
        }
        reduce(st, at(st.dst), at(st.src), st_[k].slot);
        st_[k].done = true;
        return true;
      }
      case coll::StepKind::kCopy:
        if (!deps_done(st)) return false;
        std::memmove(at(st.dst), at(st.src), bytes(st));
        st_[k].done = true;
        return true;
      case coll::StepKind::kReduce:
        if (!deps_done(st)) return false;
        reduce(st, at(st.dst), at(st.dst), at(st.src));
        st_[k].done = true;
        return true;
    }
    return false;
  }

  // Steps k..last (inclusive) form a chain of receive-reduces into one
  // region (extends_chain) whose messages have all arrived and whose other
  // dependencies are done. Returns k when there is no such chain. Fusing
  // it reads every source once and writes the destination once instead
  // of once per message: the direct all-reduce's p-1 receive-reduces of a
  // 4 MiB chunk reduce in half the time (4 ranks, from memory).
  std::uint32_t chain_end(std::uint32_t k) {
    const coll::Step& first = prog_.steps[k];
    std::uint32_t last = k;
    for (std::uint32_t j = k + 1; j < prog_.steps.size(); ++j) {
      const coll::Step& st = prog_.steps[j];
      if (!coll::extends_chain(first, prog_.steps[last], st) || !st_[j].posted) break;
      if (!st_[j].arrived) {
        if (!test(j)) break;
        st_[j].arrived = true;
      }
      const std::uint32_t* deps = prog_.deps_of(st);
      bool ready = true;
      for (std::uint32_t d = 0; ready && d < st.dep_count; ++d)
        ready = deps[d] >= k || st_[deps[d]].done;  // inside the chain: met by fusing
      if (!ready) break;
      last = j;
    }
    return last;
  }

  void reduce_chain(std::uint32_t k, std::uint32_t last) {
    const coll::Step& first = prog_.steps[k];
    chain_srcs_.clear();
    chain_srcs_.push_back(at(first.src));
    for (std::uint32_t j = k; j <= last; ++j) chain_srcs_.push_back(st_[j].slot);
    check_reduce(
        kernels::reduce(chain_reduce_args(s_, prog_.steps[last], at(first.dst), chain_srcs_)),
        first.count);
    for (std::uint32_t j = k; j <= last; ++j) st_[j].done = true;
  }

  void reduce(const coll::Step& st, void* dst, const void* a, const void* b) {
    const void* srcs[2] = {a, b};
    check_reduce(kernels::reduce(step_reduce_args(s_, st, dst, srcs)), st.count);
  }

  void check_reduce(wia_status_t rc, std::uint64_t count) const {
    if (rc != WIA_SUCCESS)
      throw Error(WIA_ERROR_INTERNAL, fmt::format("{}: CPU reduction of {} elements failed: {}",
                                                  s_.describe(), count, status_name(rc)));
  }

  void post_descriptor() {
    const NetLink& to = link(next_);
    const NetLink& from = link(prev_);
    link_call(to, "isend(descriptor)", [&](const wia_transport_ops_v1_t& t, void* ctx) {
      return t.isend(ctx, to.conn, &mine_desc_, sizeof(mine_desc_), kDescriptorTag, nullptr,
                     &desc_send_);
    });
    link_call(from, "irecv(descriptor)", [&](const wia_transport_ops_v1_t& t, void* ctx) {
      return t.irecv(ctx, from.conn, &their_desc_, sizeof(their_desc_), kDescriptorTag, nullptr,
                     &desc_recv_);
    });
    // Tiny messages: a transport out of resources for them is not worth
    // a retry path; it fails the collective with a clear message.
    if (!desc_send_ || !desc_recv_)
      throw Error(WIA_ERROR_OUT_OF_MEMORY,
                  fmt::format("rank {}: the transport has no resources for the collective's "
                              "descriptor",
                              rank_));
  }

  bool advance_descriptor() {
    bool progressed = false;
    std::int32_t done = 0;
    std::uint64_t size = 0;
    // A failed request is released by the provider: forget it before the
    // error propagates, or the error path would test it again.
    auto test = [&](const NetLink& l, wia_request_t& req) {
      try {
        link_call(l, "test(descriptor)", [&](const wia_transport_ops_v1_t& t, void* ctx) {
          return t.test(ctx, req, &done, &size);
        });
      } catch (const Error&) {
        req = nullptr;
        throw;
      }
    };
    if (desc_send_) {
      test(link(next_), desc_send_);
      if (done) desc_send_ = nullptr, progressed = true;
    }
    if (desc_recv_) {
      done = 0;
      test(link(prev_), desc_recv_);
      if (done) {
        desc_recv_ = nullptr;
        progressed = true;
        const bool same = size == sizeof(their_desc_) &&
                          std::memcmp(&mine_desc_, &their_desc_, sizeof(their_desc_)) == 0;
        const std::string diff = same                           ? std::string()
                                 : size == sizeof(their_desc_) ? describe_difference(mine_desc_, their_desc_)
                                                               : std::string("a descriptor of the wrong size");
        if (!diff.empty())
          throw Error(WIA_ERROR_MISMATCH,
                      fmt::format("collective #{} does not match across ranks: rank {} and rank "
                                  "{} differ in {}",
                                  mine_desc_.seq, rank_, prev_, diff));
      }
    }
    return progressed;
  }

  std::string timeout_message() const {
    std::set<int> waiting_for;
    std::string first;
    for (std::uint32_t k = first_; k < prog_.steps.size(); ++k) {
      const coll::Step& st = prog_.steps[k];
      if (st_[k].done || !st.is_recv() || st_[k].arrived || !st_[k].posted) continue;
      waiting_for.insert(st.peer);
      if (first.empty())
        first = fmt::format("step {}: receive of {} B from rank {}", k, bytes(st), st.peer);
    }
    if (desc_recv_) waiting_for.insert(prev_);
    std::string ranks;
    for (int r : waiting_for) ranks += fmt::format("{}{}", ranks.empty() ? "" : ", ", r);
    return fmt::format("collective #{} timed out after {} ms on rank {}: waiting for rank(s) {} "
                       "({})",
                       mine_desc_.seq, options_.timeout_ms, rank_,
                       ranks.empty() ? "none (sends not taken)" : ranks,
                       first.empty() ? "the descriptor" : first);
  }

  const ExecPlan& plan_;
  const coll::Schedule& s_;
  const coll::RankProgram& prog_;
  const int rank_;
  const RankBuffers& mine_;
  const std::size_t es_;
  const Descriptor mine_desc_;
  Descriptor their_desc_{};
  std::vector<NetLink>& links_;
  ControlChannel& control_;
  const NetExecOptions& options_;

  bool started_ = false;
  int next_ = 0, prev_ = 0;
  wia_request_t desc_send_ = nullptr, desc_recv_ = nullptr;
  std::uint32_t first_ = 0;  // steps before it are all done
  // Per step, in one allocation (one collective's worth of state).
  struct StepState {
    wia_request_t req = nullptr;
    char* slot = nullptr;  // staging of a receive-reduce
    bool posted = false, done = false, arrived = false;
  };
  std::vector<StepState> st_;
  std::vector<const void*> chain_srcs_;
  std::vector<pollfd> pollfds_;
};

NetExecution::NetExecution(const ExecPlan& plan, int rank, const RankBuffers& mine,
                           const Descriptor& descriptor, std::vector<NetLink>& links,
                           char* staging, ControlChannel& control, const NetExecOptions& options)
    : rank_(rank),
      executor_(std::make_unique<Executor>(plan, rank, mine, descriptor, links, staging, control,
                                           options)) {}

NetExecution::~NetExecution() = default;

wia_status_t NetExecution::progress(std::chrono::steady_clock::time_point give_up_at,
                                    std::string& error) {
  try {
    return executor_->progress(give_up_at) ? WIA_SUCCESS : WIA_IN_PROGRESS;
  } catch (const Error& e) {
    error = e.what();
    return e.status();
  } catch (const std::exception& e) {
    error = fmt::format("rank {}: {}", rank_, e.what());
    return WIA_ERROR_INTERNAL;
  }
}

wia_status_t execute_rank_over_network(const ExecPlan& plan, int rank, const RankBuffers& mine,
                                       const Descriptor& descriptor, std::vector<NetLink>& links,
                                       char* staging, ControlChannel& control,
                                       const NetExecOptions& options, std::string& error) {
  NetExecution e(plan, rank, mine, descriptor, links, staging, control, options);
  return e.progress(std::chrono::steady_clock::time_point::max(), error);
}

}  // namespace wia::engine
