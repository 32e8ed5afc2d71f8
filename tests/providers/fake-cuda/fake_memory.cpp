// SPDX-License-Identifier: Apache-2.0
// Device and pinned host memory, the registry of known ranges, pointer
// attributes and the synchronous copies. Device memory is host memory: a
// memfd per allocation, mapped shared, so that cuIpcGetMemHandle can hand
// it to another process (fake_ipc.cpp).
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "fake_cuda.hpp"

namespace wia::fake_cuda {
namespace {

std::size_t page_round(std::size_t n) {
  const auto page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
  return (n + page - 1) / page * page;
}

std::uint64_t device_bytes_in_use(int device) {
  std::uint64_t used = 0;
  for (const auto& entry : driver().allocations)
    if (entry.second.kind == MemKind::kDevice && entry.second.device == device)
      used += entry.second.size;
  return used;
}

bool overlaps_known(std::uintptr_t p, std::size_t n) {
  auto& all = driver().allocations;
  auto it = all.lower_bound(p + n);
  if (it == all.begin()) return false;
  --it;
  const Allocation& a = it->second;
  return a.base + std::max<std::size_t>(a.size, 1) > p;
}

}  // namespace

const Allocation* find_allocation(std::uintptr_t p) {
  auto& all = driver().allocations;
  auto it = all.upper_bound(p);
  if (it == all.begin()) return nullptr;
  --it;
  const Allocation& a = it->second;
  return p < a.base + a.size ? &a : nullptr;
}

bool range_known(std::uintptr_t p, std::size_t n) {
  const Allocation* a = find_allocation(p);
  return a != nullptr && n <= a->base + a->size - p;
}

bool kernel_may_access(const Context& ctx, std::uintptr_t p, std::size_t n) {
  const Allocation* a = find_allocation(p);
  if (a == nullptr || n > a->base + a->size - p) return false;
  switch (a->kind) {
    case MemKind::kHostAlloc:
    case MemKind::kHostRegistered:
      return true;  // pinned and, with unified addressing, mapped for every context
    case MemKind::kDevice:
    case MemKind::kIpcMapped:
      return a->device == ctx.device || ctx.peers.count(a->device) != 0;
  }
  return false;
}

CUresult check_copy_range(std::uintptr_t p, std::size_t n) {
  if (n == 0) return WIA_CUDA_SUCCESS;
  if (p == 0) return WIA_CUDA_ERROR_INVALID_VALUE;
  const Allocation* a = find_allocation(p);
  if (a != nullptr && n > a->base + a->size - p) {
    diagnose("copy of " + std::to_string(n) + " bytes at offset " + std::to_string(p - a->base) +
             " runs past the end of a " + std::to_string(a->size) + "-byte allocation");
    return WIA_CUDA_ERROR_INVALID_VALUE;
  }
  // Not inside any known range: pageable host memory, which the real
  // driver copies too (through a staging buffer).
  return WIA_CUDA_SUCCESS;
}

void release_allocation(Allocation& a) {
  if (a.mapped != 0) munmap(reinterpret_cast<void*>(a.base), a.mapped);
  if (a.memfd >= 0) close(a.memfd);
  a.mapped = 0;
  a.memfd = -1;
}

}  // namespace wia::fake_cuda

using namespace wia::fake_cuda;

wia_CUresult fake_cuMemGetInfo(size_t* free_bytes, size_t* total_bytes) {
  if (free_bytes == nullptr || total_bytes == nullptr) return WIA_CUDA_ERROR_INVALID_VALUE;
  Driver& d = driver();
  std::lock_guard<std::mutex> lk(d.mu);
  Context* ctx = current_context();
  if (ctx == nullptr) return WIA_CUDA_ERROR_INVALID_CONTEXT;
  *total_bytes = kDeviceMemory;
  *free_bytes = kDeviceMemory - device_bytes_in_use(ctx->device);
  return WIA_CUDA_SUCCESS;
}

wia_CUresult fake_cuMemAlloc(wia_CUdeviceptr* dptr, size_t bytes) {
  if (dptr == nullptr || bytes == 0) return WIA_CUDA_ERROR_INVALID_VALUE;  // as documented
  Driver& d = driver();
  std::lock_guard<std::mutex> lk(d.mu);
  Context* ctx = current_context();
  if (ctx == nullptr) return WIA_CUDA_ERROR_INVALID_CONTEXT;
  if (d.faults.oom || bytes > kDeviceMemory - device_bytes_in_use(ctx->device))
    return WIA_CUDA_ERROR_OUT_OF_MEMORY;
  char name[32];
  std::snprintf(name, sizeof(name), "fake-cuda-dev%d", ctx->device);
  Allocation a;
  a.kind = MemKind::kDevice;
  a.device = ctx->device;
  a.size = bytes;
  a.mapped = page_round(bytes);
  a.memfd = memfd_create(name, MFD_CLOEXEC);
  if (a.memfd < 0 || ftruncate(a.memfd, static_cast<off_t>(a.mapped)) != 0) {
    diagnose(std::string("cuMemAlloc: memfd: ") + std::strerror(errno));
    if (a.memfd >= 0) close(a.memfd);
    return WIA_CUDA_ERROR_OUT_OF_MEMORY;
  }
  void* p = mmap(nullptr, a.mapped, PROT_READ | PROT_WRITE, MAP_SHARED, a.memfd, 0);
  if (p == MAP_FAILED) {
    diagnose(std::string("cuMemAlloc: mmap: ") + std::strerror(errno));
    close(a.memfd);
    return WIA_CUDA_ERROR_OUT_OF_MEMORY;
  }
  struct stat st {};
  fstat(a.memfd, &st);
  a.inode = static_cast<std::uint64_t>(st.st_ino);
  a.base = reinterpret_cast<std::uintptr_t>(p);
  d.allocations[a.base] = a;
  *dptr = a.base;
  return WIA_CUDA_SUCCESS;
}

wia_CUresult fake_cuMemFree(wia_CUdeviceptr dptr) {
  Driver& d = driver();
  int device = -1;
  {
    std::lock_guard<std::mutex> lk(d.mu);
    if (current_context() == nullptr) return WIA_CUDA_ERROR_INVALID_CONTEXT;
    auto it = d.allocations.find(static_cast<std::uintptr_t>(dptr));
    if (it == d.allocations.end() || it->second.kind != MemKind::kDevice) {
      diagnose("cuMemFree of " + std::to_string(dptr) + ": not the start of a device allocation");
      return WIA_CUDA_ERROR_INVALID_VALUE;
    }
    device = it->second.device;
  }
  // The real cuMemFree waits for the device's work before the memory goes.
  wait_device_idle(device);
  std::lock_guard<std::mutex> lk(d.mu);
  auto it = d.allocations.find(static_cast<std::uintptr_t>(dptr));
  if (it == d.allocations.end()) return WIA_CUDA_ERROR_INVALID_VALUE;  // freed meanwhile
  release_allocation(it->second);
  d.allocations.erase(it);
  return WIA_CUDA_SUCCESS;
}

wia_CUresult fake_cuMemHostAlloc(void** ptr, size_t bytes, unsigned int flags) {
  if (ptr == nullptr || bytes == 0 || (flags & ~0x7u) != 0) return WIA_CUDA_ERROR_INVALID_VALUE;
  Driver& d = driver();
  std::lock_guard<std::mutex> lk(d.mu);
  Context* ctx = current_context();
  if (ctx == nullptr) return WIA_CUDA_ERROR_INVALID_CONTEXT;
  if (d.faults.oom) return WIA_CUDA_ERROR_OUT_OF_MEMORY;
  Allocation a;
  a.kind = MemKind::kHostAlloc;
  a.device = ctx->device;
  a.size = bytes;
  a.mapped = page_round(bytes);
  void* p = mmap(nullptr, a.mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return WIA_CUDA_ERROR_OUT_OF_MEMORY;
  a.base = reinterpret_cast<std::uintptr_t>(p);
  d.allocations[a.base] = a;
  *ptr = p;
  return WIA_CUDA_SUCCESS;
}

wia_CUresult fake_cuMemFreeHost(void* ptr) {
  Driver& d = driver();
  std::lock_guard<std::mutex> lk(d.mu);
  if (current_context() == nullptr) return WIA_CUDA_ERROR_INVALID_CONTEXT;
  auto it = d.allocations.find(reinterpret_cast<std::uintptr_t>(ptr));
  if (it == d.allocations.end() || it->second.kind != MemKind::kHostAlloc)
    return WIA_CUDA_ERROR_INVALID_VALUE;
  release_allocation(it->second);
  d.allocations.erase(it);
  return WIA_CUDA_SUCCESS;
}

wia_CUresult fake_cuMemHostRegister(void* ptr, size_t bytes, unsigned int flags) {
  if (ptr == nullptr || bytes == 0 || (flags & ~0xFu) != 0) return WIA_CUDA_ERROR_INVALID_VALUE;
  Driver& d = driver();
  std::lock_guard<std::mutex> lk(d.mu);
  Context* ctx = current_context();
  if (ctx == nullptr) return WIA_CUDA_ERROR_INVALID_CONTEXT;
  const auto base = reinterpret_cast<std::uintptr_t>(ptr);
  if (overlaps_known(base, bytes)) return WIA_CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED;
  Allocation a;
  a.kind = MemKind::kHostRegistered;
  a.device = ctx->device;
  a.base = base;
  a.size = bytes;
  d.allocations[base] = a;
  return WIA_CUDA_SUCCESS;
}

wia_CUresult fake_cuMemHostUnregister(void* ptr) {
  Driver& d = driver();
  std::lock_guard<std::mutex> lk(d.mu);
  if (current_context() == nullptr) return WIA_CUDA_ERROR_INVALID_CONTEXT;
  auto it = d.allocations.find(reinterpret_cast<std::uintptr_t>(ptr));
  if (it == d.allocations.end() || it->second.kind != MemKind::kHostRegistered)
    return kErrorHostMemoryNotRegistered;
  d.allocations.erase(it);
  return WIA_CUDA_SUCCESS;
}

wia_CUresult fake_cuPointerGetAttribute(void* data, int attribute, wia_CUdeviceptr ptr) {
  if (data == nullptr) return WIA_CUDA_ERROR_INVALID_VALUE;
  Driver& d = driver();
  std::lock_guard<std::mutex> lk(d.mu);
  const Allocation* a = find_allocation(static_cast<std::uintptr_t>(ptr));
  if (a == nullptr) return WIA_CUDA_ERROR_INVALID_VALUE;  // pageable or unknown memory
  const bool on_device = a->kind == MemKind::kDevice || a->kind == MemKind::kIpcMapped;
  switch (attribute) {
    case WIA_CU_POINTER_ATTRIBUTE_MEMORY_TYPE: {
      const unsigned type = on_device ? WIA_CU_MEMORYTYPE_DEVICE : WIA_CU_MEMORYTYPE_HOST;
      std::memcpy(data, &type, sizeof(type));
      break;
    }
    case WIA_CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL:
      std::memcpy(data, &a->device, sizeof(a->device));
      break;
    case WIA_CU_POINTER_ATTRIBUTE_RANGE_START_ADDR: {
      const wia_CUdeviceptr start = a->base;
      std::memcpy(data, &start, sizeof(start));
      break;
    }
    case WIA_CU_POINTER_ATTRIBUTE_RANGE_SIZE: {
      const size_t size = a->size;
      std::memcpy(data, &size, sizeof(size));
      break;
    }
    default:
      return WIA_CUDA_ERROR_INVALID_VALUE;
  }
  return WIA_CUDA_SUCCESS;
}

// The real cuMemsetD8 may return before device memory is written; the
// double's completes first (README: what the double does not prove).
wia_CUresult fake_cuMemsetD8(wia_CUdeviceptr dst, unsigned char value, size_t count) {
  Driver& d = driver();
  {
    std::lock_guard<std::mutex> lk(d.mu);
    if (current_context() == nullptr) return WIA_CUDA_ERROR_INVALID_CONTEXT;
    if (count != 0 && !range_known(static_cast<std::uintptr_t>(dst), count))
      return WIA_CUDA_ERROR_INVALID_VALUE;
  }
  if (count != 0) std::memset(reinterpret_cast<void*>(dst), value, count);
  return WIA_CUDA_SUCCESS;
}

wia_CUresult fake_cuMemcpy(wia_CUdeviceptr dst, wia_CUdeviceptr src, size_t bytes) {
  Driver& d = driver();
  {
    std::lock_guard<std::mutex> lk(d.mu);
    if (current_context() == nullptr) return WIA_CUDA_ERROR_INVALID_CONTEXT;
    if (const CUresult st = check_copy_range(static_cast<std::uintptr_t>(dst), bytes)) return st;
    if (const CUresult st = check_copy_range(static_cast<std::uintptr_t>(src), bytes)) return st;
  }
  if (bytes != 0) std::memmove(reinterpret_cast<void*>(dst), reinterpret_cast<void*>(src), bytes);
  return WIA_CUDA_SUCCESS;
}
