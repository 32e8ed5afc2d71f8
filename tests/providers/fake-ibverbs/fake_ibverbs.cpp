// SPDX-License-Identifier: Apache-2.0
// A libibverbs.so.1 test double (README.md in this folder): one RoCE-like
// device whose RC queue pairs talk over unix sockets, between processes or
// inside one. Every context runs one progress thread that owns all socket
// I/O, so a caller of ibv_post_send never blocks on a peer.
#include <fcntl.h>
#include <infiniband/verbs.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

// verbs.h wraps these in macros; the double defines the exported functions.
#undef ibv_get_device_list
#undef ibv_query_port
#undef ibv_reg_mr

#define FAKE_EXPORT extern "C" __attribute__((visibility("default")))

namespace {

// One frame on a queue pair's socket. Requests (send, write) go out on the
// socket the QP connected at RTR; each is answered by an ack on the same
// socket, in order, once the responder has placed the data (and queued its
// completion), so a requester's completion means the peer has the data. A
// read is answered by an ack that carries the bytes read.
enum Op : std::uint32_t { kHello = 1, kSend, kWrite, kAck, kRead };
struct Frame {
  std::uint32_t op;
  std::uint32_t status;  // ack: the ibv_wc_status for the requester
  std::uint64_t len;
  std::uint64_t raddr;  // write: target address; hello: the target QPN
  std::uint32_t rkey;
  std::uint32_t imm;
  std::uint32_t has_imm;
  std::uint32_t read_len;  // read: bytes asked for (the request itself has no payload)
};

struct Ctx;
struct Qp;

struct Chan {  // one socket of a QP, both directions
  int fd = -1;
  std::vector<char> out;
  std::size_t out_off = 0;
  Frame hdr{};
  std::size_t hdr_got = 0;
  bool in_payload = false;
  std::uint64_t payload_got = 0;
  char* dest = nullptr;          // where the payload goes (nullptr: discard)
  std::uint64_t recv_wr_id = 0;  // the receive consumed by this frame
  bool consumed_recv = false;
  std::uint32_t reply = IBV_WC_SUCCESS;
  bool stalled = false;  // receiver not ready: no receive posted
  bool is_ack = false;   // the payload being read answers our read
};

struct Unacked {
  std::uint64_t wr_id;
  ibv_wc_opcode opcode;
  std::uint32_t len;
  char* read_dest = nullptr;  // read: the local buffer
};

struct Qp {
  ibv_qp qp{};
  Ctx* ctx = nullptr;
  ibv_srq* srq = nullptr;
  ibv_qp_state state = IBV_QPS_RESET;
  std::uint32_t dest_qpn = 0;
  ibv_gid dgid{};
  Chan req;   // requests out, acks in
  Chan resp;  // requests in, acks out
  std::deque<Unacked> unacked;
  std::uint64_t posted = 0;                   // send WRs posted, for fault injection
  ibv_wc_status next_error = IBV_WC_SUCCESS;  // given to the next send after a failure
};

struct Srq {
  ibv_srq srq{};
  std::deque<ibv_recv_wr> wrs;  // copies, sg_list stored alongside
  std::deque<ibv_sge> sges;
};

struct Cq {
  ibv_cq cq{};
  std::deque<ibv_wc> wcs;
  bool armed = false;
  std::uint64_t overruns = 0;
};

struct Channel {
  ibv_comp_channel ch{};
  int wfd = -1;
  std::deque<Cq*> events;
};

struct Mr {
  ibv_mr mr{};
  int access = 0;
  // ibv_reg_dmabuf_mr: the dma-buf mapped by the double (what a NIC's DMA
  // reaches), at the registered offset; addresses in work requests are
  // iovas (mr.addr = the iova) and land here. nullptr: host memory, where
  // an address is a pointer.
  char* host = nullptr;
  char* map = nullptr;  // the mapping, page-aligned
  std::size_t map_len = 0;
};

// Where the bytes of [addr, ...) of `m` are for the double.
char* bytes_at(const Mr* m, std::uint64_t addr) {
  if (m == nullptr || m->host == nullptr) return reinterpret_cast<char*>(addr);
  return m->host + (addr - reinterpret_cast<std::uintptr_t>(m->mr.addr));
}

struct Faults {
  long qp_error_after = -1;    // FAKE_IBV_QP_ERROR_AFTER
  long retry_exc_after = -1;   // FAKE_IBV_RETRY_EXC_AFTER
  bool remote_access = false;  // FAKE_IBV_REMOTE_ACCESS_ERROR
  long reg_limit = -1;         // FAKE_IBV_REG_MR_LIMIT: larger registrations fail
};

struct Ctx {
  ibv_context ctx{};
  std::mutex mu;
  ibv_gid gid{};
  int listen_fd = -1;
  int wake[2] = {-1, -1};
  std::thread thread;
  std::atomic<bool> stop{false};
  std::map<std::uint32_t, Qp*> qps;
  std::map<std::uint32_t, Mr*> mrs;  // by key (lkey == rkey)
  std::vector<Chan> hellos;          // accepted, waiting for their hello
  std::uint32_t next_qpn = 0x100;
  std::uint32_t next_key = 0x1000;
  Faults faults;
  void run();
};

std::atomic<std::uint64_t> g_reg_mr_calls{0};
std::atomic<std::uint64_t> g_reg_dmabuf_mr_calls{0};
std::atomic<std::int64_t> g_dmabuf_mrs_live{0};  // registered by dma-buf, not yet deregistered
std::atomic<std::uint32_t> g_context_seq{0};
// WRs posted on QPs connected to themselves (their own QPN and GID), by opcode.
std::atomic<std::uint64_t> g_self_qp_wrs[IBV_WR_RDMA_READ + 1] = {};
ibv_device g_device{};
ibv_device* g_list[2] = {&g_device, nullptr};

long env_long(const char* name, long fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::strtol(v, nullptr, 10) : fallback;
}

sockaddr_un socket_addr(const ibv_gid& gid, socklen_t* len) {
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::string name = "fake-ibverbs-";
  char hex[3];
  for (unsigned char b : gid.raw) {
    std::snprintf(hex, sizeof hex, "%02x", b);
    name += hex;
  }
  std::memcpy(a.sun_path + 1, name.data(), name.size());  // abstract namespace
  *len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
  return a;
}

void wake(Ctx* c) {
  const char b = 1;
  [[maybe_unused]] ssize_t n = write(c->wake[1], &b, 1);
}

void push_wc(Cq* cq, const ibv_wc& wc) {
  if (cq->wcs.size() >= static_cast<std::size_t>(cq->cq.cqe)) {
    ++cq->overruns;  // a real CQ would raise IBV_EVENT_CQ_ERR; the double counts and drops
    return;
  }
  cq->wcs.push_back(wc);
  if (cq->armed && cq->cq.channel != nullptr) {
    cq->armed = false;
    auto* ch = reinterpret_cast<Channel*>(cq->cq.channel);
    ch->events.push_back(cq);
    const char b = 1;
    [[maybe_unused]] ssize_t n = write(ch->wfd, &b, 1);
  }
}

void complete_send(Qp* q, const Unacked& u, ibv_wc_status status) {
  ibv_wc wc{};
  wc.wr_id = u.wr_id;
  wc.status = status;
  wc.opcode = u.opcode;
  wc.byte_len = u.len;
  wc.qp_num = q->qp.qp_num;
  wc.vendor_err = status == IBV_WC_SUCCESS ? 0 : 0x81;
  push_wc(reinterpret_cast<Cq*>(q->qp.send_cq), wc);
}

void close_chan(Chan& ch) {
  if (ch.fd >= 0) close(ch.fd);
  ch = Chan{};
}

// The QP enters the error state: the first outstanding send gets `first`,
// the others are flushed; a later post gets `next` (a peer that died is only
// noticed by the next send that times out).
void qp_error(Qp* q, ibv_wc_status first, ibv_wc_status next) {
  if (q->state == IBV_QPS_ERR) return;
  q->state = IBV_QPS_ERR;
  bool first_given = false;
  for (const Unacked& u : q->unacked) {
    complete_send(q, u, first_given ? IBV_WC_WR_FLUSH_ERR : first);
    first_given = true;
  }
  q->unacked.clear();
  q->next_error = first_given ? IBV_WC_WR_FLUSH_ERR : next;
  close_chan(q->req);
  close_chan(q->resp);
}

void queue_frame(Chan& ch, const Frame& f, const void* payload, std::size_t n) {
  const char* p = reinterpret_cast<const char*>(&f);
  ch.out.insert(ch.out.end(), p, p + sizeof f);
  if (n)
    ch.out.insert(ch.out.end(), static_cast<const char*>(payload),
                  static_cast<const char*>(payload) + n);
}

// Writes what is queued without blocking; false when the peer is gone.
bool flush(Chan& ch) {
  while (ch.fd >= 0 && ch.out_off < ch.out.size()) {
    const ssize_t n =
        send(ch.fd, ch.out.data() + ch.out_off,
             std::min<std::size_t>(ch.out.size() - ch.out_off, 1 << 20), MSG_NOSIGNAL);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) return true;
    if (n <= 0) return false;
    ch.out_off += static_cast<std::size_t>(n);
  }
  if (ch.out_off == ch.out.size()) {
    ch.out.clear();
    ch.out_off = 0;
  }
  return true;
}

Mr* find_mr(Ctx* c, std::uint32_t key, std::uint64_t addr, std::uint64_t len, int need) {
  auto it = c->mrs.find(key);
  if (it == c->mrs.end()) return nullptr;
  Mr* m = it->second;
  const auto base = reinterpret_cast<std::uintptr_t>(m->mr.addr);
  if (addr < base || addr + len > base + m->mr.length || (m->access & need) != need) return nullptr;
  return m;
}

Srq* srq_of(Qp* q) { return reinterpret_cast<Srq*>(q->srq); }

// A request frame's header is complete: decide where its payload goes.
// Returns false to stall (no receive posted: a real NIC sends RNR NAKs and
// the requester retries; here the socket is simply not read).
bool start_request(Qp* q, Chan& ch) {
  const Frame& f = ch.hdr;
  ch.dest = nullptr;
  ch.reply = IBV_WC_SUCCESS;
  ch.consumed_recv = false;
  if (f.op == kRead) {
    if (!find_mr(q->ctx, f.rkey, f.raddr, f.read_len, IBV_ACCESS_REMOTE_READ))
      ch.reply = IBV_WC_REM_ACCESS_ERR;
    return true;
  }
  if (f.op == kWrite &&
      (q->ctx->faults.remote_access ||
       (f.len > 0 && !find_mr(q->ctx, f.rkey, f.raddr, f.len, IBV_ACCESS_REMOTE_WRITE)))) {
    ch.reply = IBV_WC_REM_ACCESS_ERR;  // NAK: nothing written, no receive consumed
    return true;
  }
  const bool needs_recv = f.op == kSend || (f.op == kWrite && f.has_imm);
  if (needs_recv) {
    Srq* s = srq_of(q);
    if (s == nullptr || s->wrs.empty()) return false;
    ibv_recv_wr wr = s->wrs.front();
    ibv_sge sge = s->sges.front();
    s->wrs.pop_front();
    s->sges.pop_front();
    ch.recv_wr_id = wr.wr_id;
    ch.consumed_recv = true;
    if (f.op == kSend) {
      const Mr* m =
          f.len > 0 ? find_mr(q->ctx, sge.lkey, sge.addr, f.len, IBV_ACCESS_LOCAL_WRITE) : nullptr;
      if (f.len > sge.length || (f.len > 0 && m == nullptr))
        ch.reply = IBV_WC_REM_INV_REQ_ERR;
      else
        ch.dest = bytes_at(m, sge.addr);
    }
  }
  if (f.op == kWrite)
    ch.dest = bytes_at(
        f.len > 0 ? find_mr(q->ctx, f.rkey, f.raddr, f.len, IBV_ACCESS_REMOTE_WRITE) : nullptr,
        f.raddr);
  return true;
}

// The ack goes to the socket before the responder's completion is queued:
// a NIC acks on placement, so an application that sees its receive and
// closes at once cannot take the requester's ack down with it.
void finish_request(Qp* q, Chan& ch) {
  const Frame& f = ch.hdr;
  Frame ack{};
  ack.op = kAck;
  ack.status = ch.reply;
  if (f.op == kRead && ch.reply == IBV_WC_SUCCESS) {
    ack.len = f.read_len;
    const Mr* m = find_mr(q->ctx, f.rkey, f.raddr, f.read_len, IBV_ACCESS_REMOTE_READ);
    queue_frame(ch, ack, bytes_at(m, f.raddr), f.read_len);
  } else {
    queue_frame(ch, ack, nullptr, 0);
  }
  flush(ch);  // a gone peer is noticed by the next pump
  if (!ch.consumed_recv) return;
  ibv_wc wc{};
  wc.wr_id = ch.recv_wr_id;
  wc.qp_num = q->qp.qp_num;
  wc.byte_len = static_cast<std::uint32_t>(f.len);
  if (ch.reply != IBV_WC_SUCCESS) {
    wc.status = ch.reply == IBV_WC_REM_INV_REQ_ERR ? IBV_WC_LOC_LEN_ERR : IBV_WC_LOC_ACCESS_ERR;
  } else {
    wc.opcode = f.op == kSend ? IBV_WC_RECV : IBV_WC_RECV_RDMA_WITH_IMM;
    if (f.has_imm) {
      wc.wc_flags = IBV_WC_WITH_IMM;
      wc.imm_data = f.imm;
    }
  }
  push_wc(reinterpret_cast<Cq*>(q->qp.recv_cq), wc);
}

void on_ack(Qp* q, const Frame& f) {
  if (q->unacked.empty()) return;
  const Unacked u = q->unacked.front();
  q->unacked.pop_front();
  const auto st = static_cast<ibv_wc_status>(f.status);
  complete_send(q, u, st);
  if (st != IBV_WC_SUCCESS) qp_error(q, IBV_WC_WR_FLUSH_ERR, IBV_WC_WR_FLUSH_ERR);
}

// Reads what the socket has; false when the peer is gone.
bool pump(Qp* q, Chan& ch) {
  if (ch.stalled) return true;  // a header waits for a receive (resume)
  for (int rounds = 0; rounds < 64 && ch.fd >= 0; ++rounds) {
    if (!ch.in_payload) {
      const ssize_t n =
          recv(ch.fd, reinterpret_cast<char*>(&ch.hdr) + ch.hdr_got, sizeof(Frame) - ch.hdr_got, 0);
      if (n < 0 && (errno == EAGAIN || errno == EINTR)) return true;
      if (n <= 0) return false;
      ch.hdr_got += static_cast<std::size_t>(n);
      if (ch.hdr_got < sizeof(Frame)) continue;
      if (ch.hdr.op == kAck && ch.hdr.len == 0) {
        ch.hdr_got = 0;
        on_ack(q, ch.hdr);
        if (q->state == IBV_QPS_ERR) return true;
        continue;
      }
      if (ch.hdr.op != kSend && ch.hdr.op != kWrite && ch.hdr.op != kRead && ch.hdr.op != kAck)
        return false;
      ch.in_payload = true;
      ch.payload_got = 0;
      ch.stalled = false;
      ch.is_ack = ch.hdr.op == kAck;
      if (ch.is_ack) {  // read data: into the oldest outstanding read
        const bool read = !q->unacked.empty() && q->unacked.front().read_dest != nullptr &&
                          q->unacked.front().len == ch.hdr.len;
        ch.dest = read ? q->unacked.front().read_dest : nullptr;
      } else if (!start_request(q, ch)) {
        ch.stalled = true;
        ch.in_payload = false;
        return true;
      }
    }
    if (ch.payload_got < ch.hdr.len) {
      char scratch[65536];
      const std::uint64_t want = std::min<std::uint64_t>(ch.hdr.len - ch.payload_got, 1 << 20);
      char* to = ch.dest ? ch.dest + ch.payload_got : scratch;
      const ssize_t n =
          recv(ch.fd, to, ch.dest ? want : std::min<std::uint64_t>(want, sizeof scratch), 0);
      if (n < 0 && (errno == EAGAIN || errno == EINTR)) return true;
      if (n <= 0) return false;
      ch.payload_got += static_cast<std::uint64_t>(n);
      if (ch.payload_got < ch.hdr.len) continue;
    }
    ch.in_payload = false;
    ch.hdr_got = 0;
    if (ch.is_ack) {
      on_ack(q, ch.hdr);
      if (q->state == IBV_QPS_ERR) return true;
    } else {
      finish_request(q, ch);
    }
  }
  return true;
}

// A stalled frame retries once a receive is posted.
bool resume(Qp* q, Chan& ch) {
  if (!ch.stalled) return true;
  if (!start_request(q, ch)) return true;
  ch.stalled = false;
  ch.in_payload = true;
  ch.payload_got = 0;
  if (ch.hdr.len == 0) {
    finish_request(q, ch);
    ch.in_payload = false;
    ch.hdr_got = 0;
  }
  return pump(q, ch);
}

void Ctx::run() {
  std::vector<pollfd> fds;
  while (!stop.load()) {
    fds.clear();
    {
      std::lock_guard<std::mutex> lk(mu);
      fds.push_back({wake[0], POLLIN, 0});
      fds.push_back({listen_fd, POLLIN, 0});
      for (const Chan& h : hellos) fds.push_back({h.fd, POLLIN, 0});
      for (auto& [n, q] : qps) {
        for (Chan* ch : {&q->req, &q->resp}) {
          if (ch->fd < 0) continue;
          short ev = ch->stalled ? 0 : POLLIN;
          if (!ch->out.empty()) ev |= POLLOUT;
          fds.push_back({ch->fd, ev, 0});
        }
      }
    }
    if (poll(fds.data(), fds.size(), 100) < 0 && errno != EINTR) return;
    std::lock_guard<std::mutex> lk(mu);
    if (fds[0].revents) {
      char buf[256];
      while (read(wake[0], buf, sizeof buf) > 0) {
      }
    }
    if (fds[1].revents & POLLIN) {
      for (int fd;
           (fd = accept4(listen_fd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC)) >= 0;) {
        Chan h;
        h.fd = fd;
        hellos.push_back(std::move(h));
      }
    }
    for (std::size_t i = 0; i < hellos.size();) {
      Chan& h = hellos[i];
      const ssize_t n =
          recv(h.fd, reinterpret_cast<char*>(&h.hdr) + h.hdr_got, sizeof(Frame) - h.hdr_got, 0);
      if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
        ++i;
        continue;
      }
      if (n > 0) h.hdr_got += static_cast<std::size_t>(n);
      if (n > 0 && h.hdr_got < sizeof(Frame)) {
        ++i;
        continue;
      }
      auto it = n > 0 && h.hdr.op == kHello ? qps.find(static_cast<std::uint32_t>(h.hdr.raddr))
                                            : qps.end();
      if (it != qps.end() && it->second->state != IBV_QPS_ERR && it->second->resp.fd < 0) {
        it->second->resp.fd = h.fd;
      } else {
        close(h.fd);
      }
      hellos.erase(hellos.begin() + static_cast<std::ptrdiff_t>(i));
    }
    for (auto& [n, q] : qps) {
      if (q->state == IBV_QPS_ERR) continue;
      bool ok = resume(q, q->resp) && pump(q, q->resp) && flush(q->resp);
      if (ok && q->state != IBV_QPS_ERR) ok = pump(q, q->req) && flush(q->req);
      if (!ok) qp_error(q, IBV_WC_RETRY_EXC_ERR, IBV_WC_RETRY_EXC_ERR);
    }
  }
}

Ctx* ctx_of(ibv_context* c) { return reinterpret_cast<Ctx*>(c); }

// --- ops reached through ibv_context.ops (verbs.h's inline functions) ----------------

int poll_cq(ibv_cq* cq, int n, ibv_wc* wc) {
  std::lock_guard<std::mutex> lk(ctx_of(cq->context)->mu);
  auto* q = reinterpret_cast<Cq*>(cq);
  int got = 0;
  while (got < n && !q->wcs.empty()) {
    wc[got++] = q->wcs.front();
    q->wcs.pop_front();
  }
  return got;
}

int req_notify_cq(ibv_cq* cq, int) {
  std::lock_guard<std::mutex> lk(ctx_of(cq->context)->mu);
  reinterpret_cast<Cq*>(cq)->armed = true;
  return 0;
}

int post_srq_recv(ibv_srq* srq, ibv_recv_wr* wr, ibv_recv_wr** bad) {
  Ctx* c = ctx_of(srq->context);
  std::lock_guard<std::mutex> lk(c->mu);
  auto* s = reinterpret_cast<Srq*>(srq);
  for (; wr != nullptr; wr = wr->next) {
    if (wr->num_sge != 1) {  // the double keeps one buffer per receive
      *bad = wr;
      return EINVAL;
    }
    s->wrs.push_back(*wr);
    s->sges.push_back(wr->sg_list[0]);
  }
  wake(c);
  return 0;
}

int post_recv(ibv_qp*, ibv_recv_wr* wr, ibv_recv_wr** bad) {
  *bad = wr;  // receives are taken from a shared receive queue only
  return EOPNOTSUPP;
}

int post_send(ibv_qp* qp, ibv_send_wr* wr, ibv_send_wr** bad) {
  Ctx* c = ctx_of(qp->context);
  std::lock_guard<std::mutex> lk(c->mu);
  auto* q = reinterpret_cast<Qp*>(qp);
  if (q->state != IBV_QPS_RTS && q->state != IBV_QPS_ERR) {
    *bad = wr;
    return EINVAL;
  }
  for (; wr != nullptr; wr = wr->next) {
    if (wr->opcode != IBV_WR_SEND && wr->opcode != IBV_WR_RDMA_WRITE &&
        wr->opcode != IBV_WR_RDMA_WRITE_WITH_IMM && wr->opcode != IBV_WR_RDMA_READ) {
      *bad = wr;
      return EINVAL;
    }
    const bool read = wr->opcode == IBV_WR_RDMA_READ;
    if (read && wr->num_sge != 1) {  // the double reads into one buffer
      *bad = wr;
      return EINVAL;
    }
    std::vector<char> payload;
    bool local_ok = true;
    for (int i = 0; i < wr->num_sge && !read; ++i) {
      const ibv_sge& s = wr->sg_list[i];
      const Mr* m = nullptr;
      if (!(wr->send_flags & IBV_SEND_INLINE) && s.length > 0) {
        m = find_mr(c, s.lkey, s.addr, s.length, 0);
        if (m == nullptr) local_ok = false;
      }
      if (!local_ok) break;
      const char* p = bytes_at(m, s.addr);
      payload.insert(payload.end(), p, p + s.length);
    }
    Unacked u{wr->wr_id, wr->opcode == IBV_WR_SEND ? IBV_WC_SEND : IBV_WC_RDMA_WRITE,
              static_cast<std::uint32_t>(payload.size())};
    if (read) {
      const ibv_sge& s = wr->sg_list[0];
      const Mr* m =
          s.length > 0 ? find_mr(c, s.lkey, s.addr, s.length, IBV_ACCESS_LOCAL_WRITE) : nullptr;
      if (s.length > 0 && m == nullptr) local_ok = false;
      u = Unacked{wr->wr_id, IBV_WC_RDMA_READ, s.length,
                  m != nullptr ? bytes_at(m, s.addr) : reinterpret_cast<char*>(s.addr)};
    }
    ++q->posted;
    const long n = static_cast<long>(q->posted);
    if (q->dest_qpn == q->qp.qp_num && std::memcmp(q->dgid.raw, c->gid.raw, 16) == 0)
      g_self_qp_wrs[wr->opcode].fetch_add(1);
    if (q->state == IBV_QPS_ERR) {
      complete_send(q, u, q->next_error);
      q->next_error = IBV_WC_WR_FLUSH_ERR;
      continue;
    }
    if (c->faults.retry_exc_after >= 0 && n > c->faults.retry_exc_after) {
      q->unacked.push_back(u);
      qp_error(q, IBV_WC_RETRY_EXC_ERR, IBV_WC_WR_FLUSH_ERR);
      continue;
    }
    if (c->faults.qp_error_after >= 0 && n > c->faults.qp_error_after) {
      q->unacked.push_back(u);
      qp_error(q, IBV_WC_WR_FLUSH_ERR, IBV_WC_WR_FLUSH_ERR);
      continue;
    }
    if (!local_ok) {
      complete_send(q, u, IBV_WC_LOC_PROT_ERR);
      qp_error(q, IBV_WC_WR_FLUSH_ERR, IBV_WC_WR_FLUSH_ERR);
      continue;
    }
    Frame f{};
    f.op = wr->opcode == IBV_WR_SEND ? kSend : read ? kRead : kWrite;
    f.len = payload.size();
    if (read) f.read_len = u.len;
    if (wr->opcode != IBV_WR_SEND) {
      f.raddr = wr->wr.rdma.remote_addr;
      f.rkey = wr->wr.rdma.rkey;
    }
    f.has_imm = wr->opcode == IBV_WR_RDMA_WRITE_WITH_IMM;
    f.imm = wr->imm_data;
    q->unacked.push_back(u);
    queue_frame(q->req, f, payload.data(), payload.size());
  }
  if (!flush(q->req)) qp_error(q, IBV_WC_RETRY_EXC_ERR, IBV_WC_RETRY_EXC_ERR);
  if (!q->req.out.empty()) wake(c);
  return 0;
}

}  // namespace

// --- exported functions -----------------------------------------------------------------

FAKE_EXPORT ibv_device** ibv_get_device_list(int* num) {
  const long n = env_long("FAKE_IBV_DEVICES", 1);
  if (num) *num = n > 0 ? 1 : 0;
  std::snprintf(g_device.name, sizeof g_device.name, "fake0");
  std::snprintf(g_device.dev_name, sizeof g_device.dev_name, "uverbs0");
  g_device.node_type = IBV_NODE_CA;
  g_device.transport_type = IBV_TRANSPORT_IB;
  return n > 0 ? g_list : g_list + 1;
}

FAKE_EXPORT void ibv_free_device_list(ibv_device**) {}

FAKE_EXPORT const char* ibv_get_device_name(ibv_device* d) { return d->name; }

FAKE_EXPORT ibv_context* ibv_open_device(ibv_device* dev) {
  auto* c = new Ctx;
  c->ctx.device = dev;
  c->ctx.ops.poll_cq = poll_cq;
  c->ctx.ops.req_notify_cq = req_notify_cq;
  c->ctx.ops.post_srq_recv = post_srq_recv;
  c->ctx.ops.post_send = post_send;
  c->ctx.ops.post_recv = post_recv;
  c->ctx.cmd_fd = -1;
  c->ctx.async_fd = -1;
  c->ctx.num_comp_vectors = 1;
  c->faults.qp_error_after = env_long("FAKE_IBV_QP_ERROR_AFTER", -1);
  c->faults.retry_exc_after = env_long("FAKE_IBV_RETRY_EXC_AFTER", -1);
  c->faults.remote_access = env_long("FAKE_IBV_REMOTE_ACCESS_ERROR", 0) != 0;
  c->faults.reg_limit = env_long("FAKE_IBV_REG_MR_LIMIT", -1);
  // A link-local GID whose interface id names this process and context.
  c->gid.raw[0] = 0xfe;
  c->gid.raw[1] = 0x80;
  const std::uint32_t pid = static_cast<std::uint32_t>(getpid());
  const std::uint32_t seq = g_context_seq.fetch_add(1);
  std::memcpy(c->gid.raw + 8, &pid, 4);
  std::memcpy(c->gid.raw + 12, &seq, 4);
  c->listen_fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  socklen_t len = 0;
  const sockaddr_un a = socket_addr(c->gid, &len);
  if (c->listen_fd < 0 || bind(c->listen_fd, reinterpret_cast<const sockaddr*>(&a), len) != 0 ||
      listen(c->listen_fd, 64) != 0 || pipe2(c->wake, O_NONBLOCK | O_CLOEXEC) != 0) {
    if (c->listen_fd >= 0) close(c->listen_fd);
    delete c;
    errno = EIO;
    return nullptr;
  }
  c->thread = std::thread([c] { c->run(); });
  return &c->ctx;
}

FAKE_EXPORT int ibv_close_device(ibv_context* ctx) {
  Ctx* c = ctx_of(ctx);
  c->stop = true;
  wake(c);
  c->thread.join();
  close(c->listen_fd);
  close(c->wake[0]);
  close(c->wake[1]);
  for (Chan& h : c->hellos) close(h.fd);
  delete c;
  return 0;
}

FAKE_EXPORT int ibv_query_port(ibv_context*, std::uint8_t port, _compat_ibv_port_attr* out) {
  if (port != 1) return EINVAL;
  // Only the fields of the compat layout (up to link_layer) are written.
  ibv_port_attr a{};
  a.state = IBV_PORT_ACTIVE;
  a.max_mtu = IBV_MTU_4096;
  a.active_mtu = IBV_MTU_4096;
  a.gid_tbl_len = 1;
  a.max_msg_sz = 1u << 30;
  a.active_width = 2;   // 4x
  a.active_speed = 32;  // EDR
  a.phys_state = 5;
  a.link_layer = IBV_LINK_LAYER_ETHERNET;
  std::memcpy(out, &a, offsetof(ibv_port_attr, link_layer) + 1);
  return 0;
}

FAKE_EXPORT int ibv_query_gid(ibv_context* ctx, std::uint8_t port, int index, ibv_gid* gid) {
  if (port != 1 || index != 0) return EINVAL;
  std::lock_guard<std::mutex> lk(ctx_of(ctx)->mu);
  *gid = ctx_of(ctx)->gid;
  return 0;
}

FAKE_EXPORT ibv_pd* ibv_alloc_pd(ibv_context* ctx) {
  auto* pd = new ibv_pd{};
  pd->context = ctx;
  return pd;
}

FAKE_EXPORT int ibv_dealloc_pd(ibv_pd* pd) {
  delete pd;
  return 0;
}

FAKE_EXPORT ibv_mr* ibv_reg_mr(ibv_pd* pd, void* addr, std::size_t length, int access) {
  Ctx* c = ctx_of(pd->context);
  std::lock_guard<std::mutex> lk(c->mu);
  g_reg_mr_calls.fetch_add(1);
  if (c->faults.reg_limit >= 0 && length > static_cast<std::size_t>(c->faults.reg_limit)) {
    errno = ENOMEM;  // what a NIC out of translation entries (or a locked-memory limit) says
    return nullptr;
  }
  auto* m = new Mr;
  m->mr.context = pd->context;
  m->mr.pd = pd;
  m->mr.addr = addr;
  m->mr.length = length;
  m->mr.lkey = m->mr.rkey = c->next_key++;
  m->access = access;
  c->mrs[m->mr.lkey] = m;
  return &m->mr;
}

#ifndef FAKE_IBV_NO_DMABUF
// rdma-core 34's ibv_reg_dmabuf_mr: the double maps the dma-buf itself (a
// memfd stands for one: tests/providers/fake-cuda exports its device memory
// that way), so data moved through the region goes through the fd at
// `offset`, never through the iova, which the caller's CPU may not be able
// to touch. FAKE_IBV_REG_MR_LIMIT applies as to ibv_reg_mr.
FAKE_EXPORT ibv_mr* ibv_reg_dmabuf_mr(ibv_pd* pd, std::uint64_t offset, std::size_t length,
                                      std::uint64_t iova, int fd, int access) {
  Ctx* c = ctx_of(pd->context);
  std::lock_guard<std::mutex> lk(c->mu);
  g_reg_dmabuf_mr_calls.fetch_add(1);
  if (c->faults.reg_limit >= 0 && length > static_cast<std::size_t>(c->faults.reg_limit)) {
    errno = ENOMEM;
    return nullptr;
  }
  struct stat st {};
  if (length == 0 || fstat(fd, &st) != 0) {
    errno = length == 0 ? EINVAL : EBADF;
    return nullptr;
  }
  if (offset > static_cast<std::uint64_t>(st.st_size) ||
      length > static_cast<std::uint64_t>(st.st_size) - offset) {
    errno = EINVAL;  // the kernel refuses a range past the dma-buf's size
    return nullptr;
  }
  const auto page = static_cast<std::uint64_t>(sysconf(_SC_PAGESIZE));
  const std::uint64_t start = offset / page * page;
  const std::size_t map_len = static_cast<std::size_t>(offset - start + length);
  void* map =
      mmap(nullptr, map_len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, static_cast<off_t>(start));
  if (map == MAP_FAILED) return nullptr;  // errno from mmap
  auto* m = new Mr;
  m->mr.context = pd->context;
  m->mr.pd = pd;
  m->mr.addr = reinterpret_cast<void*>(iova);
  m->mr.length = length;
  m->mr.lkey = m->mr.rkey = c->next_key++;
  m->access = access;
  m->map = static_cast<char*>(map);
  m->map_len = map_len;
  m->host = m->map + (offset - start);
  c->mrs[m->mr.lkey] = m;
  g_dmabuf_mrs_live.fetch_add(1);
  return &m->mr;
}
#endif

FAKE_EXPORT int ibv_dereg_mr(ibv_mr* mr) {
  Ctx* c = ctx_of(mr->context);
  std::lock_guard<std::mutex> lk(c->mu);
  c->mrs.erase(mr->lkey);
  auto* m = reinterpret_cast<Mr*>(mr);
  if (m->map != nullptr) {
    munmap(m->map, m->map_len);
    g_dmabuf_mrs_live.fetch_sub(1);
  }
  delete m;
  return 0;
}

FAKE_EXPORT ibv_comp_channel* ibv_create_comp_channel(ibv_context* ctx) {
  auto* ch = new Channel;
  int p[2];
  if (pipe2(p, O_CLOEXEC) != 0 || fcntl(p[1], F_SETFL, O_NONBLOCK) != 0) {
    delete ch;
    return nullptr;
  }
  ch->ch.context = ctx;
  ch->ch.fd = p[0];
  ch->wfd = p[1];
  return &ch->ch;
}

FAKE_EXPORT int ibv_destroy_comp_channel(ibv_comp_channel* channel) {
  auto* ch = reinterpret_cast<Channel*>(channel);
  close(ch->ch.fd);
  close(ch->wfd);
  delete ch;
  return 0;
}

FAKE_EXPORT int ibv_get_cq_event(ibv_comp_channel* channel, ibv_cq** cq, void** cq_context) {
  char b;
  if (read(channel->fd, &b, 1) != 1) return -1;  // errno EAGAIN on a non-blocking fd
  Ctx* c = ctx_of(channel->context);
  std::lock_guard<std::mutex> lk(c->mu);
  auto* ch = reinterpret_cast<Channel*>(channel);
  if (ch->events.empty()) return -1;
  *cq = &ch->events.front()->cq;
  *cq_context = (*cq)->cq_context;
  ch->events.pop_front();
  return 0;
}

FAKE_EXPORT void ibv_ack_cq_events(ibv_cq*, unsigned int) {}

FAKE_EXPORT ibv_cq* ibv_create_cq(ibv_context* ctx, int cqe, void* cq_context,
                                  ibv_comp_channel* channel, int) {
  auto* q = new Cq;
  q->cq.context = ctx;
  q->cq.channel = channel;
  q->cq.cq_context = cq_context;
  q->cq.cqe = cqe;
  return &q->cq;
}

FAKE_EXPORT int ibv_destroy_cq(ibv_cq* cq) {
  delete reinterpret_cast<Cq*>(cq);
  return 0;
}

FAKE_EXPORT ibv_srq* ibv_create_srq(ibv_pd* pd, ibv_srq_init_attr* attr) {
  auto* s = new Srq;
  s->srq.context = pd->context;
  s->srq.pd = pd;
  s->srq.srq_context = attr->srq_context;
  return &s->srq;
}

FAKE_EXPORT int ibv_destroy_srq(ibv_srq* srq) {
  std::lock_guard<std::mutex> lk(ctx_of(srq->context)->mu);
  delete reinterpret_cast<Srq*>(srq);
  return 0;
}

FAKE_EXPORT ibv_qp* ibv_create_qp(ibv_pd* pd, ibv_qp_init_attr* attr) {
  if (attr->qp_type != IBV_QPT_RC || attr->srq == nullptr) {
    errno = EOPNOTSUPP;  // RC with a shared receive queue only
    return nullptr;
  }
  Ctx* c = ctx_of(pd->context);
  std::lock_guard<std::mutex> lk(c->mu);
  auto* q = new Qp;
  q->ctx = c;
  q->qp.context = pd->context;
  q->qp.pd = pd;
  q->qp.send_cq = attr->send_cq;
  q->qp.recv_cq = attr->recv_cq;
  q->qp.srq = attr->srq;
  q->qp.qp_type = IBV_QPT_RC;
  q->qp.qp_num = c->next_qpn++;
  q->qp.state = IBV_QPS_RESET;
  q->srq = attr->srq;
  c->qps[q->qp.qp_num] = q;
  return &q->qp;
}

FAKE_EXPORT int ibv_modify_qp(ibv_qp* qp, ibv_qp_attr* attr, int mask) {
  Ctx* c = ctx_of(qp->context);
  std::lock_guard<std::mutex> lk(c->mu);
  auto* q = reinterpret_cast<Qp*>(qp);
  if (!(mask & IBV_QP_STATE)) return 0;
  const ibv_qp_state to = attr->qp_state;
  if (to == IBV_QPS_ERR) {
    qp_error(q, IBV_WC_WR_FLUSH_ERR, IBV_WC_WR_FLUSH_ERR);
  } else if (to == IBV_QPS_RTR) {
    if (q->state != IBV_QPS_INIT || !(mask & IBV_QP_AV) || !(mask & IBV_QP_DEST_QPN) ||
        !attr->ah_attr.is_global)
      return EINVAL;  // RoCE addressing: a GRH with the peer's GID is needed
    q->dest_qpn = attr->dest_qp_num;
    q->dgid = attr->ah_attr.grh.dgid;
    // The "wire": a socket to the peer context, opened with a hello naming the QP.
    socklen_t len = 0;
    const sockaddr_un a = socket_addr(q->dgid, &len);
    const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0 || connect(fd, reinterpret_cast<const sockaddr*>(&a), len) != 0) {
      if (fd >= 0) close(fd);
      return EHOSTUNREACH;
    }
    fcntl(fd, F_SETFL, O_NONBLOCK);
    q->req.fd = fd;
    Frame hello{};
    hello.op = kHello;
    hello.raddr = q->dest_qpn;
    queue_frame(q->req, hello, nullptr, 0);
    flush(q->req);
    wake(c);
  } else if (to == IBV_QPS_RTS) {
    if (q->state != IBV_QPS_RTR) return EINVAL;
  } else if (to == IBV_QPS_INIT) {
    if (q->state != IBV_QPS_RESET) return EINVAL;
  }
  if (q->state != IBV_QPS_ERR) q->state = to;
  qp->state = q->state;
  return 0;
}

FAKE_EXPORT int ibv_destroy_qp(ibv_qp* qp) {
  Ctx* c = ctx_of(qp->context);
  std::lock_guard<std::mutex> lk(c->mu);
  auto* q = reinterpret_cast<Qp*>(qp);
  // Acks a NIC would already have sent still leave (briefly blocking).
  for (Chan* ch : {&q->req, &q->resp})
    for (int i = 0; i < 200 && ch->fd >= 0 && !ch->out.empty() && flush(*ch); ++i) {
      pollfd p{ch->fd, POLLOUT, 0};
      poll(&p, 1, 1);
    }
  close_chan(q->req);
  close_chan(q->resp);
  c->qps.erase(qp->qp_num);
  delete q;
  return 0;
}

FAKE_EXPORT const char* ibv_wc_status_str(ibv_wc_status status) {
  switch (status) {
    case IBV_WC_SUCCESS:
      return "success";
    case IBV_WC_LOC_LEN_ERR:
      return "local length error";
    case IBV_WC_LOC_PROT_ERR:
      return "local protection error";
    case IBV_WC_WR_FLUSH_ERR:
      return "Work Request Flushed Error";
    case IBV_WC_LOC_ACCESS_ERR:
      return "local access error";
    case IBV_WC_REM_INV_REQ_ERR:
      return "remote invalid request error";
    case IBV_WC_REM_ACCESS_ERR:
      return "remote access error";
    case IBV_WC_RETRY_EXC_ERR:
      return "transport retry counter exceeded";
    default:
      return "unknown";
  }
}

// Test hooks (not part of libibverbs): how many ibv_reg_mr calls this process made.
FAKE_EXPORT std::uint64_t fake_ibv_reg_mr_calls() { return g_reg_mr_calls.load(); }
// And how many ibv_reg_dmabuf_mr calls (not counted above).
FAKE_EXPORT std::uint64_t fake_ibv_reg_dmabuf_mr_calls() { return g_reg_dmabuf_mr_calls.load(); }
// How many WRs of `opcode` (ibv_wr_opcode, up to IBV_WR_RDMA_READ) this process
// posted on QPs connected to themselves (a loopback QP).
FAKE_EXPORT std::uint64_t fake_ibv_self_qp_wrs(int opcode) {
  return opcode >= 0 && opcode <= IBV_WR_RDMA_READ ? g_self_qp_wrs[opcode].load() : 0;
}
// And how many of those are still registered (not yet ibv_dereg_mr'd).
FAKE_EXPORT std::int64_t fake_ibv_dmabuf_mrs_live() { return g_dmabuf_mrs_live.load(); }
