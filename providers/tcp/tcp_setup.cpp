// SPDX-License-Identifier: Apache-2.0
// Endpoints (network interfaces), listen, and the non-blocking connect and
// accept state machines of the tcp provider.
//
// Handshake: the connector opens 1 + N sockets (control, then N data
// sockets) and sends a fixed-size hello on each: {magic, version, stream
// index, N, listener secret, core cookie, random connection id}. The
// listener reads hellos without blocking, rejects (closes and logs) any
// socket whose hello is wrong, truncated or late, groups the rest by
// connection id, and hands out a connection once all 1 + N sockets of a
// group have arrived. A bad client never stalls the listener: every step
// is bounded by tcp.hello_timeout_ms and by a cap on half-open sockets.
#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/tcp.h>
#include <sys/random.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>

#include "tcp.hpp"

namespace wia::tcp {

namespace {

// Sockets that connected but are not yet part of a complete connection.
constexpr std::size_t kMaxHalfOpen = 1024;

std::string read_line(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

bool fill_random(void* out, std::size_t n) {
  auto* p = static_cast<std::uint8_t*>(out);
  std::size_t got = 0;
  while (got < n) {
    ssize_t r = ::getrandom(p + got, n - got, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    got += static_cast<std::size_t>(r);
  }
  return true;
}

// Constant time, so the secret cannot be guessed byte by byte.
bool same_secret(const std::uint8_t* a, const std::uint8_t* b) {
  std::uint8_t diff = 0;
  for (std::size_t i = 0; i < kSecretSize; ++i) diff |= static_cast<std::uint8_t>(a[i] ^ b[i]);
  return diff == 0;
}

void sysfs_facts(Endpoint& e) {
  const std::string base = "/sys/class/net/" + e.name;
  const std::string speed = read_line(base + "/speed");  // Mb/s; EINVAL for lo
  char* end = nullptr;
  const long long v = std::strtoll(speed.c_str(), &end, 10);
  if (!speed.empty() && end != speed.c_str() && v > 0) e.speed_mbps = static_cast<std::uint64_t>(v);
  char link[512];
  const ssize_t n = ::readlink((base + "/device").c_str(), link, sizeof(link) - 1);
  if (n > 0) {
    link[n] = '\0';
    std::string target(link);
    std::string leaf = target.substr(target.find_last_of('/') + 1);
    unsigned dom, bus, dev, fn;
    if (std::sscanf(leaf.c_str(), "%x:%x:%x.%x", &dom, &bus, &dev, &fn) == 4) e.pci_bus_id = leaf;
    const std::string numa = read_line(base + "/device/numa_node");
    if (!numa.empty()) e.numa_node = std::atoi(numa.c_str());
  }
}

}  // namespace

std::string sockaddr_text(const sockaddr* sa) {
  char host[INET6_ADDRSTRLEN] = "?";
  if (sa->sa_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(sa);
    inet_ntop(AF_INET, &in->sin_addr, host, sizeof(host));
    return std::string(host) + ":" + std::to_string(ntohs(in->sin_port));
  }
  if (sa->sa_family == AF_INET6) {
    const auto* in6 = reinterpret_cast<const sockaddr_in6*>(sa);
    inet_ntop(AF_INET6, &in6->sin6_addr, host, sizeof(host));
    return "[" + std::string(host) + "]:" + std::to_string(ntohs(in6->sin6_port));
  }
  return "<address family " + std::to_string(sa->sa_family) + ">";
}

bool ifname_matches(const std::string& filter_text, const std::string& name) {
  std::string f(common::trim(filter_text));
  bool exclude = false, exact = false;
  if (!f.empty() && f[0] == '^') {
    exclude = true;
    f.erase(0, 1);
  }
  if (!f.empty() && f[0] == '=') {
    exact = true;
    f.erase(0, 1);
  }
  bool any_token = false, hit = false;
  std::size_t pos = 0;
  while (pos <= f.size()) {
    std::size_t comma = f.find(',', pos);
    if (comma == std::string::npos) comma = f.size();
    const std::string token(common::trim(f.substr(pos, comma - pos)));
    pos = comma + 1;
    if (token.empty()) continue;
    any_token = true;
    if (exact ? name == token : name.compare(0, token.size(), token) == 0) hit = true;
  }
  if (!any_token) return true;
  return exclude ? !hit : hit;
}

wia_status_t discover_endpoints(Ctx& ctx) {
  std::string filter = ctx.params.ifname;
  if (filter.empty()) {
    const char* env = std::getenv("WIA_SOCKET_IFNAME");
    if (env != nullptr) filter = env;
  }
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0)
    return ctx.fail(WIA_ERROR_IO, "tcp: getifaddrs: %s", errno_text(errno).c_str());

  struct Candidate {
    std::string name;
    bool loopback = false;
    std::vector<const sockaddr*> v4, v6, v6_link;
  };
  std::vector<Candidate> cands;
  for (const ifaddrs* ifa = list; ifa != nullptr; ifa = ifa->ifa_next) {
    if (ifa->ifa_addr == nullptr) continue;
    const int family = ifa->ifa_addr->sa_family;
    if (family != AF_INET && family != AF_INET6) continue;
    if (!(ifa->ifa_flags & IFF_UP) || !(ifa->ifa_flags & IFF_RUNNING)) continue;
    if (!ifname_matches(filter, ifa->ifa_name)) continue;
    auto it = std::find_if(cands.begin(), cands.end(),
                           [&](const Candidate& c) { return c.name == ifa->ifa_name; });
    if (it == cands.end()) {
      cands.push_back(Candidate{ifa->ifa_name, (ifa->ifa_flags & IFF_LOOPBACK) != 0, {}, {}, {}});
      it = cands.end() - 1;
    }
    if (family == AF_INET) {
      it->v4.push_back(ifa->ifa_addr);
    } else {
      const auto* in6 = reinterpret_cast<const sockaddr_in6*>(ifa->ifa_addr);
      (IN6_IS_ADDR_LINKLOCAL(&in6->sin6_addr) ? it->v6_link : it->v6).push_back(ifa->ifa_addr);
    }
  }
  const std::string& fam = ctx.params.family;
  std::vector<Endpoint> real, loop;
  for (const Candidate& c : cands) {
    const sockaddr* pick = nullptr;
    if (fam != "ipv6" && !c.v4.empty()) pick = c.v4.front();
    if (pick == nullptr && fam != "ipv4") {
      if (!c.v6.empty())
        pick = c.v6.front();
      else if (!c.v6_link.empty())
        pick = c.v6_link.front();
    }
    if (pick == nullptr) continue;
    Endpoint e;
    e.name = c.name;
    e.loopback = c.loopback;
    e.addrlen = pick->sa_family == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6);
    std::memcpy(&e.addr, pick, e.addrlen);
    if (pick->sa_family == AF_INET6 &&
        IN6_IS_ADDR_LINKLOCAL(&reinterpret_cast<sockaddr_in6*>(&e.addr)->sin6_addr))
      reinterpret_cast<sockaddr_in6*>(&e.addr)->sin6_scope_id = if_nametoindex(c.name.c_str());
    e.addr_text = sockaddr_text(reinterpret_cast<const sockaddr*>(&e.addr));
    e.addr_text = e.addr_text.substr(0, e.addr_text.rfind(':'));  // no port yet
    sysfs_facts(e);
    (c.loopback ? loop : real).push_back(std::move(e));
  }
  ::freeifaddrs(list);
  // Real interfaces first: endpoint 0 should reach other nodes. Loopback
  // stays available (and wins on one host: the selector sees INTRA_NODE).
  ctx.endpoints = std::move(real);
  for (Endpoint& e : loop) ctx.endpoints.push_back(std::move(e));
  std::string names;
  for (const Endpoint& e : ctx.endpoints)
    names += (names.empty() ? "" : ", ") + e.name + " " + e.addr_text;
  if (ctx.endpoints.empty())
    ctx.log(WIA_LOG_WARN, "tcp: no usable interface (filter '%s', family %s)", filter.c_str(),
            fam.c_str());
  else
    ctx.log(WIA_LOG_DEBUG, "tcp: endpoints: %s", names.c_str());
  return WIA_SUCCESS;
}

void Ctx::tune_socket(int fd) const {
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  if (params.sndbuf > 0) {
    int v = static_cast<int>(std::min<std::uint64_t>(params.sndbuf, 1u << 30));
    ::setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &v, sizeof(v));
  }
  if (params.rcvbuf > 0) {
    int v = static_cast<int>(std::min<std::uint64_t>(params.rcvbuf, 1u << 30));
    ::setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &v, sizeof(v));
  }
  if (!params.congestion.empty() &&
      ::setsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, params.congestion.data(),
                   static_cast<socklen_t>(params.congestion.size())) != 0)
    log(WIA_LOG_DEBUG, "tcp: TCP_CONGESTION %s: %s", params.congestion.c_str(),
        errno_text(errno).c_str());
  if (params.user_timeout_ms > 0) {
    unsigned v = static_cast<unsigned>(params.user_timeout_ms);
    ::setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &v, sizeof(v));
  }
}

// ---------------------------------------------------------------------------
// Listen

Listener::~Listener() {
  if (fd >= 0) ::close(fd);
  for (const Incoming& in : incoming) ::close(in.fd);
  for (auto& [id, g] : groups)
    for (int s : g.fds)
      if (s >= 0) ::close(s);
}

wia_status_t do_listen(Ctx& ctx, int32_t endpoint, void* handle, Listener** out) {
  if (endpoint < 0 || static_cast<std::size_t>(endpoint) >= ctx.endpoints.size())
    return ctx.fail(WIA_ERROR_INVALID_ARGUMENT,
                    "tcp: listen on endpoint %d: there are %zu endpoints", endpoint,
                    ctx.endpoints.size());
  const Endpoint& e = ctx.endpoints[static_cast<std::size_t>(endpoint)];
  sockaddr_storage addr = e.addr;
  const int family = addr.ss_family;
  auto l = std::make_unique<Listener>();
  l->ctx = &ctx;
  l->fd = ::socket(family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (l->fd < 0)
    return ctx.fail(WIA_ERROR_IO, "tcp: socket() for a listener on %s: %s", e.name.c_str(),
                    errno_text(errno).c_str());
  if (family == AF_INET6) {
    int one = 1;
    ::setsockopt(l->fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof(one));
  }
  if (::bind(l->fd, reinterpret_cast<sockaddr*>(&addr), e.addrlen) != 0)
    return ctx.fail(WIA_ERROR_IO, "tcp: bind to %s (%s): %s", e.addr_text.c_str(), e.name.c_str(),
                    errno_text(errno).c_str());
  if (::listen(l->fd, 1024) != 0)
    return ctx.fail(WIA_ERROR_IO, "tcp: listen on %s: %s", e.addr_text.c_str(),
                    errno_text(errno).c_str());
  socklen_t len = sizeof(addr);
  if (::getsockname(l->fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0)
    return ctx.fail(WIA_ERROR_IO, "tcp: getsockname: %s", errno_text(errno).c_str());
  if (!fill_random(l->secret, kSecretSize))
    return ctx.fail(WIA_ERROR_IO, "tcp: getrandom for the listener secret: %s",
                    errno_text(errno).c_str());
  l->addr_text = sockaddr_text(reinterpret_cast<sockaddr*>(&addr));

  WireHandle h{};
  h.magic = kHandleMagic;
  h.version = kWireVersion;
  h.family = static_cast<std::uint16_t>(family);
  if (family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(&addr);
    h.port = in->sin_port;
    std::memcpy(h.addr, &in->sin_addr, 4);
  } else {
    const auto* in6 = reinterpret_cast<const sockaddr_in6*>(&addr);
    h.port = in6->sin6_port;
    h.scope_id = in6->sin6_scope_id;
    std::memcpy(h.addr, &in6->sin6_addr, 16);
  }
  std::memcpy(h.secret, l->secret, kSecretSize);
  std::memset(handle, 0, WIA_TRANSPORT_HANDLE_SIZE);
  std::memcpy(handle, &h, sizeof(h));
  ctx.log(WIA_LOG_DEBUG, "tcp: listening on %s (%s)", l->addr_text.c_str(), e.name.c_str());
  *out = l.release();
  return WIA_SUCCESS;
}

// ---------------------------------------------------------------------------
// Connect

wia_status_t do_connect(Ctx& ctx, int32_t endpoint, const void* handle, std::uint64_t cookie,
                        Conn** conn) {
  if (*conn != nullptr) {
    Conn* c = *conn;
    wia_status_t st;
    {
      std::lock_guard<std::mutex> lk(c->mu);
      if (!c->connecting()) return WIA_SUCCESS;
      st = c->continue_connect();
    }
    if (st < 0) {
      delete c;
      *conn = nullptr;
    }
    return st;
  }
  if (endpoint < 0 || static_cast<std::size_t>(endpoint) >= ctx.endpoints.size())
    return ctx.fail(WIA_ERROR_INVALID_ARGUMENT,
                    "tcp: connect from endpoint %d: there are %zu "
                    "endpoints",
                    endpoint, ctx.endpoints.size());
  WireHandle h;
  std::memcpy(&h, handle, sizeof(h));
  if (h.magic != kHandleMagic)
    return ctx.fail(WIA_ERROR_INVALID_ARGUMENT,
                    "tcp: connect: the handle is not a tcp listen "
                    "handle (magic 0x%08x)",
                    h.magic);
  if (h.version != kWireVersion || h.reserved != 0 || h.port == 0 ||
      (h.family != AF_INET && h.family != AF_INET6))
    return ctx.fail(WIA_ERROR_INVALID_ARGUMENT,
                    "tcp: connect: malformed handle (version %u, "
                    "family %u, port %u)",
                    h.version, h.family, ntohs(h.port));
  auto d = std::make_unique<Dialer>();
  if (h.family == AF_INET) {
    auto* in = reinterpret_cast<sockaddr_in*>(&d->addr);
    in->sin_family = AF_INET;
    in->sin_port = h.port;
    std::memcpy(&in->sin_addr, h.addr, 4);
    d->addrlen = sizeof(sockaddr_in);
  } else {
    auto* in6 = reinterpret_cast<sockaddr_in6*>(&d->addr);
    in6->sin6_family = AF_INET6;
    in6->sin6_port = h.port;
    std::memcpy(&in6->sin6_addr, h.addr, 16);
    // A link-local scope is an interface index of the host that uses it:
    // ours, not the listener's.
    in6->sin6_scope_id =
        IN6_IS_ADDR_LINKLOCAL(&in6->sin6_addr)
            ? if_nametoindex(ctx.endpoints[static_cast<std::size_t>(endpoint)].name.c_str())
            : 0;
    d->addrlen = sizeof(sockaddr_in6);
  }
  const std::string peer = sockaddr_text(reinterpret_cast<sockaddr*>(&d->addr));
  const auto nstreams = static_cast<std::uint16_t>(ctx.params.streams);
  std::uint64_t conn_id = 0;
  if (!fill_random(&conn_id, sizeof(conn_id)))
    return ctx.fail(WIA_ERROR_IO, "tcp: getrandom: %s", errno_text(errno).c_str());
  d->deadline_ns =
      ctx.now_ns() + static_cast<std::uint64_t>(ctx.params.connect_timeout_ms) * 1000000u;
  for (std::uint16_t i = 0; i <= nstreams; ++i) {
    int fd = ::socket(h.family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0)
      return ctx.fail(WIA_ERROR_IO, "tcp: socket() to connect to %s: %s", peer.c_str(),
                      errno_text(errno).c_str());
    d->fds.push_back(fd);
    ctx.tune_socket(fd);
    if (::connect(fd, reinterpret_cast<sockaddr*>(&d->addr), d->addrlen) != 0 &&
        errno != EINPROGRESS)
      return ctx.fail(WIA_ERROR_REMOTE, "tcp: connect to %s: %s", peer.c_str(),
                      errno_text(errno).c_str());
    WireHello hello{};
    hello.magic = kHelloMagic;
    hello.version = kWireVersion;
    hello.stream = i;
    hello.nstreams = nstreams;
    std::memcpy(hello.secret, h.secret, kSecretSize);
    hello.cookie = cookie;
    hello.conn_id = conn_id;
    d->hellos.push_back(hello);
  }
  d->connected.assign(d->fds.size(), false);
  d->hello_sent.assign(d->fds.size(), 0);
  auto c = std::make_unique<Conn>(&ctx, std::move(d), peer);
  wia_status_t st;
  {
    std::lock_guard<std::mutex> lk(c->mu);
    st = c->continue_connect();
  }
  if (st >= 0) *conn = c.release();
  return st;
}

// ---------------------------------------------------------------------------
// Accept

namespace {

void reject(Listener& l, Incoming& in, const std::string& why) {
  l.ctx->log(WIA_LOG_WARN, "tcp: listener %s rejected a connection from %s: %s",
             l.addr_text.c_str(), in.peer.c_str(), why.c_str());
  ::close(in.fd);
  in.fd = -1;
}

// Checks a complete hello; empty when it is acceptable.
std::string hello_problem(const Listener& l, const WireHello& h) {
  char buf[160];
  if (h.magic != kHelloMagic) {
    std::snprintf(buf, sizeof(buf), "bad hello magic 0x%08x (not a libwia tcp peer%s)", h.magic,
                  h.magic == __builtin_bswap32(kHelloMagic) ? ", or the other byte order" : "");
    return buf;
  }
  if (h.version != kWireVersion) {
    std::snprintf(buf, sizeof(buf), "hello of wire version %u, this provider speaks %u", h.version,
                  kWireVersion);
    return buf;
  }
  if (h.reserved != 0 || h.reserved2 != 0) return "reserved hello fields are not zero";
  if (!same_secret(h.secret, l.secret))
    return "wrong listener secret (a stale handle, or a client that was not given this handle)";
  if (h.nstreams < 1 || h.nstreams > kMaxDataStreams) {
    std::snprintf(buf, sizeof(buf), "hello announces %u data sockets (allowed 1..%u)", h.nstreams,
                  kMaxDataStreams);
    return buf;
  }
  if (h.stream > h.nstreams) {
    std::snprintf(buf, sizeof(buf), "hello for socket %u of a %u-socket connection", h.stream,
                  h.nstreams + 1);
    return buf;
  }
  return {};
}

}  // namespace

wia_status_t do_accept(Ctx& ctx, Listener& l, std::uint64_t* cookie, Conn** conn) {
  std::lock_guard<std::mutex> lk(l.mu);
  *conn = nullptr;
  const std::uint64_t now = ctx.now_ns();
  const std::uint64_t hello_timeout =
      static_cast<std::uint64_t>(ctx.params.hello_timeout_ms) * 1000000u;

  // 1. New sockets.
  std::size_t half_open = l.incoming.size();
  for (const auto& [id, g] : l.groups) half_open += g.arrived;
  for (int i = 0; i < 64; ++i) {
    sockaddr_storage pa{};
    socklen_t plen = sizeof(pa);
    int fd = ::accept4(l.fd, reinterpret_cast<sockaddr*>(&pa), &plen, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK)
        ctx.log(WIA_LOG_WARN, "tcp: accept on %s: %s", l.addr_text.c_str(),
                errno_text(errno).c_str());
      break;
    }
    Incoming in;
    in.fd = fd;
    in.peer = sockaddr_text(reinterpret_cast<sockaddr*>(&pa));
    in.deadline_ns = now + hello_timeout;
    if (half_open >= kMaxHalfOpen) {
      reject(l, in, "too many half-open connections on this listener");
      continue;
    }
    ctx.tune_socket(fd);
    l.incoming.push_back(in);
    ++half_open;
  }

  // 2. Hellos. A socket is judged on what recv() itself said (EOF, an
  // error, or "nothing yet"), never on a later poll(): a hello byte that
  // arrives between an EAGAIN and that poll would make a slow but good
  // socket look closed, and the connector (whose connect() already
  // succeeded) would be left with a connection the listener never hands out.
  for (Incoming& in : l.incoming) {
    auto* bytes = reinterpret_cast<char*>(&in.hello);
    bool eof = false;
    int err = 0;
    while (in.got < sizeof(WireHello)) {
      ssize_t n = ::recv(in.fd, bytes + in.got, sizeof(WireHello) - in.got, MSG_DONTWAIT);
      if (n > 0) {
        in.got += static_cast<std::size_t>(n);
        continue;
      }
      if (n == 0) {
        eof = true;
      } else if (errno == EINTR) {
        continue;
      } else if (errno != EAGAIN && errno != EWOULDBLOCK) {
        err = errno;
      }
      break;
    }
    if (in.got < sizeof(WireHello)) {
      char why[160];
      if (eof || err != 0) {
        std::snprintf(why, sizeof(why), "closed after %zu of %zu hello bytes (truncated hello)%s%s",
                      in.got, sizeof(WireHello), err ? ": " : "",
                      err ? errno_text(err).c_str() : "");
        reject(l, in, why);
      } else if (now > in.deadline_ns) {
        std::snprintf(why, sizeof(why),
                      "sent %zu of %zu hello bytes within %" PRId64 " ms (tcp.hello_timeout_ms)",
                      in.got, sizeof(WireHello), ctx.params.hello_timeout_ms);
        reject(l, in, why);
      }
      continue;
    }
    const std::string problem = hello_problem(l, in.hello);
    if (!problem.empty()) {
      reject(l, in, problem);
      continue;
    }
    auto [it, fresh] = l.groups.try_emplace(in.hello.conn_id);
    Group& g = it->second;
    if (fresh) {
      g.cookie = in.hello.cookie;
      g.nstreams = in.hello.nstreams;
      g.fds.assign(g.nstreams + 1u, -1);
      g.peer = in.peer;
      g.deadline_ns = now + hello_timeout;
    } else if (g.cookie != in.hello.cookie || g.nstreams != in.hello.nstreams ||
               g.fds[in.hello.stream] >= 0) {
      reject(l, in, "hello does not agree with the other sockets of its connection");
      continue;
    }
    if (in.hello.stream == 0) g.peer = in.peer;
    g.fds[in.hello.stream] = in.fd;
    ++g.arrived;
    in.fd = -1;  // owned by the group now
  }
  l.incoming.erase(std::remove_if(l.incoming.begin(), l.incoming.end(),
                                  [](const Incoming& in) { return in.fd < 0; }),
                   l.incoming.end());

  // 3. Complete (or expired) groups.
  for (auto it = l.groups.begin(); it != l.groups.end();) {
    Group& g = it->second;
    if (g.arrived == g.fds.size()) {
      auto c = std::make_unique<Conn>(&ctx, std::move(g.fds), g.peer);
      *cookie = g.cookie;
      ctx.log(WIA_LOG_DEBUG, "tcp: accepted a connection from %s with %u data sockets",
              g.peer.c_str(), g.nstreams);
      l.groups.erase(it);
      *conn = c.release();
      return WIA_SUCCESS;
    }
    if (now > g.deadline_ns) {
      ctx.log(WIA_LOG_WARN,
              "tcp: listener %s dropped a connection from %s: %zu of %zu sockets "
              "arrived within %" PRId64 " ms (tcp.hello_timeout_ms)",
              l.addr_text.c_str(), g.peer.c_str(), g.arrived, g.fds.size(),
              ctx.params.hello_timeout_ms);
      for (int s : g.fds)
        if (s >= 0) ::close(s);
      it = l.groups.erase(it);
      continue;
    }
    ++it;
  }
  return WIA_IN_PROGRESS;
}

}  // namespace wia::tcp
