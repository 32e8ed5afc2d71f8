// SPDX-License-Identifier: Apache-2.0
// Running one collective of the process communicator once its turn came
// (process_order.cpp): begin (plan, mode, buffers, descriptor, engine
// object), proceed until done, and the one RunningOperation kept for
// reuse between operations.
#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "coll/registry.hpp"
#include "comm/node_windows.hpp"
#include "comm/process_internal.hpp"
#include "common/error.hpp"
#include "common/log.hpp"
#include "kernels/cpu_reduce.hpp"

namespace wia::comm {

std::unique_ptr<ProcessCommunicator::RunningOperation> ProcessCommunicator::begin(
    std::uint64_t seq, Call& call, Clock::time_point deadline, wia_status_t& status,
    std::string& error) {
  using Mode = RunningOperation::Mode;
  const std::uint32_t timeout_ms = call.timeout_ms ? call.timeout_ms : default_timeout_ms_;
  const auto wire = wire_lock();
  try {
    const int me = layout_.rank;
    double estimate = 0;
    std::string reason;
    const bool debug = log::enabled(log::Level::debug);
    std::shared_ptr<const engine::ExecPlan> plan =
        plan_for(call, false, &estimate, debug ? &reason : nullptr);
    std::unique_ptr<RunningOperation> r = take_spare_operation();
    r->seq = seq;
    r->mode = through_windows(call, *plan) ? Mode::kWindow
              : eager(call, *plan)         ? Mode::kEager
                                           : Mode::kNetwork;
    engine::RankBuffers& b = r->buffers;
    b = std::move(call.buffers);  // the call is not read again
    if (call.in_place && r->mode == Mode::kNetwork) prepare_in_place(call, plan, b);
    note_selected(plan->schedule.algorithm, call.collective, estimate);
    if (profiler_.on()) {
      op_transport_ = transports_of(plan, r->mode == Mode::kWindow);
      op_peers_ = peers_of(plan, r->mode == Mode::kWindow);
    }
    if (r->mode == Mode::kNetwork) reserve_scratch_and_staging(*plan, b);

    // Ranks agree on collectives, not on operations: point to point
    // involves some ranks only, so the descriptor counts collectives.
    r->index = collectives_begun_++;
    r->descriptor.seq = r->index;
    fill_descriptor(call, *plan, r->descriptor);
    if (debug)  // describe() formats: not on every call
      log::debug("coll", "rank {} collective #{}: {} chosen by {} (estimate {:.3f} ms)", me, seq,
                 plan->schedule.describe(), reason, estimate);

    if (r->mode != Mode::kWindow) fill_links(r->links);  // the windows need no connections
    const bool one_shot = plan->schedule.algorithm == coll::Algorithm::kOneShot;
    if (r->mode == Mode::kWindow && one_shot && !debug)
      remember_window_call(call, r->descriptor, estimate);
    r->options.deadline = deadline;
    r->options.timeout_ms = timeout_ms;
    r->options.oversubscribed = oversubscribed_;
    r->plan = std::move(plan);
    start_engine(*r, call);
    running_.store(static_cast<std::int64_t>(r->index));
    return r;
  } catch (const Error& e) {
    error = e.what();
    status = e.status();
    break_communicator(status, error);
    return nullptr;
  }
}

void ProcessCommunicator::prepare_in_place(const Call& call,
                                           std::shared_ptr<const engine::ExecPlan>& plan,
                                           engine::RankBuffers& b) {
  // An in-place schedule is used when its messages are the same as the
  // out-of-place one's, so peers that made out-of-place calls still
  // match; otherwise the input is snapshotted first.
  std::shared_ptr<const engine::ExecPlan> ip = plan_for(call, true, nullptr, nullptr);
  if (same_messages_as(ip, plan)) {
    plan = ip;
    if (call.collective == coll::Collective::kReduceScatter) b.recv = b.send;
    b.send = nullptr;
    return;
  }
  const coll::RankProgram& prog = plan->schedule.programs[layout_.rank];
  const std::size_t es = plan->schedule.elem_size();
  if (b.send && prog.sizes.send) {
    snapshot_.assign(b.send, b.send + prog.sizes.send * es);
    b.send = snapshot_.data();
  }
  if (!b.send_shards.empty() && prog.sizes.send_shard) {
    const std::size_t shard = prog.sizes.send_shard * es;
    snapshot_.resize(shard * b.send_shards.size());
    for (std::size_t j = 0; j < b.send_shards.size(); ++j) {
      std::memcpy(snapshot_.data() + j * shard, b.send_shards[j], shard);
      b.send_shards[j] = snapshot_.data() + j * shard;
    }
  }
}

void ProcessCommunicator::reserve_scratch_and_staging(const engine::ExecPlan& plan,
                                                      engine::RankBuffers& b) {
  const int me = layout_.rank;
  const std::uint64_t scratch = plan.schedule.scratch_bytes(me);
  if (scratch_.size() < scratch) scratch_.resize(scratch);
  b.scratch = scratch_.data();
  const std::uint64_t staging = engine::staging_bytes(plan, me);
  if (staging_.size() < staging) staging_.resize(staging);
}

void ProcessCommunicator::fill_descriptor(const Call& call, const engine::ExecPlan& plan,
                                          engine::Descriptor& desc) {
  desc.count = call.count;
  desc.collective = static_cast<std::uint8_t>(call.collective);
  desc.algorithm = static_cast<std::uint8_t>(plan.schedule.algorithm);
  desc.dtype = static_cast<std::uint8_t>(call.dtype);
  desc.op = coll::is_reducing(call.collective) ? static_cast<std::uint8_t>(call.op) : 0;
  desc.root = (call.collective == coll::Collective::kBroadcast ||
               call.collective == coll::Collective::kReduce)
                  ? call.root
                  : 0;
  desc.num_chunks = plan.schedule.num_chunks;
}

void ProcessCommunicator::remember_window_call(const Call& call, const engine::Descriptor& desc,
                                               double estimate) {
  window_repeat_.key = call;
  window_repeat_.key.buffers = {};
  window_repeat_.reads_in_place = window_reads_in_place(call);
  window_repeat_.descriptor = desc;
  window_repeat_.estimate = estimate;
  window_repeat_.valid = true;
}

void ProcessCommunicator::start_engine(RunningOperation& r, const Call& call) {
  const int me = layout_.rank;
  const engine::RankBuffers& b = r.buffers;
  const bool one_shot = r.plan->schedule.algorithm == coll::Algorithm::kOneShot;
  switch (r.mode) {
    case RunningOperation::Mode::kWindow:
      r.window.start(me, r.descriptor, call.in_place ? b.recv : b.send, b.recv, call.op, one_shot,
                     windows_->windows(), r.control, r.options);
      break;
    case RunningOperation::Mode::kEager:
      r.eager.start(me, r.descriptor, call.in_place ? b.recv : b.send, b.recv, call.op,
                    one_shot_max_bytes_, r.links, r.control, r.options);
      break;
    case RunningOperation::Mode::kNetwork:
      r.execution = std::make_unique<engine::NetExecution>(
          *r.plan, me, r.buffers, r.descriptor, r.links, staging_.data(), r.control, r.options);
      break;
    case RunningOperation::Mode::kPointToPoint:
      break;  // begin_p2p: nothing to start
  }
}

// Written only when it changes (this thread is its only writer).
void ProcessCommunicator::note_selected(coll::Algorithm algorithm, coll::Collective collective,
                                        double estimate) {
  const auto algo_id = static_cast<wia_algorithm_id_t>(algorithm);
  const char* coll_name = coll::collective_name(collective);
  if (last_selected_.id == algo_id && last_selected_.collective == coll_name &&
      last_selected_.estimated_time_ms == estimate)
    return;
  std::lock_guard<std::mutex> lock(err_mu_);
  last_selected_.id = algo_id;
  last_selected_.name = coll::algorithm_name(algorithm);
  last_selected_.collective = coll_name;
  last_selected_.estimated_time_ms = estimate;
}

void ProcessCommunicator::name_link_transports() {
  std::vector<const char*> distinct;
  for (std::size_t q = 0; q < peers_.size(); ++q) {
    const char* name = static_cast<int>(q) == layout_.rank || peers_[q].transport.empty()
                           ? nullptr
                           : CommProfiler::intern_transport(peers_[q].transport);
    std::uint32_t bit = 0;
    if (name != nullptr) {
      auto it = std::find(distinct.begin(), distinct.end(), name);
      if (it == distinct.end()) it = distinct.insert(it, name);
      bit = 1u << (it - distinct.begin());
    }
    transport_of_peer_.push_back(name);
    transport_bit_of_peer_.push_back(bit);
  }
  // Every subset of the distinct transports, named in alphabetical order
  // ("shm+tcp"): a handful of providers, so a handful of names.
  std::vector<std::string> sorted(distinct.begin(), distinct.end());
  transport_of_set_.assign(std::size_t{1} << distinct.size(), "host");
  for (std::uint32_t set = 1; set < transport_of_set_.size(); ++set) {
    std::vector<std::string> names;
    for (std::size_t i = 0; i < distinct.size(); ++i)
      if (set & (1u << i)) names.emplace_back(distinct[i]);
    std::sort(names.begin(), names.end());
    std::string joined;
    for (const std::string& n : names) joined += (joined.empty() ? "" : "+") + n;
    transport_of_set_[set] = CommProfiler::intern_transport(joined);
  }
}

const char* ProcessCommunicator::transports_of(const std::shared_ptr<const engine::ExecPlan>& plan,
                                               bool windows) {
  if (windows) return "windows";
  if (plan == transport_plan_) return transport_plan_name_;
  std::call_once(link_transports_named_, [this] { name_link_transports(); });
  std::uint32_t set = 0;
  const auto& programs = plan->schedule.programs;
  const auto me = static_cast<std::size_t>(layout_.rank);
  if (me < programs.size() && programs[me].built) {
    for (const coll::Step& step : programs[me].steps)
      if (step.peer >= 0 && static_cast<std::size_t>(step.peer) < transport_bit_of_peer_.size())
        set |= transport_bit_of_peer_[static_cast<std::size_t>(step.peer)];
  } else {  // not built for this rank: every link may carry it
    for (std::uint32_t bit : transport_bit_of_peer_) set |= bit;
  }
  transport_plan_ = plan;
  transport_plan_name_ = transport_of_set_[set];
  return transport_plan_name_;
}

const char* ProcessCommunicator::peers_of(const std::shared_ptr<const engine::ExecPlan>& plan,
                                          bool windows) {
  auto listed = [](const std::vector<int>& ranks) {
    std::string text;
    for (const int q : ranks) text += fmt::format("{}{}", text.empty() ? "" : ",", q);
    return CommProfiler::intern_transport(text);
  };
  if (windows || !plan) {
    if (every_other_rank_ == nullptr) {
      std::vector<int> others;
      for (int q = 0; q < layout_.size; ++q)
        if (q != layout_.rank) others.push_back(q);
      every_other_rank_ = listed(others);
    }
    return every_other_rank_;
  }
  if (plan == peers_plan_) return peers_plan_list_;
  std::vector<int> peers;
  const auto& programs = plan->schedule.programs;
  const auto me = static_cast<std::size_t>(layout_.rank);
  if (me < programs.size() && programs[me].built)
    for (const coll::Step& step : programs[me].steps)
      if (step.peer >= 0 && step.peer != layout_.rank) peers.push_back(step.peer);
  std::sort(peers.begin(), peers.end());
  peers.erase(std::unique(peers.begin(), peers.end()), peers.end());
  peers_plan_ = plan;
  peers_plan_list_ = listed(peers);
  return peers_plan_list_;
}

bool ProcessCommunicator::repeats_window_call(const Call& call) const {
  const Call& k = window_repeat_.key;
  return window_repeat_.valid && call.collective == k.collective && call.count == k.count &&
         call.dtype == k.dtype && call.op == k.op && call.algorithm == k.algorithm &&
         call.num_chunks == k.num_chunks && call.in_place == k.in_place && call.root == k.root &&
         window_reads_in_place(call) == window_repeat_.reads_in_place;
}

std::unique_ptr<ProcessCommunicator::RunningOperation> ProcessCommunicator::begin_window_repeat(
    std::uint64_t seq, const Call& call, Clock::time_point deadline, wia_status_t& status,
    std::string& error) try {
  const auto wire = wire_lock();
  std::unique_ptr<RunningOperation> r = take_spare_operation();
  r->seq = seq;
  r->mode = RunningOperation::Mode::kWindow;
  r->index = collectives_begun_++;
  r->descriptor = window_repeat_.descriptor;
  r->descriptor.seq = r->index;
  note_selected(coll::Algorithm::kOneShot, call.collective, window_repeat_.estimate);
  op_transport_ = "windows";
  if (profiler_.on()) op_peers_ = peers_of(nullptr, true);
  r->options.deadline = deadline;
  r->options.timeout_ms = call.timeout_ms ? call.timeout_ms : default_timeout_ms_;
  r->options.oversubscribed = oversubscribed_;
  const engine::RankBuffers& b = call.buffers;
  r->window.start(layout_.rank, r->descriptor, call.in_place ? b.recv : b.send, b.recv, call.op,
                  true, windows_->windows(), r->control, r->options);
  r->window_restartable = r->window.restartable();
  running_.store(static_cast<std::int64_t>(r->index));
  return r;
} catch (const std::exception& e) {  // out of memory: as begin() fails
  status = WIA_ERROR_OUT_OF_MEMORY;
  error = fmt::format("rank {}: starting collective #{}: {}", layout_.rank, seq, e.what());
  break_communicator(status, error);
  return nullptr;
}

// One RunningOperation is kept for reuse: a collective after another (the common
// case) then allocates nothing here and copies the links' names in place.
std::unique_ptr<ProcessCommunicator::RunningOperation> ProcessCommunicator::take_spare_operation() {
  // No lock: operations run one at a time (SequenceTurn), and each recycles its
  // RunningOperation before the next may start.
  std::unique_ptr<RunningOperation> r = std::move(spare_operation_);
  if (!r) return std::make_unique<RunningOperation>(*this);
  r->seq = r->index = 0;
  r->buffers = {};
  r->descriptor = {};
  r->options = {};
  r->mode = RunningOperation::Mode::kNetwork;
  r->window_restartable = false;
  r->peer = -1;
  r->is_send = false;
  r->buf = nullptr;
  r->bytes = 0;
  r->request = nullptr;
  return r;
}

void ProcessCommunicator::recycle(std::unique_ptr<RunningOperation> r) {
  if (!r) return;
  r->execution.reset();
  r->plan.reset();
  spare_operation_ = std::move(r);
}

wia_status_t ProcessCommunicator::proceed(RunningOperation& r, Clock::time_point give_up_at,
                                          std::string& error) {
  const auto wire = wire_lock();
  wia_status_t st;
  switch (r.mode) {
    case RunningOperation::Mode::kPointToPoint:
      return proceed_p2p(r, give_up_at, error);
    case RunningOperation::Mode::kWindow:
      st = r.window.progress(give_up_at, error);
      break;
    case RunningOperation::Mode::kEager:
      st = r.eager.progress(give_up_at, error);
      break;
    case RunningOperation::Mode::kNetwork:
    default:
      st = r.execution->progress(give_up_at, error);
      break;
  }
  if (st == WIA_IN_PROGRESS) return st;
  // Read by the control thread answering "where are you?": no ordering
  // beyond release needed.
  running_.store(-1, std::memory_order_release);
  collectives_done_.store(r.index + 1, std::memory_order_release);
  if (st != WIA_SUCCESS) {
    error = with_peer_reason(r, st, error);
    break_communicator(st, error);
  }
  return st;
}

std::string ProcessCommunicator::with_peer_reason(RunningOperation& r, wia_status_t status,
                                                  std::string error) {
  // A peer that broke the communicator sent its reason on the control
  // channel before closing the connection: that says more than the closed
  // connection this rank's send or receive met first (a mismatch the peer
  // found, say). Seen on a loaded machine: a one-shot all-reduce's send
  // failed with EOF while the peer's "differ in op sum vs max" waited.
  if (status != WIA_ERROR_REMOTE) return error;
  try {
    const std::string why = r.control.poll();
    if (why.find("aborted the communicator") != std::string::npos)
      return fmt::format("{} (seen here as: {})", why, error);
  } catch (const std::exception&) {
    // keep the transport's message
  }
  return error;
}

bool ProcessCommunicator::through_windows(const Call& call, const engine::ExecPlan& plan) const {
  if (!windows_ || call.collective != coll::Collective::kAllReduce) return false;
  const coll::Algorithm a = plan.schedule.algorithm;
  return a == coll::Algorithm::kOneShot || a == coll::Algorithm::kDirect;
}

bool ProcessCommunicator::window_reads_in_place(const Call& call) const {
  const std::uint64_t bytes = call.count * kernels::dtype_size(call.dtype);
  if (!windows_ || call.collective != coll::Collective::kAllReduce ||
      bytes < node_window_zero_copy_min_bytes_ || bytes == 0)
    return false;
  return windows_->can_export(call.in_place ? call.buffers.recv : call.buffers.send, bytes);
}

bool ProcessCommunicator::eager(const Call& call, const engine::ExecPlan& plan) const {
  return call.collective == coll::Collective::kAllReduce &&
         plan.schedule.algorithm == coll::Algorithm::kOneShot && size() > 1 &&
         call.count * kernels::dtype_size(call.dtype) <= one_shot_max_bytes_;
}

void ProcessCommunicator::fill_links(std::vector<engine::NetLink>& links) const {
  // The peers' names are set once; only connections change (closed).
  if (links.size() != peers_.size()) {
    links.clear();
    for (const Peer& p : peers_) links.push_back(p.link);
    return;
  }
  for (std::size_t q = 0; q < peers_.size(); ++q) {
    links[q].provider = peers_[q].link.provider;
    links[q].conn = peers_[q].link.conn;
  }
}

}  // namespace wia::comm
