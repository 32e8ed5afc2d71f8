// SPDX-License-Identifier: Apache-2.0
// Device memory registered with a network transport through a dma-buf
// (GPUDirect RDMA without a vendor kernel module): the accelerator
// provider exports the allocation (mem_export_dmabuf), the transport
// registers the fd once (reg_mr), and every later send or receive on that
// allocation through that transport endpoint reuses the registration,
// until wia_free or wia_finalize releases it. The core names no vendor:
// any device provider with WIA_DEVICE_CAP_DMABUF meets any transport with
// WIA_TRANSPORT_FLAG_DMABUF (docs/point-to-point.md, "GPUDirect").
#pragma once

#include <wia/provider.h>

#include <cstdint>
#include <map>
#include <mutex>
#include <tuple>

#include "runtime/objects.hpp"

namespace wia {

class Provider;

class DmabufRegistrations {
 public:
  // The registration of the whole allocation `a` on `transport`'s
  // `endpoint`, made on first use. Throws wia::Error naming the device,
  // the provider and the call that failed (export or registration).
  wia_mr_t get(const Provider& transport, std::int32_t endpoint, const Allocation& a,
               std::uint32_t iface);
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
  mutable std::mutex mu_;
  std::map<Key, wia_mr_t> mrs_;
};

DmabufRegistrations& dmabuf_registrations();

}  // namespace wia
