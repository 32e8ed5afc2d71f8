// SPDX-License-Identifier: Apache-2.0
// Level 4's registration and the helpers its test files share
// (l4_transport.hpp).
#include "l4_transport.hpp"

#include <cinttypes>
#include <cstdio>

namespace wia::conformance {

namespace l4 {

std::string hex(std::uint64_t v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "0x%" PRIx64, v);
  return buf;
}

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

}  // namespace l4

void register_l4_tests(const wia_provider_v1_t* desc) {
  if ((desc->caps & WIA_PROVIDER_CAP_TRANSPORT) == 0) return;
  auto add = [](const char* id, int timeout_ms, const char* what, void (*fn)(Context&)) {
    registry().push_back({id, 4, timeout_ms, what, fn, {}});
  };
  add("L4.endpoint.props", 10000,
      "endpoint props: name, tag_bits 32..64, max_message_size, flags vs caps, short struct, "
      "bad index",
      l4::endpoint_props);
  add("L4.connect.cookie", 20000,
      "two connects to one listener: accept returns each cookie with its own connection",
      l4::connect_cookie);
  add("L4.connect.abandon", 20000,
      "a pending connect abandoned with close(); the listener then serves a new connect",
      l4::connect_abandon);
  add("L4.send_recv.basic", 20000,
      "tagged message both ways; larger receive buffer; 0 bytes; unexpected message",
      l4::send_recv_basic);
  add("L4.send_recv.sizes", 120000,
      "messages of 0 B .. 64 MiB both ways at once, data and reported size checked",
      l4::send_recv_sizes);
  add("L4.send_recv.tag_order", 30000,
      "4 interleaved tags (up to tag_bits) x 16 messages: n-th send meets n-th receive per tag",
      l4::send_recv_tag_order);
  add("L4.send_recv.many_outstanding", 30000,
      "300 receives and 300 sends outstanding on each side of one connection", l4::send_recv_many);
  add("L4.send_recv.truncate", 20000,
      "a receive smaller than the message fails with REMOTE, writes nothing past its buffer",
      l4::send_recv_truncate);
  add("L4.mr.register", 30000,
      "reg_mr/dereg_mr at odd offsets x 20; device memory refused; messages in registered memory",
      l4::mr_register);
  add("L4.rma.put_get", 20000, "put visible before a later message; get of two ranges (CAP_RMA)",
      l4::rma_put_get);
  add("L4.inline.order", 30000,
      "send_inline/recv_inline mixed with isend/irecv keep per-tag order; recv_inline declines "
      "with an irecv of its tag pending (CAP_INLINE)",
      l4::inline_order);
  add("L4.inline.truncate", 20000,
      "recv_inline of a message larger than its buffer: WIA_ERROR_REMOTE, nothing written past "
      "it, the next message arrives (CAP_INLINE)",
      l4::inline_truncate);
  add("L4.wait_fd.wakes", 30000,
      "a receiver that tests only when poll(2) on wait_fds wakes it gets a small and a 16 MiB "
      "message; the descriptors stay quiet while nothing is due (CAP_WAIT_FD)",
      l4::wait_fd_wakes);
  add("L4.close.pending", 20000,
      "close with pending requests: released, buffers untouched, peer's requests fail",
      l4::close_pending);
  add("L4.close.delivers", 20000, "sends done, then close(): the receiver still gets every message",
      l4::close_delivers);
  add("L4.peer.exit", 20000,
      "peer _exit()s: pending requests fail with WIA_ERROR_REMOTE, later posts fail",
      l4::peer_exit);
  add("L4.peer.killed", 20000,
      "peer SIGKILLed inside test(): pending requests fail with WIA_ERROR_REMOTE", l4::peer_killed);
}

}  // namespace wia::conformance
