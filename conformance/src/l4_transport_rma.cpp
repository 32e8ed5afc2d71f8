// SPDX-License-Identifier: Apache-2.0
// Level 4, memory registration (L4.mr.register) and one-sided access
// (L4.rma.put_get, CAP_RMA).
#include <cstring>
#include <string>

#include "l4_transport.hpp"

namespace wia::conformance::l4 {

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
    if ((s.props.flags & WIA_TRANSPORT_FLAG_RMA) == 0) {
      // put/get exist but not on this endpoint: they must say so.
      wia_conn_t conn = s.connect_pair(0x4b);
      Buffer& b = s.buffer(4096, true);
      std::uint8_t rkey[WIA_RKEY_SIZE] = {};
      wia_request_t h = nullptr;
      s.c.step("put on an endpoint without FLAG_RMA");
      const wia_status_t st = s.ops.put(s.c.ctx(), conn, b.data, 64, b.mr, 0, rkey, &h);
      const std::string text = s.c.take_error();
      s.c.expect(st < 0 && h == nullptr, "put to be refused on an endpoint without FLAG_RMA",
                 status_text(st));
      s.c.expect(!text.empty(), "the refusal explained through host->set_error", "no message");
      s.barrier("done");
      throw Skip("endpoint " + std::to_string(s.endpoint) +
                 " has no WIA_TRANSPORT_FLAG_RMA (refusal checked)");
    }
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

}  // namespace wia::conformance::l4
