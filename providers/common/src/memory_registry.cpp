// SPDX-License-Identifier: Apache-2.0
#include "wia_common/memory_registry.hpp"

#include <unistd.h>

#include <algorithm>
#include <cinttypes>

#include "wia_common/text.hpp"

namespace wia::common {

const char* reset_dmabuf_out(std::int32_t* fd, std::uint64_t* offset) noexcept {
  if (fd == nullptr || offset == nullptr) return fd == nullptr ? "fd" : "offset";
  *fd = -1;
  *offset = 0;
  return nullptr;
}

void MemoryRegistry::add(void* ptr, const Allocation& a) {
  std::lock_guard<std::mutex> lk(mu_);
  allocations_[reinterpret_cast<std::uintptr_t>(ptr)] = a;
}

std::string MemoryRegistry::take(void* ptr, std::int32_t dev, Allocation* out) {
  std::lock_guard<std::mutex> lk(mu_);
  const auto key = reinterpret_cast<std::uintptr_t>(ptr);
  const auto it = allocations_.find(key);
  if (it == allocations_.end()) {
    if (imports_.count(key) != 0)
      return format("%p was mapped by ipc_open_handle; release it with ipc_close_handle", ptr);
    return format("%p is not a live allocation (already freed, or not from mem_alloc)", ptr);
  }
  if (it->second.device != dev)
    return format("%p belongs to %s device %d", ptr, vendor_, it->second.device);
  *out = it->second;
  allocations_.erase(it);
  return {};
}

std::string MemoryRegistry::find_device_start(void* ptr, std::int32_t dev, Allocation* out) const {
  std::lock_guard<std::mutex> lk(mu_);
  const auto it = allocations_.find(reinterpret_cast<std::uintptr_t>(ptr));
  if (it == allocations_.end() || it->second.device != dev || it->second.kind != WIA_MEM_DEVICE)
    return format(
        "%p is not the start of a live device allocation of this device (only "
        "mem_alloc(WIA_MEM_DEVICE) memory exports)",
        ptr);
  *out = it->second;
  return {};
}

std::string MemoryRegistry::find_dmabuf_range(const void* ptr, std::uint64_t size, std::int32_t dev,
                                              DmabufRange* out) const {
  const auto page = static_cast<std::uint64_t>(::sysconf(_SC_PAGESIZE));
  const auto at = reinterpret_cast<std::uintptr_t>(ptr);
  std::lock_guard<std::mutex> lk(mu_);
  // The last allocation starting at or before `at`; a size-0 allocation
  // still owns its one byte.
  auto it = allocations_.upper_bound(at);
  const bool inside = it != allocations_.begin() &&
                      (--it, it->second.device == dev && it->second.kind == WIA_MEM_DEVICE &&
                                 at - it->first < std::max<std::uint64_t>(it->second.size, 1) &&
                                 size <= it->second.size - (at - it->first));
  if (!inside)
    return format("[%p, +%" PRIu64
                  ") is not inside one live device allocation of this device (only "
                  "mem_alloc(WIA_MEM_DEVICE) memory exports)",
                  ptr, size);
  out->base = it->first;
  out->allocation = it->second;
  out->span = (std::max<std::uint64_t>(it->second.size, 1) + page - 1) / page * page;
  out->offset = at - it->first;
  return {};
}

void MemoryRegistry::add_import(void* ptr, std::int32_t dev) {
  std::lock_guard<std::mutex> lk(mu_);
  Import& import = imports_[reinterpret_cast<std::uintptr_t>(ptr)];
  import.device = dev;
  ++import.opens;
}

std::string MemoryRegistry::release_import(void* ptr, std::int32_t dev) {
  std::lock_guard<std::mutex> lk(mu_);
  const auto it = imports_.find(reinterpret_cast<std::uintptr_t>(ptr));
  if (it == imports_.end() || it->second.device != dev)
    return format("%p was not opened by ipc_open_handle on this device", ptr);
  if (--it->second.opens == 0) imports_.erase(it);
  return {};
}

}  // namespace wia::common
