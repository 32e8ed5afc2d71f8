// SPDX-License-Identifier: Apache-2.0
// The process communicator's plans: the algorithm chosen for a call (the
// rules, the cost model, and the paths it does not see), the plan cache
// with a memo of the last calls in front of it, and whether an in-place
// plan may stand in for its out-of-place twin.
#include <algorithm>
#include <optional>
#include <tuple>

#include "coll/registry.hpp"
#include "comm/algorithm_choice.hpp"
#include "comm/node_windows.hpp"
#include "comm/process_internal.hpp"
#include "kernels/cpu_reduce.hpp"
#include "tuner/window_cost.hpp"

namespace wia::comm {

namespace {

// Same messages (peer, tag, count, direction, in order) on every rank: a
// rank may then run either schedule while its peers run the other.
bool same_messages(const coll::Schedule& a, const coll::Schedule& b) {
  if (a.nranks != b.nranks) return false;
  for (int r = 0; r < a.nranks; ++r) {
    std::vector<std::tuple<bool, int, std::uint32_t, std::uint64_t>> ma, mb;
    for (const coll::Step& s : a.programs[r].steps)
      if (s.is_send() || s.is_recv()) ma.emplace_back(s.is_send(), s.peer, s.tag, s.count);
    for (const coll::Step& s : b.programs[r].steps)
      if (s.is_send() || s.is_recv()) mb.emplace_back(s.is_send(), s.peer, s.tag, s.count);
    std::sort(ma.begin(), ma.end());
    std::sort(mb.begin(), mb.end());
    if (ma != mb) return false;
  }
  return true;
}

}  // namespace

std::shared_ptr<const engine::ExecPlan> ProcessCommunicator::plan_for(const Call& call,
                                                                      bool in_place,
                                                                      double* estimate,
                                                                      std::string* reason) {
  const bool reads_in_place = window_reads_in_place(call);
  {
    // No lock: begin(), the only caller, runs one operation at a time
    // (each waits for its turn, see SequenceTurn).
    for (const PlanMemo& m : plan_memo_)
      if (m.plan && m.collective == call.collective && m.requested == call.algorithm &&
          m.op == call.op && m.dtype == call.dtype && m.count == call.count &&
          m.root == call.root && m.num_chunks == call.num_chunks && m.in_place == in_place &&
          m.window_reads_in_place == reads_in_place) {
        if (estimate) *estimate = m.estimate;
        if (reason) *reason = m.reason;
        return m.plan;
      }
  }
  coll::CollArgs args;
  args.collective = call.collective;
  args.op = call.op;
  args.dtype = call.dtype;
  args.count = call.count;
  args.nranks = size();
  args.root = call.root;
  args.options.num_chunks = call.num_chunks;
  args.options.in_place = in_place;
  args.options.groups = groups_;
  coll::validate_args(args);
  std::lock_guard<std::mutex> lock(mu_);
  AlgorithmChoice choice = choose_algorithm(args, call.algorithm, *selector_);
  // Paths the cost model, which prices messages, does not see.
  auto take_instead = [&](coll::Algorithm algorithm, const char* reason) {
    args.algorithm = algorithm;
    choice.algorithm = algorithm;
    choice.num_chunks = 0;
    choice.estimated_ms = tuner::estimate(args, selector_->model()).time_us / 1000.0;
    choice.reason = reason;
  };
  const std::uint64_t bytes = call.count * kernels::dtype_size(call.dtype);
  const bool all_reduce_by_model =
      choice.by_cost_model && call.collective == coll::Collective::kAllReduce && size() > 1;
  if (all_reduce_by_model && size() <= coll::kOneShotMaxRanks && bytes <= one_shot_max_bytes_)
    // The descriptor messages and step bookkeeping the one-shot fast path
    // saves dominate here.
    take_instead(coll::Algorithm::kOneShot, "small all-reduce (collectives.one_shot_max_bytes)");
  else if (all_reduce_by_model && windows_ && bytes <= node_window_max_bytes_ && size() == 2)
    // Two ranks read as many of each other's bytes either way (the whole
    // input, or half the input and half the result); one-shot waits once
    // per chunk instead of twice and writes no slices.
    take_instead(coll::Algorithm::kOneShot,
                 "2 ranks on one node (node-shared windows, collectives.node_window_max_bytes)");
  else if (all_reduce_by_model && windows_ && bytes <= node_window_max_bytes_ &&
           size() <= coll::kOneShotMaxRanks &&
           bytes * static_cast<std::uint64_t>(size() - 1) <= node_window_one_shot_peer_bytes_)
    // Few peer bytes: one-shot reads (p-1) n of them against the direct
    // schedule's 2 (p-1)/p n, but waits once per chunk instead of twice and
    // reads no slice a peer has just written. 4 processes on 2 cores
    // (2026-12-06, wia-bench --procs 4 --algo one_shot / direct, two rounds,
    // inputs as the last call left them and rewritten before each call):
    // one-shot faster in 11 of 12 pairs from 64 KiB to 1 MiB (64 KiB 13 -
    // 28 against 19 - 47 us, 1 MiB 158 - 288 against 183 - 832 us), about
    // even at 4 MiB (990 - 2002 against 1298 - 2041 us) and mixed at 16.
    take_instead(coll::Algorithm::kOneShot,
                 "few bytes from the peers (node-shared windows, "
                 "collectives.node_window_one_shot_peer_bytes)");
  else if (all_reduce_by_model && windows_ && bytes <= node_window_max_bytes_)
    // Through the windows a rank reads every input directly: the direct
    // algorithm moves the fewest bytes and waits twice per chunk.
    take_instead(coll::Algorithm::kDirect,
                 "all ranks on one node (node-shared windows, collectives.node_window_max_bytes)");
  args.algorithm = choice.algorithm;
  if (args.options.num_chunks == 0) args.options.num_chunks = choice.num_chunks;
  // Through the windows (through_windows) the data moves by loads and
  // stores, not messages: costed by the passes each rank makes.
  if (window_model_ && call.collective == coll::Collective::kAllReduce &&
      (choice.algorithm == coll::Algorithm::kDirect ||
       choice.algorithm == coll::Algorithm::kOneShot)) {
    tuner::WindowAllReduce w;
    w.nranks = size();
    w.bytes = bytes;
    w.chunk_bytes = std::max<std::uint64_t>(windows_->windows().chunk_bytes, 1);
    w.one_shot = choice.algorithm == coll::Algorithm::kOneShot;
    w.in_place = in_place;
    w.inputs_read_in_place = reads_in_place;
    choice.estimated_ms = tuner::window_allreduce_us(w, *window_model_) / 1000.0;
  }
  std::shared_ptr<const engine::ExecPlan> plan = plans_.find(args, choice.algorithm);
  if (!plan) {
    plan = engine::make_plan(coll::build_schedule(args), choice.estimated_ms);
    plans_.insert(args, choice.algorithm, plan);
  }
  plan_memo_[plan_memo_next_++ % plan_memo_.size()] =
      PlanMemo{call.collective,  call.algorithm, call.op,        call.dtype,
               call.count,       call.root,      call.num_chunks, in_place,
               reads_in_place,   plan,           choice.estimated_ms, choice.reason};
  if (estimate) *estimate = choice.estimated_ms;
  if (reason) *reason = choice.reason;
  return plan;
}

bool ProcessCommunicator::same_messages_as(const std::shared_ptr<const engine::ExecPlan>& ip,
                                           const std::shared_ptr<const engine::ExecPlan>& plan) {
  std::optional<bool> same;
  if (same_messages_memo_.in_place == ip && same_messages_memo_.out_of_place == plan)
    same = same_messages_memo_.same;
  if (!same) {
    // Compares every rank's messages: once per pair of plans, not per call.
    same = same_messages(ip->schedule, plan->schedule);
    same_messages_memo_ = {ip, plan, *same};
  }
  return *same;
}

}  // namespace wia::comm
