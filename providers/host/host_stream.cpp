// SPDX-License-Identifier: Apache-2.0
// Streams and events of the host provider.
//
// A stream is one worker thread draining an ordered queue. All work of a
// stream, however large, runs on that thread: no hidden pool, so the
// caller's choice of streams is exactly the parallelism it gets, as on a
// GPU. Completion is tracked with sequence numbers: op k of a stream is
// done when completed() >= k. An event captures (stream, seq) when
// recorded, which is all query/synchronize/wait need, and a marker op
// stamps the time when the worker reaches it.
#include <pthread.h>
#include <signal.h>

#include <cinttypes>
#include <cstring>
#include <limits>
#include <system_error>
#include <utility>

#include "host_provider.hpp"
#include "kernels/cpu_reduce.hpp"
#include "spin_wait.hpp"

namespace wia::host {
namespace {

// The stream whose worker runs on this thread (NULL elsewhere): lets the
// blocking entries refuse a call from a host function that would wait for
// itself, instead of deadlocking.
thread_local const Stream* tls_worker_stream = nullptr;

}  // namespace

// ----------------------------------------------------------------------------
// Stream

Stream::~Stream() {
  stop_and_join();
  // Drained by the worker; only the stub is left (or, if the worker never
  // started, whatever was queued).
  for (Node* list : {tail_, spare_, free_.load(std::memory_order_acquire)}) {
    while (list != nullptr) {
      Node* next = list->next.load(std::memory_order_relaxed);
      delete list;
      list = next;
    }
  }
}

Stream::Node* Stream::take_node() {
  if (spare_ == nullptr) spare_ = free_.exchange(nullptr, std::memory_order_acquire);
  if (spare_ == nullptr) return new Node;
  Node* n = spare_;
  spare_ = n->next.load(std::memory_order_relaxed);
  n->next.store(nullptr, std::memory_order_relaxed);
  free_count_.fetch_sub(1, std::memory_order_relaxed);
  return n;
}

void Stream::recycle(Node* n) noexcept {
  if (free_count_.load(std::memory_order_relaxed) >= kMaxFreeNodes) {
    delete n;  // a burst left plenty cached: keep memory bounded
    return;
  }
  free_count_.fetch_add(1, std::memory_order_relaxed);
  // Single pusher (this worker) and a consumer that only takes the whole
  // list: no ABA.
  Node* top = free_.load(std::memory_order_relaxed);
  do {
    n->next.store(top, std::memory_order_relaxed);
  } while (
      !free_.compare_exchange_weak(top, n, std::memory_order_release, std::memory_order_relaxed));
}

void Stream::start() {
  // The worker inherits the creating thread's signal mask. Block every
  // asynchronous signal while creating it, so SIGINT, SIGTERM, SIGCHLD ...
  // keep going to the application's threads (faults are still delivered
  // to the thread that faults).
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  try {
    worker_ = std::thread([this] { run(); });
  } catch (...) {
    pthread_sigmask(SIG_SETMASK, &old, nullptr);
    throw;
  }
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
  char name[16];
  std::snprintf(name, sizeof(name), "wia-host-d%d", device_);
  pthread_setname_np(worker_.native_handle(), name);  // best effort: a debugging aid
}

void Stream::stop_and_join() noexcept {
  stop_.store(true, std::memory_order_seq_cst);
  { std::lock_guard<std::mutex> lk(sleep_mu_); }  // a sleeping worker is inside wait()
  work_cv_.notify_one();
  if (worker_.joinable() && worker_.get_id() != std::this_thread::get_id()) worker_.join();
}

std::uint64_t Stream::enqueue(Op op) {
  std::uint64_t seq;
  {
    std::lock_guard<std::mutex> lk(enqueue_mu_);
    Node* node = take_node();  // may throw bad_alloc: nothing changed yet
    seq = submitted_.load(std::memory_order_relaxed) + 1;
    op.seq = seq;
    if (op.kind == OpKind::kRecord) op.capture->seq = seq;
    node->op = std::move(op);
    submitted_.store(seq, std::memory_order_release);
    Node* prev = head_;
    head_ = node;
    // seq_cst pairs with the worker's seq_cst store of sleeping_ and load
    // of next: either it sees this node, or we see it asleep and wake it.
    prev->next.store(node, std::memory_order_seq_cst);
  }
  // Only a worker that went to sleep needs the (expensive) futex wake; a
  // spinning one sees the node appear.
  if (sleeping_.load(std::memory_order_seq_cst)) {
    { std::lock_guard<std::mutex> lk(sleep_mu_); }
    work_cv_.notify_one();
  }
  return seq;
}

bool Stream::try_pop(Op* op) noexcept {
  Node* next = tail_->next.load(std::memory_order_acquire);
  if (next == nullptr) return false;
  recycle(tail_);  // the previous stub; `next` becomes the new one
  tail_ = next;
  *op = std::move(next->op);
  return true;
}

void Stream::run() noexcept {
  tls_worker_stream = this;
  std::atomic<int>& active = active_threads();
  active.fetch_add(1, std::memory_order_relaxed);
  for (;;) {
    Op op;
    if (!try_pop(&op)) {
      spin_until([&] { return has_work() || stop_.load(std::memory_order_relaxed); }, kWorkerSpinNs,
                 /*counted=*/true);
      if (!try_pop(&op)) {
        std::unique_lock<std::mutex> lk(sleep_mu_);
        sleeping_.store(true, std::memory_order_seq_cst);
        while (!has_work() && !stop_.load(std::memory_order_seq_cst)) {
          active.fetch_sub(1, std::memory_order_relaxed);
          work_cv_.wait(lk);
          active.fetch_add(1, std::memory_order_relaxed);
        }
        sleeping_.store(false, std::memory_order_relaxed);
        lk.unlock();
        // Work first: stopping drains the queue.
        if (!try_pop(&op)) {
          active.fetch_sub(1, std::memory_order_relaxed);
          return;  // stop_ and nothing queued
        }
      }
    }
    execute(op);
    complete(op.seq);
  }
}

void Stream::execute(Op& op) noexcept {
  switch (op.kind) {
    case OpKind::kMemset:
      std::memset(op.dst, op.value, op.size);
      break;
    case OpKind::kMemcpy:
      // memmove: an overlapping copy is the caller's bug, but must not be
      // undefined behaviour here.
      std::memmove(op.dst, op.src, op.size);
      break;
    case OpKind::kReduce: {
      const wia_status_t st = kernels::reduce(op.reduce);
      if (st != WIA_SUCCESS) {
        // Arguments were validated at enqueue time, so this is a bug.
        record_error(op.seq, st,
                     std::string("reduce_async on host device ") + std::to_string(device_) +
                         ": kernel rejected validated arguments");
      }
      break;
    }
    case OpKind::kHostFn:
      try {
        op.fn(op.user_data);
      } catch (...) {
        // A C++ host function that throws must not take the worker (and
        // the process) down with it.
        record_error(op.seq, WIA_ERROR_INTERNAL,
                     std::string("host function on host device ") + std::to_string(device_) +
                         " threw an exception");
      }
      break;
    case OpKind::kRecord:
      op.capture->timestamp_ns.store(provider_->now_ns(), std::memory_order_relaxed);
      break;
    case OpKind::kWait:
      op.capture->stream->wait_for(op.capture->seq, /*counted=*/true);
      break;
  }
}

void Stream::complete(std::uint64_t seq) noexcept {
  // seq_cst store and load pair with the waiter's seq_cst increment and
  // load in wait_for: either we see the waiter and wake it, or it sees seq.
  completed_.store(seq, std::memory_order_seq_cst);
  if (waiters_.load(std::memory_order_seq_cst) > 0 &&
      seq >= wake_at_.load(std::memory_order_seq_cst)) {
    // Taking the mutex guarantees a waiter that registered is inside
    // wait(). The woken ones that still wait register their target again.
    {
      std::lock_guard<std::mutex> lk(done_mu_);
      wake_at_.store(~std::uint64_t{0}, std::memory_order_seq_cst);
    }
    done_cv_.notify_all();
  }
}

void Stream::wait_for(std::uint64_t seq, bool counted) noexcept {
  auto done = [&] { return completed_.load(std::memory_order_acquire) >= seq; };
  if (spin_until(done, kWaitSpinNs, counted)) return;
  std::atomic<int>& active = active_threads();
  std::unique_lock<std::mutex> lk(done_mu_);
  waiters_.fetch_add(1, std::memory_order_seq_cst);
  if (counted) active.fetch_sub(1, std::memory_order_relaxed);
  while (completed_.load(std::memory_order_seq_cst) < seq) {
    // Published before the check below (seq_cst on both sides, as in
    // complete()): either the worker sees our target, or we see seq done.
    if (seq < wake_at_.load(std::memory_order_relaxed))
      wake_at_.store(seq, std::memory_order_seq_cst);
    if (completed_.load(std::memory_order_seq_cst) >= seq) break;
    done_cv_.wait(lk);
  }
  if (counted) active.fetch_add(1, std::memory_order_relaxed);
  // The last waiter leaves no stale target behind (it would wake nobody,
  // but cost the worker a lock per operation).
  if (waiters_.fetch_sub(1, std::memory_order_relaxed) == 1)
    wake_at_.store(~std::uint64_t{0}, std::memory_order_relaxed);
}

void Stream::record_error(std::uint64_t seq, wia_status_t status, std::string message) noexcept {
  std::lock_guard<std::mutex> lk(err_mu_);
  if (err_status_ != WIA_SUCCESS) return;  // the first error is the one reported
  err_status_ = status;
  err_seq_ = seq;
  err_message_ = std::move(message);
}

bool Stream::take_error(std::uint64_t up_to_seq, bool clear, wia_status_t* status,
                        std::string* message) {
  std::lock_guard<std::mutex> lk(err_mu_);
  if (err_status_ == WIA_SUCCESS || err_seq_ > up_to_seq) return false;
  *status = err_status_;
  *message = err_message_;
  if (clear) {
    err_status_ = WIA_SUCCESS;
    err_message_.clear();
  }
  return true;
}

// ----------------------------------------------------------------------------
// Handle lookup

Stream* Provider::find_stream(wia_provider_stream_t h, const char* call) noexcept {
  // Every enqueue and query validates its handle: the calling thread's
  // last hit is reused until a stream is created or destroyed.
  struct Hit {
    const Provider* provider;
    std::uint64_t generation;
    wia_provider_stream_t handle;
    Stream* stream;
  };
  static thread_local Hit hit
      __attribute__((tls_model("initial-exec"))) = {nullptr, 0, nullptr, nullptr};
  const std::uint64_t g = streams_generation.load(std::memory_order_acquire);
  if (hit.provider == this && hit.generation == g && hit.handle == h && h != nullptr)
    return hit.stream;
  {
    std::shared_lock<std::shared_mutex> lk(handles_mu);
    auto it = streams.find(h);
    if (it != streams.end()) {
      hit = {this, streams_generation.load(std::memory_order_relaxed), h, it->second.get()};
      return it->second.get();
    }
  }
  if (h == nullptr)
    fail(WIA_ERROR_INVALID_HANDLE, "%s: stream is NULL", call);
  else
    fail(WIA_ERROR_INVALID_HANDLE, "%s: %p is not a live stream of the host provider", call,
         static_cast<const void*>(h));
  return nullptr;
}

Event* Provider::find_event(wia_provider_event_t h, const char* call) noexcept {
  {
    std::shared_lock<std::shared_mutex> lk(handles_mu);
    auto it = events.find(h);
    if (it != events.end()) return it->second.get();
  }
  if (h == nullptr)
    fail(WIA_ERROR_INVALID_HANDLE, "%s: event is NULL", call);
  else
    fail(WIA_ERROR_INVALID_HANDLE, "%s: %p is not a live event of the host provider", call,
         static_cast<const void*>(h));
  return nullptr;
}

void destroy_all_streams(Provider& p) noexcept {
  std::unordered_map<const void*, std::shared_ptr<Stream>> streams;
  {
    std::unique_lock<std::shared_mutex> lk(p.handles_mu);
    streams.swap(p.streams);
    p.streams_generation.fetch_add(1, std::memory_order_release);
    if (!p.events.empty())
      p.log(WIA_LOG_WARN, "fini: %zu event(s) were not destroyed", p.events.size());
    p.events.clear();
  }
  if (!streams.empty())
    p.log(WIA_LOG_WARN, "fini: %zu stream(s) were not destroyed", streams.size());
  for (auto& [h, s] : streams) s->stop_and_join();
}

namespace {

std::shared_ptr<Capture> current_capture(Event* e) {
  std::lock_guard<std::mutex> lk(e->mu);
  return e->capture;
}

bool capture_done(const Capture& c) noexcept { return c.stream->completed() >= c.seq; }

}  // namespace

// ----------------------------------------------------------------------------
// Entry points

wia_status_t stream_create(void* ctx, std::int32_t dev, wia_provider_stream_t* out) noexcept {
  return guarded(ctx, "stream_create", [&](Provider& p) -> wia_status_t {
    if (out == nullptr)
      return p.fail(WIA_ERROR_INVALID_ARGUMENT, "stream_create on host device %d: stream is NULL",
                    dev);
    *out = nullptr;
    if (!p.valid_device(dev))
      return p.fail(WIA_ERROR_INVALID_DEVICE, "stream_create: no host device %d (have %zu)", dev,
                    p.devices.size());
    auto s = std::make_shared<Stream>(&p, dev);
    try {
      s->start();
    } catch (const std::system_error& e) {
      return p.fail(WIA_ERROR_OUT_OF_MEMORY,
                    "stream_create on host device %d: cannot start a worker thread: %s", dev,
                    e.what());
    }
    // If the insertion throws, ~Stream stops and joins the new worker.
    std::unique_lock<std::shared_mutex> lk(p.handles_mu);
    p.streams.emplace(s.get(), s);
    p.streams_generation.fetch_add(1, std::memory_order_release);
    *out = reinterpret_cast<wia_provider_stream_t>(s.get());
    return WIA_SUCCESS;
  });
}

wia_status_t stream_destroy(void* ctx, wia_provider_stream_t h) noexcept {
  return guarded(ctx, "stream_destroy", [&](Provider& p) -> wia_status_t {
    std::shared_ptr<Stream> s;
    {
      std::unique_lock<std::shared_mutex> lk(p.handles_mu);
      auto it = p.streams.find(h);
      if (it == p.streams.end())
        return p.fail(WIA_ERROR_INVALID_HANDLE,
                      "stream_destroy: %p is not a live stream of the host provider",
                      static_cast<const void*>(h));
      if (it->second.get() == tls_worker_stream)
        return p.fail(WIA_ERROR_INVALID_ARGUMENT,
                      "stream_destroy on host device %d: called from a host function running "
                      "on that stream (it would wait for itself)",
                      it->second->device());
      s = std::move(it->second);
      p.streams.erase(it);
      p.streams_generation.fetch_add(1, std::memory_order_release);
    }
    // Drains the queue first: destroying a stream never drops work.
    s->stop_and_join();
    wia_status_t st;
    std::string msg;
    if (s->take_error(std::numeric_limits<std::uint64_t>::max(), true, &st, &msg))
      p.log(WIA_LOG_WARN, "stream_destroy on host device %d: unreported asynchronous error: %s",
            s->device(), msg.c_str());
    return WIA_SUCCESS;
  });
}

wia_status_t stream_synchronize(void* ctx, wia_provider_stream_t h) noexcept {
  return guarded(ctx, "stream_synchronize", [&](Provider& p) -> wia_status_t {
    Stream* s = p.find_stream(h, "stream_synchronize");
    if (s == nullptr) return WIA_ERROR_INVALID_HANDLE;
    if (s == tls_worker_stream)
      return p.fail(WIA_ERROR_INVALID_ARGUMENT,
                    "stream_synchronize on host device %d: called from a host function running "
                    "on that stream (it would wait for itself)",
                    s->device());
    s->wait_for(s->submitted(), /*counted=*/false);
    wia_status_t st;
    std::string msg;
    if (s->take_error(std::numeric_limits<std::uint64_t>::max(), true, &st, &msg))
      return p.fail(st, "%s", msg.c_str());
    return WIA_SUCCESS;
  });
}

wia_status_t stream_query(void* ctx, wia_provider_stream_t h) noexcept {
  return guarded(ctx, "stream_query", [&](Provider& p) -> wia_status_t {
    Stream* s = p.find_stream(h, "stream_query");
    if (s == nullptr) return WIA_ERROR_INVALID_HANDLE;
    return s->completed() >= s->submitted() ? WIA_SUCCESS : WIA_IN_PROGRESS;
  });
}

wia_status_t memset_async(void* ctx, wia_provider_stream_t h, void* ptr, std::int32_t value,
                          std::uint64_t size) noexcept {
  return guarded(ctx, "memset_async", [&](Provider& p) -> wia_status_t {
    Stream* s = p.find_stream(h, "memset_async");
    if (s == nullptr) return WIA_ERROR_INVALID_HANDLE;
    if (size == 0) return WIA_SUCCESS;
    if (ptr == nullptr)
      return p.fail(WIA_ERROR_INVALID_ARGUMENT,
                    "memset_async(%" PRIu64 " B) on host device %d: ptr is NULL", size,
                    s->device());
    Op op;
    op.kind = OpKind::kMemset;
    op.dst = ptr;
    op.value = value;
    op.size = size;
    s->enqueue(std::move(op));
    return WIA_SUCCESS;
  });
}

wia_status_t memcpy_async(void* ctx, wia_provider_stream_t h, void* dst, const void* src,
                          std::uint64_t size) noexcept {
  return guarded(ctx, "memcpy_async", [&](Provider& p) -> wia_status_t {
    Stream* s = p.find_stream(h, "memcpy_async");
    if (s == nullptr) return WIA_ERROR_INVALID_HANDLE;
    if (size == 0) return WIA_SUCCESS;
    if (dst == nullptr || src == nullptr)
      return p.fail(WIA_ERROR_INVALID_ARGUMENT,
                    "memcpy_async(%" PRIu64 " B) on host device %d: %s is NULL", size, s->device(),
                    dst == nullptr ? "dst" : "src");
    Op op;
    op.kind = OpKind::kMemcpy;
    op.dst = dst;
    op.src = src;
    op.size = size;
    s->enqueue(std::move(op));
    return WIA_SUCCESS;
  });
}

wia_status_t memcpy_peer_async(void* ctx, wia_provider_stream_t h, void* dst, std::int32_t dst_dev,
                               const void* src, std::int32_t src_dev, std::uint64_t size) noexcept {
  return guarded(ctx, "memcpy_peer_async", [&](Provider& p) -> wia_status_t {
    Stream* s = p.find_stream(h, "memcpy_peer_async");
    if (s == nullptr) return WIA_ERROR_INVALID_HANDLE;
    if (!p.peer_access)
      return p.fail(WIA_ERROR_NOT_SUPPORTED,
                    "memcpy_peer_async from host device %d to %d: peer access is disabled "
                    "(host.peer_access=false); stage the copy through host memory",
                    src_dev, dst_dev);
    if (!p.valid_device(dst_dev) || !p.valid_device(src_dev))
      return p.fail(WIA_ERROR_INVALID_DEVICE,
                    "memcpy_peer_async: device pair %d -> %d out of range (have %zu devices)",
                    src_dev, dst_dev, p.devices.size());
    if (s->device() != dst_dev && s->device() != src_dev)
      return p.fail(WIA_ERROR_INVALID_HANDLE,
                    "memcpy_peer_async from host device %d to %d: the stream belongs to device %d",
                    src_dev, dst_dev, s->device());
    if (size == 0) return WIA_SUCCESS;
    if (dst == nullptr || src == nullptr)
      return p.fail(WIA_ERROR_INVALID_ARGUMENT,
                    "memcpy_peer_async(%" PRIu64 " B) from host device %d to %d: %s is NULL", size,
                    src_dev, dst_dev, dst == nullptr ? "dst" : "src");
    Op op;
    op.kind = OpKind::kMemcpy;
    op.dst = dst;
    op.src = src;
    op.size = size;
    s->enqueue(std::move(op));
    return WIA_SUCCESS;
  });
}

wia_status_t reduce_async(void* ctx, wia_provider_stream_t h,
                          const wia_reduce_args_v1_t* args) noexcept {
  return guarded(ctx, "reduce_async", [&](Provider& p) -> wia_status_t {
    Stream* s = p.find_stream(h, "reduce_async");
    if (s == nullptr) return WIA_ERROR_INVALID_HANDLE;
    if (args == nullptr)
      return p.fail(WIA_ERROR_INVALID_ARGUMENT, "reduce_async on host device %d: args is NULL",
                    s->device());
    if (const char* why = kernels::reduce_args_error(*args))
      return p.fail(WIA_ERROR_INVALID_ARGUMENT,
                    "reduce_async(%s %s, %u sources, %" PRIu64 " elements) on host device %d: %s",
                    kernels::dtype_name(args->dtype), kernels::reduce_op_name(args->op),
                    args->nsrcs, args->count, s->device(), why);
    if (args->count == 0) return WIA_SUCCESS;
    Op op;
    op.kind = OpKind::kReduce;
    // Copy only the v1 fields we know; a longer struct from a newer core
    // carries nothing this kernel understands.
    std::memcpy(&op.reduce, args, sizeof(op.reduce));
    op.reduce.struct_size = sizeof(op.reduce);
    op.srcs.reset(new const void*[args->nsrcs]);
    std::memcpy(op.srcs.get(), args->srcs, sizeof(const void*) * args->nsrcs);
    op.reduce.srcs = op.srcs.get();
    s->enqueue(std::move(op));
    return WIA_SUCCESS;
  });
}

wia_status_t launch_host_func(void* ctx, wia_provider_stream_t h, wia_host_fn_t fn,
                              void* user_data) noexcept {
  return guarded(ctx, "launch_host_func", [&](Provider& p) -> wia_status_t {
    Stream* s = p.find_stream(h, "launch_host_func");
    if (s == nullptr) return WIA_ERROR_INVALID_HANDLE;
    if (fn == nullptr)
      return p.fail(WIA_ERROR_INVALID_ARGUMENT, "launch_host_func on host device %d: fn is NULL",
                    s->device());
    Op op;
    op.kind = OpKind::kHostFn;
    op.fn = fn;
    op.user_data = user_data;
    s->enqueue(std::move(op));
    return WIA_SUCCESS;
  });
}

wia_status_t event_create(void* ctx, std::int32_t dev, wia_provider_event_t* out) noexcept {
  return guarded(ctx, "event_create", [&](Provider& p) -> wia_status_t {
    if (out == nullptr)
      return p.fail(WIA_ERROR_INVALID_ARGUMENT, "event_create on host device %d: event is NULL",
                    dev);
    *out = nullptr;
    if (!p.valid_device(dev))
      return p.fail(WIA_ERROR_INVALID_DEVICE, "event_create: no host device %d (have %zu)", dev,
                    p.devices.size());
    auto e = std::make_unique<Event>();
    e->device = dev;
    Event* raw = e.get();
    std::unique_lock<std::shared_mutex> lk(p.handles_mu);
    p.events.emplace(raw, std::move(e));
    *out = reinterpret_cast<wia_provider_event_t>(raw);
    return WIA_SUCCESS;
  });
}

wia_status_t event_destroy(void* ctx, wia_provider_event_t h) noexcept {
  return guarded(ctx, "event_destroy", [&](Provider& p) -> wia_status_t {
    std::unique_ptr<Event> e;
    std::unique_lock<std::shared_mutex> lk(p.handles_mu);
    auto it = p.events.find(h);
    if (it == p.events.end())
      return p.fail(WIA_ERROR_INVALID_HANDLE,
                    "event_destroy: %p is not a live event of the host provider",
                    static_cast<const void*>(h));
    // Pending captures stay alive through their shared owners (queued
    // marker, stream_wait_event ops), so destroying a recorded event whose
    // work is still running is fine, as on CUDA.
    e = std::move(it->second);
    p.events.erase(it);
    return WIA_SUCCESS;
  });
}

wia_status_t event_record(void* ctx, wia_provider_event_t eh, wia_provider_stream_t sh) noexcept {
  return guarded(ctx, "event_record", [&](Provider& p) -> wia_status_t {
    Event* e = p.find_event(eh, "event_record");
    if (e == nullptr) return WIA_ERROR_INVALID_HANDLE;
    Stream* s = p.find_stream(sh, "event_record");
    if (s == nullptr) return WIA_ERROR_INVALID_HANDLE;
    if (e->device != s->device())
      return p.fail(WIA_ERROR_INVALID_HANDLE,
                    "event_record: event of host device %d recorded on a stream of device %d",
                    e->device, s->device());
    auto cap = std::make_shared<Capture>();
    cap->stream = s->shared_from_this();
    Op op;
    op.kind = OpKind::kRecord;
    op.capture = cap;
    s->enqueue(std::move(op));  // sets cap->seq
    std::lock_guard<std::mutex> lk(e->mu);
    e->capture = std::move(cap);  // re-recording replaces the capture
    return WIA_SUCCESS;
  });
}

wia_status_t event_query(void* ctx, wia_provider_event_t eh) noexcept {
  return guarded(ctx, "event_query", [&](Provider& p) -> wia_status_t {
    Event* e = p.find_event(eh, "event_query");
    if (e == nullptr) return WIA_ERROR_INVALID_HANDLE;
    const auto cap = current_capture(e);
    if (cap == nullptr) return WIA_SUCCESS;  // never recorded: complete, as on CUDA
    return capture_done(*cap) ? WIA_SUCCESS : WIA_IN_PROGRESS;
  });
}

wia_status_t event_synchronize(void* ctx, wia_provider_event_t eh) noexcept {
  return guarded(ctx, "event_synchronize", [&](Provider& p) -> wia_status_t {
    Event* e = p.find_event(eh, "event_synchronize");
    if (e == nullptr) return WIA_ERROR_INVALID_HANDLE;
    const auto cap = current_capture(e);
    if (cap == nullptr) return WIA_SUCCESS;
    if (!capture_done(*cap) && cap->stream.get() == tls_worker_stream)
      return p.fail(WIA_ERROR_INVALID_ARGUMENT,
                    "event_synchronize on host device %d: called from a host function running on "
                    "the stream the event waits for (it would wait for itself)",
                    e->device);
    cap->stream->wait_for(cap->seq, /*counted=*/false);
    // Report an async error of the captured work, leaving it for the
    // stream's own synchronize too.
    wia_status_t st;
    std::string msg;
    if (cap->stream->take_error(cap->seq, false, &st, &msg)) return p.fail(st, "%s", msg.c_str());
    return WIA_SUCCESS;
  });
}

wia_status_t stream_wait_event(void* ctx, wia_provider_stream_t sh,
                               wia_provider_event_t eh) noexcept {
  return guarded(ctx, "stream_wait_event", [&](Provider& p) -> wia_status_t {
    Stream* s = p.find_stream(sh, "stream_wait_event");
    if (s == nullptr) return WIA_ERROR_INVALID_HANDLE;
    Event* e = p.find_event(eh, "stream_wait_event");
    if (e == nullptr) return WIA_ERROR_INVALID_HANDLE;
    auto cap = current_capture(e);
    // Nothing to wait for: never recorded, already complete, or captured
    // on this very stream (in-order execution implies it).
    if (cap == nullptr || cap->stream.get() == s || capture_done(*cap)) return WIA_SUCCESS;
    Op op;
    op.kind = OpKind::kWait;
    op.capture = std::move(cap);
    s->enqueue(std::move(op));
    return WIA_SUCCESS;
  });
}

wia_status_t event_elapsed_ms(void* ctx, wia_provider_event_t start, wia_provider_event_t end,
                              float* ms) noexcept {
  return guarded(ctx, "event_elapsed_ms", [&](Provider& p) -> wia_status_t {
    if (ms == nullptr) return p.fail(WIA_ERROR_INVALID_ARGUMENT, "event_elapsed_ms: ms is NULL");
    Event* a = p.find_event(start, "event_elapsed_ms");
    if (a == nullptr) return WIA_ERROR_INVALID_HANDLE;
    Event* b = p.find_event(end, "event_elapsed_ms");
    if (b == nullptr) return WIA_ERROR_INVALID_HANDLE;
    if (a->device != b->device)
      return p.fail(WIA_ERROR_INVALID_ARGUMENT,
                    "event_elapsed_ms: events of different host devices (%d and %d)", a->device,
                    b->device);
    const auto ca = current_capture(a);
    const auto cb = current_capture(b);
    if (ca == nullptr || cb == nullptr)
      return p.fail(WIA_ERROR_INVALID_ARGUMENT,
                    "event_elapsed_ms on host device %d: the %s event was never recorded",
                    a->device, ca == nullptr ? "start" : "end");
    // Not finished yet: "call again", like cudaErrorNotReady.
    if (!capture_done(*ca) || !capture_done(*cb)) return WIA_IN_PROGRESS;
    const auto t0 = ca->timestamp_ns.load(std::memory_order_relaxed);
    const auto t1 = cb->timestamp_ns.load(std::memory_order_relaxed);
    *ms = static_cast<float>(static_cast<double>(static_cast<std::int64_t>(t1 - t0)) / 1e6);
    return WIA_SUCCESS;
  });
}

}  // namespace wia::host
