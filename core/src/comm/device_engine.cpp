// SPDX-License-Identifier: Apache-2.0
// The communicator's side of the device engine (engine/device_exec.hpp):
// per-rank internal streams, enqueueing completed operations in sequence
// order, and signalling completion on the users' streams.
//
// Completion reaches a user's stream in one of two ways. When the posting
// call is the one that completes the set (the last rank to post), the
// operation is already on the internal streams, so the user's stream just
// waits for the rank's done event: no host thread is involved, as with
// NCCL kernels. Otherwise the operation cannot be enqueued yet (peers have
// not posted), and an event that is not recorded cannot be waited for, so
// a stream task (a host function) holds the user's stream until the rank's
// completion callback runs or the timeout expires.
//
// Completion is signalled by one thread per communicator that waits for
// each rank's done event (event_synchronize, which blocks rather than
// polls on the host provider), not by a host function at the end of each
// internal stream: CUDA runs all host functions of a process on one
// thread, so such a callback queued behind a user stream's waiting task
// never ran (seen on an H200: 4 ranks on one GPU timed out).
#include <fmt/format.h>

#include <chrono>
#include <thread>

#include "comm/device_communicator.hpp"
#include "comm/group.hpp"
#include "common/error.hpp"
#include "common/log.hpp"
#include "runtime/device_call.hpp"
#include "runtime/objects.hpp"

namespace wia::comm {

void DeviceCommunicator::init_device_engine() {
  Runtime& rt = Runtime::get();
  std::vector<const Device*> devs;
  for (wia_device_t id : devices_) {
    const Device& d = rt.device(id);
    if (d.provider != rt.device(devices_[0]).provider)
      throw Error(
          WIA_ERROR_NOT_SUPPORTED,
          fmt::format("device engine: device {} ({}) and device {} ({}) belong to different "
                      "providers; the devices of one communicator must share a provider",
                      devices_[0], rt.device(devices_[0]).provider->name(), d.id,
                      d.provider->name()));
    if (!(ops_of(d).caps & WIA_DEVICE_CAP_REDUCE))
      throw Error(WIA_ERROR_NOT_SUPPORTED,
                  fmt::format("device engine: device {} ({}) offers no on-device reduction "
                              "(WIA_DEVICE_CAP_REDUCE)",
                              d.id, d.provider->name()));
    devs.push_back(&d);
  }
  pools_ = std::make_unique<engine::DevicePools>(devs);
  internal_streams_.assign(devs.size(), nullptr);
  try {
    for (std::size_t r = 0; r < devs.size(); ++r) {
      const Device& d = *devs[r];
      device_call(d, "stream_create(collectives)", [&](const wia_device_ops_v1_t& o, void* ctx) {
        return o.stream_create(ctx, d.local_index, &internal_streams_[r]);
      });
    }
  } catch (...) {
    shutdown_device_engine();
    throw;
  }
  // Direct reads need peer access from the receiver to the sender; pairs
  // without it are staged through host memory.
  direct_.assign(devs.size(), std::vector<std::uint8_t>(devs.size(), 0));
  std::string staged;
  for (std::size_t b = 0; b < devs.size(); ++b)
    for (std::size_t a = 0; a < devs.size(); ++a) {
      if (a == b) continue;
      const Device& rx = *devs[b];
      const Device& tx = *devs[a];
      const wia_device_ops_v1_t& o = ops_of(rx);
      std::int32_t can = 0;
      if ((o.caps & WIA_DEVICE_CAP_PEER) &&
          o.can_access_peer(rx.provider->ctx(), rx.local_index, tx.local_index, &can) ==
              WIA_SUCCESS &&
          can &&
          o.enable_peer_access(rx.provider->ctx(), rx.local_index, tx.local_index) == WIA_SUCCESS)
        direct_[b][a] = 1;
      else
        staged += fmt::format("{}{}<-{}", staged.empty() ? "" : " ", b, a);
    }
  log::debug("coll", "device engine over {} ranks ({}); pairs staged through host memory: {}",
             devs.size(), devs[0]->provider->name(), staged.empty() ? "none" : staged);
  completion_thread_ = std::thread([this] { completion_loop(); });
}

void DeviceCommunicator::completion_loop() {
  Runtime& rt = Runtime::get();
  for (;;) {
    std::shared_ptr<Operation> op;
    int rank = 0;
    {
      std::unique_lock<std::mutex> lock(completion_mu_);
      completion_cv_.wait(lock, [&] { return completion_stop_ || !completion_queue_.empty(); });
      if (completion_queue_.empty()) return;  // stopping, and nothing is left to wait for
      std::tie(op, rank) = std::move(completion_queue_.front());
      completion_queue_.pop_front();
      completion_busy_ = true;
    }
    const Device& d = rt.device(devices_[rank]);
    try {
      device_call(d, "event_synchronize(collective done)",
                  [&](const wia_device_ops_v1_t& o, void* ctx) {
                    return o.event_synchronize(ctx, op->device_ranks[rank].done);
                  });
    } catch (const Error& e) {
      const std::string message = fmt::format("collective #{} failed on the device of rank {}: {}",
                                              op->seq, rank, e.what());
      op->sync.fail(e.status(), message);
      record_device_failure(e.status(), message, rank);
    }
    if (profiler_.on()) op->note_rank_end(rank);
    // Ranks are queued in order, so the last one ends the collective.
    if (rank == size() - 1 && op->enqueued.load(std::memory_order_acquire) && !op->sync.failed())
      record_end(*op);
    device_rank_done(&op->done_args[rank]);
    {
      std::lock_guard<std::mutex> lock(completion_mu_);
      completion_busy_ = false;
    }
  }
}

void DeviceCommunicator::settle_profile() {
  if (engine_ != Engine::kDevice) return;  // the inline engine reports before streams move on
  Runtime& rt = Runtime::get();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(1);
  for (;;) {
    {
      std::lock_guard<std::mutex> lock(completion_mu_);
      if (!completion_busy_) {
        if (completion_queue_.empty()) return;
        // Still running on the devices: not in the report yet, rightly.
        const auto& [op, rank] = completion_queue_.front();
        const Device& d = rt.device(devices_[rank]);
        if (ops_of(d).event_query(d.provider->ctx(), op->device_ranks[rank].done) != WIA_SUCCESS)
          return;
      }
    }
    if (std::chrono::steady_clock::now() >= deadline) return;
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

void DeviceCommunicator::shutdown_device_engine() noexcept {
  Runtime& rt = Runtime::get();
  bool abandoned = false;
  if (completion_thread_.joinable()) {
    {
      std::lock_guard<std::mutex> lock(completion_mu_);
      completion_stop_ = true;
    }
    completion_cv_.notify_all();
    // The communicator is destroyed only after drain() saw every rank
    // released, and ranks with enqueued work are released by this thread
    // alone: its queue is empty and it is at most finishing a release.
    completion_thread_.join();
  }
  for (std::size_t r = 0; r < internal_streams_.size(); ++r) {
    if (!internal_streams_[r]) continue;
    const Device& d = rt.device(devices_[r]);
    // Bounded: drain() already waited for every stream task, so the stream is
    // normally idle; a provider whose stream never finishes is reported
    // and its stream left alive (a bounded leak) instead of hanging here.
    const auto deadline = std::chrono::steady_clock::now() +
                          std::chrono::milliseconds(std::uint64_t(default_timeout_ms_) + 1000);
    wia_status_t st;
    while ((st = ops_of(d).stream_query(d.provider->ctx(), internal_streams_[r])) ==
               WIA_IN_PROGRESS &&
           std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    if (st == WIA_IN_PROGRESS) {
      log::error("coll",
                 "device engine: the internal stream of rank {} (device {}, {}) did not finish "
                 "within {} ms of the communicator's destruction; it is abandoned",
                 r, devices_[r], d.provider->name(), default_timeout_ms_ + 1000);
      internal_streams_[r] = nullptr;
      abandoned = true;
      continue;
    }
    ops_of(d).stream_destroy(d.provider->ctx(), internal_streams_[r]);
    internal_streams_[r] = nullptr;
  }
  // An abandoned stream may still use the pooled events and staging
  // buffers: they are leaked with it.
  if (abandoned) {
    (void)pools_.release();
    return;
  }
  {
    std::lock_guard<std::mutex> lock(enqueue_mu_);
    for (auto& op : running_ops_) pools_->give_back(op->lease);
    running_ops_.clear();
    for (auto& [seq, op] : complete_ops_) pools_->give_back(op->lease);
    complete_ops_.clear();
  }
  {
    // Sets some rank never completed (they timed out) still hold the
    // input events of the ranks that posted.
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [seq, op] : ops_) pools_->give_back(op->lease);
  }
  pools_.reset();
}

// A failed kernel or copy on a rank's internal stream must not vanish: the
// ranks' completion callbacks still run after it on providers whose stream
// errors are not sticky, so the users' streams would complete with wrong
// data. Each post asks the rank's internal stream first (a non-blocking
// query); an error becomes the communicator's asynchronous error
// (wia_comm_get_async_error) and fails this call and every later one: the
// engine's streams are in an unknown state.
// The communicator's async error, and the sticky failure every later post
// reports (check_internal_stream): the engine's streams are in an unknown
// state from here on.
void DeviceCommunicator::record_device_failure(wia_status_t status, const std::string& message,
                                               int rank) {
  record_async_error(status, message);
  std::lock_guard<std::mutex> lock(err_mu_);
  if (device_failure_ == WIA_SUCCESS) {
    device_failure_ = status;
    device_failure_message_ = message;
  }
  if (rank >= 0) failed_ranks_.insert(rank);
}

void DeviceCommunicator::revoke() {
  const std::string message = "wia_comm_revoke was called on the communicator";
  revoked_.store(true, std::memory_order_release);
  record_device_failure(WIA_ERROR_ABORTED, message);
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [seq, op] : ops_) op->sync.fail(WIA_ERROR_ABORTED, message);
}

// An enqueue touches every rank's device, and its error says which device
// in words only: ask each rank's internal stream, and count as failed the
// ranks whose device cannot even answer (a busy stream is no failure).
void DeviceCommunicator::note_broken_devices() {
  Runtime& rt = Runtime::get();
  for (int r = 0; r < size(); ++r) {
    try {
      device_call(rt.device(devices_[r]), "stream_query(collectives' stream)",
                  [&](const wia_device_ops_v1_t& o, void* ctx) {
                    return o.stream_query(ctx, internal_streams_[r]);
                  });
    } catch (const Error&) {
      std::lock_guard<std::mutex> lock(err_mu_);
      failed_ranks_.insert(r);
    }
  }
}

std::vector<int> DeviceCommunicator::failed_ranks() const {
  std::lock_guard<std::mutex> lock(err_mu_);
  return {failed_ranks_.begin(), failed_ranks_.end()};
}

void DeviceCommunicator::report_failed(int rank) {
  std::lock_guard<std::mutex> lock(err_mu_);
  failed_ranks_.insert(rank);
}

void DeviceCommunicator::set_origin(std::vector<int> origin_of_rank, int origin_size) {
  origin_of_rank_ = std::move(origin_of_rank);
  origin_size_ = origin_size;
}

void DeviceCommunicator::check_internal_stream(int rank) {
  {
    std::lock_guard<std::mutex> lock(err_mu_);
    if (device_failure_ < 0) throw Error(device_failure_, device_failure_message_);
  }
  const Device& d = Runtime::get().device(devices_[rank]);
  try {
    device_call(d, "stream_query(collectives' stream)",
                [&](const wia_device_ops_v1_t& o, void* ctx) {
                  return o.stream_query(ctx, internal_streams_[rank]);
                });
  } catch (const Error& e) {
    const std::string message =
        fmt::format("work of an earlier collective failed on rank {}: {}", rank, e.what());
    record_device_failure(e.status(), message, rank);
    // Sets other ranks posted into can never complete now: fail them, so
    // their users' streams report this error instead of a timeout.
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (auto& [seq, op] : ops_) op->sync.fail(e.status(), message);
    }
    throw Error(e.status(), message);
  }
}

wia_status_t DeviceCommunicator::post_device(int rank, Call call, wia_stream_s* stream) {
  check_internal_stream(rank);
  const Device& d = Runtime::get().device(stream->device);
  // The rank's input is ready when its stream reaches this point. The event
  // is recorded before the call is registered, so whoever completes the set
  // finds every rank's event recorded.
  engine::DevicePools::Lease ready_lease;
  wia_provider_event_t ready = pools_->take_event(rank, ready_lease);
  try {
    device_call(d, "event_record", [&](const wia_device_ops_v1_t& o, void* ctx) {
      return o.event_record(ctx, ready, stream->ps);
    });
  } catch (...) {
    pools_->give_back(ready_lease);
    throw;
  }
  std::shared_ptr<Operation> op;
  bool complete = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    // A rank that posts before its peers, outside a group, needs its stream
    // held by a waiting host function until they do: refused where a
    // waiting host function can stall other streams (CUDA), before the
    // call is registered, so no peer waits for it.
    if (group_depth() == 0 && !(d.props.flags & WIA_DEVICE_FLAG_WAITING_HOST_FUNC)) {
      const auto it = ops_.find(next_seq_[rank]);
      const int posted = it == ops_.end() ? 0 : it->second->posted_count;
      if (posted + 1 < size()) {
        pools_->give_back(ready_lease);
        throw Error(WIA_ERROR_INVALID_ARGUMENT,
                    fmt::format("rank {} (device {}, {}): the ranks of an in-process communicator "
                                "on {} devices must post a collective inside "
                                "wia_group_start/wia_group_end (one thread driving several "
                                "devices, as with NCCL); {} of {} ranks have posted it",
                                rank, stream->device, d.provider->name(), d.provider->name(),
                                posted, size()));
      }
    }
    const std::uint64_t seq = next_seq_[rank]++;
    auto& slot = ops_[seq];
    if (!slot) {
      slot = new_operation(seq);
      slot->device_ranks.resize(devices_.size());
      slot->accounted.reset(new std::atomic<std::uint8_t>[devices_.size()]());
    }
    op = slot;
    op->calls[rank] = std::move(call);
    op->posted[rank] = true;
    op->device_ranks[rank].input_ready = ready;
    complete = ++op->posted_count == size();
    // Nothing posts to a complete set again; the operation lives on in
    // complete_ops_/running_ops_ until its resources are reclaimed.
    if (complete) ops_.erase(seq);
  }
  in_flight_.fetch_add(1);  // released by release_rank
  wia_status_t result = WIA_SUCCESS;
  {
    std::lock_guard<std::mutex> lock(enqueue_mu_);
    op->lease.events.insert(op->lease.events.end(), ready_lease.events.begin(),
                            ready_lease.events.end());
  }
  if (complete) {
    result = complete_set(*op);
    std::lock_guard<std::mutex> lock(enqueue_mu_);
    complete_ops_[op->seq] = op;
    enqueue_ready_ops();
    reclaim_finished_ops();
  }
  if (!op->enqueued.load(std::memory_order_acquire) && !op->sync.failed() && group_depth() > 0) {
    // The peers post before the group ends (group.hpp): attach then.
    in_flight_.fetch_add(1);
    const bool may_wait = (d.props.flags & WIA_DEVICE_FLAG_WAITING_HOST_FUNC) != 0;
    defer_to_group_end([this, op, rank, stream, may_wait]() -> GroupResult {
      GroupResult result;
      try {
        if (!may_wait && !op->enqueued.load(std::memory_order_acquire) && !op->sync.failed()) {
          // Another thread's ranks have not posted yet (a group per thread):
          // parking this stream in a waiting host function is what this
          // device forbids.
          const std::string why = fmt::format(
              "collective #{} was not posted by every rank when rank {}'s group ended: on "
              "devices of {} the ranks of an in-process communicator post inside one "
              "wia_group_start/wia_group_end",
              op->seq, rank, Runtime::get().device(stream->device).provider->name());
          op->sync.fail(WIA_ERROR_INVALID_ARGUMENT, why);
          result = {WIA_ERROR_INVALID_ARGUMENT, why};
        }
        attach_to_stream(op, rank, stream);
      } catch (const Error& e) {
        result = {e.status(), e.what()};
      } catch (const std::exception& e) {
        result = {WIA_ERROR_INTERNAL, e.what()};
      }
      if (result.status < 0) {
        record_async_error(result.status, result.message);
        stream->set_async_error(result.status, result.message);
      }
      completion_signal_.notify();  // then the decrement: see run_stream_task
      in_flight_.fetch_sub(1);
      return result;
    });
  } else {
    attach_to_stream(op, rank, stream);
  }
  if (result != WIA_SUCCESS) throw Error(result, op->sync.message());
  return result;
}

// Orders `stream` after rank `rank`'s part of `op`: a wait for its done
// event once the operation is on the devices, else a stream task that
// holds the stream until it completes or times out. Also for a set that
// failed to match: the stream task puts the error on this rank's stream,
// as on every other rank's.
void DeviceCommunicator::attach_to_stream(const std::shared_ptr<Operation>& op, int rank,
                                          wia_stream_s* stream) {
  if (op->enqueued.load(std::memory_order_acquire) && !op->sync.failed()) {
    const Device& d = Runtime::get().device(stream->device);
    device_call(d, "stream_wait_event", [&](const wia_device_ops_v1_t& o, void* ctx) {
      return o.stream_wait_event(ctx, stream->ps, op->device_ranks[rank].done);
    });
  } else {
    launch_stream_task(&DeviceCommunicator::device_stream_task, op, rank, stream);
  }
}

void DeviceCommunicator::enqueue_ready_ops() {
  Runtime& rt = Runtime::get();
  for (;;) {
    auto it = complete_ops_.find(next_enqueue_seq_);
    if (it == complete_ops_.end()) return;
    std::shared_ptr<Operation> op = std::move(it->second);
    complete_ops_.erase(it);
    ++next_enqueue_seq_;
    running_ops_.push_back(op);
    if (op->sync.failed()) {
      for (int r = 0; r < size(); ++r) release_rank(*op, r);
      continue;
    }
    op->done_args.resize(devices_.size());
    std::vector<void*> args(devices_.size());
    for (int r = 0; r < size(); ++r) {
      engine::DeviceRank& dr = op->device_ranks[r];
      dr.device = &rt.device(devices_[r]);
      dr.stream = internal_streams_[r];
      dr.snapshot_input = op->calls[r].in_place && !op->plan->schedule.in_place;
      op->done_args[r] = {this, op.get(), r};
      args[r] = &op->done_args[r];
    }
    record_start(*op);  // ends in completion_loop, when its last rank is done
    // A timed one learns when each rank's part can start (its inputs
    // ready on the internal stream), where the devices run host functions.
    if (profiler_.on() && profiler_.timed(op->seq))
      for (int r = 0; r < size(); ++r)
        if (ops_of(*op->device_ranks[r].device).caps & WIA_DEVICE_CAP_HOST_FUNC) {
          op->device_ranks[r].on_start = &DeviceCommunicator::device_rank_started;
          op->device_ranks[r].start_arg = &op->done_args[r];
        }
    try {
      engine::enqueue_on_device_streams(*op->plan, op->buffers, op->device_ranks, direct_, *pools_,
                                        op->lease, nullptr, args.data());
      op->enqueued.store(true, std::memory_order_release);
      {
        std::lock_guard<std::mutex> lock(completion_mu_);
        for (int r = 0; r < size(); ++r) completion_queue_.emplace_back(op, r);
      }
      completion_cv_.notify_all();
    } catch (const Error& e) {
      const std::string message =
          fmt::format("collective #{} could not be enqueued on the devices: {}", op->seq, e.what());
      op->sync.fail(e.status(), message);
      // Work already on the internal streams may still use pooled buffers:
      // no later collective may run beside it.
      record_device_failure(e.status(), message);
      note_broken_devices();
      // Ranks whose done event is recorded are released by the completion
      // thread once their enqueued work has finished; the others now.
      {
        std::lock_guard<std::mutex> lock(completion_mu_);
        for (int r = 0; r < size(); ++r)
          if (op->device_ranks[r].done) completion_queue_.emplace_back(op, r);
      }
      completion_cv_.notify_all();
      for (int r = 0; r < size(); ++r)
        if (!op->device_ranks[r].done) release_rank(*op, r);
    }
  }
}

void DeviceCommunicator::reclaim_finished_ops() {
  while (!running_ops_.empty()) {
    Operation& op = *running_ops_.front();
    for (int r = 0; r < size(); ++r) {
      if (!op.accounted[r].load(std::memory_order_acquire)) return;
      // A failed operation may not have waited for the users' streams:
      // its input events are reused only once they completed.
      if (!op.enqueued.load(std::memory_order_acquire)) {
        const Device& d = Runtime::get().device(devices_[r]);
        if (ops_of(d).event_query(d.provider->ctx(), op.device_ranks[r].input_ready) != WIA_SUCCESS)
          return;
      }
    }
    pools_->give_back(op.lease);
    running_ops_.pop_front();
  }
}

void DeviceCommunicator::release_rank(Operation& op, int rank) {
  if (op.accounted[rank].exchange(1, std::memory_order_acq_rel)) return;
  // `op` may be reclaimed from here on; only the communicator is touched.
  completion_signal_.notify();  // then the decrement: see run_stream_task
  in_flight_.fetch_sub(1);
}

void DeviceCommunicator::device_rank_started(void* arg) {
  auto* a = static_cast<Operation::DoneArg*>(arg);
  a->op->rank_start_ns[a->rank].store(Operation::now_ns(), std::memory_order_release);
}

void DeviceCommunicator::device_rank_done(void* arg) {
  auto* a = static_cast<Operation::DoneArg*>(arg);
  a->op->rank_done[a->rank].store(1, std::memory_order_release);
  a->op->sync.signal.notify();
  a->comm->release_rank(*a->op, a->rank);
}

void DeviceCommunicator::device_stream_task(void* arg) {
  std::unique_ptr<StreamTask> g(static_cast<StreamTask*>(arg));
  g->comm->run_device_stream_task(*g);
}

void DeviceCommunicator::run_device_stream_task(StreamTask& g) {
  Operation& op = *g.op;
  const int rank = g.rank;
  const Call& call = op.calls[rank];
  const std::uint32_t timeout_ms = call.timeout_ms ? call.timeout_ms : default_timeout_ms_;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  // The stream task does no work itself: it waits patiently, leaving the cores
  // to the streams that do.
  const bool done = op.sync.signal.wait_until(
      [&] { return op.rank_done[rank].load(std::memory_order_acquire) || op.sync.failed(); },
      deadline, oversubscribed_, /*patient=*/true);
  if (!done) {
    std::string reason;
    if (!op.ready.load(std::memory_order_acquire)) {
      std::lock_guard<std::mutex> lock(mu_);
      std::string missing;
      for (int r = 0; r < size(); ++r)
        if (!op.posted[r])
          missing += fmt::format("{}{} (posted {} collective(s) so far)",
                                 missing.empty() ? "" : ", ", r, next_seq_[r]);
      reason = fmt::format("rank(s) {} never posted it", missing);
    } else if (!op.enqueued.load(std::memory_order_acquire)) {
      reason = "an earlier collective of this communicator never completed its posting";
    } else {
      reason = fmt::format(
          "the work of rank {} on device {} did not complete (its stream or a "
          "peer's is stuck)",
          rank, devices_[rank]);
    }
    op.sync.fail(WIA_ERROR_TIMEOUT, fmt::format("collective #{} timed out after {} ms on rank {}: "
                                                "{}",
                                                op.seq, timeout_ms, rank, reason));
  }
  if (op.sync.failed()) {
    const int status = op.sync.status();
    const std::string message = op.sync.message();
    g.stream->set_async_error(status, message);
    record_async_error(status, message);
    std::lock_guard<std::mutex> lock(enqueue_mu_);
    // A rank whose done event was recorded before a failed enqueue is
    // released by the completion thread once that work has finished.
    if (!op.enqueued.load(std::memory_order_acquire) && !op.device_ranks[rank].done)
      release_rank(op, rank);
  }
  completion_signal_.notify();  // then the decrement: see run_stream_task
  in_flight_.fetch_sub(1);
}

}  // namespace wia::comm
