// SPDX-License-Identifier: Apache-2.0
// Level 4, setting up: what an endpoint says about itself
// (L4.endpoint.props) and connections: listen/connect/accept with cookies,
// and a connect abandoned half-way (L4.connect.*).
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "l4_transport.hpp"

namespace wia::conformance::l4 {

namespace {

bool nul_terminated(const char* s, std::size_t cap) { return std::memchr(s, '\0', cap) != nullptr; }

}  // namespace

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
    // The table bit says put/get exist; the flag says this endpoint's
    // fabric can do them (a provider over several fabrics, like ofi, may
    // have endpoints without RMA).
    c.expect((p.flags & WIA_TRANSPORT_FLAG_RMA) == 0 || cap_rma,
             at + "WIA_TRANSPORT_FLAG_RMA only when the table claims WIA_TRANSPORT_CAP_RMA",
             "flag set, cap clear");
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

}  // namespace wia::conformance::l4
