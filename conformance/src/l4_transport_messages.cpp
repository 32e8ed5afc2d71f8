// SPDX-License-Identifier: Apache-2.0
// Level 4, tagged messages (L4.send_recv.*): both directions, sizes from
// 0 B to 64 MiB, per-tag order, many outstanding requests, and truncation.
#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "l4_transport.hpp"

namespace wia::conformance::l4 {

// --- L4.send_recv.basic -------------------------------------------------------------------

void send_recv_basic(Context& c) {
  run_pair(c, [](Side& s) {
    wia_conn_t conn = s.connect_pair(0x5157);
    const std::uint32_t mine = 40 + s.role, theirs = 40 + (1 - s.role);
    // A receive posted before the send, with room to spare.
    Buffer& out = s.buffer(4097);
    fill_pattern(out.data, 4097, mine);
    Buffer& in = s.buffer(8192);
    std::memset(in.data, kUntouched, 8192);
    Request* r = s.irecv(conn, in, 0, 8192, 7);
    s.barrier("receives posted");
    Request* w = s.isend(conn, out, 0, 4097, 7);
    s.wait_all_ok({w, r});
    check_message(s, r, in, 0, 4097, 8192, theirs);
    // A zero-byte message.
    Buffer& zin = s.buffer(16);
    std::memset(zin.data, kUntouched, 16);
    Request* zr = s.irecv(conn, zin, 0, 16, 8);
    Request* zw = s.isend(conn, out, 0, 0, 8);
    s.wait_all_ok({zw, zr});
    check_message(s, zr, zin, 0, 0, 16, theirs);
    // A message sent before its receive is posted (unexpected).
    Buffer& uin = s.buffer(3000);
    std::memset(uin.data, kUntouched, 3000);
    Request* uw = s.isend(conn, out, 0, 2999, 9);
    s.barrier("unexpected sends posted");
    Request* ur = s.irecv(conn, uin, 0, 3000, 9);
    s.wait_all_ok({uw, ur});
    check_message(s, ur, uin, 0, 2999, 3000, theirs);
  });
}

// --- L4.send_recv.sizes --------------------------------------------------------------------

void send_recv_sizes(Context& c) {
  run_pair(c, [](Side& s) {
    wia_conn_t conn = s.connect_pair(0x512e5);
    std::vector<std::uint64_t> sizes;
    for (std::uint64_t n : {0ull, 1ull, 7ull, 4095ull, 4096ull, 65537ull, (1ull << 20) + 3,
                            (16ull << 20) + 1, 64ull << 20})
      if (n <= s.props.max_message_size) sizes.push_back(n);
    constexpr std::uint64_t kSlack = 64;
    std::vector<Buffer*> ins;
    std::vector<Request*> recvs, all;
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      Buffer& in = s.buffer(sizes[i] + kSlack);
      std::memset(in.data, kUntouched, in.size);
      ins.push_back(&in);
      recvs.push_back(s.irecv(conn, in, 0, in.size, 100 + i));
    }
    all = recvs;
    s.barrier("receives posted");
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      Buffer& out = s.buffer(sizes[i]);
      fill_pattern(out.data, sizes[i], 500 + 10 * s.role + static_cast<std::uint32_t>(i));
      all.push_back(s.isend(conn, out, 0, sizes[i], 100 + i));
    }
    s.wait_all_ok(all);
    for (std::size_t i = 0; i < sizes.size(); ++i)
      check_message(s, recvs[i], *ins[i], 0, sizes[i], sizes[i] + kSlack,
                    500 + 10 * (1 - s.role) + static_cast<std::uint32_t>(i));
  });
}

namespace {

// --- L4.send_recv.tag_order ------------------------------------------------------------------

constexpr int kOrderMessages = 16;
std::uint64_t order_size(int seq) {
  static const std::uint64_t kSizes[] = {24, 200 * 1024 + 3, 1024, 64 * 1024 + 1};
  return kSizes[seq % 4];
}
std::uint32_t order_seed(int tag_index, int seq) {
  return 7000 + static_cast<std::uint32_t>(tag_index * 100 + seq);
}

// Receives of `tags` posted tag by tag in reverse (a transport that matches
// across tags, or by arrival, puts messages in the wrong buffers), or in
// send order for transports that require it; checks that the k-th receive
// of each tag got the k-th message of that tag.
void order_round(Side& s, wia_conn_t conn, const std::vector<std::uint64_t>& tags,
                 bool sends_first) {
  const int ntags = static_cast<int>(tags.size());
  const std::uint64_t cap = 200 * 1024 + 64;
  const std::string round = sends_first ? "sends first" : "receives first";
  if (s.role == 1) {
    std::vector<Request*> sends;
    auto post_sends = [&] {
      for (int seq = 0; seq < kOrderMessages; ++seq)
        for (int t = 0; t < ntags; ++t) {
          Buffer& out = s.buffer(order_size(seq));
          fill_pattern(out.data, out.size, order_seed(t, seq));
          sends.push_back(s.isend(conn, out, 0, out.size, tags[t]));
        }
    };
    if (sends_first) post_sends();
    s.barrier(round);
    if (!sends_first) post_sends();
    s.wait_all_ok(sends);
    return;
  }
  std::vector<std::vector<Request*>> recvs(ntags, std::vector<Request*>(kOrderMessages));
  std::vector<std::vector<Buffer*>> bufs(ntags, std::vector<Buffer*>(kOrderMessages));
  auto post_one = [&](int t, int seq) {
    Buffer& in = s.buffer(cap);
    std::memset(in.data, kUntouched, cap);
    bufs[t][seq] = &in;
    recvs[t][seq] = s.irecv(conn, in, 0, cap, tags[t]);
  };
  auto post_receives = [&] {
    if (s.ordered_recv) {
      for (int seq = 0; seq < kOrderMessages; ++seq)
        for (int t = 0; t < ntags; ++t) post_one(t, seq);
    } else {
      for (int t = ntags - 1; t >= 0; --t)
        for (int seq = 0; seq < kOrderMessages; ++seq) post_one(t, seq);
    }
  };
  if (!sends_first) post_receives();
  s.barrier(round);
  if (sends_first) post_receives();
  for (int t = 0; t < ntags; ++t)
    for (int seq = 0; seq < kOrderMessages; ++seq) s.wait_ok(recvs[t][seq]);
  for (int t = 0; t < ntags; ++t)
    for (int seq = 0; seq < kOrderMessages; ++seq) {
      const Request* r = recvs[t][seq];
      const Buffer& b = *bufs[t][seq];
      const std::uint64_t want = order_size(seq);
      const bool good = r->size == want && check_pattern(b.data, want, order_seed(t, seq)).empty();
      if (good) continue;
      // Say which message arrived instead.
      std::string got = std::to_string(r->size) + " bytes matching no message of that tag";
      for (int u = 0; u < ntags; ++u)
        for (int k = 0; k < kOrderMessages; ++k)
          if (r->size == order_size(k) &&
              check_pattern(b.data, std::min<std::uint64_t>(r->size, 256), order_seed(u, k))
                  .empty())
            got = "message #" + std::to_string(k) + " of tag " + hex(tags[u]);
      s.c.fail("expected: receive #" + std::to_string(seq) + " of tag " + hex(tags[t]) +
               " to get message #" + std::to_string(seq) + " of that tag (" + size_text(want) +
               "), round '" + round + "'\n     got: " + got);
    }
}

}  // namespace

void send_recv_tag_order(Context& c) {
  run_pair(c, [](Side& s) {
    wia_conn_t conn = s.connect_pair(0x07de7);
    const std::uint64_t top = s.props.tag_bits >= 64 ? ~0ull : (1ull << s.props.tag_bits) - 1;
    const std::vector<std::uint64_t> tags = {0, 1, 0x80000001ull, top};
    order_round(s, conn, tags, false);
    order_round(s, conn, tags, true);
  });
}

// --- L4.send_recv.many_outstanding ------------------------------------------------------------

void send_recv_many(Context& c) {
  constexpr int kCount = 300;
  constexpr std::uint64_t kSize = 64;
  run_pair(c, [&](Side& s) {
    wia_conn_t conn = s.connect_pair(0x300);
    Buffer& in = s.buffer(kCount * kSize);
    std::memset(in.data, kUntouched, in.size);
    Buffer& out = s.buffer(kCount * kSize);
    for (int i = 0; i < kCount; ++i)
      fill_pattern(out.data + i * kSize, kSize,
                   900 + 1000 * s.role + static_cast<std::uint32_t>(i));
    std::vector<Request*> recvs, all;
    for (int i = 0; i < kCount; ++i) recvs.push_back(s.irecv(conn, in, i * kSize, kSize, 42));
    all = recvs;
    s.barrier("receives posted");
    for (int i = 0; i < kCount; ++i) all.push_back(s.isend(conn, out, i * kSize, kSize, 42));
    s.wait_all_ok(all);
    for (int i = 0; i < kCount; ++i) {
      const std::string bad = check_pattern(
          in.data + i * kSize, kSize, 900 + 1000 * (1 - s.role) + static_cast<std::uint32_t>(i));
      if (!bad.empty()) {
        std::string got = "other bytes (" + bad + ")";
        for (int k = 0; k < kCount; ++k)
          if (check_pattern(in.data + i * kSize, kSize,
                            900 + 1000 * (1 - s.role) + static_cast<std::uint32_t>(k))
                  .empty())
            got = "message #" + std::to_string(k);
        s.c.fail("expected: receive #" + std::to_string(i) + " of " + std::to_string(kCount) +
                 " (one tag) to get message #" + std::to_string(i) + "\n     got: " + got);
      }
    }
    const std::size_t want =
        s.props.max_requests > 0 ? std::min<std::size_t>(256, s.props.max_requests) : 256;
    s.c.expect(s.peak_outstanding >= want,
               std::to_string(want) + " requests outstanding at once on one connection",
               "at most " + std::to_string(s.peak_outstanding) + " (posts answered \"retry\" " +
                   std::to_string(s.null_posts) + " times; max_requests " +
                   std::to_string(s.props.max_requests) + ")");
  });
}

// --- L4.send_recv.truncate ------------------------------------------------------------------

void send_recv_truncate(Context& c) {
  struct Msg {
    std::uint64_t size, capacity, tag;
    bool fits;
  };
  const Msg msgs[] = {{4096, 1024, 9, false},
                      {(1ull << 20) + 5, 64 * 1024, 9, false},
                      {100, 4096, 9, true},
                      {64, 64, 10, true}};
  constexpr std::uint64_t kGuard = 4096;
  run_pair(c, [&](Side& s) {
    wia_conn_t conn = s.connect_pair(0x7a11);
    if (s.role == 1) {
      s.barrier("receives posted");
      std::vector<Request*> sends;
      for (const Msg& m : msgs) {
        Buffer& out = s.buffer(m.size);
        fill_pattern(out.data, m.size, static_cast<std::uint32_t>(m.size));
        sends.push_back(s.isend(conn, out, 0, m.size, m.tag));
      }
      // The sender's outcome of a truncated message is unspecified, but
      // every send must end.
      for (Request* r : sends) {
        s.c.step("connector: waiting for " + r->what);
        if (s.wait(r) == WIA_IN_PROGRESS)
          s.c.fail("connector: " + r->what +
                   " never ended (done or failed) after the listener received the messages");
      }
      s.barrier("done");
      return;
    }
    std::vector<Request*> recvs;
    std::vector<Buffer*> bufs;
    for (const Msg& m : msgs) {
      Buffer& in = s.buffer(m.capacity + kGuard);
      std::memset(in.data, kUntouched, in.size);
      bufs.push_back(&in);
      recvs.push_back(s.irecv(conn, in, 0, m.capacity, m.tag));
    }
    s.barrier("receives posted");
    for (std::size_t i = 0; i < recvs.size(); ++i) {
      const Msg& m = msgs[i];
      Request* r = recvs[i];
      s.c.step("listener: waiting for " + r->what);
      const wia_status_t st = s.wait(r);
      if (st == WIA_IN_PROGRESS)
        s.c.fail(r->what + " (a " + size_text(m.size) + " message) never ended");
      if (m.fits) {
        s.c.expect(st == WIA_SUCCESS,
                   r->what + " after the truncated ones to succeed (the connection goes on)",
                   status_text(st) + " " + r->what);
        check_message(s, r, *bufs[i], 0, m.size, m.capacity + kGuard,
                      static_cast<std::uint32_t>(m.size));
      } else {
        s.c.expect(st == WIA_ERROR_REMOTE,
                   r->what + " receiving a " + size_text(m.size) + " message to fail with " +
                       status_text(WIA_ERROR_REMOTE),
                   st == WIA_SUCCESS ? "WIA_SUCCESS with " + std::to_string(r->size) + " bytes"
                                     : status_text(st));
        const std::string over = check_fill(bufs[i]->data + m.capacity, kGuard, kUntouched);
        s.c.expect(over.empty(),
                   "no byte written past the " + size_text(m.capacity) + " receive buffer", over);
      }
    }
    s.barrier("done");
  });
}

}  // namespace wia::conformance::l4
