// SPDX-License-Identifier: Apache-2.0
// Connection set-up of the shm provider: the shared segment and its rings,
// listen, the connector's side of the handshake (socket, memfd segment,
// hello, welcome) and the listener's (hello checks, mapping, welcome),
// and closing listeners and connections.
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstddef>
#include <cstdio>
#include <mutex>

#include "shm.hpp"

namespace wia::shm {

bool random_bytes(void* out, std::size_t n) {
  auto* p = static_cast<std::uint8_t*>(out);
  while (n > 0) {
    const ssize_t got = getrandom(p, n, 0);
    if (got < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    p += got;
    n -= static_cast<std::size_t>(got);
  }
  return true;
}

namespace {

// ---------------------------------------------------------------------------
// Segment and socket helpers

void attach_rings(Conn* c, bool is_connector, std::uint64_t ring_size) {
  auto* base = static_cast<std::uint8_t*>(c->segment);
  auto* hdr = reinterpret_cast<wire::SegmentHeader*>(base);
  const int out_dir = is_connector ? 0 : 1;
  const int in_dir = 1 - out_dir;
  c->tx.ctl = &hdr->ring[out_dir];
  c->tx.data = base + wire::ring_data_offset(out_dir, ring_size);
  c->tx.size = ring_size;
  c->rx.ctl = &hdr->ring[in_dir];
  c->rx.data = base + wire::ring_data_offset(in_dir, ring_size);
  c->rx.size = ring_size;
  const std::uint64_t max_record = ring_size / 4 - sizeof(RecordHeader);
  c->eager_size = std::min(c->provider->cfg.eager_size, max_record);
  c->chunk_size = std::min(c->provider->cfg.chunk_size, max_record);
}

// Reads the peer's probe word with CMA: says whether large messages from
// this peer can be pulled in one copy.
bool probe_cma(const Provider* p, int pid, std::uint64_t addr, std::uint64_t expected) {
  if (p->cfg.cma == CmaMode::kOff || addr == 0) return false;
  std::uint64_t value = 0;
  iovec local{&value, sizeof(value)};
  iovec remote{reinterpret_cast<void*>(addr), sizeof(value)};
  const ssize_t n = process_vm_readv(pid, &local, 1, &remote, 1, 0);
  const bool ok = n == static_cast<ssize_t>(sizeof(value)) && value == expected;
  if (!ok)
    p->log(p->cfg.cma == CmaMode::kOn ? WIA_LOG_WARN : WIA_LOG_INFO,
           format("cross-memory attach to peer pid %d unavailable (%s); large messages use the "
                  "staging ring",
                  pid, n < 0 ? errno_text(errno).c_str() : "probe value differs"));
  return ok;
}

bool secrets_equal(const std::uint8_t* a, const std::uint8_t* b) {
  std::uint8_t diff = 0;  // constant time: no early exit on the first difference
  for (std::size_t i = 0; i < wire::kSecretSize; ++i) diff |= a[i] ^ b[i];
  return diff == 0;
}

sockaddr_un abstract_address(const char* name, socklen_t* len) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  const std::size_t n = strnlen(name, wire::kSocketNameSize);
  std::memcpy(addr.sun_path + 1, name, n);  // sun_path[0] == 0: abstract namespace
  *len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + n);
  return addr;
}

int peer_pid_of(int fd) {
  ucred cred{};
  socklen_t len = sizeof(cred);
  if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) return 0;
  return cred.pid;
}

// Both sides, once the peer's hello or welcome is read: whether each may
// pull the other's memory, and the connection is up.
void establish(Conn* c, std::uint64_t probe_addr, std::uint64_t probe_value, std::uint32_t flags) {
  const Provider* p = c->provider;
  c->cma_readable = probe_cma(p, c->peer_pid, probe_addr, probe_value);
  if (c->cma_readable) c->peer_pidfd = open_pidfd(c->peer_pid);
  c->peer_may_read = p->cfg.cma != CmaMode::kOff && (flags & wire::kCmaAllowed) != 0;
  c->state = ConnState::kUp;
  c->last_liveness_ns = monotonic_ns();
}

// ---------------------------------------------------------------------------
// Listen

wia_status_t listen_ep_impl(void* ctx, int32_t endpoint, void* handle, wia_listener_t* listener) {
  Provider* p = prov(ctx);
  if (handle == nullptr || listener == nullptr) return WIA_ERROR_INVALID_ARGUMENT;
  if (endpoint != 0)
    return p->fail(WIA_ERROR_INVALID_ARGUMENT, format("listen: no endpoint %d", endpoint));
  auto l = std::make_unique<Listener>();
  l->provider = p;
  wire::Handle& h = l->handle;
  h.magic = wire::kHandleMagic;
  h.version = wire::kProtocolVersion;
  h.listener_pid = static_cast<std::uint32_t>(getpid());
  std::memcpy(h.boot_id, p->boot_id, sizeof(h.boot_id));
  std::uint8_t nonce[8];
  if (!random_bytes(h.secret, sizeof(h.secret)) || !random_bytes(nonce, sizeof(nonce)))
    return p->fail(WIA_ERROR_IO, "getrandom: " + errno_text(errno));
  std::snprintf(h.socket_name, sizeof(h.socket_name), "wia-shm-%d-%02x%02x%02x%02x%02x%02x%02x%02x",
                static_cast<int>(getpid()), nonce[0], nonce[1], nonce[2], nonce[3], nonce[4],
                nonce[5], nonce[6], nonce[7]);
  l->fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (l->fd < 0) return p->fail(WIA_ERROR_IO, "listen: socket(AF_UNIX): " + errno_text(errno));
  socklen_t len = 0;
  const sockaddr_un addr = abstract_address(h.socket_name, &len);
  if (bind(l->fd, reinterpret_cast<const sockaddr*>(&addr), len) != 0 ||
      ::listen(l->fd, 128) != 0) {
    const int e = errno;
    ::close(l->fd);
    return p->fail(WIA_ERROR_IO,
                   format("listen: bind/listen @%s: %s", h.socket_name, errno_text(e).c_str()));
  }
  std::memset(handle, 0, WIA_TRANSPORT_HANDLE_SIZE);
  std::memcpy(handle, &h, sizeof(h));
  *listener = reinterpret_cast<wia_listener_t>(l.release());
  return WIA_SUCCESS;
}

// ---------------------------------------------------------------------------
// Connect: the steps of the first call, then the calls that wait for the
// welcome.

// Checks a listener handle before anything is opened for it.
wia_status_t check_handle(Provider* p, wire::Handle* h) {
  if (h->magic != wire::kHandleMagic || h->version != wire::kProtocolVersion)
    return p->fail(WIA_ERROR_INVALID_HANDLE,
                   "connect: not an shm handle (bad magic or layout version)");
  if (std::memcmp(h->boot_id, p->boot_id, sizeof(h->boot_id)) != 0)
    return p->fail(
        WIA_ERROR_UNAVAILABLE,
        format("connect: handle of listener pid %u is from another host (boot_id differs)",
               h->listener_pid));
  h->socket_name[wire::kSocketNameSize - 1] = '\0';
  return WIA_SUCCESS;
}

// Opens the control socket and connects it to the listener's abstract name.
wia_status_t connect_socket(Provider* p, Conn* c, const wire::Handle& h) {
  c->sock = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (c->sock < 0) return p->fail(WIA_ERROR_IO, "connect: socket(AF_UNIX): " + errno_text(errno));
  socklen_t len = 0;
  const sockaddr_un addr = abstract_address(h.socket_name, &len);
  if (::connect(c->sock, reinterpret_cast<const sockaddr*>(&addr), len) != 0)
    return p->fail(errno == ECONNREFUSED || errno == ENOENT ? WIA_ERROR_REMOTE : WIA_ERROR_IO,
                   format("connect to listener @%s of pid %u: %s", h.socket_name, h.listener_pid,
                          errno_text(errno).c_str()));
  return WIA_SUCCESS;
}

// The segment: an anonymous memfd, never visible in /dev/shm, mapped and
// laid out with this side as the connector. *mfd is open on success only.
wia_status_t create_segment(Provider* p, Conn* c, int* mfd) {
  const std::uint64_t ring = p->cfg.ring_size;
  c->segment_len = wire::segment_size(ring);
  const int fd = memfd_create("wia-shm-conn", MFD_CLOEXEC);
  if (fd < 0) return p->fail(WIA_ERROR_IO, "connect: memfd_create: " + errno_text(errno));
  if (ftruncate(fd, static_cast<off_t>(c->segment_len)) != 0) {
    const int e = errno;
    ::close(fd);
    return p->fail(WIA_ERROR_OUT_OF_MEMORY, format("connect: ftruncate(memfd, %zu): %s",
                                                   c->segment_len, errno_text(e).c_str()));
  }
  c->segment =
      mmap(nullptr, c->segment_len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
  if (c->segment == MAP_FAILED) {
    const int e = errno;
    ::close(fd);
    return p->fail(WIA_ERROR_OUT_OF_MEMORY,
                   format("connect: mmap of %zu bytes: %s", c->segment_len, errno_text(e).c_str()));
  }
  auto* seg = new (c->segment) wire::SegmentHeader{};
  seg->magic = wire::kSegmentMagic;
  seg->ring_size = ring;
  attach_rings(c, true, ring);
  *mfd = fd;
  return WIA_SUCCESS;
}

// Sends the hello with the segment's memfd attached (SCM_RIGHTS), then
// closes the memfd: our mapping keeps the segment alive.
wia_status_t send_hello(Provider* p, Conn* c, const wire::Handle& h, std::uint64_t cookie,
                        int mfd) {
  wire::Hello hello{};
  hello.magic = wire::kHelloMagic;
  hello.version = wire::kProtocolVersion;
  std::memcpy(hello.secret, h.secret, sizeof(hello.secret));
  hello.cookie = cookie;
  hello.ring_size = p->cfg.ring_size;
  hello.probe_addr = reinterpret_cast<std::uint64_t>(&g_cma_probe_word);
  hello.probe_value = g_cma_probe_word;
  hello.pid = static_cast<std::uint32_t>(getpid());
  hello.flags = p->cfg.cma != CmaMode::kOff ? wire::kCmaAllowed : 0;
  iovec iov{&hello, sizeof(hello)};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  cmsghdr* cm = CMSG_FIRSTHDR(&msg);
  cm->cmsg_level = SOL_SOCKET;
  cm->cmsg_type = SCM_RIGHTS;
  cm->cmsg_len = CMSG_LEN(sizeof(int));
  std::memcpy(CMSG_DATA(cm), &mfd, sizeof(int));
  // A fresh SEQPACKET socket has room for one small message: no EAGAIN.
  const ssize_t sent = sendmsg(c->sock, &msg, MSG_NOSIGNAL);
  const int e = errno;
  ::close(mfd);
  if (sent != static_cast<ssize_t>(sizeof(hello)))
    return p->fail(WIA_ERROR_REMOTE,
                   format("connect: sending the hello to listener pid %u: %s", h.listener_pid,
                          sent < 0 ? errno_text(e).c_str() : "short write"));
  return WIA_SUCCESS;
}

// The first connect call: everything up to the hello, which the listener
// answers later (WIA_IN_PROGRESS).
wia_status_t start_connect(Provider* p, const void* handle, std::uint64_t cookie,
                           wia_conn_t* conn_out) {
  wire::Handle h;
  std::memcpy(&h, handle, sizeof(h));
  if (wia_status_t st = check_handle(p, &h); st != WIA_SUCCESS) return st;
  auto c = std::make_unique<Conn>();
  c->provider = p;
  c->started_ns = p->now_ns();
  c->peer_pid = static_cast<int>(h.listener_pid);
  if (wia_status_t st = connect_socket(p, c.get(), h); st != WIA_SUCCESS) return st;
  int mfd = -1;
  if (wia_status_t st = create_segment(p, c.get(), &mfd); st != WIA_SUCCESS) return st;
  if (wia_status_t st = send_hello(p, c.get(), h, cookie, mfd); st != WIA_SUCCESS) return st;
  *conn_out = reinterpret_cast<wia_conn_t>(c.release());
  return WIA_IN_PROGRESS;
}

// The later connect calls: reads the welcome once it is there.
wia_status_t await_welcome(Provider* p, wia_conn_t* conn_out) {
  Conn* c = reinterpret_cast<Conn*>(*conn_out);
  if (c->state == ConnState::kUp) return WIA_SUCCESS;
  // A failed attempt is released here (the ABI: an error ends the attempt).
  auto give_up = [&](wia_status_t st, const std::string& why) {
    delete c;
    *conn_out = nullptr;
    return p->fail(st, why);
  };
  wire::Welcome w{};
  const ssize_t n = recv(c->sock, &w, sizeof(w), MSG_DONTWAIT);
  if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
    if (p->now_ns() - c->started_ns > p->cfg.handshake_timeout_ns)
      return give_up(
          WIA_ERROR_TIMEOUT,
          format("connect: listener pid %d did not answer the hello within %" PRIu64 " s",
                 c->peer_pid, p->cfg.handshake_timeout_ns / std::uint64_t{1'000'000'000}));
    return WIA_IN_PROGRESS;
  }
  if (n != static_cast<ssize_t>(sizeof(w)) || w.magic != wire::kWelcomeMagic ||
      w.version != wire::kProtocolVersion)
    return give_up(WIA_ERROR_REMOTE,
                   format("connect: listener pid %d refused the connection (%s)", c->peer_pid,
                          n == 0  ? "closed: wrong secret or incompatible peer"
                          : n < 0 ? errno_text(errno).c_str()
                                  : "malformed welcome"));
  const int cred_pid = peer_pid_of(c->sock);
  c->peer_pid = cred_pid > 0 ? cred_pid : static_cast<int>(w.pid);
  establish(c, w.probe_addr, w.probe_value, w.flags);
  return WIA_SUCCESS;
}

wia_status_t connect_ep_impl(void* ctx, int32_t endpoint, const void* handle, uint64_t cookie,
                             wia_conn_t* conn_out) {
  Provider* p = prov(ctx);
  if (handle == nullptr || conn_out == nullptr) return WIA_ERROR_INVALID_ARGUMENT;
  if (endpoint != 0)
    return p->fail(WIA_ERROR_INVALID_ARGUMENT, format("connect: no endpoint %d", endpoint));
  if (*conn_out == nullptr) return start_connect(p, handle, cookie, conn_out);
  return await_welcome(p, conn_out);
}

// ---------------------------------------------------------------------------
// Accept: the steps of serving one connector's hello.

enum class HelloResult { kWaiting, kRejected, kAccepted };

// One recvmsg of the hello; keeps the first file descriptor attached (the
// segment) in *mfd and closes any others. *err: recvmsg's errno.
ssize_t receive_hello(int fd, wire::Hello* hello, int* mfd, int* msg_flags, int* err) {
  iovec iov{hello, sizeof(*hello)};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * 4)] = {};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  const ssize_t n = recvmsg(fd, &msg, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
  *err = n < 0 ? errno : 0;
  *msg_flags = msg.msg_flags;
  if (n < 0 && (*err == EAGAIN || *err == EWOULDBLOCK || *err == EINTR)) return n;
  for (cmsghdr* cm = CMSG_FIRSTHDR(&msg); cm != nullptr; cm = CMSG_NXTHDR(&msg, cm)) {
    if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS) continue;
    const std::size_t nfds = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (std::size_t i = 0; i < nfds; ++i) {
      int attached;
      std::memcpy(&attached, CMSG_DATA(cm) + i * sizeof(int), sizeof(int));
      if (*mfd < 0)
        *mfd = attached;
      else
        ::close(attached);  // a well-behaved peer sends one
    }
  }
  return n;
}

// Why a received hello (n bytes) cannot be accepted; empty when it can.
// Sets *seg_len to the segment size its ring size implies.
std::string check_hello(const Listener* l, const wire::Hello& hello, ssize_t n, int msg_flags,
                        int err, int mfd, std::size_t* seg_len) {
  if (n <= 0) return n == 0 ? "closed before the hello" : "recvmsg: " + errno_text(err);
  if ((msg_flags & (MSG_TRUNC | MSG_CTRUNC)) != 0 || n != static_cast<ssize_t>(sizeof(hello)))
    return format("hello of %zd bytes, expected %zu", n, sizeof(hello));
  if (hello.magic != wire::kHelloMagic || hello.version != wire::kProtocolVersion)
    return "not an shm hello (bad magic or protocol version)";
  if (!secrets_equal(hello.secret, l->handle.secret)) return "wrong secret";
  if (mfd < 0) return "no shared segment attached to the hello";
  if (hello.ring_size < (64u << 10) || hello.ring_size > (1ull << 32) ||
      hello.ring_size % wire::kRecordAlign != 0)
    return format("ring size %" PRIu64 " out of range", hello.ring_size);
  *seg_len = wire::segment_size(hello.ring_size);
  struct stat st {};
  if (fstat(mfd, &st) != 0 || static_cast<std::uint64_t>(st.st_size) < *seg_len)
    return format("segment smaller than its %zu-byte layout", *seg_len);
  return {};
}

// Maps the connector's segment and checks that it is the fresh one its
// hello describes; empty when it is.
std::string map_segment(Conn* c, int mfd, std::size_t seg_len, std::uint64_t ring_size) {
  c->segment_len = seg_len;
  c->segment = mmap(nullptr, seg_len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, mfd, 0);
  if (c->segment == MAP_FAILED) return "mmap of the segment: " + errno_text(errno);
  const auto* seg = static_cast<const wire::SegmentHeader*>(c->segment);
  if (seg->magic != wire::kSegmentMagic || seg->ring_size != ring_size ||
      seg->ring[0].head.load() != 0 || seg->ring[1].head.load() != 0)
    return "segment header does not match the hello";
  return {};
}

// Answers an accepted hello. False (logged) when the connector has gone.
bool send_welcome(const Listener* l, const PendingAccept& pa) {
  const Provider* p = l->provider;
  wire::Welcome w{};
  w.magic = wire::kWelcomeMagic;
  w.version = wire::kProtocolVersion;
  w.probe_addr = reinterpret_cast<std::uint64_t>(&g_cma_probe_word);
  w.probe_value = g_cma_probe_word;
  w.pid = static_cast<std::uint32_t>(getpid());
  w.flags = p->cfg.cma != CmaMode::kOff ? wire::kCmaAllowed : 0;
  if (send(pa.fd, &w, sizeof(w), MSG_NOSIGNAL | MSG_DONTWAIT) == static_cast<ssize_t>(sizeof(w)))
    return true;
  // A valid hello whose sender has already gone (an abandoned connect)
  // is not an attack: say so quietly.
  const int e = errno;
  p->log(e == EPIPE || e == ECONNRESET ? WIA_LOG_INFO : WIA_LOG_WARN,
         format("listener @%s: connector pid %d went away before the welcome (%s)",
                l->handle.socket_name, pa.peer_pid, errno_text(e).c_str()));
  return false;
}

// Reads and checks one pending hello; returns an established connection,
// nullptr when the hello has not arrived, or rejects (closes) the socket.
HelloResult serve_hello(Listener* l, PendingAccept& pa, std::uint64_t* cookie, Conn** out) {
  Provider* p = l->provider;
  wire::Hello hello{};
  int mfd = -1, msg_flags = 0, err = 0;
  const ssize_t n = receive_hello(pa.fd, &hello, &mfd, &msg_flags, &err);
  if (n < 0 && (err == EAGAIN || err == EWOULDBLOCK || err == EINTR)) {
    if (p->now_ns() - pa.started_ns > p->cfg.handshake_timeout_ns) {
      p->log(WIA_LOG_WARN,
             format("listener @%s: dropped a connection from pid %d that sent no hello",
                    l->handle.socket_name, pa.peer_pid));
      return HelloResult::kRejected;
    }
    return HelloResult::kWaiting;
  }
  auto reject = [&](const std::string& why) {
    if (mfd >= 0) ::close(mfd);
    p->log(WIA_LOG_WARN, format("listener @%s: rejected connection from pid %d: %s",
                                l->handle.socket_name, pa.peer_pid, why.c_str()));
    return HelloResult::kRejected;
  };
  std::size_t seg_len = 0;
  if (std::string why = check_hello(l, hello, n, msg_flags, err, mfd, &seg_len); !why.empty())
    return reject(why);
  auto c = std::make_unique<Conn>();
  c->provider = p;
  const std::string why = map_segment(c.get(), mfd, seg_len, hello.ring_size);
  ::close(mfd);  // the mapping, if any, keeps the segment alive
  mfd = -1;
  if (!why.empty()) return reject(why);
  attach_rings(c.get(), false, hello.ring_size);
  c->peer_pid = pa.peer_pid > 0 ? pa.peer_pid : static_cast<int>(hello.pid);
  if (!send_welcome(l, pa)) return HelloResult::kRejected;
  c->sock = pa.fd;
  pa.fd = -1;
  establish(c.get(), hello.probe_addr, hello.probe_value, hello.flags);
  *cookie = hello.cookie;
  *out = c.release();
  return HelloResult::kAccepted;
}

wia_status_t accept_ep_impl(void* ctx, wia_listener_t listener, uint64_t* cookie,
                            wia_conn_t* conn) {
  Provider* p = prov(ctx);
  if (listener == nullptr || cookie == nullptr || conn == nullptr)
    return WIA_ERROR_INVALID_ARGUMENT;
  auto* l = reinterpret_cast<Listener*>(listener);
  *conn = nullptr;
  for (;;) {
    const int fd = accept4(l->fd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR || errno == ECONNABORTED) break;
      return p->fail(WIA_ERROR_IO,
                     format("accept on @%s: %s", l->handle.socket_name, errno_text(errno).c_str()));
    }
    l->pending.push_back(PendingAccept{fd, peer_pid_of(fd), p->now_ns()});
  }
  for (std::size_t i = 0; i < l->pending.size();) {
    Conn* c = nullptr;
    const HelloResult r = serve_hello(l, l->pending[i], cookie, &c);
    if (r == HelloResult::kWaiting) {
      ++i;
      continue;
    }
    if (l->pending[i].fd >= 0) ::close(l->pending[i].fd);
    l->pending.erase(l->pending.begin() + static_cast<std::ptrdiff_t>(i));
    if (r == HelloResult::kAccepted) {
      *conn = reinterpret_cast<wia_conn_t>(c);
      return WIA_SUCCESS;
    }
  }
  return WIA_IN_PROGRESS;
}

}  // namespace

wia_status_t close_listener(void*, wia_listener_t listener) {
  if (listener == nullptr) return WIA_ERROR_INVALID_HANDLE;
  auto* l = reinterpret_cast<Listener*>(listener);
  for (PendingAccept& pa : l->pending) ::close(pa.fd);
  ::close(l->fd);
  delete l;
  return WIA_SUCCESS;
}

wia_status_t close_conn(void*, wia_conn_t conn) {
  if (conn == nullptr) return WIA_ERROR_INVALID_HANDLE;
  Conn* c = reinterpret_cast<Conn*>(conn);
  {
    std::lock_guard<SpinLock> lock(c->mu);  // waits out a test() still running on it
  }
  // Frees every request it still holds, unmaps the segment and closes the
  // socket: the peer sees EOF.
  delete c;
  return WIA_SUCCESS;
}

// Every entry that allocates runs inside guarded (shm.hpp).
wia_status_t listen_ep(void* ctx, int32_t endpoint, void* handle, wia_listener_t* listener) {
  return guarded(ctx, [&] { return listen_ep_impl(ctx, endpoint, handle, listener); });
}
wia_status_t connect_ep(void* ctx, int32_t endpoint, const void* handle, uint64_t cookie,
                        wia_conn_t* conn) {
  return guarded(ctx, [&] { return connect_ep_impl(ctx, endpoint, handle, cookie, conn); });
}
wia_status_t accept_ep(void* ctx, wia_listener_t listener, uint64_t* cookie, wia_conn_t* conn) {
  return guarded(ctx, [&] { return accept_ep_impl(ctx, listener, cookie, conn); });
}
}  // namespace wia::shm
