// SPDX-License-Identifier: Apache-2.0
// Point-to-point send/recv between two ranks of an in-process communicator.
// Like a collective, each side posts a stream task on its stream and
// returns; the receiver's task copies straight from the sender's buffer
// once the sender's task has reached it (input ready), and the sender's
// task waits for that copy so its buffer may be reused when its stream
// moves on.
#include <fmt/format.h>

#include <cstring>

#include "comm/device_communicator.hpp"
#include "common/error.hpp"
#include "kernels/cpu_reduce.hpp"
#include "runtime/device_call.hpp"
#include "runtime/objects.hpp"

namespace wia::comm {

struct DeviceCommunicator::Message {
  int src = 0, dst = 0;
  std::uint64_t n = 0;  // index among the pair's messages
  // Each side's view, written before its flag is raised (release).
  const void* send_buf = nullptr;
  std::uint64_t send_count = 0;
  wia_datatype_t send_dtype = WIA_FLOAT32;
  void* recv_buf = nullptr;
  std::uint64_t recv_count = 0;
  wia_datatype_t recv_dtype = WIA_FLOAT32;
  std::atomic<bool> sender_arrived{false};  // the sender's stream reached the send
  std::atomic<bool> done{false};            // the receiver copied (or failed)
  std::atomic<bool> failed{false};
  std::atomic<int> finished{0};  // stream tasks done with it
  std::mutex mu;
  int status = WIA_SUCCESS;
  std::string message;

  void fail(int st, const std::string& why) {
    std::lock_guard<std::mutex> lock(mu);
    if (failed.load()) return;
    status = st;
    message = why;
    failed.store(true, std::memory_order_release);
  }
};

struct DeviceCommunicator::P2pStreamTask {
  DeviceCommunicator* comm;
  std::shared_ptr<Message> msg;
  bool is_send;
  std::uint32_t timeout_ms;
  wia_stream_s* stream;
};

void DeviceCommunicator::post_send(int rank, int peer, const void* buf, std::uint64_t count,
                                   wia_datatype_t dtype, std::uint32_t timeout_ms,
                                   wia_stream_s* stream) {
  check_revoked();
  post_p2p(rank, peer, true, const_cast<void*>(buf), count, dtype, timeout_ms, stream);
}

void DeviceCommunicator::post_recv(int rank, int peer, void* buf, std::uint64_t count,
                                   wia_datatype_t dtype, std::uint32_t timeout_ms,
                                   wia_stream_s* stream) {
  check_revoked();
  post_p2p(rank, peer, false, buf, count, dtype, timeout_ms, stream);
}

void DeviceCommunicator::post_p2p(int rank, int peer, bool is_send, void* buf, std::uint64_t count,
                                  wia_datatype_t dtype, std::uint32_t timeout_ms,
                                  wia_stream_s* stream) {
  if (peer < 0 || peer >= size())
    throw Error(WIA_ERROR_INVALID_ARGUMENT,
                fmt::format("peer {} is out of range [0, {})", peer, size()));
  if (peer == rank)
    throw Error(WIA_ERROR_INVALID_ARGUMENT,
                fmt::format("rank {} cannot send to or receive from itself", rank));
  if (count > 0 && buf == nullptr)
    throw Error(WIA_ERROR_INVALID_ARGUMENT,
                fmt::format("rank {}: buffer is NULL but count is {}", rank, count));
  // The core copies a message itself (one memcpy, no schedule), so both
  // ends must be host-addressable; collectives have the device engine.
  if (!all_host_accessible_)
    throw Error(WIA_ERROR_NOT_SUPPORTED,
                "point-to-point send/recv needs host-addressable device memory in this release "
                "(collectives on such devices use the device engine)");
  const int src = is_send ? rank : peer;
  const int dst = is_send ? peer : rank;
  std::shared_ptr<Message> msg;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto& posted = is_send ? sends_posted_[{src, dst}] : recvs_posted_[{src, dst}];
    const std::uint64_t n = posted++;
    auto& slot = messages_[{src, dst, n}];
    if (!slot) {
      slot = std::make_shared<Message>();
      slot->src = src, slot->dst = dst, slot->n = n;
    }
    msg = slot;
    if (is_send) {
      msg->send_buf = buf, msg->send_count = count, msg->send_dtype = dtype;
    } else {
      msg->recv_buf = buf, msg->recv_count = count, msg->recv_dtype = dtype;
    }
  }
  auto* g = new P2pStreamTask{this, msg, is_send, timeout_or_default(timeout_ms), stream};
  in_flight_.fetch_add(1);
  const Device& d = Runtime::get().device(stream->device);
  try {
    device_call(d, "launch_host_func", [&](const wia_device_ops_v1_t& o, void* ctx) {
      return o.launch_host_func(ctx, stream->ps, &DeviceCommunicator::p2p_stream_task, g);
    });
  } catch (const Error& e) {
    delete g;
    in_flight_.fetch_sub(1);
    msg->fail(e.status(), fmt::format("rank {} could not post its {}: {}", rank,
                                      is_send ? "send" : "receive", e.what()));
    p2p_signal_.notify();
    throw;
  }
}

void DeviceCommunicator::record_p2p(const P2pStreamTask& g, const Message& m,
                                    std::chrono::steady_clock::time_point started) {
  if (!profiler_.on()) return;
  // From this rank's stream reaching it to the message being delivered
  // (the receiver's copy done), on this rank's device's track.
  const std::uint64_t count = g.is_send ? m.send_count : m.recv_count;
  const wia_datatype_t dtype = g.is_send ? m.send_dtype : m.recv_dtype;
  profiler_.record_beside(g.is_send ? "send" : "recv", count * kernels::dtype_size(dtype), started,
                          std::chrono::steady_clock::now(), "host", transport_,
                          g.is_send ? m.dst : m.src, g.is_send ? m.src : m.dst, dtype);
}

void DeviceCommunicator::p2p_stream_task(void* arg) {
  std::unique_ptr<P2pStreamTask> g(static_cast<P2pStreamTask*>(arg));
  g->comm->run_p2p_stream_task(*g);
}

void DeviceCommunicator::run_p2p_stream_task(P2pStreamTask& g) {
  Message& m = *g.msg;
  const auto started = std::chrono::steady_clock::now();
  const auto deadline = started + std::chrono::milliseconds(g.timeout_ms);
  if (g.is_send) {
    m.sender_arrived.store(true, std::memory_order_release);
    p2p_signal_.notify();
    const bool ok = p2p_signal_.wait_until(
        [&] { return m.done.load(std::memory_order_acquire) || m.failed.load(); }, deadline,
        oversubscribed_);
    if (!ok)
      m.fail(WIA_ERROR_TIMEOUT,
             fmt::format("send #{} from rank {} to rank {} timed out after {} ms: rank {} has "
                         "not received it",
                         m.n, m.src, m.dst, g.timeout_ms, m.dst));
  } else {
    const bool ok = p2p_signal_.wait_until(
        [&] { return m.sender_arrived.load(std::memory_order_acquire) || m.failed.load(); },
        deadline, oversubscribed_);
    if (!ok) {
      std::uint64_t posted = 0;
      {
        std::lock_guard<std::mutex> lock(mu_);
        posted = sends_posted_[{m.src, m.dst}];
      }
      m.fail(WIA_ERROR_TIMEOUT,
             fmt::format("receive #{} on rank {} from rank {} timed out after {} ms: rank {} "
                         "posted {} send(s) to rank {} so far",
                         m.n, m.dst, m.src, g.timeout_ms, m.src, posted, m.dst));
    } else if (!m.failed.load()) {
      if (m.send_count != m.recv_count || m.send_dtype != m.recv_dtype) {
        m.fail(WIA_ERROR_MISMATCH,
               fmt::format("message #{} from rank {} to rank {}: sent {} x {}, receive posted "
                           "for {} x {}",
                           m.n, m.src, m.dst, m.send_count, kernels::dtype_name(m.send_dtype),
                           m.recv_count, kernels::dtype_name(m.recv_dtype)));
      } else if (m.recv_count > 0) {
        std::memcpy(m.recv_buf, m.send_buf, m.recv_count * kernels::dtype_size(m.recv_dtype));
      }
    }
    m.done.store(true, std::memory_order_release);
    p2p_signal_.notify();
  }
  if (m.failed.load(std::memory_order_acquire)) {
    std::string why;
    int st;
    {
      std::lock_guard<std::mutex> lock(m.mu);
      st = m.status;
      why = m.message;
    }
    g.stream->set_async_error(st, why);
    record_async_error(st, why);
    p2p_signal_.notify();
  }
  if (!m.failed.load(std::memory_order_acquire)) record_p2p(g, m, started);
  if (m.finished.fetch_add(1) + 1 == 2) {
    std::lock_guard<std::mutex> lock(mu_);
    messages_.erase({m.src, m.dst, m.n});
  }
  // Then the decrement: see DeviceCommunicator::run_stream_task.
  completion_signal_.notify();
  in_flight_.fetch_sub(1);
}

}  // namespace wia::comm
