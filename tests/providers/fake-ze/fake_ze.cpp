// SPDX-License-Identifier: Apache-2.0
// fake-ze: a Level Zero loader test double (README.md in this folder).
// Exports every entry of WIA_ZE_ENTRIES (providers/ze/ze_api.h), each
// checked against its wia_PFN_ type at the end of this file. One driver;
// device memory is host memory (a memfd per allocation, so another process
// can map it for IPC); an asynchronous immediate command list is a queue
// served by a worker thread which, as Level Zero allows, runs the commands
// between two barriers in reverse order (a provider that forgets a barrier
// sees its copies reordered); events are flags with host-visible state.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "ze_api.h"

#define FAKE_API extern "C" __attribute__((visibility("default")))

using Err = wia_ze_result_t;

// The handle types are opaque to the provider; here they are these.
struct wia_ze_driver {
  int unused = 0;
};
struct wia_ze_device {
  int index = 0;
};
struct wia_ze_context {
  int unused = 0;
};
struct wia_ze_event_pool {
  std::uint32_t count = 0;
  std::vector<bool> used;
};
struct wia_ze_event {
  wia_ze_event_pool* pool = nullptr;
  std::uint32_t index = 0;
  bool signalled = false;
  Err error = WIA_ZE_RESULT_SUCCESS;  // set when signalled by a list after a device fault
};

namespace {

constexpr std::uint64_t kDeviceMemory = 16ull << 30;
constexpr int kMaxDevices = 16;

struct Task {
  std::function<void()> run;
  bool ordered = false;  // a barrier or a wait: nothing moves across it
};

struct wia_ze_command_list_impl;

struct Allocation {
  std::size_t size = 0;
  std::size_t mapped = 0;
  int fd = -1;  // device memory: its memfd; host memory: -1
  int device = 0;
  std::uint64_t inode = 0;
  bool dmabuf_exportable = false;  // allocated with an export desc asking DMA_BUF
  std::uint64_t id = 0;
};

struct Import {
  std::size_t mapped = 0;
  int opens = 0;
  std::string key;
};

}  // namespace

struct wia_ze_command_list {
  int device = 0;
  bool synchronous = false;
  std::mutex mu;
  std::condition_variable cv;
  std::deque<Task> queue;
  bool busy = false;
  bool stop = false;
  Err error = WIA_ZE_RESULT_SUCCESS;  // sticky after a device fault
  std::thread worker;
};

namespace {

struct State {
  std::mutex mu;
  int devices = 2;
  std::string fault;
  bool initialised = false;
  wia_ze_driver driver;
  wia_ze_device device[kMaxDevices];
  std::set<wia_ze_context*> contexts;
  std::set<wia_ze_command_list*> lists;
  std::set<wia_ze_event_pool*> pools;
  std::set<wia_ze_event*> events;
  std::map<std::uintptr_t, Allocation> allocations;  // by base address
  std::map<std::uintptr_t, Import> imports;
  std::uint64_t used[kMaxDevices] = {};
  std::uint64_t next_id = 1;
  bool stream_fault_fired = false;

  State() {
    if (const char* v = std::getenv("WIA_FAKE_ZE_DEVICES")) {
      devices = std::atoi(v);
      if (devices < 0) devices = 0;
      if (devices > kMaxDevices) devices = kMaxDevices;
    }
    if (const char* f = std::getenv("WIA_FAKE_ZE_FAULT")) fault = f;
    for (int i = 0; i < kMaxDevices; ++i) device[i].index = i;
  }
};

// Never destroyed: a process may call in from its exit handlers (wia-info
// finalises the providers from a static destructor), as drivers allow.
State& state() {
  static State* s = new State;
  return *s;
}

// Event state changes under one lock and one condition variable.
std::mutex g_events_mu;
std::condition_variable g_events_cv;

std::uint64_t now_ns() {
  return static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                        std::chrono::steady_clock::now().time_since_epoch())
                                        .count());
}

int device_index(wia_ze_device_handle_t h) {
  State& s = state();
  for (int i = 0; i < s.devices; ++i)
    if (h == &s.device[i]) return i;
  return -1;
}

bool live_context(wia_ze_context_handle_t c) {
  State& s = state();
  std::lock_guard<std::mutex> lk(s.mu);
  return s.contexts.count(c) != 0;
}

wia_ze_command_list* live_list(wia_ze_command_list_handle_t l) {
  State& s = state();
  std::lock_guard<std::mutex> lk(s.mu);
  return s.lists.count(l) != 0 ? l : nullptr;
}

bool live_event(wia_ze_event_handle_t e) {
  State& s = state();
  std::lock_guard<std::mutex> lk(s.mu);
  return s.events.count(e) != 0;
}

// Whether [p, p + n) stays inside the allocation it starts in; memory
// no allocation holds is pageable host memory, which copies accept.
bool range_ok(const void* p, std::size_t n) {
  State& s = state();
  std::lock_guard<std::mutex> lk(s.mu);
  const auto a = reinterpret_cast<std::uintptr_t>(p);
  auto it = s.allocations.upper_bound(a);
  if (it != s.allocations.begin()) {
    --it;
    if (a < it->first + it->second.size) return a + n <= it->first + it->second.size;
  }
  auto im = s.imports.upper_bound(a);
  if (im != s.imports.begin()) {
    --im;
    if (a < im->first + im->second.mapped) return a + n <= im->first + im->second.mapped;
  }
  return true;
}

void signal(wia_ze_event* e, Err error) {
  if (e == nullptr) return;
  std::lock_guard<std::mutex> lk(g_events_mu);
  e->signalled = true;
  e->error = error;
  g_events_cv.notify_all();
}

void worker_loop(wia_ze_command_list* l) {
  std::unique_lock<std::mutex> lk(l->mu);
  for (;;) {
    l->cv.wait(lk, [&] { return !l->queue.empty() || l->stop; });
    if (l->queue.empty()) return;  // stopped, and drained
    // Everything up to the first ordered point, which Level Zero may run
    // in any order: run in reverse.
    std::vector<Task> batch;
    while (!l->queue.empty()) {
      batch.push_back(std::move(l->queue.front()));
      l->queue.pop_front();
      if (batch.back().ordered) break;
    }
    l->busy = true;
    lk.unlock();
    const bool ends_ordered = batch.back().ordered;
    const std::size_t free_part = ends_ordered ? batch.size() - 1 : batch.size();
    for (std::size_t i = free_part; i-- > 0;) batch[i].run();
    if (ends_ordered) batch.back().run();
    lk.lock();
    l->busy = false;
    l->cv.notify_all();
  }
}

// The signal error of list `l` now (after a fault every signal carries it).
Err list_error(wia_ze_command_list* l) {
  std::lock_guard<std::mutex> lk(l->mu);
  return l->error;
}

Err enqueue(wia_ze_command_list_handle_t h, std::function<void()> run, bool ordered) {
  wia_ze_command_list* l = live_list(h);
  if (l == nullptr) return WIA_ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  if (l->synchronous) {
    run();
    return list_error(l);
  }
  {
    State& st = state();
    std::lock_guard<std::mutex> lk(st.mu);
    // stream_error: the first command of any asynchronous list runs, then
    // the "device" is lost for that list: every later signal carries
    // ZE_RESULT_ERROR_DEVICE_LOST, which waits on those events return.
    if (st.fault == "stream_error" && !st.stream_fault_fired) {
      st.stream_fault_fired = true;
      run = [inner = std::move(run), l]() {
        inner();
        std::lock_guard<std::mutex> g(l->mu);
        l->error = WIA_ZE_RESULT_ERROR_DEVICE_LOST;
      };
    }
  }
  std::lock_guard<std::mutex> lk(l->mu);
  l->queue.push_back(Task{std::move(run), ordered});
  l->cv.notify_all();
  return WIA_ZE_RESULT_SUCCESS;
}

Err check_waits(std::uint32_t n, wia_ze_event_handle_t* waits) {
  if (n != 0 && waits == nullptr) return WIA_ZE_RESULT_ERROR_INVALID_NULL_POINTER;
  for (std::uint32_t i = 0; i < n; ++i)
    if (!live_event(waits[i])) return WIA_ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  return WIA_ZE_RESULT_SUCCESS;
}

void wait_all(std::vector<wia_ze_event*> waits) {
  std::unique_lock<std::mutex> lk(g_events_mu);
  g_events_cv.wait(lk, [&] {
    return std::all_of(waits.begin(), waits.end(), [](wia_ze_event* e) { return e->signalled; });
  });
}

// A command with the optional signal and wait list every append takes.
Err append(wia_ze_command_list_handle_t list, std::function<void()> body, wia_ze_event_handle_t sig,
           std::uint32_t nwaits, wia_ze_event_handle_t* waits, bool ordered) {
  if (const Err r = check_waits(nwaits, waits); r != WIA_ZE_RESULT_SUCCESS) return r;
  if (sig != nullptr && !live_event(sig)) return WIA_ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  wia_ze_command_list* l = live_list(list);
  if (l == nullptr) return WIA_ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  std::vector<wia_ze_event*> w(waits, waits + nwaits);
  return enqueue(
      list,
      [body = std::move(body), sig, w = std::move(w), l] {
        if (!w.empty()) wait_all(w);
        body();
        signal(sig, list_error(l));
      },
      ordered || nwaits != 0);
}

}  // namespace

// ---------------------------------------------------------------------------
// Init, drivers, devices

FAKE_API Err zeInit(std::uint32_t flags) {
  if ((flags & ~0x3u) != 0) return WIA_ZE_RESULT_ERROR_INVALID_ENUMERATION;
  State& s = state();
  // What the real loader answers when it finds no driver.
  if (s.fault == "init") return WIA_ZE_RESULT_ERROR_UNINITIALIZED;
  s.initialised = true;
  return WIA_ZE_RESULT_SUCCESS;
}

FAKE_API Err zeDriverGet(std::uint32_t* count, wia_ze_driver_handle_t* drivers) {
  State& s = state();
  if (!s.initialised) return WIA_ZE_RESULT_ERROR_UNINITIALIZED;
  if (count == nullptr) return WIA_ZE_RESULT_ERROR_INVALID_NULL_POINTER;
  if (drivers == nullptr || *count == 0) {
    *count = 1;
    return WIA_ZE_RESULT_SUCCESS;
  }
  drivers[0] = &s.driver;
  *count = 1;
  return WIA_ZE_RESULT_SUCCESS;
}

FAKE_API Err zeDriverGetApiVersion(wia_ze_driver_handle_t driver, wia_ze_api_version_t* version) {
  if (driver != &state().driver) return WIA_ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  if (version == nullptr) return WIA_ZE_RESULT_ERROR_INVALID_NULL_POINTER;
  *version = WIA_ZE_MAKE_VERSION(1, 4);
  return WIA_ZE_RESULT_SUCCESS;
}

FAKE_API Err zeDeviceGet(wia_ze_driver_handle_t driver, std::uint32_t* count,
                         wia_ze_device_handle_t* devs) {
  State& s = state();
  if (driver != &s.driver) return WIA_ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  if (count == nullptr) return WIA_ZE_RESULT_ERROR_INVALID_NULL_POINTER;
  const auto n = static_cast<std::uint32_t>(s.fault == "no_device" ? 0 : s.devices);
  if (devs == nullptr || *count == 0) {
    *count = n;
    return WIA_ZE_RESULT_SUCCESS;
  }
  *count = std::min(*count, n);
  for (std::uint32_t i = 0; i < *count; ++i) devs[i] = &s.device[i];
  return WIA_ZE_RESULT_SUCCESS;
}

FAKE_API Err zeDeviceGetProperties(wia_ze_device_handle_t dev, wia_ze_device_properties_t* props) {
  const int d = device_index(dev);
  if (d < 0) return WIA_ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  if (props == nullptr) return WIA_ZE_RESULT_ERROR_INVALID_NULL_POINTER;
  const wia_ze_structure_type_t stype = props->stype;
  if (stype != WIA_ZE_STRUCTURE_TYPE_DEVICE_PROPERTIES &&
      stype != WIA_ZE_STRUCTURE_TYPE_DEVICE_PROPERTIES_1_2)
    return WIA_ZE_RESULT_ERROR_INVALID_ARGUMENT;
  void* next = props->pNext;
  std::memset(props, 0, sizeof(*props));
  props->stype = stype;
  props->pNext = next;
  props->type = WIA_ZE_DEVICE_TYPE_GPU;
  props->vendorId = 0x8086;
  props->deviceId = 0x0bd5;
  props->maxMemAllocSize = kDeviceMemory;
  // Before API 1.2 the field was nanoseconds per tick; from 1.2 on ticks
  // per second. Ticks are nanoseconds here, so 1 or 1e9.
  props->timerResolution = stype == WIA_ZE_STRUCTURE_TYPE_DEVICE_PROPERTIES_1_2 ? 1000000000u : 1u;
  props->timestampValidBits = 56;
  props->kernelTimestampValidBits = 32;
  props->uuid[0] = static_cast<std::uint8_t>(d);
  std::snprintf(props->name, sizeof(props->name), "Fake ZE Device %d", d);
  return WIA_ZE_RESULT_SUCCESS;
}

FAKE_API Err zeDeviceGetMemoryProperties(wia_ze_device_handle_t dev, std::uint32_t* count,
                                         wia_ze_device_memory_properties_t* props) {
  if (device_index(dev) < 0) return WIA_ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  if (count == nullptr) return WIA_ZE_RESULT_ERROR_INVALID_NULL_POINTER;
  if (props == nullptr || *count == 0) {
    *count = 1;
    return WIA_ZE_RESULT_SUCCESS;
  }
  *count = 1;
  if (props[0].stype != WIA_ZE_STRUCTURE_TYPE_DEVICE_MEMORY_PROPERTIES)
    return WIA_ZE_RESULT_ERROR_INVALID_ARGUMENT;
  props[0].totalSize = kDeviceMemory;
  std::snprintf(props[0].name, sizeof(props[0].name), "HBM");
  return WIA_ZE_RESULT_SUCCESS;
}

// Device allocations export as dma-bufs (here: their memfd), except under
// the no_dmabuf fault.
FAKE_API Err zeDeviceGetExternalMemoryProperties(
    wia_ze_device_handle_t dev, wia_ze_device_external_memory_properties_t* props) {
  if (device_index(dev) < 0) return WIA_ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  if (props == nullptr) return WIA_ZE_RESULT_ERROR_INVALID_NULL_POINTER;
  if (props->stype != WIA_ZE_STRUCTURE_TYPE_DEVICE_EXTERNAL_MEMORY_PROPERTIES)
    return WIA_ZE_RESULT_ERROR_INVALID_ARGUMENT;
  props->memoryAllocationImportTypes = 0;
  props->memoryAllocationExportTypes =
      state().fault == "no_dmabuf" ? 0u : WIA_ZE_EXTERNAL_MEMORY_TYPE_FLAG_DMA_BUF;
  props->imageImportTypes = 0;
  props->imageExportTypes = 0;
  return WIA_ZE_RESULT_SUCCESS;
}

FAKE_API Err zeDeviceCanAccessPeer(wia_ze_device_handle_t dev, wia_ze_device_handle_t peer,
                                   wia_ze_bool_t* value) {
  if (device_index(dev) < 0 || device_index(peer) < 0)
    return WIA_ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  if (value == nullptr) return WIA_ZE_RESULT_ERROR_INVALID_NULL_POINTER;
  *value = 1;
  return WIA_ZE_RESULT_SUCCESS;
}

// ---------------------------------------------------------------------------
// Contexts and command lists

FAKE_API Err zeContextCreate(wia_ze_driver_handle_t driver, const wia_ze_context_desc_t* desc,
                             wia_ze_context_handle_t* context) {
  State& s = state();
  if (driver != &s.driver) return WIA_ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  if (desc == nullptr || context == nullptr) return WIA_ZE_RESULT_ERROR_INVALID_NULL_POINTER;
  if (desc->stype != WIA_ZE_STRUCTURE_TYPE_CONTEXT_DESC)
    return WIA_ZE_RESULT_ERROR_INVALID_ARGUMENT;
  auto* c = new wia_ze_context;
  std::lock_guard<std::mutex> lk(s.mu);
  s.contexts.insert(c);
  *context = c;
  return WIA_ZE_RESULT_SUCCESS;
}

FAKE_API Err zeContextDestroy(wia_ze_context_handle_t context) {
  State& s = state();
  std::lock_guard<std::mutex> lk(s.mu);
  if (s.contexts.erase(context) == 0) return WIA_ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  delete context;
  return WIA_ZE_RESULT_SUCCESS;
}

FAKE_API Err zeCommandListCreateImmediate(wia_ze_context_handle_t context,
                                          wia_ze_device_handle_t dev,
                                          const wia_ze_command_queue_desc_t* desc,
                                          wia_ze_command_list_handle_t* list) {
  if (!live_context(context)) return WIA_ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  const int d = device_index(dev);
  if (d < 0) return WIA_ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  if (desc == nullptr || list == nullptr) return WIA_ZE_RESULT_ERROR_INVALID_NULL_POINTER;
  if (desc->stype != WIA_ZE_STRUCTURE_TYPE_COMMAND_QUEUE_DESC || desc->ordinal != 0 ||
      desc->mode > WIA_ZE_COMMAND_QUEUE_MODE_ASYNCHRONOUS)
    return WIA_ZE_RESULT_ERROR_INVALID_ARGUMENT;
  auto* l = new wia_ze_command_list;
  l->device = d;
  l->synchronous = desc->mode == WIA_ZE_COMMAND_QUEUE_MODE_SYNCHRONOUS;
  if (!l->synchronous) l->worker = std::thread(worker_loop, l);
  State& s = state();
  std::lock_guard<std::mutex> lk(s.mu);
  s.lists.insert(l);
  *list = l;
  return WIA_ZE_RESULT_SUCCESS;
}

FAKE_API Err zeCommandListDestroy(wia_ze_command_list_handle_t list) {
  {
    State& s = state();
    std::lock_guard<std::mutex> lk(s.mu);
    if (s.lists.erase(list) == 0) return WIA_ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  }
  {
    std::lock_guard<std::mutex> lk(list->mu);
    list->stop = true;
    list->cv.notify_all();
  }
  if (list->worker.joinable()) list->worker.join();  // queued work still runs first
  delete list;
  return WIA_ZE_RESULT_SUCCESS;
}

FAKE_API Err zeCommandListAppendMemoryCopy(wia_ze_command_list_handle_t list, void* dst,
                                           const void* src, std::size_t size,
                                           wia_ze_event_handle_t sig, std::uint32_t nwaits,
                                           wia_ze_event_handle_t* waits) {
  if (size != 0 && (dst == nullptr || src == nullptr))
    return WIA_ZE_RESULT_ERROR_INVALID_NULL_POINTER;
  if (size != 0 && (!range_ok(dst, size) || !range_ok(src, size)))
    return WIA_ZE_RESULT_ERROR_INVALID_SIZE;
  return append(
      list, [=] { std::memmove(dst, src, size); }, sig, nwaits, waits, false);
}

FAKE_API Err zeCommandListAppendMemoryFill(wia_ze_command_list_handle_t list, void* ptr,
                                           const void* pattern, std::size_t pattern_size,
                                           std::size_t size, wia_ze_event_handle_t sig,
                                           std::uint32_t nwaits, wia_ze_event_handle_t* waits) {
  if (ptr == nullptr || pattern == nullptr) return WIA_ZE_RESULT_ERROR_INVALID_NULL_POINTER;
  // Level Zero: pattern sizes are powers of two, and size a multiple.
  if (pattern_size == 0 || (pattern_size & (pattern_size - 1)) != 0 || size % pattern_size != 0)
    return WIA_ZE_RESULT_ERROR_INVALID_SIZE;
  if (!range_ok(ptr, size)) return WIA_ZE_RESULT_ERROR_INVALID_SIZE;
  // The pattern is copied at append, as the driver does.
  std::vector<unsigned char> pat(static_cast<const unsigned char*>(pattern),
                                 static_cast<const unsigned char*>(pattern) + pattern_size);
  return append(
      list,
      [=] {
        auto* out = static_cast<unsigned char*>(ptr);
        for (std::size_t i = 0; i < size; ++i) out[i] = pat[i % pat.size()];
      },
      sig, nwaits, waits, false);
}

FAKE_API Err zeCommandListAppendBarrier(wia_ze_command_list_handle_t list,
                                        wia_ze_event_handle_t sig, std::uint32_t nwaits,
                                        wia_ze_event_handle_t* waits) {
  return append(
      list, [] {}, sig, nwaits, waits, true);
}

FAKE_API Err zeCommandListAppendSignalEvent(wia_ze_command_list_handle_t list,
                                            wia_ze_event_handle_t ev) {
  if (ev == nullptr) return WIA_ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  return append(
      list, [] {}, ev, 0, nullptr, false);
}

FAKE_API Err zeCommandListAppendWaitOnEvents(wia_ze_command_list_handle_t list,
                                             std::uint32_t nevents, wia_ze_event_handle_t* events) {
  if (nevents == 0) return WIA_ZE_RESULT_ERROR_INVALID_SIZE;
  return append(
      list, [] {}, nullptr, nevents, events, true);
}

FAKE_API Err zeCommandListAppendWriteGlobalTimestamp(wia_ze_command_list_handle_t list,
                                                     std::uint64_t* dst, wia_ze_event_handle_t sig,
                                                     std::uint32_t nwaits,
                                                     wia_ze_event_handle_t* waits) {
  if (dst == nullptr) return WIA_ZE_RESULT_ERROR_INVALID_NULL_POINTER;
  if (reinterpret_cast<std::uintptr_t>(dst) % 8 != 0) return WIA_ZE_RESULT_ERROR_INVALID_ARGUMENT;
  return append(
      list, [=] { *dst = now_ns(); }, sig, nwaits, waits, false);
}

// ---------------------------------------------------------------------------
// Event pools and events

FAKE_API Err zeEventPoolCreate(wia_ze_context_handle_t context,
                               const wia_ze_event_pool_desc_t* desc, std::uint32_t ndevices,
                               wia_ze_device_handle_t* devices, wia_ze_event_pool_handle_t* pool) {
  if (!live_context(context)) return WIA_ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  if (desc == nullptr || pool == nullptr) return WIA_ZE_RESULT_ERROR_INVALID_NULL_POINTER;
  if (desc->stype != WIA_ZE_STRUCTURE_TYPE_EVENT_POOL_DESC || desc->count == 0)
    return WIA_ZE_RESULT_ERROR_INVALID_SIZE;
  if (ndevices != 0 && devices == nullptr) return WIA_ZE_RESULT_ERROR_INVALID_NULL_POINTER;
  auto* p = new wia_ze_event_pool;
  p->count = desc->count;
  p->used.assign(desc->count, false);
  State& s = state();
  std::lock_guard<std::mutex> lk(s.mu);
  s.pools.insert(p);
  *pool = p;
  return WIA_ZE_RESULT_SUCCESS;
}

FAKE_API Err zeEventPoolDestroy(wia_ze_event_pool_handle_t pool) {
  State& s = state();
  std::lock_guard<std::mutex> lk(s.mu);
  if (s.pools.count(pool) == 0) return WIA_ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  // Level Zero: every event of the pool must be destroyed first.
  for (bool used : pool->used)
    if (used) return WIA_ZE_RESULT_ERROR_HANDLE_OBJECT_IN_USE;
  s.pools.erase(pool);
  delete pool;
  return WIA_ZE_RESULT_SUCCESS;
}

FAKE_API Err zeEventCreate(wia_ze_event_pool_handle_t pool, const wia_ze_event_desc_t* desc,
                           wia_ze_event_handle_t* ev) {
  State& s = state();
  std::lock_guard<std::mutex> lk(s.mu);
  if (s.pools.count(pool) == 0) return WIA_ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  if (desc == nullptr || ev == nullptr) return WIA_ZE_RESULT_ERROR_INVALID_NULL_POINTER;
  if (desc->stype != WIA_ZE_STRUCTURE_TYPE_EVENT_DESC || desc->index >= pool->count ||
      pool->used[desc->index])
    return WIA_ZE_RESULT_ERROR_INVALID_ARGUMENT;
  auto* e = new wia_ze_event;
  e->pool = pool;
  e->index = desc->index;
  pool->used[desc->index] = true;
  s.events.insert(e);
  *ev = e;
  return WIA_ZE_RESULT_SUCCESS;
}

FAKE_API Err zeEventDestroy(wia_ze_event_handle_t ev) {
  State& s = state();
  std::lock_guard<std::mutex> lk(s.mu);
  if (s.events.erase(ev) == 0) return WIA_ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  ev->pool->used[ev->index] = false;
  delete ev;
  return WIA_ZE_RESULT_SUCCESS;
}

FAKE_API Err zeEventHostSynchronize(wia_ze_event_handle_t ev, std::uint64_t timeout_ns) {
  if (!live_event(ev)) return WIA_ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  std::unique_lock<std::mutex> lk(g_events_mu);
  if (timeout_ns == UINT64_MAX) {
    g_events_cv.wait(lk, [&] { return ev->signalled; });
  } else if (!g_events_cv.wait_for(lk, std::chrono::nanoseconds(timeout_ns),
                                   [&] { return ev->signalled; })) {
    return WIA_ZE_RESULT_NOT_READY;
  }
  return ev->error;
}

FAKE_API Err zeEventQueryStatus(wia_ze_event_handle_t ev) {
  if (!live_event(ev)) return WIA_ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  std::lock_guard<std::mutex> lk(g_events_mu);
  return ev->signalled ? ev->error : WIA_ZE_RESULT_NOT_READY;
}

FAKE_API Err zeEventHostSignal(wia_ze_event_handle_t ev) {
  if (!live_event(ev)) return WIA_ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  signal(ev, WIA_ZE_RESULT_SUCCESS);
  return WIA_ZE_RESULT_SUCCESS;
}

FAKE_API Err zeEventHostReset(wia_ze_event_handle_t ev) {
  if (!live_event(ev)) return WIA_ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  std::lock_guard<std::mutex> lk(g_events_mu);
  ev->signalled = false;
  ev->error = WIA_ZE_RESULT_SUCCESS;
  return WIA_ZE_RESULT_SUCCESS;
}

// ---------------------------------------------------------------------------
// Memory

FAKE_API Err zeMemAllocDevice(wia_ze_context_handle_t context,
                              const wia_ze_device_mem_alloc_desc_t* desc, std::size_t size,
                              std::size_t alignment, wia_ze_device_handle_t dev, void** ptr) {
  if (!live_context(context)) return WIA_ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  const int d = device_index(dev);
  if (d < 0) return WIA_ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  if (desc == nullptr || ptr == nullptr) return WIA_ZE_RESULT_ERROR_INVALID_NULL_POINTER;
  if (desc->stype != WIA_ZE_STRUCTURE_TYPE_DEVICE_MEM_ALLOC_DESC)
    return WIA_ZE_RESULT_ERROR_INVALID_ARGUMENT;
  *ptr = nullptr;
  // The chain: an export desc may ask for DMA_BUF, and only where the
  // device offers it; anything else chained is not known here.
  bool exportable = false;
  for (const auto* next = static_cast<const wia_ze_external_memory_export_desc_t*>(desc->pNext);
       next != nullptr;
       next = static_cast<const wia_ze_external_memory_export_desc_t*>(next->pNext)) {
    if (next->stype != WIA_ZE_STRUCTURE_TYPE_EXTERNAL_MEMORY_EXPORT_DESC)
      return WIA_ZE_RESULT_ERROR_INVALID_ARGUMENT;
    if ((next->flags & ~WIA_ZE_EXTERNAL_MEMORY_TYPE_FLAG_DMA_BUF) != 0 ||
        state().fault == "no_dmabuf")
      return WIA_ZE_RESULT_ERROR_INVALID_ENUMERATION;
    exportable = next->flags != 0;
  }
  if (size == 0) return WIA_ZE_RESULT_ERROR_UNSUPPORTED_SIZE;
  const std::size_t page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  if (alignment != 0 && ((alignment & (alignment - 1)) != 0 || alignment > page))
    return WIA_ZE_RESULT_ERROR_UNSUPPORTED_ALIGNMENT;
  State& s = state();
  if (s.fault == "oom" || size > kDeviceMemory) return WIA_ZE_RESULT_ERROR_OUT_OF_DEVICE_MEMORY;
  const std::size_t mapped = (size + page - 1) / page * page;
  {
    std::lock_guard<std::mutex> lk(s.mu);
    if (s.used[d] + mapped > kDeviceMemory) return WIA_ZE_RESULT_ERROR_OUT_OF_DEVICE_MEMORY;
  }
  int fd = ::memfd_create("fake-ze", MFD_CLOEXEC);
  if (fd < 0) return WIA_ZE_RESULT_ERROR_OUT_OF_DEVICE_MEMORY;
  // Moved to a number >= 512, so that the descriptor an importer fetches
  // (the lowest free one there) never has the exporter's number by chance:
  // zeMemOpenIpcHandle refuses the exporter's number as untranslated.
  if (const int high = ::fcntl(fd, F_DUPFD_CLOEXEC, 512); high >= 0) {
    ::close(fd);
    fd = high;
  }
  if (::ftruncate(fd, static_cast<off_t>(mapped)) != 0) {
    ::close(fd);
    return WIA_ZE_RESULT_ERROR_OUT_OF_DEVICE_MEMORY;
  }
  void* p = ::mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    ::close(fd);
    return WIA_ZE_RESULT_ERROR_OUT_OF_DEVICE_MEMORY;
  }
  struct stat sb {};
  ::fstat(fd, &sb);
  std::lock_guard<std::mutex> lk(s.mu);
  s.allocations[reinterpret_cast<std::uintptr_t>(p)] = Allocation{
      size, mapped, fd, d, static_cast<std::uint64_t>(sb.st_ino), exportable, s.next_id++};
  s.used[d] += mapped;
  *ptr = p;
  return WIA_ZE_RESULT_SUCCESS;
}

FAKE_API Err zeMemAllocHost(wia_ze_context_handle_t context,
                            const wia_ze_host_mem_alloc_desc_t* desc, std::size_t size,
                            std::size_t alignment, void** ptr) {
  if (!live_context(context)) return WIA_ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  if (desc == nullptr || ptr == nullptr) return WIA_ZE_RESULT_ERROR_INVALID_NULL_POINTER;
  if (desc->stype != WIA_ZE_STRUCTURE_TYPE_HOST_MEM_ALLOC_DESC)
    return WIA_ZE_RESULT_ERROR_INVALID_ARGUMENT;
  *ptr = nullptr;
  if (size == 0) return WIA_ZE_RESULT_ERROR_UNSUPPORTED_SIZE;
  if (alignment != 0 && (alignment & (alignment - 1)) != 0)
    return WIA_ZE_RESULT_ERROR_UNSUPPORTED_ALIGNMENT;
  const std::size_t align = std::max<std::size_t>(alignment, 64);
  const std::size_t rounded = (size + align - 1) / align * align;
  void* p = std::aligned_alloc(align, rounded);
  if (p == nullptr) return WIA_ZE_RESULT_ERROR_OUT_OF_HOST_MEMORY;
  State& s = state();
  std::lock_guard<std::mutex> lk(s.mu);
  s.allocations[reinterpret_cast<std::uintptr_t>(p)] =
      Allocation{size, rounded, -1, 0, 0, false, s.next_id++};
  *ptr = p;
  return WIA_ZE_RESULT_SUCCESS;
}

FAKE_API Err zeMemFree(wia_ze_context_handle_t context, void* ptr) {
  if (!live_context(context)) return WIA_ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  if (ptr == nullptr) return WIA_ZE_RESULT_ERROR_INVALID_NULL_POINTER;
  State& s = state();
  Allocation a;
  {
    std::lock_guard<std::mutex> lk(s.mu);
    const auto it = s.allocations.find(reinterpret_cast<std::uintptr_t>(ptr));
    if (it == s.allocations.end()) return WIA_ZE_RESULT_ERROR_INVALID_ARGUMENT;
    a = it->second;
    s.allocations.erase(it);
    if (a.fd >= 0) s.used[a.device] -= a.mapped;
  }
  if (a.fd >= 0) {
    ::munmap(ptr, a.mapped);
    ::close(a.fd);
  } else {
    std::free(ptr);
  }
  return WIA_ZE_RESULT_SUCCESS;
}

// The allocation holding `ptr` (any pointer inside it), as Level Zero
// answers; memory of no allocation is ZE_MEMORY_TYPE_UNKNOWN. A chained
// ze_external_memory_export_fd_t asking DMA_BUF gets a new descriptor of
// the allocation's memfd (the caller closes it), only for a device
// allocation made exportable and only from its start: the double cannot
// tell a driver's whole-allocation export from part of one, so a provider
// that passes an interior pointer fails here.
FAKE_API Err zeMemGetAllocProperties(wia_ze_context_handle_t context, const void* ptr,
                                     wia_ze_memory_allocation_properties_t* props,
                                     wia_ze_device_handle_t* dev) {
  if (!live_context(context)) return WIA_ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  if (ptr == nullptr || props == nullptr) return WIA_ZE_RESULT_ERROR_INVALID_NULL_POINTER;
  if (props->stype != WIA_ZE_STRUCTURE_TYPE_MEMORY_ALLOCATION_PROPERTIES)
    return WIA_ZE_RESULT_ERROR_INVALID_ARGUMENT;
  auto* export_fd = static_cast<wia_ze_external_memory_export_fd_t*>(props->pNext);
  if (export_fd != nullptr &&
      (export_fd->stype != WIA_ZE_STRUCTURE_TYPE_EXTERNAL_MEMORY_EXPORT_FD ||
       export_fd->pNext != nullptr))
    return WIA_ZE_RESULT_ERROR_INVALID_ARGUMENT;
  State& s = state();
  std::lock_guard<std::mutex> lk(s.mu);
  const auto at = reinterpret_cast<std::uintptr_t>(ptr);
  auto it = s.allocations.upper_bound(at);
  const bool known = it != s.allocations.begin() && (--it, at - it->first < it->second.size);
  props->type = !known ? 0u : it->second.fd >= 0 ? WIA_ZE_MEMORY_TYPE_DEVICE : 1u;
  props->id = known ? it->second.id : 0;
  props->pageSize = static_cast<std::uint64_t>(::sysconf(_SC_PAGESIZE));
  if (dev != nullptr) *dev = known && it->second.fd >= 0 ? &s.device[it->second.device] : nullptr;
  if (export_fd == nullptr) return WIA_ZE_RESULT_SUCCESS;
  if (export_fd->flags != WIA_ZE_EXTERNAL_MEMORY_TYPE_FLAG_DMA_BUF)
    return WIA_ZE_RESULT_ERROR_INVALID_ENUMERATION;
  if (!known || it->second.fd < 0 || !it->second.dmabuf_exportable || at != it->first)
    return WIA_ZE_RESULT_ERROR_INVALID_ARGUMENT;
  const int fd = ::fcntl(it->second.fd, F_DUPFD_CLOEXEC, 0);
  if (fd < 0) return WIA_ZE_RESULT_ERROR_OUT_OF_HOST_MEMORY;
  export_fd->fd = fd;
  return WIA_ZE_RESULT_SUCCESS;
}

// ---------------------------------------------------------------------------
// IPC: as Intel's driver on Linux, the handle starts with a file descriptor
// (here the allocation's memfd) that is valid in the exporting process
// only. The importer must put a descriptor of its own for the same file
// there (the ze provider fetches it with pidfd_getfd); the double maps what
// that descriptor names and checks it is the exported file (inode), so a
// handle passed on untranslated fails as it would on a real driver.

namespace {
constexpr char kIpcMagic[8] = {'F', 'A', 'K', 'E', 'Z', 'E', 'I', 'P'};
struct IpcPayload {
  std::int32_t fd;  // first, where the real driver keeps its dma-buf fd
  char magic[8];
  std::int32_t pid;
  std::uint64_t size;
  std::uint64_t mapped;
  std::uint64_t inode;
  std::int32_t device;
  // The exporter's number again: a forked importer inherits the exporter's
  // descriptors, so an untranslated number would still name the file there;
  // it is refused all the same, as it would be garbage for a real driver in
  // an unrelated process.
  std::int32_t exporter_fd;
  std::uint8_t unused[16];
};
static_assert(sizeof(IpcPayload) == WIA_ZE_MAX_IPC_HANDLE_SIZE, "fills the handle exactly");
}  // namespace

FAKE_API Err zeMemGetIpcHandle(wia_ze_context_handle_t context, const void* ptr,
                               wia_ze_ipc_mem_handle_t* handle) {
  if (!live_context(context)) return WIA_ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  if (handle == nullptr || ptr == nullptr) return WIA_ZE_RESULT_ERROR_INVALID_NULL_POINTER;
  State& s = state();
  std::lock_guard<std::mutex> lk(s.mu);
  const auto it = s.allocations.find(reinterpret_cast<std::uintptr_t>(ptr));
  if (it == s.allocations.end() || it->second.fd < 0) return WIA_ZE_RESULT_ERROR_INVALID_ARGUMENT;
  IpcPayload p{};
  std::memcpy(p.magic, kIpcMagic, sizeof(kIpcMagic));
  p.pid = static_cast<std::int32_t>(::getpid());
  p.fd = it->second.fd;
  p.exporter_fd = it->second.fd;
  p.size = it->second.size;
  p.mapped = it->second.mapped;
  p.inode = it->second.inode;
  p.device = it->second.device;
  std::memcpy(handle->data, &p, sizeof(p));
  return WIA_ZE_RESULT_SUCCESS;
}

FAKE_API Err zeMemOpenIpcHandle(wia_ze_context_handle_t context, wia_ze_device_handle_t dev,
                                wia_ze_ipc_mem_handle_t handle, std::uint32_t flags, void** ptr) {
  if (!live_context(context) || device_index(dev) < 0)
    return WIA_ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  if (ptr == nullptr) return WIA_ZE_RESULT_ERROR_INVALID_NULL_POINTER;
  if ((flags & ~0x3u) != 0) return WIA_ZE_RESULT_ERROR_INVALID_ENUMERATION;
  IpcPayload p;
  std::memcpy(&p, handle.data, sizeof(p));
  if (std::memcmp(p.magic, kIpcMagic, sizeof(kIpcMagic)) != 0)
    return WIA_ZE_RESULT_ERROR_INVALID_ARGUMENT;
  if (p.pid == static_cast<std::int32_t>(::getpid())) return WIA_ZE_RESULT_ERROR_INVALID_ARGUMENT;
  // The descriptor must be ours and name the exported file.
  if (p.fd == p.exporter_fd) return WIA_ZE_RESULT_ERROR_INVALID_ARGUMENT;
  struct stat sb {};
  if (::fstat(p.fd, &sb) != 0 || static_cast<std::uint64_t>(sb.st_ino) != p.inode)
    return WIA_ZE_RESULT_ERROR_INVALID_ARGUMENT;
  const std::string key = std::to_string(p.pid) + ":" + std::to_string(p.inode);
  State& s = state();
  std::lock_guard<std::mutex> lk(s.mu);
  for (auto& [base, im] : s.imports)
    if (im.key == key) {
      ++im.opens;
      *ptr = reinterpret_cast<void*>(base);
      return WIA_ZE_RESULT_SUCCESS;
    }
  // The caller keeps its descriptor (and may close it once this returns).
  void* m = ::mmap(nullptr, p.mapped, PROT_READ | PROT_WRITE, MAP_SHARED, p.fd, 0);
  if (m == MAP_FAILED) return WIA_ZE_RESULT_ERROR_OUT_OF_HOST_MEMORY;
  s.imports[reinterpret_cast<std::uintptr_t>(m)] = Import{p.mapped, 1, key};
  *ptr = m;
  return WIA_ZE_RESULT_SUCCESS;
}

FAKE_API Err zeMemCloseIpcHandle(wia_ze_context_handle_t context, const void* ptr) {
  if (!live_context(context)) return WIA_ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  State& s = state();
  std::lock_guard<std::mutex> lk(s.mu);
  const auto it = s.imports.find(reinterpret_cast<std::uintptr_t>(ptr));
  if (it == s.imports.end()) return WIA_ZE_RESULT_ERROR_INVALID_ARGUMENT;
  if (--it->second.opens == 0) {
    ::munmap(const_cast<void*>(ptr), it->second.mapped);
    s.imports.erase(it);
  }
  return WIA_ZE_RESULT_SUCCESS;
}

// Not Level Zero: how many events exist now, so a test can see that the
// provider recycles them instead of taking new ones for ever.
FAKE_API int wia_fake_ze_live_events() {
  State& s = state();
  std::lock_guard<std::mutex> lk(s.mu);
  return static_cast<int>(s.events.size());
}

// Every entry the provider resolves exists here with exactly its type.
#define WIA_FAKE_ZE_CHECK(name, params) \
  static_assert(std::is_same_v<decltype(&::name), wia_PFN_##name>, #name " differs");
WIA_ZE_ENTRIES(WIA_FAKE_ZE_CHECK)
#undef WIA_FAKE_ZE_CHECK
