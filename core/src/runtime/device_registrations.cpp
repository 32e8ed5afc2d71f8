// SPDX-License-Identifier: Apache-2.0
#include "runtime/device_registrations.hpp"

#include <fmt/format.h>
#include <unistd.h>

#include <vector>

#include "common/error.hpp"
#include "common/log.hpp"
#include "provider/registry.hpp"
#include "provider/transport_call.hpp"
#include "runtime/device_call.hpp"
#include "runtime/runtime.hpp"

namespace wia {

wia_mr_t DeviceRegistrations::get(const Provider& transport, std::int32_t endpoint,
                                  const Allocation& a, std::uint32_t iface, Route route) {
  const Key key{a.base, &transport, endpoint};
  std::lock_guard<std::mutex> lock(mu_);
  if (const auto it = mrs_.find(key); it != mrs_.end()) return it->second;
  // Refused once: the same answer until the allocation is freed, without
  // exporting and asking the transport again on every transfer.
  if (const auto it = refused_.find(key); it != refused_.end())
    throw Error(WIA_ERROR_NOT_SUPPORTED, it->second);
  // First use: slow (an export and a NIC registration), once per
  // allocation and endpoint; held under the lock so two threads sending
  // from one buffer register it once.
  try {
    const wia_mr_t mr = register_now(transport, endpoint, a, iface, route);
    try {
      mrs_.emplace(key, mr);
    } catch (...) {
      transport.transport()->dereg_mr(transport.ctx(), mr);
      throw;
    }
    return mr;
  } catch (const Error& e) {
    if (e.status() == WIA_ERROR_NOT_SUPPORTED) refused_.emplace(key, e.what());
    throw;
  }
}

wia_mr_t DeviceRegistrations::register_now(const Provider& transport, std::int32_t endpoint,
                                           const Allocation& a, std::uint32_t iface,
                                           Route route) {
  const Device& d = Runtime::get().device(a.device);
  if (route == Route::kDmabuf && !(ops_of(d).caps & WIA_DEVICE_CAP_DMABUF))
    throw Error(WIA_ERROR_NOT_SUPPORTED,
                fmt::format("device {} ({}) cannot export its memory as a dma-buf "
                            "(no WIA_DEVICE_CAP_DMABUF), so {} cannot register it",
                            a.device, d.provider->name(), transport.name()));
  std::int32_t fd = -1;
  std::uint64_t offset = 0;
  void* base = reinterpret_cast<void*>(a.base);
  if (route == Route::kDmabuf)
    device_call(d, "mem_export_dmabuf", [&](const wia_device_ops_v1_t& o, void* ctx) {
      return o.mem_export_dmabuf(ctx, d.local_index, base, a.size, &fd, &offset);
    });
  wia_mr_desc_v1_t desc{};
  desc.struct_size = sizeof desc;
  desc.kind = WIA_MR_DEVICE;
  desc.ptr = base;
  desc.size = a.size;
  desc.iface = iface;
  desc.dmabuf_fd = fd;
  // The vendor's ordinal (a GPU split into logical devices is one ordinal);
  // a provider that does not say is taken to number its devices so.
  desc.device_id = static_cast<std::uint64_t>(
      (d.props.flags & WIA_DEVICE_FLAG_MEM_DEVICE) != 0 && d.props.mem_device >= 0
          ? d.props.mem_device
          : d.local_index);
  desc.dmabuf_offset = offset;
  wia_mr_t mr = nullptr;
  try {
    transport_call(transport,
                   route == Route::kDmabuf
                       ? fmt::format("reg_mr of {} B of device {} through its dma-buf (fd {}, "
                                     "offset {})",
                                     a.size, a.device, fd, offset)
                       : fmt::format("reg_mr of {} B of device {} by address", a.size, a.device),
                   [&](const wia_transport_ops_v1_t& t, void* ctx) {
                     return t.reg_mr(ctx, endpoint, &desc, &mr);
                   });
  } catch (...) {
    if (fd >= 0) ::close(fd);
    throw;
  }
  // The registration holds its own reference to the dma-buf.
  if (fd >= 0) ::close(fd);
  if (mr == nullptr)
    throw Error(WIA_ERROR_INTERNAL,
                fmt::format("{}: reg_mr returned success but no registration", transport.name()));
  log::debug("p2p", "device {}: {} B at {} registered with {} endpoint {} {}", a.device, a.size,
             base, transport.name(), endpoint,
             route == Route::kDmabuf ? "through a dma-buf" : "by address");
  return mr;
}

namespace {
void deregister(const Provider& transport, wia_mr_t mr, std::uintptr_t base) noexcept {
  try {
    transport_call(transport, fmt::format("dereg_mr of the device registration at {:#x}", base),
                   [&](const wia_transport_ops_v1_t& t, void* ctx) { return t.dereg_mr(ctx, mr); });
  } catch (const std::exception& e) {
    log::warn("p2p", "{}", e.what());
  }
}
}  // namespace

void DeviceRegistrations::release(std::uintptr_t base) noexcept {
  std::vector<std::pair<Key, wia_mr_t>> gone;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = mrs_.lower_bound(Key{base, nullptr, INT32_MIN});
    while (it != mrs_.end() && std::get<0>(it->first) == base) {
      gone.emplace_back(*it);
      it = mrs_.erase(it);
    }
    for (auto r = refused_.lower_bound(Key{base, nullptr, INT32_MIN});
         r != refused_.end() && std::get<0>(r->first) == base;)
      r = refused_.erase(r);
  }
  for (const auto& [key, mr] : gone) deregister(*std::get<1>(key), mr, base);
}

void DeviceRegistrations::release_all() noexcept {
  std::map<Key, wia_mr_t> gone;
  {
    std::lock_guard<std::mutex> lock(mu_);
    gone.swap(mrs_);
    refused_.clear();
  }
  for (const auto& [key, mr] : gone) deregister(*std::get<1>(key), mr, std::get<0>(key));
}

std::size_t DeviceRegistrations::count() const {
  std::lock_guard<std::mutex> lock(mu_);
  return mrs_.size();
}

DeviceRegistrations& device_registrations() {
  static DeviceRegistrations r;
  return r;
}

}  // namespace wia
