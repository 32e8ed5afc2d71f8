// SPDX-License-Identifier: Apache-2.0
// The `cuda` provider's tables and devices: its parameter, init/fini,
// discovery, peer access and the descriptor the core loads. Memory and IPC
// are in cuda_memory.cpp, streams and events in cuda_stream.cpp, the
// provider's own kernels in cuda_kernels.cpp, the driver in cuda_driver.cpp.
//
// Decisions worth knowing (docs/provider-cuda.md has them all):
//  - The Driver API only, opened with dlopen and resolved through
//    cuGetProcAddress at the 12.0 ABI: the provider builds on a machine
//    without CUDA and loads as "absent" where there is no driver.
//  - One context per device: the primary context, retained at first use
//    (never by discovery) and released in fini; every entry makes it current
//    on the calling thread.
//  - Device memory is never host accessible; memcpy relies on unified
//    addressing to find directions.
#include "cuda_provider.hpp"

#include <algorithm>
#include <cinttypes>
#include <cstdlib>
#include <cstdio>
#include <cstring>

namespace wia::cuda {

// --------------------------------------------------------------------------
// Entry points: discovery

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
      return p.fail(WIA_ERROR_INVALID_ARGUMENT, "device_props on CUDA device %d: props is NULL",
                    dev);
    if (const wia_status_t st = p.check_device(dev, "device_props"); st != WIA_SUCCESS) return st;
    const std::uint32_t caller_size = props->struct_size;
    if (!WIA_ABI_HAS_FIELD(wia_device_props_v1_t, caller_size, type))
      return p.fail(WIA_ERROR_INVALID_ARGUMENT,
                    "device_props on CUDA device %d: struct_size %u is too small", dev,
                    caller_size);
    Device& d = *p.devices[static_cast<std::size_t>(dev)];
    wia_device_props_v1_t full{};
    full.struct_size = caller_size;
    full.type = WIA_DEVICE_GPU;
    std::snprintf(full.name, sizeof(full.name), "%s", d.name.c_str());
    std::snprintf(full.pci_bus_id, sizeof(full.pci_bus_id), "%s", d.pci_bus_id.c_str());
    full.total_memory = d.total_memory;
    // cuMemGetInfo needs a context, and discovery must not create one (it
    // costs hundreds of MiB and seconds per GPU): free memory is known only
    // once the device is in use.
    if (wia_CUcontext c = d.ctx.load(std::memory_order_acquire); c != nullptr) {
      std::size_t free_bytes = 0, total_bytes = 0;
      if (p.driver.cuCtxSetCurrent(c) == WIA_CUDA_SUCCESS &&
          p.driver.cuMemGetInfo(&free_bytes, &total_bytes) == WIA_CUDA_SUCCESS)
        full.free_memory = free_bytes;
    }
    full.numa_node = d.numa_node;
    full.flags = WIA_DEVICE_FLAG_UNIFIED_ADDRESS;
    full.alignment = 256;  // cuMemAlloc's documented minimum
    full.mem_iface = WIA_MEM_IFACE_CUDA;
    // The GPU's CUdevice, whichever logical slot of it this device is: what
    // FI_HMEM and the driver's own calls name it by.
    full.mem_device = static_cast<std::int32_t>(d.cu);
    full.flags |= WIA_DEVICE_FLAG_MEM_DEVICE;
    std::memcpy(props, &full, std::min<std::size_t>(caller_size, sizeof(full)));
    return WIA_SUCCESS;
  });
}

// --------------------------------------------------------------------------
// Entry points: peers

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
    if (p.devices[static_cast<std::size_t>(dev)]->cu == p.devices[static_cast<std::size_t>(peer)]->cu) {
      *can_access = 1;  // a GPU always reaches its own memory (logical devices too)
      return WIA_SUCCESS;
    }
    int answer = 0;
    const wia_CUresult r =
        p.driver.cuDeviceCanAccessPeer(&answer, p.devices[static_cast<std::size_t>(dev)]->cu,
                                       p.devices[static_cast<std::size_t>(peer)]->cu);
    if (r != WIA_CUDA_SUCCESS) return p.fail_cu(r, dev, "cuDeviceCanAccessPeer(peer %d)", peer);
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
    // Nothing to enable on one GPU (its logical devices share a context).
    if (p.devices[static_cast<std::size_t>(dev)]->cu == p.devices[static_cast<std::size_t>(peer)]->cu)
      return WIA_SUCCESS;
    wia_CUcontext peer_ctx = nullptr;
    if (const wia_status_t st = p.context_of(peer, "enable_peer_access", &peer_ctx);
        st != WIA_SUCCESS)
      return st;
    if (const wia_status_t st = p.use_device(dev, "enable_peer_access"); st != WIA_SUCCESS)
      return st;
    const wia_CUresult r = p.driver.cuCtxEnablePeerAccess(peer_ctx, 0);
    // Enabling twice is success in the ABI; the driver calls it an error.
    if (r == WIA_CUDA_SUCCESS || r == WIA_CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED)
      return WIA_SUCCESS;
    return p.fail_cu(r, dev, "cuCtxEnablePeerAccess(to device %d)", peer);
  });
}

namespace {

// --------------------------------------------------------------------------
// init / fini

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
    const std::string library = param_text(host, "library", "libcuda.so.1");
    if (const wia_status_t st = driver_open(*p, library); st != WIA_SUCCESS) return st;
    const long long logical = std::atoll(param_text(host, "logical_devices_per_gpu", "1"));
    if (const wia_status_t st =
            discover_devices(*p, static_cast<int>(std::clamp(logical, 1LL, 64LL)));
        st != WIA_SUCCESS)
      return st;
    const int v = p->driver.version;
    p->log(WIA_LOG_INFO, "CUDA driver %d.%d (%s): %zu device(s)", v / 1000, (v % 1000) / 10,
           library.c_str(), p->devices.size());
    for (const auto& d : p->devices)
      p->log(WIA_LOG_INFO, "device %d: %s, sm_%d%d, %d SMs, %" PRIu64 " MiB, PCI %s, NUMA node %d",
             d->index, d->name.c_str(), d->cc_major, d->cc_minor, d->sm_count,
             d->total_memory >> 20, d->pci_bus_id.empty() ? "none" : d->pci_bus_id.c_str(),
             d->numa_node);
    *ctx = p.release();
    return WIA_SUCCESS;
  } catch (const std::bad_alloc&) {
    if (host->set_error != nullptr) host->set_error(host->host_ctx, "cuda init: out of memory");
    return WIA_ERROR_OUT_OF_MEMORY;
  } catch (...) {
    if (host->set_error != nullptr)
      host->set_error(host->host_ctx, "cuda init: unexpected exception");
    return WIA_ERROR_INTERNAL;
  }
}

wia_status_t fini(void* ctx) noexcept {
  auto* p = static_cast<Provider*>(ctx);
  if (p == nullptr || p->magic != Provider::kMagic) return WIA_ERROR_INVALID_ARGUMENT;
  // Handles and memory first: both need their context alive.
  release_all_handles(*p);
  release_all_memory(*p);
  unload_user_modules(*p);
  for (const auto& d : p->devices) {
    wia_CUcontext c = d->ctx.load(std::memory_order_acquire);
    if (c == nullptr) continue;
    if (p->driver.cuCtxSetCurrent(c) == WIA_CUDA_SUCCESS) unload_kernels(*p, *d);
    // Leave no released context current on this thread.
    p->driver.cuCtxSetCurrent(nullptr);
    const wia_CUresult r = p->driver.cuDevicePrimaryCtxRelease(d->cu);
    if (r != WIA_CUDA_SUCCESS)
      p->log(WIA_LOG_WARN, "fini: cuDevicePrimaryCtxRelease on device %d (%s): %s", d->index,
             d->name.c_str(), error_name(p->driver, r).c_str());
    d->ctx.store(nullptr, std::memory_order_release);
  }
  // libcuda stays loaded: its threads and exit handlers outlive any
  // context, and unloading it under them crashes at exit.
  p->magic = 0;
  delete p;
  return WIA_SUCCESS;
}

// --------------------------------------------------------------------------
// The descriptor

const wia_param_decl_v1_t kParams[] = {
    {sizeof(wia_param_decl_v1_t), WIA_PARAM_STRING, "library", "libcuda.so.1",
     "the CUDA driver library to open (a file name searched like dlopen does, or a path)", 0, 0},
    {sizeof(wia_param_decl_v1_t), WIA_PARAM_INT, "logical_devices_per_gpu", "1",
     "offer each GPU as this many devices sharing its memory (ranks of one GPU, for tests and "
     "benchmarks on a machine with fewer GPUs than ranks)",
     1, 64},
};

// Filled field by field from a zeroed table, so that entries appended to
// wia_device_ops_v1_t after this provider was written read as absent
// (NULL, capability bit clear) instead of breaking its build.
wia_device_ops_v1_t make_device_ops() {
  wia_device_ops_v1_t ops{};
  ops.struct_size = sizeof(wia_device_ops_v1_t);
  ops.abi_version = WIA_PROVIDER_ABI_VERSION;
  ops.caps = WIA_DEVICE_CAP_HOST_FUNC | WIA_DEVICE_CAP_EVENT_TIMING | WIA_DEVICE_CAP_PEER |
             WIA_DEVICE_CAP_IPC | WIA_DEVICE_CAP_REDUCE | WIA_DEVICE_CAP_PINNED_HOST |
             WIA_DEVICE_CAP_SCALE | WIA_DEVICE_CAP_KERNEL | WIA_DEVICE_CAP_DMABUF;
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
  ops.scale_async = scale_async;
  ops.module_load = module_load;
  ops.module_unload = module_unload;
  ops.module_function = module_function;
  ops.launch_kernel = launch_kernel;
  ops.mem_export_dmabuf = mem_export_dmabuf;
  return ops;
}

const wia_device_ops_v1_t kDeviceOps = make_device_ops();

}  // namespace
}  // namespace wia::cuda

extern "C" {
WIA_PROVIDER_EXPORT extern const wia_provider_v1_t wia_provider_v1;
const wia_provider_v1_t wia_provider_v1 = {
    .struct_size = sizeof(wia_provider_v1_t),
    .abi_version = WIA_PROVIDER_ABI_VERSION,
    .name = "cuda",
    .version = WIA_CUDA_PROVIDER_VERSION,
    .caps = WIA_PROVIDER_CAP_DEVICE,
    .host_services_version = WIA_HOST_SERVICES_VERSION,
    .num_params = sizeof(wia::cuda::kParams) / sizeof(wia::cuda::kParams[0]),
    .params = wia::cuda::kParams,
    .init = wia::cuda::init,
    .fini = wia::cuda::fini,
    .device = &wia::cuda::kDeviceOps,
    .transport = nullptr,
};
}
