// SPDX-License-Identifier: Apache-2.0
// Connections over one connectionless RDM endpoint (T1 and T3 in
// docs/provider-abi.md): connect/accept by control messages, tagged sends
// and receives whose wire tag carries the receiver's connection id,
// progress from the CQ, and the ends of a connection (close, a peer that
// closed, a peer process that went away).
#include <signal.h>
#include <unistd.h>

#include <cinttypes>
#include <cstdio>
#include <cstring>

#include "ofi.hpp"

namespace wia::ofi {

std::uint64_t Endpoint::new_id() { return next_id_ <= kMaxId ? next_id_++ : 0; }

// Under AddressSanitizer a pooled request is poisoned while it is free, so
// a handle used after test() reported it (or after close) is still caught
// as it was when requests were deleted.
#if defined(__SANITIZE_ADDRESS__)
#define WIA_OFI_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define WIA_OFI_ASAN 1
#endif
#endif
#ifdef WIA_OFI_ASAN
}  // namespace wia::ofi
#include <sanitizer/asan_interface.h>
namespace wia::ofi {
#define WIA_OFI_POISON(p) ASAN_POISON_MEMORY_REGION((p), sizeof(Request))
#define WIA_OFI_UNPOISON(p) ASAN_UNPOISON_MEMORY_REGION((p), sizeof(Request))
#else
#define WIA_OFI_POISON(p) static_cast<void>(p)
#define WIA_OFI_UNPOISON(p) static_cast<void>(p)
#endif

namespace {
constexpr std::size_t kSlabRequests = 64;
}

Request* Endpoint::new_request(Request::Kind kind, Conn* c) {
  if (free_.empty()) {
    slabs_.emplace_back(new Request[kSlabRequests]);
    Request* slab = slabs_.back().get();
    free_.reserve(slabs_.size() * kSlabRequests);
    for (std::size_t i = kSlabRequests; i-- > 0;) {
      free_.push_back(&slab[i]);
      WIA_OFI_POISON(&slab[i]);
    }
  }
  Request* r = free_.back();
  free_.pop_back();
  WIA_OFI_UNPOISON(r);
  r->kind = kind;
  r->conn = c;
  return r;
}

void Endpoint::release_all_requests() {
  for (Request* r : free_) WIA_OFI_UNPOISON(r);
  free_.clear();
  slabs_.clear();
}

std::unique_ptr<char[]> Endpoint::take_bounce() {
  if (bounce_pool_.empty()) return std::unique_ptr<char[]>(new char[kBounceSize]);
  std::unique_ptr<char[]> b = std::move(bounce_pool_.back());
  bounce_pool_.pop_back();
  return b;
}

void Endpoint::give_bounce(Request* r) {
  if (r->bounce == nullptr) return;
  if (bounce_pool_.size() < 1024) bounce_pool_.push_back(std::move(r->bounce));
  r->bounce.reset();
}

void Endpoint::finish(Request* r) {
  // A receive into device memory also waits for its loop send, which
  // reads its bounce buffer (land_in_device).
  if (r->in_fabric || r->loop_send != nullptr) return;
  give_bounce(r);
  if (r->auto_mr != nullptr) {
    unreg(r->auto_mr);
    r->auto_mr = nullptr;
  }
  if (!r->user_gone) return;
  *r = Request{};  // the default state, and the error text and scratch freed
  free_.push_back(r);
  WIA_OFI_POISON(r);
}

std::string Endpoint::addr_text(const void* raw) const {
  char buf[160] = "?";
  std::size_t len = sizeof(buf);
  if (fi_av_straddr(av, raw, buf, &len) == nullptr) return "?";
  buf[sizeof(buf) - 1] = '\0';
  return buf;
}

void Endpoint::fill_ctl(CtlMsg& m, CtlKind kind, std::uint64_t conn_id,
                        std::uint64_t cookie) const {
  std::memset(&m, 0, sizeof(m));
  m.magic = kCtlMagic;
  m.kind = kind;
  m.conn_id = conn_id;
  m.cookie = cookie;
  m.pid = self_pid_;
  m.start_time = self_start_time_;
  std::memcpy(m.boot_id, self_boot_id_, sizeof(m.boot_id));
  m.addrlen = static_cast<std::uint16_t>(namelen);
  std::memcpy(m.addr, name, namelen);
}

wia_status_t Endpoint::post_ctl(Request* r) {
  const bool send = r->kind == Request::Kind::ctl_send;
  const ssize_t rc =
      send ? fi_tsend(ep, &r->msg, r->ctl_len, nullptr, r->to, r->tag, &r->fctx)
           : fi_trecv(ep, &r->msg, sizeof(CtlMsg), nullptr, FI_ADDR_UNSPEC, r->tag, 0, &r->fctx);
  if (rc == -FI_EAGAIN) {
    retry_.push_back(r);
    return WIA_SUCCESS;
  }
  if (rc != 0) {
    r->user_gone = true;
    finish(r);
    return ctx_->fail(WIA_ERROR_REMOTE, "ofi: %s of a control message: %s",
                      send ? "fi_tsend" : "fi_trecv", ctx_->fi_error(static_cast<int>(rc)).c_str());
  }
  r->in_fabric = true;
  return WIA_SUCCESS;
}

wia_status_t Endpoint::send_ctl(Conn* c, fi_addr_t to, std::uint64_t tag, CtlKind kind,
                                std::uint64_t cookie) {
  Request* r = new_request(Request::Kind::ctl_send, nullptr);
  r->user_gone = true;
  r->to = to;
  r->tag = tag;
  r->owner_id = c->id();
  fill_ctl(r->msg, kind, c->id(), cookie);
  return post_ctl(r);
}

Conn* Endpoint::make_conn(const void* raw, std::uint64_t id, std::string* error) {
  if (id == 0) {
    *error = "ofi: out of connection ids on this endpoint";
    return nullptr;
  }
  fi_addr_t addr = FI_ADDR_UNSPEC;
  const int rc = fi_av_insert(av, raw, 1, &addr, 0, nullptr);
  if (rc != 1) {
    *error =
        "ofi: fi_av_insert of " + addr_text(raw) + ": " + ctx_->fi_error(rc < 0 ? rc : -FI_EINVAL);
    return nullptr;
  }
  auto* c = new Conn(this, id);
  c->addr = addr;
  c->peer_text = addr_text(raw);
  c->ctl_recv = new_request(Request::Kind::ctl_recv, c);
  c->ctl_recv->user_gone = true;
  c->ctl_recv->tag = ctl_tag(id);
  c->ctl_recv->owner_id = id;
  if (post_ctl(c->ctl_recv) != WIA_SUCCESS) {
    *error = "ofi: cannot post the control receive of a new connection";
    c->ctl_recv = nullptr;
    delete c;
    return nullptr;
  }
  conns_[id] = c;
  return c;
}

// --- listen / connect / accept ------------------------------------------------

wia_status_t Endpoint::listen(void* handle, Listener** out) {
  if (namelen > kMaxAddr)
    return ctx_->fail(WIA_ERROR_NOT_SUPPORTED,
                      "ofi: the address of %s/%s is %zu bytes; the connection handle holds %zu",
                      info_->prov.c_str(), info_->domain.c_str(), namelen, kMaxAddr);
  auto l = std::make_unique<Listener>();
  l->ep = this;
  l->id = new_id();
  if (l->id == 0) return ctx_->fail(WIA_ERROR_OUT_OF_MEMORY, "ofi: out of listener ids");
  l->recv = new_request(Request::Kind::listen_recv, nullptr);
  l->recv->user_gone = true;
  l->recv->listener = l.get();
  l->recv->tag = listen_tag(l->id);
  const wia_status_t st = post_ctl(l->recv);
  if (st != WIA_SUCCESS) return st;
  WireHandle h{};
  h.magic = kHandleMagic;
  h.layout = kLayout;
  h.addrlen = static_cast<std::uint16_t>(namelen);
  h.listener_id = l->id;
  std::memcpy(h.addr, name, namelen);
  std::memcpy(handle, &h, sizeof(h));
  listeners_[l->id] = l.get();
  ctx_->log(WIA_LOG_DEBUG, "ofi: listener %" PRIu64 " on %s/%s at %s", l->id, info_->prov.c_str(),
            info_->domain.c_str(), addr_text(name).c_str());
  *out = l.release();
  return WIA_SUCCESS;
}

wia_status_t Endpoint::connect(const void* handle, std::uint64_t cookie, Conn** conn) {
  WireHandle h;
  std::memcpy(&h, handle, sizeof(h));
  if (h.magic != kHandleMagic)
    return ctx_->fail(WIA_ERROR_INVALID_ARGUMENT,
                      "ofi: connect: the handle is not an ofi listen handle (magic 0x%08x)",
                      h.magic);
  if (h.layout != kLayout || h.addrlen == 0 || h.addrlen > kMaxAddr || h.listener_id == 0 ||
      h.listener_id > kMaxId)
    return ctx_->fail(
        WIA_ERROR_INVALID_ARGUMENT,
        "ofi: connect: malformed handle (layout %u, address %u bytes, listener %" PRIu64 ")",
        h.layout, h.addrlen, h.listener_id);
  if (h.addrlen != namelen)
    return ctx_->fail(WIA_ERROR_INVALID_ARGUMENT,
                      "ofi: connect: the handle's address is %u bytes, %s/%s uses %zu: the "
                      "listener runs another fabric provider",
                      h.addrlen, info_->prov.c_str(), info_->domain.c_str(), namelen);
  std::string error;
  Conn* c = make_conn(h.addr, new_id(), &error);
  if (c == nullptr) return ctx_->fail(WIA_ERROR_REMOTE, "%s", error.c_str());
  c->deadline_ns =
      ctx_->now_ns() + static_cast<std::uint64_t>(ctx_->params.connect_timeout_ms) * 1000000u;
  const wia_status_t st = send_ctl(c, c->addr, listen_tag(h.listener_id), CtlKind::connect, cookie);
  if (st != WIA_SUCCESS) {
    close(c);
    return st;
  }
  *conn = c;
  return continue_connect(c);
}

wia_status_t Endpoint::continue_connect(Conn* c) {
  progress();
  if (c->failed) return ctx_->fail(WIA_ERROR_REMOTE, "%s", c->failure.c_str());
  if (c->established) return WIA_SUCCESS;
  if (ctx_->now_ns() > c->deadline_ns)
    return ctx_->fail(WIA_ERROR_TIMEOUT,
                      "ofi: connect to %s: no answer within %" PRId64
                      " ms (ofi.connect_timeout_ms)",
                      c->peer_text.c_str(), ctx_->params.connect_timeout_ms);
  return WIA_IN_PROGRESS;
}

wia_status_t Endpoint::accept(Listener* l, std::uint64_t* cookie, Conn** conn) {
  progress();
  if (l->ready.empty()) return WIA_IN_PROGRESS;
  *conn = l->ready.front().release();
  *cookie = l->cookies.front();
  l->ready.erase(l->ready.begin());
  l->cookies.erase(l->cookies.begin());
  return WIA_SUCCESS;
}

void Endpoint::on_connect_msg(Listener* l, const CtlMsg& m) {
  if (m.magic != kCtlMagic || m.kind != CtlKind::connect || m.addrlen != namelen) {
    ctx_->log(WIA_LOG_WARN, "ofi: listener %" PRIu64 " ignored a malformed connect message", l->id);
    return;
  }
  std::string error;
  Conn* c = make_conn(m.addr, new_id(), &error);
  if (c == nullptr) {
    ctx_->log(WIA_LOG_WARN, "ofi: listener %" PRIu64 " dropped a connect: %s", l->id,
              error.c_str());
    return;
  }
  c->peer_id = m.conn_id;
  c->peer = Peer{m.pid, m.start_time, std::memcmp(self_boot_id_, m.boot_id, 16) == 0};
  c->peer_text += " (pid " + std::to_string(m.pid) + ")";
  c->established = true;
  if (send_ctl(c, c->addr, ctl_tag(c->peer_id), CtlKind::ack, 0) != WIA_SUCCESS) {
    fail_conn(c, "ofi: cannot answer the connect of " + c->peer_text);
  }
  l->ready.emplace_back(c);
  l->cookies.push_back(m.cookie);
}

void Endpoint::on_ctl(Request* r) {
  Conn* c = r->conn;
  const CtlMsg& m = r->msg;
  if (m.magic != kCtlMagic) {
    ctx_->log(WIA_LOG_WARN, "ofi: connection %" PRIu64 " ignored a malformed control message",
              c->id());
  } else if (m.kind == CtlKind::ack && !c->established) {
    c->peer_id = m.conn_id;
    c->peer = Peer{m.pid, m.start_time, std::memcmp(self_boot_id_, m.boot_id, 16) == 0};
    c->peer_text += " (pid " + std::to_string(m.pid) + ")";
    c->established = true;
  } else if (m.kind == CtlKind::close) {
    if (!c->failed) c->peer_closed = true;
    fail_conn(c, "ofi: the peer " + c->peer_text + " closed the connection");
  } else if (m.kind == CtlKind::cts && c->established && !c->failed) {
    on_cts(c, m.cookie);
  }
  if (post_ctl(r) != WIA_SUCCESS) c->ctl_recv = nullptr;
}

void Endpoint::close_listener(Listener* l) {
  listeners_.erase(l->id);
  if (l->recv != nullptr) {
    l->recv->listener = nullptr;
    if (l->recv->in_fabric) fi_cancel(&ep->fid, &l->recv->fctx);
    finish(l->recv);
  }
  for (auto& c : l->ready) close(c.release());
  delete l;
}

void Endpoint::close(Conn* c) {
  forget_released(c);
  for (Request* r : c->pending) {
    r->conn = nullptr;
    r->user_gone = true;
    if (r->in_fabric && !r->is_send) fi_cancel(&ep->fid, &r->fctx);
    finish(r);
  }
  c->pending.clear();
  if (c->ctl_recv != nullptr) {
    c->ctl_recv->conn = nullptr;
    if (c->ctl_recv->in_fabric) fi_cancel(&ep->fid, &c->ctl_recv->fctx);
    finish(c->ctl_recv);
  }
  for (Request* r : retry_)
    if (r->conn == c) r->conn = nullptr;
  // Tell the peer, so its pending requests end (best effort: ordered after
  // everything sent on this connection, so it never overtakes data).
  if (c->established && !c->failed) send_ctl(c, c->addr, ctl_tag(c->peer_id), CtlKind::close, 0);
  conns_.erase(c->id());
  delete c;
}

// --- failure ------------------------------------------------------------------

void Endpoint::fail_conn(Conn* c, const std::string& why) {
  if (c->failed) return;
  c->failed = true;
  c->failure = why;
  ctx_->log(WIA_LOG_DEBUG, "%s", why.c_str());
  forget_released(c);  // payloads still waiting for (or after) a CTS fail below
  for (Request* r : c->pending) {
    if (r->state != Request::State::pending) continue;
    // A receive already matched completes; one still posted is cancelled
    // and ends with FI_ECANCELED (on_error). Sends are not cancellable.
    if (!r->is_send && r->in_fabric && fi_cancel(&ep->fid, &r->fctx) == 0) continue;
    r->state = Request::State::failed;
    r->status = WIA_ERROR_REMOTE;
    r->error = why;
  }
}

void Endpoint::check_liveness(Conn* c, std::uint64_t now) {
  if (now < c->next_check_ns) return;
  c->next_check_ns = now + static_cast<std::uint64_t>(ctx_->params.liveness_ms) * 1000000u;
  if (!c->peer.same_host || c->peer.pid == 0) return;
  const std::uint64_t start = process_start_time(c->peer.pid);
  if (start == 0 || start != c->peer.start_time)
    fail_conn(c, "ofi: the peer " + c->peer_text + " on this host went away (process " +
                     std::to_string(c->peer.pid) + " exited)");
}

// --- progress -----------------------------------------------------------------

void Endpoint::on_completion(Request* r, const fi_cq_tagged_entry& e) {
  r->in_fabric = false;
  switch (r->kind) {
    case Request::Kind::data:
      if (!r->is_send && r->state == Request::State::pending) {
        on_data_recv(r, e);
        return;
      }
      if (r->state == Request::State::pending) r->state = Request::State::done;
      finish(r);
      return;
    case Request::Kind::ctl_recv:
      if (r->conn != nullptr) {
        on_ctl(r);
        return;
      }
      finish(r);
      return;
    case Request::Kind::listen_recv:
      if (r->listener != nullptr) {
        on_connect_msg(r->listener, r->msg);
        if (post_ctl(r) == WIA_SUCCESS) return;
        r->listener->recv = nullptr;
        return;
      }
      finish(r);
      return;
    case Request::Kind::ctl_send:
      if (r->loop_target != nullptr) {  // a loop send: its receive may be waiting for it
        Request* t = r->loop_target;
        t->loop_send = nullptr;
        r->loop_target = nullptr;
        finish(t);
      }
      finish(r);
      return;
  }
}

void Endpoint::on_error(Request* r, const fi_cq_err_entry& entry) {
  r->in_fabric = false;
  // Some fabric providers (shm in 1.17) store the error negated.
  fi_cq_err_entry e = entry;
  if (e.err < 0) e.err = -e.err;
  char pbuf[256] = "";
  const char* ptext = fi_cq_strerror(cq, e.prov_errno, e.err_data, pbuf, sizeof(pbuf));
  const std::string detail = std::string(ctx_->fi_error(-e.err)) +
                             (ptext != nullptr && *ptext ? std::string(", ") + ptext : "");
  Conn* c = r->conn;
  if (r->kind == Request::Kind::data) {
    if (r->state == Request::State::pending) {
      r->state = Request::State::failed;
      r->status = WIA_ERROR_REMOTE;
      char buf[512];
      const std::string peer = c != nullptr ? c->peer_text : "a closed connection";
      if (e.err == FI_ETRUNC)
        std::snprintf(buf, sizeof(buf),
                      "ofi: a message of %s from %s does not fit the %s receive (tag 0x%" PRIx64
                      "); nothing was written past the buffer",
                      size_text(r->capacity + e.olen).c_str(), peer.c_str(),
                      size_text(r->capacity).c_str(), r->tag);
      else if (e.err == FI_ECANCELED && c != nullptr && c->failed)
        std::snprintf(buf, sizeof(buf), "%s", c->failure.c_str());
      else
        std::snprintf(buf, sizeof(buf), "ofi: %s of %s (tag 0x%" PRIx64 ") with %s failed: %s",
                      r->op != nullptr ? r->op
                      : r->is_send     ? "send"
                                       : "receive",
                      size_text(r->capacity).c_str(), r->tag, peer.c_str(), detail.c_str());
      r->error = buf;
      // A transfer error other than truncation means the peer cannot be
      // reached: the connection as a whole has failed.
      if (c != nullptr && e.err != FI_ETRUNC && e.err != FI_ECANCELED) fail_conn(c, buf);
    }
    finish(r);
    return;
  }
  if (r->kind == Request::Kind::ctl_send && r->loop_target != nullptr) {
    fail_loop(r, "the fabric's send of the message to this endpoint itself failed: " + detail);
    return;
  }
  if (r->kind == Request::Kind::ctl_send && e.err != FI_ECANCELED) {
    auto it = conns_.find(r->owner_id);
    if (it != conns_.end())
      fail_conn(it->second, "ofi: cannot reach " + it->second->peer_text + ": " + detail);
  }
  if (r->kind == Request::Kind::ctl_recv && c != nullptr && e.err != FI_ECANCELED) {
    fail_conn(c, "ofi: control receive from " + c->peer_text + " failed: " + detail);
    c->ctl_recv = nullptr;
    r->conn = nullptr;
  }
  if (r->kind == Request::Kind::listen_recv && r->listener != nullptr) {
    if (e.err != FI_ECANCELED && post_ctl(r) == WIA_SUCCESS) return;
    r->listener->recv = nullptr;
    r->listener = nullptr;
  }
  finish(r);
}

void Endpoint::progress() {
  if (!retry_.empty()) {
    std::vector<Request*> again;
    again.swap(retry_);
    for (Request* r : again) post_ctl(r);
  }
  if (!loop_retry_.empty()) {
    std::vector<Request*> again;
    again.swap(loop_retry_);
    for (Request* h : again) post_loop(h);
  }
  if (!released_.empty()) send_released();
  // Each fi_cq_read that finds the queue empty makes the fabric progress
  // (rxm over tcp: a poll of its sockets, a system call), so a batch that
  // came back short ends the pass: the queue was drained, and asking again
  // would cost that call for nothing on every completion.
  constexpr ssize_t kBatch = 16;
  for (int round = 0; round < 64; ++round) {
    fi_cq_tagged_entry entries[kBatch];
    const ssize_t n = fi_cq_read(cq, entries, kBatch);
    if (n > 0) {
      for (ssize_t k = 0; k < n; ++k)
        on_completion(static_cast<Request*>(entries[k].op_context), entries[k]);
      if (n < kBatch) break;
      continue;
    }
    if (n == -FI_EAVAIL) {
      fi_cq_err_entry err{};
      if (fi_cq_readerr(cq, &err, 0) == 1 && err.op_context != nullptr)
        on_error(static_cast<Request*>(err.op_context), err);
      continue;
    }
    if (n != -FI_EAGAIN)
      ctx_->log(WIA_LOG_WARN, "ofi: fi_cq_read on %s/%s: %s", info_->prov.c_str(),
                info_->domain.c_str(), ctx_->fi_error(static_cast<int>(n)).c_str());
    break;
  }
  // The liveness sweep: one clock read per pass, and the connections
  // walked only when the earliest of their checks may be due.
  const std::uint64_t now = ctx_->now_ns();
  if (now < next_liveness_ns_) return;
  next_liveness_ns_ = now + static_cast<std::uint64_t>(ctx_->params.liveness_ms) * 1000000u;
  for (auto& [id, c] : conns_)
    if (!c->failed && (!c->pending.empty() || !c->established)) check_liveness(c, now);
}

}  // namespace wia::ofi
