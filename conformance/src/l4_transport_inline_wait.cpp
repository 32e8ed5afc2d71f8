// SPDX-License-Identifier: Apache-2.0
// Level 4, the paths the core uses to stay off the request machinery and
// off the CPU: a receiver woken only by poll(2) on the wait descriptors
// (L4.wait_fd.wakes, CAP_WAIT_FD), and small messages sent and received
// inline (L4.inline.*, CAP_INLINE).
#include <poll.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <vector>

#include "l4_transport.hpp"

namespace wia::conformance::l4 {

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
  if (!WIA_ABI_HAS_FIELD(wia_transport_ops_v1_t, o.struct_size, wait_fds) || o.wait_fds == nullptr)
    c.fail(
        "the transport table claims WIA_TRANSPORT_CAP_WAIT_FD but wait_fds is missing "
        "(struct_size " +
        std::to_string(o.struct_size) + ")");
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
      const wia_status_t st =
          s.ops.wait_fds(s.c.ctx(), conn, fds.data(), WIA_TRANSPORT_WAIT_FDS_MAX, &count);
      if (st == WIA_IN_PROGRESS) return 0;
      s.c.ok(st, "wait_fds");
      if (count == 0 || count > WIA_TRANSPORT_WAIT_FDS_MAX)
        s.fail("wait_fds returned WIA_SUCCESS with " + std::to_string(count) + " entries (1.." +
               std::to_string(WIA_TRANSPORT_WAIT_FDS_MAX) + " expected)");
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

namespace {

// --- L4.inline.order, L4.inline.truncate (CAP_INLINE) -----------------------------------------

void require_inline(Context& c) {
  const auto& o = c.tp_ops();
  if ((o.caps & WIA_TRANSPORT_CAP_INLINE) == 0)
    throw Skip("provider does not claim WIA_TRANSPORT_CAP_INLINE");
  if (!WIA_ABI_HAS_FIELD(wia_transport_ops_v1_t, o.struct_size, recv_inline) ||
      o.send_inline == nullptr || o.recv_inline == nullptr)
    c.fail(
        "the transport table claims WIA_TRANSPORT_CAP_INLINE but send_inline or recv_inline "
        "is missing (struct_size " +
        std::to_string(o.struct_size) + ")");
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
    const wia_status_t st = s.ops.recv_inline(s.c.ctx(), conn, b.data, capacity, tag, &done, size);
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

}  // namespace

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
      const wia_status_t st = s.ops.recv_inline(s.c.ctx(), conn, probe.data, cap, 6, &done, &size);
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

}  // namespace wia::conformance::l4
