// SPDX-License-Identifier: Apache-2.0
// Internal types of the `cuda` provider: NVIDIA GPUs through the CUDA
// Driver API, opened with dlopen at init (cuda_driver.cpp) so the provider
// links nothing of CUDA. Nothing here crosses the ABI; the entry points in
// cuda_provider.cpp, cuda_memory.cpp, cuda_stream.cpp and cuda_kernels.cpp
// translate.
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

#include "cuda_driver_api.h"
#include "wia_common/entry_guard.hpp"
#include "wia_common/memory_registry.hpp"

namespace wia::cuda {

// --------------------------------------------------------------------------
// The driver: every entry of WIA_CUDA_DRIVER_ENTRIES, resolved once at init.

struct Driver {
  void* library = nullptr;  // dlopen handle; kept open for the process (see driver_close)
  std::string path;         // what was opened (cuda.library)
  int version = 0;          // cuDriverGetVersion, e.g. 12080
#define WIA_CUDA_DECLARE_MEMBER(name, params) wia_PFN_##name name = nullptr;
  WIA_CUDA_DRIVER_ENTRIES(WIA_CUDA_DECLARE_MEMBER)
#undef WIA_CUDA_DECLARE_MEMBER
};

// The ONE mapping from a CUresult to a wia status.
wia_status_t status_of(wia_CUresult result) noexcept;
// "CUDA_ERROR_OUT_OF_MEMORY", or "CUresult 123" when the driver cannot name it.
std::string error_name(const Driver& driver, wia_CUresult result);

// --------------------------------------------------------------------------
// Devices

// Sources one reduce launch reads (kernels/device_kernel_params.h) and the
// number of reduce kernels per dtype (sum, prod, min, max; AVG is sum).
constexpr int kReduceKernelOps = 4;

struct Device {
  std::int32_t index = 0;
  wia_CUdevice cu = 0;
  std::string name;        // "NVIDIA H200"
  std::string pci_bus_id;  // "0000:17:00.0"
  std::uint64_t total_memory = 0;
  std::int32_t numa_node = -1;
  int sm_count = 1;
  int cc_major = 0;
  int cc_minor = 0;
  // With cuda.logical_devices_per_gpu = N > 1, each GPU is N devices of
  // this provider (slot 0..N-1), sharing its primary context and memory:
  // so that collectives of several ranks run on a machine with one GPU.
  int logical_slot = 0;
  int logical_count = 1;

  // The primary context, retained at first use (context()) and released in
  // fini. Atomic so the hot path reads it without the mutex.
  std::atomic<wia_CUcontext> ctx{nullptr};
  std::mutex mu;  // serialises retaining the context and loading the module

  // The provider's kernels (cuda_kernels.cpp), loaded into the primary
  // context on the first launch; functions looked up on first use.
  wia_CUmodule module = nullptr;
  std::atomic<wia_CUfunction> reduce_fns[WIA_DATATYPE_COUNT][kReduceKernelOps] = {};
  std::atomic<wia_CUfunction> scale_fns[WIA_DATATYPE_COUNT] = {};
};

// --------------------------------------------------------------------------
// Handles. A wia_provider_stream_t / wia_provider_event_t is a pointer to
// one of these; the provider keeps the live ones in a set so a destroyed or
// foreign handle is INVALID_HANDLE, not a driver crash.

struct Stream {
  std::int32_t device = 0;
  wia_CUstream cu = nullptr;
};

struct Event {
  std::int32_t device = 0;
  wia_CUevent cu = nullptr;
  // The ABI says a never-recorded event is complete; answering that here
  // keeps it true whatever the driver says of an unrecorded event.
  std::atomic<bool> recorded{false};
};

// What mem_alloc handed out (wia_common/memory_registry.hpp, shared with
// hip and ze).
using common::Allocation;

// --------------------------------------------------------------------------
// The provider context returned by init().

class Provider {
 public:
  static constexpr std::uint64_t kMagic = 0x574941435544413Full;  // "WIACUDA?"
  std::uint64_t magic = kMagic;

  const wia_host_services_v1_t* host = nullptr;
  Driver driver;
  std::vector<std::unique_ptr<Device>> devices;

  // mem_alloc's allocations and ipc_open_handle's mappings.
  common::MemoryRegistry memory{"CUDA"};

  std::shared_mutex handles_mu;
  std::unordered_set<const Stream*> streams;
  std::unordered_set<const Event*> events;

  // The caller's modules (cuda_user_kernels.cpp): module -> device, and
  // each function found in one -> its module and device.
  struct UserFunction {
    wia_CUmodule module = nullptr;
    std::int32_t device = 0;
  };
  std::mutex user_code_mu;
  std::unordered_map<wia_CUmodule, std::int32_t> user_modules;
  std::unordered_map<wia_CUfunction, UserFunction> user_functions;

  // Sets the host error message for the calling thread and returns st.
  wia_status_t fail(wia_status_t st, const char* fmt, ...) const noexcept
      __attribute__((format(printf, 3, 4)));
  // A failed driver call: message "<what> on device D (name): CUDA_ERROR_X",
  // status from status_of(). `what` names the call and its key arguments.
  wia_status_t fail_cu(wia_CUresult result, std::int32_t dev, const char* fmt, ...) const noexcept
      __attribute__((format(printf, 4, 5)));
  void log(wia_log_level_t level, const char* fmt, ...) const noexcept
      __attribute__((format(printf, 3, 4)));

  bool valid_device(std::int32_t dev) const noexcept {
    return dev >= 0 && static_cast<std::size_t>(dev) < devices.size();
  }
  // INVALID_DEVICE with a message naming `call` when dev is out of range.
  wia_status_t check_device(std::int32_t dev, const char* call) const noexcept;
  // Retains dev's primary context if not yet retained and makes it current
  // on the calling thread. Every entry that talks to a device calls it.
  wia_status_t use_device(std::int32_t dev, const char* call) noexcept;
  // The retained context of dev (retaining it), for peer copies.
  wia_status_t context_of(std::int32_t dev, const char* call, wia_CUcontext* ctx) noexcept;

  // NULL (and a message naming `call`) when the handle is not live.
  Stream* find_stream(wia_provider_stream_t h, const char* call) noexcept;
  Event* find_event(wia_provider_event_t h, const char* call) noexcept;
};

// Puts back the calling thread's current context when an entry point
// returns: entries make their device's primary context current, and an
// application (PyTorch, say) that had made another GPU's context current
// with cudaSetDevice would otherwise find its next runtime call on ours.
class CurrentContextKeeper {
 public:
  explicit CurrentContextKeeper(const Driver& driver) noexcept : driver_(driver) {
    saved_ok_ = driver_.cuCtxGetCurrent(&saved_) == WIA_CUDA_SUCCESS;
  }
  ~CurrentContextKeeper() {
    wia_CUcontext now = nullptr;
    if (saved_ok_ && driver_.cuCtxGetCurrent(&now) == WIA_CUDA_SUCCESS && now != saved_)
      driver_.cuCtxSetCurrent(saved_);
  }
  CurrentContextKeeper(const CurrentContextKeeper&) = delete;
  CurrentContextKeeper& operator=(const CurrentContextKeeper&) = delete;

 private:
  const Driver& driver_;
  wia_CUcontext saved_ = nullptr;
  bool saved_ok_ = false;
};

// Runs one entry point: validates ctx, keeps the caller's current context,
// and turns any exception into a status with a message, so nothing unwinds
// across the C boundary (wia_common/entry_guard.hpp, shared with hip and ze).
template <class F>
wia_status_t guarded(void* ctx, const char* call, F&& body) noexcept {
  return common::guarded_entry<Provider>(
      ctx, call, [](Provider& p) { return CurrentContextKeeper(p.driver); }, std::forward<F>(body));
}

// --------------------------------------------------------------------------
// Driver loading (cuda_driver.cpp)

// dlopen + cuGetProcAddress of every entry + cuInit. UNAVAILABLE (with a
// message) when the library, an entry or a device is absent.
wia_status_t driver_open(Provider& p, const std::string& library);
// Discovers the devices (cuDeviceGetCount, names, attributes); no contexts.
// Each GPU is offered as `logical_per_gpu` devices (cuda.logical_devices_per_gpu).
wia_status_t discover_devices(Provider& p, int logical_per_gpu);

// --------------------------------------------------------------------------
// Entry points, for the ops table in cuda_provider.cpp.

// cuda_memory.cpp
wia_status_t mem_alloc(void* ctx, std::int32_t dev, std::uint64_t size, std::uint32_t kind,
                       void** ptr) noexcept;
wia_status_t mem_free(void* ctx, std::int32_t dev, void* ptr) noexcept;
wia_status_t memset_sync(void* ctx, std::int32_t dev, void* ptr, std::int32_t value,
                         std::uint64_t size) noexcept;
wia_status_t memcpy_sync(void* ctx, std::int32_t dev, void* dst, const void* src,
                         std::uint64_t size) noexcept;
// A dma-buf of the page-aligned allocation holding [ptr, ptr + size)
// (cuMemGetHandleForAddressRange; WIA_DEVICE_CAP_DMABUF).
wia_status_t mem_export_dmabuf(void* ctx, std::int32_t dev, void* ptr, std::uint64_t size,
                               std::int32_t* fd, std::uint64_t* offset) noexcept;
wia_status_t ipc_get_handle(void* ctx, std::int32_t dev, void* ptr,
                            wia_ipc_handle_t* handle) noexcept;
wia_status_t ipc_open_handle(void* ctx, std::int32_t dev, const wia_ipc_handle_t* handle,
                             void** ptr) noexcept;
wia_status_t ipc_close_handle(void* ctx, std::int32_t dev, void* ptr) noexcept;
// fini: frees what the core never freed (the contexts are released after).
void release_all_memory(Provider& p) noexcept;

// cuda_stream.cpp
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
// fini: destroys the streams and events the core never destroyed.
void release_all_handles(Provider& p) noexcept;

// cuda_kernels.cpp
wia_status_t reduce_async(void* ctx, wia_provider_stream_t stream,
                          const wia_reduce_args_v1_t* args) noexcept;
// buf[i] *= factor on `stream` (wia_scale_<dtype>; WIA_DEVICE_CAP_SCALE).
wia_status_t scale_async(void* ctx, wia_provider_stream_t stream, void* buf, std::uint64_t count,
                         wia_datatype_t dtype, double factor) noexcept;
// fini: unloads the kernel module of every device (its context current).
void unload_kernels(Provider& p, Device& d) noexcept;

// cuda_user_kernels.cpp: the caller's device code (WIA_DEVICE_CAP_KERNEL).
wia_status_t module_load(void* ctx, std::int32_t dev, const void* image, std::uint64_t size,
                         wia_provider_module_t* module) noexcept;
wia_status_t module_unload(void* ctx, wia_provider_module_t module) noexcept;
wia_status_t module_function(void* ctx, wia_provider_module_t module, const char* name,
                             wia_provider_function_t* function) noexcept;
wia_status_t launch_kernel(void* ctx, wia_provider_stream_t stream,
                           wia_provider_function_t function,
                           const wia_kernel_launch_v1_t* launch) noexcept;
// fini: unloads the modules the caller never unloaded.
void unload_user_modules(Provider& p) noexcept;

}  // namespace wia::cuda
