// SPDX-License-Identifier: Apache-2.0
// The tcp transport provider between real processes over real loopback
// sockets: endpoints, handshake, sizes, matching, flow control, truncation,
// hostile hellos, IPv6, memory registration. tcp_harness.hpp has the
// set-up (the provider loaded as the core loads it, forked peers, raw
// sockets) and how every wait is bounded.
#include "tcp_harness.hpp"

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
