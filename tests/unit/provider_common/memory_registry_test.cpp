// SPDX-License-Identifier: Apache-2.0
// wia_common/memory_registry.hpp: the table of what cuda, hip and ze handed
// out, and the range a dma-buf export covers.
#include "wia_common/memory_registry.hpp"

#include <doctest/doctest.h>
#include <unistd.h>

#include <cstdint>
#include <string>
#include <vector>

namespace {

using wia::common::Allocation;
using wia::common::DmabufRange;
using wia::common::MemoryRegistry;

bool contains(const std::string& s, const char* what) { return s.find(what) != std::string::npos; }

void* at(std::uintptr_t a) { return reinterpret_cast<void*>(a); }

const std::uint64_t kPage = static_cast<std::uint64_t>(::sysconf(_SC_PAGESIZE));

}  // namespace

TEST_CASE("memory registry: mem_free takes a live allocation once, of its own device") {
  MemoryRegistry r("TEST");
  r.add(at(0x10000), Allocation{1, WIA_MEM_DEVICE, 100});
  Allocation a;
  CHECK(contains(r.take(at(0x10000), 0, &a), "belongs to TEST device 1"));
  CHECK(contains(r.take(at(0x10010), 1, &a), "is not a live allocation"));
  CHECK(r.take(at(0x10000), 1, &a).empty());
  CHECK(a.size == 100);
  CHECK(a.kind == WIA_MEM_DEVICE);
  CHECK(contains(r.take(at(0x10000), 1, &a), "already freed"));
  // A mapping of ipc_open_handle is named as such, and not freed.
  r.add_import(at(0x20000), 0);
  CHECK(contains(r.take(at(0x20000), 0, &a), "was mapped by ipc_open_handle"));
}

TEST_CASE("memory registry: ipc_get_handle exports only the start of a device allocation") {
  MemoryRegistry r("TEST");
  r.add(at(0x10000), Allocation{0, WIA_MEM_DEVICE, 100});
  r.add(at(0x20000), Allocation{0, WIA_MEM_HOST_PINNED, 100});
  Allocation a;
  CHECK(r.find_device_start(at(0x10000), 0, &a).empty());
  CHECK(contains(r.find_device_start(at(0x10001), 0, &a), "is not the start of a live device"));
  CHECK_FALSE(r.find_device_start(at(0x10000), 1, &a).empty());
  CHECK_FALSE(r.find_device_start(at(0x20000), 0, &a).empty());
}

TEST_CASE("memory registry: imports are counted per open and per device") {
  MemoryRegistry r("TEST");
  r.add_import(at(0x30000), 2);
  r.add_import(at(0x30000), 2);
  CHECK(contains(r.release_import(at(0x30000), 1), "was not opened by ipc_open_handle"));
  CHECK(r.release_import(at(0x30000), 2).empty());
  CHECK(r.release_import(at(0x30000), 2).empty());
  CHECK_FALSE(r.release_import(at(0x30000), 2).empty());
}

TEST_CASE(
    "memory registry: a dma-buf export covers the page-rounded allocation holding the range") {
  MemoryRegistry r("TEST");
  const std::uintptr_t base = 0x100000;
  const std::uint64_t size = 3 * kPage + 100;
  r.add(at(base), Allocation{0, WIA_MEM_DEVICE, size});
  r.add(at(base + 16 * kPage), Allocation{0, WIA_MEM_DEVICE, 0});  // size 0: one byte
  r.add(at(base + 32 * kPage), Allocation{0, WIA_MEM_HOST_PINNED, kPage});
  DmabufRange d;
  REQUIRE(r.find_dmabuf_range(at(base + kPage + 100), 1000, 0, &d).empty());
  CHECK(d.base == base);
  CHECK(d.offset == kPage + 100);
  CHECK(d.span == 4 * kPage);
  CHECK(d.allocation.size == size);
  // Up to the last byte, not one past it; not on another device.
  CHECK(r.find_dmabuf_range(at(base + 10), size - 10, 0, &d).empty());
  CHECK(contains(r.find_dmabuf_range(at(base + 10), size - 9, 0, &d), "is not inside one live"));
  CHECK_FALSE(r.find_dmabuf_range(at(base), 1, 1, &d).empty());
  // Between allocations, before the first, in pinned host memory: refused.
  CHECK_FALSE(r.find_dmabuf_range(at(base + 8 * kPage), 1, 0, &d).empty());
  CHECK_FALSE(r.find_dmabuf_range(at(base - 1), 1, 0, &d).empty());
  CHECK_FALSE(r.find_dmabuf_range(at(base + 32 * kPage), 1, 0, &d).empty());
  // A size-0 allocation owns its one byte, of which an empty range exports.
  REQUIRE(r.find_dmabuf_range(at(base + 16 * kPage), 0, 0, &d).empty());
  CHECK(d.span == kPage);
  CHECK_FALSE(r.find_dmabuf_range(at(base + 16 * kPage + 1), 0, 0, &d).empty());
}

TEST_CASE("memory registry: the dma-buf out-parameters are reset, or the NULL one named") {
  std::int32_t fd = 7;
  std::uint64_t offset = 9;
  CHECK(wia::common::reset_dmabuf_out(&fd, &offset) == nullptr);
  CHECK(fd == -1);
  CHECK(offset == 0);
  CHECK(std::string(wia::common::reset_dmabuf_out(nullptr, &offset)) == "fd");
  CHECK(std::string(wia::common::reset_dmabuf_out(&fd, nullptr)) == "offset");
}

TEST_CASE("memory registry: fini hands every allocation and mapping over once, then forgets them") {
  MemoryRegistry r("TEST");
  r.add(at(0x10000), Allocation{0, WIA_MEM_DEVICE, 1});
  r.add(at(0x20000), Allocation{1, WIA_MEM_HOST_PINNED, 2});
  r.add_import(at(0x30000), 1);
  r.add_import(at(0x30000), 1);
  std::vector<std::uintptr_t> freed;
  std::uint32_t closes = 0;
  const std::size_t leaked =
      r.release_all([&](std::uintptr_t addr, const Allocation&) { freed.push_back(addr); },
                    [&](std::uintptr_t addr, std::int32_t device, std::uint32_t opens) {
                      CHECK(addr == 0x30000);
                      CHECK(device == 1);
                      closes += opens;
                    });
  CHECK(leaked == 2);
  CHECK(freed.size() == 2);
  CHECK(closes == 2);
  Allocation a;
  CHECK_FALSE(r.take(at(0x10000), 0, &a).empty());
  CHECK(r.release_all([](std::uintptr_t, const Allocation&) {},
                      [](std::uintptr_t, std::int32_t, std::uint32_t) {}) == 0);
}
