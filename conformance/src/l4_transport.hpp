// SPDX-License-Identifier: Apache-2.0
// Level 4: the transport interface, between two processes (the test's child
// and a peer it forks, see transport_pair.hpp). The tests live in one file
// per subject; this header declares them for register_l4_tests()
// (l4_transport.cpp) and holds the helpers they share:
//   l4_transport_connect.cpp      endpoint properties; listen/connect/accept
//                                 with cookies; an abandoned connect
//   l4_transport_messages.cpp     tagged messages: sizes, per-tag order, many
//                                 outstanding, truncation
//   l4_transport_rma.cpp          memory registration and RMA
//   l4_transport_inline_wait.cpp  wait descriptors; inline send/receive
//   l4_transport_teardown.cpp     close, and peers that disappear
#pragma once

#include <cstdint>
#include <string>

#include "harness.hpp"
#include "transport_pair.hpp"

namespace wia::conformance::l4 {

inline constexpr std::uint8_t kUntouched = 0xEE;  // receive buffers start with this

// "0x1f": tags, cookies and flags in messages.
std::string hex(std::uint64_t v);

// Checks a received message: reported size, payload, and that the bytes of
// the buffer past the message were not written.
void check_message(Side& s, const Request* r, const Buffer& b, std::uint64_t offset,
                   std::uint64_t want_size, std::uint64_t capacity, std::uint32_t seed);

// The tests, in the order register_l4_tests() registers them.
void endpoint_props(Context& c);  // l4_transport_connect.cpp
void connect_cookie(Context& c);
void connect_abandon(Context& c);
void send_recv_basic(Context& c);  // l4_transport_messages.cpp
void send_recv_sizes(Context& c);
void send_recv_tag_order(Context& c);
void send_recv_many(Context& c);
void send_recv_truncate(Context& c);
void mr_register(Context& c);  // l4_transport_rma.cpp
void rma_put_get(Context& c);
void inline_order(Context& c);  // l4_transport_inline_wait.cpp
void inline_truncate(Context& c);
void wait_fd_wakes(Context& c);
void close_pending(Context& c);  // l4_transport_teardown.cpp
void close_delivers(Context& c);
void peer_exit(Context& c);
void peer_killed(Context& c);

}  // namespace wia::conformance::l4
