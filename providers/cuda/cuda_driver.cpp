// SPDX-License-Identifier: Apache-2.0
// The CUDA driver at init (dlopen, cuGetProcAddress of every entry,
// cuInit), device discovery without contexts, the one CUresult -> status
// mapping, error messages, and primary contexts retained on first use.
#include <dlfcn.h>

#include <cinttypes>
#include <cstdarg>
#include <cstdio>
#include <cstring>

#include "cuda_provider.hpp"
#include "wia_common/host_messages.hpp"

namespace wia::cuda {

wia_status_t status_of(wia_CUresult result) noexcept {
  switch (result) {
    case WIA_CUDA_SUCCESS:
      return WIA_SUCCESS;
    case WIA_CUDA_ERROR_NOT_READY:
      return WIA_IN_PROGRESS;
    case WIA_CUDA_ERROR_OUT_OF_MEMORY:
      return WIA_ERROR_OUT_OF_MEMORY;
    case WIA_CUDA_ERROR_INVALID_VALUE:
      return WIA_ERROR_INVALID_ARGUMENT;
    case WIA_CUDA_ERROR_INVALID_DEVICE:
      return WIA_ERROR_INVALID_DEVICE;
    case WIA_CUDA_ERROR_INVALID_HANDLE:
    case WIA_CUDA_ERROR_INVALID_CONTEXT:
      return WIA_ERROR_INVALID_HANDLE;
    case WIA_CUDA_ERROR_NOT_SUPPORTED:
    case WIA_CUDA_ERROR_PEER_ACCESS_UNSUPPORTED:
      return WIA_ERROR_NOT_SUPPORTED;
    case WIA_CUDA_ERROR_NO_DEVICE:
    case WIA_CUDA_ERROR_STUB_LIBRARY:
    case WIA_CUDA_ERROR_NOT_INITIALIZED:
    case WIA_CUDA_ERROR_DEINITIALIZED:
      return WIA_ERROR_UNAVAILABLE;
    default:
      // Launch failures, illegal addresses, ECC errors...: the device or
      // the driver failed, and ABI v1 has no more precise status for it.
      return WIA_ERROR_INTERNAL;
  }
}

std::string error_name(const Driver& driver, wia_CUresult result) {
  const char* name = nullptr;
  if (driver.cuGetErrorName != nullptr &&
      driver.cuGetErrorName(result, &name) == WIA_CUDA_SUCCESS && name != nullptr)
    return name;
  return "CUresult " + std::to_string(result);
}

// --------------------------------------------------------------------------
// Messages

wia_status_t Provider::fail(wia_status_t st, const char* fmt, ...) const noexcept {
  va_list ap;
  va_start(ap, fmt);
  common::host_verror(host, fmt, ap);
  va_end(ap);
  return st;
}

wia_status_t Provider::fail_cu(wia_CUresult result, std::int32_t dev, const char* fmt,
                               ...) const noexcept {
  std::string name;
  try {
    name = error_name(driver, result);
  } catch (...) {
  }
  va_list ap;
  va_start(ap, fmt);
  common::host_vendor_error(
      host, dev, valid_device(dev) ? devices[static_cast<std::size_t>(dev)]->name.c_str() : nullptr,
      name.c_str(), fmt, ap);
  va_end(ap);
  return status_of(result);
}

void Provider::log(wia_log_level_t level, const char* fmt, ...) const noexcept {
  va_list ap;
  va_start(ap, fmt);
  common::host_vlog(host, level, fmt, ap);
  va_end(ap);
}

wia_status_t Provider::check_device(std::int32_t dev, const char* call) const noexcept {
  if (valid_device(dev)) return WIA_SUCCESS;
  return fail(WIA_ERROR_INVALID_DEVICE, "%s: no CUDA device %d (have %zu)", call, dev,
              devices.size());
}

// --------------------------------------------------------------------------
// Contexts

wia_status_t Provider::context_of(std::int32_t dev, const char* call, wia_CUcontext* ctx) noexcept {
  if (const wia_status_t st = check_device(dev, call); st != WIA_SUCCESS) return st;
  Device& d = *devices[static_cast<std::size_t>(dev)];
  wia_CUcontext c = d.ctx.load(std::memory_order_acquire);
  if (c == nullptr) {
    // The primary context, not one of our own: it is the context the CUDA
    // runtime and every library of the process share, so pointers and
    // streams of an application using cudaMalloc are ours too.
    std::lock_guard<std::mutex> lk(d.mu);
    c = d.ctx.load(std::memory_order_relaxed);
    if (c == nullptr) {
      const wia_CUresult r = driver.cuDevicePrimaryCtxRetain(&c, d.cu);
      if (r != WIA_CUDA_SUCCESS) return fail_cu(r, dev, "%s: cuDevicePrimaryCtxRetain", call);
      d.ctx.store(c, std::memory_order_release);
      log(WIA_LOG_DEBUG, "device %d (%s): primary context retained", dev, d.name.c_str());
    }
  }
  *ctx = c;
  return WIA_SUCCESS;
}

wia_status_t Provider::use_device(std::int32_t dev, const char* call) noexcept {
  wia_CUcontext c = nullptr;
  if (const wia_status_t st = context_of(dev, call, &c); st != WIA_SUCCESS) return st;
  // Set on every entry: the calling thread may be new, or the application
  // may have made another context current since our last call.
  const wia_CUresult r = driver.cuCtxSetCurrent(c);
  if (r != WIA_CUDA_SUCCESS) return fail_cu(r, dev, "%s: cuCtxSetCurrent", call);
  return WIA_SUCCESS;
}

// --------------------------------------------------------------------------
// Handles

Stream* Provider::find_stream(wia_provider_stream_t h, const char* call) noexcept {
  auto* s = reinterpret_cast<Stream*>(h);
  {
    std::shared_lock<std::shared_mutex> lk(handles_mu);
    if (streams.count(s) != 0) return s;
  }
  fail(WIA_ERROR_INVALID_HANDLE, "%s: %p is not a live stream of the cuda provider", call,
       static_cast<void*>(h));
  return nullptr;
}

Event* Provider::find_event(wia_provider_event_t h, const char* call) noexcept {
  auto* e = reinterpret_cast<Event*>(h);
  {
    std::shared_lock<std::shared_mutex> lk(handles_mu);
    if (events.count(e) != 0) return e;
  }
  fail(WIA_ERROR_INVALID_HANDLE, "%s: %p is not a live event of the cuda provider", call,
       static_cast<void*>(h));
  return nullptr;
}

// --------------------------------------------------------------------------
// Loading the driver

wia_status_t driver_open(Provider& p, const std::string& library) {
  Driver& drv = p.driver;
  drv.path = library;
  drv.library = ::dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (drv.library == nullptr) {
    const char* why = ::dlerror();
    return p.fail(WIA_ERROR_UNAVAILABLE, "%s not found (dlopen: %s)", library.c_str(),
                  why != nullptr ? why : "unknown error");
  }
  auto close_library = [&] {
    // Only before cuInit: once the driver has started its threads,
    // unloading it is unsafe, so an initialised driver stays mapped.
    ::dlclose(drv.library);
    drv.library = nullptr;
  };
  auto get_proc = reinterpret_cast<wia_PFN_cuGetProcAddress>(
      ::dlsym(drv.library, WIA_CUDA_GET_PROC_ADDRESS_SYMBOL));
  if (get_proc == nullptr) {
    close_library();
    return p.fail(WIA_ERROR_UNAVAILABLE,
                  "%s has no %s: a CUDA driver older than 12.0 (or not a CUDA driver)",
                  library.c_str(), WIA_CUDA_GET_PROC_ADDRESS_SYMBOL);
  }
  // Every entry at the 12.0 ABI: the driver hands back the variant with
  // that version's signature (cuMemAlloc_v2, ...), whatever its own version.
  const char* missing = nullptr;
  wia_CUresult missing_result = WIA_CUDA_SUCCESS;
  int missing_status = 0;
#define WIA_CUDA_RESOLVE(name, params)                                                         \
  {                                                                                            \
    void* fn = nullptr;                                                                        \
    int symbol_status = 0;                                                                     \
    const wia_CUresult r = get_proc(#name, &fn, WIA_CUDA_API_VERSION,                          \
                                    WIA_CU_GET_PROC_ADDRESS_DEFAULT, &symbol_status);          \
    if (r == WIA_CUDA_SUCCESS && fn != nullptr)                                                \
      drv.name = reinterpret_cast<wia_PFN_##name>(fn);                                         \
    else if (missing == nullptr && std::strcmp(#name, "cuMemGetHandleForAddressRange") != 0) { \
      missing = #name;                                                                         \
      missing_result = r;                                                                      \
      missing_status = symbol_status;                                                          \
    }                                                                                          \
  }
  WIA_CUDA_DRIVER_ENTRIES(WIA_CUDA_RESOLVE)
#undef WIA_CUDA_RESOLVE
  if (missing != nullptr) {
    // cuGetErrorName may itself be the missing one: name the code by hand.
    close_library();
    return p.fail(WIA_ERROR_UNAVAILABLE,
                  "%s: cuGetProcAddress(\"%s\", version %d) found no such entry (CUresult %d, "
                  "symbol status %d); the driver is too old or not a CUDA driver",
                  library.c_str(), missing, WIA_CUDA_API_VERSION, missing_result, missing_status);
  }
  const wia_CUresult r = drv.cuInit(0);
  if (r != WIA_CUDA_SUCCESS)
    return p.fail(WIA_ERROR_UNAVAILABLE, "cuInit: %s", error_name(drv, r).c_str());
  if (drv.cuDriverGetVersion(&drv.version) != WIA_CUDA_SUCCESS) drv.version = 0;
  return WIA_SUCCESS;
}

wia_status_t discover_devices(Provider& p, int logical_per_gpu) {
  const Driver& drv = p.driver;
  int count = 0;
  wia_CUresult r = drv.cuDeviceGetCount(&count);
  if (r == WIA_CUDA_ERROR_NO_DEVICE)
    count = 0;  // a valid answer, not a failure
  else if (r != WIA_CUDA_SUCCESS)
    return p.fail_cu(r, -1, "cuDeviceGetCount");
  for (int i = 0; i < count; ++i) {
    auto d = std::make_unique<Device>();
    d->index = i;
    if ((r = drv.cuDeviceGet(&d->cu, i)) != WIA_CUDA_SUCCESS)
      return p.fail_cu(r, -1, "cuDeviceGet(%d)", i);
    char text[256] = {};
    if ((r = drv.cuDeviceGetName(text, sizeof(text) - 1, d->cu)) != WIA_CUDA_SUCCESS)
      return p.fail_cu(r, -1, "cuDeviceGetName(device %d)", i);
    d->name = text;
    std::memset(text, 0, sizeof(text));
    // Not every device sits on PCI (a simulator, some SoCs): no bus id then.
    if (drv.cuDeviceGetPCIBusId(text, sizeof(text) - 1, d->cu) == WIA_CUDA_SUCCESS)
      d->pci_bus_id = text;
    for (char& c : d->pci_bus_id)
      if (c >= 'A' && c <= 'F') c = static_cast<char>(c - 'A' + 'a');  // as sysfs spells it
    std::size_t total = 0;
    if ((r = drv.cuDeviceTotalMem(&total, d->cu)) != WIA_CUDA_SUCCESS)
      return p.fail_cu(r, -1, "cuDeviceTotalMem(device %d)", i);
    d->total_memory = total;
    int value = 0;
    if (drv.cuDeviceGetAttribute(&value, WIA_CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, d->cu) ==
            WIA_CUDA_SUCCESS &&
        value > 0)
      d->sm_count = value;
    if (drv.cuDeviceGetAttribute(&value, WIA_CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, d->cu) ==
        WIA_CUDA_SUCCESS)
      d->cc_major = value;
    if (drv.cuDeviceGetAttribute(&value, WIA_CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, d->cu) ==
        WIA_CUDA_SUCCESS)
      d->cc_minor = value;
    // HOST_NUMA_ID exists from driver 12.2 on; older ones refuse the
    // attribute, and -1 (no NUMA affinity) is what the ABI says then.
    if (drv.cuDeviceGetAttribute(&value, WIA_CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID, d->cu) ==
            WIA_CUDA_SUCCESS &&
        value >= 0)
      d->numa_node = value;
    int unified = 0;
    if (drv.cuDeviceGetAttribute(&unified, WIA_CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING, d->cu) ==
            WIA_CUDA_SUCCESS &&
        unified == 0)
      // ABI v1 memcpy infers directions from pointers; without unified
      // addressing (32-bit or very old setups) that cannot work.
      return p.fail(WIA_ERROR_UNAVAILABLE,
                    "device %d (%s) has no unified addressing, which the cuda provider needs", i,
                    d->name.c_str());
    // The logical devices of this GPU: copies of what was discovered, each
    // retaining the primary context for itself (the driver counts).
    for (int slot = 1; slot < logical_per_gpu; ++slot) {
      auto l = std::make_unique<Device>();
      l->cu = d->cu;
      l->name = d->name + " (logical " + std::to_string(slot) + " of " +
                std::to_string(logical_per_gpu) + ")";
      l->pci_bus_id = d->pci_bus_id;
      l->total_memory = d->total_memory;
      l->numa_node = d->numa_node;
      l->sm_count = d->sm_count;
      l->cc_major = d->cc_major;
      l->cc_minor = d->cc_minor;
      l->logical_slot = slot;
      l->logical_count = logical_per_gpu;
      p.devices.push_back(std::move(l));
    }
    if (logical_per_gpu > 1) {
      d->name += " (logical 0 of " + std::to_string(logical_per_gpu) + ")";
      d->logical_count = logical_per_gpu;
    }
    p.devices.insert(p.devices.end() - (logical_per_gpu - 1), std::move(d));
  }
  for (std::size_t i = 0; i < p.devices.size(); ++i)
    p.devices[i]->index = static_cast<std::int32_t>(i);
  return WIA_SUCCESS;
}

}  // namespace wia::cuda
