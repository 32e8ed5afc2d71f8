// SPDX-License-Identifier: Apache-2.0
// The state of the CUDA driver test double (libcuda.so.1 built from this
// folder): devices, primary contexts, the allocation registry, streams and
// events, and the injected faults. Every entry of WIA_CUDA_DRIVER_ENTRIES
// is implemented in one of the fake_*.cpp files as `fake_<name>` with the
// exact wia_PFN_<name> type; fake_entry.cpp hands them out through
// cuGetProcAddress_v2 behind one gate (initialisation, device loss, calls
// from host functions). README.md says what this double proves.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "cuda_driver_api.h"

namespace wia::fake_cuda {

using CUresult = wia_CUresult;

// Not in the provider's header, but what the real driver returns in the
// situations the double reproduces.
constexpr CUresult kErrorHostMemoryNotRegistered = 713;
constexpr CUresult kErrorNotPermitted = 800;
constexpr CUresult kErrorPeerAccessNotEnabled = 705;

constexpr std::uint64_t kDeviceMemory = 16ull << 30;  // per device
constexpr int kDriverVersion = 12040;

// WIA_FAKE_CUDA_FAULT (comma-separated) and WIA_FAKE_CUDA_FAULT_AFTER, read
// once per process at the first cuInit.
struct Faults {
  bool no_device = false;     // cuInit -> CUDA_ERROR_NO_DEVICE
  bool oom = false;           // cuMemAlloc -> CUDA_ERROR_OUT_OF_MEMORY
  bool stream_error = false;  // the first kernel launch fails on its stream
  bool device_lost = false;   // after `lost_after` calls: sticky ILLEGAL_ADDRESS
  bool no_dmabuf = false;     // CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED reads 0
  long lost_after = 0;
  int lost_device = -1;  // >= 0: only that device's context is lost (WIA_FAKE_CUDA_LOST_DEVICE)
};

class Stream;

// A device's primary context. Its address is the CUcontext handle, stable
// for the life of the process like the real driver's; it is usable only
// while retained (refcount > 0).
struct Context {
  int device = 0;
  int refcount = 0;
  std::set<int> peers;                     // devices whose memory kernels of this context may touch
  std::shared_ptr<Stream> default_stream;  // the NULL stream, made on first use
};

enum class MemKind { kDevice, kHostAlloc, kHostRegistered, kIpcMapped };

// One range of memory the driver knows. Device memory is host memory from
// a memfd (so that another process can map it for IPC); the registry is
// what lets pointer queries, bad frees and kernel address checks work.
struct Allocation {
  std::uintptr_t base = 0;
  std::size_t size = 0;    // what the caller asked for
  std::size_t mapped = 0;  // what is mmap'ed (page multiple); 0 for registered ranges
  MemKind kind = MemKind::kDevice;
  int device = -1;          // -1 for portable host memory
  int memfd = -1;           // kDevice only
  std::uint64_t inode = 0;  // kDevice and kIpcMapped: identifies the memfd across processes
  int ipc_opens = 0;        // kIpcMapped: cuIpcOpenMemHandle count in this process
};

// One queued piece of stream work. A non-success result becomes the
// stream's pending error, reported by its next synchronize or query.
using Task = std::function<CUresult()>;

// A stream: one worker thread running its tasks in FIFO order.
class Stream {
 public:
  explicit Stream(Context* ctx);
  ~Stream();  // runs what is queued, then joins the worker
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;

  Context* context() const { return ctx_; }
  void enqueue(Task task);
  // Waits for the queue to drain; returns the pending error and clears it.
  CUresult synchronize();
  // CUDA_ERROR_NOT_READY while work is queued; else as synchronize.
  CUresult query();
  // Waits for the queue to drain and leaves any pending error in place
  // (the implicit synchronisation of cuMemFree).
  void wait_idle();
  bool finished() const;  // the worker has exited (after stop)
  void stop();            // no more tasks; the worker exits when drained

 private:
  void run();

  Context* ctx_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Task> queue_;
  bool busy_ = false;
  bool stopping_ = false;
  bool exited_ = false;
  CUresult pending_error_ = WIA_CUDA_SUCCESS;
  std::thread worker_;
};

struct Event {
  Context* ctx = nullptr;
  unsigned flags = 0;
  std::uint64_t recorded = 0;   // records issued (cuEventRecord calls)
  std::uint64_t completed = 0;  // records that ran on their stream
  double ms = 0;                // steady clock at the last completed record
};

// kTestAddU32 stands for a caller's own kernel (wia_launch_kernel tests):
// "wia_test_add_u32"(uint32_t* data, uint64_t count, uint32_t value) adds
// value to data[0 .. count); its arguments come as CUDA passes a caller's,
// one kernelParams pointer each.
enum class KernelKind { kReduce, kScale, kTestAddU32 };

struct Function {
  struct Module* module = nullptr;
  std::string name;
  KernelKind kind = KernelKind::kReduce;
  int dtype = 0;  // wia_datatype_t
  int op = 0;     // wia_reduce_op_t (reduce only)
};

struct Module {
  Context* ctx = nullptr;
  const void* image = nullptr;  // recorded, never parsed
  std::map<std::string, std::unique_ptr<Function>> functions;
};

// Everything, under one lock (`mu`) except the streams' queues and event
// completion (`event_mu`/`event_cv`), which the workers touch.
// Runs host functions (cuLaunchHostFunc) one at a time on ONE thread of
// the process, as the CUDA driver does: a host function that blocks holds
// up every other stream's host functions. A double that gave each stream
// its own callback thread hid a deadlock that real CUDA showed (a host
// function waiting for another one queued behind it).
class HostFunctionThread {
 public:
  HostFunctionThread();
  ~HostFunctionThread();  // runs what is queued, then joins
  // Runs fn on the host-function thread; returns when it has run.
  void run(const std::function<void()>& fn);

 private:
  void loop();
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  bool stopping_ = false;
  std::thread thread_;
};

struct Driver {
  std::mutex mu;
  bool initialized = false;
  Faults faults;
  int device_count = 0;
  std::vector<std::unique_ptr<Context>> contexts;
  std::map<std::uintptr_t, Allocation> allocations;  // by base address
  std::map<Stream*, std::shared_ptr<Stream>> streams;
  std::vector<std::shared_ptr<Stream>> retired_streams;  // destroyed, worker still draining
  std::map<Event*, std::unique_ptr<Event>> events;
  std::vector<std::unique_ptr<Event>> retired_events;  // destroyed; queued records may still run
  std::map<Module*, std::unique_ptr<Module>> modules;

  std::mutex event_mu;
  std::condition_variable event_cv;
  // Last member: destroyed (joined) after ~Driver has joined the streams
  // whose host functions it runs.
  HostFunctionThread host_functions;

  Driver();   // reads the WIA_FAKE_CUDA_* variables
  ~Driver();  // joins every worker, unmaps and closes everything
};

Driver& driver();

// The calling thread's current context if it is retained, else nullptr.
Context* current_context();
void set_current_context(Context* ctx);
// True inside a host function run by a stream (CUDA calls are refused there).
bool in_host_function();
void set_in_host_function(bool value);

// The stream a call with `s` runs on: NULL is the current context's
// default stream. nullptr when `s` is not a live stream or there is no
// context. Takes driver().mu.
Stream* resolve_stream(wia_CUstream s, CUresult* error);

// Registry look-ups; the caller holds driver().mu.
const Allocation* find_allocation(std::uintptr_t p);
// Whether [p, p + n) lies inside one known range (any kind).
bool range_known(std::uintptr_t p, std::size_t n);
// Whether a kernel running on `ctx`'s device may touch [p, p + n): device
// memory of its own device, of a peer it enabled, memory it opened through
// IPC, or pinned host memory.
bool kernel_may_access(const Context& ctx, std::uintptr_t p, std::size_t n);
// Checks a copy/memset operand: a range that starts inside a known range
// must end inside it (else INVALID_VALUE); unknown memory is host memory.
CUresult check_copy_range(std::uintptr_t p, std::size_t n);

// Unmaps and closes what `a` holds (not its registry entry).
void release_allocation(Allocation& a);

// Waits for every stream of `device` (all devices when -1) to drain,
// without consuming their errors: cuMemFree's implicit synchronisation.
void wait_device_idle(int device);
// Frees every resource of a context whose last reference went away.
void destroy_context_resources(Context& ctx);

// Prints a diagnostic on stderr (prefixed "fake-cuda: ") so a failing
// provider test says which call the double rejected and why.
void diagnose(const std::string& message);

}  // namespace wia::fake_cuda

// The fake's entries, one per WIA_CUDA_DRIVER_ENTRIES line, each of type
// wia_PFN_<name> (checked where fake_entry.cpp builds the table).
#define WIA_FAKE_CUDA_DECLARE(name, params) wia_CUresult fake_##name params;
WIA_CUDA_DRIVER_ENTRIES(WIA_FAKE_CUDA_DECLARE)
#undef WIA_FAKE_CUDA_DECLARE
