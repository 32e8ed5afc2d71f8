// SPDX-License-Identifier: Apache-2.0
// The ofi provider through its ABI alone (dlopen, a minimal host-services
// table), in one process: a connection to its own listener over
// libfabric's tcp;ofi_rxm. Checks what the conformance suite cannot see
// from outside: the registration cache (one fi_mr_reg for a buffer
// registered twice, counted from the provider's log), the max_message
// error, and the error that names an unknown fabric provider.
#include <dlfcn.h>
#include <doctest/doctest.h>
#include <wia/provider.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "support/recording_host.hpp"

namespace {

using Host = wia::test::RecordingHost;

struct Provider {
  void* so = nullptr;
  const wia_provider_v1_t* d = nullptr;
  const wia_transport_ops_v1_t* t = nullptr;
  void* ctx = nullptr;
  wia_status_t init_status = WIA_ERROR_INTERNAL;

  explicit Provider(Host& h) {
    so = dlopen(WIA_OFI_PROVIDER_FILE, RTLD_NOW | RTLD_LOCAL);
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

std::size_t count_logs(const Host& h, const char* needle) {
  std::size_t n = 0;
  for (const auto& l : h.logs) n += l.find(needle) != std::string::npos;
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
    REQUIRE(sa >= 0);
    REQUIRE(sb >= 0);
  }
  REQUIRE(sa == WIA_SUCCESS);
  REQUIRE(sb == WIA_SUCCESS);
  CHECK(cookie == 0x55);
  CHECK(p.t->close_listener(p.ctx, l) == WIA_SUCCESS);
  return {a, b};
}

wia_status_t wait(Provider& p, wia_request_t r, std::uint64_t* size) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (std::chrono::steady_clock::now() < deadline) {
    int32_t done = 0;
    const wia_status_t st = p.t->test(p.ctx, r, &done, size);
    if (st != WIA_SUCCESS || done) return st;
  }
  return WIA_ERROR_TIMEOUT;
}

}  // namespace

TEST_CASE("ofi: registering one buffer twice costs one fi_mr_reg, and the region carries data") {
  Host h;
  h.params["provider"] = "tcp;ofi_rxm";
  Provider p(h);
  REQUIRE_MESSAGE(p.init_status == WIA_SUCCESS, h.error);
  auto [a, b] = self_pair(p);
  std::vector<char> src(1 << 20), dst(1 << 20, 0);
  for (std::size_t i = 0; i < src.size(); ++i) src[i] = static_cast<char>(i * 7 + 3);
  wia_mr_desc_v1_t desc{sizeof(desc),       WIA_MR_HOST, src.data(), src.size(),
                        WIA_MEM_IFACE_HOST, -1,          0,          0};
  wia_mr_t m1 = nullptr, m2 = nullptr, m3 = nullptr;
  const std::size_t before = count_logs(h, "fi_mr_reg(");
  REQUIRE(p.t->reg_mr(p.ctx, 0, &desc, &m1) == WIA_SUCCESS);
  REQUIRE(p.t->reg_mr(p.ctx, 0, &desc, &m2) == WIA_SUCCESS);
  CHECK(count_logs(h, "fi_mr_reg(") - before == 1);
  // Another range is another registration.
  desc.size = 4096;
  REQUIRE(p.t->reg_mr(p.ctx, 0, &desc, &m3) == WIA_SUCCESS);
  CHECK(count_logs(h, "fi_mr_reg(") - before == 2);

  wia_request_t rr = nullptr, sr = nullptr;
  REQUIRE(p.t->irecv(p.ctx, b, dst.data(), dst.size(), 42, nullptr, &rr) == WIA_SUCCESS);
  REQUIRE(p.t->isend(p.ctx, a, src.data(), src.size(), 42, m1, &sr) == WIA_SUCCESS);
  REQUIRE(rr != nullptr);
  REQUIRE(sr != nullptr);
  std::uint64_t got = 0;
  CHECK(wait(p, sr, nullptr) == WIA_SUCCESS);
  CHECK(wait(p, rr, &got) == WIA_SUCCESS);
  CHECK(got == src.size());
  CHECK(std::memcmp(src.data(), dst.data(), src.size()) == 0);

  // The last reference closes the fabric registration; a new one registers again.
  CHECK(p.t->dereg_mr(p.ctx, m1) == WIA_SUCCESS);
  CHECK(p.t->dereg_mr(p.ctx, m2) == WIA_SUCCESS);
  desc.size = src.size();
  REQUIRE(p.t->reg_mr(p.ctx, 0, &desc, &m1) == WIA_SUCCESS);
  CHECK(count_logs(h, "fi_mr_reg(") - before == 3);
  CHECK(p.t->dereg_mr(p.ctx, m1) == WIA_SUCCESS);
  CHECK(p.t->dereg_mr(p.ctx, m3) == WIA_SUCCESS);
  CHECK(p.t->close(p.ctx, a) == WIA_SUCCESS);
  CHECK(p.t->close(p.ctx, b) == WIA_SUCCESS);
}

TEST_CASE("ofi: a message over max_message is refused with the sizes and the fabric named") {
  Host h;
  h.params["provider"] = "tcp;ofi_rxm";
  h.params["max_message"] = "1M";
  Provider p(h);
  REQUIRE_MESSAGE(p.init_status == WIA_SUCCESS, h.error);
  wia_transport_props_v1_t props{};
  props.struct_size = sizeof(props);
  REQUIRE(p.t->endpoint_props(p.ctx, 0, &props) == WIA_SUCCESS);
  CHECK(props.max_message_size == (1u << 20));
  CHECK(std::string(props.name).rfind("tcp;ofi_rxm/", 0) == 0);
  auto [a, b] = self_pair(p);
  std::vector<char> big((2u << 20));
  wia_request_t r = nullptr;
  CHECK(p.t->isend(p.ctx, a, big.data(), big.size(), 1, nullptr, &r) == WIA_ERROR_INVALID_ARGUMENT);
  CHECK(r == nullptr);
  INFO(h.error);
  CHECK(h.error.find("2 MiB") != std::string::npos);
  CHECK(h.error.find("1 MiB") != std::string::npos);
  CHECK(h.error.find("tcp;ofi_rxm") != std::string::npos);
  // The connection goes on: a message at the limit passes.
  std::vector<char> dst(1u << 20);
  wia_request_t rr = nullptr;
  REQUIRE(p.t->irecv(p.ctx, b, dst.data(), dst.size(), 1, nullptr, &rr) == WIA_SUCCESS);
  REQUIRE(p.t->isend(p.ctx, a, big.data(), 1u << 20, 1, nullptr, &r) == WIA_SUCCESS);
  CHECK(wait(p, r, nullptr) == WIA_SUCCESS);
  CHECK(wait(p, rr, nullptr) == WIA_SUCCESS);
  CHECK(p.t->close(p.ctx, a) == WIA_SUCCESS);
  CHECK(p.t->close(p.ctx, b) == WIA_SUCCESS);
}

// A peer that sends a last message and closes at once (an acknowledgement,
// then close: what every benchmark and shutdown does) must not lose that
// message to its CLOSE, which arrives after it. Small sends go out with
// fi_tinject (8 B) or fi_tsend (1000 B), framed or not.
TEST_CASE(
    "ofi: messages sent just before the peer closed are still received; later receives fail naming "
    "the close") {
  for (const char* rendezvous : {"off", "on"}) {
    CAPTURE(rendezvous);
    Host h;
    h.params["provider"] = "tcp;ofi_rxm";
    h.params["rendezvous"] = rendezvous;
    Provider p(h);
    REQUIRE_MESSAGE(p.init_status == WIA_SUCCESS, h.error);
    auto [a, b] = self_pair(p);
    // Before: a receive with nothing coming, so b sees the CLOSE.
    char nothing[8];
    wia_request_t before = nullptr;
    REQUIRE(p.t->irecv(p.ctx, b, nothing, sizeof(nothing), 99, nullptr, &before) == WIA_SUCCESS);
    std::vector<char> small(8, 's'), mid(1000, 'm');
    wia_request_t s1 = nullptr, s2 = nullptr;
    REQUIRE(p.t->isend(p.ctx, a, small.data(), small.size(), 7, nullptr, &s1) == WIA_SUCCESS);
    REQUIRE(p.t->isend(p.ctx, a, mid.data(), mid.size(), 8, nullptr, &s2) == WIA_SUCCESS);
    REQUIRE(s1 != nullptr);
    REQUIRE(s2 != nullptr);
    CHECK(wait(p, s1, nullptr) == WIA_SUCCESS);
    CHECK(wait(p, s2, nullptr) == WIA_SUCCESS);
    CHECK(p.t->close(p.ctx, a) == WIA_SUCCESS);
    CHECK(wait(p, before, nullptr) == WIA_ERROR_REMOTE);
    CHECK(h.error.find("closed the connection") != std::string::npos);
    // After the CLOSE: the two messages sent before it are still there.
    std::vector<char> got_small(8), got_mid(1000);
    wia_request_t r1 = nullptr, r2 = nullptr;
    REQUIRE(p.t->irecv(p.ctx, b, got_small.data(), got_small.size(), 7, nullptr, &r1) ==
            WIA_SUCCESS);
    REQUIRE(p.t->irecv(p.ctx, b, got_mid.data(), got_mid.size(), 8, nullptr, &r2) == WIA_SUCCESS);
    std::uint64_t n1 = 0, n2 = 0;
    CHECK(wait(p, r1, &n1) == WIA_SUCCESS);
    CHECK(wait(p, r2, &n2) == WIA_SUCCESS);
    CHECK(n1 == small.size());
    CHECK(n2 == mid.size());
    CHECK(got_small == small);
    CHECK(got_mid == mid);
    // Nothing else was sent: a new receive fails, naming the close.
    wia_request_t r3 = nullptr;
    h.error.clear();
    REQUIRE(p.t->irecv(p.ctx, b, nothing, sizeof(nothing), 9, nullptr, &r3) == WIA_SUCCESS);
    CHECK(wait(p, r3, nullptr) == WIA_ERROR_REMOTE);
    CHECK(h.error.find("closed the connection") != std::string::npos);
    // Sends to a peer that closed fail at once.
    wia_request_t s3 = nullptr;
    CHECK(p.t->isend(p.ctx, b, small.data(), small.size(), 7, nullptr, &s3) == WIA_ERROR_REMOTE);
    CHECK(s3 == nullptr);
    CHECK(p.t->close(p.ctx, b) == WIA_SUCCESS);
  }
}

// Many small messages both ways (the requests come from a pool and are
// reused; sends up to inject_size complete at once): every payload arrives
// intact and in order.
TEST_CASE("ofi: a long ping-pong of small messages keeps every payload and its order") {
  for (const char* rendezvous : {"off", "on"}) {
    CAPTURE(rendezvous);
    Host h;
    h.params["provider"] = "tcp;ofi_rxm";
    h.params["rendezvous"] = rendezvous;
    Provider p(h);
    REQUIRE_MESSAGE(p.init_status == WIA_SUCCESS, h.error);
    auto [a, b] = self_pair(p);
    for (std::uint32_t i = 0; i < 2000; ++i) {
      const std::size_t size = (i % 3 == 0) ? 0 : (i % 3 == 1) ? 8 : 100;  // 100 B: above inject
      std::vector<char> out(size, static_cast<char>(i)), in(128, 0);
      wia_conn_t from = (i % 2 == 0) ? a : b, to = (i % 2 == 0) ? b : a;
      wia_request_t rr = nullptr, sr = nullptr;
      REQUIRE(p.t->irecv(p.ctx, to, in.data(), in.size(), 5, nullptr, &rr) == WIA_SUCCESS);
      REQUIRE(p.t->isend(p.ctx, from, out.data(), out.size(), 5, nullptr, &sr) == WIA_SUCCESS);
      REQUIRE(sr != nullptr);
      std::uint64_t got = 0;
      REQUIRE(wait(p, sr, nullptr) == WIA_SUCCESS);
      REQUIRE(wait(p, rr, &got) == WIA_SUCCESS);
      REQUIRE(got == size);
      if (size > 0) REQUIRE(std::memcmp(in.data(), out.data(), size) == 0);
    }
    CHECK(p.t->close(p.ctx, a) == WIA_SUCCESS);
    CHECK(p.t->close(p.ctx, b) == WIA_SUCCESS);
  }
}

TEST_CASE("ofi: an unknown fabric provider is WIA_ERROR_UNAVAILABLE naming it") {
  Host h;
  h.params["provider"] = "nosuchfabric";
  Provider p(h);
  CHECK(p.init_status == WIA_ERROR_UNAVAILABLE);
  INFO(h.error);
  CHECK(h.error.find("'nosuchfabric'") != std::string::npos);
  CHECK(h.error.find("tcp;ofi_rxm") != std::string::npos);  // what there is instead
}

TEST_CASE("ofi: without an RDMA device or a named fabric the provider is absent, saying why") {
  if (std::getenv("FI_PROVIDER") != nullptr) unsetenv("FI_PROVIDER");
  Host h;  // no parameters: ofi.enable auto
  Provider p(h);
  bool rdma = false;
  for (const char* dir : {"/sys/class/infiniband", "/sys/class/cxi"})
    if (std::system((std::string("ls -A ") + dir + " 2>/dev/null | grep -q .").c_str()) == 0)
      rdma = true;
  if (rdma) {
    MESSAGE("this machine has an RDMA device: ofi loads by default here");
    return;
  }
  CHECK(p.init_status == WIA_ERROR_UNAVAILABLE);
  CHECK(h.error.find("no RDMA device") != std::string::npos);
  CHECK(h.error.find("WIA_OFI_PROVIDER") != std::string::npos);
}
