// SPDX-License-Identifier: Apache-2.0
// Internal types of the `ze` provider: Intel GPUs through oneAPI Level Zero,
// whose loader is opened with dlopen at init (ze_loader.cpp) so the
// provider links nothing of it. Nothing here crosses the ABI; the entry
// points in ze_provider.cpp, ze_memory.cpp and ze_stream.cpp translate.
#pragma once

#include <wia/provider.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <new>
#include <shared_mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "wia_common/entry_guard.hpp"
#include "wia_common/memory_registry.hpp"
#include "ze_api.h"

namespace wia::ze {

// Every entry of WIA_ZE_ENTRIES, resolved once at init.
struct Runtime {
  void* library = nullptr;  // dlopen handle; kept open for the process
  std::string path;         // what was opened
#define WIA_ZE_DECLARE_MEMBER(name, params) wia_PFN_##name name = nullptr;
  WIA_ZE_ENTRIES(WIA_ZE_DECLARE_MEMBER)
#undef WIA_ZE_DECLARE_MEMBER
};

// The ONE mapping from a ze_result_t to a wia status.
wia_status_t status_of(wia_ze_result_t result) noexcept;
// "ZE_RESULT_ERROR_DEVICE_LOST", or "ze_result_t 0x..." for a value not
// known here. Level Zero 1.4 has no call that names a result.
std::string result_name(wia_ze_result_t result);

// How far a stream's device work is known to be done: `done` is the
// highest position (count of commands appended) of which the provider saw
// a completion (a fence, a host function's start). Shared with the ze
// events whose waits the stream appended, so they can be recycled safely.
struct StreamClock {
  std::atomic<std::uint64_t> done{0};
};

// One Level Zero event from a pool, with its 8-byte timestamp slot in host
// USM memory. Recycled only when signalled and every stream that appended
// a wait on it has passed that wait (Level Zero: an event may be reset or
// destroyed only once the device no longer refers to it).
struct ZeEvent {
  wia_ze_event_handle_t h = nullptr;
  std::uint64_t* timestamp = nullptr;
  // The stream whose list signals it, and at which position: seen
  // signalled, it tells how far that stream is (so waits of that stream on
  // other events can be known passed without a fence).
  std::shared_ptr<StreamClock> signaller;
  std::uint64_t signal_position = 0;
  struct Waiter {
    std::shared_ptr<StreamClock> clock;
    std::uint64_t position = 0;
  };
  std::vector<Waiter> waiters;
};

// Advances the signalling stream's clock to the event's position; for an
// event seen signalled.
void note_signalled(const ZeEvent& e) noexcept;

class Provider;

// The events of one driver's context, handed out one at a time from pools
// of kPoolSize host-visible events. Thread-safe.
class EventAllocator {
 public:
  static constexpr std::uint32_t kPoolSize = 64;
  // NULL with the failure reported through p.fail().
  ZeEvent* get(Provider& p, std::int32_t dev);
  // Reset and back to the free list (the caller knows it is unused).
  void put(const Runtime& rt, ZeEvent* e) noexcept;
  void destroy_all(const Runtime& rt) noexcept;

  wia_ze_context_handle_t context = nullptr;

 private:
  std::mutex mu_;
  struct Pool {
    wia_ze_event_pool_handle_t h = nullptr;
    std::uint64_t* timestamps = nullptr;  // kPoolSize slots, zeMemAllocHost
  };
  std::vector<Pool> pools_;
  std::deque<std::unique_ptr<ZeEvent>> all_;
  std::vector<ZeEvent*> free_;
};

struct Driver {
  wia_ze_driver_handle_t h = nullptr;
  wia_ze_context_handle_t context = nullptr;
  std::uint32_t api_version = 0;
  EventAllocator events;
};

struct Device {
  std::int32_t index = 0;
  Driver* driver = nullptr;
  wia_ze_device_handle_t h = nullptr;
  std::string name;
  std::uint32_t ze_type = 0;
  std::uint64_t total_memory = 0;
  std::uint64_t timer_hz = 0;        // device timestamp ticks per second
  std::uint64_t timestamp_mask = 0;  // timestampValidBits as a mask
  // memoryAllocationExportTypes has DMA_BUF: device allocations are made
  // exportable as dma-bufs (mem_alloc) and mem_export_dmabuf exports them.
  bool dmabuf_export = false;
  // Synchronous immediate list of the blocking memset/memcpy, made on
  // first use and used under its mutex.
  std::mutex sync_mu;
  wia_ze_command_list_handle_t sync_list = nullptr;
};

struct HostTask {
  wia_host_fn_t fn = nullptr;
  void* user_data = nullptr;
  ZeEvent* reached = nullptr;  // signalled by the list where the function is due
  ZeEvent* done = nullptr;     // signalled by us once it ran; the list waits on it
  std::uint64_t position = 0;  // stream position of `reached`
};

struct Stream {
  std::int32_t device = 0;
  wia_ze_command_list_handle_t list = nullptr;  // immediate, asynchronous
  // Serialises appends, so positions and command order agree.
  std::mutex mu;
  std::uint64_t appended = 0;
  std::shared_ptr<StreamClock> clock = std::make_shared<StreamClock>();
  ZeEvent* query_fence = nullptr;  // stream_query's outstanding fence
  std::uint64_t query_position = 0;
  // Host functions: Level Zero has none, so a thread of ours per stream
  // (started by the first launch_host_func) waits for `reached`, runs the
  // function and signals `done`.
  std::mutex host_mu;
  std::condition_variable host_cv;
  std::deque<HostTask> host_tasks;
  bool host_stop = false;
  std::thread host_thread;
  // A failure the host-function thread saw, reported by the next
  // stream_synchronize/stream_query.
  std::atomic<wia_ze_result_t> async_error{WIA_ZE_RESULT_SUCCESS};
};

struct Event {
  std::int32_t device = 0;
  std::mutex mu;
  ZeEvent* current = nullptr;  // the latest record; NULL: never recorded
};

// What mem_alloc handed out (wia_common/memory_registry.hpp, shared with
// cuda and hip).
using common::Allocation;

class Provider {
 public:
  static constexpr std::uint64_t kMagic = 0x574941205A453F3Full;  // "WIA ZE??"
  std::uint64_t magic = kMagic;

  const wia_host_services_v1_t* host = nullptr;
  Runtime rt;
  std::vector<std::unique_ptr<Driver>> drivers;
  std::vector<std::unique_ptr<Device>> devices;

  // mem_alloc's allocations and ipc_open_handle's mappings.
  common::MemoryRegistry memory{"Level Zero"};

  std::shared_mutex handles_mu;
  std::unordered_set<const Stream*> streams;
  std::unordered_set<const Event*> events;

  // Events no longer current whose waiters may not have passed yet.
  std::mutex graveyard_mu;
  std::vector<std::pair<Driver*, ZeEvent*>> graveyard;

  wia_status_t fail(wia_status_t st, const char* fmt, ...) const noexcept
      __attribute__((format(printf, 3, 4)));
  // "<what> on device D (name): ZE_RESULT_X", status from status_of().
  wia_status_t fail_ze(wia_ze_result_t result, std::int32_t dev, const char* fmt,
                       ...) const noexcept __attribute__((format(printf, 4, 5)));
  void log(wia_log_level_t level, const char* fmt, ...) const noexcept
      __attribute__((format(printf, 3, 4)));

  bool valid_device(std::int32_t dev) const noexcept {
    return dev >= 0 && static_cast<std::size_t>(dev) < devices.size();
  }
  wia_status_t check_device(std::int32_t dev, const char* call) const noexcept;
  Device& device(std::int32_t dev) const noexcept {
    return *devices[static_cast<std::size_t>(dev)];
  }

  Stream* find_stream(wia_provider_stream_t h, const char* call) noexcept;
  Event* find_event(wia_provider_event_t h, const char* call) noexcept;

  // An event that may still be waited on: recycled by sweep() once safe.
  void retire(Driver* d, ZeEvent* e);
  void sweep() noexcept;
};

// Runs one entry point: validates ctx, turns any exception into a status
// with a message (wia_common/entry_guard.hpp, shared with cuda and hip).
// Level Zero has no current device: nothing to restore.
template <class F>
wia_status_t guarded(void* ctx, const char* call, F&& body) noexcept {
  return common::guarded_entry<Provider>(
      ctx, call, [](Provider&) { return common::NoKeeper{}; }, std::forward<F>(body));
}

// ze_loader.cpp: dlopen + dlsym of every entry + zeInit; then drivers,
// their contexts and devices.
wia_status_t loader_open(Provider& p, const std::string& library);
wia_status_t discover_devices(Provider& p);
void release_drivers(Provider& p) noexcept;

// ze_memory.cpp
wia_status_t mem_alloc(void* ctx, std::int32_t dev, std::uint64_t size, std::uint32_t kind,
                       void** ptr) noexcept;
wia_status_t mem_free(void* ctx, std::int32_t dev, void* ptr) noexcept;
wia_status_t memset_sync(void* ctx, std::int32_t dev, void* ptr, std::int32_t value,
                         std::uint64_t size) noexcept;
wia_status_t memcpy_sync(void* ctx, std::int32_t dev, void* dst, const void* src,
                         std::uint64_t size) noexcept;
// A dma-buf of the allocation holding [ptr, ptr + size): zeMemGetAllocProperties
// with a chained ze_external_memory_export_fd_t (WIA_DEVICE_CAP_DMABUF).
wia_status_t mem_export_dmabuf(void* ctx, std::int32_t dev, void* ptr, std::uint64_t size,
                               std::int32_t* fd, std::uint64_t* offset) noexcept;
wia_status_t ipc_get_handle(void* ctx, std::int32_t dev, void* ptr,
                            wia_ipc_handle_t* handle) noexcept;
wia_status_t ipc_open_handle(void* ctx, std::int32_t dev, const wia_ipc_handle_t* handle,
                             void** ptr) noexcept;
wia_status_t ipc_close_handle(void* ctx, std::int32_t dev, void* ptr) noexcept;
void release_all_memory(Provider& p) noexcept;

// ze_stream.cpp
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
// Host-staged: no SPIR-V kernels are built (docs/provider-ze.md).
wia_status_t reduce_async(void* ctx, wia_provider_stream_t stream,
                          const wia_reduce_args_v1_t* args) noexcept;
void release_all_handles(Provider& p) noexcept;

}  // namespace wia::ze
