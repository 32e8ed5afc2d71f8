// SPDX-License-Identifier: Apache-2.0
// Host memory of the `host` provider: the allocation backends (a memfd
// arena per device for exportable device memory, posix_memalign or mmap for
// pinned host memory), their NUMA and huge-page advice, and the memory
// entry points mem_alloc, mem_free, memset and memcpy.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstdlib>
#include <cstring>

#include "host_provider.hpp"
#include "wia_common/text.hpp"

// Not every libc names it yet.
#ifndef MPOL_PREFERRED
#define MPOL_PREFERRED 1
#endif

namespace wia::host {

using common::errno_text;

std::uint64_t page_size() {
  static const std::uint64_t n = [] {
    const long v = sysconf(_SC_PAGESIZE);
    return v > 0 ? static_cast<std::uint64_t>(v) : 4096u;
  }();
  return n;
}

void release(const Device& d, const Allocation& a) noexcept {
  switch (a.backing) {
    case Backing::kMalloc:
      std::free(a.base);
      break;
    case Backing::kAnon:
      munmap(a.base, a.map_len);
      break;
    case Backing::kArena:
      munmap(a.base, a.map_len);
      // Give the pages back now; the offset range is never reused. A
      // process that still maps this range through an IPC handle would
      // read zeros from here on: using exported memory after its owner
      // freed it is the caller's bug, as on CUDA.
      fallocate(d.arena_fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
                static_cast<off_t>(a.offset), static_cast<off_t>(a.map_len));
      break;
  }
}

wia_status_t explain_unknown_pointer(Provider& p, const char* call, std::int32_t dev,
                                     const void* ptr) {
  const auto addr = reinterpret_cast<std::uintptr_t>(ptr);
  for (const auto& other : p.devices) {
    std::lock_guard<std::mutex> lk(other->mu);
    if (other->index == dev && other->imports.count(ptr) != 0)
      return p.fail(WIA_ERROR_INVALID_ARGUMENT,
                    "%s on host device %d: %p was mapped by ipc_open_handle; release it with "
                    "ipc_close_handle",
                    call, dev, ptr);
    for (const auto& [base, a] : other->allocs) {
      const auto b = reinterpret_cast<std::uintptr_t>(base);
      if (addr == b)
        return p.fail(WIA_ERROR_INVALID_ARGUMENT,
                      "%s on host device %d: %p belongs to host device %d", call, dev, ptr,
                      other->index);
      if (addr > b && addr < b + std::max<std::uint64_t>(a.size, 1))
        return p.fail(WIA_ERROR_INVALID_ARGUMENT,
                      "%s on host device %d: %p points inside an allocation of host device %d "
                      "that starts at %p",
                      call, dev, ptr, other->index, base);
    }
  }
  return p.fail(WIA_ERROR_INVALID_ARGUMENT,
                "%s on host device %d: %p is not a live allocation (already freed, or not from "
                "mem_alloc)",
                call, dev, ptr);
}

namespace {

// Pinned host allocations from this size on are mmapped: page aligned,
// returned to the OS on free, and eligible for transparent huge pages.
constexpr std::uint64_t kMmapThreshold = 256 * 1024;
constexpr std::uint64_t kHugePageSize = 2 * 1024 * 1024;

std::uint64_t round_up(std::uint64_t v, std::uint64_t to) { return (v + to - 1) / to * to; }

// --------------------------------------------------------------------------
// Allocation backends. Called with the device mutex held.

void advise(const Provider& p, const Device& d, void* base, std::uint64_t len) noexcept {
  if (len >= kHugePageSize) madvise(base, len, MADV_HUGEPAGE);  // best effort
  if (p.numa_nodes > 1 && d.numa_node >= 0 && d.numa_node < 64) {
    // Prefer (not bind) the device's node: memory pressure there spills
    // elsewhere instead of failing.
    unsigned long mask = 1ul << d.numa_node;
    // maxnode is one more than the bits in the mask (the kernel drops one).
    if (syscall(SYS_mbind, base, len, MPOL_PREFERRED, &mask, sizeof(mask) * 8 + 1, 0) != 0)
      p.log(WIA_LOG_DEBUG, "mbind to NUMA node %d failed: %s", d.numa_node,
            errno_text(errno).c_str());
  }
}

wia_status_t alloc_device_memory(Provider& p, Device& d, std::uint64_t size, Allocation* a) {
  const std::uint64_t len = round_up(std::max<std::uint64_t>(size, 1), page_size());
  if (d.arena_fd < 0 && !d.arena_failed) {
    const std::string name = "wia-host-dev" + std::to_string(d.index);
    d.arena_fd = memfd_create(name.c_str(), MFD_CLOEXEC);
    if (d.arena_fd < 0) {
      d.arena_failed = true;
      p.log(WIA_LOG_INFO,
            "memfd_create failed on host device %d (%s): device memory is anonymous and "
            "cannot be exported with ipc_get_handle",
            d.index, errno_text(errno).c_str());
    }
  }
  void* base = MAP_FAILED;
  if (d.arena_fd >= 0) {
    const std::uint64_t off = d.arena_end;
    if (ftruncate(d.arena_fd, static_cast<off_t>(off + len)) != 0) {
      const int e = errno;
      return p.fail(WIA_ERROR_OUT_OF_MEMORY,
                    "mem_alloc(%" PRIu64 " B) on host device %d: growing the memory arena: %s",
                    size, d.index, errno_text(e).c_str());
    }
    base =
        mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_SHARED, d.arena_fd, static_cast<off_t>(off));
    if (base == MAP_FAILED) {
      const int e = errno;
      return p.fail(WIA_ERROR_OUT_OF_MEMORY, "mem_alloc(%" PRIu64 " B) on host device %d: mmap: %s",
                    size, d.index, errno_text(e).c_str());
    }
    d.arena_end = off + len;
    a->offset = off;
    a->backing = Backing::kArena;
    madvise(base, len, MADV_DONTFORK);
  } else {
    base = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (base == MAP_FAILED) {
      const int e = errno;
      return p.fail(WIA_ERROR_OUT_OF_MEMORY, "mem_alloc(%" PRIu64 " B) on host device %d: mmap: %s",
                    size, d.index, errno_text(e).c_str());
    }
    a->backing = Backing::kAnon;
  }
  advise(p, d, base, len);
  a->base = base;
  a->map_len = len;
  return WIA_SUCCESS;
}

wia_status_t alloc_pinned_memory(Provider& p, Device& d, std::uint64_t size, Allocation* a) {
  if (size < kMmapThreshold) {
    void* base = nullptr;
    // size 0 still gets its own byte, so the pointer is unique.
    const int rc = posix_memalign(&base, kAlignment, std::max<std::uint64_t>(size, 1));
    if (rc != 0)
      return p.fail(WIA_ERROR_OUT_OF_MEMORY,
                    "mem_alloc(%" PRIu64 " B, pinned) on host device %d: posix_memalign: %s", size,
                    d.index, errno_text(rc).c_str());
    a->base = base;
    a->backing = Backing::kMalloc;
    return WIA_SUCCESS;
  }
  const std::uint64_t len = round_up(size, page_size());
  void* base = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (base == MAP_FAILED) {
    const int e = errno;
    return p.fail(WIA_ERROR_OUT_OF_MEMORY,
                  "mem_alloc(%" PRIu64 " B, pinned) on host device %d: mmap: %s", size, d.index,
                  errno_text(e).c_str());
  }
  advise(p, d, base, len);
  a->base = base;
  a->map_len = len;
  a->backing = Backing::kAnon;
  return WIA_SUCCESS;
}

}  // namespace

// --------------------------------------------------------------------------
// Entry points: memory

wia_status_t mem_alloc(void* ctx, std::int32_t dev, std::uint64_t size, std::uint32_t kind,
                       void** ptr) noexcept {
  return guarded(ctx, "mem_alloc", [&](Provider& p) -> wia_status_t {
    if (ptr == nullptr)
      return p.fail(WIA_ERROR_INVALID_ARGUMENT, "mem_alloc on host device %d: ptr is NULL", dev);
    *ptr = nullptr;
    if (!p.valid_device(dev))
      return p.fail(WIA_ERROR_INVALID_DEVICE, "mem_alloc: no host device %d (have %zu)", dev,
                    p.devices.size());
    if (kind != WIA_MEM_DEVICE && kind != WIA_MEM_HOST_PINNED)
      return p.fail(WIA_ERROR_INVALID_ARGUMENT, "mem_alloc on host device %d: unknown kind %u", dev,
                    kind);
    const char* kind_name = kind == WIA_MEM_DEVICE ? "device" : "pinned";
    // Lazy commitment would let an absurd request "succeed" and fail at
    // first touch; refuse what the machine cannot hold at all.
    if (p.physical_memory != 0 && size > p.physical_memory)
      return p.fail(WIA_ERROR_OUT_OF_MEMORY,
                    "mem_alloc(%" PRIu64
                    " B, %s) on host device %d: larger than this machine's "
                    "memory (%" PRIu64 " B RAM + swap)",
                    size, kind_name, dev, p.physical_memory);
    Device& d = *p.devices[static_cast<std::size_t>(dev)];
    std::lock_guard<std::mutex> lk(d.mu);
    if (kind == WIA_MEM_DEVICE && p.memory_limit != 0 &&
        (d.used > p.memory_limit || size > p.memory_limit - d.used))
      return p.fail(WIA_ERROR_OUT_OF_MEMORY,
                    "mem_alloc(%" PRIu64
                    " B, device) on host device %d: exceeds host.memory_limit "
                    "(%" PRIu64 " B, %" PRIu64 " B in use)",
                    size, dev, p.memory_limit, d.used);
    Allocation a;
    a.size = size;
    a.kind = kind;
    const wia_status_t st = kind == WIA_MEM_DEVICE ? alloc_device_memory(p, d, size, &a)
                                                   : alloc_pinned_memory(p, d, size, &a);
    if (st != WIA_SUCCESS) return st;
    try {
      d.allocs.emplace(a.base, a);
    } catch (...) {
      release(d, a);
      throw;
    }
    if (kind == WIA_MEM_DEVICE) d.used += size;
    *ptr = a.base;
    return WIA_SUCCESS;
  });
}

wia_status_t mem_free(void* ctx, std::int32_t dev, void* ptr) noexcept {
  return guarded(ctx, "mem_free", [&](Provider& p) -> wia_status_t {
    if (!p.valid_device(dev))
      return p.fail(WIA_ERROR_INVALID_DEVICE, "mem_free: no host device %d (have %zu)", dev,
                    p.devices.size());
    // Strict on NULL (unlike free()): mem_alloc never returns NULL, so a
    // NULL here is a bookkeeping bug worth reporting.
    if (ptr == nullptr)
      return p.fail(WIA_ERROR_INVALID_ARGUMENT, "mem_free on host device %d: ptr is NULL", dev);
    Device& d = *p.devices[static_cast<std::size_t>(dev)];
    {
      std::lock_guard<std::mutex> lk(d.mu);
      auto it = d.allocs.find(ptr);
      if (it != d.allocs.end()) {
        const Allocation a = it->second;
        d.allocs.erase(it);
        if (a.kind == WIA_MEM_DEVICE) d.used -= a.size;
        release(d, a);
        return WIA_SUCCESS;
      }
    }
    return explain_unknown_pointer(p, "mem_free", dev, ptr);
  });
}

wia_status_t memset_sync(void* ctx, std::int32_t dev, void* ptr, std::int32_t value,
                         std::uint64_t size) noexcept {
  return guarded(ctx, "memset", [&](Provider& p) -> wia_status_t {
    if (!p.valid_device(dev))
      return p.fail(WIA_ERROR_INVALID_DEVICE, "memset: no host device %d (have %zu)", dev,
                    p.devices.size());
    if (size == 0) return WIA_SUCCESS;
    if (ptr == nullptr)
      return p.fail(WIA_ERROR_INVALID_ARGUMENT,
                    "memset(%" PRIu64 " B) on host device %d: ptr is NULL", size, dev);
    std::memset(ptr, value, size);
    return WIA_SUCCESS;
  });
}

wia_status_t memcpy_sync(void* ctx, std::int32_t dev, void* dst, const void* src,
                         std::uint64_t size) noexcept {
  return guarded(ctx, "memcpy", [&](Provider& p) -> wia_status_t {
    if (!p.valid_device(dev))
      return p.fail(WIA_ERROR_INVALID_DEVICE, "memcpy: no host device %d (have %zu)", dev,
                    p.devices.size());
    if (size == 0) return WIA_SUCCESS;
    if (dst == nullptr || src == nullptr)
      return p.fail(WIA_ERROR_INVALID_ARGUMENT,
                    "memcpy(%" PRIu64 " B) on host device %d: %s is NULL", size, dev,
                    dst == nullptr ? "dst" : "src");
    std::memmove(dst, src, size);  // overlap is a caller bug, but not UB here
    return WIA_SUCCESS;
  });
}

}  // namespace wia::host
