// SPDX-License-Identifier: Apache-2.0
// The data path of one tcp connection: a control socket carrying framed
// messages (eager payloads inline, RTS/CTS for large ones) and N data
// sockets carrying the payload of large messages, striped.
//
// Why it looks like this:
//  - Progress happens only inside calls on this connection (isend, irecv,
//    test), under the connection's mutex. No provider thread: on the
//    2-core machines we target a spinning helper thread competes with the
//    ranks themselves, and a sleeping one costs ~50 us per wake-up.
//  - Every socket is non-blocking and an idle data socket is never touched,
//    so a small-message round trip costs one send and one recv per side.
//  - The control stream is never blocked by a large payload: that goes over
//    the data sockets after the receiver's CTS, straight into the posted
//    buffer (zero extra copies). Both sides derive which bytes travel on
//    which data socket from the CTS order, so data sockets need no framing.
//  - Everything the peer sends is validated before it is acted upon; a
//    violation fails this connection (WIA_ERROR_REMOTE on every pending
//    request, naming the peer), never the process.
#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>

#include "tcp.hpp"

namespace wia::tcp {

namespace {

// What an unexpected message costs against tcp.unexpected_max: its payload
// plus a fixed charge, so a flood of zero-byte or RTS messages is bounded too.
constexpr std::uint64_t kUnexpectedOverhead = 64;

std::uint64_t unexpected_cost(const Unexpected& u) {
  return kUnexpectedOverhead + (u.is_rts ? 0 : u.size);
}

std::uint64_t payload_len(const TxItem& it) {
  return it.hdr.type == static_cast<std::uint8_t>(MsgType::eager) ? it.hdr.size : 0;
}

bool would_block(int err) { return err == EAGAIN || err == EWOULDBLOCK; }

// After the peer closed its control socket, payload still due on a data
// socket must keep arriving; a peer that closed the control socket but
// keeps a data socket open and silent this long is given up on. (A process
// that exits or calls close() ends every socket at once, so this bound is
// only reached by a broken or hostile peer.)
constexpr std::uint64_t kDrainIdleNs = 60ull * 1000 * 1000 * 1000;

}  // namespace

Conn::Conn(Ctx* ctx, std::vector<int> fds, std::string peer) : ctx_(ctx), peer_(std::move(peer)) {
  adopt_sockets(std::move(fds));
}

Conn::Conn(Ctx* ctx, std::unique_ptr<Dialer> dialer, std::string peer)
    : ctx_(ctx), peer_(std::move(peer)), dialer_(std::move(dialer)) {}

Conn::~Conn() {
  if (!failed_ && !connecting()) discard_unread();
  close_sockets();
  for (Request* r : live_) delete r;
}

Dialer::~Dialer() {
  for (int fd : fds)
    if (fd >= 0) ::close(fd);
}

void Conn::adopt_sockets(std::vector<int> fds) {
  ctrl_fd_ = fds[0];
  streams_.resize(fds.size() - 1);
  for (std::size_t i = 1; i < fds.size(); ++i) streams_[i - 1].fd = fds[i];
  // Room for the largest eager message plus a read-ahead of small ones.
  rx_buf_.resize(sizeof(WireMsg) + kEagerMax + 64 * 1024);
}

void Conn::discard_unread() {
  // At most 4 MiB per socket, without waiting: close() never blocks long.
  char sink[16 * 1024];
  auto discard = [&sink](int fd) {
    if (fd < 0) return;
    for (int i = 0; i < 256; ++i) {
      const ssize_t n = ::recv(fd, sink, sizeof(sink), MSG_DONTWAIT);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return;
    }
  };
  discard(ctrl_fd_);
  for (const DataStream& s : streams_) discard(s.fd);
}

void Conn::close_sockets() {
  if (ctrl_fd_ >= 0) ::close(ctrl_fd_);
  ctrl_fd_ = -1;
  for (DataStream& s : streams_) {
    if (s.fd >= 0) ::close(s.fd);
    s.fd = -1;
  }
}

// ---------------------------------------------------------------------------
// Connection setup (connector side)

wia_status_t Conn::continue_connect() {
  Dialer& d = *dialer_;
  if (ctx_->now_ns() > d.deadline_ns)
    return ctx_->fail(WIA_ERROR_TIMEOUT,
                      "tcp: connect to %s did not complete within %" PRId64
                      " ms (tcp.connect_timeout_ms)",
                      peer_.c_str(), ctx_->params.connect_timeout_ms);
  bool all_done = true;
  for (std::size_t i = 0; i < d.fds.size(); ++i) {
    if (!d.connected[i]) {
      pollfd p{d.fds[i], POLLOUT, 0};
      int n = ::poll(&p, 1, 0);
      if (n == 0) {
        all_done = false;
        continue;
      }
      int err = 0;
      socklen_t len = sizeof(err);
      if (n < 0 || ::getsockopt(d.fds[i], SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
      if (err != 0)
        return ctx_->fail(WIA_ERROR_REMOTE, "tcp: connect to %s (socket %zu of %zu) failed: %s",
                          peer_.c_str(), i, d.fds.size(), errno_text(err).c_str());
      d.connected[i] = true;
    }
    while (d.hello_sent[i] < sizeof(WireHello)) {
      const char* p = reinterpret_cast<const char*>(&d.hellos[i]) + d.hello_sent[i];
      ssize_t n =
          ::send(d.fds[i], p, sizeof(WireHello) - d.hello_sent[i], MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && would_block(errno)) break;
      if (n < 0)
        return ctx_->fail(WIA_ERROR_REMOTE, "tcp: sending the hello to %s failed: %s",
                          peer_.c_str(), errno_text(errno).c_str());
      d.hello_sent[i] += static_cast<std::size_t>(n);
    }
    if (d.hello_sent[i] < sizeof(WireHello)) all_done = false;
  }
  if (!all_done) return WIA_IN_PROGRESS;
  std::vector<int> fds = std::move(d.fds);
  dialer_.reset();
  adopt_sockets(std::move(fds));
  ctx_->log(WIA_LOG_DEBUG, "tcp: connected to %s with %zu data sockets", peer_.c_str(),
            streams_.size());
  return WIA_SUCCESS;
}

// ---------------------------------------------------------------------------
// Requests

Request* Conn::new_request(bool is_send, char* buf, std::uint64_t cap, std::uint64_t tag) {
  auto* r = new Request;
  r->conn = this;
  r->is_send = is_send;
  r->buf = buf;
  r->capacity = cap;
  r->tag = tag;
  r->live_index = live_.size();
  live_.push_back(r);
  return r;
}

void Conn::release(Request* r) {
  Request* last = live_.back();
  live_[r->live_index] = last;
  last->live_index = r->live_index;
  live_.pop_back();
  delete r;
}

void Conn::complete(Request* r, std::uint64_t size) {
  r->state = Request::State::done;
  r->size = size;
}

void Conn::fail_request(Request* r, const std::string& why) {
  r->state = Request::State::failed;
  r->status = WIA_ERROR_REMOTE;
  r->error = why;
}

wia_status_t Conn::isend(const void* buf, std::uint64_t size, std::uint64_t tag,
                         wia_request_t* out) {
  std::lock_guard<std::mutex> lk(mu);
  *out = nullptr;
  if (connecting())
    return ctx_->fail(WIA_ERROR_INVALID_HANDLE,
                      "tcp: isend on a connection to %s that connect() "
                      "has not completed",
                      peer_.c_str());
  if (failed_ || peer_closed_) return ctx_->fail_text(WIA_ERROR_REMOTE, failure_);
  if (buf == nullptr && size > 0)
    return ctx_->fail(WIA_ERROR_INVALID_ARGUMENT, "tcp: isend of %" PRIu64 " bytes from NULL",
                      size);
  if (size > ctx_->params.max_message)
    return ctx_->fail(WIA_ERROR_INVALID_ARGUMENT,
                      "tcp: isend of %" PRIu64 " bytes exceeds tcp.max_message (%" PRIu64 ")", size,
                      ctx_->params.max_message);
  if (live_.size() >= kMaxRequests) return WIA_SUCCESS;  // retry later
  Request* r = new_request(true, const_cast<char*>(static_cast<const char*>(buf)), size, tag);
  r->size = size;
  TxItem item;
  if (size <= kEagerMax) {
    item.hdr = make_msg(MsgType::eager, tx_seq_++, tag, size);
    item.payload = static_cast<const char*>(buf);
    item.req = r;
  } else {
    awaiting_cts_[tx_seq_] = r;
    item.hdr = make_msg(MsgType::rts, tx_seq_++, tag, size);
  }
  tx_.push_back(item);
  progress();
  *out = reinterpret_cast<wia_request_t>(r);
  return WIA_SUCCESS;
}

wia_status_t Conn::irecv(void* buf, std::uint64_t size, std::uint64_t tag, wia_request_t* out) {
  std::lock_guard<std::mutex> lk(mu);
  *out = nullptr;
  if (connecting())
    return ctx_->fail(WIA_ERROR_INVALID_HANDLE,
                      "tcp: irecv on a connection to %s that connect() "
                      "has not completed",
                      peer_.c_str());
  if (buf == nullptr && size > 0)
    return ctx_->fail(WIA_ERROR_INVALID_ARGUMENT, "tcp: irecv of %" PRIu64 " bytes into NULL",
                      size);
  if (live_.size() >= kMaxRequests) return WIA_SUCCESS;  // retry later
  auto u = unexpected_.find(tag);
  const bool closed = failed_ || peer_closed_;  // no more messages will arrive
  if (u == unexpected_.end() && closed) return ctx_->fail_text(WIA_ERROR_REMOTE, failure_);
  Request* r = new_request(false, static_cast<char*>(buf), size, tag);
  if (u != unexpected_.end()) {
    Unexpected e = std::move(u->second.front());
    u->second.pop_front();
    if (u->second.empty()) unexpected_.erase(u);
    unexpected_bytes_ -= unexpected_cost(e);
    if (rx_paused_ && unexpected_bytes_ < ctx_->params.unexpected_max) rx_paused_ = false;
    if (!e.is_rts) {
      deliver_eager(r, e.data.data(), e.size);
      // At most 16 kept, each at most an eager message: 1 MiB per connection.
      if (spare_payloads_.size() < 16) spare_payloads_.push_back(std::move(e.data));
    } else if (closed) {
      fail_request(r, failure_);
    } else {
      answer_rts(r, e.seq, e.size);
    }
  } else {
    posted_[tag].push_back(r);
  }
  progress();
  *out = reinterpret_cast<wia_request_t>(r);
  return WIA_SUCCESS;
}

wia_status_t Conn::test(Request* r, int32_t* done, std::uint64_t* size) {
  std::lock_guard<std::mutex> lk(mu);
  if (r->state == Request::State::pending) progress();
  switch (r->state) {
    case Request::State::pending:
      *done = 0;
      return WIA_SUCCESS;
    case Request::State::done:
      *done = 1;
      if (size != nullptr) *size = r->size;
      release(r);
      return WIA_SUCCESS;
    case Request::State::failed:
      break;
  }
  *done = 1;
  if (size != nullptr) *size = 0;
  const std::string why = r->error;
  const wia_status_t status = r->status;
  release(r);
  return ctx_->fail_text(status, why);
}

wia_status_t Conn::wait_fds(pollfd* fds, std::uint32_t capacity, std::uint32_t* count) {
  std::lock_guard<std::mutex> lk(mu);
  *count = 0;
  // A failing connection answers test() at once; one being drained keeps
  // its own clock (drain()); one being set up progresses in connect().
  if (failed_ || connecting() || peer_closed_) return WIA_IN_PROGRESS;
  std::uint32_t n = 0;
  auto add = [&](int fd, short events) {
    if (n < capacity) fds[n] = pollfd{fd, events, 0};
    ++n;
  };
  // The control socket always: any message of the peer is progress (an
  // expected one, or one to buffer), and POLLHUP/POLLERR come without
  // asking. While reading is paused (the unexpected bound), only those.
  add(ctrl_fd_, static_cast<short>((rx_paused_ ? 0 : POLLIN) | (tx_.empty() ? 0 : POLLOUT)));
  for (const DataStream& s : streams_) {
    const short events =
        static_cast<short>((s.rx.empty() ? 0 : POLLIN) | (s.tx.empty() ? 0 : POLLOUT));
    if (events != 0) add(s.fd, events);
  }
  if (n > capacity)
    return ctx_->fail(WIA_ERROR_INVALID_ARGUMENT,
                      "tcp: wait_fds: the connection to %s needs %u entries, %u given",
                      peer_.c_str(), n, capacity);
  *count = n;
  return WIA_SUCCESS;
}

// ---------------------------------------------------------------------------
// Matching

void Conn::deliver_eager(Request* r, const char* payload, std::uint64_t size) {
  if (size > r->capacity) {
    char why[256];
    std::snprintf(why, sizeof(why),
                  "tcp: a %" PRIu64 "-byte message with tag %" PRIu64
                  " from %s does not fit the %" PRIu64 "-byte receive buffer",
                  size, r->tag, peer_.c_str(), r->capacity);
    fail_request(r, why);
    return;
  }
  if (size > 0) std::memcpy(r->buf, payload, size);
  complete(r, size);
}

void Conn::answer_rts(Request* r, std::uint32_t seq, std::uint64_t size) {
  if (size > r->capacity) {
    tx_.push_back(TxItem{make_msg(MsgType::nak, seq, r->tag, size), nullptr, 0, nullptr});
    char why[256];
    std::snprintf(why, sizeof(why),
                  "tcp: a %" PRIu64 "-byte message with tag %" PRIu64
                  " from %s does not fit the %" PRIu64 "-byte receive buffer",
                  size, r->tag, peer_.c_str(), r->capacity);
    fail_request(r, why);
    return;
  }
  // The receiver chooses the striping; the sender follows the CTS.
  const std::uint64_t stripe = std::max<std::uint64_t>(ctx_->params.min_stripe, 1);
  std::uint64_t slices = (size + stripe - 1) / stripe;
  slices = std::clamp<std::uint64_t>(slices, 1, streams_.size());
  slices = std::min<std::uint64_t>(slices, size);
  r->size = size;
  tx_.push_back(
      TxItem{make_msg(MsgType::cts, seq, r->tag, size, static_cast<std::uint16_t>(slices)), nullptr,
             0, nullptr});
  schedule_slices(r, r->buf, size, static_cast<std::uint32_t>(slices), false);
}

// Slice i of a message goes to data socket (cursor + i) mod N; both sides
// advance their cursor by the slice count of each CTS, in CTS order, so
// they agree on the layout without per-slice headers.
void Conn::schedule_slices(Request* r, char* base, std::uint64_t size, std::uint32_t nslices,
                           bool outgoing) {
  std::uint32_t& cursor = outgoing ? tx_stripe_ : rx_stripe_;
  const std::uint32_t n = static_cast<std::uint32_t>(streams_.size());
  const std::uint64_t base_len = size / nslices, rem = size % nslices;
  std::uint64_t off = 0;
  for (std::uint32_t i = 0; i < nslices; ++i) {
    const std::uint64_t len = base_len + (i < rem ? 1 : 0);
    DataStream& s = streams_[(cursor + i) % n];
    (outgoing ? s.tx : s.rx).push_back(Slice{base + off, len, 0, r});
    off += len;
  }
  cursor = (cursor + nslices) % n;
  r->slices_left = nslices;
}

void Conn::on_message(const WireMsg& m, const char* payload) {
  const auto type = static_cast<MsgType>(m.type);
  if (type == MsgType::eager || type == MsgType::rts) {
    ++rx_seq_;
    auto p = posted_.find(m.tag);
    if (p != posted_.end()) {
      Request* r = p->second.front();
      p->second.pop_front();
      if (p->second.empty()) posted_.erase(p);
      if (type == MsgType::eager)
        deliver_eager(r, payload, m.size);
      else
        answer_rts(r, m.seq, m.size);
      return;
    }
    Unexpected u;
    u.is_rts = type == MsgType::rts;
    u.seq = m.seq;
    u.size = m.size;
    if (!u.is_rts) {
      if (!spare_payloads_.empty()) {
        u.data = std::move(spare_payloads_.back());
        spare_payloads_.pop_back();
      }
      u.data.assign(payload, payload + m.size);
    }
    unexpected_bytes_ += unexpected_cost(u);
    unexpected_[m.tag].push_back(std::move(u));
    return;
  }
  // cts / nak: validated by parse_control (the RTS exists).
  auto it = awaiting_cts_.find(m.seq);
  Request* r = it->second;
  awaiting_cts_.erase(it);
  if (type == MsgType::cts) {
    schedule_slices(r, r->buf, r->size, m.slices, true);
  } else {
    char why[256];
    std::snprintf(why, sizeof(why),
                  "tcp: %s refused this %" PRIu64 "-byte message with tag %" PRIu64
                  ": its matching receive buffer is smaller",
                  peer_.c_str(), r->size, r->tag);
    fail_request(r, why);
  }
}

// ---------------------------------------------------------------------------
// Progress

void Conn::progress() {
  if (failed_ || connecting()) return;
  if (!peer_closed_) {
    if (read_control() && flush_control()) {
      progress_data();
      return;
    }
    if (failed_ || !peer_closed_) return;
  }
  drain();
}

// The peer closed the control socket: receive the payload still due on
// the data sockets; once none is due, the connection has failed.
void Conn::drain() {
  const std::uint64_t before = rx_data_bytes_;
  if (!progress_data()) return;
  if (!rx_slices_pending()) {
    fail_conn(peer_closed_why_);
    return;
  }
  const std::uint64_t now = ctx_->now_ns();
  if (rx_data_bytes_ != before || drain_progress_ns_ == 0) {
    drain_progress_ns_ = now;
  } else if (now - drain_progress_ns_ > kDrainIdleNs) {
    fail_conn(peer_closed_why_ + ", and the rest of a message it sent did not arrive within " +
              std::to_string(kDrainIdleNs / 1000000000) + " s");
  }
}

bool Conn::flush_control() {
  while (!tx_.empty()) {
    iovec iov[64];
    int n = 0;
    for (const TxItem& it : tx_) {
      if (n + 2 > 64) break;
      if (it.done < sizeof(WireMsg))
        iov[n++] = {const_cast<char*>(reinterpret_cast<const char*>(&it.hdr)) + it.done,
                    sizeof(WireMsg) - it.done};
      const std::uint64_t plen = payload_len(it);
      const std::uint64_t poff = it.done > sizeof(WireMsg) ? it.done - sizeof(WireMsg) : 0;
      if (plen > poff) iov[n++] = {const_cast<char*>(it.payload) + poff, plen - poff};
    }
    msghdr mh{};
    mh.msg_iov = iov;
    mh.msg_iovlen = static_cast<std::size_t>(n);
    ssize_t w = ::sendmsg(ctrl_fd_, &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (w < 0) {
      if (errno == EINTR) continue;
      if (would_block(errno)) return true;
      if (errno == EPIPE || errno == ECONNRESET)
        control_lost("send on the control socket: connection reset by the peer");
      else
        io_error("send on the control socket", errno);
      return false;
    }
    auto left = static_cast<std::uint64_t>(w);
    while (left > 0 && !tx_.empty()) {
      TxItem& it = tx_.front();
      const std::uint64_t total = sizeof(WireMsg) + payload_len(it);
      const std::uint64_t take = std::min(left, total - it.done);
      it.done += take;
      left -= take;
      if (it.done < total) break;
      if (it.req != nullptr) complete(it.req, it.req->size);
      tx_.pop_front();
    }
  }
  return true;
}

bool Conn::read_control() {
  for (;;) {
    if (!parse_control()) return false;
    if (rx_paused_) {
      // Not reading (the unexpected bound is reached), but a reset peer
      // must still fail the connection promptly.
      pollfd p{ctrl_fd_, 0, 0};
      if (::poll(&p, 1, 0) > 0 && (p.revents & POLLERR)) {
        io_error("the control socket", ECONNRESET);
        return false;
      }
      return true;
    }
    if (rx_begin_ == rx_end_) rx_begin_ = rx_end_ = 0;
    if (rx_end_ == rx_buf_.size() && rx_begin_ > 0) {
      std::memmove(rx_buf_.data(), rx_buf_.data() + rx_begin_, rx_end_ - rx_begin_);
      rx_end_ -= rx_begin_;
      rx_begin_ = 0;
    }
    // Cannot happen (the buffer holds the largest frame); a zero-length
    // recv would read as EOF, so never issue one.
    if (rx_end_ == rx_buf_.size()) return true;
    ssize_t n = ::recv(ctrl_fd_, rx_buf_.data() + rx_end_, rx_buf_.size() - rx_end_, MSG_DONTWAIT);
    if (n > 0) {
      rx_end_ += static_cast<std::size_t>(n);
      continue;
    }
    if (n == 0) {
      control_lost("the peer closed the connection (EOF on the control socket)");
      return false;
    }
    if (errno == EINTR) continue;
    if (would_block(errno)) return true;
    if (errno == ECONNRESET)
      control_lost("recv on the control socket: connection reset by the peer");
    else
      io_error("recv on the control socket", errno);
    return false;
  }
}

bool Conn::parse_control() {
  while (!rx_paused_ && !failed_ && rx_end_ - rx_begin_ >= sizeof(WireMsg)) {
    WireMsg m;
    std::memcpy(&m, rx_buf_.data() + rx_begin_, sizeof(m));
    if (m.magic != kMsgMagic) {
      if (m.magic == __builtin_bswap32(kMsgMagic))
        protocol_error("the peer uses the other byte order (not supported)");
      else
        protocol_error("bad message magic 0x%08x (not a libwia tcp peer, or framing lost)",
                       m.magic);
      return false;
    }
    if (m.version != kWireVersion) {
      protocol_error("wire version %u, this provider speaks %u", m.version, kWireVersion);
      return false;
    }
    if (m.check != msg_check(m)) {
      protocol_error("header checksum mismatch");
      return false;
    }
    const auto type = static_cast<MsgType>(m.type);
    std::size_t frame = sizeof(WireMsg);
    switch (type) {
      case MsgType::eager:
      case MsgType::rts:
        if (m.seq != rx_seq_) {
          protocol_error("message number %u, expected %u", m.seq, rx_seq_);
          return false;
        }
        if (m.slices != 0) {
          protocol_error("%s message with a slice count", type == MsgType::rts ? "RTS" : "eager");
          return false;
        }
        if (type == MsgType::eager && m.size > kEagerMax) {
          protocol_error("eager message of %" PRIu64 " bytes exceeds the %" PRIu64
                         "-byte eager limit",
                         m.size, kEagerMax);
          return false;
        }
        if (type == MsgType::rts && m.size > ctx_->params.max_message) {
          protocol_error("message of %" PRIu64 " bytes exceeds tcp.max_message (%" PRIu64 ")",
                         m.size, ctx_->params.max_message);
          return false;
        }
        if (type == MsgType::eager) frame += m.size;
        break;
      case MsgType::cts:
      case MsgType::nak: {
        auto it = awaiting_cts_.find(m.seq);
        if (it == awaiting_cts_.end()) {
          protocol_error("%s for message %u, which is not waiting for one",
                         type == MsgType::cts ? "CTS" : "NAK", m.seq);
          return false;
        }
        if (m.size != it->second->size || m.tag != it->second->tag) {
          protocol_error("%s for message %u names %" PRIu64 " bytes / tag %" PRIu64
                         ", the message has %" PRIu64 " / %" PRIu64,
                         type == MsgType::cts ? "CTS" : "NAK", m.seq, m.size, m.tag,
                         it->second->size, it->second->tag);
          return false;
        }
        const bool slices_ok =
            type == MsgType::cts
                ? m.slices >= 1 && m.slices <= streams_.size() && m.slices <= m.size
                : m.slices == 0;
        if (!slices_ok) {
          protocol_error("%s with slice count %u (%zu data sockets)",
                         type == MsgType::cts ? "CTS" : "NAK", m.slices, streams_.size());
          return false;
        }
        break;
      }
      default:
        protocol_error("unknown message type %u", m.type);
        return false;
    }
    if (rx_end_ - rx_begin_ < frame) break;  // eager payload still arriving
    const bool unmatched =
        (type == MsgType::eager || type == MsgType::rts) && posted_.find(m.tag) == posted_.end();
    if (unmatched && unexpected_bytes_ > 0 &&
        unexpected_bytes_ + kUnexpectedOverhead + (type == MsgType::eager ? m.size : 0) >
            ctx_->params.unexpected_max) {
      // Flow control: stop reading until receives consume what is buffered;
      // TCP then stops the sender.
      rx_paused_ = true;
      break;
    }
    const char* payload = rx_buf_.data() + rx_begin_ + sizeof(WireMsg);
    rx_begin_ += frame;
    on_message(m, payload);
  }
  return !failed_;
}

bool Conn::progress_data() {
  for (std::size_t k = 0; k < streams_.size(); ++k) {
    DataStream& s = streams_[k];
    while (!s.tx.empty()) {
      Slice& sl = s.tx.front();
      ssize_t n = ::send(s.fd, sl.ptr + sl.done, sl.len - sl.done, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n < 0) {
        if (errno == EINTR) continue;
        if (would_block(errno)) break;
        char what[64];
        std::snprintf(what, sizeof(what), "send on data socket %zu", k + 1);
        io_error(what, errno);
        return false;
      }
      sl.done += static_cast<std::uint64_t>(n);
      if (sl.done < sl.len) break;
      Request* r = sl.req;
      s.tx.pop_front();
      if (--r->slices_left == 0) complete(r, r->size);
    }
    while (!s.rx.empty()) {
      Slice& sl = s.rx.front();
      ssize_t n = ::recv(s.fd, sl.ptr + sl.done, sl.len - sl.done, MSG_DONTWAIT);
      if (n == 0) {
        char why[128];
        std::snprintf(why, sizeof(why),
                      "the peer closed the connection in the middle of a message (EOF on data "
                      "socket %zu)",
                      k + 1);
        fail_conn(why);
        return false;
      }
      if (n < 0) {
        if (errno == EINTR) continue;
        if (would_block(errno)) break;
        char what[64];
        std::snprintf(what, sizeof(what), "recv on data socket %zu", k + 1);
        io_error(what, errno);
        return false;
      }
      sl.done += static_cast<std::uint64_t>(n);
      rx_data_bytes_ += static_cast<std::uint64_t>(n);
      if (sl.done < sl.len) break;
      Request* r = sl.req;
      s.rx.pop_front();
      if (--r->slices_left == 0) complete(r, r->size);
    }
  }
  return true;
}

// ---------------------------------------------------------------------------
// Failure

void Conn::fail_conn(const std::string& why) {
  if (failed_ || salvaging_) return;
  salvage_control();
  failed_ = true;
  failure_ = "tcp: connection to " + peer_ + " failed: " + why;
  std::size_t pending = 0;
  for (Request* r : live_)
    if (r->state == Request::State::pending) {
      fail_request(r, failure_);
      ++pending;
    }
  // A peer that closes an idle connection is an orderly shutdown, not news.
  ctx_->log(pending > 0 ? WIA_LOG_WARN : WIA_LOG_DEBUG, "%s (%zu pending requests failed)",
            failure_.c_str(), pending);
  tx_.clear();
  awaiting_cts_.clear();
  posted_.clear();
  for (DataStream& s : streams_) {
    s.tx.clear();
    s.rx.clear();
  }
  drop_unexpected_rts();
  close_sockets();
}

// Delivery before failure, for the control socket: a peer that gives up
// sends its reason (the communicator's abort message), then closes while
// what we sent it is unread, and its kernel resets the sockets. When the
// reset is what this side notices first (a send on a data socket), the
// reason still sits in the control socket's receive queue, which Linux
// keeps readable after a reset. Losing it made a surviving rank call the
// aborting one dead instead of the rank it named. So the complete messages
// in it reach their receives (or the unexpected queue) before everything
// fails; a partial one, EOF or an error ends the salvage.
void Conn::salvage_control() {
  if (ctrl_fd_ < 0 || peer_closed_ || connecting()) return;
  salvaging_ = true;
  for (int reads = 0; reads < 64 && parse_control() && !rx_paused_; ++reads) {
    if (rx_begin_ == rx_end_) rx_begin_ = rx_end_ = 0;
    if (rx_begin_ > 0) {
      std::memmove(rx_buf_.data(), rx_buf_.data() + rx_begin_, rx_end_ - rx_begin_);
      rx_end_ -= rx_begin_;
      rx_begin_ = 0;
    }
    if (rx_end_ == rx_buf_.size()) break;
    const ssize_t n =
        ::recv(ctrl_fd_, rx_buf_.data() + rx_end_, rx_buf_.size() - rx_end_, MSG_DONTWAIT);
    if (n <= 0 && !(n < 0 && errno == EINTR)) break;
    if (n > 0) rx_end_ += static_cast<std::size_t>(n);
  }
  salvaging_ = false;
}

// Eager messages already buffered stay deliverable; RTSs are not (their
// payload would have to come from a peer that is gone).
void Conn::drop_unexpected_rts() {
  for (auto it = unexpected_.begin(); it != unexpected_.end();) {
    auto& q = it->second;
    q.erase(std::remove_if(q.begin(), q.end(), [](const Unexpected& u) { return u.is_rts; }),
            q.end());
    it = q.empty() ? unexpected_.erase(it) : std::next(it);
  }
}

bool Conn::rx_slices_pending() const {
  for (const DataStream& s : streams_)
    if (!s.rx.empty()) return true;
  return false;
}

// Delivery before failure: a peer that sends a message and then closes
// (or exits) has put all of the message's payload on the data sockets
// before the control socket's FIN, so a receive that the CTS already
// matched completes from what is in flight. Only what can no longer
// complete fails now: receives without a message, every send (nobody will
// read it), RTSs not yet answered. A killed peer ends its data sockets
// too, so a receive whose payload stops short fails at once (EOF or reset
// on its data socket), not after a timeout.
void Conn::control_lost(const std::string& why) {
  if (failed_ || peer_closed_) return;
  if (!rx_slices_pending()) {
    fail_conn(why);
    return;
  }
  peer_closed_ = true;
  peer_closed_why_ = why;
  failure_ = "tcp: connection to " + peer_ + " failed: " + why;
  std::size_t failed_now = 0, draining = 0;
  for (Request* r : live_) {
    if (r->state != Request::State::pending) continue;
    if (!r->is_send && r->slices_left > 0) {
      ++draining;
      continue;
    }
    fail_request(r, failure_);
    ++failed_now;
  }
  ctx_->log(failed_now > 0 ? WIA_LOG_WARN : WIA_LOG_DEBUG,
            "%s (%zu pending requests failed; still receiving %zu messages already on their way)",
            failure_.c_str(), failed_now, draining);
  tx_.clear();
  awaiting_cts_.clear();
  posted_.clear();
  for (DataStream& s : streams_) s.tx.clear();
  drop_unexpected_rts();
  drain_progress_ns_ = 0;
}

void Conn::protocol_error(const char* fmt, ...) {
  char buf[320];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(buf, sizeof(buf), fmt, ap);
  va_end(ap);
  fail_conn(std::string("protocol violation by the peer: ") + buf);
}

void Conn::io_error(const char* what, int err) {
  if (err == ECONNRESET || err == EPIPE)
    fail_conn(std::string(what) + ": connection reset by the peer");
  else
    fail_conn(std::string(what) + ": " + errno_text(err));
}

}  // namespace wia::tcp
