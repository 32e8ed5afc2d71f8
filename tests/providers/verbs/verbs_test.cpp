// SPDX-License-Identifier: Apache-2.0
// The verbs provider through its ABI alone (dlopen, a minimal host-services
// table) against the libibverbs double (tests/providers/fake-ibverbs). Most
// cases connect the endpoint to its own listener in one process; peer death
// forks a peer first. Checks what the conformance suite cannot see from
// outside: the registration cache (ibv_reg_mr calls counted by the double),
// rendezvous data at the eager boundary and at 64 MiB, each injected fault
// becoming WIA_ERROR_REMOTE naming the peer on both sides within a bounded
// wait, init's reasons when there is no device or no usable library, and
// device memory registered through its dma-buf (ibv_reg_dmabuf_mr), with
// the CPU kept off it, or refused where the library lacks the symbol.
#include <dlfcn.h>
#include <doctest/doctest.h>
#include <fcntl.h>
#include <infiniband/verbs.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>
#include <wia/provider.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "support/recording_host.hpp"

namespace {

constexpr std::uint64_t kEagerMax = 8192 - 48;  // providers/verbs/verbs.hpp

using Host = wia::test::RecordingHost;
Host* g_host = nullptr;  // the one the last Provider was made with, for failure messages

// Sets an environment variable for one scope (the double reads its faults
// at ibv_open_device, i.e. in the provider's init).
struct Env {
  std::string name;
  Env(const char* n, const char* v) : name(n) { setenv(n, v, 1); }
  ~Env() { unsetenv(name.c_str()); }
};

struct Provider {
  void* so = nullptr;
  const wia_provider_v1_t* d = nullptr;
  const wia_transport_ops_v1_t* t = nullptr;
  void* ctx = nullptr;
  wia_status_t init_status = WIA_ERROR_INTERNAL;

  explicit Provider(Host& h, bool use_double = true) {
    g_host = &h;
    if (use_double && h.params.count("library") == 0) h.params["library"] = WIA_FAKE_IBVERBS_FILE;
    so = dlopen(WIA_VERBS_PROVIDER_FILE, RTLD_NOW | RTLD_LOCAL);
    REQUIRE_MESSAGE(so != nullptr, dlerror());
    d = static_cast<const wia_provider_v1_t*>(dlsym(so, WIA_PROVIDER_SYMBOL_V1));
    REQUIRE(d != nullptr);
    t = d->transport;
    init_status = d->init(&h.table, &ctx);
  }
  ~Provider() {
    if (init_status == WIA_SUCCESS) d->fini(ctx);
  }
};

// ibv_reg_mr calls of this process, counted by the double.
std::uint64_t reg_mr_calls() {
  void* lib = dlopen(WIA_FAKE_IBVERBS_FILE, RTLD_NOW | RTLD_NOLOAD);
  REQUIRE_MESSAGE(lib != nullptr, "the double is not loaded");
  void* sym = dlsym(lib, "fake_ibv_reg_mr_calls");
  REQUIRE(sym != nullptr);
  auto fn = reinterpret_cast<std::uint64_t (*)()>(sym);
  const std::uint64_t n = fn();
  dlclose(lib);
  return n;
}

// Connects endpoint 0 to its own listener; returns {connector, acceptor}.
std::pair<wia_conn_t, wia_conn_t> self_pair(Provider& p) {
  std::uint8_t handle[WIA_TRANSPORT_HANDLE_SIZE];
  wia_listener_t l = nullptr;
  REQUIRE(p.t->listen(p.ctx, 0, handle, &l) == WIA_SUCCESS);
  wia_conn_t a = nullptr, b = nullptr;
  std::uint64_t cookie = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  wia_status_t sa = WIA_IN_PROGRESS, sb = WIA_IN_PROGRESS;
  while ((sa != WIA_SUCCESS || sb != WIA_SUCCESS) && std::chrono::steady_clock::now() < deadline) {
    if (sa == WIA_IN_PROGRESS) sa = p.t->connect(p.ctx, 0, handle, 0x55, &a);
    if (sb == WIA_IN_PROGRESS) sb = p.t->accept(p.ctx, l, &cookie, &b);
    REQUIRE_MESSAGE(sa >= 0, g_host->error);
    REQUIRE_MESSAGE(sb >= 0, g_host->error);
  }
  REQUIRE_MESSAGE(sa == WIA_SUCCESS, "connect not done after 10 s");
  REQUIRE_MESSAGE(sb == WIA_SUCCESS, "accept not done after 10 s");
  CHECK(cookie == 0x55);
  CHECK(p.t->close_listener(p.ctx, l) == WIA_SUCCESS);
  return {a, b};
}

// Tests until done or failed; WIA_ERROR_TIMEOUT after `seconds`.
wia_status_t wait(Provider& p, wia_request_t r, std::uint64_t* size = nullptr, int seconds = 10) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
  while (std::chrono::steady_clock::now() < deadline) {
    int32_t done = 0;
    const wia_status_t st = p.t->test(p.ctx, r, &done, size);
    if (st != WIA_SUCCESS || done) return st;
  }
  return WIA_ERROR_TIMEOUT;
}

std::vector<char> pattern(std::size_t n, unsigned seed) {
  std::vector<char> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<char>((i * 131 + seed) ^ (i >> 9));
  return v;
}

// One message a -> b of `size` bytes into a receive of `capacity`; checks
// the reported size and the bytes, and that nothing past them changed.
void roundtrip(Provider& p, wia_conn_t a, wia_conn_t b, std::uint64_t size, std::uint64_t tag,
               wia_mr_t mr = nullptr, const std::vector<char>* src_in = nullptr) {
  const std::vector<char> own =
      src_in ? std::vector<char>() : pattern(size, static_cast<unsigned>(size));
  const std::vector<char>& src = src_in ? *src_in : own;  // the caller's, when it registered it
  std::vector<char> dst(size + 64, 0x5a);
  wia_request_t rr = nullptr, sr = nullptr;
  REQUIRE(p.t->irecv(p.ctx, b, dst.data(), size + 32, tag, nullptr, &rr) == WIA_SUCCESS);
  REQUIRE(p.t->isend(p.ctx, a, src.data(), size, tag, mr, &sr) == WIA_SUCCESS);
  REQUIRE(rr != nullptr);
  REQUIRE(sr != nullptr);
  std::uint64_t got = 0;
  REQUIRE_MESSAGE(wait(p, sr) == WIA_SUCCESS, "send of " << size << " B: " << g_host->error);
  REQUIRE_MESSAGE(wait(p, rr, &got) == WIA_SUCCESS,
                  "receive of " << size << " B: " << g_host->error);
  CHECK(got == size);
  CHECK((size == 0 || std::memcmp(src.data(), dst.data(), size) == 0));
  for (std::size_t i = size; i < dst.size(); ++i)
    if (dst[i] != 0x5a) FAIL("byte " << i << " past a " << size << " B message was written");
}

}  // namespace

TEST_CASE("verbs: one buffer registered twice costs one ibv_reg_mr, and a large send uses it") {
  Host h;
  Provider p(h);
  REQUIRE_MESSAGE(p.init_status == WIA_SUCCESS, h.error);
  auto [a, b] = self_pair(p);
  const std::vector<char> src = pattern(1 << 20, 7);
  wia_mr_desc_v1_t desc{sizeof(desc),
                        WIA_MR_HOST,
                        const_cast<char*>(src.data()),
                        src.size(),
                        WIA_MEM_IFACE_HOST,
                        -1,
                        0,
                        0};
  wia_mr_t m1 = nullptr, m2 = nullptr, m3 = nullptr;
  const std::uint64_t before = reg_mr_calls();
  REQUIRE(p.t->reg_mr(p.ctx, 0, &desc, &m1) == WIA_SUCCESS);
  REQUIRE(p.t->reg_mr(p.ctx, 0, &desc, &m2) == WIA_SUCCESS);
  CHECK(reg_mr_calls() - before == 1);
  desc.size = 4096;  // another range is another registration
  REQUIRE(p.t->reg_mr(p.ctx, 0, &desc, &m3) == WIA_SUCCESS);
  CHECK(reg_mr_calls() - before == 2);

  // A rendezvous from the registered buffer registers only the receive.
  const std::uint64_t mid = reg_mr_calls();
  roundtrip(p, a, b, src.size(), 42, m1, &src);
  CHECK(reg_mr_calls() - mid == 1);
  // Without naming the region, the cache still finds the source's range.
  const std::uint64_t late = reg_mr_calls();
  roundtrip(p, a, b, src.size(), 43, nullptr, &src);
  CHECK(reg_mr_calls() - late == 1);
  // A source nobody registered is registered for the message as well.
  const std::vector<char> other = pattern(1 << 20, 8);
  const std::uint64_t fresh = reg_mr_calls();
  roundtrip(p, a, b, other.size(), 44, nullptr, &other);
  CHECK(reg_mr_calls() - fresh == 2);

  // One dereg of two references keeps the registration alive.
  CHECK(p.t->dereg_mr(p.ctx, m2) == WIA_SUCCESS);
  const std::uint64_t kept = reg_mr_calls();
  REQUIRE(p.t->reg_mr(p.ctx, 0, &desc, &m2) == WIA_SUCCESS);  // the 4096 B range: cached
  CHECK(reg_mr_calls() == kept);
  for (wia_mr_t m : {m1, m2, m3}) CHECK(p.t->dereg_mr(p.ctx, m) == WIA_SUCCESS);
  CHECK(p.t->close(p.ctx, a) == WIA_SUCCESS);
  CHECK(p.t->close(p.ctx, b) == WIA_SUCCESS);
}

TEST_CASE("verbs: messages at the eager boundary and a 64 MiB rendezvous arrive intact") {
  Host h;
  Provider p(h);
  REQUIRE_MESSAGE(p.init_status == WIA_SUCCESS, h.error);
  auto [a, b] = self_pair(p);
  for (std::uint64_t size :
       {std::uint64_t{0}, std::uint64_t{1}, std::uint64_t{100}, std::uint64_t{300}, kEagerMax,
        kEagerMax + 1, std::uint64_t{1} << 20, (std::uint64_t{64} << 20) + 5}) {
    CAPTURE(size);
    roundtrip(p, a, b, size, 9);  // connector -> acceptor
    roundtrip(p, b, a, size, 9);  // and back
  }
  CHECK(p.t->close(p.ctx, a) == WIA_SUCCESS);
  CHECK(p.t->close(p.ctx, b) == WIA_SUCCESS);
}

TEST_CASE("verbs: 2000 messages sent before any receive is posted all arrive, in order") {
  Host h;
  Provider p(h);
  REQUIRE_MESSAGE(p.init_status == WIA_SUCCESS, h.error);
  auto [a, b] = self_pair(p);
  // More than the shared receive queue holds (512) and the QP takes (128):
  // the provider queues sends, the receiver keeps them as unexpected.
  constexpr int kCount = 2000;
  std::vector<std::uint32_t> out(kCount), in(kCount, 0xffffffffu);
  std::vector<wia_request_t> sends(kCount), recvs(kCount);
  // Message i starts with out[i]; two in three are longer (1004, 2004 B).
  std::vector<char> src(kCount * 4 + 2004);
  for (int i = 0; i < kCount; ++i) {
    out[i] = static_cast<std::uint32_t>(i * 2654435761u);
    std::memcpy(src.data() + 4 * i, &out[i], 4);
  }
  for (int i = 0; i < kCount; ++i)
    REQUIRE(p.t->isend(p.ctx, a, src.data() + 4 * i, 4 + (i % 3) * 1000, 77, nullptr, &sends[i]) ==
            WIA_SUCCESS);
  for (int i = 0; i < kCount; ++i) REQUIRE_MESSAGE(wait(p, sends[i]) == WIA_SUCCESS, h.error);
  for (int i = 0; i < kCount; ++i)
    REQUIRE(p.t->irecv(p.ctx, b, &in[i], 4, 77, nullptr, &recvs[i]) == WIA_SUCCESS);
  int wrong = 0;
  for (int i = 0; i < kCount; ++i) {
    std::uint64_t got = 0;
    const wia_status_t st = wait(p, recvs[i], &got);
    if (i % 3 == 0) {
      REQUIRE_MESSAGE(st == WIA_SUCCESS, h.error);
      wrong += in[i] != out[i];
    } else {  // 1004 and 2004 B into 4 B: truncated, and the order holds after it
      CHECK(st == WIA_ERROR_REMOTE);
    }
  }
  CHECK(wrong == 0);
  CHECK(p.t->close(p.ctx, a) == WIA_SUCCESS);
  CHECK(p.t->close(p.ctx, b) == WIA_SUCCESS);
}

TEST_CASE("verbs: put and get move data; out of the region is refused; a stale rkey is REMOTE") {
  Host h;
  Provider p(h);
  REQUIRE_MESSAGE(p.init_status == WIA_SUCCESS, h.error);
  REQUIRE((p.t->caps & WIA_TRANSPORT_CAP_RMA) != 0);
  auto [a, b] = self_pair(p);
  constexpr std::size_t kSize = 256 << 10;
  std::vector<char> target(kSize, 0), src = pattern(kSize, 3), back(kSize, 0);
  wia_mr_desc_v1_t desc{
      sizeof(desc), WIA_MR_HOST, target.data(), target.size(), WIA_MEM_IFACE_HOST, -1, 0, 0};
  wia_mr_t tm = nullptr;
  REQUIRE(p.t->reg_mr(p.ctx, 0, &desc, &tm) == WIA_SUCCESS);
  std::uint8_t rkey[WIA_RKEY_SIZE];
  REQUIRE(p.t->mr_rkey(p.ctx, tm, rkey) == WIA_SUCCESS);
  const auto base = reinterpret_cast<std::uint64_t>(target.data());
  wia_request_t r = nullptr;
  // Half of it at an offset, then the whole region read back.
  REQUIRE(p.t->put(p.ctx, a, src.data(), kSize / 2, nullptr, base + 100, rkey, &r) == WIA_SUCCESS);
  REQUIRE_MESSAGE(wait(p, r) == WIA_SUCCESS, h.error);
  CHECK(std::memcmp(target.data() + 100, src.data(), kSize / 2) == 0);
  CHECK(target[99] == 0);
  REQUIRE(p.t->get(p.ctx, a, back.data(), kSize, nullptr, base, rkey, &r) == WIA_SUCCESS);
  REQUIRE_MESSAGE(wait(p, r) == WIA_SUCCESS, h.error);
  CHECK(std::memcmp(back.data(), target.data(), kSize) == 0);
  // Past the end of the region: refused before anything is posted.
  CHECK(p.t->put(p.ctx, a, src.data(), 200, nullptr, base + kSize - 100, rkey, &r) ==
        WIA_ERROR_INVALID_ARGUMENT);
  CHECK_MESSAGE(h.error.find("outside the remote region") != std::string::npos, h.error);
  // The target deregistered the region: the NIC refuses the write.
  REQUIRE(p.t->dereg_mr(p.ctx, tm) == WIA_SUCCESS);
  REQUIRE(p.t->put(p.ctx, a, src.data(), 64, nullptr, base, rkey, &r) == WIA_SUCCESS);
  CHECK(wait(p, r) == WIA_ERROR_REMOTE);
  CHECK_MESSAGE(h.error.find("IBV_WC_REM_ACCESS_ERR") != std::string::npos, h.error);
  CHECK_MESSAGE(h.error.find("RDMA write") != std::string::npos, h.error);
  CHECK(p.t->close(p.ctx, a) == WIA_SUCCESS);
  CHECK(p.t->close(p.ctx, b) == WIA_SUCCESS);
}

TEST_CASE("verbs: a message over the port's max_msg_sz is refused with the sizes named") {
  Host h;
  Provider p(h);
  REQUIRE_MESSAGE(p.init_status == WIA_SUCCESS, h.error);
  auto [a, b] = self_pair(p);
  char byte = 0;
  wia_request_t r = nullptr;
  // The buffer is never read: the size is refused first.
  CHECK(p.t->isend(p.ctx, a, &byte, (std::uint64_t{1} << 30) + 1, 1, nullptr, &r) ==
        WIA_ERROR_INVALID_ARGUMENT);
  CHECK(h.error.find("1 GiB") != std::string::npos);
  CHECK(h.error.find("fake0") != std::string::npos);
  CHECK(p.t->close(p.ctx, a) == WIA_SUCCESS);
  CHECK(p.t->close(p.ctx, b) == WIA_SUCCESS);
}

namespace {

// Under an injected fault: the side whose QP fails and the side waiting on
// it both end with WIA_ERROR_REMOTE within 10 s, the first naming the
// completion status and both naming their peer; later posts fail at once.
void expect_fault(const char* var, const char* value, std::uint64_t size, int sends,
                  const char* status_text, const char* status_name) {
  Env env(var, value);
  Host h;
  Provider p(h);
  REQUIRE_MESSAGE(p.init_status == WIA_SUCCESS, h.error);
  auto [a, b] = self_pair(p);
  std::vector<char> buf(size + 1, 1);
  std::vector<std::vector<char>> dst(sends + 1, std::vector<char>(size + 1));
  // The acceptor waits for one more message than will ever come.
  std::vector<wia_request_t> recvs, sendreqs;
  for (int i = 0; i <= sends; ++i) {
    wia_request_t r = nullptr;
    REQUIRE(p.t->irecv(p.ctx, b, dst[i].data(), size + 1, 5, nullptr, &r) == WIA_SUCCESS);
    recvs.push_back(r);
  }
  for (int i = 0; i < sends; ++i) {
    wia_request_t r = nullptr;
    REQUIRE(p.t->isend(p.ctx, a, buf.data(), size, 5, nullptr, &r) == WIA_SUCCESS);
    sendreqs.push_back(r);
  }
  wia_status_t last = WIA_SUCCESS;
  for (wia_request_t r : sendreqs) {
    const wia_status_t st = wait(p, r);
    REQUIRE_MESSAGE(st != WIA_ERROR_TIMEOUT, "a send neither completed nor failed in 10 s");
    if (st != WIA_SUCCESS) {
      last = st;
      if (h.error.find(status_name) != std::string::npos) break;
    }
  }
  CHECK(last == WIA_ERROR_REMOTE);
  const std::string sender_error = h.error;
  CHECK_MESSAGE(sender_error.find(status_text) != std::string::npos, sender_error);
  CHECK_MESSAGE(sender_error.find(status_name) != std::string::npos, sender_error);
  CHECK_MESSAGE(sender_error.find("peer host ") != std::string::npos, sender_error);
  CHECK_MESSAGE(sender_error.find("pid " + std::to_string(getpid())) != std::string::npos,
                sender_error);
  // The last receive can never be satisfied: the failure reaches it.
  const wia_status_t st = wait(p, recvs.back());
  CHECK_MESSAGE(st == WIA_ERROR_REMOTE, "the waiting receive ended with " << st << ": " << h.error);
  CHECK_MESSAGE(h.error.find("connection to peer") != std::string::npos, h.error);
  wia_request_t r = nullptr;
  CHECK(p.t->isend(p.ctx, a, buf.data(), 1, 6, nullptr, &r) == WIA_ERROR_REMOTE);
  CHECK(p.t->close(p.ctx, a) == WIA_SUCCESS);
  CHECK(p.t->close(p.ctx, b) == WIA_SUCCESS);
}

}  // namespace

TEST_CASE("verbs: a retry-exceeded send (cut link) is WIA_ERROR_REMOTE on both sides") {
  expect_fault("FAKE_IBV_RETRY_EXC_AFTER", "3", 100, 6, "transport retry counter exceeded",
               "IBV_WC_RETRY_EXC_ERR");
}

TEST_CASE("verbs: a QP moved to the error state is WIA_ERROR_REMOTE on both sides") {
  expect_fault("FAKE_IBV_QP_ERROR_AFTER", "2", 1000, 5, "Work Request Flushed Error",
               "IBV_WC_WR_FLUSH_ERR");
}

TEST_CASE("verbs: a remote access error on the rendezvous write is WIA_ERROR_REMOTE") {
  expect_fault("FAKE_IBV_REMOTE_ACCESS_ERROR", "1", 1 << 20, 1, "remote access error",
               "IBV_WC_REM_ACCESS_ERR");
}

TEST_CASE("verbs: a registration the NIC refuses fails reg_mr and a large message on both sides") {
  // The provider's own slots (4 and 8 MiB) fit; a 16 MiB user buffer does not.
  Env env("FAKE_IBV_REG_MR_LIMIT", "8388608");
  Host h;
  Provider p(h);
  REQUIRE_MESSAGE(p.init_status == WIA_SUCCESS, h.error);
  auto [a, b] = self_pair(p);
  std::vector<char> big(16 << 20, 1), dst(16 << 20, 0);
  wia_mr_desc_v1_t desc{sizeof(desc),       WIA_MR_HOST, big.data(), big.size(),
                        WIA_MEM_IFACE_HOST, -1,          0,          0};
  wia_mr_t m = nullptr;
  CHECK(p.t->reg_mr(p.ctx, 0, &desc, &m) == WIA_ERROR_IO);
  CHECK_MESSAGE(h.error.find("ibv_reg_mr") != std::string::npos, h.error);
  CHECK_MESSAGE(h.error.find("16 MiB") != std::string::npos, h.error);
  CHECK_MESSAGE(h.error.find("Cannot allocate memory") != std::string::npos, h.error);
  // A rendezvous needs the receive registered: it fails there naming the
  // cause; the receiver drops the message, so the send ends; nothing hangs.
  wia_request_t rr = nullptr, sr = nullptr;
  REQUIRE(p.t->irecv(p.ctx, b, dst.data(), dst.size(), 3, nullptr, &rr) == WIA_SUCCESS);
  REQUIRE(p.t->isend(p.ctx, a, big.data(), big.size(), 3, nullptr, &sr) == WIA_SUCCESS);
  const wia_status_t rs = wait(p, rr);
  CHECK_MESSAGE(rs == WIA_ERROR_IO, "the receive ended with " << rs << ": " << h.error);
  CHECK_MESSAGE(h.error.find("ibv_reg_mr") != std::string::npos, h.error);
  const wia_status_t ss = wait(p, sr);
  CHECK_MESSAGE(ss != WIA_ERROR_TIMEOUT, "the send neither completed nor failed in 10 s");
  // Small messages still flow on the connection.
  roundtrip(p, a, b, 100, 4);
  CHECK(p.t->close(p.ctx, a) == WIA_SUCCESS);
  CHECK(p.t->close(p.ctx, b) == WIA_SUCCESS);
}

TEST_CASE("verbs: a killed peer fails the survivor's receive with WIA_ERROR_REMOTE naming it") {
  int to_child[2], to_parent[2];
  REQUIRE(pipe(to_child) == 0);
  REQUIRE(pipe(to_parent) == 0);
  // Fork before any provider exists in this process (the double has a thread).
  const pid_t child = fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    Host h;
    h.params["library"] = WIA_FAKE_IBVERBS_FILE;
    g_host = &h;
    void* so = dlopen(WIA_VERBS_PROVIDER_FILE, RTLD_NOW | RTLD_LOCAL);
    auto* d =
        so ? static_cast<const wia_provider_v1_t*>(dlsym(so, WIA_PROVIDER_SYMBOL_V1)) : nullptr;
    void* ctx = nullptr;
    if (d == nullptr || d->init(&h.table, &ctx) != WIA_SUCCESS) _exit(2);
    std::uint8_t handle[WIA_TRANSPORT_HANDLE_SIZE];
    if (read(to_child[0], handle, sizeof handle) != sizeof handle) _exit(3);
    wia_conn_t c = nullptr;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    wia_status_t st = WIA_IN_PROGRESS;
    while (st == WIA_IN_PROGRESS && std::chrono::steady_clock::now() < deadline)
      st = d->transport->connect(ctx, 0, handle, 0x77, &c);
    if (st != WIA_SUCCESS) _exit(4);
    const char ok = 1;
    if (write(to_parent[1], &ok, 1) != 1) _exit(5);
    // Keep the connection busy until the parent kills this process.
    for (;;) {
      char buf[16];
      wia_request_t r = nullptr;
      if (d->transport->irecv(ctx, c, buf, sizeof buf, 1, nullptr, &r) != WIA_SUCCESS) _exit(6);
      int32_t done = 0;
      while (!done)
        if (d->transport->test(ctx, r, &done, nullptr) != WIA_SUCCESS) _exit(7);
    }
  }
  Host h;
  Provider p(h);
  REQUIRE_MESSAGE(p.init_status == WIA_SUCCESS, h.error);
  std::uint8_t handle[WIA_TRANSPORT_HANDLE_SIZE];
  wia_listener_t l = nullptr;
  REQUIRE(p.t->listen(p.ctx, 0, handle, &l) == WIA_SUCCESS);
  REQUIRE(write(to_child[1], handle, sizeof handle) == sizeof handle);
  wia_conn_t conn = nullptr;
  std::uint64_t cookie = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (conn == nullptr && std::chrono::steady_clock::now() < deadline)
    REQUIRE(p.t->accept(p.ctx, l, &cookie, &conn) >= 0);
  REQUIRE_MESSAGE(conn != nullptr, "the child's connection was not accepted in 10 s");
  CHECK(cookie == 0x77);
  char ok = 0;
  REQUIRE(read(to_parent[0], &ok, 1) == 1);
  char buf[16];
  wia_request_t r = nullptr;
  REQUIRE(p.t->irecv(p.ctx, conn, buf, sizeof buf, 2, nullptr, &r) == WIA_SUCCESS);
  kill(child, SIGKILL);
  int status = 0;
  waitpid(child, &status, 0);
  CHECK(WIFSIGNALED(status));
  const wia_status_t st = wait(p, r, nullptr, 10);
  CHECK_MESSAGE(st == WIA_ERROR_REMOTE, "the receive ended with " << st << ": " << h.error);
  CHECK_MESSAGE(h.error.find("pid " + std::to_string(child)) != std::string::npos, h.error);
  wia_request_t s = nullptr;
  CHECK(p.t->isend(p.ctx, conn, buf, 1, 2, nullptr, &s) == WIA_ERROR_REMOTE);
  CHECK(p.t->close(p.ctx, conn) == WIA_SUCCESS);
  CHECK(p.t->close_listener(p.ctx, l) == WIA_SUCCESS);
  for (int fd : {to_child[0], to_child[1], to_parent[0], to_parent[1]}) close(fd);
}

TEST_CASE("verbs: ifname picks the handshake interface the handle carries") {
  Host h;
  h.params["ifname"] = "lo";
  Provider p(h);
  REQUIRE_MESSAGE(p.init_status == WIA_SUCCESS, h.error);
  std::uint8_t handle[WIA_TRANSPORT_HANDLE_SIZE];
  wia_listener_t l = nullptr;
  REQUIRE(p.t->listen(p.ctx, 0, handle, &l) == WIA_SUCCESS);
  const std::uint8_t loopback[4] = {127, 0, 0, 1};  // bytes 8-11, network order
  CHECK(std::memcmp(handle + 8, loopback, 4) == 0);
  CHECK(p.t->close_listener(p.ctx, l) == WIA_SUCCESS);
  auto [a, b] = self_pair(p);
  roundtrip(p, a, b, 64, 1);
  CHECK(p.t->close(p.ctx, a) == WIA_SUCCESS);
  CHECK(p.t->close(p.ctx, b) == WIA_SUCCESS);
}

TEST_CASE("verbs: init without a device, with an unknown device or a foreign library says why") {
  {
    Env env("FAKE_IBV_DEVICES", "0");
    Host h;
    Provider p(h);
    CHECK(p.init_status == WIA_ERROR_UNAVAILABLE);
    CHECK_MESSAGE(h.error.find("no RDMA device") != std::string::npos, h.error);
  }
  {
    Host h;
    h.params["device"] = "mlx5_9";
    Provider p(h);
    CHECK(p.init_status == WIA_ERROR_UNAVAILABLE);
    CHECK_MESSAGE(
        h.error.find("no RDMA device named 'mlx5_9' (devices: fake0)") != std::string::npos,
        h.error);
  }
  {
    Host h;
    h.params["library"] = "libc.so.6";  // loads, but is not libibverbs
    Provider p(h);
    CHECK(p.init_status == WIA_ERROR_UNAVAILABLE);
    CHECK_MESSAGE(h.error.find("has no ibv_get_device_list@IBVERBS_1.1") != std::string::npos,
                  h.error);
  }
  {
    Host h;
    h.params["library"] = "/nonexistent/libibverbs.so.1";
    Provider p(h);
    CHECK(p.init_status == WIA_ERROR_UNAVAILABLE);
    CHECK_MESSAGE(h.error.find("/nonexistent/libibverbs.so.1") != std::string::npos, h.error);
  }
  {
    Host h;
    h.params["port"] = "seven";
    Provider p(h);
    CHECK(p.init_status == WIA_ERROR_CONFIG);
    CHECK_MESSAGE(h.error.find("port 'seven'") != std::string::npos, h.error);
  }
}

namespace {

// Device memory as a transport sees it: a dma-buf fd (a memfd, which is how
// tests/providers/fake-cuda exports its device memory) and a device pointer
// the CPU cannot use: `dev` maps the memfd PROT_NONE, so a provider that
// reads or writes device memory with the CPU crashes the test. The double
// reaches the bytes through the fd, as a NIC does through the dma-buf; the
// test fills and checks them through `view`.
struct DeviceBuffer {
  int fd = -1;
  char* dev = nullptr;
  char* view = nullptr;
  std::size_t len = 0;
  explicit DeviceBuffer(std::size_t n) : len(n) {
    fd = memfd_create("wia-test-dmabuf", MFD_CLOEXEC);
    REQUIRE(fd >= 0);
    REQUIRE(ftruncate(fd, static_cast<off_t>(n)) == 0);
    void* d = mmap(nullptr, n, PROT_NONE, MAP_SHARED, fd, 0);
    void* v = mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    REQUIRE(d != MAP_FAILED);
    REQUIRE(v != MAP_FAILED);
    dev = static_cast<char*>(d);
    view = static_cast<char*>(v);
    std::memset(view, 0x5a, n);
  }
  ~DeviceBuffer() {
    munmap(dev, len);
    munmap(view, len);
    close(fd);
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  // Registers [dev + offset, + size) as CUDA memory through a duplicate of
  // the fd, closed right after: the fd is only borrowed by reg_mr.
  wia_status_t reg(Provider& p, std::size_t offset, std::size_t size, wia_mr_t* mr) const {
    const int dup_fd = fcntl(fd, F_DUPFD_CLOEXEC, 0);
    REQUIRE(dup_fd >= 0);
    wia_mr_desc_v1_t desc{
        sizeof(desc), WIA_MR_DEVICE, dev + offset, size, WIA_MEM_IFACE_CUDA, dup_fd, 0, offset};
    const wia_status_t st = p.t->reg_mr(p.ctx, 0, &desc, mr);
    close(dup_fd);
    return st;
  }
};

// ibv_reg_dmabuf_mr calls of this process, counted by the double.
std::uint64_t reg_dmabuf_mr_calls() {
  void* lib = dlopen(WIA_FAKE_IBVERBS_FILE, RTLD_NOW | RTLD_NOLOAD);
  REQUIRE_MESSAGE(lib != nullptr, "the double is not loaded");
  void* sym = dlsym(lib, "fake_ibv_reg_dmabuf_mr_calls");
  REQUIRE(sym != nullptr);
  const std::uint64_t n = reinterpret_cast<std::uint64_t (*)()>(sym)();
  dlclose(lib);
  return n;
}

// One message a -> b; either side may be device memory (dev != nullptr:
// its registration). Checks the bytes and that nothing around them moved.
void device_message(Provider& p, wia_conn_t a, wia_conn_t b, std::uint64_t size, std::uint64_t tag,
                    DeviceBuffer* sdev, wia_mr_t smr, DeviceBuffer* rdev, wia_mr_t rmr,
                    std::size_t offset, bool send_first = false) {
  INFO("message of " << size << " B, from " << (sdev ? "device" : "host") << " to "
                     << (rdev ? "device" : "host") << " memory"
                     << (send_first ? ", sent before the receive was posted" : ""));
  const std::vector<char> src = pattern(size, static_cast<unsigned>(size + tag));
  std::vector<char> host_src = src, host_dst(size + 64, 0x5a);
  const char* sbuf = host_src.data();
  char* rbuf = host_dst.data();
  if (sdev != nullptr) {
    if (size > 0) std::memcpy(sdev->view + offset, src.data(), size);
    sbuf = sdev->dev + offset;
  }
  if (rdev != nullptr) {
    std::memset(rdev->view, 0x5a, rdev->len);
    rbuf = rdev->dev + offset;
  }
  wia_request_t rr = nullptr, sr = nullptr;
  bool send_done = false;
  if (send_first) {  // the RTS or the eager message waits as an unexpected message
    REQUIRE_MESSAGE(p.t->isend(p.ctx, a, sbuf, size, tag, smr, &sr) == WIA_SUCCESS, g_host->error);
    if (sdev != nullptr || size > kEagerMax) {
      int32_t done = 0;
      for (int i = 0; i < 100; ++i) REQUIRE(p.t->test(p.ctx, sr, &done, nullptr) == WIA_SUCCESS);
      REQUIRE(done == 0);  // a rendezvous send cannot end before its receive
    } else {               // an eager send ends once the receiving side has the message
      REQUIRE_MESSAGE(wait(p, sr) == WIA_SUCCESS, "send: " << g_host->error);
      send_done = true;
    }
  }
  REQUIRE_MESSAGE(p.t->irecv(p.ctx, b, rbuf, size, tag, rmr, &rr) == WIA_SUCCESS, g_host->error);
  if (!send_first)
    REQUIRE_MESSAGE(p.t->isend(p.ctx, a, sbuf, size, tag, smr, &sr) == WIA_SUCCESS, g_host->error);
  std::uint64_t got = 0;
  if (!send_done) REQUIRE_MESSAGE(wait(p, sr) == WIA_SUCCESS, "send: " << g_host->error);
  REQUIRE_MESSAGE(wait(p, rr, &got) == WIA_SUCCESS, "receive: " << g_host->error);
  CHECK(got == size);
  const char* landed = rdev != nullptr ? rdev->view + offset : host_dst.data();
  CHECK((size == 0 || std::memcmp(landed, src.data(), size) == 0));
  if (rdev != nullptr) {  // the dma-buf offset was honoured: nothing before or after moved
    for (std::size_t i = 0; i < rdev->len; ++i)
      if ((i < offset || i >= offset + size) && rdev->view[i] != 0x5a)
        FAIL("device byte " << i << " outside the " << size << " B message at offset " << offset
                            << " was written");
  }
}

// WRs of `opcode` this process posted on QPs connected to themselves (the
// provider's loopback QP), counted by the double.
std::uint64_t self_qp_wrs(ibv_wr_opcode opcode) {
  void* lib = dlopen(WIA_FAKE_IBVERBS_FILE, RTLD_NOW | RTLD_NOLOAD);
  REQUIRE_MESSAGE(lib != nullptr, "the double is not loaded");
  void* sym = dlsym(lib, "fake_ibv_self_qp_wrs");
  REQUIRE(sym != nullptr);
  const std::uint64_t n = reinterpret_cast<std::uint64_t (*)(int)>(sym)(opcode);
  dlclose(lib);
  return n;
}

// The endpoint claims host memory only: no device-memory or dma-buf flag.
void check_claims_host_memory_only(Provider& p) {
  wia_transport_props_v1_t props{};
  props.struct_size = sizeof props;
  REQUIRE(p.t->endpoint_props(p.ctx, 0, &props) == WIA_SUCCESS);
  CHECK((props.flags & (WIA_TRANSPORT_FLAG_DEVICE_MEMORY | WIA_TRANSPORT_FLAG_DMABUF)) == 0);
  CHECK(props.mem_ifaces == (1u << WIA_MEM_IFACE_HOST));
}

}  // namespace

TEST_CASE("verbs: device memory registered by its dma-buf moves data; the CPU never touches it") {
  {  // verbs.dmabuf: false turns the claim off (device buffers are staged).
    Host h0;
    h0.params["dmabuf"] = "false";
    Provider p0(h0);
    REQUIRE_MESSAGE(p0.init_status == WIA_SUCCESS, h0.error);
    check_claims_host_memory_only(p0);
  }
  Host h;
  h.params["dmabuf"] = "true";
  Provider p(h);
  REQUIRE_MESSAGE(p.init_status == WIA_SUCCESS, h.error);
  wia_transport_props_v1_t props{};
  props.struct_size = sizeof props;
  REQUIRE(p.t->endpoint_props(p.ctx, 0, &props) == WIA_SUCCESS);
  CHECK((props.flags & WIA_TRANSPORT_FLAG_DEVICE_MEMORY) != 0);
  CHECK((props.flags & WIA_TRANSPORT_FLAG_DMABUF) != 0);
  CHECK((props.mem_ifaces & (1u << WIA_MEM_IFACE_CUDA)) != 0);
  auto [a, b] = self_pair(p);

  // The regions start one page into their dma-bufs (dmabuf_offset 4096).
  constexpr std::size_t kOffset = 4096, kLen = 64 << 10, kRegion = kLen - 2 * kOffset;
  DeviceBuffer sdev(kLen), rdev(kLen);
  wia_mr_t smr = nullptr, rmr = nullptr;
  const std::uint64_t dmabuf_before = reg_dmabuf_mr_calls();
  REQUIRE_MESSAGE(sdev.reg(p, kOffset, kRegion, &smr) == WIA_SUCCESS, h.error);
  REQUIRE_MESSAGE(rdev.reg(p, kOffset, kRegion, &rmr) == WIA_SUCCESS, h.error);
  CHECK(reg_dmabuf_mr_calls() - dmabuf_before == 2);

  // Device to device, below and above the eager limit: every message goes
  // by RDMA write, and nothing registers the device pointers as host memory.
  const std::uint64_t host_regs = reg_mr_calls();
  std::uint64_t tag = 1;
  for (std::uint64_t size :
       {std::uint64_t{1}, std::uint64_t{100}, kEagerMax, kEagerMax + 1, std::uint64_t{kRegion}})
    device_message(p, a, b, size, tag++, &sdev, smr, &rdev, rmr, kOffset);
  CHECK(reg_mr_calls() == host_regs);
  // Zero bytes touch nothing: allowed either way.
  device_message(p, a, b, 0, tag++, &sdev, smr, &rdev, rmr, kOffset);
  // Device to host (small: rendezvous all the same) and host to device (large).
  device_message(p, a, b, 100, tag++, &sdev, smr, nullptr, nullptr, kOffset);
  device_message(p, a, b, kEagerMax + 1, tag++, nullptr, nullptr, &rdev, rmr, kOffset);
  // The same with the message waiting as unexpected when the receive comes.
  device_message(p, a, b, 100, tag++, &sdev, smr, &rdev, rmr, kOffset, true);
  device_message(p, a, b, kEagerMax + 1, tag++, nullptr, nullptr, &rdev, rmr, kOffset, true);

  // A small message from host memory arrives eagerly, in an SRQ slot: the
  // NIC writes it into the device receive from there (an RDMA write on the
  // provider's loopback QP, a QP connected to itself), then reads one byte
  // back (the flush) before the receive completes. The CPU never touches the
  // device buffer (PROT_NONE). At the region's start and at an odd offset
  // inside it; with the receive posted first (written from the SRQ slot)
  // and after the message waited as unexpected (from a send slot).
  const std::uint64_t writes0 = self_qp_wrs(IBV_WR_RDMA_WRITE);
  const std::uint64_t reads0 = self_qp_wrs(IBV_WR_RDMA_READ);
  std::uint64_t eager_into_device = 0;
  for (std::size_t offset : {kOffset, kOffset + 4093})
    for (bool send_first : {false, true})
      for (std::uint64_t size : {std::uint64_t{1}, std::uint64_t{100}, kEagerMax}) {
        device_message(p, a, b, size, tag++, nullptr, nullptr, &rdev, rmr, offset, send_first);
        ++eager_into_device;
      }
  CHECK(self_qp_wrs(IBV_WR_RDMA_WRITE) - writes0 == eager_into_device);
  CHECK(self_qp_wrs(IBV_WR_RDMA_READ) - reads0 == eager_into_device);
  // A rendezvous into device memory is flushed too (one read, no write);
  // zero bytes and host receives need neither.
  {
    const std::uint64_t w = self_qp_wrs(IBV_WR_RDMA_WRITE), r = self_qp_wrs(IBV_WR_RDMA_READ);
    device_message(p, a, b, kEagerMax + 1, tag++, nullptr, nullptr, &rdev, rmr, kOffset);
    device_message(p, a, b, 0, tag++, nullptr, nullptr, &rdev, rmr, kOffset);
    device_message(p, a, b, 100, tag++, &sdev, smr, nullptr, nullptr, kOffset);
    CHECK(self_qp_wrs(IBV_WR_RDMA_WRITE) == w);
    CHECK(self_qp_wrs(IBV_WR_RDMA_READ) - r == 1);
  }
  // An eager message larger than its device receive fails it, nothing written.
  {
    std::memset(rdev.view, 0x5a, rdev.len);
    std::vector<char> small = pattern(100, 9);
    wia_request_t rr = nullptr, sr = nullptr;
    REQUIRE(p.t->irecv(p.ctx, b, rdev.dev + kOffset, 50, 77, rmr, &rr) == WIA_SUCCESS);
    REQUIRE(p.t->isend(p.ctx, a, small.data(), 100, 77, nullptr, &sr) == WIA_SUCCESS);
    CHECK(wait(p, sr) == WIA_SUCCESS);
    CHECK(wait(p, rr) == WIA_ERROR_REMOTE);
    CHECK_MESSAGE(h.error.find("does not fit the 50 B receive") != std::string::npos, h.error);
    for (std::size_t i = 0; i < rdev.len; ++i)
      if (rdev.view[i] != 0x5a) FAIL("device byte " << i << " written by a refused message");
  }
  // More eager messages than the SRQ has slots (512) and the loopback QP
  // send WRs (128), all into device receives posted first: slots wait in
  // the loopback's queue, the SRQ drains and refills, every one lands.
  {
    constexpr int kMany = 600;
    constexpr std::size_t kEach = 64;
    std::memset(rdev.view, 0x5a, rdev.len);
    std::vector<wia_request_t> rr(kMany), sr(kMany);
    std::vector<std::vector<char>> src(kMany);
    for (int i = 0; i < kMany; ++i)
      REQUIRE(p.t->irecv(p.ctx, b, rdev.dev + kOffset + i * kEach, kEach, 1000 + i, rmr, &rr[i]) ==
              WIA_SUCCESS);
    for (int i = 0; i < kMany; ++i) {
      src[i] = pattern(kEach, 3 * i + 1);
      REQUIRE(p.t->isend(p.ctx, a, src[i].data(), kEach, 1000 + i, nullptr, &sr[i]) == WIA_SUCCESS);
    }
    for (int i = 0; i < kMany; ++i) REQUIRE_MESSAGE(wait(p, sr[i]) == WIA_SUCCESS, h.error);
    for (int i = 0; i < kMany; ++i) {
      std::uint64_t got = 0;
      REQUIRE_MESSAGE(wait(p, rr[i], &got) == WIA_SUCCESS, "receive " << i << ": " << h.error);
      CHECK(got == kEach);
      CHECK(std::memcmp(rdev.view + kOffset + i * kEach, src[i].data(), kEach) == 0);
    }
    for (std::size_t i = kOffset + kMany * kEach; i < rdev.len; ++i)
      if (rdev.view[i] != 0x5a) FAIL("device byte " << i << " past the messages was written");
  }

  // put into the peer's device region and get back into local device memory.
  {
    std::uint8_t rkey[WIA_RKEY_SIZE];
    REQUIRE(p.t->mr_rkey(p.ctx, rmr, rkey) == WIA_SUCCESS);
    const std::vector<char> src = pattern(kRegion / 2, 5);
    const auto remote = reinterpret_cast<std::uint64_t>(rdev.dev + kOffset);
    wia_request_t r = nullptr;
    REQUIRE(p.t->put(p.ctx, a, src.data(), src.size(), nullptr, remote + 8, rkey, &r) ==
            WIA_SUCCESS);
    REQUIRE_MESSAGE(wait(p, r) == WIA_SUCCESS, h.error);
    CHECK(std::memcmp(rdev.view + kOffset + 8, src.data(), src.size()) == 0);
    std::memset(sdev.view, 0, sdev.len);
    REQUIRE(p.t->get(p.ctx, a, sdev.dev + kOffset, src.size(), smr, remote + 8, rkey, &r) ==
            WIA_SUCCESS);
    REQUIRE_MESSAGE(wait(p, r) == WIA_SUCCESS, h.error);
    CHECK(std::memcmp(sdev.view + kOffset, src.data(), src.size()) == 0);
  }

  // Misuse, each refused with the reason: a region the buffer is not in;
  // device memory without its dma-buf; a range past the dma-buf's end.
  {
    wia_request_t r = nullptr;
    CHECK(p.t->isend(p.ctx, a, sdev.dev, 64, 1, smr, &r) == WIA_ERROR_INVALID_ARGUMENT);
    CHECK_MESSAGE(h.error.find("does not cover it") != std::string::npos, h.error);
    wia_mr_desc_v1_t desc{
        sizeof(desc), WIA_MR_DEVICE, sdev.dev, 4096, WIA_MEM_IFACE_CUDA, -1, 0, 0};
    wia_mr_t m = nullptr;
    CHECK(p.t->reg_mr(p.ctx, 0, &desc, &m) == WIA_ERROR_NOT_SUPPORTED);
    CHECK_MESSAGE(h.error.find("without its dma-buf") != std::string::npos, h.error);
    CHECK(sdev.reg(p, kLen - 4096, 8192, &m) == WIA_ERROR_IO);
    CHECK_MESSAGE(h.error.find("ibv_reg_dmabuf_mr(fd") != std::string::npos, h.error);
    CHECK_MESSAGE(h.error.find("Invalid argument") != std::string::npos, h.error);
  }
  CHECK(p.t->dereg_mr(p.ctx, smr) == WIA_SUCCESS);
  CHECK(p.t->dereg_mr(p.ctx, rmr) == WIA_SUCCESS);
  CHECK(p.t->close(p.ctx, a) == WIA_SUCCESS);
  CHECK(p.t->close(p.ctx, b) == WIA_SUCCESS);
}

TEST_CASE("verbs: verbs.gdr_flush: false lands device receives without the read-back") {
  // Where the platform orders the NIC's writes into GPU memory itself (as
  // NCCL_GDR_FLUSH_DISABLE): eager messages are still written in by the
  // loopback QP and complete on that write, rendezvous ones on their
  // write's immediate; no 1-byte RDMA read is posted. The data is the same.
  Host h;
  h.params["dmabuf"] = "true";
  h.params["gdr_flush"] = "false";
  Provider p(h);
  REQUIRE_MESSAGE(p.init_status == WIA_SUCCESS, h.error);
  auto [a, b] = self_pair(p);
  constexpr std::size_t kOffset = 4096, kLen = 64 << 10, kRegion = kLen - 2 * kOffset;
  DeviceBuffer sdev(kLen), rdev(kLen);
  wia_mr_t smr = nullptr, rmr = nullptr;
  REQUIRE_MESSAGE(sdev.reg(p, kOffset, kRegion, &smr) == WIA_SUCCESS, h.error);
  REQUIRE_MESSAGE(rdev.reg(p, kOffset, kRegion, &rmr) == WIA_SUCCESS, h.error);
  const std::uint64_t writes0 = self_qp_wrs(IBV_WR_RDMA_WRITE);
  const std::uint64_t reads0 = self_qp_wrs(IBV_WR_RDMA_READ);
  std::uint64_t tag = 1, eager = 0;
  for (bool send_first : {false, true})
    for (std::uint64_t size : {std::uint64_t{1}, std::uint64_t{100}, kEagerMax}) {
      device_message(p, a, b, size, tag++, nullptr, nullptr, &rdev, rmr, kOffset + 3, send_first);
      ++eager;
    }
  CHECK(self_qp_wrs(IBV_WR_RDMA_WRITE) - writes0 == eager);
  // Rendezvous into device memory, from host and from device memory.
  device_message(p, a, b, kEagerMax + 1, tag++, nullptr, nullptr, &rdev, rmr, kOffset);
  device_message(p, a, b, kRegion, tag++, &sdev, smr, &rdev, rmr, kOffset);
  CHECK(self_qp_wrs(IBV_WR_RDMA_WRITE) - writes0 == eager);
  CHECK(self_qp_wrs(IBV_WR_RDMA_READ) == reads0);
  CHECK(p.t->dereg_mr(p.ctx, smr) == WIA_SUCCESS);
  CHECK(p.t->dereg_mr(p.ctx, rmr) == WIA_SUCCESS);
  CHECK(p.t->close(p.ctx, a) == WIA_SUCCESS);
  CHECK(p.t->close(p.ctx, b) == WIA_SUCCESS);
  // Anything but a boolean is refused, naming it.
  Host bad;
  bad.params["gdr_flush"] = "sometimes";
  Provider pb(bad);
  CHECK(pb.init_status == WIA_ERROR_CONFIG);
  CHECK_MESSAGE(bad.error.find("gdr_flush 'sometimes'") != std::string::npos, bad.error);
}

TEST_CASE("verbs: a loopback write the NIC refuses fails that device receive, not the connection") {
  // This process refuses incoming RDMA writes: the loopback QP's write of an
  // eager message into device memory completes with a remote access error.
  Env env("FAKE_IBV_REMOTE_ACCESS_ERROR", "1");
  Host h;
  h.params["dmabuf"] = "true";
  Provider p(h);
  REQUIRE_MESSAGE(p.init_status == WIA_SUCCESS, h.error);
  auto [a, b] = self_pair(p);
  DeviceBuffer rdev(16384);
  wia_mr_t rmr = nullptr;
  REQUIRE_MESSAGE(rdev.reg(p, 0, rdev.len, &rmr) == WIA_SUCCESS, h.error);
  const std::vector<char> small = pattern(100, 4);
  for (int round = 0; round < 2; ++round) {  // the failed loopback QP is remade for the next
    CAPTURE(round);
    wia_request_t rr = nullptr, sr = nullptr;
    REQUIRE(p.t->irecv(p.ctx, b, rdev.dev + 64, 100, 9, rmr, &rr) == WIA_SUCCESS);
    REQUIRE(p.t->isend(p.ctx, a, small.data(), small.size(), 9, nullptr, &sr) == WIA_SUCCESS);
    CHECK(wait(p, sr) == WIA_SUCCESS);
    const wia_status_t st = wait(p, rr);
    CHECK_MESSAGE(st == WIA_ERROR_IO, "the receive ended with " << st << ": " << h.error);
    CHECK_MESSAGE(h.error.find("could not be placed in device memory") != std::string::npos,
                  h.error);
    CHECK_MESSAGE(h.error.find("IBV_WC_REM_ACCESS_ERR") != std::string::npos, h.error);
    CHECK_MESSAGE(h.error.find("from peer host") != std::string::npos, h.error);
    for (std::size_t i = 0; i < rdev.len; ++i)
      if (rdev.view[i] != 0x5a) FAIL("device byte " << i << " was written");
    // The connection is fine: host messages still flow.
    roundtrip(p, a, b, 100, 10 + round);
  }
  CHECK(p.t->dereg_mr(p.ctx, rmr) == WIA_SUCCESS);
  CHECK(p.t->close(p.ctx, a) == WIA_SUCCESS);
  CHECK(p.t->close(p.ctx, b) == WIA_SUCCESS);
}

TEST_CASE("verbs: a libibverbs without ibv_reg_dmabuf_mr refuses device memory, naming it") {
  Host h;
  h.params["library"] = WIA_FAKE_IBVERBS_NODMABUF_FILE;
  h.params["dmabuf"] = "true";
  Provider p(h);
  REQUIRE_MESSAGE(p.init_status == WIA_SUCCESS, h.error);
  check_claims_host_memory_only(p);
  DeviceBuffer dev(8192);
  wia_mr_t m = nullptr;
  CHECK(dev.reg(p, 0, 4096, &m) == WIA_ERROR_NOT_SUPPORTED);
  CHECK(m == nullptr);
  CHECK_MESSAGE(h.error.find("has no ibv_reg_dmabuf_mr@IBVERBS_1.12") != std::string::npos,
                h.error);
  CHECK_MESSAGE(h.error.find(WIA_FAKE_IBVERBS_NODMABUF_FILE) != std::string::npos, h.error);
  // Host memory is unaffected.
  std::vector<char> host(4096);
  wia_mr_desc_v1_t desc{sizeof(desc),       WIA_MR_HOST, host.data(), host.size(),
                        WIA_MEM_IFACE_HOST, -1,          0,           0};
  REQUIRE_MESSAGE(p.t->reg_mr(p.ctx, 0, &desc, &m) == WIA_SUCCESS, h.error);
  CHECK(p.t->dereg_mr(p.ctx, m) == WIA_SUCCESS);
}
