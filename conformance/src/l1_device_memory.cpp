// SPDX-License-Identifier: Apache-2.0
// Level 1: device memory. Content is only ever checked through the
// provider's own memcpy back to the host, so the tests hold for devices
// whose memory the host cannot read directly.
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "harness.hpp"

namespace wia::conformance {
namespace {

constexpr std::uint64_t kMiB = 1ull << 20;

std::uint32_t alignment_of(Context& c, int dev) {
  wia_device_props_v1_t p{};
  p.struct_size = sizeof(p);
  c.ok(c.dev_ops().device_props(c.ctx(), dev, &p), "device_props");
  return p.alignment == 0 ? 1 : p.alignment;
}

void alloc_sizes(Context& c) {
  const int dev = c.device();
  const std::uint32_t align = alignment_of(c, dev);
  void* zero[2] = {};
  for (const std::uint64_t size :
       {std::uint64_t{0}, std::uint64_t{1}, std::uint64_t{4095}, kMiB, 64 * kMiB}) {
    void* p = c.alloc(size, dev);
    c.expect(reinterpret_cast<std::uintptr_t>(p) % align == 0,
             "mem_alloc(" + size_text(size) + ") aligned to " + std::to_string(align),
             "an address " + std::to_string(reinterpret_cast<std::uintptr_t>(p) % align) +
                 " bytes past a multiple");
    if (size == 0) zero[0] = p;
    c.free(p, dev);
  }
  // Two live zero-size allocations are distinct (provider.h, mem_alloc).
  zero[0] = c.alloc(0, dev);
  zero[1] = c.alloc(0, dev);
  c.expect(zero[0] != zero[1], "two live zero-size allocations at distinct addresses",
           "the same address twice");
  c.free(zero[0], dev);
  c.free(zero[1], dev);
}

void alloc_alignment(Context& c) {
  const int dev = c.device();
  const std::uint32_t align = alignment_of(c, dev);
  std::vector<void*> ptrs;
  for (std::uint64_t size = 1; size <= 8193; size = size * 3 + 1) {
    void* p = c.alloc(size, dev);
    c.expect(reinterpret_cast<std::uintptr_t>(p) % align == 0,
             "every allocation aligned to the reported " + std::to_string(align) + " bytes",
             "mem_alloc(" + size_text(size) + ") misaligned by " +
                 std::to_string(reinterpret_cast<std::uintptr_t>(p) % align));
    ptrs.push_back(p);
  }
  for (void* p : ptrs) c.free(p, dev);
}

void alloc_pinned(Context& c) {
  c.require_cap(WIA_DEVICE_CAP_PINNED_HOST, "WIA_DEVICE_CAP_PINNED_HOST");
  const int dev = c.device();
  auto* p = static_cast<std::uint8_t*>(c.alloc(kMiB + 3, dev, WIA_MEM_HOST_PINNED));
  // Pinned host memory is host memory: the host writes it directly, and the
  // device copies from it.
  fill_pattern(p, kMiB + 3, 11);
  void* d = c.alloc(kMiB + 3, dev);
  c.to_device(d, p, kMiB + 3, dev);
  std::memset(p, 0, kMiB + 3);
  c.to_host(p, d, kMiB + 3, dev);
  const std::string bad = check_pattern(p, kMiB + 3, 11);
  c.expect(bad.empty(), "pinned -> device -> pinned round trip intact", bad);
  c.free(d, dev);
  c.free(p, dev);
}

void double_free(Context& c) {
  const int dev = c.device();
  void* p = c.alloc(4096, dev);
  c.free(p, dev);
  c.step("mem_free of an already freed pointer");
  const wia_status_t st = c.dev_ops().mem_free(c.ctx(), dev, p);
  c.take_error();
  c.expect(st < 0, "a second mem_free of the same pointer to return an error", status_text(st));
}

void absurd_size(Context& c) {
  const int dev = c.device();
  void* p = nullptr;
  c.step("mem_alloc(1 << 62)");
  const wia_status_t st = c.dev_ops().mem_alloc(c.ctx(), dev, 1ull << 62, WIA_MEM_DEVICE, &p);
  c.take_error();
  if (st == WIA_SUCCESS) c.dev_ops().mem_free(c.ctx(), dev, p);
  c.expect(st == WIA_ERROR_OUT_OF_MEMORY || st == WIA_ERROR_INVALID_ARGUMENT,
           "mem_alloc(4 EiB) to return WIA_ERROR_OUT_OF_MEMORY or WIA_ERROR_INVALID_ARGUMENT",
           status_text(st));
}

void free_reuse(Context& c) {
  // Memory given back must be reusable: 100 rounds of 64 MiB exceed any
  // memory cap of a provider that leaks on mem_free.
  const int dev = c.device();
  for (int i = 0; i < 100; ++i) {
    void* p = nullptr;
    const wia_status_t st = c.dev_ops().mem_alloc(c.ctx(), dev, 64 * kMiB, WIA_MEM_DEVICE, &p);
    const std::string err = c.take_error();
    c.expect(
        st == WIA_SUCCESS,
        "100 rounds of mem_alloc(64 MiB) + mem_free to succeed (freed memory reusable)",
        "round " + std::to_string(i) + ": " + status_text(st) + (err.empty() ? "" : ": ") + err);
    c.ok(c.dev_ops().mem_free(c.ctx(), dev, p), "mem_free(64 MiB), round " + std::to_string(i));
  }
}

void memset_pattern(Context& c) {
  const int dev = c.device();
  const std::uint64_t size = kMiB + 5;
  auto* d = static_cast<std::uint8_t*>(c.alloc(size, dev));
  std::vector<std::uint8_t> h(size, 0);
  c.step("memset(value 0x1A5)");
  c.ok(c.dev_ops().memset(c.ctx(), dev, d, 0x1A5, size), "memset(value 0x1A5)");
  c.to_host(h.data(), d, size, dev);
  // The value is used as an unsigned char (provider.h, memset).
  std::string bad = check_fill(h.data(), size, 0xA5);
  c.expect(bad.empty(), "every byte 0xA5 after memset(value 0x1A5)", bad);
  // Unaligned interior: neighbours keep their value.
  c.step("memset(0x3C) at offset 3, 4093 bytes");
  c.ok(c.dev_ops().memset(c.ctx(), dev, d + 3, 0x3C, 4093), "memset(offset 3, 4093 B)");
  c.to_host(h.data(), d, size, dev);
  bad = check_fill(h.data(), 3, 0xA5) + check_fill(h.data() + 3, 4093, 0x3C) +
        check_fill(h.data() + 4096, size - 4096, 0xA5);
  c.expect(bad.empty(), "only [3, 4096) changed by memset(offset 3, 4093 B)", bad);
  c.step("memset(size 0)");
  c.ok(c.dev_ops().memset(c.ctx(), dev, d, 0x77, 0), "memset(size 0)");
}

// Host -> device -> host with a pattern; the host destination starts with
// other bytes so that "success without copying" cannot pass.
void roundtrip(Context& c, std::uint64_t size, std::uint32_t seed) {
  const int dev = c.device();
  std::vector<std::uint8_t> src(size), back(size);
  fill_pattern(src.data(), size, seed);
  fill_pattern(back.data(), size, seed + 1000);
  void* d = c.alloc(size, dev);
  c.to_device(d, src.data(), size, dev);
  c.to_host(back.data(), d, size, dev);
  const std::string bad = check_pattern(back.data(), size, seed);
  c.expect(bad.empty(), "host -> device -> host round trip of " + size_text(size) + " intact", bad);
  c.free(d, dev);
}

void memcpy_h2d(Context& c) {
  // Checked after a device-side memset so that h2d is what makes the bytes.
  const int dev = c.device();
  const std::uint64_t size = 65537;
  auto* d = c.alloc(size, dev);
  c.step("memset(0)");
  c.ok(c.dev_ops().memset(c.ctx(), dev, d, 0, size), "memset(0)");
  std::vector<std::uint8_t> src(size), back(size, 0);
  fill_pattern(src.data(), size, 21);
  c.to_device(d, src.data(), size, dev);
  c.to_host(back.data(), d, size, dev);
  const std::string bad = check_pattern(back.data(), size, 21);
  c.expect(bad.empty(), "device holds the bytes copied host -> device", bad);
}

void memcpy_d2h_pattern(Context& c) {
  const int dev = c.device();
  const std::uint64_t size = 65537;
  auto* d = c.alloc(size, dev);
  c.step("memset(0x5E)");
  c.ok(c.dev_ops().memset(c.ctx(), dev, d, 0x5E, size), "memset(0x5E)");
  std::vector<std::uint8_t> back(size);
  fill_pattern(back.data(), size, 3);
  c.to_host(back.data(), d, size, dev);
  const std::string bad = check_fill(back.data(), size, 0x5E);
  c.expect(bad.empty(), "host buffer holds the device's 0x5E bytes after device -> host", bad);
  roundtrip(c, 4099, 4);
}

void memcpy_d2d(Context& c) {
  const int dev = c.device();
  const std::uint64_t size = 3 * kMiB + 7;
  std::vector<std::uint8_t> src(size), back(size, 0);
  fill_pattern(src.data(), size, 31);
  void* a = c.alloc(size, dev);
  void* b = c.alloc(size, dev);
  c.step("memset(0)");
  c.ok(c.dev_ops().memset(c.ctx(), dev, b, 0, size), "memset(0)");
  c.to_device(a, src.data(), size, dev);
  c.step("memcpy device -> device " + size_text(size));
  c.ok(c.dev_ops().memcpy(c.ctx(), dev, b, a, size), "memcpy(device -> device)");
  c.to_host(back.data(), b, size, dev);
  const std::string bad = check_pattern(back.data(), size, 31);
  c.expect(bad.empty(), "device -> device copy of " + size_text(size) + " intact", bad);
}

void memcpy_unaligned(Context& c) {
  // Odd offsets and odd sizes in every direction: vector code paths with
  // head and tail handling are where copies go wrong.
  const int dev = c.device();
  const std::uint64_t cap = 8192 + 64;
  auto* a = static_cast<std::uint8_t*>(c.alloc(cap, dev));
  auto* b = static_cast<std::uint8_t*>(c.alloc(cap, dev));
  std::vector<std::uint8_t> host(cap), back(cap);
  std::uint32_t seed = 100;
  for (const std::uint64_t off : {1, 3, 7, 13}) {
    for (const std::uint64_t size : {1, 7, 63, 4097, 8191}) {
      ++seed;
      const std::string what = size_text(size) + " at offset " + std::to_string(off);
      fill_pattern(host.data() + off, size, seed);
      c.step("memset(0xEE)");
      c.ok(c.dev_ops().memset(c.ctx(), dev, a, 0xEE, cap), "memset(0xEE)");
      c.ok(c.dev_ops().memcpy(c.ctx(), dev, a + off, host.data() + off, size),
           "memcpy(host -> device, " + what + ")");
      c.step("memset(0xDD)");
      c.ok(c.dev_ops().memset(c.ctx(), dev, b, 0xDD, cap), "memset(0xDD)");
      c.ok(c.dev_ops().memcpy(c.ctx(), dev, b + off + 1, a + off, size),
           "memcpy(device -> device, " + what + ")");
      std::memset(back.data(), 0, cap);
      c.ok(c.dev_ops().memcpy(c.ctx(), dev, back.data() + off, b + off + 1, size),
           "memcpy(device -> host, " + what + ")");
      std::string bad = check_pattern(back.data() + off, size, seed);
      c.expect(bad.empty(), "h2d, d2d, d2h of " + what + " intact", bad);
      // Bytes around the copied range are untouched.
      c.to_host(back.data(), b, cap, dev);
      bad = check_fill(back.data(), off + 1, 0xDD) +
            check_fill(back.data() + off + 1 + size, cap - off - 1 - size, 0xDD);
      c.expect(bad.empty(), "no byte outside the destination range written (" + what + ")", bad);
    }
  }
  c.ok(c.dev_ops().memcpy(c.ctx(), dev, a, host.data(), 0), "memcpy(size 0)");
}

void memcpy_large(Context& c) {
  // Large copies take other paths (chunking, DMA engines, threads).
  roundtrip(c, 64 * kMiB + 3, 41);
}

}  // namespace

void register_l1_tests() {
  auto add = [](const char* id, int timeout_ms, const char* what, void (*fn)(Context&)) {
    registry().push_back({id, 1, timeout_ms, what, fn, {}});
  };
  add("L1.alloc.sizes", 20000, "mem_alloc/mem_free of 0, 1, 4095 B, 1 MiB, 64 MiB", alloc_sizes);
  add("L1.alloc.alignment", 10000, "allocations aligned to device_props.alignment",
      alloc_alignment);
  add("L1.alloc.pinned_host", 10000,
      "pinned host memory usable by host and device (CAP_PINNED_HOST)", alloc_pinned);
  add("L1.alloc.double_free", 10000, "a second mem_free of a pointer is an error, not a crash",
      double_free);
  add("L1.alloc.absurd_size", 10000, "mem_alloc(1 << 62) is OUT_OF_MEMORY or INVALID_ARGUMENT",
      absurd_size);
  add("L1.alloc.free_reuse", 60000, "100 x (alloc 64 MiB, free): freed memory is reusable",
      free_reuse);
  add("L1.memset.pattern", 10000, "memset uses value as unsigned char; exact range, size 0",
      memset_pattern);
  add("L1.memcpy.h2d", 10000, "host -> device copy lands on the device", memcpy_h2d);
  add("L1.memcpy.d2h_pattern", 10000, "device -> host copy brings the device's bytes",
      memcpy_d2h_pattern);
  add("L1.memcpy.d2d", 10000, "device -> device copy of 3 MiB + 7", memcpy_d2d);
  add("L1.memcpy.unaligned", 20000, "odd offsets and sizes, all directions, no overrun",
      memcpy_unaligned);
  add("L1.memcpy.large", 30000, "64 MiB + 3 round trip, tail included", memcpy_large);
}

}  // namespace wia::conformance
