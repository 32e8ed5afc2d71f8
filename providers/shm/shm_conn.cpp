// SPDX-License-Identifier: Apache-2.0
// The shm connection engine: records out of and into the two rings
// (handle_record and its steps per record type), the bounded progress
// step, and the message entry points isend, irecv, test and the inline
// pair. Everything on one connection runs under its spin lock.
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <iterator>
#include <mutex>

#include "shm.hpp"

namespace wia::shm {

// ---------------------------------------------------------------------------
// Request outcomes and connection failure (also used by shm_rma.cpp)

void complete(Request* r, std::uint64_t size) {
  r->stage = Stage::kDone;
  r->msg_size = size;
  r->status = WIA_SUCCESS;
}

void fail_request(Request* r, std::string why) {
  r->stage = Stage::kDone;
  r->status = WIA_ERROR_REMOTE;
  r->error = std::move(why);
}

void fail_conn(Conn* c, const std::string& why) {
  if (c->state == ConnState::kFailed) return;
  c->state = ConnState::kFailed;
  c->failure = why;
  if (c->sock >= 0) shutdown(c->sock, SHUT_RDWR);
  std::size_t pending = 0;
  for (Request* r = c->live; r != nullptr; r = r->live_next)
    if (r->stage != Stage::kDone) {
      fail_request(r, why);
      ++pending;
    }
  c->out_sends.clear();
  c->out_control.clear();
  c->streaming.clear();
  c->sends_waiting.clear();
  c->recvs_staged.clear();
  c->cma_recvs.clear();
  c->posted.clear();
  c->provider->log(WIA_LOG_WARN,
                   format("connection to pid %d failed (%zu pending requests failed): %s",
                          c->peer_pid, pending, why.c_str()));
}

void queue_control(Conn* c, std::uint16_t type, std::uint16_t flags, std::uint64_t tag,
                   std::uint64_t msg_size, std::uint64_t id, std::uint64_t addr) {
  c->out_control.push_back(Control{RecordHeader{type, flags, 0, tag, 0, msg_size, id, addr}});
}

Request* new_request(Conn* c, bool is_send, const void* buf, std::uint64_t size,
                     std::uint64_t tag) {
  if (c->live_count >= (1u << 16)) return nullptr;  // max_requests: the caller retries
  Request* r = c->free_requests;
  if (r != nullptr) {
    c->free_requests = r->qnext;
    --c->free_request_count;
  } else {
    r = new (std::nothrow) Request;
    if (r == nullptr) return nullptr;
  }
  r->conn = c;
  r->qnext = nullptr;
  r->is_send = is_send;
  r->stage = Stage::kQueued;
  r->buf = static_cast<std::uint8_t*>(const_cast<void*>(buf));
  r->capacity = size;
  r->tag = tag;
  r->id = 0;
  r->msg_size = 0;
  r->offset = 0;
  r->peer_id = 0;
  r->peer_addr = 0;
  r->status = WIA_SUCCESS;
  r->error.clear();
  r->live_prev = nullptr;
  r->live_next = c->live;
  if (c->live != nullptr) c->live->live_prev = r;
  c->live = r;
  ++c->live_count;
  return r;
}

wia_status_t post_check(Provider* p, Conn* c, const void* buf, std::uint64_t size,
                        const char* what) {
  if (c->state == ConnState::kConnecting)
    return p->fail(WIA_ERROR_INVALID_HANDLE,
                   format("%s on a connection that is not established yet", what));
  if (c->state == ConnState::kFailed) return p->fail(WIA_ERROR_REMOTE, c->failure);
  if (buf == nullptr && size > 0)
    return p->fail(WIA_ERROR_INVALID_ARGUMENT, format("%s: NULL buffer", what));
  return WIA_SUCCESS;
}

namespace {

// ---------------------------------------------------------------------------
// Engine (called with conn->mu held)

std::string too_small(const Conn* c, std::uint64_t msg, std::uint64_t cap, std::uint64_t tag) {
  return format("message of %" PRIu64 " bytes with tag %" PRIu64
                " from peer pid %d does not fit "
                "the receive buffer of %" PRIu64 " bytes",
                msg, tag, c->peer_pid, cap);
}

// A matched large message: pull it by CMA or ask the sender to stream it.
void start_large_recv(Conn* c, Request* r, std::uint64_t msg_size, std::uint64_t send_id,
                      std::uint64_t addr, std::uint16_t flags) {
  r->msg_size = msg_size;
  r->peer_id = send_id;
  r->offset = 0;
  if (msg_size > r->capacity) {
    fail_request(r, too_small(c, msg_size, r->capacity, r->tag));
    queue_control(c, wire::kFin, wire::kFinError, r->tag, msg_size, send_id, 0);
    return;
  }
  if ((flags & wire::kRtsCmaOk) != 0 && c->cma_readable &&
      msg_size >= c->provider->cfg.cma_threshold) {
    r->stage = Stage::kCma;
    r->peer_addr = addr;
    c->cma_recvs.push_back(r);
    return;
  }
  r->stage = Stage::kStaged;
  r->id = c->next_id++;
  c->recvs_staged.emplace(r->id, r);
  queue_control(c, wire::kCts, 0, r->tag, msg_size, send_id, r->id);
}

Request* pop_posted(Conn* c, std::uint64_t tag) { return c->posted.pop(tag); }

Unexpected* new_unexpected(Conn* c) {
  if (Unexpected* u = c->free_unexpected) {
    c->free_unexpected = u->qnext;
    --c->free_unexpected_count;
    u->qnext = nullptr;
    return u;
  }
  return new (std::nothrow) Unexpected;
}

// A consumed unexpected message: its heap buffer goes to the spares, the
// node to the free list.
void release_unexpected(Conn* c, Unexpected* u) {
  if (u->data && c->spare_buffers.size() < 32)
    c->spare_buffers.emplace_back(std::move(u->data), u->capacity);
  u->data.reset();
  u->capacity = 0;
  if (c->free_unexpected_count >= kMaxFreeUnexpected) {
    delete u;
    return;
  }
  u->qnext = c->free_unexpected;
  c->free_unexpected = u;
  ++c->free_unexpected_count;
}

void take_buffer(Conn* c, std::uint64_t len, Unexpected* u) {
  for (auto it = c->spare_buffers.rbegin(); it != c->spare_buffers.rend(); ++it)
    if (it->second >= len) {
      u->data = std::move(it->first);
      u->capacity = it->second;
      c->spare_buffers.erase(std::next(it).base());
      return;
    }
  std::uint64_t cap = 256;  // powers of two, so that buffers fit later messages
  while (cap < len) cap <<= 1;
  u->data.reset(new (std::nothrow) std::uint8_t[cap]);
  u->capacity = u->data ? cap : 0;
}

// The steps of handle_record, one per record type. Each returns false
// when the record must stay in the ring for now or the connection failed.

// Copies an EAGER payload nobody waits for out of the ring.
bool buffer_unexpected_eager(Conn* c, const RecordHeader& h, const std::uint8_t* payload) {
  // Flow control: unexpected payload is copied out of the ring up to
  // unexpected_limit; past it the record stays in the ring, which
  // stalls the sender (back-pressure) until receives are posted.
  if (c->unexpected_bytes > 0 && c->unexpected_bytes + h.len > c->provider->cfg.unexpected_limit) {
    if (!c->warned_unexpected_limit) {
      c->warned_unexpected_limit = true;
      c->provider->log(WIA_LOG_WARN,
                       format("peer pid %d: %" PRIu64 " bytes of unexpected messages buffered "
                              "(shm.unexpected_limit); holding back the sender until "
                              "receives are posted",
                              c->peer_pid, c->unexpected_bytes));
    }
    return false;
  }
  Unexpected* u = new_unexpected(c);
  if (u == nullptr) {
    fail_conn(c, "out of memory buffering an unexpected message");
    return false;
  }
  u->type = wire::kEager;
  u->flags = 0;
  u->msg_size = h.len;
  if (h.len > kInlineUnexpected) {
    take_buffer(c, h.len, u);
    if (!u->data) {
      release_unexpected(c, u);
      fail_conn(
          c, format("out of memory buffering an unexpected message of %" PRIu64 " bytes", h.len));
      return false;
    }
    std::memcpy(u->data.get(), payload, h.len);
  } else if (h.len > 0) {
    std::memcpy(u->inline_data, payload, h.len);
  }
  if (!c->unexpected.push(h.tag, u)) {
    release_unexpected(c, u);
    fail_conn(c, "out of memory queueing an unexpected message");
    return false;
  }
  c->unexpected_bytes += h.len;
  return true;
}

// A small message: to the posted receive, else recv_inline's sink, else
// buffered as unexpected.
bool on_eager(Conn* c, const RecordHeader& h, const std::uint8_t* payload) {
  if (h.msg_size != h.len) {
    fail_conn(c,
              format("corrupt EAGER record from peer pid %d: size %" PRIu64 " != length %" PRIu64,
                     c->peer_pid, h.msg_size, h.len));
    return false;
  }
  if (Request* r = pop_posted(c, h.tag)) {
    if (h.len > r->capacity) {
      fail_request(r, too_small(c, h.len, r->capacity, h.tag));
    } else {
      if (h.len > 0) std::memcpy(r->buf, payload, h.len);
      complete(r, h.len);
    }
    return true;
  }
  if (c->sink.armed && c->sink.tag == h.tag) {
    c->sink.armed = false;
    c->sink.filled = true;
    c->sink.size = h.len;
    if (h.len > 0 && h.len <= c->sink.capacity) std::memcpy(c->sink.buf, payload, h.len);
    return true;
  }
  return buffer_unexpected_eager(c, h, payload);
}

// A large message announced: matched now, or queued as unexpected.
bool on_rts(Conn* c, const RecordHeader& h) {
  if (h.len != 0 || h.msg_size == 0) {
    fail_conn(c,
              format("corrupt RTS record from peer pid %d (length %" PRIu64 ", size %" PRIu64 ")",
                     c->peer_pid, h.len, h.msg_size));
    return false;
  }
  if (Request* r = pop_posted(c, h.tag)) {
    start_large_recv(c, r, h.msg_size, h.id, h.addr, h.flags);
    return true;
  }
  Unexpected* u = new_unexpected(c);
  if (u == nullptr || !c->unexpected.push(h.tag, u)) {
    if (u != nullptr) release_unexpected(c, u);
    fail_conn(c, "out of memory queueing an unexpected RTS");
    return false;
  }
  u->type = wire::kRts;
  u->flags = h.flags;
  u->msg_size = h.msg_size;
  u->send_id = h.id;
  u->addr = h.addr;
  return true;
}

// The receiver of one of our large sends is ready: start streaming it.
bool on_cts(Conn* c, const RecordHeader& h) {
  auto it = c->sends_waiting.find(h.id);
  if (it == c->sends_waiting.end()) {
    fail_conn(c, format("corrupt CTS record from peer pid %d: unknown send id %" PRIu64,
                        c->peer_pid, h.id));
    return false;
  }
  Request* s = it->second;
  c->sends_waiting.erase(it);
  s->stage = Stage::kStreaming;
  s->peer_id = h.addr;
  s->offset = 0;
  c->streaming.push_back(s);
  return true;
}

// One chunk of a large message streamed to one of our staged receives.
bool on_data(Conn* c, const RecordHeader& h, const std::uint8_t* payload) {
  auto it = c->recvs_staged.find(h.id);
  if (it == c->recvs_staged.end() || h.addr != it->second->offset ||
      h.len > it->second->msg_size - it->second->offset || h.len == 0) {
    fail_conn(c, format("corrupt DATA record from peer pid %d: recv id %" PRIu64 ", offset %" PRIu64
                        ", length %" PRIu64,
                        c->peer_pid, h.id, h.addr, h.len));
    return false;
  }
  Request* r = it->second;
  std::memcpy(r->buf + r->offset, payload, h.len);
  r->offset += h.len;
  if (r->offset == r->msg_size) {
    c->recvs_staged.erase(it);
    complete(r, r->msg_size);
  }
  return true;
}

// The receiver has pulled one of our large sends by CMA, or refused it.
bool on_fin(Conn* c, const RecordHeader& h) {
  auto it = c->sends_waiting.find(h.id);
  if (it == c->sends_waiting.end()) {
    fail_conn(c, format("corrupt FIN record from peer pid %d: unknown send id %" PRIu64,
                        c->peer_pid, h.id));
    return false;
  }
  Request* s = it->second;
  c->sends_waiting.erase(it);
  if ((h.flags & wire::kFinError) != 0)
    fail_request(s, format("peer pid %d refused the message of %" PRIu64 " bytes with tag %" PRIu64
                           ": its receive buffer is smaller",
                           c->peer_pid, s->capacity, s->tag));
  else
    complete(s, s->capacity);
  return true;
}

// Handles one validated record. Returns false when the record must stay in
// the ring for now (unexpected-message budget spent) or the connection failed.
bool handle_record(Conn* c, const RecordHeader& h, const std::uint8_t* payload) {
  switch (h.type) {
    case wire::kPad:
      return true;
    case wire::kEager:
      return on_eager(c, h, payload);
    case wire::kRts:
      return on_rts(c, h);
    case wire::kCts:
      return on_cts(c, h);
    case wire::kData:
      return on_data(c, h, payload);
    case wire::kFin:
      return on_fin(c, h);
    default:
      return false;
  }
}

bool drain_rx(Conn* c) {
  bool work = false;
  std::string why;  // set only when a record is corrupt
  // Bounded so that one test() call stays short even under a flood.
  for (int budget = 0; budget < 512 && c->state == ConnState::kUp; ++budget) {
    RecordHeader h;
    const std::uint8_t* payload = nullptr;
    switch (c->rx.next(&h, &payload, &why)) {
      case RxRing::Peek::kEmpty:
        return work;
      case RxRing::Peek::kCorrupt:
        fail_conn(c, format("corrupt shared ring from peer pid %d: %s", c->peer_pid, why.c_str()));
        return true;
      case RxRing::Peek::kRecord:
        break;
    }
    if (!handle_record(c, h, payload)) return work;
    c->rx.consume(h);
    work = true;
  }
  return work;
}

bool flush_tx(Conn* c) {
  bool work = false;
  while (!c->out_control.empty() && c->state == ConnState::kUp) {
    RecordHeader* h = c->tx.reserve(wire::record_span(0));
    if (h == nullptr) return work;
    RecordHeader rec = c->out_control.front().header;
    rec.seq = c->tx.seq++;
    *h = rec;
    c->tx.commit(wire::record_span(0));
    c->out_control.pop_front();
    work = true;
  }
  while (!c->out_sends.empty() && c->state == ConnState::kUp) {
    Request* s = c->out_sends.front();
    const bool eager = s->capacity <= c->eager_size;
    const std::uint64_t len = eager ? s->capacity : 0;
    RecordHeader* h = c->tx.reserve(wire::record_span(len));
    if (h == nullptr) return work;
    if (eager) {
      *h = RecordHeader{wire::kEager, 0, c->tx.seq++, s->tag, len, len, 0, 0};
      if (len > 0)
        std::memcpy(reinterpret_cast<std::uint8_t*>(h) + sizeof(RecordHeader), s->buf, len);
      complete(s, len);
    } else {
      s->id = c->next_id++;
      const std::uint16_t flags = c->peer_may_read ? wire::kRtsCmaOk : 0;
      *h = RecordHeader{
          wire::kRts, flags,       c->tx.seq++, s->tag,
          0,          s->capacity, s->id,       reinterpret_cast<std::uint64_t>(s->buf)};
      s->stage = Stage::kWaitPeer;
      c->sends_waiting.emplace(s->id, s);
    }
    c->tx.commit(wire::record_span(len));
    c->out_sends.pop_front();
    work = true;
  }
  while (!c->streaming.empty() && c->state == ConnState::kUp) {
    Request* s = c->streaming.front();
    const std::uint64_t len = std::min(c->chunk_size, s->capacity - s->offset);
    RecordHeader* h = c->tx.reserve(wire::record_span(len));
    if (h == nullptr) return work;
    *h = RecordHeader{wire::kData, 0, c->tx.seq++, s->tag, len, s->capacity, s->peer_id, s->offset};
    std::memcpy(reinterpret_cast<std::uint8_t*>(h) + sizeof(RecordHeader), s->buf + s->offset, len);
    c->tx.commit(wire::record_span(len));
    s->offset += len;
    if (s->offset == s->capacity) {
      c->streaming.pop_front();
      complete(s, s->capacity);
    }
    work = true;
  }
  return work;
}

// Peeks the control socket: EOF or an error means the peer is gone.
void check_liveness(Conn* c) {
  char scratch[64];
  ssize_t n;
  // Nothing is sent after the handshake; anything that is gets discarded
  // so that it cannot hide the EOF behind it.
  do {
    n = recv(c->sock, scratch, sizeof(scratch), MSG_DONTWAIT);
  } while (n > 0);
  if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
  const std::string how = n == 0 ? std::string("closed its end of the connection")
                                 : "control socket error: " + errno_text(errno);
  // Deliver what the peer wrote before it went away, then fail the rest.
  while (drain_rx(c)) {
  }
  std::size_t still_pending = 0;
  for (Request* r = c->live; r != nullptr; r = r->live_next)
    still_pending += r->stage != Stage::kDone ? 1 : 0;
  if (still_pending > 0 || c->state == ConnState::kUp)
    fail_conn(c, format("peer pid %d %s (exited or was killed)", c->peer_pid, how.c_str()));
}

// One bounded progress step. `sending`: called by isend, which writes its
// record before looking at what came in (the peer is waiting for it).
void progress(Conn* c, bool sending = false) {
  if (c->state != ConnState::kUp) return;
  bool work = sending && flush_tx(c);
  bool got = drain_rx(c);
  if (!c->cma_recvs.empty()) got |= run_cma(c);
  // Records drained may have queued CTS/FIN or cleared sends to stream.
  if (got || !sending) work |= flush_tx(c);
  work |= got;
  if (c->state != ConnState::kUp) return;
  if (work) {
    c->idle_steps = 0;
  } else if (++c->idle_steps >= kIdleStepsPerClockRead) {
    c->idle_steps = 0;
    const std::uint64_t now = monotonic_ns();
    if (now - c->last_liveness_ns >= c->provider->cfg.liveness_interval_ns) {
      c->last_liveness_ns = now;
      check_liveness(c);
    }
  }
}

// Unlinks a request from `live` and keeps it for reuse (or frees it).
void release_request(Conn* c, Request* r) {
  if (r->live_prev != nullptr)
    r->live_prev->live_next = r->live_next;
  else
    c->live = r->live_next;
  if (r->live_next != nullptr) r->live_next->live_prev = r->live_prev;
  --c->live_count;
  if (c->free_request_count >= kMaxFreeRequests) {
    delete r;
    return;
  }
  r->stage = Stage::kDone;
  r->qnext = c->free_requests;
  c->free_requests = r;
  ++c->free_request_count;
}

// ---------------------------------------------------------------------------
// Message entry points

wia_status_t isend_impl(void* ctx, wia_conn_t conn, const void* buf, uint64_t size, uint64_t tag,
                        wia_mr_t, wia_request_t* request) {
  Provider* p = prov(ctx);
  if (conn == nullptr || request == nullptr) return WIA_ERROR_INVALID_ARGUMENT;
  Conn* c = reinterpret_cast<Conn*>(conn);
  std::lock_guard<SpinLock> lock(c->mu);
  *request = nullptr;
  if (wia_status_t st = post_check(p, c, buf, size, "isend"); st != WIA_SUCCESS) return st;
  Request* r = new_request(c, true, buf, size, tag);
  if (r == nullptr) return WIA_SUCCESS;  // no resources now: retry
  c->out_sends.push_back(r);
  progress(c, /*sending=*/true);
  *request = reinterpret_cast<wia_request_t>(r);
  return WIA_SUCCESS;
}

wia_status_t irecv_impl(void* ctx, wia_conn_t conn, void* buf, uint64_t size, uint64_t tag,
                        wia_mr_t, wia_request_t* request) {
  Provider* p = prov(ctx);
  if (conn == nullptr || request == nullptr) return WIA_ERROR_INVALID_ARGUMENT;
  Conn* c = reinterpret_cast<Conn*>(conn);
  std::lock_guard<SpinLock> lock(c->mu);
  *request = nullptr;
  // A message that arrived before the peer went away is still delivered.
  Unexpected* u = c->unexpected.front(tag);
  const bool buffered = u != nullptr && u->type == wire::kEager;
  if (!(buffered && c->state == ConnState::kFailed))
    if (wia_status_t st = post_check(p, c, buf, size, "irecv"); st != WIA_SUCCESS) return st;
  Request* r = new_request(c, false, buf, size, tag);
  if (r == nullptr) return WIA_SUCCESS;
  r->stage = Stage::kPosted;
  if (u != nullptr) {
    c->unexpected.pop(tag);
    if (u->type == wire::kEager) {
      c->unexpected_bytes -= u->msg_size;
      if (u->msg_size > size) {
        fail_request(r, too_small(c, u->msg_size, size, tag));
      } else {
        if (u->msg_size > 0) std::memcpy(buf, u->payload(), u->msg_size);
        complete(r, u->msg_size);
      }
    } else {
      start_large_recv(c, r, u->msg_size, u->send_id, u->addr, u->flags);
    }
    release_unexpected(c, u);
  } else if (!c->posted.push(tag, r)) {
    release_request(c, r);
    return p->fail(WIA_ERROR_OUT_OF_MEMORY, "irecv: out of memory queueing the receive");
  }
  progress(c);
  *request = reinterpret_cast<wia_request_t>(r);
  return WIA_SUCCESS;
}

wia_status_t test_impl(void* ctx, wia_request_t request, int32_t* done, uint64_t* size) {
  Provider* p = prov(ctx);
  if (request == nullptr || done == nullptr) return WIA_ERROR_INVALID_ARGUMENT;
  auto* r = reinterpret_cast<Request*>(request);
  Conn* c = r->conn;
  wia_status_t status;
  std::string error;
  {
    std::lock_guard<SpinLock> lock(c->mu);
    if (r->stage != Stage::kDone) progress(c);
    if (r->stage != Stage::kDone) {
      *done = 0;
      return WIA_SUCCESS;
    }
    status = r->status;
    if (size != nullptr) *size = status == WIA_SUCCESS ? r->msg_size : 0;
    if (status != WIA_SUCCESS) error.swap(r->error);
    release_request(c, r);
  }
  *done = 1;
  if (status != WIA_SUCCESS) return p->fail(status, error);
  return WIA_SUCCESS;
}

// The eager record of isend, written at once and with no request (see
// provider.h, WIA_TRANSPORT_CAP_INLINE).
wia_status_t send_inline_impl(void* ctx, wia_conn_t conn, const void* buf, uint64_t size,
                              uint64_t tag) {
  Provider* p = prov(ctx);
  if (conn == nullptr) return WIA_ERROR_INVALID_ARGUMENT;
  Conn* c = reinterpret_cast<Conn*>(conn);
  std::lock_guard<SpinLock> lock(c->mu);
  if (wia_status_t st = post_check(p, c, buf, size, "send_inline"); st != WIA_SUCCESS) return st;
  // Declined when the message would not be an EAGER record, or when
  // earlier isends still wait for ring space (it must not overtake them).
  if (size > c->eager_size || !c->out_sends.empty()) return WIA_IN_PROGRESS;
  const std::uint64_t span = wire::record_span(size);
  RecordHeader* h = c->tx.reserve(span);
  if (h == nullptr) return WIA_IN_PROGRESS;
  *h = RecordHeader{wire::kEager, 0, c->tx.seq++, tag, size, size, 0, 0};
  if (size > 0) std::memcpy(reinterpret_cast<std::uint8_t*>(h) + sizeof(RecordHeader), buf, size);
  c->tx.commit(span);
  return WIA_SUCCESS;
}

// The next message of `tag` if it is here: from the unexpected queue, or
// straight out of the ring through the connection's sink.
wia_status_t recv_inline_impl(void* ctx, wia_conn_t conn, void* buf, uint64_t capacity,
                              uint64_t tag, int32_t* done, uint64_t* size) {
  Provider* p = prov(ctx);
  if (conn == nullptr || done == nullptr) return WIA_ERROR_INVALID_ARGUMENT;
  *done = 0;
  if (buf == nullptr && capacity > 0)
    return p->fail(WIA_ERROR_INVALID_ARGUMENT, "recv_inline: NULL buffer");
  Conn* c = reinterpret_cast<Conn*>(conn);
  std::lock_guard<SpinLock> lock(c->mu);
  if (c->state == ConnState::kConnecting)
    return p->fail(WIA_ERROR_INVALID_HANDLE,
                   "recv_inline on a connection that is not established yet");
  // Matching order: an irecv of this tag posted earlier gets the next one.
  if (c->posted.front(tag) != nullptr)
    return p->fail(WIA_ERROR_NOT_SUPPORTED,
                   format("recv_inline: an irecv of tag %" PRIu64 " is pending; use irecv", tag));
  std::uint64_t got = 0;
  Unexpected* u = c->unexpected.front(tag);
  if (u == nullptr && c->state == ConnState::kUp) {
    c->sink = Conn::InlineSink{true, false, tag, static_cast<std::uint8_t*>(buf), capacity, 0};
    progress(c);
    c->sink.armed = false;
    if (c->sink.filled) {
      c->sink.filled = false;
      got = c->sink.size;
      if (got > capacity) return p->fail(WIA_ERROR_REMOTE, too_small(c, got, capacity, tag));
      if (size != nullptr) *size = got;
      *done = 1;
      return WIA_SUCCESS;
    }
    u = c->unexpected.front(tag);
  }
  if (u == nullptr) {
    // A message that arrived before the peer went away was delivered above.
    if (c->state == ConnState::kFailed) return p->fail(WIA_ERROR_REMOTE, c->failure);
    return WIA_SUCCESS;
  }
  if (u->type != wire::kEager)
    return p->fail(WIA_ERROR_NOT_SUPPORTED, format("recv_inline: the next message of tag %" PRIu64
                                                   " is a large one (%" PRIu64 " bytes); use irecv",
                                                   tag, u->msg_size));
  c->unexpected.pop(tag);
  c->unexpected_bytes -= u->msg_size;
  got = u->msg_size;
  const bool fits = got <= capacity;
  if (fits && got > 0) std::memcpy(buf, u->payload(), got);
  release_unexpected(c, u);
  if (!fits) return p->fail(WIA_ERROR_REMOTE, too_small(c, got, capacity, tag));
  if (size != nullptr) *size = got;
  *done = 1;
  return WIA_SUCCESS;
}

}  // namespace

wia_status_t isend(void* ctx, wia_conn_t conn, const void* buf, uint64_t size, uint64_t tag,
                   wia_mr_t mr, wia_request_t* request) {
  return guarded(ctx, [&] { return isend_impl(ctx, conn, buf, size, tag, mr, request); });
}
wia_status_t irecv(void* ctx, wia_conn_t conn, void* buf, uint64_t size, uint64_t tag, wia_mr_t mr,
                   wia_request_t* request) {
  return guarded(ctx, [&] { return irecv_impl(ctx, conn, buf, size, tag, mr, request); });
}
wia_status_t test(void* ctx, wia_request_t request, int32_t* done, uint64_t* size) {
  return guarded(ctx, [&] { return test_impl(ctx, request, done, size); });
}
wia_status_t send_inline(void* ctx, wia_conn_t conn, const void* buf, uint64_t size, uint64_t tag) {
  return guarded(ctx, [&] { return send_inline_impl(ctx, conn, buf, size, tag); });
}
wia_status_t recv_inline(void* ctx, wia_conn_t conn, void* buf, uint64_t capacity, uint64_t tag,
                         int32_t* done, uint64_t* size) {
  return guarded(ctx, [&] { return recv_inline_impl(ctx, conn, buf, capacity, tag, done, size); });
}

}  // namespace wia::shm
