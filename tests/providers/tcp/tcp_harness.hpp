// SPDX-License-Identifier: Apache-2.0
// What the tcp provider tests share: the provider loaded the way the core
// loads it (the registry, with a YAML text and an injected environment),
// forked peer processes whose listen handles travel through a pipe, and raw
// sockets that play hostile clients. Every wait is bounded: requests by a
// deadline on test(), children by a deadline on waitpid (then SIGKILL). A
// child reports through its exit code (0 = every check passed) and
// explains failures on stderr.
#pragma once

#include <arpa/inet.h>
#include <doctest/doctest.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/error.hpp"
#include "config/config.hpp"
#include "provider/registry.hpp"
#include "tcp_wire.hpp"

// File-local helpers in each test file that includes this (an anonymous
// namespace): a file need not use all of them.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-function"
namespace {

using Clock = std::chrono::steady_clock;
using Params = std::map<std::string, std::string>;

const std::string kProviderDir = WIA_TEST_PROVIDER_DIR;
constexpr int kWaitMs = 30000;  // generous: the machine is shared and slow

wia::EnvLookup env_of(std::map<std::string, std::string> vars) {
  auto shared = std::make_shared<const std::map<std::string, std::string>>(std::move(vars));
  return [shared](const char* name) -> const char* {
    auto it = shared->find(name);
    return it == shared->end() ? nullptr : it->second.c_str();
  };
}

// The tcp provider loaded through the core's registry with `params` as its
// YAML section (defaults: loopback only, short hello timeout).
class Tcp {
 public:
  Tcp() : Tcp(Params{}) {}
  explicit Tcp(const Params& overrides) {
    Params params{{"ifname", "=lo"}, {"hello_timeout_ms", "500"}};
    for (const auto& [k, v] : overrides) params[k] = v;
    std::string yaml = "providers:\n  enable: [tcp]\ntcp:\n";
    for (const auto& [k, v] : params) yaml += "  " + k + ": \"" + v + "\"\n";
    env_ = env_of({{"WIA_PROVIDER_PATH", kProviderDir}});
    config_ = std::make_unique<wia::Config>(wia::Config::parse(yaml, "tcp-test.yaml", env_));
    registry_ = wia::ProviderRegistry::load(*config_, env_);
    provider_ = registry_->find("tcp");
    REQUIRE(provider_ != nullptr);
    ops = provider_->transport();
    REQUIRE(ops != nullptr);
    ctx = provider_->ctx();
  }

  int32_t endpoint_count() const {
    int32_t n = -1;
    REQUIRE(ops->endpoint_count(ctx, &n) == WIA_SUCCESS);
    return n;
  }
  wia_transport_props_v1_t props(int32_t ep) const {
    wia_transport_props_v1_t p{};
    p.struct_size = sizeof(p);
    REQUIRE(ops->endpoint_props(ctx, ep, &p) == WIA_SUCCESS);
    return p;
  }
  int32_t endpoint_named(const std::string& name) const {
    for (int32_t i = 0; i < endpoint_count(); ++i)
      if (name == props(i).name) return i;
    return -1;
  }

  // The provider's message for the status a call just returned.
  std::string message(wia_status_t st) const {
    try {
      wia::check_provider(*provider_, st, "call");
    } catch (const wia::Error& e) {
      return e.what();
    }
    return {};
  }

  Tcp(const Tcp&) = delete;
  Tcp& operator=(const Tcp&) = delete;

  const wia_transport_ops_v1_t* ops = nullptr;
  void* ctx = nullptr;

 private:
  wia::EnvLookup env_;
  std::unique_ptr<wia::Config> config_;
  std::unique_ptr<wia::ProviderRegistry> registry_;
  const wia::Provider* provider_ = nullptr;
};

bool expired(Clock::time_point deadline) { return Clock::now() > deadline; }
Clock::time_point after_ms(int ms) { return Clock::now() + std::chrono::milliseconds(ms); }

// Polls test() until done, a failure, or the deadline (WIA_ERROR_TIMEOUT,
// the request stays posted).
wia_status_t wait_request(const Tcp& t, wia_request_t req, uint64_t* size = nullptr,
                          std::string* why = nullptr, int timeout_ms = kWaitMs) {
  const auto deadline = after_ms(timeout_ms);
  for (unsigned spins = 0;; ++spins) {
    wia::clear_provider_error();
    int32_t done = 0;
    uint64_t n = 0;
    const wia_status_t st = t.ops->test(t.ctx, req, &done, &n);
    if (st < 0) {
      if (why != nullptr) *why = t.message(st);
      return st;
    }
    if (done) {
      if (size != nullptr) *size = n;
      return WIA_SUCCESS;
    }
    if (expired(deadline)) return WIA_ERROR_TIMEOUT;
    if (spins % 256 == 255) std::this_thread::yield();
  }
}

wia_conn_t connect_to(const Tcp& t, int32_t ep, const void* handle, uint64_t cookie,
                      wia_status_t* status = nullptr) {
  wia_conn_t conn = nullptr;
  const auto deadline = after_ms(kWaitMs);
  for (;;) {
    wia::clear_provider_error();
    const wia_status_t st = t.ops->connect(t.ctx, ep, handle, cookie, &conn);
    if (status != nullptr) *status = st;
    if (st == WIA_SUCCESS) return conn;
    if (st < 0) return nullptr;
    if (expired(deadline)) {
      t.ops->close(t.ctx, conn);
      if (status != nullptr) *status = WIA_ERROR_TIMEOUT;
      return nullptr;
    }
    std::this_thread::yield();
  }
}

wia_conn_t accept_one(const Tcp& t, wia_listener_t l, uint64_t* cookie, int timeout_ms = kWaitMs) {
  const auto deadline = after_ms(timeout_ms);
  for (;;) {
    wia_conn_t conn = nullptr;
    uint64_t c = 0;
    const wia_status_t st = t.ops->accept(t.ctx, l, &c, &conn);
    if (st == WIA_SUCCESS) {
      if (cookie != nullptr) *cookie = c;
      return conn;
    }
    if (st < 0 || expired(deadline)) return nullptr;
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}

// Deterministic content for message `seed`.
void fill(std::vector<char>& b, uint64_t seed) {
  for (std::size_t i = 0; i < b.size(); ++i)
    b[i] = static_cast<char>((i * 131u + seed * 7u + (i >> 12)) & 0xff);
}
bool check(const char* p, std::size_t n, uint64_t seed) {
  for (std::size_t i = 0; i < n; ++i)
    if (p[i] != static_cast<char>((i * 131u + seed * 7u + (i >> 12)) & 0xff)) return false;
  return true;
}

// --- processes ---------------------------------------------------------------

bool write_all(int fd, const void* p, std::size_t n) {
  const auto* c = static_cast<const char*>(p);
  while (n > 0) {
    ssize_t w = ::write(fd, c, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    c += w;
    n -= static_cast<std::size_t>(w);
  }
  return true;
}

bool read_all(int fd, void* p, std::size_t n, int timeout_ms = kWaitMs) {
  auto* c = static_cast<char*>(p);
  const auto deadline = after_ms(timeout_ms);
  while (n > 0) {
    pollfd pf{fd, POLLIN, 0};
    if (::poll(&pf, 1, 100) <= 0) {
      if (expired(deadline)) return false;
      continue;
    }
    ssize_t r = ::read(fd, c, n);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    c += r;
    n -= static_cast<std::size_t>(r);
  }
  return true;
}

// Failing check inside a child: explain on stderr, exit with `code`.
[[noreturn]] void child_fail(int code, const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  std::fprintf(stderr, "tcp test child: ");
  std::vfprintf(stderr, fmt, ap);
  std::fprintf(stderr, "\n");
  va_end(ap);
  std::fflush(stderr);
  ::_exit(code);
}

// A forked process running `body`; its return value is the exit code. Two
// pipes connect it to the parent (to_child / from_child from the parent's
// view). Killed if still running when destroyed.
class Child {
 public:
  explicit Child(const std::function<int(int in, int out)>& body) {
    int down[2], up[2];
    REQUIRE(::pipe(down) == 0);
    REQUIRE(::pipe(up) == 0);
    std::fflush(nullptr);
    pid_ = ::fork();
    REQUIRE(pid_ >= 0);
    if (pid_ == 0) {
      ::close(down[1]);
      ::close(up[0]);
      int code = 99;
      try {
        code = body(down[0], up[1]);
      } catch (...) {
        code = 98;
      }
      std::fflush(nullptr);
      ::_exit(code);
    }
    ::close(down[0]);
    ::close(up[1]);
    to_child = down[1];
    from_child = up[0];
  }
  ~Child() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
    ::close(to_child);
    ::close(from_child);
  }
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;

  // Exit code, or -1 when it did not exit in time (then it is killed), or
  // 128 + signal.
  int wait(int timeout_ms = kWaitMs) {
    const auto deadline = after_ms(timeout_ms);
    for (;;) {
      int status = 0;
      pid_t r = ::waitpid(pid_, &status, WNOHANG);
      if (r == pid_) {
        pid_ = -1;
        if (WIFEXITED(status)) return WEXITSTATUS(status);
        return 128 + WTERMSIG(status);
      }
      if (expired(deadline)) {
        ::kill(pid_, SIGKILL);
        ::waitpid(pid_, nullptr, 0);
        pid_ = -1;
        return -1;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  }
  void kill_now() {
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }

  int to_child = -1;
  int from_child = -1;

 private:
  pid_t pid_ = -1;
};

// The common shape: this process listens on loopback, a child connects
// (cookie 42) and runs `child_body(conn)`; the parent accepts and returns
// the connection. The listener is closed before returning.
struct Pair {
  std::unique_ptr<Child> child;
  wia_conn_t conn = nullptr;
};

Pair start_pair(const Tcp& t, const std::function<int(wia_conn_t, int in, int out)>& child_body) {
  const int32_t ep = t.endpoint_named("lo");
  REQUIRE(ep >= 0);
  char handle[WIA_TRANSPORT_HANDLE_SIZE];
  wia_listener_t l = nullptr;
  REQUIRE(t.ops->listen(t.ctx, ep, handle, &l) == WIA_SUCCESS);
  Pair p;
  p.child = std::make_unique<Child>([&](int in, int out) {
    char h[WIA_TRANSPORT_HANDLE_SIZE];
    if (!read_all(in, h, sizeof(h))) child_fail(2, "no handle from the parent");
    wia_status_t st = WIA_SUCCESS;
    wia_conn_t conn = connect_to(t, ep, h, 42, &st);
    if (conn == nullptr) child_fail(3, "connect failed: status %d", st);
    return child_body(conn, in, out);
  });
  REQUIRE(write_all(p.child->to_child, handle, sizeof(handle)));
  uint64_t cookie = 0;
  p.conn = accept_one(t, l, &cookie);
  REQUIRE(p.conn != nullptr);
  CHECK(cookie == 42);
  REQUIRE(t.ops->close_listener(t.ctx, l) == WIA_SUCCESS);
  return p;
}

wia_request_t post_send(const Tcp& t, wia_conn_t c, const void* buf, uint64_t n, uint64_t tag) {
  wia_request_t r = nullptr;
  const wia_status_t st = t.ops->isend(t.ctx, c, buf, n, tag, nullptr, &r);
  if (st != WIA_SUCCESS || r == nullptr) return nullptr;
  return r;
}
wia_request_t post_recv(const Tcp& t, wia_conn_t c, void* buf, uint64_t n, uint64_t tag) {
  wia_request_t r = nullptr;
  const wia_status_t st = t.ops->irecv(t.ctx, c, buf, n, tag, nullptr, &r);
  if (st != WIA_SUCCESS || r == nullptr) return nullptr;
  return r;
}

// --- raw sockets for the hostile-client tests ----------------------------------

int raw_connect(const wia::tcp::WireHandle& h) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = h.port;
  std::memcpy(&a.sin_addr, h.addr, 4);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// True when the listener closes `fd` (EOF or reset) within timeout_ms.
bool closed_by_listener(int fd, int timeout_ms) {
  const auto deadline = after_ms(timeout_ms);
  while (!expired(deadline)) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 50) > 0) {
      char c;
      ssize_t r = ::recv(fd, &c, 1, MSG_DONTWAIT);
      if (r == 0 || (r < 0 && errno == ECONNRESET)) return true;
    }
  }
  return false;
}

wia::tcp::WireHello good_hello(const wia::tcp::WireHandle& h, uint16_t stream, uint16_t nstreams,
                               uint64_t conn_id, uint64_t cookie) {
  wia::tcp::WireHello hello{};
  hello.magic = wia::tcp::kHelloMagic;
  hello.version = wia::tcp::kWireVersion;
  hello.stream = stream;
  hello.nstreams = nstreams;
  std::memcpy(hello.secret, h.secret, sizeof(hello.secret));
  hello.cookie = cookie;
  hello.conn_id = conn_id;
  return hello;
}

}  // namespace
#pragma GCC diagnostic pop
