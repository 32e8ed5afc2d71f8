// SPDX-License-Identifier: Apache-2.0
// Allocation, and copies/sets whose devices are found from the pointers.
#include <wia/wia.h>

#include <cstring>

#include <fmt/format.h>

#include "api/guard.hpp"
#include "api/copy.hpp"
#include "runtime/device_call.hpp"
#include "runtime/device_registrations.hpp"
#include "runtime/objects.hpp"

using namespace wia;

namespace {

void* allocate(wia_device_t device, std::size_t size, std::uint32_t kind) {
  const Device& d = Runtime::get().device(device);
  if (kind == WIA_MEM_HOST_PINNED && !(ops_of(d).caps & WIA_DEVICE_CAP_PINNED_HOST))
    throw Error(WIA_ERROR_NOT_SUPPORTED,
                fmt::format("device {} ({}) cannot allocate pinned host memory", device,
                            d.provider->name()));
  void* p = nullptr;
  device_call(d, kind == WIA_MEM_DEVICE ? "mem_alloc" : "mem_alloc(pinned host)",
              [&](const wia_device_ops_v1_t& o, void* ctx) {
                return o.mem_alloc(ctx, d.local_index, size, kind, &p);
              });
  if (p == nullptr)
    throw Error(WIA_ERROR_INTERNAL, fmt::format("provider {} returned success but a NULL pointer "
                                                "for a {}-byte allocation on device {}",
                                                d.provider->name(), size, device));
  objects().allocations.add(Allocation{reinterpret_cast<std::uintptr_t>(p), size, device, kind});
  return p;
}

}  // namespace

extern "C" {

WIA_API wia_status_t wia_malloc(void** ptr, size_t size) {
  return api::guard(__func__, [&] {
    api::require_non_null(ptr, "ptr");
    *ptr = allocate(current_device(), size, WIA_MEM_DEVICE);
  });
}

WIA_API wia_status_t wia_malloc_on(wia_device_t device, void** ptr, size_t size) {
  return api::guard(__func__, [&] {
    api::require_non_null(ptr, "ptr");
    *ptr = allocate(device, size, WIA_MEM_DEVICE);
  });
}

WIA_API wia_status_t wia_malloc_host(void** ptr, size_t size) {
  return api::guard(__func__, [&] {
    api::require_non_null(ptr, "ptr");
    *ptr = allocate(current_device(), size, WIA_MEM_HOST_PINNED);
  });
}

WIA_API wia_status_t wia_free(void* ptr) {
  return api::guard(__func__, [&] {
    if (ptr == nullptr) return;  // like free(NULL)
    Runtime& rt = Runtime::get();
    std::optional<Allocation> a = objects().allocations.remove(ptr);
    if (!a) {
      if (objects().allocations.find(ptr))
        throw Error(WIA_ERROR_INVALID_ARGUMENT,
                    fmt::format("pointer {} points inside an allocation, not at its start", ptr));
      throw Error(WIA_ERROR_INVALID_ARGUMENT,
                  fmt::format("pointer {} was not allocated by wia_malloc*, or was already freed",
                              ptr));
    }
    // A NIC registration of it must go first (a dma-buf keeps the memory
    // alive, and a later allocation at this address must not meet it).
    device_registrations().release(a->base);
    const Device& d = rt.device(a->device);
    device_call(d, "mem_free", [&](const wia_device_ops_v1_t& o, void* ctx) {
      return o.mem_free(ctx, d.local_index, ptr);
    });
  });
}

WIA_API wia_status_t wia_pointer_get_device(const void* ptr, wia_device_t* device) {
  return api::guard(__func__, [&] {
    api::require_non_null(ptr, "ptr");
    api::require_non_null(device, "device");
    Runtime::get();
    std::optional<Allocation> a = objects().allocations.find(ptr);
    if (!a)
      throw Error(WIA_ERROR_INVALID_ARGUMENT,
                  fmt::format("pointer {} is not inside any live libwia allocation", ptr));
    *device = a->device;
  });
}

WIA_API wia_status_t wia_memcpy(void* dst, const void* src, size_t size) {
  return api::guard(__func__, [&] { api::copy(dst, src, size, nullptr, api::CopyMode::sync); });
}

WIA_API wia_status_t wia_memcpy_async(void* dst, const void* src, size_t size,
                                      wia_stream_t stream) {
  return api::guard(__func__, [&] {
    api::ComputeBracket compute(stream, "copy");
    api::copy(dst, src, size, stream, api::CopyMode::async);
    compute.posted();
  });
}

WIA_API wia_status_t wia_memset(void* ptr, int value, size_t size) {
  return api::guard(__func__, [&] { api::set(ptr, value, size, nullptr, api::CopyMode::sync); });
}

WIA_API wia_status_t wia_memset_async(void* ptr, int value, size_t size, wia_stream_t stream) {
  return api::guard(__func__, [&] {
    api::ComputeBracket compute(stream, "memset");
    api::set(ptr, value, size, stream, api::CopyMode::async);
    compute.posted();
  });
}

}  // extern "C"
