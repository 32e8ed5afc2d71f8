// SPDX-License-Identifier: Apache-2.0
// What an accelerator provider (cuda, hip, ze) handed out: mem_alloc's
// allocations and ipc_open_handle's mappings, by address, with the checks
// each entry makes against them and the words of its refusals. The three
// providers kept the same two maps, the same lookups and the same messages,
// each in its own copy; the vendor calls (allocate, free, export, map)
// stay in the providers.
//
// Thread-safe: every member takes the registry's mutex; none calls out
// while holding it, except release_all (at fini, when nothing else runs).
#pragma once

#include <wia/provider.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace wia::common {

// What mem_alloc handed out: mem_free tells device from pinned memory by
// it, ipc_get_handle carries the size to the importer.
struct Allocation {
  std::int32_t device = 0;
  std::uint32_t kind = WIA_MEM_DEVICE;
  std::uint64_t size = 0;  // bytes asked for (0 allocates 1)
};

// What mem_export_dmabuf exports for a pointer: the whole allocation
// holding it, from its start, rounded up to a page (vendors export
// page-aligned ranges only; their allocations start on a page and are
// mapped in pages, so the rounding stays inside what they mapped).
struct DmabufRange {
  std::uintptr_t base = 0;   // the allocation's start
  std::uint64_t span = 0;    // bytes to export: the allocation's size up to a page
  std::uint64_t offset = 0;  // where the pointer lies in the dma-buf
  Allocation allocation;
};

// mem_export_dmabuf's out-parameters, set to "nothing exported" (-1, 0)
// before anything can fail: NULL, or the name of the one that is NULL.
const char* reset_dmabuf_out(std::int32_t* fd, std::uint64_t* offset) noexcept;

class MemoryRegistry {
 public:
  // `vendor` names the provider's devices in refusals: "CUDA" gives
  // "belongs to CUDA device 1".
  explicit MemoryRegistry(const char* vendor) : vendor_(vendor) {}
  MemoryRegistry(const MemoryRegistry&) = delete;
  MemoryRegistry& operator=(const MemoryRegistry&) = delete;

  // mem_alloc: records a new allocation at `ptr`. May throw std::bad_alloc
  // (the caller frees the vendor memory and rethrows).
  void add(void* ptr, const Allocation& a);

  // mem_free: when `ptr` starts a live allocation of `dev`, removes it,
  // sets *out and returns ""; otherwise returns why not ("%p was mapped by
  // ipc_open_handle; ...", "is not a live allocation ...", "belongs to ...").
  std::string take(void* ptr, std::int32_t dev, Allocation* out);

  // ipc_get_handle: "" and *out when `ptr` starts a live WIA_MEM_DEVICE
  // allocation of `dev`, otherwise why not.
  std::string find_device_start(void* ptr, std::int32_t dev, Allocation* out) const;

  // mem_export_dmabuf: "" and *out (pages of sysconf(_SC_PAGESIZE)) when
  // [ptr, ptr + size) lies inside one live WIA_MEM_DEVICE allocation of
  // `dev`, otherwise why not.
  std::string find_dmabuf_range(const void* ptr, std::uint64_t size, std::int32_t dev,
                                DmabufRange* out) const;

  // ipc_open_handle: one more open of the mapping at `ptr` (vendors return
  // the same pointer for a handle opened twice and count; so do we). May
  // throw std::bad_alloc.
  void add_import(void* ptr, std::int32_t dev);

  // ipc_close_handle: one open fewer; "" or why not (not opened on `dev`).
  std::string release_import(void* ptr, std::int32_t dev);

  // fini: hands every allocation to free_allocation(address, Allocation)
  // and every mapping to close_import(address, device, opens), and forgets
  // them all. Returns how many allocations were never freed.
  template <class FreeAllocation, class CloseImport>
  std::size_t release_all(FreeAllocation&& free_allocation, CloseImport&& close_import) noexcept {
    std::lock_guard<std::mutex> lk(mu_);
    const std::size_t leaked = allocations_.size();
    for (const auto& [addr, a] : allocations_) free_allocation(addr, a);
    allocations_.clear();
    for (const auto& [addr, import] : imports_) close_import(addr, import.device, import.opens);
    imports_.clear();
    return leaked;
  }

 private:
  struct Import {
    std::int32_t device = 0;
    std::uint32_t opens = 0;
  };
  const char* vendor_;
  mutable std::mutex mu_;
  std::map<std::uintptr_t, Allocation> allocations_;  // by start, ordered: interior pointers
  std::unordered_map<std::uintptr_t, Import> imports_;
};

}  // namespace wia::common
