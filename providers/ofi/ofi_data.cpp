// SPDX-License-Identifier: Apache-2.0
// The data path of the ofi provider: tagged sends and receives (direct up
// to kDirectMax, announced above it: see ofi.hpp), their completion, test()
// and the wait descriptor.
#include <cinttypes>
#include <cstdio>
#include <cstring>

#include "ofi.hpp"
#include "wia_common/host_messages.hpp"

namespace wia::ofi {

std::string size_text(std::uint64_t n) {
  char buf[48];
  if (n >= (1ull << 20) && n % (1ull << 20) == 0)
    std::snprintf(buf, sizeof(buf), "%" PRIu64 " MiB", n >> 20);
  else
    std::snprintf(buf, sizeof(buf), "%" PRIu64 " B", n);
  return buf;
}

void Endpoint::on_data_recv(Request* r, const fi_cq_tagged_entry& e) {
  Conn* c = r->conn;
  if (common::log_enabled(ctx_->host, WIA_LOG_TRACE))  // formatting costs on the data path
    ctx_->log(WIA_LOG_TRACE,
              "ofi: receive (tag 0x%" PRIx64 ", %s) completed: wire tag 0x%" PRIx64 ", %zu B%s",
              r->tag, size_text(r->capacity).c_str(), e.tag, e.len,
              r->announced ? ", payload" : "");
  auto fail_trunc = [&](std::uint64_t size) {
    r->state = Request::State::failed;
    r->status = WIA_ERROR_REMOTE;
    r->error = "ofi: a message of " + size_text(size) + " from " +
               (c != nullptr ? c->peer_text : std::string("a closed connection")) +
               " does not fit the " + size_text(r->capacity) + " receive (tag " +
               std::to_string(r->tag) + "); nothing was written past the buffer";
  };
  if (r->announced) {  // the bulk part of an announced message
    if (r->truncated)
      fail_trunc(r->announced_size);
    else {
      r->state = Request::State::done;
      r->size = e.len;
    }
    r->scratch.reset();
    finish(r);
    return;
  }
  // A direct message, or (rendezvous mode) a framed one: the payload
  // after its header.
  auto deliver = [&](const char* from, std::uint64_t len) {
    if (len > r->capacity) {
      fail_trunc(len);
    } else if (r->device && len > 0) {
      land_in_device(r, from, len);  // the CPU never writes device memory
      return;
    } else {
      if (len > 0) std::memcpy(r->buf, from, len);
      r->state = Request::State::done;
      r->size = len;
    }
    finish(r);
  };
  if ((e.tag & kAnnounceBit) == 0) {
    deliver(r->bounce.get(), e.len);
    return;
  }
  Announce a{};
  if (e.len >= sizeof(a)) std::memcpy(&a, r->bounce.get(), sizeof(a));
  if (a.magic == kAnnounceMagic && (a.flags & kAnnounceInline) != 0 &&
      a.size == e.len - sizeof(a)) {
    deliver(r->bounce.get() + sizeof(a), a.size);
    return;
  }
  give_bounce(r);
  if (e.len != sizeof(a) || a.magic != kAnnounceMagic || c == nullptr) {
    if (c != nullptr) fail_conn(c, "ofi: " + c->peer_text + " sent a malformed message header");
    r->state = Request::State::failed;
    r->status = WIA_ERROR_REMOTE;
    r->error = c != nullptr ? c->failure : "ofi: connection closed";
    finish(r);
    return;
  }
  if (c->failed && (a.flags & kAnnounceWantsCts) != 0) {
    // The payload waits for a clear-to-send that a peer gone can no longer
    // act on.
    r->state = Request::State::failed;
    r->status = WIA_ERROR_REMOTE;
    r->error = c->failure;
    finish(r);
    return;
  }
  r->announced = true;
  r->announced_size = a.size;
  char* into = r->buf;
  if (a.size > r->capacity) {
    if (a.size > kMaxDrain) {
      fail_conn(c, "ofi: " + c->peer_text + " sent a message of " + size_text(a.size) + " to a " +
                       size_text(r->capacity) + " receive; too large to drain");
      r->state = Request::State::failed;
      r->status = WIA_ERROR_REMOTE;
      r->error = c->failure;
      finish(r);
      return;
    }
    r->truncated = true;
    r->scratch.reset(new char[a.size]);
    into = r->scratch.get();
  }
  void* desc = r->truncated ? nullptr : r->desc;
  const ssize_t rc = fi_trecv(ep, into, a.size, desc, FI_ADDR_UNSPEC,
                              data_tag(c->id(), r->tag) | kBulkBit, 0, &r->fctx);
  if (rc != 0) {
    fail_conn(c, "ofi: fi_trecv of the payload of a " + size_text(a.size) + " message from " +
                     c->peer_text + ": " + ctx_->fi_error(static_cast<int>(rc)));
    r->state = Request::State::failed;
    r->status = WIA_ERROR_REMOTE;
    r->error = c->failure;
    finish(r);
    return;
  }
  r->in_fabric = true;
  // The payload's receive is posted: now the sender may send it.
  if ((a.flags & kAnnounceWantsCts) != 0 &&
      send_ctl(c, c->addr, ctl_tag(c->peer_id), CtlKind::cts, a.send_id) != WIA_SUCCESS)
    fail_conn(c, "ofi: cannot send clear-to-send to " + c->peer_text);
}

// A message for a receive into device memory arrived in the bounce buffer
// (every receive is posted into one: ofi.hpp). The fabric moves it in: a
// receive of the exact size posted straight into the device buffer with its
// registration's descriptor (FI_MR_HMEM), fed by a send of the bounce from
// this endpoint to itself. libfabric copies with the device's own API (or
// its NIC's DMA), which the CPU cannot do on device memory. The receive's
// completion is the message's: it is marked announced, so on_data_recv
// finishes it with that completion's size. Costs one local message per
// small device receive; large ones are announced and their payload is
// received straight into the device buffer (on_data_recv).
void Endpoint::land_in_device(Request* r, const char* from, std::uint64_t len) {
  if (self_addr_ == FI_ADDR_UNSPEC) {
    const int rc = fi_av_insert(av, name, 1, &self_addr_, 0, nullptr);
    if (rc != 1) {
      self_addr_ = FI_ADDR_UNSPEC;
      r->state = Request::State::failed;
      r->status = WIA_ERROR_IO;
      r->error = "ofi: cannot insert " + addr_text(name) + " (this endpoint) into its own AV to " +
                 "move a " + size_text(len) +
                 " message into device memory: " + ctx_->fi_error(rc < 0 ? rc : -FI_EINVAL);
      finish(r);
      return;
    }
  }
  r->announced = true;
  Request* h = new_request(Request::Kind::ctl_send, nullptr);
  h->user_gone = true;
  h->is_send = true;
  h->loop_target = r;
  h->buf = const_cast<char*>(from);
  h->size = len;
  h->tag = loop_tag(next_loop_seq_++);
  r->loop_send = h;
  post_loop(h);
}

void Endpoint::post_loop(Request* h) {
  Request* r = h->loop_target;
  // The receive was closed, cancelled or failed before its loop got
  // going: nothing more to post (its buffer may be gone).
  if (r->conn == nullptr || r->state != Request::State::pending) {
    fail_loop(h, "");
    return;
  }
  if (!r->in_fabric) {
    const ssize_t rc = fi_trecv(ep, r->buf, h->size, r->desc, FI_ADDR_UNSPEC, h->tag, 0, &r->fctx);
    if (rc == -FI_EAGAIN) {
      loop_retry_.push_back(h);
      return;
    }
    if (rc != 0) {
      fail_loop(h, "fi_trecv into device memory: " + ctx_->fi_error(static_cast<int>(rc)));
      return;
    }
    r->in_fabric = true;
  }
  const ssize_t rc = fi_tsend(ep, h->buf, h->size, nullptr, self_addr_, h->tag, &h->fctx);
  if (rc == -FI_EAGAIN) {
    loop_retry_.push_back(h);
    return;
  }
  if (rc != 0) {
    fail_loop(h, "fi_tsend to this endpoint itself: " + ctx_->fi_error(static_cast<int>(rc)));
    return;
  }
  h->in_fabric = true;
}

void Endpoint::fail_loop(Request* h, const std::string& why) {
  Request* r = h->loop_target;
  h->loop_target = nullptr;
  r->loop_send = nullptr;
  if (!why.empty() && r->state == Request::State::pending) {
    r->state = Request::State::failed;
    r->status = WIA_ERROR_IO;
    r->error = "ofi: moving a " + size_text(h->size) + " message from " +
               (r->conn != nullptr ? r->conn->peer_text : std::string("a closed connection")) +
               " into device memory (tag " + std::to_string(r->tag) + ") on " + info_->prov + "/" +
               info_->domain + ": " + why;
    // A posted receive ends with FI_ECANCELED (on_error keeps this error).
    if (r->in_fabric) fi_cancel(&ep->fid, &r->fctx);
  }
  finish(h);
  finish(r);
}

void Endpoint::on_cts(Conn* c, std::uint64_t send_id) {
  auto it = c->awaiting_cts.find(send_id);
  if (it == c->awaiting_cts.end()) {
    ctx_->log(WIA_LOG_WARN, "ofi: %s sent clear-to-send for send %" PRIu64 ", which is not waiting",
              c->peer_text.c_str(), send_id);
    return;
  }
  released_.push_back(it->second);
  c->awaiting_cts.erase(it);
  send_released();
}

void Endpoint::send_released() {
  // In CTS order, so two payloads of one tag land in the receives posted
  // for them in that order; the first that meets -FI_EAGAIN waits for the
  // next progress pass and holds the rest behind it.
  while (!released_.empty()) {
    Request* r = released_.front();
    Conn* c = r->conn;
    const ssize_t rc = fi_tsend(ep, r->buf, r->size, r->desc, c->addr,
                                data_tag(c->peer_id, r->tag) | kBulkBit, &r->fctx);
    if (rc == -FI_EAGAIN) return;
    released_.pop_front();
    if (rc == 0) {
      r->in_fabric = true;
      continue;
    }
    fail_conn(c, "ofi: cannot send the payload of a " + size_text(r->size) + " message to " +
                     c->peer_text +
                     " after its clear-to-send: " + ctx_->fi_error(static_cast<int>(rc)));
  }
}

void Endpoint::forget_released(Conn* c) {
  c->awaiting_cts.clear();
  for (auto it = released_.begin(); it != released_.end();)
    it = (*it)->conn == c ? released_.erase(it) : it + 1;
}

// --- data -----------------------------------------------------------------------

wia_status_t Endpoint::local_desc(void* buf, std::uint64_t len, MrHandle* mr, MrEntry** auto_mr,
                                  void** desc) {
  *auto_mr = nullptr;
  *desc = mr != nullptr ? mr->entry->desc : nullptr;
  if (*desc != nullptr || !mr_local || len == 0) return WIA_SUCCESS;
  const wia_status_t st = reg(buf, len, WIA_MEM_IFACE_HOST, 0, auto_mr);
  if (st == WIA_SUCCESS) *desc = (*auto_mr)->desc;
  return st;
}

wia_status_t Endpoint::post(Conn* c, bool send, void* buf, std::uint64_t size, std::uint64_t tag,
                            MrHandle* mr, wia_request_t* out) {
  *out = nullptr;
  // After the peer's CLOSE a receive is still posted: the peer may have
  // sent its message just before closing (a last acknowledgement), and it
  // waits in the fabric's unexpected queue. The receive is cancelled right
  // after it is posted (below): one that matched completes, one that did
  // not fails with the close.
  const bool after_close = c->failed && c->peer_closed && !send;
  if (c->failed && !after_close) return ctx_->fail(WIA_ERROR_REMOTE, "%s", c->failure.c_str());
  if (!c->established)
    return ctx_->fail(WIA_ERROR_INVALID_HANDLE, "ofi: %s on a connection still being set up",
                      send ? "isend" : "irecv");
  if (tag > kUserTagMask)
    return ctx_->fail(WIA_ERROR_INVALID_ARGUMENT,
                      "ofi: tag 0x%" PRIx64 " does not fit the %u tag bits this transport has", tag,
                      kUserTagBits);
  if (send && size > info_->max_msg)
    return ctx_->fail(WIA_ERROR_INVALID_ARGUMENT,
                      "ofi: a message of %s to %s exceeds the largest message of %s/%s, %s "
                      "(fabric max_msg_size, or ofi.max_message)",
                      size_text(size).c_str(), c->peer_text.c_str(), info_->prov.c_str(),
                      info_->domain.c_str(), size_text(info_->max_msg).c_str());
  if (buf == nullptr && size > 0)
    return ctx_->fail(WIA_ERROR_INVALID_ARGUMENT, "ofi: %s of %s at NULL", send ? "isend" : "irecv",
                      size_text(size).c_str());
  // Device memory (a registration with a device interface, FI_HMEM): the
  // CPU must not read or write it, so no inject, no framing in a bounce
  // buffer, no copy out of one; the fabric gets the registration's
  // descriptor with every transfer. (A zero-byte message touches no
  // memory: it travels as host memory does.)
  const bool device = mr != nullptr && mr->entry->iface != WIA_MEM_IFACE_HOST && size > 0;
  if (device) {
    const auto at = reinterpret_cast<std::uintptr_t>(buf);
    if (at < mr->entry->base || at - mr->entry->base > mr->entry->len ||
        size > mr->entry->len - (at - mr->entry->base))
      return ctx_->fail(WIA_ERROR_INVALID_ARGUMENT,
                        "ofi: %s of %s at %p with %s: the buffer is not inside its device "
                        "registration [%p, +%s)",
                        send ? "isend" : "irecv", size_text(size).c_str(), buf,
                        c->peer_text.c_str(), reinterpret_cast<void*>(mr->entry->base),
                        size_text(mr->entry->len).c_str());
  }
  // A small send whose wire message fits the fabric's inject size: no
  // registration, no bounce, no completion to reap (post_inject).
  if (send && !device && size <= kDirectMax &&
      size + (rendezvous ? sizeof(Announce) : 0) <= inject_size)
    return post_inject(c, buf, size, tag, out);
  std::uint64_t len = send ? size : std::min(size, info_->max_msg);
  MrEntry* auto_mr = nullptr;
  void* desc = nullptr;
  if (const wia_status_t st = local_desc(buf, len, mr, &auto_mr, &desc); st != WIA_SUCCESS)
    return st;
  Request* r = new_request(Request::Kind::data, c);
  r->is_send = send;
  r->capacity = size;
  r->size = size;
  r->tag = tag;
  r->auto_mr = auto_mr;
  r->buf = static_cast<char*>(buf);
  r->desc = desc;
  r->device = device;
  void* into = buf;
  std::uint64_t into_len = len;
  // Rendezvous mode: every message carries the announce bit, and receives
  // match it exactly (ofi.hpp says why).
  const std::uint64_t wire_tag = send ? data_tag(c->peer_id, tag) | (rendezvous ? kAnnounceBit : 0)
                                      : data_tag(c->id(), tag) | (rendezvous ? kAnnounceBit : 0);
  const std::uint64_t ignore = rendezvous ? 0 : kAnnounceBit;
  if (!send) {
    // Every receive lands in a bounce buffer first: a direct message is
    // copied out (at most kDirectMax bytes), an announce header stays
    // private (the caller's buffer may be shared by several receives, and
    // a payload landing there must not be read as a header).
    r->bounce = take_bounce();
    into = r->bounce.get();
    into_len = rendezvous ? kBounceSize : kDirectMax;
    desc = nullptr;
  } else if (rendezvous && size <= kDirectMax && !device) {
    // One framed message: the header, then the payload, from a bounce.
    // (From device memory it is announced instead, below: the payload is
    // not copied.)
    r->bounce = take_bounce();
    const Announce a{kAnnounceMagic, kAnnounceInline, size, 0};
    std::memcpy(r->bounce.get(), &a, sizeof(a));
    if (size > 0) std::memcpy(r->bounce.get() + sizeof(a), buf, size);
    buf = r->bounce.get();
    len = size + sizeof(a);
    desc = nullptr;
  }
  const bool announce = send && (size > kDirectMax || (device && rendezvous));
  auto give_up = [&](ssize_t rc) -> wia_status_t {
    if (common::log_enabled(ctx_->host, WIA_LOG_TRACE))
      ctx_->log(WIA_LOG_TRACE, "ofi: %s of %s (tag 0x%" PRIx64 ") with %s not taken: %s",
                send ? "send" : "receive", size_text(size).c_str(), tag, c->peer_text.c_str(),
                ctx_->fi_error(static_cast<int>(rc)).c_str());
    r->user_gone = true;
    finish(r);
    if (rc == -FI_EAGAIN) return WIA_SUCCESS;  // no resources now: the core retries
    return ctx_->fail(WIA_ERROR_REMOTE, "ofi: %s of %s (tag 0x%" PRIx64 ") with %s: %s",
                      send ? "fi_tsend" : "fi_trecv", size_text(size).c_str(), tag,
                      c->peer_text.c_str(), ctx_->fi_error(static_cast<int>(rc)).c_str());
  };
  Request* h = nullptr;
  if (announce) {
    // The header goes first: the fabric delivers in order, and a payload
    // sent ahead of it could hold the connection (rxm's and shm's segmented
    // paths wait for their receive) so that the header never arrives.
    h = new_request(Request::Kind::ctl_send, nullptr);
    h->user_gone = true;
    h->to = c->addr;
    h->tag = data_tag(c->peer_id, tag) | kAnnounceBit;
    h->owner_id = c->id();
    h->ctl_len = sizeof(Announce);
    if (rendezvous) r->send_id = next_send_id_++;
    const Announce a{kAnnounceMagic, rendezvous ? kAnnounceWantsCts : 0, size, r->send_id};
    std::memcpy(&h->msg, &a, sizeof(a));
    ssize_t rc = fi_tsend(ep, &h->msg, sizeof(Announce), nullptr, h->to, h->tag, &h->fctx);
    if (rc == -FI_EAGAIN) {
      progress();
      rc = fi_tsend(ep, &h->msg, sizeof(Announce), nullptr, h->to, h->tag, &h->fctx);
    }
    if (rc != 0) {
      finish(h);
      return give_up(rc);
    }
    h->in_fabric = true;
    if (rendezvous) {  // the payload goes when the receiver's CTS comes (on_cts)
      c->awaiting_cts[r->send_id] = r;
      c->add_pending(r);
      *out = reinterpret_cast<wia_request_t>(r);
      return WIA_SUCCESS;
    }
  }
  // Once a header is out, its payload must follow: -FI_EAGAIN is then
  // waited out (progress frees room) for up to a second. The clock is read
  // only then: a post that goes through at once (every small receive)
  // costs no clock_gettime.
  std::uint64_t until = 0;
  for (int attempt = 0;; ++attempt) {
    const ssize_t rc =
        send ? fi_tsend(ep, buf, len, desc, c->addr,
                        announce ? data_tag(c->peer_id, tag) | kBulkBit : wire_tag, &r->fctx)
             : fi_trecv(ep, into, into_len, desc, FI_ADDR_UNSPEC, wire_tag, ignore, &r->fctx);
    if (rc == 0) break;
    if (rc == -FI_EAGAIN && announce && until == 0) until = ctx_->now_ns() + 1000000000ull;
    if (rc == -FI_EAGAIN && (attempt == 0 || (announce && ctx_->now_ns() < until))) {
      progress();  // completions free send and receive slots
      continue;
    }
    if (announce) {
      fail_conn(c, "ofi: cannot send the payload of a " + size_text(size) + " message to " +
                       c->peer_text + " after its header: " + ctx_->fi_error(static_cast<int>(rc)));
      r->state = Request::State::failed;
      r->status = WIA_ERROR_REMOTE;
      r->error = c->failure;
      c->add_pending(r);
      *out = reinterpret_cast<wia_request_t>(r);
      return WIA_SUCCESS;
    }
    return give_up(rc);
  }
  r->in_fabric = true;
  c->add_pending(r);
  // Matched already (the fabric matches its unexpected queue when the
  // receive is posted): fi_cancel finds nothing and the receive completes.
  // Otherwise it ends with FI_ECANCELED and the connection's failure.
  if (after_close) fi_cancel(&ep->fid, &r->fctx);
  *out = reinterpret_cast<wia_request_t>(r);
  return WIA_SUCCESS;
}

wia_status_t Endpoint::post_inject(Conn* c, const void* buf, std::uint64_t size, std::uint64_t tag,
                                   wia_request_t* out) {
  // fi_tinject copies the message before it returns and reports no
  // completion, so the request is done at once; it is still a request
  // (the ABI returns one) and sits in c->pending until test() reports it,
  // so close() releases it if the core never does. The fabric keeps
  // FI_ORDER_SAS between injected and posted sends.
  const void* wire = buf;
  std::uint64_t len = size;
  alignas(Announce) char frame[kBounceSize];
  if (rendezvous) {  // framed: header and payload in one message (ofi.hpp)
    const Announce a{kAnnounceMagic, kAnnounceInline, size, 0};
    std::memcpy(frame, &a, sizeof(a));
    if (size > 0) std::memcpy(frame + sizeof(a), buf, size);
    wire = frame;
    len = size + sizeof(a);
  }
  const std::uint64_t wire_tag = data_tag(c->peer_id, tag) | (rendezvous ? kAnnounceBit : 0);
  ssize_t rc = fi_tinject(ep, wire, len, c->addr, wire_tag);
  if (rc == -FI_EAGAIN) {
    progress();  // completions free send slots
    rc = fi_tinject(ep, wire, len, c->addr, wire_tag);
  }
  if (rc != 0) {
    if (common::log_enabled(ctx_->host, WIA_LOG_TRACE))
      ctx_->log(WIA_LOG_TRACE, "ofi: inject of %s (tag 0x%" PRIx64 ") to %s not taken: %s",
                size_text(size).c_str(), tag, c->peer_text.c_str(),
                ctx_->fi_error(static_cast<int>(rc)).c_str());
    if (rc == -FI_EAGAIN) return WIA_SUCCESS;  // no resources now: the core retries
    return ctx_->fail(WIA_ERROR_REMOTE, "ofi: fi_tinject of %s (tag 0x%" PRIx64 ") to %s: %s",
                      size_text(size).c_str(), tag, c->peer_text.c_str(),
                      ctx_->fi_error(static_cast<int>(rc)).c_str());
  }
  Request* r = new_request(Request::Kind::data, c);
  r->is_send = true;
  r->state = Request::State::done;
  r->capacity = size;
  r->size = size;
  r->tag = tag;
  c->add_pending(r);
  *out = reinterpret_cast<wia_request_t>(r);
  return WIA_SUCCESS;
}

wia_status_t Endpoint::test(Request* r, int32_t* done, std::uint64_t* size) {
  // progress() also sweeps the liveness of connections with pending
  // requests, this one's included.
  if (r->state == Request::State::pending) progress();
  if (r->state == Request::State::pending) {
    *done = 0;
    return WIA_SUCCESS;
  }
  *done = 1;
  if (size != nullptr) *size = r->state == Request::State::done ? r->size : 0;
  if (r->conn != nullptr) r->conn->remove_pending(r);
  r->user_gone = true;
  const wia_status_t status = r->state == Request::State::done ? WIA_SUCCESS : r->status;
  const std::string why = r->error;
  finish(r);
  if (status != WIA_SUCCESS) return ctx_->fail(status, "%s", why.c_str());
  return WIA_SUCCESS;
}

wia_status_t Endpoint::wait_fds(Conn* c, pollfd* fds, std::uint32_t capacity,
                                std::uint32_t* count) {
  *count = 0;
  if (wait_fd < 0 || c->failed || !c->established || !retry_.empty() || !released_.empty() ||
      !loop_retry_.empty() || capacity == 0)
    return WIA_IN_PROGRESS;
  fid* f = &cq->fid;
  if (fi_trywait(fabric, &f, 1) != 0) return WIA_IN_PROGRESS;  // completions are waiting
  fds[0] = pollfd{wait_fd, POLLIN, 0};
  *count = 1;
  return WIA_SUCCESS;
}

}  // namespace wia::ofi
