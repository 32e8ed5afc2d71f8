// SPDX-License-Identifier: Apache-2.0
// Point to point on the process communicator: posting a send or a
// receive, and running it as one transport request on the peer's
// connection, in posting order with the rank's collectives.
#include <fmt/format.h>

#include "comm/process_internal.hpp"
#include "common/error.hpp"
#include "engine/backoff.hpp"
#include "kernels/cpu_reduce.hpp"
#include "provider/registry.hpp"
#include "provider/transport_call.hpp"
#include "runtime/device_registrations.hpp"

namespace wia::comm {

// Point to point: the n-th send from a to b meets the n-th receive on b
// from a (one transport tag for all of them, matched in order), run in
// posting order with the rank's collectives.
void ProcessCommunicator::post_p2p(int rank, int peer, bool is_send, void* buf, std::uint64_t count,
                                   wia_datatype_t dtype, std::uint32_t timeout_ms,
                                   wia_stream_s* stream, std::uint32_t tag, const char* name,
                                   const char* path, wia_mr_t mr) {
  if (rank != layout_.rank)
    throw Error(WIA_ERROR_INVALID_ARGUMENT,
                fmt::format("rank {} is not this process's rank {}", rank, layout_.rank));
  if (peer < 0 || peer >= size() || peer == rank)
    throw Error(WIA_ERROR_INVALID_ARGUMENT,
                fmt::format("rank {}: peer {} is not another rank of [0, {})", rank, peer, size()));
  if (count > 0 && buf == nullptr)
    throw Error(WIA_ERROR_INVALID_ARGUMENT,
                fmt::format("rank {}: buffer is NULL but count is {}", rank, count));
  Call call;
  call.collective = coll::Collective::kSendRecv;
  call.count = count;
  call.dtype = dtype;
  call.timeout_ms = timeout_ms;
  call.buffers.send = call.buffers.recv = static_cast<char*>(buf);
  call.tag = tag;
  call.p2p_name = name;
  call.p2p_path = path;
  call.p2p_mr = mr;
  if (!try_post_inline(call, stream, peer, is_send))
    post_stream_task(std::move(call), stream, peer, is_send);
}

void ProcessCommunicator::post_send(int rank, int peer, const void* buf, std::uint64_t count,
                                    wia_datatype_t dtype, std::uint32_t timeout_ms,
                                    wia_stream_s* stream) {
  post_p2p(rank, peer, true, const_cast<void*>(buf), count, dtype, timeout_ms, stream);
}

void ProcessCommunicator::post_recv(int rank, int peer, void* buf, std::uint64_t count,
                                    wia_datatype_t dtype, std::uint32_t timeout_ms,
                                    wia_stream_s* stream) {
  post_p2p(rank, peer, false, buf, count, dtype, timeout_ms, stream);
}

std::unique_ptr<ProcessCommunicator::RunningOperation> ProcessCommunicator::begin_p2p(
    std::uint64_t seq, const Call& call, int peer, bool is_send, Clock::time_point deadline) {
  const auto wire = wire_lock();
  std::unique_ptr<RunningOperation> r = take_spare_operation();
  r->seq = seq;
  r->mode = RunningOperation::Mode::kPointToPoint;
  r->peer = peer;
  r->is_send = is_send;
  r->buf = is_send ? call.buffers.send : call.buffers.recv;
  r->bytes = call.count * kernels::dtype_size(call.dtype);
  r->tag = call.tag;
  r->mr = call.p2p_mr;
  r->options.deadline = deadline;
  r->options.timeout_ms = call.timeout_ms ? call.timeout_ms : default_timeout_ms_;
  r->options.oversubscribed = oversubscribed_;
  return r;
}

// Point to point: one request on the peer's connection, on the
// point-to-point bit with the caller's tag below it (wia_comm_send: 0),
// matched in posting order per tag.
wia_status_t ProcessCommunicator::proceed_p2p(RunningOperation& r, Clock::time_point give_up_at,
                                              std::string& error) {
  const std::uint64_t wire_tag = (1ull << 36) | r.tag;
  const engine::NetLink& l = peers_[r.peer].link;
  // "rank 0: send of 8 B to rank 1", formatted only for a message.
  auto what = [&] {
    return fmt::format("rank {}: {} of {} B {} rank {}{}", layout_.rank,
                       r.is_send ? "send" : "receive", r.bytes, r.is_send ? "to" : "from", r.peer,
                       r.tag ? fmt::format(" (tag {})", r.tag) : std::string());
  };
  try {
    engine::Backoff backoff(r.options.oversubscribed);
    auto clock_checks = [&] {
      if (!backoff.read_clock()) return false;
      if (const std::string reason = r.control.poll(); !reason.empty())
        throw Error(WIA_ERROR_REMOTE, reason);
      if (backoff.now() > r.options.deadline)
        throw Error(WIA_ERROR_TIMEOUT,
                    r.request ? fmt::format("{} timed out after {} ms: rank {} has not posted "
                                            "the matching {}",
                                            what(), r.options.timeout_ms, r.peer,
                                            r.is_send ? "receive" : "send")
                              : fmt::format("{}: the transport had no resources for {} ms", what(),
                                            r.options.timeout_ms));
      return backoff.now() > give_up_at;
    };
    while (!r.request) {
      transport_call_lazy(*l.provider, what, [&](const wia_transport_ops_v1_t& t, void* ctx) {
        return r.is_send ? t.isend(ctx, l.conn, r.buf, r.bytes, wire_tag, r.mr, &r.request)
                         : t.irecv(ctx, l.conn, r.buf, r.bytes, wire_tag, r.mr, &r.request);
      });
      if (r.request) break;
      backoff.wait();
      if (clock_checks()) return WIA_IN_PROGRESS;
    }
    backoff.reset();
    std::uint64_t got = 0;
    for (;;) {
      std::int32_t done = 0;
      transport_call_lazy(*l.provider, what, [&](const wia_transport_ops_v1_t& t, void* ctx) {
        return t.test(ctx, r.request, &done, &got);
      });
      if (done) break;
      backoff.wait();
      if (clock_checks()) return WIA_IN_PROGRESS;
    }
    r.request = nullptr;
    if (!r.is_send && got != r.bytes)
      throw Error(WIA_ERROR_MISMATCH,
                  fmt::format("{}: rank {} sent {} B, the receive was posted for {} B (the two "
                              "calls differ in size, count or datatype)",
                              what(), r.peer, got, r.bytes));
    return WIA_SUCCESS;
  } catch (const Error& e) {
    r.request = nullptr;  // a failed request is released by the provider
    error = with_peer_reason(r, e.status(), e.what());
    break_communicator(e.status(), error);
    return e.status();
  }
}

void ProcessCommunicator::post_tagged(int peer, bool is_send, void* buf, std::uint64_t bytes,
                                      std::uint32_t tag, const char* name, const char* path,
                                      wia_stream_s* stream, wia_mr_t mr) {
  if (tag >= (1u << 31))
    throw Error(WIA_ERROR_INVALID_ARGUMENT,
                fmt::format("rank {}: tag {} is outside 0 .. 2^31-1", layout_.rank, tag));
  post_p2p(layout_.rank, peer, is_send, buf, bytes, WIA_UINT8, 0, stream, tag, name, path, mr);
}

ProcessCommunicator::DeviceMemoryPath ProcessCommunicator::device_memory_path(
    int peer, std::uint32_t iface, bool device_exports_dmabuf, std::string* why) const {
  const engine::NetLink& l = peers_[peer].link;
  if (!l.provider || !l.provider->transport()) {
    if (why) *why = fmt::format("rank {} has no transport link to rank {}", layout_.rank, peer);
    return DeviceMemoryPath::kStaged;
  }
  wia_transport_props_v1_t p{};
  p.struct_size = sizeof p;
  if (l.endpoint < 0 ||
      l.provider->transport()->endpoint_props(l.provider->ctx(), l.endpoint, &p) != WIA_SUCCESS) {
    if (why)
      *why = fmt::format("the link to rank {} over {} has no endpoint to ask", peer,
                         peers_[peer].transport);
    return DeviceMemoryPath::kStaged;
  }
  const bool takes_iface =
      (p.flags & WIA_TRANSPORT_FLAG_DEVICE_MEMORY) && (p.mem_ifaces & (1u << iface));
  if (takes_iface && (p.flags & WIA_TRANSPORT_FLAG_DMABUF)) {
    if (device_exports_dmabuf) return DeviceMemoryPath::kDmabuf;
    if (why)
      *why = fmt::format(
          "the link to rank {} runs over {}, which registers device memory through a dma-buf, "
          "and the buffer's device cannot export one (no WIA_DEVICE_CAP_DMABUF)",
          peer, peers_[peer].transport);
    return DeviceMemoryPath::kStaged;
  }
  if (takes_iface) return DeviceMemoryPath::kByAddress;
  if (why)
    *why = fmt::format(
        "the link to rank {} runs over {}, which does not take device memory of "
        "this kind",
        peer, peers_[peer].transport);
  return DeviceMemoryPath::kStaged;
}

wia_mr_t ProcessCommunicator::register_device_memory(int peer, const Allocation& a,
                                                     std::uint32_t iface,
                                                     DeviceMemoryPath path) const {
  const engine::NetLink& l = peers_[peer].link;
  try {
    return device_registrations().get(*l.provider, l.endpoint, a, iface,
                                      path == DeviceMemoryPath::kDmabuf
                                          ? DeviceRegistrations::Route::kDmabuf
                                          : DeviceRegistrations::Route::kAddress);
  } catch (const Error& e) {
    throw Error(e.status(), fmt::format("rank {}: registering device {}'s buffer for the link to "
                                        "rank {}: {}",
                                        layout_.rank, a.device, peer, e.what()));
  }
}

}  // namespace wia::comm
