// SPDX-License-Identifier: Apache-2.0
// The `ze` provider's tables and devices: its parameter, init/fini,
// discovery, peer access and the descriptor the core loads. Memory and IPC
// are in ze_memory.cpp, streams, events, host functions and the
// host-staged reduction in ze_stream.cpp, the loader in ze_loader.cpp.
//
// Decisions worth knowing (docs/provider-ze.md has them all):
//  - The Level Zero loader, opened with dlopen and resolved with dlsym: the
//    provider builds without libze-dev and loads as "absent" where there is
//    no loader, no driver or no device.
//  - A stream is an asynchronous immediate command list. Level Zero 1.4
//    lists are not in order, so every command is followed by a barrier.
//  - Level Zero has no host functions: each stream has a thread of ours
//    that waits for an event the list signals, runs the function, and
//    signals the event the list then waits on.
//  - Reductions are staged through host memory (no SPIR-V kernels: no
//    driver here could run them); the version string wia-info shows says so.
#include "ze_provider.hpp"

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstring>

namespace wia::ze {

wia_status_t device_count(void* ctx, std::int32_t* count) noexcept {
  return guarded(ctx, "device_count", [&](Provider& p) -> wia_status_t {
    if (count == nullptr) return p.fail(WIA_ERROR_INVALID_ARGUMENT, "device_count: count is NULL");
    *count = static_cast<std::int32_t>(p.devices.size());
    return WIA_SUCCESS;
  });
}

wia_status_t device_props(void* ctx, std::int32_t dev, wia_device_props_v1_t* props) noexcept {
  return guarded(ctx, "device_props", [&](Provider& p) -> wia_status_t {
    if (props == nullptr)
      return p.fail(WIA_ERROR_INVALID_ARGUMENT,
                    "device_props on Level Zero device %d: props is NULL", dev);
    if (const wia_status_t st = p.check_device(dev, "device_props"); st != WIA_SUCCESS) return st;
    const std::uint32_t caller_size = props->struct_size;
    if (!WIA_ABI_HAS_FIELD(wia_device_props_v1_t, caller_size, type))
      return p.fail(WIA_ERROR_INVALID_ARGUMENT,
                    "device_props on Level Zero device %d: struct_size %u is too small", dev,
                    caller_size);
    const Device& d = p.device(dev);
    wia_device_props_v1_t full{};
    full.struct_size = caller_size;
    full.type = d.ze_type == WIA_ZE_DEVICE_TYPE_GPU ? WIA_DEVICE_GPU : WIA_DEVICE_ACCELERATOR;
    std::snprintf(full.name, sizeof(full.name), "%s", d.name.c_str());
    // The PCI address needs the zeDevicePciGetPropertiesExt extension: not
    // in this version (empty = "not known", as the ABI allows).
    full.pci_bus_id[0] = '\0';
    full.total_memory = d.total_memory;
    full.free_memory = 0;  // Level Zero core has no free-memory query (Sysman has)
    full.numa_node = -1;
    // Host functions run on a thread of ours per stream: a waiting one
    // holds up no other stream.
    full.flags = WIA_DEVICE_FLAG_UNIFIED_ADDRESS | WIA_DEVICE_FLAG_WAITING_HOST_FUNC;
    full.alignment = 256;  // what mem_alloc asks zeMemAlloc* for
    full.mem_iface = WIA_MEM_IFACE_ZE;
    std::memcpy(props, &full, std::min<std::size_t>(caller_size, sizeof(full)));
    return WIA_SUCCESS;
  });
}

wia_status_t can_access_peer(void* ctx, std::int32_t dev, std::int32_t peer,
                             std::int32_t* can_access) noexcept {
  return guarded(ctx, "can_access_peer", [&](Provider& p) -> wia_status_t {
    if (can_access == nullptr)
      return p.fail(WIA_ERROR_INVALID_ARGUMENT, "can_access_peer: can_access is NULL");
    *can_access = 0;
    if (!p.valid_device(dev) || !p.valid_device(peer))
      return p.fail(WIA_ERROR_INVALID_DEVICE,
                    "can_access_peer: device pair %d -> %d out of range (have %zu)", dev, peer,
                    p.devices.size());
    if (dev == peer) {
      *can_access = 1;
      return WIA_SUCCESS;
    }
    // Devices of different drivers share no context: no USM pointer of one
    // is valid on the other.
    if (p.device(dev).driver != p.device(peer).driver) return WIA_SUCCESS;
    wia_ze_bool_t answer = 0;
    const wia_ze_result_t r =
        p.rt.zeDeviceCanAccessPeer(p.device(dev).h, p.device(peer).h, &answer);
    if (r != WIA_ZE_RESULT_SUCCESS)
      return p.fail_ze(r, dev, "zeDeviceCanAccessPeer(peer %d)", peer);
    *can_access = answer != 0 ? 1 : 0;
    return WIA_SUCCESS;
  });
}

wia_status_t enable_peer_access(void* ctx, std::int32_t dev, std::int32_t peer) noexcept {
  return guarded(ctx, "enable_peer_access", [&](Provider& p) -> wia_status_t {
    std::int32_t ok = 0;
    if (const wia_status_t st = can_access_peer(ctx, dev, peer, &ok); st != WIA_SUCCESS) return st;
    // Level Zero has no enabling step: access within a context is there or
    // not. Enabling is success exactly when it is there.
    if (ok == 0)
      return p.fail(WIA_ERROR_NOT_SUPPORTED,
                    "enable_peer_access %d -> %d: zeDeviceCanAccessPeer says no (or the devices "
                    "belong to different Level Zero drivers)",
                    dev, peer);
    return WIA_SUCCESS;
  });
}

namespace {

const char* param_text(const wia_host_services_v1_t* host, const char* key, const char* def) {
  const char* v = host->get_param != nullptr ? host->get_param(host->host_ctx, key) : nullptr;
  return v != nullptr && *v != '\0' ? v : def;
}

wia_status_t init(const wia_host_services_v1_t* host, void** ctx) noexcept {
  if (host == nullptr || ctx == nullptr) return WIA_ERROR_INVALID_ARGUMENT;
  *ctx = nullptr;
  if (host->abi_version < WIA_HOST_SERVICES_VERSION ||
      !WIA_ABI_HAS_FIELD(wia_host_services_v1_t, host->struct_size, clock_ns))
    return WIA_ERROR_ABI_MISMATCH;
  try {
    auto p = std::make_unique<Provider>();
    p->host = host;
    // Empty (the default): libze_loader.so.1, then libze_loader.so.
    const std::string library = param_text(host, "library", "");
    if (const wia_status_t st = loader_open(*p, library); st != WIA_SUCCESS) return st;
    if (const wia_status_t st = discover_devices(*p); st != WIA_SUCCESS) {
      release_drivers(*p);
      return st;
    }
    const std::uint32_t v = p->drivers.front()->api_version;
    p->log(WIA_LOG_INFO,
           "Level Zero API %u.%u (%s): %zu device(s) on %zu driver(s); reductions staged through "
           "host memory (no SPIR-V kernels)",
           v >> 16, v & 0xffff, p->rt.path.c_str(), p->devices.size(), p->drivers.size());
    for (const auto& d : p->devices)
      p->log(WIA_LOG_INFO, "device %d: %s, %" PRIu64 " MiB", d->index, d->name.c_str(),
             d->total_memory >> 20);
    *ctx = p.release();
    return WIA_SUCCESS;
  } catch (const std::bad_alloc&) {
    if (host->set_error != nullptr) host->set_error(host->host_ctx, "ze init: out of memory");
    return WIA_ERROR_OUT_OF_MEMORY;
  } catch (...) {
    if (host->set_error != nullptr)
      host->set_error(host->host_ctx, "ze init: unexpected exception");
    return WIA_ERROR_INTERNAL;
  }
}

wia_status_t fini(void* ctx) noexcept {
  auto* p = static_cast<Provider*>(ctx);
  if (p == nullptr || p->magic != Provider::kMagic) return WIA_ERROR_INVALID_ARGUMENT;
  release_all_handles(*p);
  release_all_memory(*p);
  release_drivers(*p);
  // The loader stays loaded (RTLD_NODELETE): drivers' threads and exit
  // handlers outlive us.
  p->magic = 0;
  delete p;
  return WIA_SUCCESS;
}

const wia_param_decl_v1_t kParams[] = {
    {sizeof(wia_param_decl_v1_t), WIA_PARAM_STRING, "library", "",
     "the Level Zero loader to open (a file name searched like dlopen does, or a path); empty: "
     "libze_loader.so.1, then libze_loader.so",
     0, 0},
};

wia_device_ops_v1_t make_device_ops() {
  wia_device_ops_v1_t ops{};
  ops.struct_size = sizeof(wia_device_ops_v1_t);
  ops.abi_version = WIA_PROVIDER_ABI_VERSION;
  // No SCALE and no KERNEL: both need device code (SPIR-V), which this
  // provider does not build (docs/provider-ze.md). DMABUF is per device
  // (external memory properties): mem_export_dmabuf answers NOT_SUPPORTED
  // with the reason on a device that cannot export.
  ops.caps = WIA_DEVICE_CAP_HOST_FUNC | WIA_DEVICE_CAP_EVENT_TIMING | WIA_DEVICE_CAP_PEER |
             WIA_DEVICE_CAP_IPC | WIA_DEVICE_CAP_REDUCE | WIA_DEVICE_CAP_PINNED_HOST |
             WIA_DEVICE_CAP_DMABUF;
  ops.must_understand = 0;
  ops.device_count = device_count;
  ops.device_props = device_props;
  ops.mem_alloc = mem_alloc;
  ops.mem_free = mem_free;
  ops.memset = memset_sync;
  ops.memcpy = memcpy_sync;
  ops.stream_create = stream_create;
  ops.stream_destroy = stream_destroy;
  ops.stream_synchronize = stream_synchronize;
  ops.stream_query = stream_query;
  ops.memset_async = memset_async;
  ops.memcpy_async = memcpy_async;
  ops.event_create = event_create;
  ops.event_destroy = event_destroy;
  ops.event_record = event_record;
  ops.event_query = event_query;
  ops.event_synchronize = event_synchronize;
  ops.stream_wait_event = stream_wait_event;
  ops.event_elapsed_ms = event_elapsed_ms;
  ops.launch_host_func = launch_host_func;
  ops.can_access_peer = can_access_peer;
  ops.enable_peer_access = enable_peer_access;
  ops.memcpy_peer_async = memcpy_peer_async;
  ops.ipc_get_handle = ipc_get_handle;
  ops.ipc_open_handle = ipc_open_handle;
  ops.ipc_close_handle = ipc_close_handle;
  ops.reduce_async = reduce_async;
  ops.mem_export_dmabuf = mem_export_dmabuf;
  return ops;
}

const wia_device_ops_v1_t kDeviceOps = make_device_ops();

}  // namespace
}  // namespace wia::ze

extern "C" {
WIA_PROVIDER_EXPORT extern const wia_provider_v1_t wia_provider_v1;
const wia_provider_v1_t wia_provider_v1 = {
    .struct_size = sizeof(wia_provider_v1_t),
    .abi_version = WIA_PROVIDER_ABI_VERSION,
    .name = "ze",
    // wia-info prints this beside the name: it says where reductions run.
    .version = WIA_ZE_PROVIDER_VERSION " (reduce: host-staged, no SPIR-V kernels)",
    .caps = WIA_PROVIDER_CAP_DEVICE,
    .host_services_version = WIA_HOST_SERVICES_VERSION,
    .num_params = sizeof(wia::ze::kParams) / sizeof(wia::ze::kParams[0]),
    .params = wia::ze::kParams,
    .init = wia::ze::init,
    .fini = wia::ze::fini,
    .device = &wia::ze::kDeviceOps,
    .transport = nullptr,
};
}
