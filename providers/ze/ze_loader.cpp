// SPDX-License-Identifier: Apache-2.0
// The Level Zero loader at init (dlopen, dlsym of every entry, zeInit),
// drivers, their contexts and devices, the one ze_result_t -> status
// mapping, messages, handle lookup, and the event pools.
#include <dlfcn.h>

#include <cinttypes>
#include <cstdarg>
#include <cstdio>
#include <cstring>

#include "wia_common/host_messages.hpp"
#include "wia_common/vendor_library.hpp"
#include "ze_provider.hpp"

namespace wia::ze {

wia_status_t status_of(wia_ze_result_t result) noexcept {
  switch (result) {
    case WIA_ZE_RESULT_SUCCESS:
      return WIA_SUCCESS;
    case WIA_ZE_RESULT_NOT_READY:
      return WIA_IN_PROGRESS;
    case WIA_ZE_RESULT_ERROR_OUT_OF_HOST_MEMORY:
    case WIA_ZE_RESULT_ERROR_OUT_OF_DEVICE_MEMORY:
      return WIA_ERROR_OUT_OF_MEMORY;
    case WIA_ZE_RESULT_ERROR_INVALID_ARGUMENT:
    case WIA_ZE_RESULT_ERROR_INVALID_NULL_POINTER:
    case WIA_ZE_RESULT_ERROR_INVALID_SIZE:
    case WIA_ZE_RESULT_ERROR_UNSUPPORTED_SIZE:
    case WIA_ZE_RESULT_ERROR_UNSUPPORTED_ALIGNMENT:
    case WIA_ZE_RESULT_ERROR_INVALID_ENUMERATION:
    case WIA_ZE_RESULT_ERROR_OVERLAPPING_REGIONS:
      return WIA_ERROR_INVALID_ARGUMENT;
    case WIA_ZE_RESULT_ERROR_INVALID_NULL_HANDLE:
    case WIA_ZE_RESULT_ERROR_HANDLE_OBJECT_IN_USE:
    case WIA_ZE_RESULT_ERROR_INVALID_SYNCHRONIZATION_OBJECT:
      return WIA_ERROR_INVALID_HANDLE;
    case WIA_ZE_RESULT_ERROR_UNSUPPORTED_FEATURE:
    case WIA_ZE_RESULT_ERROR_UNSUPPORTED_VERSION:
      return WIA_ERROR_NOT_SUPPORTED;
    case WIA_ZE_RESULT_ERROR_UNINITIALIZED:
    case WIA_ZE_RESULT_ERROR_DEPENDENCY_UNAVAILABLE:
    case WIA_ZE_RESULT_ERROR_DEVICE_IN_LOW_POWER_STATE:
      return WIA_ERROR_UNAVAILABLE;
    default:
      // Device lost, reset required, unknown: the device or the driver
      // failed, and ABI v1 has no more precise status for it.
      return WIA_ERROR_INTERNAL;
  }
}

std::string result_name(wia_ze_result_t result) {
  switch (result) {
#define WIA_ZE_NAME(value) \
  case WIA_##value:        \
    return #value;
    WIA_ZE_NAME(ZE_RESULT_SUCCESS)
    WIA_ZE_NAME(ZE_RESULT_NOT_READY)
    WIA_ZE_NAME(ZE_RESULT_ERROR_DEVICE_LOST)
    WIA_ZE_NAME(ZE_RESULT_ERROR_OUT_OF_HOST_MEMORY)
    WIA_ZE_NAME(ZE_RESULT_ERROR_OUT_OF_DEVICE_MEMORY)
    WIA_ZE_NAME(ZE_RESULT_ERROR_DEVICE_REQUIRES_RESET)
    WIA_ZE_NAME(ZE_RESULT_ERROR_DEVICE_IN_LOW_POWER_STATE)
    WIA_ZE_NAME(ZE_RESULT_ERROR_DEPENDENCY_UNAVAILABLE)
    WIA_ZE_NAME(ZE_RESULT_ERROR_UNINITIALIZED)
    WIA_ZE_NAME(ZE_RESULT_ERROR_UNSUPPORTED_VERSION)
    WIA_ZE_NAME(ZE_RESULT_ERROR_UNSUPPORTED_FEATURE)
    WIA_ZE_NAME(ZE_RESULT_ERROR_INVALID_ARGUMENT)
    WIA_ZE_NAME(ZE_RESULT_ERROR_INVALID_NULL_HANDLE)
    WIA_ZE_NAME(ZE_RESULT_ERROR_HANDLE_OBJECT_IN_USE)
    WIA_ZE_NAME(ZE_RESULT_ERROR_INVALID_NULL_POINTER)
    WIA_ZE_NAME(ZE_RESULT_ERROR_INVALID_SIZE)
    WIA_ZE_NAME(ZE_RESULT_ERROR_UNSUPPORTED_SIZE)
    WIA_ZE_NAME(ZE_RESULT_ERROR_UNSUPPORTED_ALIGNMENT)
    WIA_ZE_NAME(ZE_RESULT_ERROR_INVALID_SYNCHRONIZATION_OBJECT)
    WIA_ZE_NAME(ZE_RESULT_ERROR_INVALID_ENUMERATION)
    WIA_ZE_NAME(ZE_RESULT_ERROR_OVERLAPPING_REGIONS)
    WIA_ZE_NAME(ZE_RESULT_ERROR_UNKNOWN)
#undef WIA_ZE_NAME
    default:
      break;
  }
  char text[32];
  std::snprintf(text, sizeof(text), "ze_result_t 0x%08x", static_cast<unsigned>(result));
  return text;
}

wia_status_t Provider::fail(wia_status_t st, const char* fmt, ...) const noexcept {
  va_list ap;
  va_start(ap, fmt);
  common::host_verror(host, fmt, ap);
  va_end(ap);
  return st;
}

wia_status_t Provider::fail_ze(wia_ze_result_t result, std::int32_t dev, const char* fmt,
                               ...) const noexcept {
  std::string name;
  try {
    name = result_name(result);
  } catch (...) {
  }
  va_list ap;
  va_start(ap, fmt);
  common::host_vendor_error(host, dev, valid_device(dev) ? device(dev).name.c_str() : nullptr,
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
  return fail(WIA_ERROR_INVALID_DEVICE, "%s: no Level Zero device %d (have %zu)", call, dev,
              devices.size());
}

Stream* Provider::find_stream(wia_provider_stream_t h, const char* call) noexcept {
  auto* s = reinterpret_cast<Stream*>(h);
  {
    std::shared_lock<std::shared_mutex> lk(handles_mu);
    if (streams.count(s) != 0) return s;
  }
  fail(WIA_ERROR_INVALID_HANDLE, "%s: %p is not a live stream of the ze provider", call,
       static_cast<void*>(h));
  return nullptr;
}

Event* Provider::find_event(wia_provider_event_t h, const char* call) noexcept {
  auto* e = reinterpret_cast<Event*>(h);
  {
    std::shared_lock<std::shared_mutex> lk(handles_mu);
    if (events.count(e) != 0) return e;
  }
  fail(WIA_ERROR_INVALID_HANDLE, "%s: %p is not a live event of the ze provider", call,
       static_cast<void*>(h));
  return nullptr;
}

// --------------------------------------------------------------------------
// Event pools and recycling

ZeEvent* EventAllocator::get(Provider& p, std::int32_t dev) {
  std::lock_guard<std::mutex> lk(mu_);
  if (free_.empty()) {
    const Runtime& rt = p.rt;
    // Host-visible: the provider waits on and queries these events from the
    // host; timestamps are written by zeCommandListAppendWriteGlobalTimestamp
    // into host USM slots, so the pool needs no KERNEL_TIMESTAMP flag.
    wia_ze_event_pool_desc_t desc{WIA_ZE_STRUCTURE_TYPE_EVENT_POOL_DESC, nullptr,
                                  WIA_ZE_EVENT_POOL_FLAG_HOST_VISIBLE, kPoolSize};
    Pool pool;
    wia_ze_result_t r = rt.zeEventPoolCreate(context, &desc, 0, nullptr, &pool.h);
    if (r != WIA_ZE_RESULT_SUCCESS) {
      p.fail_ze(r, dev, "zeEventPoolCreate(%u host-visible events)", kPoolSize);
      return nullptr;
    }
    wia_ze_host_mem_alloc_desc_t hdesc{WIA_ZE_STRUCTURE_TYPE_HOST_MEM_ALLOC_DESC, nullptr, 0};
    void* slots = nullptr;
    r = rt.zeMemAllocHost(context, &hdesc, kPoolSize * sizeof(std::uint64_t), 64, &slots);
    if (r != WIA_ZE_RESULT_SUCCESS) {
      rt.zeEventPoolDestroy(pool.h);
      p.fail_ze(r, dev, "zeMemAllocHost(%zu bytes of timestamp slots)",
                kPoolSize * sizeof(std::uint64_t));
      return nullptr;
    }
    pool.timestamps = static_cast<std::uint64_t*>(slots);
    std::vector<std::unique_ptr<ZeEvent>> made;
    for (std::uint32_t i = 0; i < kPoolSize; ++i) {
      // HOST scope on signal: the timestamp and any copied data are visible
      // to the host once the event is seen signalled.
      wia_ze_event_desc_t edesc{WIA_ZE_STRUCTURE_TYPE_EVENT_DESC, nullptr, i,
                                WIA_ZE_EVENT_SCOPE_FLAG_HOST, WIA_ZE_EVENT_SCOPE_FLAG_HOST};
      auto e = std::make_unique<ZeEvent>();
      r = rt.zeEventCreate(pool.h, &edesc, &e->h);
      if (r != WIA_ZE_RESULT_SUCCESS) {
        for (auto& m : made) rt.zeEventDestroy(m->h);
        rt.zeMemFree(context, slots);
        rt.zeEventPoolDestroy(pool.h);
        p.fail_ze(r, dev, "zeEventCreate(index %u of a new pool)", i);
        return nullptr;
      }
      e->timestamp = pool.timestamps + i;
      made.push_back(std::move(e));
    }
    pools_.push_back(pool);
    for (auto& e : made) {
      free_.push_back(e.get());
      all_.push_back(std::move(e));
    }
  }
  ZeEvent* e = free_.back();
  free_.pop_back();
  return e;
}

void EventAllocator::put(const Runtime& rt, ZeEvent* e) noexcept {
  rt.zeEventHostReset(e->h);
  e->waiters.clear();
  e->signaller.reset();
  e->signal_position = 0;
  *e->timestamp = 0;
  std::lock_guard<std::mutex> lk(mu_);
  free_.push_back(e);
}

void EventAllocator::destroy_all(const Runtime& rt) noexcept {
  std::lock_guard<std::mutex> lk(mu_);
  for (auto& e : all_) rt.zeEventDestroy(e->h);
  all_.clear();
  free_.clear();
  for (const Pool& pool : pools_) {
    rt.zeEventPoolDestroy(pool.h);
    rt.zeMemFree(context, pool.timestamps);
  }
  pools_.clear();
}

void Provider::retire(Driver* d, ZeEvent* e) {
  std::lock_guard<std::mutex> lk(graveyard_mu);
  graveyard.emplace_back(d, e);
}

void note_signalled(const ZeEvent& e) noexcept {
  if (e.signaller == nullptr) return;
  std::uint64_t now = e.signaller->done.load(std::memory_order_relaxed);
  while (now < e.signal_position && !e.signaller->done.compare_exchange_weak(
                                        now, e.signal_position, std::memory_order_acq_rel)) {
  }
}

void Provider::sweep() noexcept {
  std::lock_guard<std::mutex> lk(graveyard_mu);
  // First what the signalled events say about their streams' progress, then
  // which events no wait still needs.
  std::vector<char> signalled;
  try {
    signalled.assign(graveyard.size(), 0);
  } catch (...) {
    return;  // out of host memory: recycle later
  }
  for (std::size_t i = 0; i < graveyard.size(); ++i) {
    if (rt.zeEventQueryStatus(graveyard[i].second->h) != WIA_ZE_RESULT_SUCCESS) continue;
    signalled[i] = 1;
    note_signalled(*graveyard[i].second);
  }
  for (std::size_t i = graveyard.size(); i-- > 0;) {
    auto [d, e] = graveyard[i];
    bool free = signalled[i] != 0;
    for (const ZeEvent::Waiter& w : e->waiters)
      if (w.clock->done.load(std::memory_order_acquire) < w.position) free = false;
    if (!free) continue;
    d->events.put(rt, e);
    graveyard[i] = graveyard.back();  // one already looked at (the loop runs backwards)
    graveyard.pop_back();
  }
}

// --------------------------------------------------------------------------
// Loader, drivers, devices

wia_status_t loader_open(Provider& p, const std::string& library) {
  Runtime& rt = p.rt;
  // The default is a list: the soname Debian's libze1 installs, then the
  // -dev link. An explicit `library` is opened alone.
  std::vector<std::string> names;
  if (library.empty()) {
    names = {"libze_loader.so.1", "libze_loader.so"};
  } else {
    names = {library};
  }
  // NODELETE: the loader and its drivers stay mapped after our dlclose;
  // vendor runtimes expect never to be unloaded (as libcuda, libamdhip64).
  common::OpenedLibrary lib = common::open_first_library(names, RTLD_NODELETE);
  if (lib.handle == nullptr)
    return p.fail(WIA_ERROR_UNAVAILABLE, "Level Zero loader not found (dlopen %s)",
                  lib.tried.c_str());
  rt.library = lib.handle;
  rt.path = lib.name;
  const char* missing = nullptr;
#define WIA_ZE_RESOLVE(name, params)                  \
  {                                                   \
    void* fn = ::dlsym(rt.library, #name);            \
    if (fn != nullptr)                                \
      rt.name = reinterpret_cast<wia_PFN_##name>(fn); \
    else if (missing == nullptr)                      \
      missing = #name;                                \
  }
  WIA_ZE_ENTRIES(WIA_ZE_RESOLVE)
#undef WIA_ZE_RESOLVE
  if (missing != nullptr) {
    ::dlclose(rt.library);
    rt.library = nullptr;
    return p.fail(WIA_ERROR_UNAVAILABLE,
                  "%s has no %s: not a Level Zero 1.x loader (or older than API 1.0)",
                  rt.path.c_str(), missing);
  }
  // 0: every driver type. The loader answers ERROR_UNINITIALIZED when it
  // finds no driver at all (Debian ships none for CPUs).
  const wia_ze_result_t r = rt.zeInit(0);
  if (r != WIA_ZE_RESULT_SUCCESS)
    return p.fail(WIA_ERROR_UNAVAILABLE, "no Level Zero driver: zeInit (%s): %s", rt.path.c_str(),
                  result_name(r).c_str());
  return WIA_SUCCESS;
}

wia_status_t discover_devices(Provider& p) {
  const Runtime& rt = p.rt;
  std::uint32_t ndrivers = 0;
  wia_ze_result_t r = rt.zeDriverGet(&ndrivers, nullptr);
  if (r == WIA_ZE_RESULT_ERROR_UNINITIALIZED || (r == WIA_ZE_RESULT_SUCCESS && ndrivers == 0))
    return p.fail(WIA_ERROR_UNAVAILABLE, "no Level Zero driver (zeDriverGet: %s)",
                  r == WIA_ZE_RESULT_SUCCESS ? "0 drivers" : result_name(r).c_str());
  if (r != WIA_ZE_RESULT_SUCCESS) return p.fail_ze(r, -1, "zeDriverGet");
  std::vector<wia_ze_driver_handle_t> handles(ndrivers);
  if ((r = rt.zeDriverGet(&ndrivers, handles.data())) != WIA_ZE_RESULT_SUCCESS)
    return p.fail_ze(r, -1, "zeDriverGet(%u drivers)", ndrivers);
  handles.resize(ndrivers);
  for (wia_ze_driver_handle_t dh : handles) {
    std::uint32_t ndev = 0;
    if ((r = rt.zeDeviceGet(dh, &ndev, nullptr)) != WIA_ZE_RESULT_SUCCESS)
      return p.fail_ze(r, -1, "zeDeviceGet(driver %zu)", p.drivers.size());
    if (ndev == 0) continue;
    auto drv = std::make_unique<Driver>();
    drv->h = dh;
    if (rt.zeDriverGetApiVersion(dh, &drv->api_version) != WIA_ZE_RESULT_SUCCESS)
      drv->api_version = 0;
    std::vector<wia_ze_device_handle_t> devs(ndev);
    if ((r = rt.zeDeviceGet(dh, &ndev, devs.data())) != WIA_ZE_RESULT_SUCCESS)
      return p.fail_ze(r, -1, "zeDeviceGet(driver %zu, %u devices)", p.drivers.size(), ndev);
    // One context per driver, over all its devices: USM pointers of one
    // device are then usable in copies on another's command list.
    const wia_ze_context_desc_t cdesc{WIA_ZE_STRUCTURE_TYPE_CONTEXT_DESC, nullptr, 0};
    if ((r = rt.zeContextCreate(dh, &cdesc, &drv->context)) != WIA_ZE_RESULT_SUCCESS)
      return p.fail_ze(r, -1, "zeContextCreate(driver %zu)", p.drivers.size());
    drv->events.context = drv->context;
    Driver* driver = drv.get();
    p.drivers.push_back(std::move(drv));
    for (std::uint32_t i = 0; i < ndev; ++i) {
      auto d = std::make_unique<Device>();
      d->index = static_cast<std::int32_t>(p.devices.size());
      d->driver = driver;
      d->h = devs[i];
      wia_ze_device_properties_t props{};
      props.stype = WIA_ZE_STRUCTURE_TYPE_DEVICE_PROPERTIES_1_2;
      if ((r = rt.zeDeviceGetProperties(d->h, &props)) != WIA_ZE_RESULT_SUCCESS)
        return p.fail_ze(r, -1, "zeDeviceGetProperties(device %d)", d->index);
      props.name[sizeof(props.name) - 1] = '\0';
      d->name = props.name;
      d->ze_type = props.type;
      d->timer_hz = props.timerResolution;
      // 0 valid bits would be a driver that does not say: take all 64.
      const std::uint32_t bits = props.timestampValidBits;
      d->timestamp_mask = bits == 0 || bits >= 64 ? ~0ull : (1ull << bits) - 1;
      std::uint32_t nmem = 0;
      if (rt.zeDeviceGetMemoryProperties(d->h, &nmem, nullptr) == WIA_ZE_RESULT_SUCCESS &&
          nmem > 0) {
        std::vector<wia_ze_device_memory_properties_t> mem(nmem);
        for (auto& m : mem) m.stype = WIA_ZE_STRUCTURE_TYPE_DEVICE_MEMORY_PROPERTIES;
        if (rt.zeDeviceGetMemoryProperties(d->h, &nmem, mem.data()) == WIA_ZE_RESULT_SUCCESS)
          for (std::uint32_t m = 0; m < nmem && m < mem.size(); ++m)
            d->total_memory += mem[m].totalSize;
      }
      // A device that cannot say is taken as one that cannot export.
      wia_ze_device_external_memory_properties_t ext{};
      ext.stype = WIA_ZE_STRUCTURE_TYPE_DEVICE_EXTERNAL_MEMORY_PROPERTIES;
      d->dmabuf_export =
          rt.zeDeviceGetExternalMemoryProperties(d->h, &ext) == WIA_ZE_RESULT_SUCCESS &&
          (ext.memoryAllocationExportTypes & WIA_ZE_EXTERNAL_MEMORY_TYPE_FLAG_DMA_BUF) != 0;
      p.devices.push_back(std::move(d));
    }
  }
  if (p.devices.empty())
    return p.fail(WIA_ERROR_UNAVAILABLE,
                  "no Level Zero device (zeDeviceGet: 0 devices on %u driver(s))", ndrivers);
  return WIA_SUCCESS;
}

void release_drivers(Provider& p) noexcept {
  for (auto& d : p.devices) {
    if (d->sync_list != nullptr) p.rt.zeCommandListDestroy(d->sync_list);
    d->sync_list = nullptr;
  }
  {
    std::lock_guard<std::mutex> lk(p.graveyard_mu);
    p.graveyard.clear();  // destroyed with their pools below
  }
  for (auto& drv : p.drivers) {
    drv->events.destroy_all(p.rt);
    if (drv->context != nullptr) p.rt.zeContextDestroy(drv->context);
    drv->context = nullptr;
  }
}

}  // namespace wia::ze
