// SPDX-License-Identifier: Apache-2.0
// Streams (one worker thread each, FIFO), events with steady-clock
// timestamps, host functions and the asynchronous copies, plus the
// teardown of a context's resources when its last reference goes.
#include <chrono>
#include <cstring>

#include "fake_cuda.hpp"

namespace wia::fake_cuda {
namespace {

double now_ms() {
  return std::chrono::duration<double, std::milli>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// Looks up a live event; the caller holds driver().mu.
Event* live_event(wia_CUevent e) {
  auto& all = driver().events;
  auto it = all.find(reinterpret_cast<Event*>(e));
  return it == all.end() ? nullptr : it->second.get();
}

// Joins the workers of destroyed streams that have drained, so a program
// that creates and destroys streams in a loop does not collect threads.
void reap_retired_streams(std::vector<std::shared_ptr<Stream>>& retired) {
  for (auto it = retired.begin(); it != retired.end();) {
    if ((*it)->finished()) {
      it = retired.erase(it);
    } else {
      ++it;
    }
  }
}

}  // namespace

Stream::Stream(Context* ctx) : ctx_(ctx), worker_([this] { run(); }) {}

Stream::~Stream() {
  stop();
  if (worker_.joinable()) worker_.join();
}

void Stream::enqueue(Task task) {
  std::lock_guard<std::mutex> lk(mu_);
  queue_.push_back(std::move(task));
  cv_.notify_all();
}

void Stream::run() {
  std::unique_lock<std::mutex> lk(mu_);
  for (;;) {
    cv_.wait(lk, [this] { return stopping_ || !queue_.empty(); });
    if (queue_.empty()) break;  // stopping and drained
    Task task = std::move(queue_.front());
    queue_.pop_front();
    busy_ = true;
    lk.unlock();
    const CUresult st = task();
    lk.lock();
    busy_ = false;
    // The first error is the one reported; later ones are its echoes.
    if (st != WIA_CUDA_SUCCESS && pending_error_ == WIA_CUDA_SUCCESS) pending_error_ = st;
    cv_.notify_all();
  }
  exited_ = true;
  cv_.notify_all();
}

void Stream::wait_idle() {
  std::unique_lock<std::mutex> lk(mu_);
  cv_.wait(lk, [this] { return (queue_.empty() && !busy_) || exited_; });
}

CUresult Stream::synchronize() {
  wait_idle();
  std::lock_guard<std::mutex> lk(mu_);
  const CUresult st = pending_error_;
  pending_error_ = WIA_CUDA_SUCCESS;
  return st;
}

CUresult Stream::query() {
  std::lock_guard<std::mutex> lk(mu_);
  // A failure is reported as soon as it happened, even while later work is
  // queued, as the real driver's errors are (they stick to the context):
  // "busy" would hide it for as long as the stream is kept fed.
  if (pending_error_ != WIA_CUDA_SUCCESS) {
    const CUresult st = pending_error_;
    pending_error_ = WIA_CUDA_SUCCESS;
    return st;
  }
  return !queue_.empty() || busy_ ? WIA_CUDA_ERROR_NOT_READY : WIA_CUDA_SUCCESS;
}

bool Stream::finished() const {
  std::lock_guard<std::mutex> lk(mu_);
  return exited_;
}

void Stream::stop() {
  std::lock_guard<std::mutex> lk(mu_);
  stopping_ = true;
  cv_.notify_all();
}

Stream* resolve_stream(wia_CUstream s, CUresult* error) {
  Driver& d = driver();
  std::lock_guard<std::mutex> lk(d.mu);
  if (s == nullptr) {
    Context* ctx = current_context();
    if (ctx == nullptr) {
      *error = WIA_CUDA_ERROR_INVALID_CONTEXT;
      return nullptr;
    }
    if (!ctx->default_stream) ctx->default_stream = std::make_shared<Stream>(ctx);
    return ctx->default_stream.get();
  }
  auto it = d.streams.find(reinterpret_cast<Stream*>(s));
  if (it == d.streams.end() || it->first->context()->refcount == 0) {
    *error = WIA_CUDA_ERROR_INVALID_HANDLE;
    return nullptr;
  }
  return it->first;
}

void wait_device_idle(int device) {
  // Shared owners: another thread may destroy and reap a stream meanwhile.
  std::vector<std::shared_ptr<Stream>> to_wait;
  {
    Driver& d = driver();
    std::lock_guard<std::mutex> lk(d.mu);
    for (auto& entry : d.streams)
      if (device < 0 || entry.first->context()->device == device) to_wait.push_back(entry.second);
    for (auto& s : d.retired_streams)  // destroyed, but their queued work still runs
      if (device < 0 || s->context()->device == device) to_wait.push_back(s);
    for (auto& ctx : d.contexts)
      if (ctx->default_stream && (device < 0 || ctx->device == device))
        to_wait.push_back(ctx->default_stream);
  }
  for (const auto& s : to_wait) s->wait_idle();
}

void destroy_context_resources(Context& ctx) {
  Driver& d = driver();
  std::vector<std::shared_ptr<Stream>> doomed;
  {
    std::lock_guard<std::mutex> lk(d.mu);
    for (auto it = d.streams.begin(); it != d.streams.end();) {
      if (it->first->context() == &ctx) {
        doomed.push_back(std::move(it->second));
        it = d.streams.erase(it);
      } else {
        ++it;
      }
    }
    for (auto it = d.retired_streams.begin(); it != d.retired_streams.end();) {
      if ((*it)->context() == &ctx) {
        doomed.push_back(std::move(*it));
        it = d.retired_streams.erase(it);
      } else {
        ++it;
      }
    }
    if (ctx.default_stream) doomed.push_back(std::move(ctx.default_stream));
  }
  doomed.clear();  // joins the workers, outside the lock their tasks take
  std::lock_guard<std::mutex> lk(d.mu);
  std::erase_if(d.events, [&](const auto& e) { return e.second->ctx == &ctx; });
  std::erase_if(d.retired_events, [&](const auto& e) { return e->ctx == &ctx; });
  std::erase_if(d.modules, [&](const auto& m) { return m.second->ctx == &ctx; });
  for (auto it = d.allocations.begin(); it != d.allocations.end();) {
    Allocation& a = it->second;
    if (a.device == ctx.device && a.kind != MemKind::kHostRegistered) {
      release_allocation(a);
      it = d.allocations.erase(it);
    } else {
      ++it;
    }
  }
  std::erase_if(d.allocations, [&](const auto& e) {
    return e.second.device == ctx.device && e.second.kind == MemKind::kHostRegistered;
  });
  ctx.peers.clear();
}

}  // namespace wia::fake_cuda

using namespace wia::fake_cuda;

wia_CUresult fake_cuStreamCreate(wia_CUstream* stream, unsigned int flags) {
  if (stream == nullptr || (flags & ~WIA_CU_STREAM_NON_BLOCKING) != 0)
    return WIA_CUDA_ERROR_INVALID_VALUE;
  Driver& d = driver();
  std::lock_guard<std::mutex> lk(d.mu);
  Context* ctx = current_context();
  if (ctx == nullptr) return WIA_CUDA_ERROR_INVALID_CONTEXT;
  reap_retired_streams(d.retired_streams);
  auto s = std::make_shared<Stream>(ctx);
  *stream = reinterpret_cast<wia_CUstream>(s.get());
  d.streams[s.get()] = std::move(s);
  return WIA_CUDA_SUCCESS;
}

wia_CUresult fake_cuStreamDestroy(wia_CUstream stream) {
  Driver& d = driver();
  std::lock_guard<std::mutex> lk(d.mu);
  auto it = d.streams.find(reinterpret_cast<Stream*>(stream));
  if (stream == nullptr || it == d.streams.end()) return WIA_CUDA_ERROR_INVALID_HANDLE;
  // Returns at once, like the real driver; queued work still runs.
  it->second->stop();
  d.retired_streams.push_back(std::move(it->second));
  d.streams.erase(it);
  return WIA_CUDA_SUCCESS;
}

wia_CUresult fake_cuStreamSynchronize(wia_CUstream stream) {
  CUresult error = WIA_CUDA_SUCCESS;
  Stream* s = resolve_stream(stream, &error);
  return s == nullptr ? error : s->synchronize();
}

wia_CUresult fake_cuStreamQuery(wia_CUstream stream) {
  CUresult error = WIA_CUDA_SUCCESS;
  Stream* s = resolve_stream(stream, &error);
  return s == nullptr ? error : s->query();
}

wia_CUresult fake_cuStreamWaitEvent(wia_CUstream stream, wia_CUevent event, unsigned int flags) {
  if (flags != 0) return WIA_CUDA_ERROR_INVALID_VALUE;
  CUresult error = WIA_CUDA_SUCCESS;
  Stream* s = resolve_stream(stream, &error);
  if (s == nullptr) return error;
  Driver& d = driver();
  std::uint64_t target = 0;
  Event* e = nullptr;
  {
    std::lock_guard<std::mutex> lk(d.mu);
    e = live_event(event);
    if (e == nullptr) return WIA_CUDA_ERROR_INVALID_HANDLE;
    std::lock_guard<std::mutex> ek(d.event_mu);
    target = e->recorded;
  }
  if (target == 0) return WIA_CUDA_SUCCESS;  // never recorded: nothing to wait for, as in CUDA
  // The wait is for the record issued before this call, not later ones.
  s->enqueue([e, target] {
    Driver& drv = driver();
    std::unique_lock<std::mutex> ek(drv.event_mu);
    drv.event_cv.wait(ek, [&] { return e->completed >= target; });
    return WIA_CUDA_SUCCESS;
  });
  return WIA_CUDA_SUCCESS;
}

HostFunctionThread::HostFunctionThread() : thread_([this] { loop(); }) {}

HostFunctionThread::~HostFunctionThread() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void HostFunctionThread::run(const std::function<void()>& fn) {
  std::mutex done_mu;
  std::condition_variable done_cv;
  bool done = false;
  {
    std::lock_guard<std::mutex> lk(mu_);
    queue_.push_back([&] {
      fn();
      std::lock_guard<std::mutex> dl(done_mu);
      done = true;
      done_cv.notify_all();
    });
  }
  cv_.notify_all();
  std::unique_lock<std::mutex> dl(done_mu);
  done_cv.wait(dl, [&] { return done; });
}

void HostFunctionThread::loop() {
  std::unique_lock<std::mutex> lk(mu_);
  for (;;) {
    cv_.wait(lk, [this] { return stopping_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stopping and drained
    std::function<void()> task = std::move(queue_.front());
    queue_.pop_front();
    lk.unlock();
    set_in_host_function(true);  // CUDA calls from here return NOT_PERMITTED
    task();
    set_in_host_function(false);
    lk.lock();
  }
}

wia_CUresult fake_cuLaunchHostFunc(wia_CUstream stream, wia_CUhostFn fn, void* user_data) {
  if (fn == nullptr) return WIA_CUDA_ERROR_INVALID_VALUE;
  CUresult error = WIA_CUDA_SUCCESS;
  Stream* s = resolve_stream(stream, &error);
  if (s == nullptr) return error;
  // The stream waits while the process's one host-function thread runs fn.
  s->enqueue([fn, user_data] {
    driver().host_functions.run([fn, user_data] { fn(user_data); });
    return WIA_CUDA_SUCCESS;
  });
  return WIA_CUDA_SUCCESS;
}

wia_CUresult fake_cuEventCreate(wia_CUevent* event, unsigned int flags) {
  if (event == nullptr || (flags & ~0xFu) != 0) return WIA_CUDA_ERROR_INVALID_VALUE;
  Driver& d = driver();
  std::lock_guard<std::mutex> lk(d.mu);
  Context* ctx = current_context();
  if (ctx == nullptr) return WIA_CUDA_ERROR_INVALID_CONTEXT;
  auto e = std::make_unique<Event>();
  e->ctx = ctx;
  e->flags = flags;
  *event = reinterpret_cast<wia_CUevent>(e.get());
  d.events[e.get()] = std::move(e);
  return WIA_CUDA_SUCCESS;
}

wia_CUresult fake_cuEventDestroy(wia_CUevent event) {
  Driver& d = driver();
  std::lock_guard<std::mutex> lk(d.mu);
  auto it = d.events.find(reinterpret_cast<Event*>(event));
  if (it == d.events.end()) return WIA_CUDA_ERROR_INVALID_HANDLE;
  // The real driver defers the release until pending records complete;
  // keep the object (it is small) so queued records stay valid: the
  // handle is dead, the memory goes with the context.
  d.retired_events.push_back(std::move(it->second));
  d.events.erase(it);
  return WIA_CUDA_SUCCESS;
}

wia_CUresult fake_cuEventRecord(wia_CUevent event, wia_CUstream stream) {
  CUresult error = WIA_CUDA_SUCCESS;
  Stream* s = resolve_stream(stream, &error);
  if (s == nullptr) return error;
  Driver& d = driver();
  Event* e = nullptr;
  std::uint64_t generation = 0;
  {
    std::lock_guard<std::mutex> lk(d.mu);
    e = live_event(event);
    if (e == nullptr) return WIA_CUDA_ERROR_INVALID_HANDLE;
    if (e->ctx != s->context()) return WIA_CUDA_ERROR_INVALID_HANDLE;  // same context only
    std::lock_guard<std::mutex> ek(d.event_mu);
    generation = ++e->recorded;
  }
  s->enqueue([e, generation] {
    Driver& drv = driver();
    std::lock_guard<std::mutex> ek(drv.event_mu);
    if (generation > e->completed) {
      e->completed = generation;
      e->ms = now_ms();
    }
    drv.event_cv.notify_all();
    return WIA_CUDA_SUCCESS;
  });
  return WIA_CUDA_SUCCESS;
}

wia_CUresult fake_cuEventQuery(wia_CUevent event) {
  Driver& d = driver();
  std::lock_guard<std::mutex> lk(d.mu);
  Event* e = live_event(event);
  if (e == nullptr) return WIA_CUDA_ERROR_INVALID_HANDLE;
  std::lock_guard<std::mutex> ek(d.event_mu);
  return e->completed >= e->recorded ? WIA_CUDA_SUCCESS : WIA_CUDA_ERROR_NOT_READY;
}

wia_CUresult fake_cuEventSynchronize(wia_CUevent event) {
  Driver& d = driver();
  Event* e = nullptr;
  std::uint64_t target = 0;
  {
    std::lock_guard<std::mutex> lk(d.mu);
    e = live_event(event);
    if (e == nullptr) return WIA_CUDA_ERROR_INVALID_HANDLE;
    std::lock_guard<std::mutex> ek(d.event_mu);
    target = e->recorded;
  }
  std::unique_lock<std::mutex> ek(d.event_mu);
  d.event_cv.wait(ek, [&] { return e->completed >= target; });
  return WIA_CUDA_SUCCESS;
}

wia_CUresult fake_cuEventElapsedTime(float* ms, wia_CUevent start, wia_CUevent end) {
  if (ms == nullptr) return WIA_CUDA_ERROR_INVALID_VALUE;
  Driver& d = driver();
  std::lock_guard<std::mutex> lk(d.mu);
  Event* a = live_event(start);
  Event* b = live_event(end);
  if (a == nullptr || b == nullptr) return WIA_CUDA_ERROR_INVALID_HANDLE;
  if (((a->flags | b->flags) & WIA_CU_EVENT_DISABLE_TIMING) != 0)
    return WIA_CUDA_ERROR_INVALID_HANDLE;
  std::lock_guard<std::mutex> ek(d.event_mu);
  if (a->recorded == 0 || b->recorded == 0) return WIA_CUDA_ERROR_INVALID_HANDLE;
  if (a->completed < a->recorded || b->completed < b->recorded) return WIA_CUDA_ERROR_NOT_READY;
  *ms = static_cast<float>(b->ms - a->ms);
  return WIA_CUDA_SUCCESS;
}

wia_CUresult fake_cuMemsetD8Async(wia_CUdeviceptr dst, unsigned char value, size_t count,
                                  wia_CUstream stream) {
  CUresult error = WIA_CUDA_SUCCESS;
  Stream* s = resolve_stream(stream, &error);
  if (s == nullptr) return error;
  {
    std::lock_guard<std::mutex> lk(driver().mu);
    if (count != 0 && !range_known(static_cast<std::uintptr_t>(dst), count))
      return WIA_CUDA_ERROR_INVALID_VALUE;
  }
  s->enqueue([dst, value, count] {
    if (count != 0) std::memset(reinterpret_cast<void*>(dst), value, count);
    return WIA_CUDA_SUCCESS;
  });
  return WIA_CUDA_SUCCESS;
}

namespace {

CUresult enqueue_copy(wia_CUdeviceptr dst, wia_CUdeviceptr src, size_t bytes, Stream* s) {
  {
    std::lock_guard<std::mutex> lk(driver().mu);
    if (const CUresult st = check_copy_range(static_cast<std::uintptr_t>(dst), bytes)) return st;
    if (const CUresult st = check_copy_range(static_cast<std::uintptr_t>(src), bytes)) return st;
  }
  s->enqueue([dst, src, bytes] {
    if (bytes != 0) std::memmove(reinterpret_cast<void*>(dst), reinterpret_cast<void*>(src), bytes);
    return WIA_CUDA_SUCCESS;
  });
  return WIA_CUDA_SUCCESS;
}

}  // namespace

wia_CUresult fake_cuMemcpyAsync(wia_CUdeviceptr dst, wia_CUdeviceptr src, size_t bytes,
                                wia_CUstream stream) {
  CUresult error = WIA_CUDA_SUCCESS;
  Stream* s = resolve_stream(stream, &error);
  return s == nullptr ? error : enqueue_copy(dst, src, bytes, s);
}

wia_CUresult fake_cuMemcpyPeerAsync(wia_CUdeviceptr dst, wia_CUcontext dst_ctx, wia_CUdeviceptr src,
                                    wia_CUcontext src_ctx, size_t bytes, wia_CUstream stream) {
  auto* dc = reinterpret_cast<Context*>(dst_ctx);
  auto* sc = reinterpret_cast<Context*>(src_ctx);
  if (dc == nullptr || sc == nullptr || dc->refcount == 0 || sc->refcount == 0)
    return WIA_CUDA_ERROR_INVALID_CONTEXT;
  CUresult error = WIA_CUDA_SUCCESS;
  Stream* s = resolve_stream(stream, &error);
  if (s == nullptr) return error;
  {
    // Each pointer must be memory of the context named for it.
    std::lock_guard<std::mutex> lk(driver().mu);
    const Allocation* da = find_allocation(static_cast<std::uintptr_t>(dst));
    const Allocation* sa = find_allocation(static_cast<std::uintptr_t>(src));
    if (bytes != 0 &&
        ((da != nullptr && da->kind == MemKind::kDevice && da->device != dc->device) ||
         (sa != nullptr && sa->kind == MemKind::kDevice && sa->device != sc->device))) {
      diagnose("cuMemcpyPeerAsync: a pointer is not memory of the context given for it");
      return WIA_CUDA_ERROR_INVALID_VALUE;
    }
  }
  return enqueue_copy(dst, src, bytes, s);
}
