// SPDX-License-Identifier: Apache-2.0
// The `hip` provider's tables and devices: its parameter, init/fini,
// discovery, peer access and the descriptor the core loads. Memory and IPC
// are in hip_memory.cpp, streams and events in hip_stream.cpp, the
// host-staged reduction in hip_reduce.cpp, the runtime in hip_runtime.cpp.
//
// Decisions worth knowing (docs/provider-hip.md has them all):
//  - The HIP runtime API, opened with dlopen and resolved with dlsym: the
//    provider builds without ROCm and loads as "absent" where there is no
//    runtime or no GPU.
//  - HIP has no contexts in its runtime API: a device is made current with
//    hipSetDevice on every entry, and the caller's device is put back.
//  - Reductions are staged through host memory (no hipcc kernels yet); the
//    version string wia-info shows says so.
#include "hip_provider.hpp"

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstring>

namespace wia::hip {

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
      return p.fail(WIA_ERROR_INVALID_ARGUMENT, "device_props on HIP device %d: props is NULL",
                    dev);
    if (const wia_status_t st = p.check_device(dev, "device_props"); st != WIA_SUCCESS) return st;
    const std::uint32_t caller_size = props->struct_size;
    if (!WIA_ABI_HAS_FIELD(wia_device_props_v1_t, caller_size, type))
      return p.fail(WIA_ERROR_INVALID_ARGUMENT,
                    "device_props on HIP device %d: struct_size %u is too small", dev, caller_size);
    Device& d = *p.devices[static_cast<std::size_t>(dev)];
    wia_device_props_v1_t full{};
    full.struct_size = caller_size;
    full.type = WIA_DEVICE_GPU;
    std::snprintf(full.name, sizeof(full.name), "%s", d.name.c_str());
    std::snprintf(full.pci_bus_id, sizeof(full.pci_bus_id), "%s", d.pci_bus_id.c_str());
    full.total_memory = d.total_memory;
    // hipMemGetInfo works on the current device and sets it up on first
    // use; discovery must not, so free memory is known only once in use.
    if (d.used.load(std::memory_order_relaxed)) {
      std::size_t free_bytes = 0, total_bytes = 0;
      if (p.rt.hipSetDevice(dev) == WIA_hipSuccess &&
          p.rt.hipMemGetInfo(&free_bytes, &total_bytes) == WIA_hipSuccess)
        full.free_memory = free_bytes;
    }
    full.numa_node = -1;  // no ROCm 5/6-stable query; 0 topology hints beat wrong ones
    full.flags = WIA_DEVICE_FLAG_UNIFIED_ADDRESS;
    full.alignment = 256;  // hipMalloc's documented minimum
    full.mem_iface = WIA_MEM_IFACE_ROCM;
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
      *can_access = 1;  // a GPU always reaches its own memory (HIP answers 0)
      return WIA_SUCCESS;
    }
    int answer = 0;
    const wia_hipError_t r = p.rt.hipDeviceCanAccessPeer(&answer, dev, peer);
    if (r != WIA_hipSuccess) return p.fail_hip(r, dev, "hipDeviceCanAccessPeer(peer %d)", peer);
    *can_access = answer != 0 ? 1 : 0;
    return WIA_SUCCESS;
  });
}

wia_status_t enable_peer_access(void* ctx, std::int32_t dev, std::int32_t peer) noexcept {
  return guarded(ctx, "enable_peer_access", [&](Provider& p) -> wia_status_t {
    if (!p.valid_device(dev) || !p.valid_device(peer))
      return p.fail(WIA_ERROR_INVALID_DEVICE,
                    "enable_peer_access: device pair %d -> %d out of range (have %zu)", dev, peer,
                    p.devices.size());
    if (dev == peer) return WIA_SUCCESS;
    if (const wia_status_t st = p.use_device(dev, "enable_peer_access"); st != WIA_SUCCESS)
      return st;
    const wia_hipError_t r = p.rt.hipDeviceEnablePeerAccess(peer, 0);
    // Enabling twice is success in the ABI; the runtime calls it an error.
    if (r == WIA_hipSuccess || r == WIA_hipErrorPeerAccessAlreadyEnabled) return WIA_SUCCESS;
    return p.fail_hip(r, dev, "hipDeviceEnablePeerAccess(to device %d)", peer);
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
    // Empty (the default): libamdhip64.so.5, then libamdhip64.so.
    const std::string library = param_text(host, "library", "");
    if (const wia_status_t st = runtime_open(*p, library); st != WIA_SUCCESS) return st;
    {
      // Discovery may set a device current on this thread (some runtimes
      // do in hipGetDeviceCount): put the caller's back.
      const CurrentDeviceKeeper keep(p->rt);
      if (const wia_status_t st = discover_devices(*p); st != WIA_SUCCESS) return st;
    }
    const int v = p->rt.version;
    p->log(WIA_LOG_INFO,
           "HIP runtime %d.%d (%s): %zu device(s); reductions staged through host memory (no "
           "hipcc kernels)",
           v / 10000000, (v / 100000) % 100, p->rt.path.c_str(), p->devices.size());
    for (const auto& d : p->devices)
      p->log(WIA_LOG_INFO, "device %d: %s, %" PRIu64 " MiB, PCI %s", d->index, d->name.c_str(),
             d->total_memory >> 20, d->pci_bus_id.empty() ? "none" : d->pci_bus_id.c_str());
    *ctx = p.release();
    return WIA_SUCCESS;
  } catch (const std::bad_alloc&) {
    if (host->set_error != nullptr) host->set_error(host->host_ctx, "hip init: out of memory");
    return WIA_ERROR_OUT_OF_MEMORY;
  } catch (...) {
    if (host->set_error != nullptr)
      host->set_error(host->host_ctx, "hip init: unexpected exception");
    return WIA_ERROR_INTERNAL;
  }
}

wia_status_t fini(void* ctx) noexcept {
  auto* p = static_cast<Provider*>(ctx);
  if (p == nullptr || p->magic != Provider::kMagic) return WIA_ERROR_INVALID_ARGUMENT;
  {
    const CurrentDeviceKeeper keep(p->rt);
    release_all_handles(*p);
    release_all_memory(*p);
  }
  // libamdhip64 stays loaded: its threads and exit handlers outlive us,
  // and unloading it under them crashes at exit (as with libcuda).
  p->magic = 0;
  delete p;
  return WIA_SUCCESS;
}

const wia_param_decl_v1_t kParams[] = {
    {sizeof(wia_param_decl_v1_t), WIA_PARAM_STRING, "library", "",
     "the HIP runtime library to open (a file name searched like dlopen does, or a path); empty: "
     "libamdhip64.so.5, then libamdhip64.so",
     0, 0},
};

wia_device_ops_v1_t make_device_ops() {
  wia_device_ops_v1_t ops{};
  ops.struct_size = sizeof(wia_device_ops_v1_t);
  ops.abi_version = WIA_PROVIDER_ABI_VERSION;
  // No SCALE and no KERNEL: both need device code, which this provider
  // does not build yet (docs/provider-hip.md). DMABUF is claimed whatever
  // the runtime: caps are fixed before init opens it, and where it has no
  // hipMemGetHandleForAddressRange (ROCm 5.2) mem_export_dmabuf answers
  // NOT_SUPPORTED naming it, which the core takes as "stage this buffer".
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
}  // namespace wia::hip

extern "C" {
WIA_PROVIDER_EXPORT extern const wia_provider_v1_t wia_provider_v1;
const wia_provider_v1_t wia_provider_v1 = {
    .struct_size = sizeof(wia_provider_v1_t),
    .abi_version = WIA_PROVIDER_ABI_VERSION,
    .name = "hip",
    // wia-info prints this beside the name: it says where reductions run.
    .version = WIA_HIP_PROVIDER_VERSION " (reduce: host-staged)",
    .caps = WIA_PROVIDER_CAP_DEVICE,
    .host_services_version = WIA_HOST_SERVICES_VERSION,
    .num_params = sizeof(wia::hip::kParams) / sizeof(wia::hip::kParams[0]),
    .params = wia::hip::kParams,
    .init = wia::hip::init,
    .fini = wia::hip::fini,
    .device = &wia::hip::kDeviceOps,
    .transport = nullptr,
};
}
