// SPDX-License-Identifier: Apache-2.0
// The HIP runtime at init (dlopen, dlsym of every entry, hipInit), device
// discovery, the one hipError_t -> status mapping, error messages, handles.
#include <dlfcn.h>

#include <cstdarg>
#include <cstdio>
#include <cstring>

#include "hip_provider.hpp"
#include "wia_common/host_messages.hpp"
#include "wia_common/vendor_library.hpp"

namespace wia::hip {

wia_status_t status_of(wia_hipError_t error) noexcept {
  switch (error) {
    case WIA_hipSuccess:
      return WIA_SUCCESS;
    case WIA_hipErrorNotReady:
      return WIA_IN_PROGRESS;
    case WIA_hipErrorOutOfMemory:
      return WIA_ERROR_OUT_OF_MEMORY;
    case WIA_hipErrorInvalidValue:
      return WIA_ERROR_INVALID_ARGUMENT;
    case WIA_hipErrorInvalidDevice:
      return WIA_ERROR_INVALID_DEVICE;
    case WIA_hipErrorInvalidHandle:
    case WIA_hipErrorInvalidContext:
      return WIA_ERROR_INVALID_HANDLE;
    case WIA_hipErrorNotSupported:
    case WIA_hipErrorPeerAccessUnsupported:
      return WIA_ERROR_NOT_SUPPORTED;
    case WIA_hipErrorNoDevice:
    case WIA_hipErrorInsufficientDriver:
    case WIA_hipErrorNotInitialized:
    case WIA_hipErrorDeinitialized:
      return WIA_ERROR_UNAVAILABLE;
    default:
      // Launch failures, illegal addresses, ...: the device or the runtime
      // failed, and ABI v1 has no more precise status for it.
      return WIA_ERROR_INTERNAL;
  }
}

std::string error_name(const Runtime& rt, wia_hipError_t error) {
  const char* name = rt.hipGetErrorName != nullptr ? rt.hipGetErrorName(error) : nullptr;
  if (name != nullptr && *name != '\0') return name;
  return "hipError_t " + std::to_string(error);
}

wia_status_t Provider::fail(wia_status_t st, const char* fmt, ...) const noexcept {
  va_list ap;
  va_start(ap, fmt);
  common::host_verror(host, fmt, ap);
  va_end(ap);
  return st;
}

wia_status_t Provider::fail_hip(wia_hipError_t error, std::int32_t dev, const char* fmt,
                                ...) const noexcept {
  std::string name;
  try {
    name = error_name(rt, error);
  } catch (...) {
  }
  va_list ap;
  va_start(ap, fmt);
  common::host_vendor_error(
      host, dev, valid_device(dev) ? devices[static_cast<std::size_t>(dev)]->name.c_str() : nullptr,
      name.c_str(), fmt, ap);
  va_end(ap);
  return status_of(error);
}

void Provider::log(wia_log_level_t level, const char* fmt, ...) const noexcept {
  va_list ap;
  va_start(ap, fmt);
  common::host_vlog(host, level, fmt, ap);
  va_end(ap);
}

wia_status_t Provider::check_device(std::int32_t dev, const char* call) const noexcept {
  if (valid_device(dev)) return WIA_SUCCESS;
  return fail(WIA_ERROR_INVALID_DEVICE, "%s: no HIP device %d (have %zu)", call, dev,
              devices.size());
}

wia_status_t Provider::use_device(std::int32_t dev, const char* call) noexcept {
  if (const wia_status_t st = check_device(dev, call); st != WIA_SUCCESS) return st;
  // On every entry: the calling thread may be new, or the application may
  // have set another device since our last call.
  const wia_hipError_t r = rt.hipSetDevice(dev);
  if (r != WIA_hipSuccess) return fail_hip(r, dev, "%s: hipSetDevice(%d)", call, dev);
  devices[static_cast<std::size_t>(dev)]->used.store(true, std::memory_order_relaxed);
  return WIA_SUCCESS;
}

Stream* Provider::find_stream(wia_provider_stream_t h, const char* call) noexcept {
  auto* s = reinterpret_cast<Stream*>(h);
  {
    std::shared_lock<std::shared_mutex> lk(handles_mu);
    if (streams.count(s) != 0) return s;
  }
  fail(WIA_ERROR_INVALID_HANDLE, "%s: %p is not a live stream of the hip provider", call,
       static_cast<void*>(h));
  return nullptr;
}

Event* Provider::find_event(wia_provider_event_t h, const char* call) noexcept {
  auto* e = reinterpret_cast<Event*>(h);
  {
    std::shared_lock<std::shared_mutex> lk(handles_mu);
    if (events.count(e) != 0) return e;
  }
  fail(WIA_ERROR_INVALID_HANDLE, "%s: %p is not a live event of the hip provider", call,
       static_cast<void*>(h));
  return nullptr;
}

wia_status_t runtime_open(Provider& p, const std::string& library) {
  Runtime& rt = p.rt;
  // The default is a list: the ROCm 5 soname first (Debian 12/13 ship
  // libamdhip64.so.5), then the unversioned name (ROCm 6 installs, or a
  // -dev package's link). An explicit `library` is opened alone.
  std::vector<std::string> names;
  if (library.empty()) {
    names = {"libamdhip64.so.5", "libamdhip64.so"};
  } else {
    names = {library};
  }
  // NODELETE: the runtime stays mapped after our dlclose, as vendor
  // runtimes expect (ROCm's never expects to be unloaded). Its static
  // initialisers allocate at load, even with no GPU; unmapped, that memory
  // would be reported as a leak of every process that loaded this provider.
  common::OpenedLibrary lib = common::open_first_library(names, RTLD_NODELETE);
  if (lib.handle == nullptr)
    return p.fail(WIA_ERROR_UNAVAILABLE, "HIP runtime not found (dlopen %s)", lib.tried.c_str());
  rt.library = lib.handle;
  rt.path = lib.name;
  const char* missing = nullptr;
#define WIA_HIP_RESOLVE(ret, name, params)            \
  {                                                   \
    void* fn = ::dlsym(rt.library, #name);            \
    if (fn != nullptr)                                \
      rt.name = reinterpret_cast<wia_PFN_##name>(fn); \
    else if (missing == nullptr)                      \
      missing = #name;                                \
  }
  WIA_HIP_RUNTIME_ENTRIES(WIA_HIP_RESOLVE)
#undef WIA_HIP_RESOLVE
#define WIA_HIP_RESOLVE_OPTIONAL(ret, name, params) \
  rt.name = reinterpret_cast<wia_PFN_##name>(::dlsym(rt.library, #name));
  WIA_HIP_RUNTIME_OPTIONAL_ENTRIES(WIA_HIP_RESOLVE_OPTIONAL)
  WIA_HIP_RUNTIME_NEWER_ENTRIES(WIA_HIP_RESOLVE_OPTIONAL)
#undef WIA_HIP_RESOLVE_OPTIONAL
  if (missing != nullptr) {
    // Before hipInit nothing of the runtime runs yet: unloading is safe.
    ::dlclose(rt.library);
    rt.library = nullptr;
    return p.fail(WIA_ERROR_UNAVAILABLE,
                  "%s has no %s: a HIP runtime older than ROCm 5 (or not a HIP runtime)",
                  rt.path.c_str(), missing);
  }
  const wia_hipError_t r = rt.hipInit(0);
  if (r != WIA_hipSuccess)
    return p.fail(WIA_ERROR_UNAVAILABLE, "hipInit (%s): %s", rt.path.c_str(),
                  error_name(rt, r).c_str());
  if (rt.hipRuntimeGetVersion(&rt.version) != WIA_hipSuccess) rt.version = 0;
  return WIA_SUCCESS;
}

namespace {

// hipStreamAddCallback's callback running a host function. Like CUDA's
// stream callbacks it also runs when earlier work failed (`status`): the
// function may release what the caller waits for, and the failure is the
// stream's, reported by its next synchronize.
struct HostFnCall {
  wia_hipHostFn_t fn;
  void* data;
};
void run_host_fn(wia_hipStream_t, wia_hipError_t, void* arg) {
  const HostFnCall call = *static_cast<HostFnCall*>(arg);
  delete static_cast<HostFnCall*>(arg);
  call.fn(call.data);
}

}  // namespace

wia_hipError_t Runtime::enqueue_host_fn(wia_hipStream_t stream, wia_hipHostFn_t fn,
                                        void* data) const {
  if (hipLaunchHostFunc != nullptr) return hipLaunchHostFunc(stream, fn, data);
  auto* call = new HostFnCall{fn, data};
  const wia_hipError_t r = hipStreamAddCallback(stream, run_host_fn, call, 0);
  if (r != WIA_hipSuccess) delete call;
  return r;
}

wia_status_t discover_devices(Provider& p) {
  const Runtime& rt = p.rt;
  int count = 0;
  wia_hipError_t r = rt.hipGetDeviceCount(&count);
  // No GPU (or no /dev/kfd access): the provider is absent, not broken.
  if (r == WIA_hipErrorNoDevice || (r == WIA_hipSuccess && count == 0))
    return p.fail(WIA_ERROR_UNAVAILABLE, "no HIP device (hipGetDeviceCount: %s)",
                  r == WIA_hipSuccess ? "0 devices" : error_name(rt, r).c_str());
  if (r != WIA_hipSuccess) return p.fail_hip(r, -1, "hipGetDeviceCount");
  for (int i = 0; i < count; ++i) {
    auto d = std::make_unique<Device>();
    d->index = i;
    char text[256] = {};
    if ((r = rt.hipDeviceGetName(text, sizeof(text) - 1, i)) != WIA_hipSuccess)
      return p.fail_hip(r, -1, "hipDeviceGetName(device %d)", i);
    d->name = text;
    std::memset(text, 0, sizeof(text));
    if (rt.hipDeviceGetPCIBusId(text, sizeof(text) - 1, i) == WIA_hipSuccess) d->pci_bus_id = text;
    for (char& c : d->pci_bus_id)
      if (c >= 'A' && c <= 'F') c = static_cast<char>(c - 'A' + 'a');  // as sysfs spells it
    std::size_t total = 0;
    if ((r = rt.hipDeviceTotalMem(&total, i)) != WIA_hipSuccess)
      return p.fail_hip(r, -1, "hipDeviceTotalMem(device %d)", i);
    d->total_memory = total;
    p.devices.push_back(std::move(d));
  }
  return WIA_SUCCESS;
}

}  // namespace wia::hip
