// SPDX-License-Identifier: Apache-2.0
// Device memory registered with a network transport (GPUDirect RDMA): the
// transport registers the whole allocation once (reg_mr naming its memory
// interface and device), and every later send or receive on that
// allocation through that transport endpoint reuses the registration,
// until wia_free or wia_finalize releases it. Two routes: through a
// dma-buf (the accelerator provider exports the allocation,
// mem_export_dmabuf, and the transport registers the fd: GPUDirect
// without a vendor kernel module; transports with
// WIA_TRANSPORT_FLAG_DMABUF), or by address (the transport's own library
// reaches the device's memory, as libfabric with FI_HMEM does;
// WIA_TRANSPORT_FLAG_DEVICE_MEMORY alone). The core names no vendor
// (docs/point-to-point.md, "GPUDirect").
#pragma once

#include <wia/provider.h>

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <tuple>

#include "runtime/objects.hpp"

namespace wia {

class Provider;

class DeviceRegistrations {
 public:
  // The registration of the whole allocation `a` on `transport`'s
  // `endpoint`, made on first use, through its dma-buf or by address.
  // Throws wia::Error naming the device, the provider and the call that
  // failed (export or registration); NOT_SUPPORTED where the device or the
  // transport cannot (the caller stages).
  enum class Route { kDmabuf, kAddress };
  wia_mr_t get(const Provider& transport, std::int32_t endpoint, const Allocation& a,
               std::uint32_t iface, Route route);
  // Deregisters every registration of the allocation starting at `base`:
  // wia_free calls it before the memory goes back to its provider.
  void release(std::uintptr_t base) noexcept;
  // Every registration (wia_finalize, before allocations are freed).
  void release_all() noexcept;
  // Registrations held now (tests).
  std::size_t count() const;

 private:
  // Allocation base first, so release() takes one contiguous range.
  using Key = std::tuple<std::uintptr_t, const Provider*, std::int32_t>;
  wia_mr_t register_now(const Provider& transport, std::int32_t endpoint, const Allocation& a,
                        std::uint32_t iface, Route route);  // under mu_
  mutable std::mutex mu_;
  std::map<Key, wia_mr_t> mrs_;
  std::map<Key, std::string> refused_;  // NOT_SUPPORTED answers, until the allocation is freed
};

DeviceRegistrations& device_registrations();

}  // namespace wia
