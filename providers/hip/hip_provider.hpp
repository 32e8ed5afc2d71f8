// SPDX-License-Identifier: Apache-2.0
// Internal types of the `hip` provider: AMD GPUs through the HIP runtime,
// opened with dlopen at init (hip_runtime.cpp) so the provider links
// nothing of ROCm. Nothing here crosses the ABI; the entry points in
// hip_provider.cpp, hip_memory.cpp and hip_stream.cpp translate.
#pragma once

#include <wia/provider.h>

#include <atomic>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <new>
#include <shared_mutex>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "hip_runtime_api.h"
#include "wia_common/entry_guard.hpp"
#include "wia_common/memory_registry.hpp"

namespace wia::hip {

// Every entry of WIA_HIP_RUNTIME_ENTRIES, resolved once at init.
struct Runtime {
  void* library = nullptr;  // dlopen handle; kept open for the process
  std::string path;         // what was opened
  int version = 0;          // hipRuntimeGetVersion, e.g. 50221601
#define WIA_HIP_DECLARE_MEMBER(ret, name, params) wia_PFN_##name name = nullptr;
  WIA_HIP_RUNTIME_ENTRIES(WIA_HIP_DECLARE_MEMBER)
  WIA_HIP_RUNTIME_OPTIONAL_ENTRIES(WIA_HIP_DECLARE_MEMBER)
  WIA_HIP_RUNTIME_NEWER_ENTRIES(WIA_HIP_DECLARE_MEMBER)
#undef WIA_HIP_DECLARE_MEMBER
  // Queues fn(data) on the stream after the work before it, as the ABI's
  // launch_host_func: hipLaunchHostFunc, or hipStreamAddCallback where the
  // runtime has no hipLaunchHostFunc (ROCm 5.2).
  wia_hipError_t enqueue_host_fn(wia_hipStream_t stream, wia_hipHostFn_t fn, void* data) const;
  const char* host_fn_entry() const {
    return hipLaunchHostFunc != nullptr ? "hipLaunchHostFunc" : "hipStreamAddCallback";
  }
};

// The ONE mapping from a hipError_t to a wia status.
wia_status_t status_of(wia_hipError_t error) noexcept;
// "hipErrorOutOfMemory", or "hipError_t 123" when the runtime cannot name it.
std::string error_name(const Runtime& rt, wia_hipError_t error);

struct Device {
  std::int32_t index = 0;
  std::string name;
  std::string pci_bus_id;
  std::uint64_t total_memory = 0;
  // Set once an entry made the device current: hipMemGetInfo is asked only
  // then, so device_props never makes the runtime set a device up.
  std::atomic<bool> used{false};
};

struct Stream {
  std::int32_t device = 0;
  wia_hipStream_t hip = nullptr;
};

struct Event {
  std::int32_t device = 0;
  wia_hipEvent_t hip = nullptr;
  std::atomic<bool> recorded{false};  // the ABI: a never-recorded event is complete
};

// What mem_alloc handed out (wia_common/memory_registry.hpp, shared with
// cuda and ze).
using common::Allocation;

class Provider {
 public:
  static constexpr std::uint64_t kMagic = 0x5749414849503F3Full;  // "WIAHIP??"
  std::uint64_t magic = kMagic;

  const wia_host_services_v1_t* host = nullptr;
  Runtime rt;
  std::vector<std::unique_ptr<Device>> devices;

  // mem_alloc's allocations and ipc_open_handle's mappings.
  common::MemoryRegistry memory{"HIP"};

  std::shared_mutex handles_mu;
  std::unordered_set<const Stream*> streams;
  std::unordered_set<const Event*> events;

  wia_status_t fail(wia_status_t st, const char* fmt, ...) const noexcept
      __attribute__((format(printf, 3, 4)));
  // "<what> on device D (name): hipErrorX", status from status_of().
  wia_status_t fail_hip(wia_hipError_t error, std::int32_t dev, const char* fmt, ...) const noexcept
      __attribute__((format(printf, 4, 5)));
  void log(wia_log_level_t level, const char* fmt, ...) const noexcept
      __attribute__((format(printf, 3, 4)));

  bool valid_device(std::int32_t dev) const noexcept {
    return dev >= 0 && static_cast<std::size_t>(dev) < devices.size();
  }
  wia_status_t check_device(std::int32_t dev, const char* call) const noexcept;
  // hipSetDevice(dev) on the calling thread (the guard puts the caller's
  // device back when the entry returns).
  wia_status_t use_device(std::int32_t dev, const char* call) noexcept;

  Stream* find_stream(wia_provider_stream_t h, const char* call) noexcept;
  Event* find_event(wia_provider_event_t h, const char* call) noexcept;
};

// Puts back the calling thread's current HIP device when an entry returns:
// entries call hipSetDevice, and an application (PyTorch on ROCm) would
// otherwise find its next runtime call on our device.
class CurrentDeviceKeeper {
 public:
  explicit CurrentDeviceKeeper(const Runtime& rt) noexcept : rt_(rt) {
    saved_ok_ = rt_.hipGetDevice(&saved_) == WIA_hipSuccess;
  }
  ~CurrentDeviceKeeper() {
    int now = 0;
    if (saved_ok_ && rt_.hipGetDevice(&now) == WIA_hipSuccess && now != saved_)
      rt_.hipSetDevice(saved_);
  }
  CurrentDeviceKeeper(const CurrentDeviceKeeper&) = delete;
  CurrentDeviceKeeper& operator=(const CurrentDeviceKeeper&) = delete;

 private:
  const Runtime& rt_;
  int saved_ = 0;
  bool saved_ok_ = false;
};

// Runs one entry point: validates ctx, keeps the caller's current device,
// turns any exception into a status with a message
// (wia_common/entry_guard.hpp, shared with cuda and ze).
template <class F>
wia_status_t guarded(void* ctx, const char* call, F&& body) noexcept {
  return common::guarded_entry<Provider>(
      ctx, call, [](Provider& p) { return CurrentDeviceKeeper(p.rt); }, std::forward<F>(body));
}

// hip_runtime.cpp: dlopen + dlsym of every entry + hipInit; then devices.
wia_status_t runtime_open(Provider& p, const std::string& library);
wia_status_t discover_devices(Provider& p);

// hip_memory.cpp
wia_status_t mem_alloc(void* ctx, std::int32_t dev, std::uint64_t size, std::uint32_t kind,
                       void** ptr) noexcept;
wia_status_t mem_free(void* ctx, std::int32_t dev, void* ptr) noexcept;
wia_status_t memset_sync(void* ctx, std::int32_t dev, void* ptr, std::int32_t value,
                         std::uint64_t size) noexcept;
wia_status_t memcpy_sync(void* ctx, std::int32_t dev, void* dst, const void* src,
                         std::uint64_t size) noexcept;
// A dma-buf of the page-aligned allocation holding [ptr, ptr + size)
// (hipMemGetHandleForAddressRange, where the runtime has it; WIA_DEVICE_CAP_DMABUF).
wia_status_t mem_export_dmabuf(void* ctx, std::int32_t dev, void* ptr, std::uint64_t size,
                               std::int32_t* fd, std::uint64_t* offset) noexcept;
wia_status_t ipc_get_handle(void* ctx, std::int32_t dev, void* ptr,
                            wia_ipc_handle_t* handle) noexcept;
wia_status_t ipc_open_handle(void* ctx, std::int32_t dev, const wia_ipc_handle_t* handle,
                             void** ptr) noexcept;
wia_status_t ipc_close_handle(void* ctx, std::int32_t dev, void* ptr) noexcept;
void release_all_memory(Provider& p) noexcept;

// hip_stream.cpp
wia_status_t stream_create(void* ctx, std::int32_t dev, wia_provider_stream_t* stream) noexcept;
wia_status_t stream_destroy(void* ctx, wia_provider_stream_t stream) noexcept;
wia_status_t stream_synchronize(void* ctx, wia_provider_stream_t stream) noexcept;
wia_status_t stream_query(void* ctx, wia_provider_stream_t stream) noexcept;
wia_status_t memset_async(void* ctx, wia_provider_stream_t stream, void* ptr, std::int32_t value,
                          std::uint64_t size) noexcept;
wia_status_t memcpy_async(void* ctx, wia_provider_stream_t stream, void* dst, const void* src,
                          std::uint64_t size) noexcept;
wia_status_t event_create(void* ctx, std::int32_t dev, wia_provider_event_t* event) noexcept;
wia_status_t event_destroy(void* ctx, wia_provider_event_t event) noexcept;
wia_status_t event_record(void* ctx, wia_provider_event_t event,
                          wia_provider_stream_t stream) noexcept;
wia_status_t event_query(void* ctx, wia_provider_event_t event) noexcept;
wia_status_t event_synchronize(void* ctx, wia_provider_event_t event) noexcept;
wia_status_t stream_wait_event(void* ctx, wia_provider_stream_t stream,
                               wia_provider_event_t event) noexcept;
wia_status_t event_elapsed_ms(void* ctx, wia_provider_event_t start, wia_provider_event_t end,
                              float* ms) noexcept;
wia_status_t launch_host_func(void* ctx, wia_provider_stream_t stream, wia_host_fn_t fn,
                              void* user_data) noexcept;
wia_status_t memcpy_peer_async(void* ctx, wia_provider_stream_t stream, void* dst,
                               std::int32_t dst_dev, const void* src, std::int32_t src_dev,
                               std::uint64_t size) noexcept;
// Host-staged: sources copied to host memory, reduced there by
// wia_cpu_kernels in a host function, the result copied back (no hipcc).
wia_status_t reduce_async(void* ctx, wia_provider_stream_t stream,
                          const wia_reduce_args_v1_t* args) noexcept;
void release_all_handles(Provider& p) noexcept;

}  // namespace wia::hip
