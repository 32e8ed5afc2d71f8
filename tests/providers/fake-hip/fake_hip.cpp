// SPDX-License-Identifier: Apache-2.0
// fake-hip: a HIP runtime test double (README.md in this folder). Exports
// every entry of WIA_HIP_RUNTIME_ENTRIES (providers/hip/hip_runtime_api.h),
// each checked against its wia_PFN_ type at the end of this file. Device
// memory is host memory (a memfd per allocation, so another process can
// map it for IPC); a stream is a FIFO served by a worker thread; events
// are completion marks with steady-clock timestamps.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

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

#include "hip_runtime_api.h"

#define FAKE_API extern "C" __attribute__((visibility("default")))

namespace {

using Clock = std::chrono::steady_clock;
using Err = wia_hipError_t;
constexpr std::uint64_t kDeviceMemory = 16ull << 30;
constexpr int kMaxDevices = 16;

struct Allocation {
  std::size_t size = 0;
  std::size_t mapped = 0;
  int fd = -1;  // device memory: its memfd; pinned host memory: -1
  int device = 0;
  std::uint64_t inode = 0;
};

struct Import {
  std::size_t mapped = 0;
  int opens = 0;
  std::string key;
};

struct Mark {
  bool done = false;
  Clock::time_point when;
};

struct FakeStream {
  int device = 0;
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::function<Err()>> queue;
  bool busy = false;
  bool stop = false;
  Err error = WIA_hipSuccess;  // first asynchronous error, reported once
  std::thread worker;
};

struct FakeEvent {
  int device = 0;
  std::shared_ptr<Mark> mark;  // the latest record; NULL: never recorded
};

struct State {
  std::mutex mu;
  int devices = 2;
  std::string fault;
  std::map<std::uintptr_t, Allocation> allocations;  // by base address
  std::map<std::uintptr_t, Import> imports;
  std::set<FakeStream*> streams;
  std::set<FakeEvent*> events;
  std::set<std::pair<int, int>> peers;
  std::uint64_t used[kMaxDevices] = {};
  bool stream_fault_fired = false;

  State() {
    if (const char* v = std::getenv("WIA_FAKE_HIP_DEVICES")) {
      devices = std::atoi(v);
      if (devices < 0) devices = 0;
      if (devices > kMaxDevices) devices = kMaxDevices;
    }
    if (const char* f = std::getenv("WIA_FAKE_HIP_FAULT")) fault = f;
  }
};

State& state() {
  static State s;
  return s;
}

// Marks complete under one lock and one condition variable for all events.
std::mutex g_marks_mu;
std::condition_variable g_marks_cv;

thread_local int t_device = 0;
thread_local bool t_in_host_fn = false;

bool valid_device(int d) { return d >= 0 && d < state().devices; }

// The allocation holding [p, p + n), if p is inside a known one. `inside`
// false: unknown memory (pageable host memory, which copies accept).
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

void worker_loop(FakeStream* s) {
  std::unique_lock<std::mutex> lk(s->mu);
  for (;;) {
    s->cv.wait(lk, [&] { return !s->queue.empty() || s->stop; });
    if (s->queue.empty()) return;  // stop, and drained
    std::function<Err()> task = std::move(s->queue.front());
    s->queue.pop_front();
    s->busy = true;
    lk.unlock();
    const Err r = task();
    lk.lock();
    s->busy = false;
    if (r != WIA_hipSuccess && s->error == WIA_hipSuccess) s->error = r;
    s->cv.notify_all();
  }
}

FakeStream* live_stream(wia_hipStream_t h) {
  State& s = state();
  std::lock_guard<std::mutex> lk(s.mu);
  auto* fs = reinterpret_cast<FakeStream*>(h);
  return s.streams.count(fs) != 0 ? fs : nullptr;
}

FakeEvent* live_event(wia_hipEvent_t h) {
  State& s = state();
  std::lock_guard<std::mutex> lk(s.mu);
  auto* fe = reinterpret_cast<FakeEvent*>(h);
  return s.events.count(fe) != 0 ? fe : nullptr;
}

// Runs `task` in order on stream `h`; the NULL stream runs it now.
Err enqueue(wia_hipStream_t h, std::function<Err()> task) {
  if (h == nullptr) return task();
  FakeStream* s = live_stream(h);
  if (s == nullptr) return WIA_hipErrorInvalidHandle;
  {
    State& st = state();
    std::lock_guard<std::mutex> lk(st.mu);
    // stream_error: the first work item of any created stream fails on
    // the "device" (it still runs, so host staging is never left dangling).
    if (st.fault == "stream_error" && !st.stream_fault_fired) {
      st.stream_fault_fired = true;
      task = [inner = std::move(task)]() {
        inner();
        return static_cast<Err>(WIA_hipErrorIllegalAddress);
      };
    }
  }
  std::lock_guard<std::mutex> lk(s->mu);
  s->queue.push_back(std::move(task));
  s->cv.notify_all();
  return WIA_hipSuccess;
}

Err wait_mark(const std::shared_ptr<Mark>& m) {
  std::unique_lock<std::mutex> lk(g_marks_mu);
  g_marks_cv.wait(lk, [&] { return m->done; });
  return WIA_hipSuccess;
}

}  // namespace

#define GATE()                                                                              \
  do {                                                                                      \
    if (t_in_host_fn) return WIA_hipErrorNotSupported; /* no API calls in host functions */ \
  } while (0)

// ---------------------------------------------------------------------------
// Runtime, errors, devices

FAKE_API Err hipInit(unsigned int flags) {
  GATE();
  if (flags != 0) return WIA_hipErrorInvalidValue;
  if (state().fault == "init") return WIA_hipErrorInsufficientDriver;
  return WIA_hipSuccess;
}

FAKE_API Err hipRuntimeGetVersion(int* version) {
  if (version == nullptr) return WIA_hipErrorInvalidValue;
  *version = 50231000;  // 5.2.x, what Debian ships
  return WIA_hipSuccess;
}

FAKE_API const char* hipGetErrorName(Err error) {
  switch (error) {
    case WIA_hipSuccess:
      return "hipSuccess";
    case WIA_hipErrorInvalidValue:
      return "hipErrorInvalidValue";
    case WIA_hipErrorOutOfMemory:
      return "hipErrorOutOfMemory";
    case WIA_hipErrorNotInitialized:
      return "hipErrorNotInitialized";
    case WIA_hipErrorInsufficientDriver:
      return "hipErrorInsufficientDriver";
    case WIA_hipErrorNoDevice:
      return "hipErrorNoDevice";
    case WIA_hipErrorInvalidDevice:
      return "hipErrorInvalidDevice";
    case WIA_hipErrorInvalidContext:
      return "hipErrorInvalidContext";
    case WIA_hipErrorInvalidHandle:
      return "hipErrorInvalidHandle";
    case WIA_hipErrorNotReady:
      return "hipErrorNotReady";
    case WIA_hipErrorIllegalAddress:
      return "hipErrorIllegalAddress";
    case WIA_hipErrorPeerAccessAlreadyEnabled:
      return "hipErrorPeerAccessAlreadyEnabled";
    case WIA_hipErrorNotSupported:
      return "hipErrorNotSupported";
    default:
      return "hipErrorUnknown";
  }
}

FAKE_API Err hipGetDeviceCount(int* count) {
  GATE();
  if (count == nullptr) return WIA_hipErrorInvalidValue;
  const int n = state().fault == "no_device" ? 0 : state().devices;
  *count = n;
  return n == 0 ? WIA_hipErrorNoDevice : WIA_hipSuccess;
}

FAKE_API Err hipGetDevice(int* device) {
  if (device == nullptr) return WIA_hipErrorInvalidValue;
  *device = t_device;
  return WIA_hipSuccess;
}

FAKE_API Err hipSetDevice(int device) {
  GATE();
  if (!valid_device(device)) return WIA_hipErrorInvalidDevice;
  t_device = device;
  return WIA_hipSuccess;
}

FAKE_API Err hipDeviceGetName(char* name, int len, int device) {
  if (name == nullptr || len <= 0) return WIA_hipErrorInvalidValue;
  if (!valid_device(device)) return WIA_hipErrorInvalidDevice;
  std::snprintf(name, static_cast<std::size_t>(len), "Fake HIP Device %d", device);
  return WIA_hipSuccess;
}

FAKE_API Err hipDeviceTotalMem(std::size_t* bytes, int device) {
  if (bytes == nullptr) return WIA_hipErrorInvalidValue;
  if (!valid_device(device)) return WIA_hipErrorInvalidDevice;
  *bytes = kDeviceMemory;
  return WIA_hipSuccess;
}

FAKE_API Err hipDeviceGetPCIBusId(char* bus_id, int len, int device) {
  if (bus_id == nullptr || len <= 0) return WIA_hipErrorInvalidValue;
  if (!valid_device(device)) return WIA_hipErrorInvalidDevice;
  std::snprintf(bus_id, static_cast<std::size_t>(len), "0000:%02X:00.0", 0xC0 + device);
  return WIA_hipSuccess;
}

FAKE_API Err hipDeviceCanAccessPeer(int* can_access, int device, int peer) {
  if (can_access == nullptr) return WIA_hipErrorInvalidValue;
  if (!valid_device(device) || !valid_device(peer)) return WIA_hipErrorInvalidDevice;
  *can_access = device != peer ? 1 : 0;  // as HIP: a device is not its own peer
  return WIA_hipSuccess;
}

FAKE_API Err hipDeviceEnablePeerAccess(int peer, unsigned int flags) {
  GATE();
  if (flags != 0) return WIA_hipErrorInvalidValue;
  if (!valid_device(peer) || peer == t_device) return WIA_hipErrorInvalidDevice;
  State& s = state();
  std::lock_guard<std::mutex> lk(s.mu);
  if (!s.peers.insert({t_device, peer}).second) return WIA_hipErrorPeerAccessAlreadyEnabled;
  return WIA_hipSuccess;
}

FAKE_API Err hipMemGetInfo(std::size_t* free_bytes, std::size_t* total_bytes) {
  GATE();
  if (free_bytes == nullptr || total_bytes == nullptr) return WIA_hipErrorInvalidValue;
  State& s = state();
  std::lock_guard<std::mutex> lk(s.mu);
  *total_bytes = kDeviceMemory;
  *free_bytes = kDeviceMemory - s.used[t_device];
  return WIA_hipSuccess;
}

// ---------------------------------------------------------------------------
// Memory

FAKE_API Err hipMalloc(void** ptr, std::size_t bytes) {
  GATE();
  if (ptr == nullptr) return WIA_hipErrorInvalidValue;
  *ptr = nullptr;
  if (bytes == 0) return WIA_hipSuccess;  // HIP: NULL for 0 bytes
  State& s = state();
  if (s.fault == "oom") return WIA_hipErrorOutOfMemory;
  const std::size_t page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  if (bytes > kDeviceMemory) return WIA_hipErrorOutOfMemory;
  const std::size_t mapped = (bytes + page - 1) / page * page;
  {
    std::lock_guard<std::mutex> lk(s.mu);
    if (s.used[t_device] + mapped > kDeviceMemory) return WIA_hipErrorOutOfMemory;
  }
  const int fd = ::memfd_create("fake-hip", MFD_CLOEXEC);
  if (fd < 0) return WIA_hipErrorOutOfMemory;
  if (::ftruncate(fd, static_cast<off_t>(mapped)) != 0) {
    ::close(fd);
    return WIA_hipErrorOutOfMemory;
  }
  void* p = ::mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    ::close(fd);
    return WIA_hipErrorOutOfMemory;
  }
  struct stat sb {};
  ::fstat(fd, &sb);
  std::lock_guard<std::mutex> lk(s.mu);
  s.allocations[reinterpret_cast<std::uintptr_t>(p)] =
      Allocation{bytes, mapped, fd, t_device, static_cast<std::uint64_t>(sb.st_ino)};
  s.used[t_device] += mapped;
  *ptr = p;
  return WIA_hipSuccess;
}

FAKE_API Err hipFree(void* ptr) {
  GATE();
  if (ptr == nullptr) return WIA_hipSuccess;
  State& s = state();
  Allocation a;
  {
    std::lock_guard<std::mutex> lk(s.mu);
    const auto it = s.allocations.find(reinterpret_cast<std::uintptr_t>(ptr));
    if (it == s.allocations.end() || it->second.fd < 0) return WIA_hipErrorInvalidValue;
    a = it->second;
    s.allocations.erase(it);
    s.used[a.device] -= a.mapped;
  }
  ::munmap(ptr, a.mapped);
  ::close(a.fd);
  return WIA_hipSuccess;
}

FAKE_API Err hipHostMalloc(void** ptr, std::size_t bytes, unsigned int flags) {
  GATE();
  if (ptr == nullptr || (flags & ~0xFu) != 0) return WIA_hipErrorInvalidValue;
  *ptr = nullptr;
  if (bytes == 0) return WIA_hipSuccess;
  const std::size_t rounded = (bytes + 255) / 256 * 256;
  void* p = std::aligned_alloc(256, rounded);
  if (p == nullptr) return WIA_hipErrorOutOfMemory;
  State& s = state();
  std::lock_guard<std::mutex> lk(s.mu);
  s.allocations[reinterpret_cast<std::uintptr_t>(p)] = Allocation{bytes, rounded, -1, t_device, 0};
  *ptr = p;
  return WIA_hipSuccess;
}

FAKE_API Err hipHostFree(void* ptr) {
  GATE();
  if (ptr == nullptr) return WIA_hipSuccess;
  State& s = state();
  {
    std::lock_guard<std::mutex> lk(s.mu);
    const auto it = s.allocations.find(reinterpret_cast<std::uintptr_t>(ptr));
    if (it == s.allocations.end() || it->second.fd >= 0) return WIA_hipErrorInvalidValue;
    s.allocations.erase(it);
  }
  std::free(ptr);
  return WIA_hipSuccess;
}

FAKE_API Err hipMemsetAsync(void* dst, int value, std::size_t bytes, wia_hipStream_t stream) {
  GATE();
  if (bytes == 0) return WIA_hipSuccess;
  if (dst == nullptr || !range_ok(dst, bytes)) return WIA_hipErrorInvalidValue;
  return enqueue(stream, [=] {
    std::memset(dst, value & 0xff, bytes);
    return static_cast<Err>(WIA_hipSuccess);
  });
}

FAKE_API Err hipMemcpyAsync(void* dst, const void* src, std::size_t bytes, int kind,
                            wia_hipStream_t stream) {
  GATE();
  if (kind < 0 || kind > WIA_hipMemcpyDefault) return WIA_hipErrorInvalidValue;
  if (bytes == 0) return WIA_hipSuccess;
  if (dst == nullptr || src == nullptr || !range_ok(dst, bytes) || !range_ok(src, bytes))
    return WIA_hipErrorInvalidValue;
  return enqueue(stream, [=] {
    std::memmove(dst, src, bytes);
    return static_cast<Err>(WIA_hipSuccess);
  });
}

FAKE_API Err hipMemcpyPeerAsync(void* dst, int dst_device, const void* src, int src_device,
                                std::size_t bytes, wia_hipStream_t stream) {
  GATE();
  if (!valid_device(dst_device) || !valid_device(src_device)) return WIA_hipErrorInvalidDevice;
  return hipMemcpyAsync(dst, src, bytes, WIA_hipMemcpyDefault, stream);
}

// ---------------------------------------------------------------------------
// Streams and host functions

FAKE_API Err hipStreamCreateWithFlags(wia_hipStream_t* stream, unsigned int flags) {
  GATE();
  if (stream == nullptr || (flags & ~1u) != 0) return WIA_hipErrorInvalidValue;
  auto* s = new FakeStream;
  s->device = t_device;
  s->worker = std::thread(worker_loop, s);
  State& st = state();
  std::lock_guard<std::mutex> lk(st.mu);
  st.streams.insert(s);
  *stream = reinterpret_cast<wia_hipStream_t>(s);
  return WIA_hipSuccess;
}

FAKE_API Err hipStreamDestroy(wia_hipStream_t stream) {
  GATE();
  auto* s = reinterpret_cast<FakeStream*>(stream);
  {
    State& st = state();
    std::lock_guard<std::mutex> lk(st.mu);
    if (s == nullptr || st.streams.erase(s) == 0) return WIA_hipErrorInvalidHandle;
  }
  {
    std::lock_guard<std::mutex> lk(s->mu);
    s->stop = true;
    s->cv.notify_all();
  }
  s->worker.join();  // queued work still runs first
  delete s;
  return WIA_hipSuccess;
}

FAKE_API Err hipStreamSynchronize(wia_hipStream_t stream) {
  GATE();
  if (stream == nullptr) return WIA_hipSuccess;  // the NULL stream runs inline
  FakeStream* s = live_stream(stream);
  if (s == nullptr) return WIA_hipErrorInvalidHandle;
  std::unique_lock<std::mutex> lk(s->mu);
  s->cv.wait(lk, [&] { return s->queue.empty() && !s->busy; });
  return std::exchange(s->error, WIA_hipSuccess);
}

FAKE_API Err hipStreamQuery(wia_hipStream_t stream) {
  GATE();
  if (stream == nullptr) return WIA_hipSuccess;
  FakeStream* s = live_stream(stream);
  if (s == nullptr) return WIA_hipErrorInvalidHandle;
  std::lock_guard<std::mutex> lk(s->mu);
  if (!s->queue.empty() || s->busy) return WIA_hipErrorNotReady;
  return std::exchange(s->error, WIA_hipSuccess);
}

// Built without it (FAKE_HIP_ROCM52) the double is ROCm 5.2's runtime as
// Debian ships it: declared in the header, not exported.
#ifndef FAKE_HIP_ROCM52
FAKE_API Err hipLaunchHostFunc(wia_hipStream_t stream, wia_hipHostFn_t fn, void* data) {
  GATE();
  if (fn == nullptr) return WIA_hipErrorInvalidValue;
  return enqueue(stream, [=] {
    t_in_host_fn = true;
    fn(data);
    t_in_host_fn = false;
    return static_cast<Err>(WIA_hipSuccess);
  });
}
#endif

// Runs after the work before it, with that work's status, as HIP's.
FAKE_API Err hipStreamAddCallback(wia_hipStream_t stream, wia_hipStreamCallback_t callback,
                                  void* data, unsigned int flags) {
  GATE();
  if (callback == nullptr || flags != 0) return WIA_hipErrorInvalidValue;
  return enqueue(stream, [=] {
    t_in_host_fn = true;
    callback(stream, WIA_hipSuccess, data);
    t_in_host_fn = false;
    return static_cast<Err>(WIA_hipSuccess);
  });
}

// ---------------------------------------------------------------------------
// Events

FAKE_API Err hipEventCreateWithFlags(wia_hipEvent_t* event, unsigned int flags) {
  GATE();
  if (event == nullptr || (flags & ~0x7u) != 0) return WIA_hipErrorInvalidValue;
  auto* e = new FakeEvent;
  e->device = t_device;
  State& st = state();
  std::lock_guard<std::mutex> lk(st.mu);
  st.events.insert(e);
  *event = reinterpret_cast<wia_hipEvent_t>(e);
  return WIA_hipSuccess;
}

FAKE_API Err hipEventDestroy(wia_hipEvent_t event) {
  GATE();
  auto* e = reinterpret_cast<FakeEvent*>(event);
  {
    State& st = state();
    std::lock_guard<std::mutex> lk(st.mu);
    if (e == nullptr || st.events.erase(e) == 0) return WIA_hipErrorInvalidHandle;
  }
  delete e;  // pending records hold their mark, not the event
  return WIA_hipSuccess;
}

FAKE_API Err hipEventRecord(wia_hipEvent_t event, wia_hipStream_t stream) {
  GATE();
  FakeEvent* e = live_event(event);
  if (e == nullptr) return WIA_hipErrorInvalidHandle;
  auto mark = std::make_shared<Mark>();
  {
    std::lock_guard<std::mutex> lk(g_marks_mu);
    e->mark = mark;
  }
  return enqueue(stream, [mark] {
    std::lock_guard<std::mutex> lk(g_marks_mu);
    mark->done = true;
    mark->when = Clock::now();
    g_marks_cv.notify_all();
    return static_cast<Err>(WIA_hipSuccess);
  });
}

FAKE_API Err hipEventQuery(wia_hipEvent_t event) {
  GATE();
  FakeEvent* e = live_event(event);
  if (e == nullptr) return WIA_hipErrorInvalidHandle;
  std::lock_guard<std::mutex> lk(g_marks_mu);
  return e->mark == nullptr || e->mark->done ? WIA_hipSuccess : WIA_hipErrorNotReady;
}

FAKE_API Err hipEventSynchronize(wia_hipEvent_t event) {
  GATE();
  FakeEvent* e = live_event(event);
  if (e == nullptr) return WIA_hipErrorInvalidHandle;
  std::shared_ptr<Mark> mark;
  {
    std::lock_guard<std::mutex> lk(g_marks_mu);
    mark = e->mark;
  }
  return mark == nullptr ? WIA_hipSuccess : wait_mark(mark);
}

FAKE_API Err hipStreamWaitEvent(wia_hipStream_t stream, wia_hipEvent_t event, unsigned int flags) {
  GATE();
  if (flags != 0) return WIA_hipErrorInvalidValue;
  FakeEvent* e = live_event(event);
  if (e == nullptr) return WIA_hipErrorInvalidHandle;
  std::shared_ptr<Mark> mark;
  {
    std::lock_guard<std::mutex> lk(g_marks_mu);
    mark = e->mark;  // the record issued before this call, as HIP
  }
  if (mark == nullptr) return WIA_hipSuccess;
  return enqueue(stream, [mark] { return wait_mark(mark); });
}

FAKE_API Err hipEventElapsedTime(float* ms, wia_hipEvent_t start, wia_hipEvent_t end) {
  GATE();
  if (ms == nullptr) return WIA_hipErrorInvalidValue;
  FakeEvent* a = live_event(start);
  FakeEvent* b = live_event(end);
  if (a == nullptr || b == nullptr) return WIA_hipErrorInvalidHandle;
  std::lock_guard<std::mutex> lk(g_marks_mu);
  if (a->mark == nullptr || b->mark == nullptr) return WIA_hipErrorInvalidHandle;
  if (!a->mark->done || !b->mark->done) return WIA_hipErrorNotReady;
  *ms = std::chrono::duration<float, std::milli>(b->mark->when - a->mark->when).count();
  return WIA_hipSuccess;
}

// ---------------------------------------------------------------------------
// IPC: the handle names the exporter's memfd as /proc/<pid>/fd/<n>; the
// importer reopens that path (same user) and maps it shared.

namespace {
constexpr char kIpcMagic[8] = {'F', 'A', 'K', 'E', 'H', 'I', 'P', 'I'};
struct IpcPayload {
  char magic[8];
  std::int32_t pid;
  std::int32_t fd;
  std::uint64_t size;
  std::uint64_t mapped;
  std::uint64_t inode;
  std::int32_t device;
  std::uint8_t unused[20];
};
static_assert(sizeof(IpcPayload) == WIA_HIP_IPC_HANDLE_SIZE, "fills the handle exactly");
}  // namespace

FAKE_API Err hipIpcGetMemHandle(wia_hipIpcMemHandle_t* handle, void* ptr) {
  GATE();
  if (handle == nullptr || ptr == nullptr) return WIA_hipErrorInvalidValue;
  State& s = state();
  std::lock_guard<std::mutex> lk(s.mu);
  const auto it = s.allocations.find(reinterpret_cast<std::uintptr_t>(ptr));
  if (it == s.allocations.end() || it->second.fd < 0) return WIA_hipErrorInvalidValue;
  IpcPayload p{};
  std::memcpy(p.magic, kIpcMagic, sizeof(kIpcMagic));
  p.pid = static_cast<std::int32_t>(::getpid());
  p.fd = it->second.fd;
  p.size = it->second.size;
  p.mapped = it->second.mapped;
  p.inode = it->second.inode;
  p.device = it->second.device;
  std::memcpy(handle->reserved, &p, sizeof(p));
  return WIA_hipSuccess;
}

FAKE_API Err hipIpcOpenMemHandle(void** ptr, wia_hipIpcMemHandle_t handle, unsigned int flags) {
  GATE();
  // As the runtime it stands in for (5.2, hipRuntimeGetVersion): ROCm 5
  // takes only its own value of the lazy-peer-access flag.
  if (ptr == nullptr || flags != WIA_hipIpcMemLazyEnablePeerAccess_ROCM5)
    return WIA_hipErrorInvalidValue;
  IpcPayload p;
  std::memcpy(&p, handle.reserved, sizeof(p));
  if (std::memcmp(p.magic, kIpcMagic, sizeof(kIpcMagic)) != 0) return WIA_hipErrorInvalidValue;
  if (p.pid == static_cast<std::int32_t>(::getpid())) return WIA_hipErrorInvalidContext;
  const std::string key =
      std::to_string(p.pid) + ":" + std::to_string(p.fd) + ":" + std::to_string(p.inode);
  State& s = state();
  std::lock_guard<std::mutex> lk(s.mu);
  for (auto& [base, im] : s.imports)
    if (im.key == key) {
      ++im.opens;
      *ptr = reinterpret_cast<void*>(base);
      return WIA_hipSuccess;
    }
  const std::string path = "/proc/" + std::to_string(p.pid) + "/fd/" + std::to_string(p.fd);
  const int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) return WIA_hipErrorInvalidHandle;
  struct stat sb {};
  if (::fstat(fd, &sb) != 0 || static_cast<std::uint64_t>(sb.st_ino) != p.inode) {
    ::close(fd);
    return WIA_hipErrorInvalidHandle;
  }
  void* m = ::mmap(nullptr, p.mapped, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ::close(fd);
  if (m == MAP_FAILED) return WIA_hipErrorOutOfMemory;
  s.imports[reinterpret_cast<std::uintptr_t>(m)] = Import{p.mapped, 1, key};
  *ptr = m;
  return WIA_hipSuccess;
}

FAKE_API Err hipIpcCloseMemHandle(void* ptr) {
  GATE();
  State& s = state();
  std::lock_guard<std::mutex> lk(s.mu);
  const auto it = s.imports.find(reinterpret_cast<std::uintptr_t>(ptr));
  if (it == s.imports.end()) return WIA_hipErrorInvalidValue;
  if (--it->second.opens == 0) {
    ::munmap(ptr, it->second.mapped);
    s.imports.erase(it);
  }
  return WIA_hipSuccess;
}

// dma-buf export (newer runtimes than 5.2; not in the rocm52 variant): a
// new descriptor of the allocation's memfd. Like the real call the range
// must be page-aligned; unlike it, only a whole allocation from its start
// exports (a memfd cannot stand for part of itself), so a provider that
// exports an interior range fails here.
#ifndef FAKE_HIP_ROCM52
FAKE_API Err hipMemGetHandleForAddressRange(void* handle, void* dptr, std::size_t size,
                                            int handle_type, unsigned long long flags) {
  GATE();
  if (handle == nullptr || dptr == nullptr || size == 0 || flags != 0 ||
      handle_type != WIA_hipMemRangeHandleTypeDmaBufFd)
    return WIA_hipErrorInvalidValue;
  const auto page = static_cast<std::uintptr_t>(::sysconf(_SC_PAGESIZE));
  const auto start = reinterpret_cast<std::uintptr_t>(dptr);
  if (start % page != 0 || size % page != 0) return WIA_hipErrorInvalidValue;
  State& s = state();
  std::lock_guard<std::mutex> lk(s.mu);
  const auto it = s.allocations.find(start);
  if (it == s.allocations.end() || it->second.fd < 0 || size > it->second.mapped)
    return WIA_hipErrorInvalidValue;
  const int fd = ::fcntl(it->second.fd, F_DUPFD_CLOEXEC, 0);
  if (fd < 0) return WIA_hipErrorOutOfMemory;
  std::memcpy(handle, &fd, sizeof(fd));
  return WIA_hipSuccess;
}
static_assert(std::is_same_v<decltype(&::hipMemGetHandleForAddressRange),
                             wia_PFN_hipMemGetHandleForAddressRange>);
#endif

// Every entry the provider resolves exists here with exactly its type.
#define WIA_FAKE_HIP_CHECK(ret, name, params) \
  static_assert(std::is_same_v<decltype(&::name), wia_PFN_##name>, #name " differs");
WIA_HIP_RUNTIME_ENTRIES(WIA_FAKE_HIP_CHECK)
#undef WIA_FAKE_HIP_CHECK
