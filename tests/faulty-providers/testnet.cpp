// SPDX-License-Identifier: Apache-2.0
// "testnet": a small, self-contained transport provider over Unix-domain
// stream sockets (abstract names, so nothing to clean up), correct unless a
// WIA_TESTNET_DEFECT_* macro injects exactly one defect. tests.cmake builds
// it once per defect so the conformance self-tests can check that
// wia-conformance flags each defect with the right L4 test ids. Without a
// defect it must pass L4.
//
// Design, kept simple on purpose: one socket per connection; frames of a
// fixed header plus payload; all progress happens inside provider calls
// (test, connect, accept) under one lock per context. Receives match posted
// requests of the same tag in post order, else the message waits in an
// unexpected queue. RMA is emulated with frames: PUT carries the data and
// completes on the target's ACK (so a done put is visible before any later
// message), GET asks and completes with the response. Peer death is EOF or
// a socket error, which fails every pending request with WIA_ERROR_REMOTE.
#include <errno.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>
#include <wia/provider.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#ifndef WIA_TESTNET_NAME
#error "WIA_TESTNET_NAME must name the provider"
#endif

namespace {

constexpr std::uint32_t kHandleMagic = 0x574e4554;  // "WNET"
constexpr std::uint32_t kRkeyMagic = 0x524b4559;    // "RKEY"
constexpr std::uint64_t kTailThreshold = 1ull << 20;
[[maybe_unused]] constexpr std::uint64_t kOverflowBytes = 256;
// "busy": more retries per send than a pipe holds of the harness's step
// records (64 KiB of about 40 B each).
[[maybe_unused]] constexpr std::uint32_t kBusyAnswers = 3000;

enum FrameType : std::uint32_t { kMsg = 1, kPut = 2, kPutAck = 3, kGetReq = 4, kGetResp = 5 };

struct Header {
  std::uint32_t type;
  std::int32_t status;  // PUT_ACK / GET_RESP: the target's verdict
  std::uint64_t tag;    // MSG: tag; PUT / GET_REQ: rkey id
  std::uint64_t size;   // payload bytes (GET_REQ: bytes asked for)
  std::uint64_t addr;   // PUT / GET_REQ: target address
  std::uint64_t id;     // PUT / GET: the initiator's request id
};

struct HandleWire {
  std::uint32_t magic;
  std::uint32_t name_len;
  char name[96];  // abstract socket name without the leading NUL
};
static_assert(sizeof(HandleWire) <= WIA_TRANSPORT_HANDLE_SIZE, "handle too large");

struct RkeyWire {
  std::uint32_t magic;
  std::uint32_t pad;
  std::uint64_t id, base, size;
};
static_assert(sizeof(RkeyWire) <= WIA_RKEY_SIZE, "rkey too large");

struct Conn;

struct Req {
  enum Kind { kSend, kRecv, kPut, kGet } kind;
  Conn* conn = nullptr;
  std::uint8_t* buf = nullptr;
  std::uint64_t capacity = 0;  // receive/get buffer size; send size
  std::uint64_t tag = 0;
  std::uint64_t id = 0;
  bool done = false;
  wia_status_t status = WIA_SUCCESS;
  std::uint64_t transferred = 0;
  std::string error;
};

struct Mr {
  std::uint64_t id;
  std::uint8_t* base;
  std::uint64_t size;
};

struct OutFrame {
  Header h{};
  const std::uint8_t* payload = nullptr;
  std::vector<std::uint8_t> owned;  // send_inline's copy (payload points into it)
  std::uint64_t sent = 0;  // bytes of header + payload written
  Req* req = nullptr;      // a send completes when its frame is written
};

struct Conn {
  int fd = -1;
  bool broken = false;
  std::string why;
  bool hello_sent = false;
  std::uint64_t cookie = 0;
  std::deque<OutFrame> out;
  // Incoming frame state.
  Header in_h{};
  std::size_t in_header_got = 0;
  bool in_payload = false;
  std::uint64_t in_left = 0;
  std::uint8_t* in_dst = nullptr;  // NULL: discard
  Req* in_req = nullptr;
  std::vector<std::uint8_t> in_unexpected;
  bool in_is_unexpected = false;
  std::int32_t in_put_status = WIA_SUCCESS;
  std::map<std::uint64_t, std::deque<Req*>> posted;  // receives by tag, in post order
  std::map<std::uint64_t, std::deque<std::vector<std::uint8_t>>> unexpected;
  std::map<std::uint64_t, Req*> rma;  // puts/gets waiting for the target
  std::set<Req*> reqs;                // every live request of this connection
  std::uint32_t busy_answers = 0;     // "busy": retries answered so far
};

struct Accepting {
  int fd;
  std::uint8_t hello[8];
  std::size_t got = 0;
};

struct Listener {
  int fd = -1;
  std::vector<Accepting> pending;
};

struct Ctx {
  const wia_host_services_v1_t* host = nullptr;
  std::mutex mu;
  std::set<Conn*> conns;
  std::set<Listener*> listeners;
  std::map<Req*, std::unique_ptr<Req>> reqs;
  std::map<std::uint64_t, Mr> mrs;
  std::set<Mr*> mr_handles;
  std::uint64_t next_id = 1;

  wia_status_t fail(wia_status_t st, const std::string& message) const {
    host->set_error(host->host_ctx, message.c_str());
    return st;
  }
};

std::atomic<std::uint64_t> g_listener_serial{0};

void finish(Req* r, wia_status_t st, std::uint64_t bytes, std::string error = {}) {
  r->done = true;
  r->status = st;
  r->transferred = bytes;
  r->error = std::move(error);
}

#if defined(WIA_TESTNET_DEFECT_TAIL)
void corrupt_tail(Req* r) {
  // Defect: the last 64 bytes of large messages are garbage.
  if (r->transferred > kTailThreshold) std::memset(r->buf + r->transferred - 64, 0xCD, 64);
}
#else
void corrupt_tail(Req*) { (void)kTailThreshold; }
#endif

void mark_broken(Conn* c, const std::string& why) {
  if (c->broken) return;
#if defined(WIA_TESTNET_DEFECT_NODEATH)
  // Defect: the connection just goes quiet; its requests stay pending.
  c->broken = true;
  c->why = why;
  return;
#else
  c->broken = true;
  c->why = why;
  for (Req* r : c->reqs)
    if (!r->done) finish(r, WIA_ERROR_REMOTE, 0, "testnet: connection to the peer lost: " + why);
  c->posted.clear();
  c->rma.clear();
  c->out.clear();
#endif
}

// Delivers a complete unexpected message to a receive.
void deliver(Req* r, const std::vector<std::uint8_t>& data) {
  if (data.size() > r->capacity) {
    finish(r, WIA_ERROR_REMOTE, 0,
           "testnet: message of " + std::to_string(data.size()) + " bytes for a receive of " +
               std::to_string(r->capacity));
    return;
  }
#if !defined(WIA_TESTNET_DEFECT_NODATA)
  if (!data.empty()) std::memcpy(r->buf, data.data(), data.size());
#endif
  finish(r, WIA_SUCCESS, data.size());
  corrupt_tail(r);
}

Req* take_posted(Conn* c, std::uint64_t tag) {
  auto it = c->posted.find(tag);
  if (it == c->posted.end() || it->second.empty()) return nullptr;
#if defined(WIA_TESTNET_DEFECT_REORDER)
  // Defect: the newest posted receive of a tag gets the next message.
  Req* r = it->second.back();
  it->second.pop_back();
#else
  Req* r = it->second.front();
  it->second.pop_front();
#endif
  return r;
}

const Mr* find_region(Ctx* x, std::uint64_t id, std::uint64_t addr, std::uint64_t size) {
  auto it = x->mrs.find(id);
  if (it == x->mrs.end()) return nullptr;
  const Mr& m = it->second;
  const auto base = reinterpret_cast<std::uintptr_t>(m.base);
  if (addr < base || addr - base > m.size || size > m.size - (addr - base)) return nullptr;
  return &m;
}

void queue_frame(Conn* c, const Header& h, const std::uint8_t* payload, Req* req) {
  OutFrame f;
  f.h = h;
  f.payload = payload;
  f.req = req;
  c->out.push_back(f);
}

// A header has arrived: decide where its payload goes.
void on_header(Ctx* x, Conn* c) {
  Header& h = c->in_h;
  c->in_dst = nullptr;
  c->in_req = nullptr;
  c->in_is_unexpected = false;
  c->in_left = h.size;
  switch (h.type) {
    case kMsg: {
      Req* r = take_posted(c, h.tag);
      if (r == nullptr) {
        c->in_unexpected.assign(h.size, 0);
        c->in_dst = c->in_unexpected.data();
        c->in_is_unexpected = true;
        break;
      }
      c->in_req = r;
#if defined(WIA_TESTNET_DEFECT_OVERFLOW)
      // Defect: the receive size is not enforced (bounded here so the
      // test's guard bytes, not random memory, take the overflow).
      c->in_dst = r->buf;
#elif defined(WIA_TESTNET_DEFECT_NODATA)
      // Defect: the payload is dropped, the receive still succeeds.
#else
      if (h.size <= r->capacity) c->in_dst = r->buf;
#endif
      break;
    }
    case kPut: {
      const Mr* m = find_region(x, h.tag, h.addr, h.size);
      c->in_put_status = m != nullptr ? WIA_SUCCESS : WIA_ERROR_INVALID_ARGUMENT;
      if (m != nullptr) c->in_dst = reinterpret_cast<std::uint8_t*>(h.addr);
      break;
    }
    case kGetResp: {
      auto it = c->rma.find(h.id);
      if (it != c->rma.end() && h.size <= it->second->capacity) {
        c->in_req = it->second;
        c->in_dst = it->second->buf;
      }
      break;
    }
    default:
      break;
  }
}

// A frame (header and payload) is complete.
void on_frame(Ctx* x, Conn* c) {
  Header& h = c->in_h;
  switch (h.type) {
    case kMsg:
      if (c->in_is_unexpected) {
        // A receive may have been posted while the payload streamed in.
        if (Req* r = take_posted(c, h.tag))
          deliver(r, c->in_unexpected);
        else
          c->unexpected[h.tag].push_back(std::move(c->in_unexpected));
        c->in_unexpected = {};
      } else if (Req* r = c->in_req) {
#if defined(WIA_TESTNET_DEFECT_OVERFLOW)
        finish(r, WIA_SUCCESS, h.size);
#else
        if (h.size <= r->capacity)
          finish(r, WIA_SUCCESS, h.size);
        else
          finish(r, WIA_ERROR_REMOTE, 0,
                 "testnet: message of " + std::to_string(h.size) + " bytes (tag " +
                     std::to_string(h.tag) + ") for a receive of " + std::to_string(r->capacity));
#endif
        corrupt_tail(r);
      }
      break;
    case kPut: {
      Header ack{};
      ack.type = kPutAck;
      ack.status = c->in_put_status;
      ack.id = h.id;
      queue_frame(c, ack, nullptr, nullptr);
      break;
    }
    case kPutAck: {
      auto it = c->rma.find(h.id);
      if (it != c->rma.end()) {
        Req* r = it->second;
        c->rma.erase(it);
        if (h.status == WIA_SUCCESS)
          finish(r, WIA_SUCCESS, r->capacity);
        else
          finish(r, h.status, 0, "testnet: the target refused the put (address outside the rkey)");
      }
      break;
    }
    case kGetReq: {
      const Mr* m = find_region(x, h.tag, h.addr, h.size);
      Header resp{};
      resp.type = kGetResp;
      resp.id = h.id;
      resp.status = m != nullptr ? WIA_SUCCESS : WIA_ERROR_INVALID_ARGUMENT;
      resp.size = m != nullptr ? h.size : 0;
      queue_frame(c, resp, m != nullptr ? reinterpret_cast<std::uint8_t*>(h.addr) : nullptr,
                  nullptr);
      break;
    }
    case kGetResp: {
      auto it = c->rma.find(h.id);
      if (it != c->rma.end()) {
        Req* r = it->second;
        c->rma.erase(it);
        if (h.status != WIA_SUCCESS)
          finish(r, h.status, 0, "testnet: the target refused the get");
        else if (c->in_req != r)
          finish(r, WIA_ERROR_REMOTE, 0, "testnet: get response larger than the buffer");
        else
          finish(r, WIA_SUCCESS, h.size);
      }
      break;
    }
    default:
      mark_broken(c, "unknown frame type " + std::to_string(h.type));
  }
}

void progress_read(Ctx* x, Conn* c) {
  std::uint8_t scratch[65536];
  while (!c->broken) {
    ssize_t n;
    if (!c->in_payload) {
      n = ::recv(c->fd, reinterpret_cast<char*>(&c->in_h) + c->in_header_got,
                 sizeof(Header) - c->in_header_got, MSG_DONTWAIT);
      if (n > 0) {
        c->in_header_got += static_cast<std::size_t>(n);
        if (c->in_header_got == sizeof(Header)) {
          c->in_header_got = 0;
          c->in_payload = true;
          on_header(x, c);
          // Payload bytes the overflow defect does not write still arrive.
          c->in_left = c->in_h.type == kGetReq || c->in_h.type == kPutAck ? 0 : c->in_h.size;
        }
      }
    } else if (c->in_left > 0) {
      const std::uint64_t written = c->in_h.size - c->in_left;
      std::uint8_t* dst = c->in_dst != nullptr ? c->in_dst + written : scratch;
      std::uint64_t want = c->in_left;
      if (c->in_dst == nullptr) want = std::min<std::uint64_t>(want, sizeof(scratch));
#if defined(WIA_TESTNET_DEFECT_OVERFLOW)
      // Stop writing into the receive buffer past capacity + kOverflowBytes.
      if (c->in_dst != nullptr && c->in_req != nullptr) {
        const std::uint64_t limit = c->in_req->capacity + kOverflowBytes;
        if (written >= limit) {
          dst = scratch;
          want = std::min<std::uint64_t>(want, sizeof(scratch));
        } else {
          want = std::min(want, limit - written);
        }
      }
#endif
      n = ::recv(c->fd, dst, want, MSG_DONTWAIT);
      if (n > 0) c->in_left -= static_cast<std::uint64_t>(n);
    } else {
      n = 1;
    }
    if (n == 0) {
      mark_broken(c, "the peer closed the connection");
      return;
    }
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK) mark_broken(c, std::strerror(errno));
      return;
    }
    if (c->in_payload && c->in_left == 0) {
      c->in_payload = false;
      on_frame(x, c);
    }
  }
}

void progress_write(Conn* c) {
  while (!c->broken && !c->out.empty()) {
    OutFrame& f = c->out.front();
    const std::uint64_t payload = f.h.type == kGetReq ? 0 : f.h.size;
    const std::uint64_t total = sizeof(Header) + payload;
    iovec iov[2];
    int n_iov = 0;
    if (f.sent < sizeof(Header)) {
      iov[n_iov].iov_base = reinterpret_cast<char*>(&f.h) + f.sent;
      iov[n_iov].iov_len = sizeof(Header) - f.sent;
      ++n_iov;
    }
    if (payload > 0) {
      const std::uint64_t done = f.sent > sizeof(Header) ? f.sent - sizeof(Header) : 0;
      iov[n_iov].iov_base = const_cast<std::uint8_t*>(f.payload) + done;
      iov[n_iov].iov_len = payload - done;
      ++n_iov;
    }
    msghdr m{};
    m.msg_iov = iov;
    m.msg_iovlen = static_cast<std::size_t>(n_iov);
    const ssize_t n = ::sendmsg(c->fd, &m, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK) mark_broken(c, std::strerror(errno));
      return;
    }
    f.sent += static_cast<std::uint64_t>(n);
    if (f.sent == total) {
      if (f.req != nullptr && f.req->kind == Req::kSend) finish(f.req, WIA_SUCCESS, payload);
      c->out.pop_front();
    }
  }
}

void progress_all(Ctx* x) {
  for (Conn* c : x->conns) {
    if (c->broken) continue;
    progress_write(c);
    progress_read(x, c);
    progress_write(c);  // acks and responses queued by the reads
  }
}

Req* new_req(Ctx* x, Conn* c, Req::Kind kind) {
  auto owned = std::make_unique<Req>();
  Req* r = owned.get();
  r->kind = kind;
  r->conn = c;
  r->id = x->next_id++;
  x->reqs.emplace(r, std::move(owned));
  c->reqs.insert(r);
  return r;
}

void release(Ctx* x, Req* r) {
  if (r->conn != nullptr) r->conn->reqs.erase(r);
  x->reqs.erase(r);
}

// --- entry points ------------------------------------------------------------------

template <typename F>
wia_status_t guarded(Ctx* x, F&& f) {
  try {
    std::lock_guard<std::mutex> lock(x->mu);
    return f();
  } catch (const std::exception& e) {
    return x->fail(WIA_ERROR_INTERNAL, std::string("testnet: ") + e.what());
  }
}

wia_status_t tn_init(const wia_host_services_v1_t* host, void** ctx) {
  if (host == nullptr || host->abi_version < 1) return WIA_ERROR_ABI_MISMATCH;
  auto* x = new (std::nothrow) Ctx;
  if (x == nullptr) return WIA_ERROR_OUT_OF_MEMORY;
  x->host = host;
  *ctx = x;
  return WIA_SUCCESS;
}

wia_status_t tn_fini(void* ctx) {
  auto* x = static_cast<Ctx*>(ctx);
  for (Conn* c : x->conns) {
    ::close(c->fd);
    delete c;
  }
  for (Listener* l : x->listeners) {
    ::close(l->fd);
    for (auto& a : l->pending) ::close(a.fd);
    delete l;
  }
  for (Mr* m : x->mr_handles) delete m;
  delete x;
  return WIA_SUCCESS;
}

wia_status_t tn_endpoint_count(void*, std::int32_t* count) {
  *count = 1;
  return WIA_SUCCESS;
}

wia_status_t tn_endpoint_props(void* ctx, std::int32_t ep, wia_transport_props_v1_t* props) {
  auto* x = static_cast<Ctx*>(ctx);
  if (ep != 0)
    return x->fail(WIA_ERROR_INVALID_ARGUMENT,
                   "testnet: no endpoint " + std::to_string(ep) + " (have 1)");
  wia_transport_props_v1_t p{};
  p.struct_size = props->struct_size;
  p.flags = WIA_TRANSPORT_FLAG_INTRA_NODE | WIA_TRANSPORT_FLAG_RMA;
  std::snprintf(p.name, sizeof(p.name), "unix");
  p.speed_mbps = 0;
  p.latency_us = 5.0;
  p.max_message_size = 1ull << 30;
  p.max_requests = 4096;
  p.numa_node = -1;
  p.tag_bits = 64;
  p.mem_ifaces = 1u << WIA_MEM_IFACE_HOST;
  std::memcpy(props, &p, std::min<std::size_t>(props->struct_size, sizeof(p)));
  return WIA_SUCCESS;
}

wia_status_t tn_listen(void* ctx, std::int32_t ep, void* handle, wia_listener_t* listener) {
  auto* x = static_cast<Ctx*>(ctx);
  return guarded(x, [&]() -> wia_status_t {
    if (ep != 0) return x->fail(WIA_ERROR_INVALID_ARGUMENT, "testnet: listen: no such endpoint");
    HandleWire w{};
    w.magic = kHandleMagic;
    timespec ts{};
    clock_gettime(CLOCK_MONOTONIC, &ts);
    const int len = std::snprintf(w.name, sizeof(w.name), "wia-testnet-%d-%llu-%ld", getpid(),
                                  static_cast<unsigned long long>(g_listener_serial++),
                                  static_cast<long>(ts.tv_nsec));
    w.name_len = static_cast<std::uint32_t>(len);
    const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) return x->fail(WIA_ERROR_IO, std::string("testnet: socket: ") + strerror(errno));
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::memcpy(addr.sun_path + 1, w.name, w.name_len);
    const socklen_t alen = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + w.name_len);
    if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), alen) != 0 || ::listen(fd, 128) != 0) {
      const int e = errno;
      ::close(fd);
      return x->fail(WIA_ERROR_IO, std::string("testnet: bind/listen: ") + strerror(e));
    }
    auto* l = new Listener;
    l->fd = fd;
    x->listeners.insert(l);
    std::memset(handle, 0, WIA_TRANSPORT_HANDLE_SIZE);
    std::memcpy(handle, &w, sizeof(w));
    *listener = reinterpret_cast<wia_listener_t>(l);
    return WIA_SUCCESS;
  });
}

wia_status_t tn_connect(void* ctx, std::int32_t, const void* handle, std::uint64_t cookie,
                        wia_conn_t* conn) {
  auto* x = static_cast<Ctx*>(ctx);
  return guarded(x, [&]() -> wia_status_t {
    Conn* c = reinterpret_cast<Conn*>(*conn);
    if (c == nullptr) {
      HandleWire w;
      std::memcpy(&w, handle, sizeof(w));
      if (w.magic != kHandleMagic || w.name_len == 0 || w.name_len > sizeof(w.name))
        return x->fail(WIA_ERROR_INVALID_ARGUMENT, "testnet: connect: not a testnet handle");
      const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
      if (fd < 0) return x->fail(WIA_ERROR_IO, std::string("testnet: socket: ") + strerror(errno));
      sockaddr_un addr{};
      addr.sun_family = AF_UNIX;
      std::memcpy(addr.sun_path + 1, w.name, w.name_len);
      const socklen_t alen =
          static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + w.name_len);
      // A non-blocking Unix connect either completes at once or fails
      // (EAGAIN: the listener's backlog is full).
      if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), alen) != 0) {
        const int e = errno;
        ::close(fd);
        return x->fail(e == ECONNREFUSED ? WIA_ERROR_REMOTE : WIA_ERROR_IO,
                       std::string("testnet: connect: ") + strerror(e));
      }
      c = new Conn;
      c->fd = fd;
      c->cookie = cookie;
      x->conns.insert(c);
      *conn = reinterpret_cast<wia_conn_t>(c);
      // The hello goes out now, but the first call always says "in
      // progress" so a core's retry path is exercised.
      const ssize_t n = ::send(fd, &cookie, sizeof(cookie), MSG_DONTWAIT | MSG_NOSIGNAL);
      c->hello_sent = n == static_cast<ssize_t>(sizeof(cookie));
      return WIA_IN_PROGRESS;
    }
    if (!c->hello_sent) {
      const ssize_t n = ::send(c->fd, &c->cookie, sizeof(c->cookie), MSG_DONTWAIT | MSG_NOSIGNAL);
      if (n < 0 && errno != EAGAIN)
        return x->fail(WIA_ERROR_REMOTE, std::string("testnet: connect: ") + strerror(errno));
      c->hello_sent = n == static_cast<ssize_t>(sizeof(c->cookie));
      if (!c->hello_sent) return WIA_IN_PROGRESS;
    }
    return WIA_SUCCESS;
  });
}

wia_status_t tn_accept(void* ctx, wia_listener_t listener, std::uint64_t* cookie,
                       wia_conn_t* conn) {
  auto* x = static_cast<Ctx*>(ctx);
  return guarded(x, [&]() -> wia_status_t {
    auto* l = reinterpret_cast<Listener*>(listener);
    *conn = nullptr;
    for (;;) {
      const int fd = ::accept4(l->fd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) break;
      l->pending.push_back({fd, {}, 0});
    }
    for (auto it = l->pending.begin(); it != l->pending.end();) {
      const ssize_t n =
          ::recv(it->fd, it->hello + it->got, sizeof(it->hello) - it->got, MSG_DONTWAIT);
      if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) {
        ::close(it->fd);  // gave up before saying hello
        it = l->pending.erase(it);
        continue;
      }
      if (n > 0) it->got += static_cast<std::size_t>(n);
      if (it->got == sizeof(it->hello)) {
        auto* c = new Conn;
        c->fd = it->fd;
        c->hello_sent = true;
        std::memcpy(cookie, it->hello, sizeof(*cookie));
        x->conns.insert(c);
        l->pending.erase(it);
        *conn = reinterpret_cast<wia_conn_t>(c);
        return WIA_SUCCESS;
      }
      ++it;
    }
    return WIA_IN_PROGRESS;
  });
}

wia_status_t tn_close_listener(void* ctx, wia_listener_t listener) {
  auto* x = static_cast<Ctx*>(ctx);
  return guarded(x, [&]() -> wia_status_t {
    auto* l = reinterpret_cast<Listener*>(listener);
    if (x->listeners.erase(l) == 0)
      return x->fail(WIA_ERROR_INVALID_HANDLE, "testnet: close_listener: unknown listener");
    ::close(l->fd);
    for (auto& a : l->pending) ::close(a.fd);
    delete l;
    return WIA_SUCCESS;
  });
}

wia_status_t tn_reg_mr(void* ctx, std::int32_t, const wia_mr_desc_v1_t* d, wia_mr_t* mr) {
  auto* x = static_cast<Ctx*>(ctx);
  return guarded(x, [&]() -> wia_status_t {
    if (d == nullptr || !WIA_ABI_HAS_FIELD(wia_mr_desc_v1_t, d->struct_size, iface))
      return x->fail(WIA_ERROR_INVALID_ARGUMENT, "testnet: reg_mr: descriptor too short");
    if (d->kind != WIA_MR_HOST || d->iface != WIA_MEM_IFACE_HOST)
      return x->fail(WIA_ERROR_NOT_SUPPORTED,
                     "testnet: reg_mr: only host memory (no FLAG_DEVICE_MEMORY)");
    auto* m = new Mr{x->next_id++, static_cast<std::uint8_t*>(d->ptr), d->size};
    x->mrs[m->id] = *m;
    x->mr_handles.insert(m);
    *mr = reinterpret_cast<wia_mr_t>(m);
    return WIA_SUCCESS;
  });
}

wia_status_t tn_dereg_mr(void* ctx, wia_mr_t mr) {
  auto* x = static_cast<Ctx*>(ctx);
  return guarded(x, [&]() -> wia_status_t {
    auto* m = reinterpret_cast<Mr*>(mr);
    if (x->mr_handles.erase(m) == 0)
      return x->fail(WIA_ERROR_INVALID_HANDLE, "testnet: dereg_mr: unknown registration");
    x->mrs.erase(m->id);
    delete m;
    return WIA_SUCCESS;
  });
}

Conn* live_conn(Ctx* x, wia_conn_t conn) {
  auto* c = reinterpret_cast<Conn*>(conn);
  return x->conns.count(c) != 0 ? c : nullptr;
}

wia_status_t broken_conn(Ctx* x, Conn* c, const char* call) {
  return x->fail(WIA_ERROR_REMOTE,
                 std::string("testnet: ") + call + ": connection to the peer lost: " + c->why);
}

wia_status_t tn_isend(void* ctx, wia_conn_t conn, const void* buf, std::uint64_t size,
                      std::uint64_t tag, wia_mr_t, wia_request_t* request) {
  auto* x = static_cast<Ctx*>(ctx);
  return guarded(x, [&]() -> wia_status_t {
    Conn* c = live_conn(x, conn);
    if (c == nullptr)
      return x->fail(WIA_ERROR_INVALID_HANDLE, "testnet: isend: unknown connection");
#if !defined(WIA_TESTNET_DEFECT_NODEATH)
    if (c->broken) return broken_conn(x, c, "isend");
#endif
#if defined(WIA_TESTNET_DEFECT_BUSY)
    // Not a defect: a transport short of resources answers "retry" (no
    // request), here to the first kBusyAnswers posts of a connection's
    // sends. A conformant caller drives progress and posts again.
    if (c->busy_answers < kBusyAnswers) {
      ++c->busy_answers;
      *request = nullptr;
      return WIA_SUCCESS;
    }
#endif
    Req* r = new_req(x, c, Req::kSend);
    r->buf = static_cast<std::uint8_t*>(const_cast<void*>(buf));
    r->capacity = size;
    r->tag = tag;
    Header h{};
    h.type = kMsg;
    h.tag = tag;
    h.size = size;
    queue_frame(c, h, r->buf, r);
    *request = reinterpret_cast<wia_request_t>(r);
    return WIA_SUCCESS;
  });
}

wia_status_t tn_irecv(void* ctx, wia_conn_t conn, void* buf, std::uint64_t size, std::uint64_t tag,
                      wia_mr_t, wia_request_t* request) {
  auto* x = static_cast<Ctx*>(ctx);
  return guarded(x, [&]() -> wia_status_t {
    Conn* c = live_conn(x, conn);
    if (c == nullptr)
      return x->fail(WIA_ERROR_INVALID_HANDLE, "testnet: irecv: unknown connection");
#if !defined(WIA_TESTNET_DEFECT_NODEATH)
    if (c->broken) return broken_conn(x, c, "irecv");
#endif
    Req* r = new_req(x, c, Req::kRecv);
    r->buf = static_cast<std::uint8_t*>(buf);
    r->capacity = size;
    r->tag = tag;
    auto it = c->unexpected.find(tag);
    if (it != c->unexpected.end() && !it->second.empty()) {
      deliver(r, it->second.front());
      it->second.pop_front();
    } else {
      c->posted[tag].push_back(r);
    }
    *request = reinterpret_cast<wia_request_t>(r);
    return WIA_SUCCESS;
  });
}

wia_status_t tn_test(void* ctx, wia_request_t request, std::int32_t* done, std::uint64_t* size) {
  auto* x = static_cast<Ctx*>(ctx);
#if defined(WIA_TESTNET_DEFECT_HANG)
  // Defect: testing a receive never returns.
  if (reinterpret_cast<Req*>(request)->kind == Req::kRecv)
    for (;;) pause();
#endif
  return guarded(x, [&]() -> wia_status_t {
    auto* r = reinterpret_cast<Req*>(request);
    if (x->reqs.count(r) == 0)
      return x->fail(WIA_ERROR_INVALID_HANDLE, "testnet: test: unknown or released request");
    *done = 0;
    if (!r->done) progress_all(x);
    if (!r->done) return WIA_SUCCESS;
    const wia_status_t st = r->status;
    *size = r->transferred;
    if (st == WIA_SUCCESS) *done = 1;
    std::string error = r->error;
    release(x, r);
    if (st != WIA_SUCCESS) return x->fail(st, error);
    return WIA_SUCCESS;
  });
}

// Inline messages: a send copied into its frame at once (declined above
// 4 KiB), a receive taken from the unexpected queue.
wia_status_t tn_send_inline(void* ctx, wia_conn_t conn, const void* buf, std::uint64_t size,
                            std::uint64_t tag) {
  auto* x = static_cast<Ctx*>(ctx);
  return guarded(x, [&]() -> wia_status_t {
    Conn* c = live_conn(x, conn);
    if (c == nullptr)
      return x->fail(WIA_ERROR_INVALID_HANDLE, "testnet: send_inline: unknown connection");
    if (c->broken) return broken_conn(x, c, "send_inline");
    // "Sent" means no later call is needed to deliver it (provider.h), so
    // the frame is written here: declined behind queued frames, or when
    // the socket takes none of it; a partial write is finished at once.
    if (size > 4096 || !c->out.empty()) return WIA_IN_PROGRESS;
    Header h{};
    h.type = kMsg;
    h.tag = tag;
    h.size = size;
    queue_frame(c, h, nullptr, nullptr);
    OutFrame& f = c->out.back();
    const auto* bytes = static_cast<const std::uint8_t*>(buf);
    f.owned.assign(bytes, bytes + size);
    f.payload = f.owned.data();
    progress_write(c);
    if (!c->out.empty() && c->out.front().sent == 0) {
      c->out.pop_front();
      return c->broken ? broken_conn(x, c, "send_inline") : WIA_IN_PROGRESS;
    }
    // Bounded: a peer that stops reading for 10 s fails the connection.
    for (int waited_ms = 0; !c->out.empty() && !c->broken; waited_ms += 10) {
      if (waited_ms >= 10000)
        mark_broken(c, "send_inline: the peer took no bytes for 10 s (it stopped reading)");
      pollfd p{c->fd, POLLOUT, 0};
      ::poll(&p, 1, 10);
      progress_write(c);
    }
    if (c->broken) return broken_conn(x, c, "send_inline");
    return WIA_SUCCESS;
  });
}

wia_status_t tn_recv_inline(void* ctx, wia_conn_t conn, void* buf, std::uint64_t capacity,
                            std::uint64_t tag, std::int32_t* done, std::uint64_t* size) {
  auto* x = static_cast<Ctx*>(ctx);
  return guarded(x, [&]() -> wia_status_t {
    *done = 0;
    Conn* c = live_conn(x, conn);
    if (c == nullptr)
      return x->fail(WIA_ERROR_INVALID_HANDLE, "testnet: recv_inline: unknown connection");
    if (auto p = c->posted.find(tag); p != c->posted.end() && !p->second.empty())
      return x->fail(WIA_ERROR_NOT_SUPPORTED,
                     "testnet: recv_inline: an irecv of tag " + std::to_string(tag) + " is pending");
    auto it = c->unexpected.find(tag);
    if (it == c->unexpected.end() || it->second.empty()) {
      progress_all(x);
      it = c->unexpected.find(tag);
    }
    if (it == c->unexpected.end() || it->second.empty())
      return c->broken ? broken_conn(x, c, "recv_inline") : WIA_SUCCESS;
    const std::vector<std::uint8_t> data = std::move(it->second.front());
    it->second.pop_front();
    if (data.size() > capacity)
      return x->fail(WIA_ERROR_REMOTE, "testnet: message of " + std::to_string(data.size()) +
                                           " bytes for a recv_inline of " +
                                           std::to_string(capacity));
#if !defined(WIA_TESTNET_DEFECT_NODATA)
    if (!data.empty()) std::memcpy(buf, data.data(), data.size());
#else
    (void)buf;
#endif
    if (size != nullptr) *size = data.size();
    *done = 1;
    return WIA_SUCCESS;
  });
}

// Everything arrives on the one socket; it is written to while frames
// are queued.
wia_status_t tn_wait_fds(void* ctx, wia_conn_t conn, pollfd* fds, std::uint32_t capacity,
                         std::uint32_t* count) {
  auto* x = static_cast<Ctx*>(ctx);
  return guarded(x, [&]() -> wia_status_t {
    Conn* c = live_conn(x, conn);
    if (c == nullptr)
      return x->fail(WIA_ERROR_INVALID_HANDLE, "testnet: wait_fds: unknown connection");
    *count = 0;
    if (c->broken) return WIA_IN_PROGRESS;  // test() fails at once
    if (capacity < 1) return x->fail(WIA_ERROR_INVALID_ARGUMENT, "testnet: wait_fds: no room");
#if defined(WIA_TESTNET_DEFECT_DEAF)
    // Defect: never asks to be woken for incoming data.
    const short in = 0;
#else
    const short in = POLLIN;
#endif
    fds[0] = pollfd{c->fd, static_cast<short>(in | (c->out.empty() ? 0 : POLLOUT)), 0};
    *count = 1;
    return WIA_SUCCESS;
  });
}

wia_status_t tn_close(void* ctx, wia_conn_t conn) {
  auto* x = static_cast<Ctx*>(ctx);
  return guarded(x, [&]() -> wia_status_t {
    Conn* c = live_conn(x, conn);
    if (c == nullptr)
      return x->fail(WIA_ERROR_INVALID_HANDLE, "testnet: close: unknown connection");
    x->conns.erase(c);
    ::close(c->fd);
    for (Req* r : c->reqs) x->reqs.erase(r);
    delete c;
    return WIA_SUCCESS;
  });
}

wia_status_t tn_mr_rkey(void* ctx, wia_mr_t mr, void* rkey) {
  auto* x = static_cast<Ctx*>(ctx);
  return guarded(x, [&]() -> wia_status_t {
    auto* m = reinterpret_cast<Mr*>(mr);
    if (x->mr_handles.count(m) == 0)
      return x->fail(WIA_ERROR_INVALID_HANDLE, "testnet: mr_rkey: unknown registration");
    RkeyWire w{kRkeyMagic, 0, m->id, reinterpret_cast<std::uintptr_t>(m->base), m->size};
    std::memset(rkey, 0, WIA_RKEY_SIZE);
    std::memcpy(rkey, &w, sizeof(w));
    return WIA_SUCCESS;
  });
}

wia_status_t rma(Ctx* x, bool is_put, wia_conn_t conn, void* local, std::uint64_t size,
                 std::uint64_t remote, const void* rkey, wia_request_t* request) {
  return guarded(x, [&]() -> wia_status_t {
    const char* call = is_put ? "put" : "get";
    Conn* c = live_conn(x, conn);
    if (c == nullptr)
      return x->fail(WIA_ERROR_INVALID_HANDLE,
                     std::string("testnet: ") + call + ": unknown connection");
    if (c->broken) return broken_conn(x, c, call);
    RkeyWire w;
    std::memcpy(&w, rkey, sizeof(w));
    if (w.magic != kRkeyMagic)
      return x->fail(WIA_ERROR_INVALID_ARGUMENT, std::string("testnet: ") + call + ": not an rkey");
    Req* r = new_req(x, c, is_put ? Req::kPut : Req::kGet);
    r->buf = static_cast<std::uint8_t*>(local);
    r->capacity = size;
    Header h{};
    h.type = is_put ? kPut : kGetReq;
    h.tag = w.id;
    h.size = size;
    h.addr = remote;
    h.id = r->id;
    c->rma[r->id] = r;
    queue_frame(c, h, is_put ? r->buf : nullptr, r);
    *request = reinterpret_cast<wia_request_t>(r);
    return WIA_SUCCESS;
  });
}

wia_status_t tn_put(void* ctx, wia_conn_t conn, const void* local, std::uint64_t size, wia_mr_t,
                    std::uint64_t remote, const void* rkey, wia_request_t* request) {
  return rma(static_cast<Ctx*>(ctx), true, conn, const_cast<void*>(local), size, remote, rkey,
             request);
}

wia_status_t tn_get(void* ctx, wia_conn_t conn, void* local, std::uint64_t size, wia_mr_t,
                    std::uint64_t remote, const void* rkey, wia_request_t* request) {
  return rma(static_cast<Ctx*>(ctx), false, conn, local, size, remote, rkey, request);
}

const wia_transport_ops_v1_t kTransportOps = {
    .struct_size = sizeof(wia_transport_ops_v1_t),
    .abi_version = WIA_PROVIDER_ABI_VERSION,
    .caps = WIA_TRANSPORT_CAP_RMA | WIA_TRANSPORT_CAP_INLINE | WIA_TRANSPORT_CAP_WAIT_FD,
    .must_understand = 0,
    .endpoint_count = tn_endpoint_count,
    .endpoint_props = tn_endpoint_props,
    .listen = tn_listen,
    .connect = tn_connect,
    .accept = tn_accept,
    .close_listener = tn_close_listener,
    .reg_mr = tn_reg_mr,
    .dereg_mr = tn_dereg_mr,
    .isend = tn_isend,
    .irecv = tn_irecv,
    .test = tn_test,
    .close = tn_close,
    .mr_rkey = tn_mr_rkey,
    .put = tn_put,
    .get = tn_get,
    .send_inline = tn_send_inline,
    .recv_inline = tn_recv_inline,
    .wait_fds = tn_wait_fds,
};

}  // namespace

extern "C" {
WIA_PROVIDER_EXPORT extern const wia_provider_v1_t wia_provider_v1;
const wia_provider_v1_t wia_provider_v1 = {
    .struct_size = sizeof(wia_provider_v1_t),
    .abi_version = WIA_PROVIDER_ABI_VERSION,
    .name = WIA_TESTNET_NAME,
    .version = "1.0-test",
    .caps = WIA_PROVIDER_CAP_TRANSPORT,
    .host_services_version = WIA_HOST_SERVICES_VERSION,
    .num_params = 0,
    .params = nullptr,
    .init = tn_init,
    .fini = tn_fini,
    .device = nullptr,
    .transport = &kTransportOps,
};
}
