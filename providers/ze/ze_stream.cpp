// SPDX-License-Identifier: Apache-2.0
// Streams and events of the `ze` provider. A stream is an asynchronous
// immediate command list; because Level Zero 1.4 lists may reorder
// commands between barriers, every command is followed by a barrier, which
// gives the in-order stream the ABI promises. Completion is observed
// through host-visible events from the driver's pools: a "fence" is a
// barrier that signals one. Host functions (Level Zero has none) run on a
// thread of ours per stream. Reductions are host-staged
// (wia_common/staged_reduce.hpp).
#include <cinttypes>
#include <cstdint>

#include "kernels/cpu_reduce.hpp"
#include "wia_common/staged_reduce.hpp"
#include "ze_provider.hpp"

namespace wia::ze {

namespace {

constexpr std::uint64_t kForever = UINT64_MAX;

void advance(StreamClock& c, std::uint64_t position) {
  std::uint64_t now = c.done.load(std::memory_order_relaxed);
  while (now < position &&
         !c.done.compare_exchange_weak(now, position, std::memory_order_acq_rel)) {
  }
}

Driver* driver_of(Provider& p, const Stream& s) { return p.device(s.device).driver; }

// Appends `command` (which returns the ze result) plus a barrier, under
// s.mu held by the caller. The barrier keeps the stream in order.
template <class F>
wia_ze_result_t append_ordered(Provider& p, Stream& s, F&& command) {
  wia_ze_result_t r = command();
  if (r != WIA_ZE_RESULT_SUCCESS) return r;
  ++s.appended;
  r = p.rt.zeCommandListAppendBarrier(s.list, nullptr, 0, nullptr);
  return r;
}

// The failure the host-function thread saw, once.
wia_status_t take_async_error(Provider& p, Stream& s, const char* call) {
  const wia_ze_result_t r = s.async_error.exchange(WIA_ZE_RESULT_SUCCESS);
  if (r == WIA_ZE_RESULT_SUCCESS) return WIA_SUCCESS;
  return p.fail_ze(r, s.device, "%s: zeEventHostSynchronize (work before a host function)", call);
}

// Waits until everything appended so far has run.
wia_status_t fence(Provider& p, Stream& s, const char* call) {
  Driver* d = driver_of(p, s);
  ZeEvent* f = d->events.get(p, s.device);
  if (f == nullptr) return WIA_ERROR_OUT_OF_MEMORY;
  std::uint64_t position = 0;
  {
    std::lock_guard<std::mutex> lk(s.mu);
    const wia_ze_result_t r = p.rt.zeCommandListAppendBarrier(s.list, f->h, 0, nullptr);
    if (r != WIA_ZE_RESULT_SUCCESS) {
      d->events.put(p.rt, f);
      return p.fail_ze(r, s.device, "%s: zeCommandListAppendBarrier(fence)", call);
    }
    position = s.appended;
  }
  const wia_ze_result_t r = p.rt.zeEventHostSynchronize(f->h, kForever);
  // Signalled (or the device is lost): no command refers to it any more.
  d->events.put(p.rt, f);
  if (r != WIA_ZE_RESULT_SUCCESS)
    return p.fail_ze(r, s.device, "%s: zeEventHostSynchronize(fence)", call);
  advance(*s.clock, position);
  p.sweep();
  return take_async_error(p, s, call);
}

void host_worker(Provider* p, Stream* s) {
  std::unique_lock<std::mutex> lk(s->host_mu);
  for (;;) {
    s->host_cv.wait(lk, [&] { return !s->host_tasks.empty() || s->host_stop; });
    if (s->host_tasks.empty()) return;  // stopped, and drained
    HostTask t = s->host_tasks.front();
    s->host_tasks.pop_front();
    lk.unlock();
    const wia_ze_result_t r = p->rt.zeEventHostSynchronize(t.reached->h, kForever);
    if (r == WIA_ZE_RESULT_SUCCESS) {
      advance(*s->clock, t.position);
    } else {
      wia_ze_result_t none = WIA_ZE_RESULT_SUCCESS;
      s->async_error.compare_exchange_strong(none, r);
    }
    // Run even after a failure: staging memory is freed by a host function.
    t.fn(t.user_data);
    p->rt.zeEventHostSignal(t.done->h);
    Driver* d = driver_of(*p, *s);
    d->events.put(p->rt, t.reached);  // signalled, and waited on by nobody but us
    try {
      p->retire(d, t.done);  // the list's wait on it may not have passed yet
    } catch (...) {
      // Out of memory for the graveyard: leak the event rather than reset
      // it under a list that still waits on it.
    }
    p->sweep();
    lk.lock();
  }
}

wia_status_t append_host_fn(Provider& p, Stream& s, wia_host_fn_t fn, void* user_data,
                            const char* call) {
  Driver* d = driver_of(p, s);
  ZeEvent* reached = d->events.get(p, s.device);
  if (reached == nullptr) return WIA_ERROR_OUT_OF_MEMORY;
  ZeEvent* done = d->events.get(p, s.device);
  if (done == nullptr) {
    d->events.put(p.rt, reached);
    return WIA_ERROR_OUT_OF_MEMORY;
  }
  HostTask t{fn, user_data, reached, done, 0};
  {
    std::lock_guard<std::mutex> lk(s.mu);
    wia_ze_result_t r = p.rt.zeCommandListAppendBarrier(s.list, reached->h, 0, nullptr);
    if (r != WIA_ZE_RESULT_SUCCESS) {
      d->events.put(p.rt, reached);
      d->events.put(p.rt, done);
      return p.fail_ze(r, s.device,
                       "%s: zeCommandListAppendBarrier(signal where the host function is due)",
                       call);
    }
    t.position = ++s.appended;
    r = p.rt.zeCommandListAppendWaitOnEvents(s.list, 1, &done->h);
    if (r != WIA_ZE_RESULT_SUCCESS) {
      // `reached` will be signalled by the list: recycled once it is.
      p.retire(d, reached);
      d->events.put(p.rt, done);
      return p.fail_ze(r, s.device, "%s: zeCommandListAppendWaitOnEvents(host function done)",
                       call);
    }
    done->waiters.push_back({s.clock, ++s.appended});
    {
      std::lock_guard<std::mutex> hk(s.host_mu);
      if (!s.host_thread.joinable()) s.host_thread = std::thread(host_worker, &p, &s);
      s.host_tasks.push_back(t);
    }
    s.host_cv.notify_all();
  }
  return WIA_SUCCESS;
}

wia_status_t append_copy(Provider& p, Stream& s, void* dst, const void* src, std::size_t bytes,
                         const char* call) {
  std::lock_guard<std::mutex> lk(s.mu);
  const wia_ze_result_t r = append_ordered(p, s, [&] {
    return p.rt.zeCommandListAppendMemoryCopy(s.list, dst, src, bytes, nullptr, 0, nullptr);
  });
  if (r != WIA_ZE_RESULT_SUCCESS)
    return p.fail_ze(r, s.device, "%s: zeCommandListAppendMemoryCopy(%p <- %p, %zu bytes)", call,
                     dst, src, bytes);
  return WIA_SUCCESS;
}

void stop_host_thread(Stream& s) {
  {
    std::lock_guard<std::mutex> lk(s.host_mu);
    s.host_stop = true;
  }
  s.host_cv.notify_all();
  if (s.host_thread.joinable()) s.host_thread.join();
}

}  // namespace

// --------------------------------------------------------------------------
// Streams

wia_status_t stream_create(void* ctx, std::int32_t dev, wia_provider_stream_t* stream) noexcept {
  return guarded(ctx, "stream_create", [&](Provider& p) -> wia_status_t {
    if (stream == nullptr)
      return p.fail(WIA_ERROR_INVALID_ARGUMENT, "stream_create: stream is NULL");
    *stream = nullptr;
    if (const wia_status_t st = p.check_device(dev, "stream_create"); st != WIA_SUCCESS) return st;
    Device& d = p.device(dev);
    auto s = std::make_unique<Stream>();
    s->device = dev;
    // Ordinal 0: the first command-queue group, which every device has and
    // which does compute and copies.
    const wia_ze_command_queue_desc_t desc{WIA_ZE_STRUCTURE_TYPE_COMMAND_QUEUE_DESC,
                                           nullptr,
                                           0,
                                           0,
                                           0,
                                           WIA_ZE_COMMAND_QUEUE_MODE_ASYNCHRONOUS,
                                           WIA_ZE_COMMAND_QUEUE_PRIORITY_NORMAL};
    const wia_ze_result_t r =
        p.rt.zeCommandListCreateImmediate(d.driver->context, d.h, &desc, &s->list);
    if (r != WIA_ZE_RESULT_SUCCESS)
      return p.fail_ze(r, dev, "zeCommandListCreateImmediate(asynchronous)");
    try {
      std::unique_lock<std::shared_mutex> lk(p.handles_mu);
      p.streams.insert(s.get());
    } catch (...) {
      p.rt.zeCommandListDestroy(s->list);
      throw;
    }
    *stream = reinterpret_cast<wia_provider_stream_t>(s.release());
    return WIA_SUCCESS;
  });
}

wia_status_t stream_destroy(void* ctx, wia_provider_stream_t h) noexcept {
  return guarded(ctx, "stream_destroy", [&](Provider& p) -> wia_status_t {
    std::unique_ptr<Stream> s;
    {
      std::unique_lock<std::shared_mutex> lk(p.handles_mu);
      auto* raw = reinterpret_cast<Stream*>(h);
      if (p.streams.erase(raw) == 0)
        return p.fail(WIA_ERROR_INVALID_HANDLE,
                      "stream_destroy: %p is not a live stream of the ze provider",
                      static_cast<void*>(h));
      s.reset(raw);
    }
    // The ABI's destroy waits for the stream's work; Level Zero's does not.
    const wia_status_t synced = fence(p, *s, "stream_destroy");
    stop_host_thread(*s);
    advance(*s->clock, UINT64_MAX);  // no wait of this list is pending any more
    if (s->query_fence != nullptr) driver_of(p, *s)->events.put(p.rt, s->query_fence);
    const wia_ze_result_t r = p.rt.zeCommandListDestroy(s->list);
    p.sweep();
    if (synced != WIA_SUCCESS) return synced;
    if (r != WIA_ZE_RESULT_SUCCESS) return p.fail_ze(r, s->device, "zeCommandListDestroy");
    return WIA_SUCCESS;
  });
}

wia_status_t stream_synchronize(void* ctx, wia_provider_stream_t h) noexcept {
  return guarded(ctx, "stream_synchronize", [&](Provider& p) -> wia_status_t {
    Stream* s = p.find_stream(h, "stream_synchronize");
    if (s == nullptr) return WIA_ERROR_INVALID_HANDLE;
    return fence(p, *s, "stream_synchronize");
  });
}

wia_status_t stream_query(void* ctx, wia_provider_stream_t h) noexcept {
  return guarded(ctx, "stream_query", [&](Provider& p) -> wia_status_t {
    Stream* s = p.find_stream(h, "stream_query");
    if (s == nullptr) return WIA_ERROR_INVALID_HANDLE;
    Driver* d = driver_of(p, *s);
    std::lock_guard<std::mutex> lk(s->mu);
    if (const wia_status_t st = take_async_error(p, *s, "stream_query"); st != WIA_SUCCESS)
      return st;
    // One fence at a time: a query while the last one is pending looks at
    // it instead of appending another.
    for (int round = 0; round < 2; ++round) {
      if (s->query_fence != nullptr) {
        const wia_ze_result_t r = p.rt.zeEventQueryStatus(s->query_fence->h);
        if (r == WIA_ZE_RESULT_NOT_READY) return WIA_IN_PROGRESS;
        d->events.put(p.rt, s->query_fence);
        s->query_fence = nullptr;
        if (r != WIA_ZE_RESULT_SUCCESS)
          return p.fail_ze(r, s->device, "stream_query: zeEventQueryStatus(fence)");
        advance(*s->clock, s->query_position);
      }
      if (s->clock->done.load(std::memory_order_acquire) >= s->appended) return WIA_SUCCESS;
      if (round == 1) break;
      ZeEvent* f = d->events.get(p, s->device);
      if (f == nullptr) return WIA_ERROR_OUT_OF_MEMORY;
      const wia_ze_result_t r = p.rt.zeCommandListAppendBarrier(s->list, f->h, 0, nullptr);
      if (r != WIA_ZE_RESULT_SUCCESS) {
        d->events.put(p.rt, f);
        return p.fail_ze(r, s->device, "stream_query: zeCommandListAppendBarrier(fence)");
      }
      s->query_fence = f;
      s->query_position = s->appended;
    }
    return WIA_IN_PROGRESS;
  });
}

wia_status_t memset_async(void* ctx, wia_provider_stream_t h, void* ptr, std::int32_t value,
                          std::uint64_t size) noexcept {
  return guarded(ctx, "memset_async", [&](Provider& p) -> wia_status_t {
    Stream* s = p.find_stream(h, "memset_async");
    if (s == nullptr) return WIA_ERROR_INVALID_HANDLE;
    if (size == 0) return WIA_SUCCESS;
    if (ptr == nullptr)
      return p.fail(WIA_ERROR_INVALID_ARGUMENT, "memset_async on Level Zero device %d: ptr is NULL",
                    s->device);
    const auto byte = static_cast<unsigned char>(value);
    std::lock_guard<std::mutex> lk(s->mu);
    // The pattern is read when the command is appended (Level Zero copies
    // patterns up to the maximum fill size at append time).
    const wia_ze_result_t r = append_ordered(p, *s, [&] {
      return p.rt.zeCommandListAppendMemoryFill(
          s->list, ptr, &byte, 1, static_cast<std::size_t>(size), nullptr, 0, nullptr);
    });
    if (r != WIA_ZE_RESULT_SUCCESS)
      return p.fail_ze(r, s->device, "zeCommandListAppendMemoryFill(%p, 0x%02x, %" PRIu64 " bytes)",
                       ptr, byte, size);
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
      return p.fail(WIA_ERROR_INVALID_ARGUMENT, "memcpy_async on Level Zero device %d: %s is NULL",
                    s->device, dst == nullptr ? "dst" : "src");
    return append_copy(p, *s, dst, src, static_cast<std::size_t>(size), "memcpy_async");
  });
}

wia_status_t launch_host_func(void* ctx, wia_provider_stream_t h, wia_host_fn_t fn,
                              void* user_data) noexcept {
  return guarded(ctx, "launch_host_func", [&](Provider& p) -> wia_status_t {
    Stream* s = p.find_stream(h, "launch_host_func");
    if (s == nullptr) return WIA_ERROR_INVALID_HANDLE;
    if (fn == nullptr)
      return p.fail(WIA_ERROR_INVALID_ARGUMENT,
                    "launch_host_func on Level Zero device %d: fn is NULL", s->device);
    return append_host_fn(p, *s, fn, user_data, "launch_host_func");
  });
}

wia_status_t memcpy_peer_async(void* ctx, wia_provider_stream_t h, void* dst, std::int32_t dst_dev,
                               const void* src, std::int32_t src_dev, std::uint64_t size) noexcept {
  return guarded(ctx, "memcpy_peer_async", [&](Provider& p) -> wia_status_t {
    Stream* s = p.find_stream(h, "memcpy_peer_async");
    if (s == nullptr) return WIA_ERROR_INVALID_HANDLE;
    if (s->device != dst_dev && s->device != src_dev)
      return p.fail(WIA_ERROR_INVALID_ARGUMENT,
                    "memcpy_peer_async %d -> %d: the stream belongs to Level Zero device %d, "
                    "neither end of the copy",
                    src_dev, dst_dev, s->device);
    if (const wia_status_t st = p.check_device(dst_dev, "memcpy_peer_async"); st != WIA_SUCCESS)
      return st;
    if (const wia_status_t st = p.check_device(src_dev, "memcpy_peer_async"); st != WIA_SUCCESS)
      return st;
    if (p.device(dst_dev).driver != p.device(src_dev).driver)
      return p.fail(WIA_ERROR_NOT_SUPPORTED,
                    "memcpy_peer_async %d -> %d: the devices belong to different Level Zero "
                    "drivers (no shared context)",
                    src_dev, dst_dev);
    if (size == 0) return WIA_SUCCESS;
    if (dst == nullptr || src == nullptr)
      return p.fail(WIA_ERROR_INVALID_ARGUMENT, "memcpy_peer_async %d -> %d: %s is NULL", src_dev,
                    dst_dev, dst == nullptr ? "dst" : "src");
    // One context spans the driver's devices: a plain copy between USM
    // pointers of two devices, which the driver routes (over the link when
    // the devices are peers).
    return append_copy(p, *s, dst, src, static_cast<std::size_t>(size), "memcpy_peer_async");
  });
}

// --------------------------------------------------------------------------
// Events

wia_status_t event_create(void* ctx, std::int32_t dev, wia_provider_event_t* event) noexcept {
  return guarded(ctx, "event_create", [&](Provider& p) -> wia_status_t {
    if (event == nullptr) return p.fail(WIA_ERROR_INVALID_ARGUMENT, "event_create: event is NULL");
    *event = nullptr;
    if (const wia_status_t st = p.check_device(dev, "event_create"); st != WIA_SUCCESS) return st;
    // The Level Zero event is taken at each record: a recorded one may still
    // be waited on by a list when the event is recorded again.
    auto e = std::make_unique<Event>();
    e->device = dev;
    {
      std::unique_lock<std::shared_mutex> lk(p.handles_mu);
      p.events.insert(e.get());
    }
    *event = reinterpret_cast<wia_provider_event_t>(e.release());
    return WIA_SUCCESS;
  });
}

wia_status_t event_destroy(void* ctx, wia_provider_event_t h) noexcept {
  return guarded(ctx, "event_destroy", [&](Provider& p) -> wia_status_t {
    std::unique_ptr<Event> e;
    {
      std::unique_lock<std::shared_mutex> lk(p.handles_mu);
      auto* raw = reinterpret_cast<Event*>(h);
      if (p.events.erase(raw) == 0)
        return p.fail(WIA_ERROR_INVALID_HANDLE,
                      "event_destroy: %p is not a live event of the ze provider",
                      static_cast<void*>(h));
      e.reset(raw);
    }
    if (e->current != nullptr) p.retire(p.device(e->device).driver, e->current);
    e->current = nullptr;
    p.sweep();
    return WIA_SUCCESS;
  });
}

wia_status_t event_record(void* ctx, wia_provider_event_t eh, wia_provider_stream_t sh) noexcept {
  return guarded(ctx, "event_record", [&](Provider& p) -> wia_status_t {
    Event* e = p.find_event(eh, "event_record");
    if (e == nullptr) return WIA_ERROR_INVALID_HANDLE;
    Stream* s = p.find_stream(sh, "event_record");
    if (s == nullptr) return WIA_ERROR_INVALID_HANDLE;
    if (e->device != s->device)
      return p.fail(WIA_ERROR_INVALID_HANDLE,
                    "event_record: the event belongs to Level Zero device %d, the stream to "
                    "device %d",
                    e->device, s->device);
    Driver* d = driver_of(p, *s);
    p.sweep();
    ZeEvent* n = d->events.get(p, s->device);
    if (n == nullptr) return WIA_ERROR_OUT_OF_MEMORY;
    std::lock_guard<std::mutex> ek(e->mu);
    {
      std::lock_guard<std::mutex> lk(s->mu);
      // After the barrier of the previous command: the device's global
      // timestamp once everything before it has run, then the signal.
      const wia_ze_result_t r =
          p.rt.zeCommandListAppendWriteGlobalTimestamp(s->list, n->timestamp, n->h, 0, nullptr);
      if (r != WIA_ZE_RESULT_SUCCESS) {
        d->events.put(p.rt, n);
        return p.fail_ze(r, s->device, "event_record: zeCommandListAppendWriteGlobalTimestamp");
      }
      n->signaller = s->clock;
      n->signal_position = ++s->appended;
      const wia_ze_result_t b = p.rt.zeCommandListAppendBarrier(s->list, nullptr, 0, nullptr);
      if (b != WIA_ZE_RESULT_SUCCESS) {
        p.retire(d, n);
        return p.fail_ze(b, s->device, "event_record: zeCommandListAppendBarrier");
      }
    }
    if (e->current != nullptr) p.retire(d, e->current);
    e->current = n;
    return WIA_SUCCESS;
  });
}

wia_status_t event_query(void* ctx, wia_provider_event_t h) noexcept {
  return guarded(ctx, "event_query", [&](Provider& p) -> wia_status_t {
    Event* e = p.find_event(h, "event_query");
    if (e == nullptr) return WIA_ERROR_INVALID_HANDLE;
    std::lock_guard<std::mutex> ek(e->mu);
    if (e->current == nullptr) return WIA_SUCCESS;  // the ABI: never recorded is complete
    const wia_ze_result_t r = p.rt.zeEventQueryStatus(e->current->h);
    if (r == WIA_ZE_RESULT_SUCCESS) note_signalled(*e->current);
    if (r == WIA_ZE_RESULT_SUCCESS || r == WIA_ZE_RESULT_NOT_READY) return status_of(r);
    return p.fail_ze(r, e->device, "zeEventQueryStatus");
  });
}

wia_status_t event_synchronize(void* ctx, wia_provider_event_t h) noexcept {
  return guarded(ctx, "event_synchronize", [&](Provider& p) -> wia_status_t {
    Event* e = p.find_event(h, "event_synchronize");
    if (e == nullptr) return WIA_ERROR_INVALID_HANDLE;
    // Held while waiting: a concurrent record must not retire (and a sweep
    // recycle) the Level Zero event under this wait.
    std::lock_guard<std::mutex> ek(e->mu);
    if (e->current == nullptr) return WIA_SUCCESS;
    const wia_ze_result_t r = p.rt.zeEventHostSynchronize(e->current->h, kForever);
    if (r != WIA_ZE_RESULT_SUCCESS) return p.fail_ze(r, e->device, "zeEventHostSynchronize");
    note_signalled(*e->current);
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
    std::lock_guard<std::mutex> ek(e->mu);
    if (e->current == nullptr) return WIA_SUCCESS;  // nothing to wait for
    if (p.device(e->device).driver != driver_of(p, *s))
      return p.fail(WIA_ERROR_NOT_SUPPORTED,
                    "stream_wait_event: an event of Level Zero device %d and a stream of device "
                    "%d belong to different drivers",
                    e->device, s->device);
    std::lock_guard<std::mutex> lk(s->mu);
    // Registered first, so a failed append leaves a waiter that keeps the
    // event alive (never one that lets it be recycled under the list).
    e->current->waiters.push_back({s->clock, s->appended + 1});
    const wia_ze_result_t r = p.rt.zeCommandListAppendWaitOnEvents(s->list, 1, &e->current->h);
    if (r != WIA_ZE_RESULT_SUCCESS)
      return p.fail_ze(r, s->device, "zeCommandListAppendWaitOnEvents(event of device %d)",
                       e->device);
    ++s->appended;
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
                    "event_elapsed_ms: events of Level Zero devices %d and %d (timing needs one "
                    "device)",
                    a->device, b->device);
    std::uint64_t ticks[2] = {};
    Event* both[2] = {a, b};
    for (int i = 0; i < 2; ++i) {
      std::lock_guard<std::mutex> ek(both[i]->mu);
      if (both[i]->current == nullptr)
        return p.fail(WIA_ERROR_INVALID_ARGUMENT,
                      "event_elapsed_ms on Level Zero device %d: the %s event was never recorded",
                      a->device, i == 0 ? "start" : "end");
      const wia_ze_result_t r = p.rt.zeEventQueryStatus(both[i]->current->h);
      if (r != WIA_ZE_RESULT_SUCCESS)
        return p.fail_ze(r, a->device, "event_elapsed_ms: zeEventQueryStatus(%s event)",
                         i == 0 ? "start" : "end");
      ticks[i] = *both[i]->current->timestamp;
    }
    const Device& d = p.device(a->device);
    if (d.timer_hz == 0)
      return p.fail(WIA_ERROR_NOT_SUPPORTED,
                    "event_elapsed_ms on Level Zero device %d: the driver reports no timer "
                    "resolution",
                    a->device);
    // The counter wraps at timestampValidBits.
    const std::uint64_t delta = (ticks[1] - ticks[0]) & d.timestamp_mask;
    *ms = static_cast<float>(static_cast<double>(delta) * 1000.0 / static_cast<double>(d.timer_hz));
    return WIA_SUCCESS;
  });
}

// --------------------------------------------------------------------------
// reduce_async, staged through host memory

namespace {

struct StreamQueue {
  Provider& p;
  Stream& s;
  wia_status_t copy(void* dst, const void* src, std::size_t bytes, const char* what) {
    const wia_status_t st = append_copy(p, s, dst, src, bytes, "reduce_async");
    if (st != WIA_SUCCESS) p.log(WIA_LOG_DEBUG, "reduce_async: %s failed", what);
    return st;
  }
  wia_status_t host_fn(wia_host_fn_t fn, void* data, const char* what) {
    const wia_status_t st = append_host_fn(p, s, fn, data, "reduce_async");
    if (st != WIA_SUCCESS) p.log(WIA_LOG_DEBUG, "reduce_async: %s failed", what);
    return st;
  }
  void leak(std::size_t bytes) {
    p.log(WIA_LOG_WARN, "reduce_async on Level Zero device %d: %zu staging bytes leak", s.device,
          bytes);
  }
  wia_status_t no_staging_memory(std::size_t bytes) {
    return p.fail(WIA_ERROR_OUT_OF_MEMORY,
                  "reduce_async on Level Zero device %d: no host memory for %zu staging bytes",
                  s.device, bytes);
  }
};

}  // namespace

wia_status_t reduce_async(void* ctx, wia_provider_stream_t h,
                          const wia_reduce_args_v1_t* args) noexcept {
  return guarded(ctx, "reduce_async", [&](Provider& p) -> wia_status_t {
    Stream* s = p.find_stream(h, "reduce_async");
    if (s == nullptr) return WIA_ERROR_INVALID_HANDLE;
    if (args == nullptr)
      return p.fail(WIA_ERROR_INVALID_ARGUMENT,
                    "reduce_async on Level Zero device %d: args is NULL", s->device);
    if (const char* why = kernels::reduce_args_error(*args))
      return p.fail(WIA_ERROR_INVALID_ARGUMENT,
                    "reduce_async(%s %s, %u sources, %" PRIu64
                    " elements) on Level Zero device %d: %s",
                    kernels::dtype_name(args->dtype), kernels::reduce_op_name(args->op),
                    args->nsrcs, args->count, s->device, why);
    if (args->count == 0) return WIA_SUCCESS;
    StreamQueue q{p, *s};
    return common::enqueue_staged_reduce(*args, q);
  });
}

// --------------------------------------------------------------------------
// fini

void release_all_handles(Provider& p) noexcept {
  std::unique_lock<std::shared_mutex> lk(p.handles_mu);
  if (!p.streams.empty() || !p.events.empty())
    p.log(WIA_LOG_WARN, "fini: destroying %zu stream(s) and %zu event(s) never destroyed",
          p.streams.size(), p.events.size());
  for (const Stream* cs : p.streams) {
    auto* s = const_cast<Stream*>(cs);
    static_cast<void>(fence(p, *s, "fini"));
    stop_host_thread(*s);
    p.rt.zeCommandListDestroy(s->list);
    delete s;
  }
  p.streams.clear();
  for (const Event* e : p.events) delete e;  // their Level Zero events go with the pools
  p.events.clear();
}

}  // namespace wia::ze
