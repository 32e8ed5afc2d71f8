// SPDX-License-Identifier: Apache-2.0
// Connections: a TCP handshake that swaps QP facts (QpInfo), RC queue
// pairs brought to RTS, and the TCP socket kept as the liveness channel.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstring>

#include "verbs.hpp"

namespace wia::verbs {

namespace {

// The handshake socket is also the liveness channel: keepalive probes make
// a peer whose node died or whose link was cut (no FIN ever comes) show as
// a failed socket after about 20 s of silence.
void tune(int fd) {
  int one = 1, idle = 10, interval = 2, count = 5;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  ::setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one);
  ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof idle);
  ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &interval, sizeof interval);
  ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &count, sizeof count);
}

int tcp_socket() {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd >= 0) tune(fd);
  return fd;
}

// Sends the rest of `info` without blocking; false when the socket failed.
bool send_info(int fd, const QpInfo& info, std::size_t* sent) {
  while (*sent < sizeof info) {
    const ssize_t n =
        ::send(fd, reinterpret_cast<const char*>(&info) + *sent, sizeof info - *sent, MSG_NOSIGNAL);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) return true;
    if (n <= 0) return false;
    *sent += static_cast<std::size_t>(n);
  }
  return true;
}

// Reads toward a whole QpInfo; -1 failed or closed, 0 not yet, 1 complete.
int read_info(int fd, std::vector<char>* in, QpInfo* out) {
  while (in->size() < sizeof(QpInfo)) {
    char buf[sizeof(QpInfo)];
    const ssize_t n = ::recv(fd, buf, sizeof(QpInfo) - in->size(), 0);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) return 0;
    if (n <= 0) return -1;
    in->insert(in->end(), buf, buf + n);
  }
  std::memcpy(out, in->data(), sizeof *out);
  return out->magic == kInfoMagic ? 1 : -1;
}

std::string peer_text(const QpInfo& r) {
  char buf[160];
  std::snprintf(buf, sizeof buf, "host %.64s pid %u (QP 0x%06x)", r.host, r.pid, r.qpn);
  return buf;
}

}  // namespace

wia_status_t Ctx::listen(void* handle, Listener** out) {
  const int fd = tcp_socket();
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_ANY);
  socklen_t len = sizeof a;
  if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
      ::listen(fd, 256) != 0 || ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    const int err = errno;
    if (fd >= 0) ::close(fd);
    return fail(WIA_ERROR_IO, "verbs: listen: handshake socket: %s", errno_text(err).c_str());
  }
  WireHandle h{};
  h.magic = kHandleMagic;
  h.link_layer = port_attr.link_layer;
  h.port = port;
  h.lid = port_attr.lid;
  h.ipv4 = oob_ipv4;
  h.tcp_port = a.sin_port;
  h.mtu = static_cast<std::uint8_t>(port_attr.active_mtu);
  std::memcpy(h.gid, gid.raw, 16);
  h.listener_nonce = now_ns();
  std::snprintf(h.device, sizeof h.device, "%s", dev_name.c_str());
  std::memcpy(handle, &h, sizeof h);
  *out = new Listener{fd, {}};
  return WIA_SUCCESS;
}

wia_status_t Ctx::qp_create(Conn* c) {
  if (by_qpn.size() >= kMaxQps)
    return fail(WIA_ERROR_UNAVAILABLE,
                "verbs: %s already has %zu connections, the most its completion queue of %u "
                "entries serves",
                dev_name.c_str(), by_qpn.size(), kCqSize);
  ibv_qp_init_attr ia{};
  ia.send_cq = cq;
  ia.recv_cq = cq;
  ia.srq = srq;
  ia.qp_type = IBV_QPT_RC;
  ia.cap.max_send_wr = kMaxSendWr;
  ia.cap.max_send_sge = 1;
  ia.cap.max_inline_data = kMaxInline;
  c->qp = lib.create_qp(pd, &ia);
  if (c->qp == nullptr && errno == EINVAL) {  // a device with less (or no) inline room
    ia.cap.max_inline_data = 0;
    c->qp = lib.create_qp(pd, &ia);
  }
  if (c->qp == nullptr)
    return fail(WIA_ERROR_IO, "verbs: ibv_create_qp (RC, %u send WRs) on %s: %s", kMaxSendWr,
                dev_name.c_str(), errno_text(errno).c_str());
  max_inline = ia.cap.max_inline_data;
  ibv_qp_attr at{};
  at.qp_state = IBV_QPS_INIT;
  at.pkey_index = 0;
  at.port_num = port;
  at.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
  const int rc = lib.modify_qp(
      c->qp, &at, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
  if (rc != 0) return fail(WIA_ERROR_IO, "verbs: QP to INIT: %s", errno_text(rc).c_str());
  QpInfo& l = c->local;
  l.magic = kInfoMagic;
  l.qpn = c->qp->qp_num;
  l.psn = static_cast<std::uint32_t>(next_psn++ & 0xffffff);
  l.pid = static_cast<std::uint32_t>(::getpid());
  l.lid = port_attr.lid;
  l.mtu = static_cast<std::uint8_t>(port_attr.active_mtu);
  l.link_layer = port_attr.link_layer;
  std::memcpy(l.gid, gid.raw, 16);
  ::gethostname(l.host, sizeof l.host - 1);
  by_qpn[l.qpn] = c;
  return WIA_SUCCESS;
}

// INIT -> RTR -> RTS toward the peer `r`.
wia_status_t Ctx::qp_connect(Conn* c, const QpInfo& r) {
  c->peer = peer_text(r);
  ibv_qp_attr at{};
  at.qp_state = IBV_QPS_RTR;
  at.path_mtu = static_cast<ibv_mtu>(std::min<int>(r.mtu, port_attr.active_mtu));
  at.dest_qp_num = r.qpn;
  at.rq_psn = r.psn;
  at.max_dest_rd_atomic = 1;
  at.min_rnr_timer = 12;  // 0.64 ms
  at.ah_attr.port_num = port;
  at.ah_attr.dlid = r.lid;
  std::uint8_t zero[16] = {};
  if (r.link_layer == IBV_LINK_LAYER_ETHERNET || std::memcmp(r.gid, zero, 16) != 0) {
    at.ah_attr.is_global = 1;
    std::memcpy(at.ah_attr.grh.dgid.raw, r.gid, 16);
    at.ah_attr.grh.sgid_index = static_cast<std::uint8_t>(gid_index);
    at.ah_attr.grh.hop_limit = 64;
  }
  int rc = lib.modify_qp(c->qp, &at,
                         IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                             IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
  if (rc != 0)
    return fail(WIA_ERROR_REMOTE, "verbs: QP 0x%06x to RTR toward peer %s: %s", c->local.qpn,
                c->peer.c_str(), errno_text(rc).c_str());
  ibv_qp_attr st{};
  st.qp_state = IBV_QPS_RTS;
  st.timeout = 14;   // 67 ms per try
  st.retry_cnt = 7;  // a dead peer shows after about half a second of sends
  st.rnr_retry = 7;  // receiver not ready: retry forever (the SRQ refills)
  st.sq_psn = c->local.psn;
  st.max_rd_atomic = 1;
  rc = lib.modify_qp(c->qp, &st,
                     IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                         IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC);
  if (rc != 0)
    return fail(WIA_ERROR_REMOTE, "verbs: QP 0x%06x to RTS toward peer %s: %s", c->local.qpn,
                c->peer.c_str(), errno_text(rc).c_str());
  c->established = true;
  return WIA_SUCCESS;
}

// The loopback QP: an RC QP of this endpoint connected to itself (its own
// QPN, LID and GID, as NCCL's flush QP), on the endpoint's CQ and SRQ. It
// only posts RDMA writes without immediate and RDMA reads, which consume no
// receive. Made at the first irecv into device memory; a failed one is
// remade once its WRs have completed (flush_loop), so a call while it
// drains succeeds and the work waits.
wia_status_t Ctx::open_loopback() {
  if (loop != nullptr && (!loop->failed || loop->sq_used > 0)) return WIA_SUCCESS;
  close_loopback();
  auto c = std::make_unique<Conn>();
  wia_status_t st = qp_create(c.get());
  if (st == WIA_SUCCESS) st = qp_connect(c.get(), c->local);
  if (st != WIA_SUCCESS) {
    if (c->qp != nullptr) {
      by_qpn.erase(c->local.qpn);
      lib.destroy_qp(c->qp);
    }
    return st;
  }
  char text[80];
  std::snprintf(text, sizeof text, "itself (loopback QP 0x%06x)", c->local.qpn);
  c->peer = text;
  log(WIA_LOG_DEBUG, "verbs: %s: loopback QP 0x%06x for device-memory receives", dev_name.c_str(),
      c->local.qpn);
  loop = std::move(c);
  return WIA_SUCCESS;
}

// Only when none of its WRs is outstanding (or at fini: nothing polls again).
void Ctx::close_loopback() {
  if (loop == nullptr) return;
  if (loop->qp != nullptr) {
    by_qpn.erase(loop->local.qpn);
    lib.destroy_qp(loop->qp);
  }
  loop.reset();
}

wia_status_t Ctx::connect(const void* handle, std::uint64_t cookie, Conn** conn) {
  Conn* c = *conn;
  if (c == nullptr) {
    WireHandle h;
    std::memcpy(&h, handle, sizeof h);
    if (h.magic != kHandleMagic)
      return fail(WIA_ERROR_INVALID_ARGUMENT,
                  "verbs: connect: the handle is not a verbs listener's (magic 0x%08x)", h.magic);
    auto owned = std::make_unique<Conn>();
    c = owned.get();
    c->connector = true;
    c->cookie = cookie;
    c->deadline_ns = now_ns() + static_cast<std::uint64_t>(params.connect_timeout_ms) * 1000000;
    char ip[INET_ADDRSTRLEN] = {};
    ::inet_ntop(AF_INET, &h.ipv4, ip, sizeof ip);
    c->peer = std::string(ip) + ":" + std::to_string(ntohs(h.tcp_port)) + " (" + h.device + ")";
    c->fd = tcp_socket();
    if (c->fd < 0)
      return fail(WIA_ERROR_IO, "verbs: connect: socket: %s", errno_text(errno).c_str());
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = h.ipv4;
    a.sin_port = h.tcp_port;
    if (::connect(c->fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 && errno != EINPROGRESS) {
      const int err = errno;
      ::close(c->fd);
      return fail(WIA_ERROR_REMOTE, "verbs: connect to %s: %s", c->peer.c_str(),
                  errno_text(err).c_str());
    }
    const wia_status_t st = qp_create(c);
    if (st != WIA_SUCCESS) {
      if (c->qp != nullptr) {
        by_qpn.erase(c->qp->qp_num);
        lib.destroy_qp(c->qp);
      }
      ::close(c->fd);
      return st;
    }
    c->local.cookie = cookie;
    conns.insert(owned.release());
    *conn = reinterpret_cast<Conn*>(c);
  }
  if (c->established) return WIA_SUCCESS;
  if (!send_info(c->fd, c->local, &c->sent))
    return fail(WIA_ERROR_REMOTE, "verbs: connect to %s: the listener closed the handshake: %s",
                c->peer.c_str(), errno_text(errno).c_str());
  QpInfo remote{};
  const int r = c->sent == sizeof(QpInfo) ? read_info(c->fd, &c->inbuf, &remote) : 0;
  if (r < 0)
    return fail(WIA_ERROR_REMOTE, "verbs: connect to %s: the listener closed the handshake",
                c->peer.c_str());
  if (r == 0) {
    if (now_ns() > c->deadline_ns)
      return fail(WIA_ERROR_TIMEOUT, "verbs: connect to %s: no answer after %" PRId64 " ms",
                  c->peer.c_str(), params.connect_timeout_ms);
    return WIA_IN_PROGRESS;
  }
  const wia_status_t st = qp_connect(c, remote);
  if (st != WIA_SUCCESS) return st;
  const char ready = 1;
  if (::send(c->fd, &ready, 1, MSG_NOSIGNAL) != 1)
    return fail(WIA_ERROR_REMOTE, "verbs: connect to %s: the listener went away: %s",
                c->peer.c_str(), errno_text(errno).c_str());
  return WIA_SUCCESS;
}

wia_status_t Ctx::accept(Listener* l, std::uint64_t* cookie, Conn** out) {
  *out = nullptr;
  for (int fd; (fd = ::accept4(l->fd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC)) >= 0;) {
    tune(fd);
    l->pending.push_back(Pending{fd, {}, nullptr});
  }
  for (std::size_t i = 0; i < l->pending.size();) {
    Pending& p = l->pending[i];
    auto drop = [&](const char* why) {
      if (p.conn != nullptr) {
        if (p.conn->qp != nullptr) {
          by_qpn.erase(p.conn->local.qpn);
          lib.destroy_qp(p.conn->qp);
        }
        p.conn->fd = -1;
      }
      ::close(p.fd);
      log(WIA_LOG_DEBUG, "verbs: accept: dropped a connection attempt: %s", why);
      l->pending.erase(l->pending.begin() + static_cast<std::ptrdiff_t>(i));
    };
    if (p.conn == nullptr) {
      QpInfo remote{};
      const int r = read_info(p.fd, &p.inbuf, &remote);
      if (r == 0) {
        ++i;
        continue;
      }
      if (r < 0) {  // an abandoned connect, or not one of ours
        drop("closed before its QP facts");
        continue;
      }
      auto c = std::make_unique<Conn>();
      c->fd = p.fd;
      c->cookie = remote.cookie;
      wia_status_t st = qp_create(c.get());
      p.conn = std::move(c);
      if (st == WIA_SUCCESS) st = qp_connect(p.conn.get(), remote);
      // The answer is 112 bytes on a fresh socket: it fits the send buffer.
      if (st == WIA_SUCCESS &&
          (!send_info(p.fd, p.conn->local, &p.conn->sent) || p.conn->sent != sizeof(QpInfo)))
        st = WIA_ERROR_REMOTE;
      if (st != WIA_SUCCESS) {
        drop("QP setup or answer failed");
        continue;
      }
    }
    char ready = 0;
    const ssize_t n = ::recv(p.fd, &ready, 1, 0);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
      ++i;
      continue;
    }
    if (n != 1) {
      drop("closed before it was ready");
      continue;
    }
    Conn* c = p.conn.release();
    l->pending.erase(l->pending.begin() + static_cast<std::ptrdiff_t>(i));
    *cookie = c->cookie;
    *out = c;
    conns.insert(c);
    return WIA_SUCCESS;
  }
  return WIA_IN_PROGRESS;
}

void Ctx::close_listener(Listener* l) {
  for (Pending& p : l->pending) {
    if (p.conn != nullptr && p.conn->qp != nullptr) {
      by_qpn.erase(p.conn->local.qpn);
      lib.destroy_qp(p.conn->qp);
    }
    ::close(p.fd);
  }
  ::close(l->fd);
  delete l;
}

// Pending requests are released; the QP is destroyed and the CQ drained
// before the connection's send slots go back, so no completion can name a
// freed slot or request afterwards.
void Ctx::close(Conn* c) {
  if (c->qp != nullptr) {
    lib.destroy_qp(c->qp);
    by_qpn.erase(c->local.qpn);
    c->qp = nullptr;
  }
  c->failed = true;
  if (c->failure.empty()) c->failure = "the connection was closed";
  progress();  // completions already queued for this QP find no connection
  for (std::uint32_t i = 0; i < ops_.size(); ++i) {
    SendOp& op = ops_[i];
    if (op.conn != c) continue;
    if (op.slot >= 0) free_send_slots.push_back(op.slot);
    if (op.req != nullptr) --op.req->in_flight;
    op = SendOp{};
    free_ops_.push_back(i);
  }
  c->out.clear();
  for (auto& [id, r] : c->rndv_recvs) unreg(std::exchange(r->mr, nullptr));
  for (auto& [id, r] : c->rndv_sends) unreg(std::exchange(r->mr, nullptr));
  const std::vector<Request*> reqs(c->requests.begin(), c->requests.end());
  for (Request* r : reqs) {
    unreg(std::exchange(r->mr, nullptr));
    r->conn = nullptr;
    r->user_gone = true;
    release(r);
  }
  if (c->fd >= 0) ::close(c->fd);
  conns.erase(c);
  delete c;
}

// A peer whose process ended (exit, kill) or that closed its end: EOF on
// the handshake socket. Completions that arrived before are delivered first.
void Ctx::check_liveness() {
  // Reused between calls: test() comes here on every call, and two fresh
  // vectors cost two heap allocations per test of a pending request.
  std::vector<pollfd>& fds = liveness_fds;
  std::vector<Conn*>& who = liveness_who;
  fds.clear();
  who.clear();
  for (Conn* c : conns) {
    if (!c->established || c->failed || c->fd < 0) continue;
    fds.push_back({c->fd, POLLIN, 0});
    who.push_back(c);
  }
  if (fds.empty() || ::poll(fds.data(), fds.size(), 0) <= 0) return;
  for (std::size_t i = 0; i < fds.size(); ++i) {
    if (fds[i].revents == 0) continue;
    char b;
    const ssize_t n = ::recv(fds[i].fd, &b, 1, MSG_DONTWAIT);
    const int err = errno;
    if (n > 0 || (n < 0 && (err == EAGAIN || err == EINTR))) continue;  // nothing is sent here
    while (progress()) {
    }
    Conn* c = who[i];
    // A peer that closes right after its receive completed has acked our
    // last write, but that ack and this EOF travel different paths: sends
    // still on the QP get a short grace to complete before they are failed.
    // A dead peer's QP errors them (retry exceeded) well within it.
    if (n == 0 && c->sq_used > 0) {
      const std::uint64_t now = now_ns();
      if (c->peer_eof_ns == 0) c->peer_eof_ns = now;
      if (now - c->peer_eof_ns < kPeerCloseGraceNs) continue;
    }
    fail_conn(c, n == 0 ? "the peer closed the connection or its process ended"
                        : "the handshake socket failed: " + errno_text(err));
  }
}

}  // namespace wia::verbs
