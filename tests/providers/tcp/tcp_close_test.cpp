// SPDX-License-Identifier: Apache-2.0
// The tcp transport provider's connection life cycle between real
// processes: failed and abandoned connects, data sent before close()
// delivered, striped sends closed at once, hellos trickling in, and a
// receiver that only wakes from poll(2) on wait_fds (tcp_harness.hpp).
#include "tcp_harness.hpp"

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
