// SPDX-License-Identifier: Apache-2.0
// Level 4: the transport interface, between two processes (the test's child
// and a peer it forks, see transport_pair.hpp): endpoint properties,
// listen/connect/accept with cookies, tagged messages (sizes, per-tag order,
// many outstanding, truncation), registration, RMA, close, and peers that
// disappear.
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "harness.hpp"
#include "transport_pair.hpp"

namespace wia::conformance {
namespace {

constexpr std::uint8_t kUntouched = 0xEE;  // receive buffers start with this

std::string hex(std::uint64_t v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "0x%" PRIx64, v);
  return buf;
}

bool nul_terminated(const char* s, std::size_t cap) { return std::memchr(s, '\0', cap) != nullptr; }

// --- L4.endpoint.props ----------------------------------------------------------

void endpoint_props(Context& c) {
  const auto& o = c.tp_ops();
  c.init();
  std::int32_t n = -1;
  c.step("endpoint_count");
  c.ok(o.endpoint_count(c.ctx(), &n), "endpoint_count");
  c.expect(n >= 0, "endpoint_count >= 0", std::to_string(n));
  if (n == 0) throw Skip("the transport has no endpoint here (endpoint_count 0)");
  const bool cap_rma = (o.caps & WIA_TRANSPORT_CAP_RMA) != 0;
  constexpr std::uint32_t kKnownFlags = (1u << 6) - 1;
  for (int e = 0; e < n; ++e) {
    const std::string call = "endpoint_props(" + std::to_string(e) + ")";
    wia_transport_props_v1_t p{};
    p.struct_size = sizeof(p);
    c.step(call);
    c.ok(o.endpoint_props(c.ctx(), e, &p), call);
    const std::string at = call + ": ";
    c.expect(nul_terminated(p.name, sizeof(p.name)) && p.name[0] != '\0',
             at + "a non-empty, NUL-terminated name", "empty or unterminated name");
    c.expect(nul_terminated(p.pci_bus_id, sizeof(p.pci_bus_id)), at + "a NUL-terminated pci_bus_id",
             "unterminated pci_bus_id");
    c.expect(p.tag_bits >= 32 && p.tag_bits <= 64, at + "tag_bits in [32, 64]",
             std::to_string(p.tag_bits));
    c.expect(p.max_message_size > 0, at + "max_message_size > 0", "0");
    c.expect((p.flags & ~kKnownFlags) == 0, at + "only WIA_TRANSPORT_FLAG_* bits of ABI v1",
             "flags " + hex(p.flags));
    c.expect(((p.flags & WIA_TRANSPORT_FLAG_RMA) != 0) == cap_rma,
             at + "WIA_TRANSPORT_FLAG_RMA set exactly when the table claims WIA_TRANSPORT_CAP_RMA",
             std::string("flag ") + ((p.flags & WIA_TRANSPORT_FLAG_RMA) ? "set" : "clear") +
                 ", cap " + (cap_rma ? "set" : "clear"));
    c.expect((p.flags & (WIA_TRANSPORT_FLAG_INTRA_NODE | WIA_TRANSPORT_FLAG_INTER_NODE)) != 0,
             at + "INTRA_NODE or INTER_NODE (which peers it reaches)", "neither flag");
    c.expect((p.mem_ifaces & (1u << WIA_MEM_IFACE_HOST)) != 0,
             at + "mem_ifaces to include host memory (1 << WIA_MEM_IFACE_HOST)",
             "mem_ifaces " + hex(p.mem_ifaces));
    const bool device_ifaces = (p.mem_ifaces & ~(1u << WIA_MEM_IFACE_HOST)) != 0;
    const bool device_flag = (p.flags & WIA_TRANSPORT_FLAG_DEVICE_MEMORY) != 0;
    c.expect(
        device_ifaces == device_flag,
        at + "device interfaces in mem_ifaces exactly when FLAG_DEVICE_MEMORY is set",
        "mem_ifaces " + hex(p.mem_ifaces) + ", DEVICE_MEMORY " + (device_flag ? "set" : "clear"));
    c.expect(std::isfinite(p.latency_us) && p.latency_us >= 0, at + "latency_us finite and >= 0",
             std::to_string(p.latency_us));
  }
  // The caller's struct_size bounds what the provider writes.
  {
    constexpr std::size_t kShort = offsetof(wia_transport_props_v1_t, pci_bus_id);
    unsigned char raw[sizeof(wia_transport_props_v1_t) + 16];
    std::memset(raw, 0xA5, sizeof(raw));
    auto* p = reinterpret_cast<wia_transport_props_v1_t*>(raw);
    p->struct_size = kShort;
    c.step("endpoint_props with struct_size " + std::to_string(kShort));
    c.ok(o.endpoint_props(c.ctx(), 0, p), "endpoint_props(0) with a short struct");
    std::size_t first_bad = sizeof(raw);
    for (std::size_t i = kShort; i < sizeof(raw); ++i)
      if (raw[i] != 0xA5) {
        first_bad = i;
        break;
      }
    c.expect(
        first_bad == sizeof(raw),
        "endpoint_props to write no byte at or past struct_size (" + std::to_string(kShort) + ")",
        "byte " + std::to_string(first_bad) + " changed");
  }
  for (const std::int32_t bad : {n, -1}) {
    wia_transport_props_v1_t p{};
    p.struct_size = sizeof(p);
    const std::string call = "endpoint_props(" + std::to_string(bad) + ")";
    c.step(call);
    const wia_status_t st = o.endpoint_props(c.ctx(), bad, &p);
    const std::string text = c.take_error();
    c.expect(st < 0, call + " (out of range) to fail", status_text(st));
    c.expect(!text.empty(), call + " to explain its error through host->set_error",
             status_text(st) + " with no set_error message");
  }
}

// --- helpers for message tests ------------------------------------------------------

// Checks a received message: reported size, payload, and that the bytes of
// the buffer past the message were not written.
void check_message(Side& s, const Request* r, const Buffer& b, std::uint64_t offset,
                   std::uint64_t want_size, std::uint64_t capacity, std::uint32_t seed) {
  s.c.expect(r->size == want_size, r->what + " to report " + std::to_string(want_size) + " bytes",
             std::to_string(r->size) + " bytes");
  const std::string bad = check_pattern(b.data + offset, want_size, seed);
  s.c.expect(bad.empty(), r->what + ": the sender's bytes", bad);
  const std::string over =
      check_fill(b.data + offset + want_size, capacity - want_size, kUntouched);
  s.c.expect(over.empty(),
             r->what + ": the receive buffer past the message untouched (" +
                 size_text(capacity - want_size) + ")",
             over);
}

// --- L4.connect.cookie ------------------------------------------------------------------

void connect_cookie(Context& c) {
  constexpr std::uint64_t kCookies[2] = {0x0123456789abcdefull, 0xfedcba9876543210ull};
  run_pair(c, [&](Side& s) {
    if (s.role == 0) {
      s.listen_and_share();
      wia_conn_t conns[2];
      std::uint64_t got[2];
      for (int i = 0; i < 2; ++i) {
        s.c.step("accept connection " + std::to_string(i + 1) + " of 2");
        conns[i] = s.accept_any(&got[i]);
      }
      const bool same = (got[0] == kCookies[0] && got[1] == kCookies[1]) ||
                        (got[0] == kCookies[1] && got[1] == kCookies[0]);
      s.c.expect(same,
                 "accept to return the connectors' cookies " + hex(kCookies[0]) + " and " +
                     hex(kCookies[1]),
                 hex(got[0]) + " and " + hex(got[1]));
      // Accepted connections outlive their listener.
      s.close_listener();
      // Each connection carries its cookie as its first message: the
      // cookie accept reported must be that connection's. (Both receives
      // are posted first: accept order need not be connect order.)
      Buffer& b = s.buffer(32);
      std::memset(b.data, kUntouched, 32);
      Request* r[2] = {s.irecv(conns[0], b, 0, 16, 1), s.irecv(conns[1], b, 16, 16, 1)};
      s.wait_all_ok({r[0], r[1]});
      Buffer& reply = s.buffer(16);
      std::vector<Request*> sends;
      for (int i = 0; i < 2; ++i) {
        std::uint64_t v = 0;
        std::memcpy(&v, b.data + 16 * i, sizeof(v));
        s.c.expect(r[i]->size == 8 && v == got[i],
                   "connection accepted with cookie " + hex(got[i]) + " to carry that cookie",
                   std::to_string(r[i]->size) + " bytes, value " + hex(v));
        const std::uint64_t answer = ~v;
        std::memcpy(reply.data + 8 * i, &answer, 8);
        sends.push_back(s.isend(conns[i], reply, 8 * i, 8, 2));
      }
      s.wait_all_ok(sends);
    } else {
      const auto handle = s.take_handle();
      wia_conn_t conns[2];
      for (int i = 0; i < 2; ++i) conns[i] = s.connect_handle(handle, kCookies[i]);
      Buffer& b = s.buffer(16);
      Buffer& reply = s.buffer(16);
      std::vector<Request*> all;
      Request* replies[2];
      for (int i = 0; i < 2; ++i) {
        std::memcpy(b.data + 8 * i, &kCookies[i], 8);
        replies[i] = s.irecv(conns[i], reply, 8 * i, 8, 2);
        all.push_back(replies[i]);
        all.push_back(s.isend(conns[i], b, 8 * i, 8, 1));
      }
      s.wait_all_ok(all);
      for (int i = 0; i < 2; ++i) {
        std::uint64_t v = 0;
        std::memcpy(&v, reply.data + 8 * i, 8);
        s.c.expect(v == ~kCookies[i],
                   "the reply on the connection of cookie " + hex(kCookies[i]) +
                       " to come from the listener's side of that connection",
                   hex(v));
      }
    }
  });
}

// --- L4.connect.abandon ---------------------------------------------------------------------

void connect_abandon(Context& c) {
  constexpr std::uint64_t kAbandoned = 0xdeadull, kReal = 0xbeefull;
  run_pair(c, [&](Side& s) {
    if (s.role == 0) {
      // Nobody accepts while the connector starts and abandons an attempt.
      s.listen_and_share();
      s.barrier("abandoned");
      wia_conn_t conn = s.accept_cookie(kReal);
      Buffer& b = s.buffer(4096);
      std::memset(b.data, kUntouched, 4096);
      Request* r = s.irecv(conn, b, 0, 4096, 3);
      s.wait_ok(r);
      check_message(s, r, b, 0, 1000, 4096, 31);
    } else {
      const auto handle = s.take_handle();
      wia_conn_t pending = nullptr;
      s.c.step("connect(cookie " + hex(kAbandoned) + "), first call");
      const wia_status_t st =
          s.ops.connect(s.c.ctx(), s.endpoint, handle.data(), kAbandoned, &pending);
      if (st != WIA_IN_PROGRESS) s.c.ok(st, "connect (the attempt to abandon)");
      if (pending != nullptr) {
        s.c.step("close() of the pending connection");
        s.c.ok(s.ops.close(s.c.ctx(), pending), "close() abandoning a pending connect");
      }
      s.barrier("abandoned");
      wia_conn_t conn = s.connect_handle(handle, kReal);
      Buffer& b = s.buffer(1000);
      fill_pattern(b.data, 1000, 31);
      s.wait_ok(s.isend(conn, b, 0, 1000, 3));
    }
  });
}

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

// --- L4.mr.register ---------------------------------------------------------------------------

void mr_register(Context& c) {
  run_pair(c, [](Side& s) {
    const auto& o = s.ops;
    // Registration alone: odd addresses and sizes, and many rounds.
    Buffer& big = s.buffer(16ull << 20);
    struct Range {
      std::uint64_t offset, size;
    };
    for (int round = 0; round < 20; ++round)
      for (const Range& r :
           {Range{0, 1}, Range{1, 4095}, Range{4096, 1ull << 20}, Range{0, 16ull << 20}}) {
        wia_mr_desc_v1_t d{};
        d.struct_size = sizeof(d);
        d.kind = WIA_MR_HOST;
        d.ptr = big.data + r.offset;
        d.size = r.size;
        d.iface = WIA_MEM_IFACE_HOST;
        d.dmabuf_fd = -1;
        wia_mr_t mr = nullptr;
        const std::string call =
            "reg_mr(host, +" + std::to_string(r.offset) + ", " + size_text(r.size) + ")";
        if (round == 0) s.c.step(call);
        s.c.ok(o.reg_mr(s.c.ctx(), s.endpoint, &d, &mr), call);
        s.c.expect(mr != nullptr, call + " to return a handle", "NULL");
        s.c.ok(o.dereg_mr(s.c.ctx(), mr), "dereg_mr after " + call);
      }
    // Device memory without FLAG_DEVICE_MEMORY: refused, with a reason.
    if ((s.props.flags & WIA_TRANSPORT_FLAG_DEVICE_MEMORY) == 0) {
      wia_mr_desc_v1_t d{};
      d.struct_size = sizeof(d);
      d.kind = WIA_MR_DEVICE;
      d.ptr = big.data;
      d.size = 4096;
      d.iface = WIA_MEM_IFACE_CUDA;
      d.dmabuf_fd = -1;
      wia_mr_t mr = nullptr;
      s.c.step("reg_mr(device memory) without FLAG_DEVICE_MEMORY");
      const wia_status_t st = o.reg_mr(s.c.ctx(), s.endpoint, &d, &mr);
      const std::string text = s.c.take_error();
      if (st == WIA_SUCCESS && mr != nullptr) o.dereg_mr(s.c.ctx(), mr);
      s.c.expect(st < 0, "reg_mr(WIA_MR_DEVICE) to fail on an endpoint without FLAG_DEVICE_MEMORY",
                 status_text(st));
      s.c.expect(!text.empty(), "the refusal explained through host->set_error",
                 status_text(st) + " with no set_error message");
    }
    // Messages from and into registered regions, at offsets inside them.
    wia_conn_t conn = s.connect_pair(0x3e6);
    Buffer& out = s.buffer(1ull << 20, true);
    Buffer& in = s.buffer(1ull << 20, true);
    std::memset(in.data, kUntouched, in.size);
    fill_pattern(out.data + 777, 100000, 60 + s.role);
    Request* r = s.irecv(conn, in, 4099, 200000, 11);
    s.barrier("receives posted");
    Request* w = s.isend(conn, out, 777, 100000, 11);
    s.wait_all_ok({w, r});
    check_message(s, r, in, 4099, 100000, 200000, 60 + (1 - s.role));
    s.barrier("done");
  });
}

// --- L4.rma.put_get ---------------------------------------------------------------------------

void rma_put_get(Context& c) {
  if ((c.tp_ops().caps & WIA_TRANSPORT_CAP_RMA) == 0)
    throw Skip("provider does not claim WIA_TRANSPORT_CAP_RMA");
  constexpr std::uint64_t kTarget = 1ull << 20, kPutAt = 4099, kPutSize = 256 * 1024 + 3;
  constexpr std::uint32_t kTargetSeed = 81, kPutSeed = 82;
  run_pair(c, [&](Side& s) {
    wia_conn_t conn = s.connect_pair(0x4a);
    if (s.role == 1) {
      Buffer& t = s.buffer(kTarget, true);
      fill_pattern(t.data, kTarget, kTargetSeed);
      std::uint8_t rkey[WIA_RKEY_SIZE] = {};
      s.c.step("mr_rkey");
      s.c.ok(s.ops.mr_rkey(s.c.ctx(), t.mr, rkey), "mr_rkey");
      const std::uint64_t addr = reinterpret_cast<std::uintptr_t>(t.data);
      s.send_ctl(rkey, sizeof(rkey));
      s.send_ctl(&addr, sizeof(addr));
      Buffer& note = s.buffer(8);
      s.wait_ok(s.irecv(conn, note, 0, 8, 77));  // "the put is done"
      // The put must be visible once a later message has arrived.
      std::string bad = check_pattern(t.data + kPutAt, kPutSize, kPutSeed);
      s.c.expect(bad.empty(),
                 "the bytes of a completed put visible at the target before a later message", bad);
      bad = check_pattern(t.data, kPutAt, kTargetSeed);
      if (bad.empty())
        bad = check_pattern(t.data + kPutAt + kPutSize, kTarget - kPutAt - kPutSize, kTargetSeed,
                            kPutAt + kPutSize);
      s.c.expect(bad.empty(), "put to write only its range of the target", bad);
      s.wait_ok(s.irecv(conn, note, 0, 8, 78));  // keeps progressing while gets run
      return;
    }
    std::uint8_t rkey[WIA_RKEY_SIZE];
    std::uint64_t addr = 0;
    s.recv_ctl(rkey, sizeof(rkey), "the target's rkey");
    s.recv_ctl(&addr, sizeof(addr), "the target's address");
    Buffer& local = s.buffer(kPutSize, true);
    fill_pattern(local.data, kPutSize, kPutSeed);
    s.wait_ok(s.put(conn, local, 0, kPutSize, addr + kPutAt, rkey));
    Buffer& note = s.buffer(8);
    s.wait_ok(s.isend(conn, note, 0, 8, 77));
    Buffer& got = s.buffer(64 * 1024, true);
    s.wait_ok(s.get(conn, got, 0, 4096, addr, rkey));
    std::string bad = check_pattern(got.data, 4096, kTargetSeed);
    s.c.expect(bad.empty(), "get of the target's first 4 KiB", bad);
    s.wait_ok(s.get(conn, got, 0, 64 * 1024, addr + 512 * 1024, rkey));
    bad = check_pattern(got.data, 64 * 1024, kTargetSeed, 512 * 1024);
    s.c.expect(bad.empty(), "get of 64 KiB at offset 512 KiB of the target", bad);
    s.wait_ok(s.isend(conn, note, 0, 8, 78));
  });
}

// --- L4.wait_fd.wakes (CAP_WAIT_FD) -------------------------------------------------------------

// A receiver that calls test() only when poll(2) on wait_fds wakes it, as
// the core does with more ranks than cores: the descriptors stay quiet
// while nothing is due (else the core would spin), and wake it for a small
// and a large message until both are in (else the core would sleep
// through them until its timeout).
void wait_fd_wakes(Context& c) {
  const auto& o = c.tp_ops();
  if ((o.caps & WIA_TRANSPORT_CAP_WAIT_FD) == 0)
    throw Skip("provider does not claim WIA_TRANSPORT_CAP_WAIT_FD");
  if (!WIA_ABI_HAS_FIELD(wia_transport_ops_v1_t, o.struct_size, wait_fds) ||
      o.wait_fds == nullptr)
    c.fail("the transport table claims WIA_TRANSPORT_CAP_WAIT_FD but wait_fds is missing "
           "(struct_size " + std::to_string(o.struct_size) + ")");
  constexpr std::uint64_t kSmall = 100, kLarge = 16ull << 20;
  run_pair(c, [&](Side& s) {
    wia_conn_t conn = s.connect_pair(0x3a1);
    if (s.role == 1) {
      Buffer& small = s.buffer(kSmall);
      Buffer& large = s.buffer(kLarge);
      fill_pattern(small.data, kSmall, 71);
      fill_pattern(large.data, kLarge, 72);
      s.barrier("receives posted, quiet checked");
      s.wait_all_ok({s.isend(conn, small, 0, kSmall, 7), s.isend(conn, large, 0, kLarge, 8)});
      s.barrier("received");
      return;
    }
    std::vector<pollfd> fds(WIA_TRANSPORT_WAIT_FDS_MAX);
    // Entries to poll; 0 when the provider says "do not wait now".
    auto entries = [&]() -> nfds_t {
      std::uint32_t count = 0;
      s.c.step("wait_fds");
      const wia_status_t st = s.ops.wait_fds(s.c.ctx(), conn, fds.data(),
                                             WIA_TRANSPORT_WAIT_FDS_MAX, &count);
      if (st == WIA_IN_PROGRESS) return 0;
      s.c.ok(st, "wait_fds");
      if (count == 0 || count > WIA_TRANSPORT_WAIT_FDS_MAX)
        s.fail("wait_fds returned WIA_SUCCESS with " + std::to_string(count) +
               " entries (1.." + std::to_string(WIA_TRANSPORT_WAIT_FDS_MAX) + " expected)");
      return count;
    };
    Buffer& small = s.buffer(kSmall + 64);
    Buffer& large = s.buffer(kLarge);
    std::memset(small.data, kUntouched, kSmall + 64);
    Request* rs = s.irecv(conn, small, 0, kSmall + 64, 7);
    Request* rl = s.irecv(conn, large, 0, kLarge, 8);
    if (const nfds_t n = entries(); n > 0) {
      const int ready = ::poll(fds.data(), n, 200);
      s.c.expect(ready == 0, "no descriptor ready within 200 ms while the peer sends nothing",
                 std::to_string(ready) + " ready");
    }
    s.barrier("receives posted, quiet checked");
    int wakeups = 0;
    while (s.outstanding() > 0) {
      if (const nfds_t n = entries(); n > 0) {
        const double budget = s.wait_budget_ms();
        if (budget <= 0 || ::poll(fds.data(), n, static_cast<int>(budget)) <= 0)
          s.fail("messages are due but no descriptor of wait_fds became ready (woken " +
                 std::to_string(wakeups) + " times so far)");
        ++wakeups;
      }
      s.progress();
    }
    s.wait_ok(rs);  // finished: fails unless it succeeded
    s.wait_ok(rl);
    check_message(s, rs, small, 0, kSmall, kSmall + 64, 71);
    check_message(s, rl, large, 0, kLarge, kLarge, 72);
    s.barrier("received");
  });
}

// --- L4.inline.order, L4.inline.truncate (CAP_INLINE) -----------------------------------------

void require_inline(Context& c) {
  const auto& o = c.tp_ops();
  if ((o.caps & WIA_TRANSPORT_CAP_INLINE) == 0)
    throw Skip("provider does not claim WIA_TRANSPORT_CAP_INLINE");
  if (!WIA_ABI_HAS_FIELD(wia_transport_ops_v1_t, o.struct_size, recv_inline) ||
      o.send_inline == nullptr || o.recv_inline == nullptr)
    c.fail("the transport table claims WIA_TRANSPORT_CAP_INLINE but send_inline or recv_inline "
           "is missing (struct_size " + std::to_string(o.struct_size) + ")");
}

// send_inline, or isend when the provider declines (WIA_IN_PROGRESS).
// Returns the isend's request, nullptr when send_inline sent it.
Request* send_small(Side& s, wia_conn_t conn, Buffer& b, std::uint64_t size, std::uint64_t tag) {
  const std::string call = "send_inline(tag " + hex(tag) + ", " + size_text(size) + ")";
  s.c.step(call);
  const wia_status_t st = s.ops.send_inline(s.c.ctx(), conn, b.data, size, tag);
  if (st == WIA_SUCCESS) return nullptr;
  if (st != WIA_IN_PROGRESS) s.c.ok(st, call);
  return s.isend(conn, b, 0, size, tag);
}

// recv_inline until the message is there, driving the side's requests
// meanwhile; WIA_ERROR_NOT_SUPPORTED (declined) and errors are returned.
wia_status_t recv_small(Side& s, wia_conn_t conn, Buffer& b, std::uint64_t capacity,
                        std::uint64_t tag, std::uint64_t* size) {
  const std::string call = "recv_inline(tag " + hex(tag) + ", " + size_text(capacity) + ")";
  s.c.step(call);
  for (;;) {
    std::int32_t done = 0;
    *size = ~0ull;
    const wia_status_t st =
        s.ops.recv_inline(s.c.ctx(), conn, b.data, capacity, tag, &done, size);
    if (st != WIA_SUCCESS || done) return st;
    s.progress();
    if (s.wait_budget_ms() <= 0) s.fail(call + ": the peer's message never arrived");
  }
}

constexpr int kInlineMessages = 24;
std::uint64_t inline_size(int i) {
  static const std::uint64_t kSizes[] = {24, 0, 200 * 1024 + 3, 1000};
  return kSizes[i % 4];
}
std::uint64_t inline_tag(int i) { return (i / 2) % 2 == 0 ? 5 : 6; }

// Inline and request-based messages mixed on one connection keep the
// per-tag order; a receive declined by recv_inline is taken by irecv; an
// irecv of the tag still pending makes recv_inline decline.
void inline_order(Context& c) {
  require_inline(c);
  run_pair(c, [](Side& s) {
    wia_conn_t conn = s.connect_pair(0x1e1);
    if (s.role == 1) {
      std::vector<Request*> sends;
      s.barrier("first receive posted");
      for (int i = 0; i < kInlineMessages; ++i) {
        const std::uint64_t n = inline_size(i);
        Buffer& out = s.buffer(n);
        fill_pattern(out.data, n, 3000 + static_cast<std::uint32_t>(i));
        // Large ones by isend: send_inline is for small messages.
        Request* r = n > 4096 ? s.isend(conn, out, 0, n, inline_tag(i))
                              : send_small(s, conn, out, n, inline_tag(i));
        if (r != nullptr) sends.push_back(r);
      }
      s.wait_all_ok(sends);
      s.barrier("all received");
      return;
    }
    // The first message of tag 6 goes to an irecv posted before anything
    // was sent; recv_inline of tag 6 must then decline.
    const std::uint64_t cap = 200 * 1024 + 64;
    int first6 = 0;
    while (inline_tag(first6) != 6) ++first6;
    Buffer& early = s.buffer(cap);
    std::memset(early.data, kUntouched, cap);
    Request* early_recv = s.irecv(conn, early, 0, cap, 6);
    s.barrier("first receive posted");
    {
      Buffer& probe = s.buffer(cap);
      std::int32_t done = 0;
      std::uint64_t size = 0;
      s.c.step("recv_inline(tag 6) with an irecv of tag 6 pending");
      const wia_status_t st =
          s.ops.recv_inline(s.c.ctx(), conn, probe.data, cap, 6, &done, &size);
      s.c.expect(st == WIA_ERROR_NOT_SUPPORTED && done == 0,
                 "recv_inline to decline (WIA_ERROR_NOT_SUPPORTED) while an irecv of its tag is "
                 "pending",
                 status_text(st) + (done ? ", done = 1" : ""));
    }
    s.wait_ok(early_recv);
    check_message(s, early_recv, early, 0, inline_size(first6), cap,
                  3000 + static_cast<std::uint32_t>(first6));
    // Tag 6 first, then tag 5: every message of a tag in its send order.
    for (std::uint64_t tag : {6, 5})
      for (int i = 0; i < kInlineMessages; ++i) {
        if (inline_tag(i) != tag || i == first6) continue;
        const std::uint64_t want = inline_size(i);
        const auto seed = 3000 + static_cast<std::uint32_t>(i);
        Buffer& in = s.buffer(cap);
        std::memset(in.data, kUntouched, cap);
        std::uint64_t size = 0;
        const wia_status_t st = recv_small(s, conn, in, cap, tag, &size);
        if (st == WIA_ERROR_NOT_SUPPORTED) {
          Request* r = s.irecv(conn, in, 0, cap, tag);
          s.wait_ok(r);
          check_message(s, r, in, 0, want, cap, seed);
          continue;
        }
        s.c.ok(st, "recv_inline(tag " + hex(tag) + ")");
        Request shown;
        shown.what = "recv_inline of message #" + std::to_string(i) + " (tag " + hex(tag) + ")";
        shown.size = size;
        check_message(s, &shown, in, 0, want, cap, seed);
      }
    s.barrier("all received");
  });
}

// A message larger than recv_inline's buffer fails that call with
// WIA_ERROR_REMOTE and writes nothing past the buffer; the next one
// arrives. Twice: messages the transport already buffered when recv_inline
// is called (a later message of another tag was received first), and
// messages that arrive while it polls (a provider may take the two cases
// by different code).
void inline_truncate(Context& c) {
  require_inline(c);
  constexpr std::uint64_t kBig = 100, kSmall = 24, kCap = 50, kGuard = 4096;
  run_pair(c, [&](Side& s) {
    wia_conn_t conn = s.connect_pair(0x1e2);
    for (const bool arrived_first : {true, false}) {
      const std::string round = arrived_first ? "sent before the receive" : "sent while polling";
      if (s.role == 1) {
        if (!arrived_first) {
          s.barrier(round);
          usleep(20000);  // the receiver is polling by now
        }
        std::vector<Request*> sends;
        for (std::uint64_t n : {kBig, kSmall}) {
          Buffer& out = s.buffer(n);
          fill_pattern(out.data, n, static_cast<std::uint32_t>(n));
          if (Request* r = send_small(s, conn, out, n, 9)) sends.push_back(r);
        }
        Buffer& marker = s.buffer(1);
        if (arrived_first) sends.push_back(s.isend(conn, marker, 0, 1, 10));
        // The sender's outcome of a truncated message is unspecified.
        for (Request* r : sends) s.wait(r);
        if (arrived_first) s.barrier(round);
        s.barrier(round + ": done");
        continue;
      }
      s.barrier(round);
      if (arrived_first) {  // taking the marker makes the transport buffer what came before it
        Buffer& marker = s.buffer(1);
        s.wait_ok(s.irecv(conn, marker, 0, 1, 10));
      }
      Buffer& in = s.buffer(kCap + kGuard);
      std::memset(in.data, kUntouched, in.size);
      std::uint64_t size = 0;
      wia_status_t st = recv_small(s, conn, in, kCap, 9, &size);
      if (st == WIA_ERROR_NOT_SUPPORTED) st = s.wait(s.irecv(conn, in, 0, kCap, 9, &st));
      s.c.expect(st == WIA_ERROR_REMOTE,
                 round + ": a " + size_text(kBig) + " message into a " + size_text(kCap) +
                     " recv_inline buffer to fail with WIA_ERROR_REMOTE",
                 status_text(st));
      const std::string over = check_fill(in.data + kCap, kGuard, kUntouched);
      s.c.expect(over.empty(), round + ": nothing written past the receive buffer", over);
      Buffer& next = s.buffer(kCap);
      std::memset(next.data, kUntouched, kCap);
      st = recv_small(s, conn, next, kCap, 9, &size);
      if (st == WIA_ERROR_NOT_SUPPORTED) {
        Request* r = s.irecv(conn, next, 0, kCap, 9);
        s.wait_ok(r);
        size = r->size;
      } else {
        s.c.ok(st, "recv_inline of the message after the truncated one");
      }
      Request shown;
      shown.what = round + ": the message after the truncated one";
      shown.size = size;
      check_message(s, &shown, next, 0, kSmall, kCap, static_cast<std::uint32_t>(kSmall));
      s.barrier(round + ": done");
    }
  });
}

// --- L4.close.pending -------------------------------------------------------------------------

void close_pending(Context& c) {
  run_pair(c, [](Side& s) {
    wia_conn_t conn = s.connect_pair(1);
    if (s.role == 0) {
      std::vector<Buffer*> bufs;
      for (int t = 1; t <= 4; ++t) {
        Buffer& in = s.buffer(1ull << 20);
        bufs.push_back(&in);
        s.irecv(conn, in, 0, in.size, t);
      }
      Buffer& big = s.buffer(16ull << 20);
      fill_pattern(big.data, big.size, 5);
      bufs.push_back(&big);
      s.isend(conn, big, 0, big.size, 50);  // never received
      s.barrier("posted");
      s.close_conn(conn);
      // After close the provider must not touch those buffers: unmapped,
      // any access is a crash.
      for (Buffer* b : bufs) s.unmap(*b);
      s.barrier("closed");
    } else {
      Buffer& in = s.buffer(1ull << 20);
      Request* r = s.irecv(conn, in, 0, in.size, 9);
      Buffer& out = s.buffer(4ull << 20);
      Request* w = s.isend(conn, out, 0, out.size, 11);
      s.barrier("posted");
      s.barrier("closed");
      s.c.step("connector: waiting for the pending irecv to fail after the listener's close");
      const wia_status_t st = s.wait(r);
      s.c.expect(
          st < 0,
          "a receive pending when the other side closed the connection to fail "
          "(WIA_ERROR_REMOTE)",
          st == WIA_IN_PROGRESS ? "still pending at the end of the test's time" : status_text(st));
      s.c.step("connector: waiting for the pending isend to end");
      s.c.expect(s.wait(w) != WIA_IN_PROGRESS,
                 "a send pending when the other side closed to end (done or failed)",
                 "still pending at the end of the test's time");
      s.close_conn(conn, false);
    }
    // The provider is still usable: a fresh connection carries a message.
    wia_conn_t again = s.connect_pair(2);
    Buffer& in = s.buffer(4096);
    std::memset(in.data, kUntouched, in.size);
    Buffer& out = s.buffer(4000);
    fill_pattern(out.data, 4000, 90 + s.role);
    Request* r = s.irecv(again, in, 0, 4096, 5);
    Request* w = s.isend(again, out, 0, 4000, 5);
    s.wait_all_ok({w, r});
    check_message(s, r, in, 0, 4000, 4096, 90 + (1 - s.role));
    s.barrier("done");
  });
}

// --- L4.close.delivers ------------------------------------------------------------------

// A connection is reliable: a send reported done is delivered even when
// its side closes the connection right after.
void close_delivers(Context& c) {
  const std::uint64_t sizes[] = {100, 64 * 1024, 4ull << 20};
  run_pair(c, [&](Side& s) {
    wia_conn_t conn = s.connect_pair(0xc105e);
    if (s.role == 1) {
      s.barrier("receives posted");
      std::vector<Request*> sends;
      for (std::size_t i = 0; i < 3; ++i) {
        Buffer& out = s.buffer(sizes[i]);
        fill_pattern(out.data, sizes[i], 300 + static_cast<std::uint32_t>(i));
        sends.push_back(s.isend(conn, out, 0, sizes[i], 20 + i));
      }
      s.wait_all_ok(sends);
      s.close_conn(conn);
      return;
    }
    std::vector<Request*> recvs;
    std::vector<Buffer*> bufs;
    for (std::size_t i = 0; i < 3; ++i) {
      Buffer& in = s.buffer(sizes[i]);
      std::memset(in.data, kUntouched, in.size);
      bufs.push_back(&in);
      recvs.push_back(s.irecv(conn, in, 0, sizes[i], 20 + i));
    }
    s.barrier("receives posted");
    // Not waiting for the close: the sends may need this side's progress.
    for (std::size_t i = 0; i < 3; ++i) {
      s.c.step("listener: waiting for " + recvs[i]->what);
      const wia_status_t st = s.wait(recvs[i]);
      s.c.expect(
          st == WIA_SUCCESS,
          recvs[i]->what +
              " of a message whose send was done before the sender closed "
              "the connection to succeed",
          st == WIA_IN_PROGRESS ? "still pending at the end of the test's time" : status_text(st));
      check_message(s, recvs[i], *bufs[i], 0, sizes[i], sizes[i],
                    300 + static_cast<std::uint32_t>(i));
    }
    s.close_conn(conn, false);
  });
}

// --- L4.peer.exit / L4.peer.killed ------------------------------------------------------------

enum class Death { kExit, kKilled };

void peer_gone(Context& c, Death how) {
  run_pair(
      c,
      [how](Side& s) {
        wia_conn_t conn = s.connect_pair(0xdead);
        if (s.role == 1) {
          Buffer& in = s.buffer(4096);
          s.irecv(conn, in, 0, in.size, 1);
          s.barrier("posted");
          if (how == Death::kExit) _exit(0);  // no close, no fini
          // Busy inside the provider until the listener kills us.
          for (;;) {
            s.progress();
            usleep(100);
          }
        }
        Buffer& r1 = s.buffer(1ull << 20);
        Buffer& r2 = s.buffer(16);
        Buffer& big = s.buffer(16ull << 20);
        fill_pattern(big.data, big.size, 3);
        std::vector<Request*> recvs = {s.irecv(conn, r1, 0, r1.size, 1),
                                       s.irecv(conn, r2, 0, r2.size, 2)};
        Request* send = s.isend(conn, big, 0, big.size, 3);
        s.barrier("posted");
        const char* gone = how == Death::kExit ? "exited" : "was killed (SIGKILL)";
        if (how == Death::kKilled) {
          usleep(50 * 1000);
          s.c.step("listener: kill(peer, SIGKILL)");
          kill(s.peer_pid, SIGKILL);
        }
        for (Request* r : recvs) {
          s.c.step("listener: waiting for " + r->what + " to fail");
          const wia_status_t st = s.wait(r);
          s.c.expect(st == WIA_ERROR_REMOTE,
                     r->what + " pending when the peer " + gone + " to fail with " +
                         status_text(WIA_ERROR_REMOTE),
                     st == WIA_IN_PROGRESS ? "still pending at the end of the test's time"
                                           : status_text(st));
        }
        s.c.step("listener: waiting for " + send->what + " to end");
        const wia_status_t st = s.wait(send);
        s.c.expect(
            st == WIA_SUCCESS || st == WIA_ERROR_REMOTE,
            send->what + " to the peer that " + gone + " to end (done before, or WIA_ERROR_REMOTE)",
            st == WIA_IN_PROGRESS ? "still pending at the end of the test's time"
                                  : status_text(st));
        // Posting on a connection known to be broken fails too.
        wia_status_t post = WIA_SUCCESS;
        Request* late = s.irecv(conn, r2, 0, r2.size, 4, &post);
        if (late != nullptr) {
          s.c.step("listener: waiting for a receive posted after the peer died");
          post = s.wait(late);
        }
        s.c.expect(post < 0, "a receive posted after the peer " + std::string(gone) + " to fail",
                   post == WIA_IN_PROGRESS ? "still pending at the end of the test's time"
                                           : status_text(post));
        s.close_conn(conn, false);
      },
      PeerEnd::kDies);
}

void peer_exit(Context& c) { peer_gone(c, Death::kExit); }
void peer_killed(Context& c) { peer_gone(c, Death::kKilled); }

}  // namespace

void register_l4_tests(const wia_provider_v1_t* desc) {
  if ((desc->caps & WIA_PROVIDER_CAP_TRANSPORT) == 0) return;
  auto add = [](const char* id, int timeout_ms, const char* what, void (*fn)(Context&)) {
    registry().push_back({id, 4, timeout_ms, what, fn, {}});
  };
  add("L4.endpoint.props", 10000,
      "endpoint props: name, tag_bits 32..64, max_message_size, flags vs caps, short struct, "
      "bad index",
      endpoint_props);
  add("L4.connect.cookie", 20000,
      "two connects to one listener: accept returns each cookie with its own connection",
      connect_cookie);
  add("L4.connect.abandon", 20000,
      "a pending connect abandoned with close(); the listener then serves a new connect",
      connect_abandon);
  add("L4.send_recv.basic", 20000,
      "tagged message both ways; larger receive buffer; 0 bytes; unexpected message",
      send_recv_basic);
  add("L4.send_recv.sizes", 120000,
      "messages of 0 B .. 64 MiB both ways at once, data and reported size checked",
      send_recv_sizes);
  add("L4.send_recv.tag_order", 30000,
      "4 interleaved tags (up to tag_bits) x 16 messages: n-th send meets n-th receive per tag",
      send_recv_tag_order);
  add("L4.send_recv.many_outstanding", 30000,
      "300 receives and 300 sends outstanding on each side of one connection", send_recv_many);
  add("L4.send_recv.truncate", 20000,
      "a receive smaller than the message fails with REMOTE, writes nothing past its buffer",
      send_recv_truncate);
  add("L4.mr.register", 30000,
      "reg_mr/dereg_mr at odd offsets x 20; device memory refused; messages in registered memory",
      mr_register);
  add("L4.rma.put_get", 20000, "put visible before a later message; get of two ranges (CAP_RMA)",
      rma_put_get);
  add("L4.inline.order", 30000,
      "send_inline/recv_inline mixed with isend/irecv keep per-tag order; recv_inline declines "
      "with an irecv of its tag pending (CAP_INLINE)",
      inline_order);
  add("L4.inline.truncate", 20000,
      "recv_inline of a message larger than its buffer: WIA_ERROR_REMOTE, nothing written past "
      "it, the next message arrives (CAP_INLINE)",
      inline_truncate);
  add("L4.wait_fd.wakes", 30000,
      "a receiver that tests only when poll(2) on wait_fds wakes it gets a small and a 16 MiB "
      "message; the descriptors stay quiet while nothing is due (CAP_WAIT_FD)",
      wait_fd_wakes);
  add("L4.close.pending", 20000,
      "close with pending requests: released, buffers untouched, peer's requests fail",
      close_pending);
  add("L4.close.delivers", 20000, "sends done, then close(): the receiver still gets every message",
      close_delivers);
  add("L4.peer.exit", 20000,
      "peer _exit()s: pending requests fail with WIA_ERROR_REMOTE, later posts fail", peer_exit);
  add("L4.peer.killed", 20000,
      "peer SIGKILLed inside test(): pending requests fail with WIA_ERROR_REMOTE", peer_killed);
}

}  // namespace wia::conformance
