// SPDX-License-Identifier: Apache-2.0
// Internal types of the `host` provider: CPU memory presented as N virtual
// devices, one worker thread per stream. Nothing here crosses the ABI; the
// entry points in host_provider.cpp, host_memory.cpp, host_ipc.cpp and
// host_stream.cpp translate.
#pragma once

#include <wia/provider.h>

#include <atomic>
#include <condition_variable>
#include <cstdarg>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <new>
#include <shared_mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "wia_common/entry_guard.hpp"

namespace wia::host {

class Provider;
class Stream;

// --------------------------------------------------------------------------
// Memory

enum class Backing : std::uint8_t {
  kMalloc,  // posix_memalign: small pinned-host allocations
  kAnon,    // private anonymous mmap: large pinned-host allocations, and
            // device memory when memfd_create is unavailable
  kArena,   // MAP_SHARED window of the device's memfd arena (exportable)
};

struct Allocation {
  void* base = nullptr;
  std::uint64_t size = 0;     // bytes the caller asked for (accounted)
  std::uint64_t map_len = 0;  // bytes mapped (page multiple; 0 for kMalloc)
  std::uint64_t offset = 0;   // offset in the arena (kArena)
  std::uint32_t kind = WIA_MEM_DEVICE;
  Backing backing = Backing::kMalloc;
};

struct Device {
  std::int32_t index = 0;
  std::int32_t numa_node = -1;  // -1: unknown (no /sys/devices/system/node)
  std::string name;

  std::mutex mu;  // guards everything below
  std::unordered_map<const void*, Allocation> allocs;
  std::unordered_map<const void*, std::uint64_t> imports;  // ipc_open_handle: ptr -> map_len
  std::uint64_t used = 0;  // WIA_MEM_DEVICE bytes, against memory_limit
  // Device memory is carved out of one memfd per device ("arena") so that
  // any allocation can be exported to another process by fd (IPC). The
  // file is sparse: offsets only grow, and freed ranges are returned to
  // the kernel with FALLOC_FL_PUNCH_HOLE, so one descriptor serves every
  // allocation (no per-allocation fd limit).
  int arena_fd = -1;
  bool arena_failed = false;  // memfd_create refused: anonymous memory, no IPC
  std::uint64_t arena_end = 0;
};

// --------------------------------------------------------------------------
// Streams and events

// What an event_record captured: "stream `stream` has finished op `seq`".
// Shared by the event, the record marker in the queue and any
// stream_wait_event ops, so it outlives re-recording and destruction of
// either handle.
struct Capture {
  std::shared_ptr<Stream> stream;
  std::uint64_t seq = 0;
  std::atomic<std::uint64_t> timestamp_ns{0};  // set when the worker reaches the marker
};

enum class OpKind : std::uint8_t { kMemset, kMemcpy, kReduce, kHostFn, kRecord, kWait };

// One unit of stream work. Move-only; the common kinds allocate nothing.
struct Op {
  OpKind kind = OpKind::kMemset;
  std::uint64_t seq = 0;
  void* dst = nullptr;
  const void* src = nullptr;
  std::uint64_t size = 0;
  int value = 0;
  wia_host_fn_t fn = nullptr;
  void* user_data = nullptr;
  std::shared_ptr<Capture> capture;  // kRecord, kWait
  // kReduce: the args with srcs pointing at `srcs` (copied at enqueue time,
  // since the caller's array is only valid during the call).
  wia_reduce_args_v1_t reduce{};
  std::unique_ptr<const void*[]> srcs;
};

class Stream : public std::enable_shared_from_this<Stream> {
 public:
  Stream(Provider* provider, std::int32_t device)
      : provider_(provider), device_(device), head_(new Node), tail_(head_) {}
  ~Stream();
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;

  // Starts the worker thread. Throws std::system_error when it cannot.
  void start();
  // Drains the queue and joins the worker. Idempotent.
  void stop_and_join() noexcept;

  // Appends an op; returns its sequence number.
  std::uint64_t enqueue(Op op);
  // Sequence number of the last op enqueued / finished.
  std::uint64_t submitted() const noexcept { return submitted_.load(std::memory_order_acquire); }
  std::uint64_t completed() const noexcept { return completed_.load(std::memory_order_acquire); }
  // Blocks (after a bounded spin) until op `seq` has finished. `counted`:
  // the caller is a stream worker holding an active slot.
  void wait_for(std::uint64_t seq, bool counted) noexcept;

  // The first async error not reported yet (status 0 when none). take_
  // clears it (stream_synchronize); peek_ leaves it for the stream
  // (event_synchronize reports errors of work its capture covers).
  bool take_error(std::uint64_t up_to_seq, bool clear, wia_status_t* status, std::string* message);

  std::int32_t device() const noexcept { return device_; }

 private:
  // The queue is Dmitry Vyukov's intrusive MPSC list: producers link a
  // node with one atomic exchange and the worker pops without any lock.
  // A mutex shared by producer and worker would put a futex sleep (about
  // 50 us on our VMs) on the hot path whenever the two collide.
  struct Node {
    std::atomic<Node*> next{nullptr};
    Op op;
  };
  bool try_pop(Op* op) noexcept;
  // Consumed nodes go back to the producers through a free list instead of
  // delete: freeing on the worker what the caller's thread allocated makes
  // the two threads fight over malloc's arena lock on every op.
  Node* take_node();               // producers, under enqueue_mu_
  void recycle(Node* n) noexcept;  // worker
  static constexpr int kMaxFreeNodes = 1024;
  bool has_work() const noexcept { return tail_->next.load(std::memory_order_seq_cst) != nullptr; }
  void run() noexcept;
  void execute(Op& op) noexcept;
  void record_error(std::uint64_t seq, wia_status_t status, std::string message) noexcept;
  void complete(std::uint64_t seq) noexcept;

  Provider* const provider_;
  const std::int32_t device_;

  // Producers: serialised by the core per handle; the mutex only keeps
  // sequence numbers in queue order if a caller breaks that rule. The
  // worker never takes it.
  std::mutex enqueue_mu_;
  Node* head_;                        // last node linked (producers)
  Node* tail_;                        // stub before the next op to run (worker only)
  Node* spare_ = nullptr;             // producers' private free nodes
  std::atomic<Node*> free_{nullptr};  // worker pushes, producers take all
  std::atomic<int> free_count_{0};    // approximate length of both lists
  std::atomic<std::uint64_t> submitted_{0};
  std::atomic<std::uint64_t> completed_{0};

  // Slow paths only: the worker sleeping for work, waiters sleeping for
  // completion.
  std::mutex sleep_mu_;
  std::condition_variable work_cv_;
  std::atomic<bool> sleeping_{false};
  std::atomic<bool> stop_{false};
  std::mutex done_mu_;
  std::condition_variable done_cv_;
  std::atomic<int> waiters_{0};
  // The smallest operation a sleeping waiter waits for: the worker wakes
  // waiters when that one completes, not after every operation (a thread
  // that posted 100 collectives and synchronizes was woken 100 times,
  // each a context switch on the worker's core).
  std::atomic<std::uint64_t> wake_at_{~std::uint64_t{0}};
  std::thread worker_;

  std::mutex err_mu_;
  wia_status_t err_status_ = WIA_SUCCESS;
  std::uint64_t err_seq_ = 0;
  std::string err_message_;
};

struct Event {
  std::int32_t device = 0;
  std::mutex mu;
  std::shared_ptr<Capture> capture;  // NULL until recorded
};

// --------------------------------------------------------------------------
// The provider context returned by init().

class Provider {
 public:
  static constexpr std::uint64_t kMagic = 0x574941484f535431ull;  // "WIAHOST1"
  std::uint64_t magic = kMagic;

  const wia_host_services_v1_t* host = nullptr;
  std::vector<std::unique_ptr<Device>> devices;
  std::uint64_t memory_limit = 0;  // per device, 0 = none
  bool peer_access = true;
  bool host_accessible = true;  // WIA_DEVICE_FLAG_HOST_ACCESSIBLE (host.host_accessible)
  // host.ipc_open: how ipc_open_handle reaches the exporter's memory.
  enum class IpcOpen { kAuto, kPidfd, kProc } ipc_open = IpcOpen::kAuto;
  int numa_nodes = 0;                 // NUMA nodes found in /sys, 0 = no NUMA info
  std::uint64_t physical_memory = 0;  // RAM + swap, the OS bound for one allocation

  // Live stream and event handles. Lookups take the lock shared, so
  // validating a handle never serialises two streams' enqueues.
  std::shared_mutex handles_mu;
  std::unordered_map<const void*, std::shared_ptr<Stream>> streams;
  // Bumped (under handles_mu) whenever `streams` changes: find_stream
  // remembers each thread's last answer until then.
  std::atomic<std::uint64_t> streams_generation{1};
  std::unordered_map<const void*, std::unique_ptr<Event>> events;

  // Sets the host error message for the calling thread and returns st.
  wia_status_t fail(wia_status_t st, const char* fmt, ...) const noexcept
      __attribute__((format(printf, 3, 4)));
  void log(wia_log_level_t level, const char* fmt, ...) const noexcept
      __attribute__((format(printf, 3, 4)));
  std::uint64_t now_ns() const noexcept;

  // NULL (and a message naming `call`) when the handle is not live.
  Stream* find_stream(wia_provider_stream_t h, const char* call) noexcept;
  Event* find_event(wia_provider_event_t h, const char* call) noexcept;
  bool valid_device(std::int32_t dev) const noexcept {
    return dev >= 0 && static_cast<std::size_t>(dev) < devices.size();
  }
};

// Runs one entry point: validates ctx, and turns any exception into a
// status with a message, so nothing unwinds across the C boundary (the
// accelerator providers' guard, wia_common/entry_guard.hpp).
template <class F>
wia_status_t guarded(void* ctx, const char* call, F&& body) noexcept {
  return common::guarded_entry<Provider>(
      ctx, call, [](Provider&) { return common::NoKeeper{}; }, std::forward<F>(body));
}

// Stream and event entry points (host_stream.cpp), for the ops table.
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
wia_status_t reduce_async(void* ctx, wia_provider_stream_t stream,
                          const wia_reduce_args_v1_t* args) noexcept;

// Stops every stream still alive (fini).
void destroy_all_streams(Provider& p) noexcept;

// --------------------------------------------------------------------------
// Host memory (host_memory.cpp)

// The alignment every allocation guarantees (both memory kinds).
constexpr std::uint32_t kAlignment = 64;

std::uint64_t page_size();
// Returns one allocation's memory to the OS (device mutex held).
void release(const Device& d, const Allocation& a) noexcept;
// Explains why `ptr` is not a live allocation of device `dev` (mem_free,
// ipc_get_handle). Locks one device at a time, never two.
wia_status_t explain_unknown_pointer(Provider& p, const char* call, std::int32_t dev,
                                     const void* ptr);

wia_status_t mem_alloc(void* ctx, std::int32_t dev, std::uint64_t size, std::uint32_t kind,
                       void** ptr) noexcept;
wia_status_t mem_free(void* ctx, std::int32_t dev, void* ptr) noexcept;
wia_status_t memset_sync(void* ctx, std::int32_t dev, void* ptr, std::int32_t value,
                         std::uint64_t size) noexcept;
wia_status_t memcpy_sync(void* ctx, std::int32_t dev, void* dst, const void* src,
                         std::uint64_t size) noexcept;

// --------------------------------------------------------------------------
// IPC (host_ipc.cpp)

wia_status_t ipc_get_handle(void* ctx, std::int32_t dev, void* ptr,
                            wia_ipc_handle_t* handle) noexcept;
wia_status_t ipc_open_handle(void* ctx, std::int32_t dev, const wia_ipc_handle_t* handle,
                             void** ptr) noexcept;
wia_status_t ipc_close_handle(void* ctx, std::int32_t dev, void* ptr) noexcept;

}  // namespace wia::host
