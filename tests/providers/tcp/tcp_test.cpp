// SPDX-License-Identifier: Apache-2.0
// The tcp transport provider between real processes over real loopback
// sockets. The provider is loaded the way the core loads it (the registry,
// with a YAML text and an injected environment); the second process is a
// fork() of the test, and listen handles travel through a pipe.
//
// Every wait is bounded: requests by a deadline on test(), children by a
// deadline on waitpid (then SIGKILL). A child reports through its exit
// code (0 = every check passed) and explains failures on stderr.
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

// ============================================================================

TEST_CASE("tcp endpoints: loopback is offered with 64 tag bits and node-local flags") {
  Tcp all(Params{{"ifname", ""}});
  REQUIRE(all.endpoint_count() >= 1);
  const int32_t lo = all.endpoint_named("lo");
  REQUIRE(lo >= 0);
  const auto p = all.props(lo);
  CHECK(p.tag_bits == 64);
  CHECK((p.flags & WIA_TRANSPORT_FLAG_INTRA_NODE) != 0);
  CHECK((p.flags & WIA_TRANSPORT_FLAG_INTER_NODE) == 0);
  CHECK((p.flags & WIA_TRANSPORT_FLAG_REG_REQUIRED) == 0);
  CHECK(p.mem_ifaces == (1u << WIA_MEM_IFACE_HOST));
  CHECK(p.max_message_size > (64u << 20));
  // Real interfaces come first so that endpoint 0 reaches other nodes.
  if (all.endpoint_count() > 1) {
    CHECK(lo == all.endpoint_count() - 1);
    CHECK((all.props(0).flags & WIA_TRANSPORT_FLAG_INTER_NODE) != 0);
  }

  Tcp only_lo(Params{{"ifname", "=lo"}});
  CHECK(only_lo.endpoint_count() == 1);
  CHECK(std::string(only_lo.props(0).name) == "lo");
  Tcp no_lo(Params{{"ifname", "^lo"}});
  CHECK(no_lo.endpoint_named("lo") == -1);

  // WIA_SOCKET_IFNAME applies when tcp.ifname is empty.
  ::setenv("WIA_SOCKET_IFNAME", "=lo", 1);
  Tcp by_env(Params{{"ifname", ""}});
  ::unsetenv("WIA_SOCKET_IFNAME");
  CHECK(by_env.endpoint_count() == 1);
  CHECK(by_env.endpoint_named("lo") == 0);

  // A bad family is a configuration error naming the key.
  bool refused = false;
  try {
    Tcp bad(Params{{"family", "ipx"}});
  } catch (const wia::Error& e) {
    refused = true;
    CHECK(std::string(e.what()).find("tcp.family") != std::string::npos);
  }
  CHECK(refused);
}

TEST_CASE("tcp handshake: the listener gets the connector's cookie and messages flow both ways") {
  Tcp t;
  const int32_t ep = t.endpoint_named("lo");
  REQUIRE(ep >= 0);
  // The child listens and passes its handle up the pipe.
  Child child([&](int in, int out) {
    char handle[WIA_TRANSPORT_HANDLE_SIZE];
    wia_listener_t l = nullptr;
    if (t.ops->listen(t.ctx, ep, handle, &l) != WIA_SUCCESS) child_fail(2, "listen failed");
    if (!write_all(out, handle, sizeof(handle))) child_fail(3, "pipe");
    uint64_t cookie = 0;
    wia_conn_t c = accept_one(t, l, &cookie);
    if (c == nullptr) child_fail(4, "accept failed");
    if (cookie != 0xC0FFEE0123456789ull) child_fail(5, "cookie %llx", (unsigned long long)cookie);
    char buf[16] = {};
    uint64_t n = 0;
    if (wait_request(t, post_recv(t, c, buf, sizeof(buf), 7), &n) != WIA_SUCCESS || n != 5 ||
        std::memcmp(buf, "ping", 5) != 0)
      child_fail(6, "ping not received");
    if (wait_request(t, post_send(t, c, "pong", 5, 8)) != WIA_SUCCESS) child_fail(7, "pong");
    // Keep the connection until the parent has the reply.
    char ok;
    if (!read_all(in, &ok, 1)) child_fail(8, "no word from the parent");
    t.ops->close(t.ctx, c);
    t.ops->close_listener(t.ctx, l);
    return 0;
  });
  char handle[WIA_TRANSPORT_HANDLE_SIZE];
  REQUIRE(read_all(child.from_child, handle, sizeof(handle)));
  wia_status_t st = WIA_SUCCESS;
  wia_conn_t c = connect_to(t, ep, handle, 0xC0FFEE0123456789ull, &st);
  REQUIRE_MESSAGE(c != nullptr, "connect: " << st << " " << t.message(st));
  char reply[16] = {};
  uint64_t n = 0;
  wia_request_t rr = post_recv(t, c, reply, sizeof(reply), 8);
  REQUIRE(wait_request(t, post_send(t, c, "ping", 5, 7)) == WIA_SUCCESS);
  REQUIRE(wait_request(t, rr, &n) == WIA_SUCCESS);
  CHECK(n == 5);
  CHECK(std::string(reply) == "pong");
  const char ok = 1;
  CHECK(write_all(child.to_child, &ok, 1));
  CHECK(child.wait() == 0);
  CHECK(t.ops->close(t.ctx, c) == WIA_SUCCESS);
}

TEST_CASE("tcp sizes: 0, 1, 4095, 1 MiB and 64 MiB arrive intact in both directions") {
  const std::vector<uint64_t> sizes = {0, 1, 4095, 65536, 65537, 1u << 20, 64u << 20};
  for (const char* streams : {"1", "3"}) {
    CAPTURE(streams);
    Tcp t(Params{{"streams", streams}});
    // The child echoes every message back on tag + 1000.
    Pair p = start_pair(t, [&](wia_conn_t c, int, int) {
      for (uint64_t size : sizes) {
        std::vector<char> buf(size + 1);
        uint64_t n = 0;
        if (wait_request(t, post_recv(t, c, buf.data(), buf.size(), size), &n) != WIA_SUCCESS)
          child_fail(10, "recv of %llu bytes failed", (unsigned long long)size);
        if (n != size || !check(buf.data(), size, size))
          child_fail(11, "%llu bytes: got %llu or bad data", (unsigned long long)size,
                     (unsigned long long)n);
        if (wait_request(t, post_send(t, c, buf.data(), size, size + 1000)) != WIA_SUCCESS)
          child_fail(12, "echo of %llu bytes failed", (unsigned long long)size);
      }
      t.ops->close(t.ctx, c);
      return 0;
    });
    for (uint64_t size : sizes) {
      CAPTURE(size);
      std::vector<char> out(size), in(size + 1);
      fill(out, size);
      wia_request_t r = post_recv(t, p.conn, in.data(), in.size(), size + 1000);
      REQUIRE(r != nullptr);
      REQUIRE(wait_request(t, post_send(t, p.conn, out.data(), size, size)) == WIA_SUCCESS);
      uint64_t n = 0;
      REQUIRE(wait_request(t, r, &n) == WIA_SUCCESS);
      CHECK(n == size);
      CHECK(check(in.data(), size, size));
    }
    CHECK(p.child->wait() == 0);
    CHECK(t.ops->close(t.ctx, p.conn) == WIA_SUCCESS);
  }
}

TEST_CASE("tcp matching: 1000 outstanding requests with mixed tags, posted in different orders") {
  constexpr int kCount = 1000, kTags = 7;
  auto size_of = [](int i) -> uint64_t {
    if (i % 50 == 0) return 300 * 1024 + static_cast<uint64_t>(i);  // RTS, striped
    if (i % 3 == 0) return 0;
    return static_cast<uint64_t>(i * 37 % 5000 + 1);
  };
  // Receive order: tags from the highest down, each tag's messages in order
  // (the n-th receive of a tag meets the n-th send of that tag).
  std::vector<int> recv_order;
  for (int tag = kTags - 1; tag >= 0; --tag)
    for (int i = tag; i < kCount; i += kTags) recv_order.push_back(i);

  // Posts every send (in index order) and every receive (in recv_order),
  // then waits for all; message i carries seed i + seed_base.
  auto exchange = [&](const Tcp& t, wia_conn_t c, uint64_t send_seed, uint64_t recv_seed,
                      bool recv_first) -> std::string {
    std::vector<std::vector<char>> out(kCount), in(kCount);
    std::vector<wia_request_t> sends(kCount), recvs(kCount);
    auto post_recvs = [&] {
      for (int i : recv_order) {
        in[i].resize(size_of(i) + 8);
        recvs[i] = post_recv(t, c, in[i].data(), in[i].size(), static_cast<uint64_t>(i % kTags));
      }
    };
    if (recv_first) post_recvs();
    for (int i = 0; i < kCount; ++i) {
      out[i].resize(size_of(i));
      fill(out[i], send_seed + i);
      sends[i] = post_send(t, c, out[i].data(), out[i].size(), static_cast<uint64_t>(i % kTags));
      if (sends[i] == nullptr) return "isend " + std::to_string(i) + " not posted";
    }
    if (!recv_first) post_recvs();
    for (int i = 0; i < kCount; ++i)
      if (recvs[i] == nullptr) return "irecv " + std::to_string(i) + " not posted";
    for (int i = 0; i < kCount; ++i) {
      std::string why;
      if (wait_request(t, sends[i], nullptr, &why) != WIA_SUCCESS)
        return "send " + std::to_string(i) + ": " + why;
    }
    for (int i : recv_order) {
      uint64_t n = 0;
      std::string why;
      if (wait_request(t, recvs[i], &n, &why) != WIA_SUCCESS)
        return "recv " + std::to_string(i) + ": " + why;
      if (n != size_of(i) || !check(in[i].data(), n, recv_seed + i))
        return "message " + std::to_string(i) + " has the wrong size or content";
    }
    return {};
  };

  Tcp t(Params{{"streams", "2"}});
  Pair p = start_pair(t, [&](wia_conn_t c, int, int) {
    const std::string err = exchange(t, c, 5000, 0, false);
    if (!err.empty()) child_fail(20, "%s", err.c_str());
    t.ops->close(t.ctx, c);
    return 0;
  });
  CHECK(exchange(t, p.conn, 0, 5000, true) == "");
  CHECK(p.child->wait() == 0);
  CHECK(t.ops->close(t.ctx, p.conn) == WIA_SUCCESS);
}

TEST_CASE("tcp flow control: unmatched messages beyond tcp.unexpected_max wait, then all arrive") {
  constexpr int kCount = 200;
  constexpr std::size_t kSize = 8192;  // 1.6 MB in all, 25x the bound
  Tcp t(Params{{"unexpected_max", "64K"}});
  Pair p = start_pair(t, [&](wia_conn_t c, int, int) {
    std::vector<std::vector<char>> out(kCount, std::vector<char>(kSize));
    std::vector<wia_request_t> reqs;
    for (int i = 0; i < kCount; ++i) {
      fill(out[i], i);
      reqs.push_back(post_send(t, c, out[i].data(), kSize, 1));
    }
    for (auto r : reqs)
      if (r == nullptr || wait_request(t, r) != WIA_SUCCESS) child_fail(30, "send failed");
    t.ops->close(t.ctx, c);
    return 0;
  });
  // Let the sender run into the bound before any receive is posted.
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  for (int i = 0; i < kCount; ++i) {
    std::vector<char> in(kSize);
    uint64_t n = 0;
    REQUIRE(wait_request(t, post_recv(t, p.conn, in.data(), kSize, 1), &n) == WIA_SUCCESS);
    REQUIRE(check(in.data(), n, i));
  }
  CHECK(p.child->wait() == 0);
  CHECK(t.ops->close(t.ctx, p.conn) == WIA_SUCCESS);
}

TEST_CASE("tcp truncation: a receive smaller than the message fails with WIA_ERROR_REMOTE") {
  Tcp t;
  Pair p = start_pair(t, [&](wia_conn_t c, int, int) {
    std::vector<char> small(100), big(1u << 20), after(100);
    fill(small, 1);
    fill(big, 2);
    fill(after, 3);
    wia_request_t a = post_send(t, c, small.data(), small.size(), 1);
    wia_request_t b = post_send(t, c, big.data(), big.size(), 2);
    wia_request_t d = post_send(t, c, after.data(), after.size(), 3);
    // Eager: complete once written. Large: refused by the receiver.
    if (wait_request(t, a) != WIA_SUCCESS) child_fail(40, "eager send failed");
    std::string why;
    if (wait_request(t, b, nullptr, &why) != WIA_ERROR_REMOTE)
      child_fail(41, "large send not refused");
    if (why.find("smaller") == std::string::npos) child_fail(42, "message: %s", why.c_str());
    if (wait_request(t, d) != WIA_SUCCESS) child_fail(43, "send after the refusal failed");
    t.ops->close(t.ctx, c);
    return 0;
  });
  // Buffers far larger than what is posted: everything past the posted
  // size must stay untouched.
  std::vector<char> guard(2u << 20, '\x5a');
  std::string why;
  REQUIRE(wait_request(t, post_recv(t, p.conn, guard.data(), 50, 1), nullptr, &why) ==
          WIA_ERROR_REMOTE);
  CHECK(why.find("does not fit the 50-byte receive buffer") != std::string::npos);
  REQUIRE(wait_request(t, post_recv(t, p.conn, guard.data(), 1000, 2), nullptr, &why) ==
          WIA_ERROR_REMOTE);
  CHECK(why.find("1048576-byte message") != std::string::npos);
  CHECK(why.find("127.0.0.1") != std::string::npos);
  bool untouched = true;
  for (char c : guard) untouched = untouched && c == '\x5a';
  CHECK(untouched);
  // The connection stays usable.
  std::vector<char> in(100);
  uint64_t n = 0;
  REQUIRE(wait_request(t, post_recv(t, p.conn, in.data(), in.size(), 3), &n) == WIA_SUCCESS);
  CHECK(n == 100);
  CHECK(check(in.data(), n, 3));
  CHECK(p.child->wait() == 0);
  CHECK(t.ops->close(t.ctx, p.conn) == WIA_SUCCESS);
}

TEST_CASE("tcp listener: bad hellos are rejected and a good client is still served") {
  Tcp t;  // hello_timeout_ms 500
  const int32_t ep = t.endpoint_named("lo");
  REQUIRE(ep >= 0);
  char handle[WIA_TRANSPORT_HANDLE_SIZE];
  wia_listener_t l = nullptr;
  REQUIRE(t.ops->listen(t.ctx, ep, handle, &l) == WIA_SUCCESS);
  wia::tcp::WireHandle h;
  std::memcpy(&h, handle, sizeof(h));

  Child child([&](int, int out) {
    // 1. wrong secret
    int a = raw_connect(h);
    wia::tcp::WireHello bad = good_hello(h, 0, 1, 1, 1);
    bad.secret[3] ^= 0x40;
    if (a < 0 || !write_all(a, &bad, sizeof(bad))) child_fail(50, "raw connect");
    // 2. truncated hello, then close
    int b = raw_connect(h);
    wia::tcp::WireHello trunc = good_hello(h, 0, 1, 2, 2);
    if (b < 0 || !write_all(b, &trunc, 20)) child_fail(51, "raw connect");
    ::close(b);
    // 3. garbage
    int g = raw_connect(h);
    char junk[48];
    std::memset(junk, 0xEE, sizeof(junk));
    if (g < 0 || !write_all(g, junk, sizeof(junk))) child_fail(52, "raw connect");
    // 4. silent (slow) client
    int s = raw_connect(h);
    if (s < 0) child_fail(53, "raw connect");
    // 5. absurd stream count
    int x = raw_connect(h);
    wia::tcp::WireHello many = good_hello(h, 0, 300, 3, 3);
    if (x < 0 || !write_all(x, &many, sizeof(many))) child_fail(54, "raw connect");
    if (!closed_by_listener(a, 10000)) child_fail(55, "wrong-secret client not closed");
    if (!closed_by_listener(g, 10000)) child_fail(56, "garbage client not closed");
    if (!closed_by_listener(x, 10000)) child_fail(57, "300-stream client not closed");
    if (!closed_by_listener(s, 10000)) child_fail(58, "silent client not closed after the timeout");
    for (int fd : {a, g, s, x}) ::close(fd);

    // 6. a good client through the provider.
    wia_status_t st = WIA_SUCCESS;
    wia_conn_t c = connect_to(t, ep, handle, 77, &st);
    if (c == nullptr) child_fail(59, "good connect failed: %d", st);
    if (wait_request(t, post_send(t, c, "good", 5, 1)) != WIA_SUCCESS) child_fail(60, "send");

    // 7. a hostile peer that passes the handshake, then sends bad headers:
    //    an eager message far over the eager limit, and a broken checksum.
    std::vector<int> hostile;
    for (uint64_t cookie : {101u, 102u}) {
      int ctrl = raw_connect(h), data = raw_connect(h);
      auto h0 = good_hello(h, 0, 1, 1000 + cookie, cookie);
      auto h1 = good_hello(h, 1, 1, 1000 + cookie, cookie);
      if (ctrl < 0 || data < 0 || !write_all(ctrl, &h0, sizeof(h0)) ||
          !write_all(data, &h1, sizeof(h1)))
        child_fail(61, "raw handshake");
      wia::tcp::WireMsg m =
          wia::tcp::make_msg(wia::tcp::MsgType::eager, 0, 9, cookie == 101 ? (1ull << 50) : 10);
      if (cookie == 102) m.check ^= 1;
      if (!write_all(ctrl, &m, sizeof(m))) child_fail(62, "raw header");
      hostile.push_back(ctrl);
      hostile.push_back(data);
    }
    if (!closed_by_listener(hostile[0], 10000)) child_fail(63, "hostile peer 101 not disconnected");
    if (!closed_by_listener(hostile[2], 10000)) child_fail(64, "hostile peer 102 not disconnected");
    for (int fd : hostile) ::close(fd);
    char bye = 0;
    write_all(out, &bye, 1);
    t.ops->close(t.ctx, c);
    return 0;
  });

  // Serve until the good client (cookie 77) and the two hostile ones that
  // pass the handshake (101, 102) have arrived, in whatever order.
  std::map<uint64_t, wia_conn_t> conns;
  while (conns.size() < 3) {
    uint64_t cookie = 0;
    wia_conn_t c = accept_one(t, l, &cookie);
    REQUIRE(c != nullptr);
    conns[cookie] = c;
  }
  REQUIRE(conns.count(77) == 1);
  wia_conn_t good = conns[77];
  char buf[8] = {};
  REQUIRE(wait_request(t, post_recv(t, good, buf, sizeof(buf), 1)) == WIA_SUCCESS);
  CHECK(std::string(buf) == "good");
  // The two hostile connections: each fails with a message naming the peer.
  for (uint64_t cookie : {101u, 102u}) {
    const char* expect = cookie == 101 ? "exceeds the 65536-byte eager limit" : "checksum";
    REQUIRE(conns.count(cookie) == 1);
    wia_conn_t bad = conns[cookie];
    std::string why;
    char sink[16];
    CHECK(wait_request(t, post_recv(t, bad, sink, sizeof(sink), 9), nullptr, &why) ==
          WIA_ERROR_REMOTE);
    CHECK_MESSAGE(why.find(expect) != std::string::npos, why);
    CHECK_MESSAGE(why.find("127.0.0.1") != std::string::npos, why);
    CHECK(t.ops->close(t.ctx, bad) == WIA_SUCCESS);
  }
  char bye;
  CHECK(read_all(child.from_child, &bye, 1));
  CHECK(child.wait() == 0);
  CHECK(t.ops->close(t.ctx, good) == WIA_SUCCESS);
  CHECK(t.ops->close_listener(t.ctx, l) == WIA_SUCCESS);
}

TEST_CASE(
    "tcp peer death: SIGKILL mid-transfer fails every pending request with WIA_ERROR_REMOTE") {
  Tcp t;
  constexpr std::size_t kBig = 64u << 20;
  Pair p = start_pair(t, [&](wia_conn_t c, int, int out) -> int {
    std::vector<char> big(kBig, 'k');
    wia_request_t r = post_send(t, c, big.data(), big.size(), 1);
    if (r == nullptr) child_fail(70, "isend");
    char go = 1;
    write_all(out, &go, 1);
    // Keep the transfer going until the parent kills us.
    int32_t done = 0;
    for (;;) {
      if (t.ops->test(t.ctx, r, &done, nullptr) < 0 || done) ::pause();
    }
  });
  std::vector<char> in(kBig), small(16), out(kBig, 'p');
  wia_request_t big_recv = post_recv(t, p.conn, in.data(), in.size(), 1);
  wia_request_t small_recv = post_recv(t, p.conn, small.data(), small.size(), 2);
  wia_request_t big_send = post_send(t, p.conn, out.data(), out.size(), 3);
  REQUIRE(big_recv != nullptr);
  REQUIRE(small_recv != nullptr);
  REQUIRE(big_send != nullptr);
  // Move some data, so the kill lands mid-transfer.
  char go;
  REQUIRE(read_all(p.child->from_child, &go, 1));
  int32_t done = 0;
  for (int i = 0; i < 3 && !done; ++i) REQUIRE(t.ops->test(t.ctx, big_recv, &done, nullptr) >= 0);
  REQUIRE(done == 0);
  p.child->kill_now();
  for (wia_request_t r : {big_recv, small_recv, big_send}) {
    std::string why;
    const auto start = Clock::now();
    CHECK(wait_request(t, r, nullptr, &why, 10000) == WIA_ERROR_REMOTE);
    CHECK(Clock::now() - start < std::chrono::seconds(10));
    CHECK_MESSAGE(why.find("127.0.0.1") != std::string::npos, why);
  }
  // Later requests fail at once.
  wia_request_t r = nullptr;
  CHECK(t.ops->irecv(t.ctx, p.conn, small.data(), small.size(), 5, nullptr, &r) ==
        WIA_ERROR_REMOTE);
  CHECK(t.ops->isend(t.ctx, p.conn, small.data(), small.size(), 5, nullptr, &r) ==
        WIA_ERROR_REMOTE);
  CHECK(t.ops->close(t.ctx, p.conn) == WIA_SUCCESS);
}

TEST_CASE("tcp IPv6 loopback") {
  Tcp t(Params{{"family", "ipv6"}});
  if (t.endpoint_named("lo") < 0) {
    MESSAGE("skipped: no IPv6 address on lo (::1) on this machine");
    return;
  }
  Pair p = start_pair(t, [&](wia_conn_t c, int, int) {
    std::vector<char> buf(1u << 20);
    uint64_t n = 0;
    if (wait_request(t, post_recv(t, c, buf.data(), buf.size(), 6), &n) != WIA_SUCCESS ||
        n != buf.size() || !check(buf.data(), n, 6))
      child_fail(80, "IPv6 message");
    t.ops->close(t.ctx, c);
    return 0;
  });
  std::vector<char> out(1u << 20);
  fill(out, 6);
  CHECK(wait_request(t, post_send(t, p.conn, out.data(), out.size(), 6)) == WIA_SUCCESS);
  CHECK(p.child->wait() == 0);
  CHECK(t.ops->close(t.ctx, p.conn) == WIA_SUCCESS);
}

TEST_CASE("tcp reg_mr: host memory is accepted, device memory refused with a reason") {
  Tcp t;
  std::vector<char> buf(4096);
  wia_mr_desc_v1_t d{};
  d.struct_size = sizeof(d);
  d.kind = WIA_MR_HOST;
  d.ptr = buf.data();
  d.size = buf.size();
  d.iface = WIA_MEM_IFACE_HOST;
  d.dmabuf_fd = -1;
  wia_mr_t mr = nullptr;
  REQUIRE(t.ops->reg_mr(t.ctx, 0, &d, &mr) == WIA_SUCCESS);
  CHECK(t.ops->dereg_mr(t.ctx, mr) == WIA_SUCCESS);
  d.kind = WIA_MR_DEVICE;
  d.iface = WIA_MEM_IFACE_CUDA;
  wia::clear_provider_error();
  const wia_status_t st = t.ops->reg_mr(t.ctx, 0, &d, &mr);
  CHECK(st == WIA_ERROR_NOT_SUPPORTED);
  CHECK(t.message(st).find("host-accessible") != std::string::npos);
  // "Device" memory that is host memory (the host provider's) is fine.
  d.iface = WIA_MEM_IFACE_HOST;
  REQUIRE(t.ops->reg_mr(t.ctx, 0, &d, &mr) == WIA_SUCCESS);
  CHECK(t.ops->dereg_mr(t.ctx, mr) == WIA_SUCCESS);
}

TEST_CASE("tcp connect: a closed port fails with a message; close() abandons a pending connect") {
  Tcp t;
  const int32_t ep = t.endpoint_named("lo");
  char handle[WIA_TRANSPORT_HANDLE_SIZE];
  wia_listener_t l = nullptr;
  REQUIRE(t.ops->listen(t.ctx, ep, handle, &l) == WIA_SUCCESS);
  REQUIRE(t.ops->close_listener(t.ctx, l) == WIA_SUCCESS);
  wia_status_t st = WIA_SUCCESS;
  CHECK(connect_to(t, ep, handle, 1, &st) == nullptr);
  CHECK(st == WIA_ERROR_REMOTE);
  CHECK(t.message(st).find("127.0.0.1") != std::string::npos);

  // A handle that is not one.
  char junk[WIA_TRANSPORT_HANDLE_SIZE] = {1, 2, 3};
  wia_conn_t c = nullptr;
  wia::clear_provider_error();
  st = t.ops->connect(t.ctx, ep, junk, 1, &c);
  CHECK(st == WIA_ERROR_INVALID_ARGUMENT);
  CHECK(c == nullptr);

  // An address nobody answers for: the first call is IN_PROGRESS (or fails
  // at once without a route); close() must release it either way.
  wia::tcp::WireHandle h;
  REQUIRE(t.ops->listen(t.ctx, ep, handle, &l) == WIA_SUCCESS);
  std::memcpy(&h, handle, sizeof(h));
  const in_addr_t unreachable = inet_addr("192.0.2.254");
  std::memcpy(h.addr, &unreachable, 4);
  std::memcpy(handle, &h, sizeof(h));
  c = nullptr;
  st = t.ops->connect(t.ctx, ep, handle, 1, &c);
  if (st == WIA_IN_PROGRESS) {
    REQUIRE(c != nullptr);
    CHECK(t.ops->close(t.ctx, c) == WIA_SUCCESS);
  } else {
    CHECK(st < 0);
    CHECK(c == nullptr);
  }
  CHECK(t.ops->close_listener(t.ctx, l) == WIA_SUCCESS);
}

// Delivery before failure: a sender whose large send is done (handed to the
// data sockets) and which then closes at once. The receiver sees the
// control socket's EOF while the payload still waits on a data socket; it
// must complete the receive from it, and fail only what cannot complete.
TEST_CASE("tcp close: a send done before close() is delivered (control EOF before the data)") {
  // Send buffers large enough to hold the whole 200 KiB message, so the
  // child's send completes and it closes while the parent has read none of
  // the payload: the parent then reads the control EOF first.
  Tcp t(Params{{"streams", "1"}, {"sndbuf", "1M"}});
  constexpr std::size_t kBig = 200 * 1024, kSmall = 1000;
  Pair p = start_pair(t, [&](wia_conn_t c, int, int out) {
    std::vector<char> small(kSmall), big(kBig);
    fill(small, 1);
    fill(big, 2);
    wia_request_t a = post_send(t, c, small.data(), small.size(), 1);
    wia_request_t b = post_send(t, c, big.data(), big.size(), 2);
    if (a == nullptr || b == nullptr) child_fail(90, "isend");
    if (!write_all(out, "r", 1)) child_fail(91, "pipe");  // the RTS is out
    if (wait_request(t, a) != WIA_SUCCESS || wait_request(t, b) != WIA_SUCCESS)
      child_fail(92, "send failed");
    t.ops->close(t.ctx, c);
    if (!write_all(out, "c", 1)) child_fail(93, "pipe");
    return 0;
  });
  std::vector<char> small(kSmall), big(kBig);
  wia_request_t a = post_recv(t, p.conn, small.data(), small.size(), 1);
  wia_request_t b = post_recv(t, p.conn, big.data(), big.size(), 2);
  wia_request_t never = post_recv(t, p.conn, small.data(), small.size(), 3);
  REQUIRE(a != nullptr);
  REQUIRE(b != nullptr);
  REQUIRE(never != nullptr);
  char word = 0;
  REQUIRE(read_all(p.child->from_child, &word, 1));
  REQUIRE(word == 'r');
  // One progress call answers the RTS with a CTS; then leave the payload
  // unread until the child has closed (progressing again only if the child
  // seems stuck, so a slow machine cannot deadlock the test).
  int32_t done = 0;
  REQUIRE(t.ops->test(t.ctx, b, &done, nullptr) >= 0);
  const auto deadline = after_ms(kWaitMs);
  while (!done && !expired(deadline)) {
    pollfd pf{p.child->from_child, POLLIN, 0};
    if (::poll(&pf, 1, 200) > 0) break;
    REQUIRE(t.ops->test(t.ctx, b, &done, nullptr) >= 0);
    if (done) break;
  }
  if (!done) {
    REQUIRE(read_all(p.child->from_child, &word, 1));
    REQUIRE(word == 'c');
    uint64_t n = 0;
    std::string why;
    REQUIRE_MESSAGE(wait_request(t, b, &n, &why) == WIA_SUCCESS, why);
    CHECK(n == kBig);
  }
  CHECK(check(big.data(), kBig, 2));
  uint64_t n = 0;
  REQUIRE(wait_request(t, a, &n) == WIA_SUCCESS);
  CHECK(n == kSmall);
  CHECK(check(small.data(), kSmall, 1));
  // The receive no message can meet fails, naming the peer, and so do new
  // requests; nothing waits for a timeout.
  std::string why;
  CHECK(wait_request(t, never, nullptr, &why, 10000) == WIA_ERROR_REMOTE);
  CHECK_MESSAGE(why.find("127.0.0.1") != std::string::npos, why);
  wia_request_t r = nullptr;
  CHECK(t.ops->irecv(t.ctx, p.conn, small.data(), small.size(), 4, nullptr, &r) ==
        WIA_ERROR_REMOTE);
  CHECK(t.ops->isend(t.ctx, p.conn, small.data(), small.size(), 4, nullptr, &r) ==
        WIA_ERROR_REMOTE);
  CHECK(p.child->wait() == 0);
  CHECK(t.ops->close(t.ctx, p.conn) == WIA_SUCCESS);
}

TEST_CASE("tcp close: striped 4 and 16 MiB sends, close at once, the receiver gets all data") {
  constexpr int kRounds = 3;
  const std::vector<std::size_t> sizes = {100, 64 * 1024, 4u << 20, 16u << 20};
  Tcp t(Params{{"streams", "2"}, {"min_stripe", "256K"}});
  for (int round = 0; round < kRounds; ++round) {
    CAPTURE(round);
    Pair p = start_pair(t, [&](wia_conn_t c, int, int) {
      std::vector<std::vector<char>> out(sizes.size());
      std::vector<wia_request_t> reqs;
      for (std::size_t i = 0; i < sizes.size(); ++i) {
        out[i].resize(sizes[i]);
        fill(out[i], 10 + i);
        reqs.push_back(post_send(t, c, out[i].data(), sizes[i], 10 + i));
      }
      for (wia_request_t r : reqs)
        if (r == nullptr || wait_request(t, r) != WIA_SUCCESS) child_fail(95, "send failed");
      t.ops->close(t.ctx, c);  // at once, then exit
      return 0;
    });
    std::vector<std::vector<char>> in(sizes.size());
    std::vector<wia_request_t> reqs;
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      in[i].resize(sizes[i]);
      reqs.push_back(post_recv(t, p.conn, in[i].data(), sizes[i], 10 + i));
      REQUIRE(reqs.back() != nullptr);
    }
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      CAPTURE(sizes[i]);
      uint64_t n = 0;
      std::string why;
      REQUIRE_MESSAGE(wait_request(t, reqs[i], &n, &why) == WIA_SUCCESS, why);
      CHECK(n == sizes[i]);
      CHECK(check(in[i].data(), n, 10 + i));
    }
    CHECK(p.child->wait() == 0);
    CHECK(t.ops->close(t.ctx, p.conn) == WIA_SUCCESS);
  }
}

// A listener must judge a socket by what recv() says, not by a poll()
// after an EAGAIN: a hello byte landing in between made a good but slow
// socket look "truncated", and the connector (already told WIA_SUCCESS)
// was left with a connection the listener never handed out.
TEST_CASE("tcp listener: hellos trickling in byte by byte are accepted, never called truncated") {
  Tcp t(Params{{"hello_timeout_ms", "20000"}});
  const int32_t ep = t.endpoint_named("lo");
  REQUIRE(ep >= 0);
  char handle[WIA_TRANSPORT_HANDLE_SIZE];
  wia_listener_t l = nullptr;
  REQUIRE(t.ops->listen(t.ctx, ep, handle, &l) == WIA_SUCCESS);
  wia::tcp::WireHandle h;
  std::memcpy(&h, handle, sizeof(h));
  constexpr int kConns = 3;
  Child child([&](int in, int) {
    for (int k = 0; k < kConns; ++k) {
      const uint64_t cookie = 500 + static_cast<uint64_t>(k);
      int fds[3] = {raw_connect(h), raw_connect(h), raw_connect(h)};
      for (int fd : fds) {
        if (fd < 0) child_fail(100, "raw connect");
        int one = 1;
        ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
      }
      wia::tcp::WireHello hellos[3];
      for (uint16_t s = 0; s < 3; ++s) hellos[s] = good_hello(h, s, 2, 9000 + cookie, cookie);
      // One byte at a time on each socket in turn, each its own segment.
      for (std::size_t b = 0; b < sizeof(wia::tcp::WireHello); ++b)
        for (int s = 0; s < 3; ++s) {
          if (!write_all(fds[s], reinterpret_cast<const char*>(&hellos[s]) + b, 1))
            child_fail(101, "hello byte %zu on socket %d", b, s);
          std::this_thread::sleep_for(std::chrono::microseconds(30));
        }
      // Keep the sockets open until the parent has accepted everything.
      char word;
      if (k == kConns - 1 && !read_all(in, &word, 1)) child_fail(102, "no word from the parent");
    }
    return 0;
  });
  // Spin on accept() without pausing so its recv/poll sequence keeps
  // meeting bytes as they land.
  std::map<uint64_t, wia_conn_t> conns;
  const auto deadline = after_ms(kWaitMs);
  while (conns.size() < kConns && !expired(deadline)) {
    wia_conn_t c = nullptr;
    uint64_t cookie = 0;
    const wia_status_t st = t.ops->accept(t.ctx, l, &cookie, &c);
    REQUIRE(st >= 0);
    if (st == WIA_SUCCESS) conns[cookie] = c;
  }
  CHECK(conns.size() == kConns);
  for (int k = 0; k < kConns; ++k) CHECK(conns.count(500 + static_cast<uint64_t>(k)) == 1);
  const char bye = 1;
  CHECK(write_all(child.to_child, &bye, 1));
  CHECK(child.wait() == 0);
  for (auto& [cookie, c] : conns) CHECK(t.ops->close(t.ctx, c) == WIA_SUCCESS);
  CHECK(t.ops->close_listener(t.ctx, l) == WIA_SUCCESS);
}

// The engine sleeps in poll(2) on what wait_fds reports when ranks outnumber
// cores, and calls test() only when woken: a missing descriptor or event
// (the data sockets of a striped message, the control socket's hang-up)
// would leave it asleep until its timeout, and a socket reported ready
// while nothing is due would make it spin.
TEST_CASE("tcp wait_fds: a receiver that only wakes from poll gets every message and the EOF") {
  Tcp t(Params{{"streams", "2"}, {"min_stripe", "65536"}});
  REQUIRE((t.ops->caps & WIA_TRANSPORT_CAP_WAIT_FD) != 0);
  REQUIRE(static_cast<bool>(t.ops->wait_fds));
  // Striped over both data sockets, and more than their buffers hold, so
  // the sender needs the receiver to read.
  const uint64_t big = 32u << 20;
  Pair p = start_pair(t, [&](wia_conn_t c, int in, int) {
    char go = 0;
    if (!read_all(in, &go, 1)) child_fail(20, "no go from the parent");
    std::vector<char> small(100), large(big);
    fill(small, 1);
    fill(large, 2);
    if (wait_request(t, post_send(t, c, small.data(), small.size(), 1)) != WIA_SUCCESS ||
        wait_request(t, post_send(t, c, large.data(), large.size(), 2)) != WIA_SUCCESS)
      child_fail(21, "send failed");
    // Closing only when the parent has everything: the end of the
    // connection must not be what wakes it for the data.
    if (!read_all(in, &go, 1)) child_fail(22, "no bye from the parent");
    t.ops->close(t.ctx, c);
    return 0;
  });
  std::vector<pollfd> fds(WIA_TRANSPORT_WAIT_FDS_MAX);
  // Sleeps on wait_fds; the number of descriptors that woke it (0: timed out).
  auto sleep_on = [&](int timeout_ms) {
    uint32_t count = 0;
    const wia_status_t st =
        t.ops->wait_fds(t.ctx, p.conn, fds.data(), static_cast<uint32_t>(fds.size()), &count);
    if (st == WIA_IN_PROGRESS) return 1;  // "do not wait": progress is possible now
    REQUIRE(st == WIA_SUCCESS);
    REQUIRE(count >= 1);
    REQUIRE(count <= fds.size());
    return ::poll(fds.data(), count, timeout_ms);
  };
  std::vector<char> small(200), large(big);
  wia_request_t rs = post_recv(t, p.conn, small.data(), small.size(), 1);
  wia_request_t rl = post_recv(t, p.conn, large.data(), large.size(), 2);
  REQUIRE(rs != nullptr);
  REQUIRE(rl != nullptr);
  // Nothing is due yet: the descriptors stay quiet.
  CHECK(sleep_on(200) == 0);
  REQUIRE(write_all(p.child->to_child, "g", 1));
  bool small_done = false, large_done = false;
  uint64_t small_size = 0, large_size = 0;
  int wakeups = 0;
  while (!small_done || !large_done) {
    REQUIRE_MESSAGE(sleep_on(10000) > 0, "messages are due but poll on wait_fds timed out");
    ++wakeups;
    int32_t done = 0;
    if (!small_done) {
      REQUIRE(t.ops->test(t.ctx, rs, &done, &small_size) == WIA_SUCCESS);
      small_done = done != 0;
    }
    if (!large_done) {
      done = 0;
      REQUIRE(t.ops->test(t.ctx, rl, &done, &large_size) == WIA_SUCCESS);
      large_done = done != 0;
    }
  }
  CHECK(small_size == 100);
  CHECK(check(small.data(), 100, 1));
  CHECK(large_size == big);
  CHECK(check(large.data(), big, 2));
  MESSAGE("woken " << wakeups << " times for 100 B + 32 MiB");
  REQUIRE(write_all(p.child->to_child, "b", 1));
  // The child closed: poll wakes for the end of the connection, and a
  // receive posted now fails instead of waiting forever.
  CHECK(p.child->wait() == 0);
  // (irecv may already refuse it, if the EOF was read with the data.)
  wia_request_t after = nullptr;
  wia_status_t st = t.ops->irecv(t.ctx, p.conn, small.data(), small.size(), 3, nullptr, &after);
  for (int i = 0; i < 100 && st == WIA_SUCCESS; ++i) {
    REQUIRE(after != nullptr);
    REQUIRE_MESSAGE(sleep_on(10000) > 0, "the peer closed but poll on wait_fds timed out");
    int32_t done = 0;
    st = t.ops->test(t.ctx, after, &done, nullptr);
    REQUIRE((st != WIA_SUCCESS || !done));  // nothing was sent with tag 3
  }
  CHECK(st == WIA_ERROR_REMOTE);
  CHECK(t.ops->close(t.ctx, p.conn) == WIA_SUCCESS);
}
