// SPDX-License-Identifier: Apache-2.0
// The order in which the process communicator's operations run: posting
// (on the posting thread when the stream is idle, else as a StreamTask
// the stream runs), the turn each operation waits for in sequence, and
// draining. What one collective does once its turn came is in
// process_exec.cpp.
#include <fmt/format.h>
#include <sched.h>

#include <algorithm>
#include <array>
#include <utility>

#include "comm/process_internal.hpp"
#include "common/error.hpp"
#include "kernels/cpu_reduce.hpp"
#include "runtime/device_call.hpp"
#include "runtime/objects.hpp"
#include "runtime/runtime.hpp"

namespace wia::comm {

wia_status_t ProcessCommunicator::post(int rank, Call call, wia_stream_s* stream) {
  if (rank != layout_.rank)
    throw Error(WIA_ERROR_INVALID_ARGUMENT,
                fmt::format("rank {} is not this process's rank {}", rank, layout_.rank));
  if (!try_post_inline(call, stream, -1, false))
    post_stream_task(std::move(call), stream, -1, false);
  return WIA_SUCCESS;
}

bool ProcessCommunicator::try_post_inline(Call& call, wia_stream_s* stream, int peer,
                                          bool is_send) {
  if (post_progress_.count() == 0 || broken_.load() ||
      call.count * kernels::dtype_size(call.dtype) > post_progress_max_bytes_)
    return false;
  // The stream must have nothing before the collective, so that running
  // it now keeps stream order; nothing of this communicator may be
  // pending either (every sequence number handed out has run). The query
  // goes straight to the provider of the communicator's device (the API
  // checked the stream is on it): any answer but "idle" (an error too)
  // sends the call through the stream, which reports errors in full.
  auto idle = [&] {
    return executed_.load(std::memory_order_acquire) == next_seq_ &&
           device_ops_->stream_query(device_ctx_, stream->ps) == WIA_SUCCESS;
  };
  // The clock is read only when something waits: a read costs 31 ns here,
  // a tenth of an 8-byte all-reduce between two processes.
  Clock::time_point now{};
  if (!idle()) {
    now = Clock::now();
    // Only small collectives of ours are ahead (a burst of them, the
    // first handed over because a peer was late): wait a little for them
    // rather than queue this one too, or every later one of the burst
    // would pay a hand-over as well. Bounded, so posting stays quick.
    if (large_in_flight_.load() > 0) return false;
    const auto until = now + post_progress_;
    for (std::uint32_t i = 1;; ++i) {
      if (i & 7) {
#if defined(__x86_64__) || defined(__i386__)
        __builtin_ia32_pause();
#endif
      } else {
        sched_yield();
      }
      if (idle()) break;
      if ((i & 15) == 0 && Clock::now() > until) return false;
    }
    now = Clock::now();
  }
  // Claim the next sequence number only if every earlier one has run.
  std::uint64_t seq = executed_.load(std::memory_order_acquire);
  if (!next_seq_.compare_exchange_strong(seq, seq + 1)) return false;
  record_posted(seq, call, peer, is_send, stream);
  const std::uint32_t timeout_ms = call.timeout_ms ? call.timeout_ms : default_timeout_ms_;
  std::string error;
  wia_status_t st = WIA_SUCCESS;
  const auto timeout = std::chrono::milliseconds(timeout_ms);
  const bool clock_unread = now == Clock::time_point{};
  const auto deadline = clock_unread ? Clock::time_point::max() : now + timeout;
  std::unique_ptr<RunningOperation> r;
  if (peer >= 0)
    r = begin_p2p(seq, call, peer, is_send, deadline);
  else if (repeats_window_call(call))
    r = begin_window_repeat(seq, call, deadline, st, error);
  else
    r = begin(seq, call, deadline, st, error);
  run_claimed(seq, std::move(r), st, error, stream, peer, is_send, now, timeout);
  return true;
}

bool ProcessCommunicator::try_post_repeat(int rank, const Call& call, wia_stream_s* stream) {
  // try_post_inline for the last small all-reduce through the windows
  // once more, with nothing to look up: the stream (this communicator's
  // device, the API checked) is asked directly, and the RunningOperation of last
  // time restarts its window on the new buffers. A third of the
  // instructions of a 2-rank 8-byte all-reduce (callgrind) were the
  // general path's.
  if (rank != layout_.rank || post_progress_.count() == 0 ||
      broken_.load(std::memory_order_relaxed))
    return false;
  // Nothing in flight first: the last call's key is written by the thread
  // that runs an operation, and read here only once every one has run
  // (ThreadSanitizer saw the read race a stream task's write).
  std::uint64_t seq = executed_.load(std::memory_order_acquire);
  if (next_seq_.load(std::memory_order_relaxed) != seq || !repeats_window_call(call) ||
      device_ops_->stream_query(device_ctx_, stream->ps) != WIA_SUCCESS ||
      !next_seq_.compare_exchange_strong(seq, seq + 1))
    return false;  // post() waits or queues
  record_posted(seq, call, -1, false, stream);
  // The turn is ours: no other thread touches the spare RunningOperation now.
  const auto timeout =
      std::chrono::milliseconds(call.timeout_ms ? call.timeout_ms : default_timeout_ms_);
  std::string error;
  wia_status_t st = WIA_SUCCESS;
  std::unique_ptr<RunningOperation> r = std::move(spare_operation_);
  if (r && r->window_restartable) {
    r->seq = seq;
    r->index = collectives_begun_++;
    r->descriptor.seq = r->index;
    r->options.deadline = Clock::time_point::max();
    r->options.timeout_ms = static_cast<std::uint32_t>(timeout.count());
    const engine::RankBuffers& b = call.buffers;
    r->window.restart(r->descriptor.seq, call.in_place ? b.recv : b.send, b.recv);
    running_.store(static_cast<std::int64_t>(r->index), std::memory_order_release);
  } else {
    spare_operation_ = std::move(r);
    r = begin_window_repeat(seq, call, Clock::time_point::max(), st, error);
  }
  run_claimed(seq, std::move(r), st, error, stream, -1, false, Clock::time_point{}, timeout);
  return true;
}

void ProcessCommunicator::run_claimed(std::uint64_t seq, std::unique_ptr<RunningOperation> r,
                                      wia_status_t st, std::string& error, wia_stream_s* stream,
                                      int peer, bool is_send, Clock::time_point now,
                                      std::chrono::milliseconds timeout) {
  const bool clock_unread = now == Clock::time_point{};
  if (r) {
    // Without the time, a first attempt takes what is ready and gives up
    // at its first look at the clock; the time and the deadlines are known
    // from then on.
    st = proceed(*r, clock_unread ? Clock::time_point::min() : now + post_progress_, error);
    if (st == WIA_IN_PROGRESS && clock_unread) {
      now = Clock::now();
      r->options.deadline = now + timeout;
      st = proceed(*r, now + post_progress_, error);
    }
  }
  if (st == WIA_IN_PROGRESS) {
    // Peers are late: the stream's worker goes on from here.
    // From here it is queued on a stream: counted in in_flight_ (the
    // task uncounts it), which is what destroy waits for.
    auto* task = new StreamTask{this, seq, Call{}, stream, peer, is_send, std::move(r), false};
    in_flight_.fetch_add(1);
    try {
      device_call(Runtime::get().device(stream->device), "launch_host_func",
                  [&](const wia_device_ops_v1_t& o, void* ctx) {
                    return o.launch_host_func(ctx, stream->ps, &ProcessCommunicator::stream_task,
                                              task);
                  });
      return;
    } catch (const Error& e) {
      in_flight_.fetch_sub(1);
      delete task;
      st = e.status();
      error = fmt::format("could not hand collective #{} to its stream: {}", seq, e.what());
      break_communicator(st, error);
    }
  }
  // Failures are reported like those of a collective run by the stream.
  if (st != WIA_SUCCESS) stream->set_async_error(unless_aborted(st), error);
  recycle(std::move(r));
  release_turn(seq);  // notifies
}

void ProcessCommunicator::post_stream_task(Call call, wia_stream_s* stream, int peer,
                                           bool is_send) {
  if (broken_.load()) {
    std::lock_guard<std::mutex> lock(err_mu_);
    throw Error(error_, fmt::format("the communicator is unusable after an earlier failure: {}",
                                    error_message_));
  }
  std::uint64_t seq;
  {
    std::lock_guard<std::mutex> lock(mu_);
    seq = next_seq_++;
  }
  record_posted(seq, call, peer, is_send, stream);
  const bool large = call.count * kernels::dtype_size(call.dtype) > post_progress_max_bytes_;
  auto* task = new StreamTask{this, seq, std::move(call), stream, peer, is_send, nullptr, large};
  in_flight_.fetch_add(1);
  if (large) large_in_flight_.fetch_add(1);
  const Device& d = Runtime::get().device(stream->device);
  try {
    device_call(d, "launch_host_func", [&](const wia_device_ops_v1_t& o, void* ctx) {
      return o.launch_host_func(ctx, stream->ps, &ProcessCommunicator::stream_task, task);
    });
  } catch (const Error& e) {
    delete task;
    in_flight_.fetch_sub(1);
    if (large) large_in_flight_.fetch_sub(1);
    // Its sequence number is spent; the ranks can no longer agree.
    break_communicator(e.status(), fmt::format("could not post operation #{}: {}", seq, e.what()));
    executed_.store(seq + 1);
    order_signal_.notify();
    throw;
  }
}

void ProcessCommunicator::stream_task(void* arg) {
  std::unique_ptr<StreamTask> task(static_cast<StreamTask*>(arg));
  task->comm->run_stream_task(*task);
}

void ProcessCommunicator::run_stream_task(StreamTask& task) {
  std::string error;
  wia_status_t st;
  if (task.running) {
    st = proceed(*task.running, Clock::time_point::max(), error);
    recycle(std::move(task.running));
    release_turn(task.seq);
  } else {
    // Its stream reached it only now (work posted before it ran first):
    // its time starts here, not at its posting.
    if (profiler_.on()) profiler_.reached(task.seq);
    st = execute(task.seq, task.call, task.peer, task.is_send, error);
  }
  if (st != WIA_SUCCESS) task.stream->set_async_error(unless_aborted(st), error);
  if (task.large) large_in_flight_.fetch_sub(1);
  // Notify, then decrement, and touch nothing after: once drain() reads
  // in_flight_ at 0 its caller may free this communicator, signal
  // included (the same order as DeviceCommunicator::run_stream_task, where
  // ThreadSanitizer saw notify() run on a freed communicator).
  order_signal_.notify();
  in_flight_.fetch_sub(1);
}

// Operations run in posting order, whatever streams they were posted on.
ProcessCommunicator::SequenceTurn::SequenceTurn(ProcessCommunicator& c, std::uint64_t seq,
                                                std::chrono::steady_clock::time_point deadline)
    : c_(c), seq_(seq) {
  reached_ = c.order_signal_.wait_until(
      [&] { return c.executed_.load(std::memory_order_acquire) >= seq; }, deadline, false, true);
}

ProcessCommunicator::SequenceTurn::~SequenceTurn() { c_.release_turn(seq_); }

namespace {
// nccl-tests' bus bandwidth factor's (p - 1) / p, without a division on
// every posting of communicators up to 64 ranks (profiling's fast path).
double share_of_others(int p) {
  static const auto table = [] {
    std::array<double, 65> t{};
    for (int n = 1; n < 65; ++n) t[static_cast<std::size_t>(n)] = (n - 1.0) / n;
    return t;
  }();
  return p > 0 && p < 65 ? table[static_cast<std::size_t>(p)] : (p - 1.0) / p;
}

// The profiler's kind of each collective, numbered once for the process
// (its posting then does no lookup).
std::uint32_t profiler_kind(coll::Collective c) {
  static const auto kinds = [] {
    std::array<std::uint32_t, coll::kCollectiveCount> k{};
    for (int i = 0; i < coll::kCollectiveCount; ++i)
      k[static_cast<std::size_t>(i)] =
          CommProfiler::kind_id(coll::collective_name(static_cast<coll::Collective>(i)));
    return k;
  }();
  return kinds[static_cast<std::size_t>(c)];
}
}  // namespace

void ProcessCommunicator::record_posted(std::uint64_t seq, const Call& call, int peer,
                                        bool is_send, const wia_stream_s* stream) noexcept {
  if (profiler_.on()) {
    const char* const p2p = peer >= 0 ? (call.p2p_name ? call.p2p_name
                                         : is_send     ? "send"
                                                       : "recv")
                                      : nullptr;
    const std::uint64_t bytes = call.count * kernels::dtype_size(call.dtype);
    const std::uint32_t kind =
        p2p != nullptr ? CommProfiler::kind_id(p2p) : profiler_kind(call.collective);
    if (!profiler_.post_counted(seq, kind, bytes)) [[unlikely]] {
      // One the profiler may time: the bus factor, its path and link.
      double factor = 1.0;  // broadcast, reduce, send, receive
      if (peer < 0 && call.collective == coll::Collective::kAllReduce)
        factor = 2 * share_of_others(layout_.size);
      if (peer < 0 && (call.collective == coll::Collective::kAllGather ||
                       call.collective == coll::Collective::kReduceScatter ||
                       call.collective == coll::Collective::kAllToAll))
        factor = share_of_others(layout_.size);
      profiler_.posted(seq, kind, bytes, factor,
                       peer >= 0 ? (call.p2p_path ? call.p2p_path : "host") : nullptr,
                       peer >= 0 ? transport_to_peer(peer) : nullptr, peer, call.dtype,
                       stream != nullptr ? stream->track() : 0);
    }
  }
  if (peer >= 0) {
    flight_.posted(seq, -1, call.p2p_name ? call.p2p_name : is_send ? "send" : "recv", call.count,
                   call.dtype, -1, peer);
  } else {
    const auto coll = static_cast<std::int64_t>(
        collectives_posted_.fetch_add(1, std::memory_order_relaxed));
    flight_.posted(seq, coll, coll::collective_name(call.collective), call.count, call.dtype,
                   call.root, -1);
  }
}

const char* ProcessCommunicator::transport_to_peer(int peer) noexcept {
  try {
    std::call_once(link_transports_named_, [this] { name_link_transports(); });
  } catch (...) {  // out of memory naming them: the profile says nothing
    return nullptr;
  }
  const auto q = static_cast<std::size_t>(peer);
  return q < transport_of_peer_.size() && transport_of_peer_[q] ? transport_of_peer_[q] : "host";
}

void ProcessCommunicator::release_turn(std::uint64_t seq) {
  flight_.finished(seq);
  // The algorithm's name takes a lock: asked for the timed operations only.
  if (profiler_.on())
    profiler_.finished(seq, profiler_.timed(seq) ? last_selected().name : nullptr, op_transport_,
                       {nullptr, nullptr, 0}, op_peers_);
  executed_.store(std::max(executed_.load(), seq + 1), std::memory_order_release);
  order_signal_.notify();
}

wia_status_t ProcessCommunicator::execute(std::uint64_t seq, Call& call, int peer, bool is_send,
                                          std::string& error) {
  const std::uint32_t timeout_ms = call.timeout_ms ? call.timeout_ms : default_timeout_ms_;
  const auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
  const SequenceTurn turn(*this, seq, deadline);
  if (!turn.reached()) {
    error = fmt::format(
        "rank {}: {} (operation #{}) timed out after {} ms waiting for this "
        "rank's earlier operations (posted on other streams) to finish",
        layout_.rank,
        peer < 0 ? std::string("a collective")
                 : fmt::format("a {} with rank {}", is_send ? "send" : "receive", peer),
        seq, timeout_ms);
    break_communicator(WIA_ERROR_TIMEOUT, error);
    return WIA_ERROR_TIMEOUT;
  }
  if (broken_.load()) {
    std::lock_guard<std::mutex> lock(err_mu_);
    error =
        fmt::format("the communicator is unusable after an earlier failure: {}", error_message_);
    return error_;
  }
  wia_status_t st = WIA_SUCCESS;
  std::unique_ptr<RunningOperation> r = peer >= 0 ? begin_p2p(seq, call, peer, is_send, deadline)
                                                  : begin(seq, call, deadline, st, error);
  if (r) st = proceed(*r, Clock::time_point::max(), error);
  recycle(std::move(r));
  return st;
}

void ProcessCommunicator::run_now(Call call) {
  std::uint64_t seq;
  {
    std::lock_guard<std::mutex> lock(mu_);
    seq = next_seq_++;
  }
  record_posted(seq, call, -1, false, nullptr);
  std::string error;
  const wia_status_t st = execute(seq, call, -1, false, error);
  if (st != WIA_SUCCESS) throw Error(st, error);
}

bool ProcessCommunicator::drain() {
  const auto deadline =
      Clock::now() + std::chrono::milliseconds(2 * std::uint64_t(default_timeout_ms_) + 1000);
  return order_signal_.wait_until([&] { return in_flight_.load() == 0; }, deadline, false, true);
}

}  // namespace wia::comm
