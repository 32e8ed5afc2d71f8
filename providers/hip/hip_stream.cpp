// SPDX-License-Identifier: Apache-2.0
// Streams and events of the `hip` provider: thin, validated wrappers of
// hipStream_t / hipEvent_t, plus host functions, peer copies and the
// host-staged reduction on a stream.
#include <cinttypes>

#include "hip_provider.hpp"

namespace wia::hip {

// --------------------------------------------------------------------------
// Streams

wia_status_t stream_create(void* ctx, std::int32_t dev, wia_provider_stream_t* stream) noexcept {
  return guarded(ctx, "stream_create", [&](Provider& p) -> wia_status_t {
    if (stream == nullptr)
      return p.fail(WIA_ERROR_INVALID_ARGUMENT, "stream_create: stream is NULL");
    *stream = nullptr;
    if (const wia_status_t st = p.use_device(dev, "stream_create"); st != WIA_SUCCESS) return st;
    auto s = std::make_unique<Stream>();
    s->device = dev;
    // NonBlocking: never serialised with the null stream, which other
    // libraries of the process (and our sync memset/memcpy) use.
    const wia_hipError_t r = p.rt.hipStreamCreateWithFlags(&s->hip, WIA_hipStreamNonBlocking);
    if (r != WIA_hipSuccess) return p.fail_hip(r, dev, "hipStreamCreateWithFlags(NonBlocking)");
    try {
      std::unique_lock<std::shared_mutex> lk(p.handles_mu);
      p.streams.insert(s.get());
    } catch (...) {
      p.rt.hipStreamDestroy(s->hip);
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
                      "stream_destroy: %p is not a live stream of the hip provider",
                      static_cast<void*>(h));
      s.reset(raw);
    }
    if (const wia_status_t st = p.use_device(s->device, "stream_destroy"); st != WIA_SUCCESS)
      return st;
    // hipStreamDestroy returns at once and lets the work finish; the ABI
    // promises the work is done when destroy returns.
    const wia_hipError_t sync = p.rt.hipStreamSynchronize(s->hip);
    const wia_hipError_t r = p.rt.hipStreamDestroy(s->hip);
    if (sync != WIA_hipSuccess)
      return p.fail_hip(sync, s->device,
                        "stream_destroy: hipStreamSynchronize (work on the stream failed; the "
                        "stream is released)");
    if (r != WIA_hipSuccess) return p.fail_hip(r, s->device, "hipStreamDestroy");
    return WIA_SUCCESS;
  });
}

wia_status_t stream_synchronize(void* ctx, wia_provider_stream_t h) noexcept {
  return guarded(ctx, "stream_synchronize", [&](Provider& p) -> wia_status_t {
    Stream* s = p.find_stream(h, "stream_synchronize");
    if (s == nullptr) return WIA_ERROR_INVALID_HANDLE;
    if (const wia_status_t st = p.use_device(s->device, "stream_synchronize"); st != WIA_SUCCESS)
      return st;
    const wia_hipError_t r = p.rt.hipStreamSynchronize(s->hip);
    if (r != WIA_hipSuccess) return p.fail_hip(r, s->device, "hipStreamSynchronize");
    return WIA_SUCCESS;
  });
}

wia_status_t stream_query(void* ctx, wia_provider_stream_t h) noexcept {
  return guarded(ctx, "stream_query", [&](Provider& p) -> wia_status_t {
    Stream* s = p.find_stream(h, "stream_query");
    if (s == nullptr) return WIA_ERROR_INVALID_HANDLE;
    if (const wia_status_t st = p.use_device(s->device, "stream_query"); st != WIA_SUCCESS)
      return st;
    const wia_hipError_t r = p.rt.hipStreamQuery(s->hip);
    if (r == WIA_hipSuccess || r == WIA_hipErrorNotReady) return status_of(r);
    return p.fail_hip(r, s->device, "hipStreamQuery");
  });
}

wia_status_t memset_async(void* ctx, wia_provider_stream_t h, void* ptr, std::int32_t value,
                          std::uint64_t size) noexcept {
  return guarded(ctx, "memset_async", [&](Provider& p) -> wia_status_t {
    Stream* s = p.find_stream(h, "memset_async");
    if (s == nullptr) return WIA_ERROR_INVALID_HANDLE;
    if (size == 0) return WIA_SUCCESS;
    if (ptr == nullptr)
      return p.fail(WIA_ERROR_INVALID_ARGUMENT, "memset_async on HIP device %d: ptr is NULL",
                    s->device);
    if (const wia_status_t st = p.use_device(s->device, "memset_async"); st != WIA_SUCCESS)
      return st;
    const auto byte = static_cast<unsigned char>(value);
    const wia_hipError_t r = p.rt.hipMemsetAsync(ptr, byte, static_cast<std::size_t>(size), s->hip);
    if (r != WIA_hipSuccess)
      return p.fail_hip(r, s->device, "hipMemsetAsync(%p, 0x%02x, %" PRIu64 " bytes)", ptr, byte,
                        size);
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
      return p.fail(WIA_ERROR_INVALID_ARGUMENT, "memcpy_async on HIP device %d: %s is NULL",
                    s->device, dst == nullptr ? "dst" : "src");
    if (const wia_status_t st = p.use_device(s->device, "memcpy_async"); st != WIA_SUCCESS)
      return st;
    const wia_hipError_t r =
        p.rt.hipMemcpyAsync(dst, src, static_cast<std::size_t>(size), WIA_hipMemcpyDefault, s->hip);
    if (r != WIA_hipSuccess)
      return p.fail_hip(r, s->device, "hipMemcpyAsync(%p <- %p, %" PRIu64 " bytes)", dst, src,
                        size);
    return WIA_SUCCESS;
  });
}

wia_status_t launch_host_func(void* ctx, wia_provider_stream_t h, wia_host_fn_t fn,
                              void* user_data) noexcept {
  return guarded(ctx, "launch_host_func", [&](Provider& p) -> wia_status_t {
    Stream* s = p.find_stream(h, "launch_host_func");
    if (s == nullptr) return WIA_ERROR_INVALID_HANDLE;
    if (fn == nullptr)
      return p.fail(WIA_ERROR_INVALID_ARGUMENT, "launch_host_func on HIP device %d: fn is NULL",
                    s->device);
    if (const wia_status_t st = p.use_device(s->device, "launch_host_func"); st != WIA_SUCCESS)
      return st;
    // Same signature as hipHostFn_t; the runtime runs it on its own thread with
    // the ordering the ABI asks for.
    const wia_hipError_t r = p.rt.enqueue_host_fn(s->hip, fn, user_data);
    if (r != WIA_hipSuccess) return p.fail_hip(r, s->device, "%s", p.rt.host_fn_entry());
    return WIA_SUCCESS;
  });
}

wia_status_t memcpy_peer_async(void* ctx, wia_provider_stream_t h, void* dst, std::int32_t dst_dev,
                               const void* src, std::int32_t src_dev, std::uint64_t size) noexcept {
  return guarded(ctx, "memcpy_peer_async", [&](Provider& p) -> wia_status_t {
    Stream* s = p.find_stream(h, "memcpy_peer_async");
    if (s == nullptr) return WIA_ERROR_INVALID_HANDLE;
    if (s->device != dst_dev && s->device != src_dev)
      return p.fail(WIA_ERROR_INVALID_ARGUMENT,
                    "memcpy_peer_async %d -> %d: the stream belongs to HIP device %d, neither "
                    "end of the copy",
                    src_dev, dst_dev, s->device);
    if (const wia_status_t st = p.check_device(dst_dev, "memcpy_peer_async"); st != WIA_SUCCESS)
      return st;
    if (const wia_status_t st = p.check_device(src_dev, "memcpy_peer_async"); st != WIA_SUCCESS)
      return st;
    if (size == 0) return WIA_SUCCESS;
    if (dst == nullptr || src == nullptr)
      return p.fail(WIA_ERROR_INVALID_ARGUMENT, "memcpy_peer_async %d -> %d: %s is NULL", src_dev,
                    dst_dev, dst == nullptr ? "dst" : "src");
    if (const wia_status_t st = p.use_device(s->device, "memcpy_peer_async"); st != WIA_SUCCESS)
      return st;
    // HIP names devices by ordinal (no contexts): direct over xGMI/PCIe
    // when peer access is enabled, staged by the runtime otherwise.
    const wia_hipError_t r =
        p.rt.hipMemcpyPeerAsync(dst, dst_dev, src, src_dev, static_cast<std::size_t>(size), s->hip);
    if (r != WIA_hipSuccess)
      return p.fail_hip(r, s->device,
                        "hipMemcpyPeerAsync(%p on device %d <- %p on device %d, %" PRIu64 " bytes)",
                        dst, dst_dev, src, src_dev, size);
    return WIA_SUCCESS;
  });
}

// --------------------------------------------------------------------------
// Events

wia_status_t event_create(void* ctx, std::int32_t dev, wia_provider_event_t* event) noexcept {
  return guarded(ctx, "event_create", [&](Provider& p) -> wia_status_t {
    if (event == nullptr) return p.fail(WIA_ERROR_INVALID_ARGUMENT, "event_create: event is NULL");
    *event = nullptr;
    if (const wia_status_t st = p.use_device(dev, "event_create"); st != WIA_SUCCESS) return st;
    auto e = std::make_unique<Event>();
    e->device = dev;
    // DEFAULT, not DISABLE_TIMING: event_elapsed_ms is offered (the cost
    // of a timestamp is small next to anything worth an event).
    const wia_hipError_t r = p.rt.hipEventCreateWithFlags(&e->hip, WIA_hipEventDefault);
    if (r != WIA_hipSuccess) return p.fail_hip(r, dev, "hipEventCreateWithFlags(Default)");
    try {
      std::unique_lock<std::shared_mutex> lk(p.handles_mu);
      p.events.insert(e.get());
    } catch (...) {
      p.rt.hipEventDestroy(e->hip);
      throw;
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
                      "event_destroy: %p is not a live event of the hip provider",
                      static_cast<void*>(h));
      e.reset(raw);
    }
    if (const wia_status_t st = p.use_device(e->device, "event_destroy"); st != WIA_SUCCESS)
      return st;
    const wia_hipError_t r = p.rt.hipEventDestroy(e->hip);
    if (r != WIA_hipSuccess) return p.fail_hip(r, e->device, "hipEventDestroy");
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
                    "event_record: the event belongs to HIP device %d, the stream to device %d",
                    e->device, s->device);
    if (const wia_status_t st = p.use_device(s->device, "event_record"); st != WIA_SUCCESS)
      return st;
    const wia_hipError_t r = p.rt.hipEventRecord(e->hip, s->hip);
    if (r != WIA_hipSuccess) return p.fail_hip(r, s->device, "hipEventRecord");
    e->recorded.store(true, std::memory_order_release);
    return WIA_SUCCESS;
  });
}

wia_status_t event_query(void* ctx, wia_provider_event_t h) noexcept {
  return guarded(ctx, "event_query", [&](Provider& p) -> wia_status_t {
    Event* e = p.find_event(h, "event_query");
    if (e == nullptr) return WIA_ERROR_INVALID_HANDLE;
    if (!e->recorded.load(std::memory_order_acquire)) return WIA_SUCCESS;
    if (const wia_status_t st = p.use_device(e->device, "event_query"); st != WIA_SUCCESS)
      return st;
    const wia_hipError_t r = p.rt.hipEventQuery(e->hip);
    if (r == WIA_hipSuccess || r == WIA_hipErrorNotReady) return status_of(r);
    return p.fail_hip(r, e->device, "hipEventQuery");
  });
}

wia_status_t event_synchronize(void* ctx, wia_provider_event_t h) noexcept {
  return guarded(ctx, "event_synchronize", [&](Provider& p) -> wia_status_t {
    Event* e = p.find_event(h, "event_synchronize");
    if (e == nullptr) return WIA_ERROR_INVALID_HANDLE;
    if (!e->recorded.load(std::memory_order_acquire)) return WIA_SUCCESS;
    if (const wia_status_t st = p.use_device(e->device, "event_synchronize"); st != WIA_SUCCESS)
      return st;
    const wia_hipError_t r = p.rt.hipEventSynchronize(e->hip);
    if (r != WIA_hipSuccess) return p.fail_hip(r, e->device, "hipEventSynchronize");
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
    if (!e->recorded.load(std::memory_order_acquire)) return WIA_SUCCESS;  // nothing to wait for
    if (const wia_status_t st = p.use_device(s->device, "stream_wait_event"); st != WIA_SUCCESS)
      return st;
    // An event of another device is fine: the runtime orders across GPUs.
    const wia_hipError_t r = p.rt.hipStreamWaitEvent(s->hip, e->hip, 0);
    if (r != WIA_hipSuccess)
      return p.fail_hip(r, s->device, "hipStreamWaitEvent(event of device %d)", e->device);
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
                    "event_elapsed_ms: events of HIP devices %d and %d (timing needs one device)",
                    a->device, b->device);
    if (!a->recorded.load() || !b->recorded.load())
      return p.fail(WIA_ERROR_INVALID_ARGUMENT,
                    "event_elapsed_ms on HIP device %d: the %s event was never recorded", a->device,
                    a->recorded.load() ? "end" : "start");
    if (const wia_status_t st = p.use_device(a->device, "event_elapsed_ms"); st != WIA_SUCCESS)
      return st;
    const wia_hipError_t r = p.rt.hipEventElapsedTime(ms, a->hip, b->hip);
    if (r != WIA_hipSuccess) return p.fail_hip(r, a->device, "hipEventElapsedTime");
    return WIA_SUCCESS;
  });
}

// --------------------------------------------------------------------------
// fini

void release_all_handles(Provider& p) noexcept {
  std::unique_lock<std::shared_mutex> lk(p.handles_mu);
  if (!p.streams.empty() || !p.events.empty())
    p.log(WIA_LOG_WARN, "fini: destroying %zu stream(s) and %zu event(s) never destroyed",
          p.streams.size(), p.events.size());
  for (const Stream* s : p.streams) {
    if (p.rt.hipSetDevice(s->device) == WIA_hipSuccess) {
      p.rt.hipStreamSynchronize(s->hip);
      p.rt.hipStreamDestroy(s->hip);
    }
    delete s;
  }
  p.streams.clear();
  for (const Event* e : p.events) {
    if (p.rt.hipSetDevice(e->device) == WIA_hipSuccess) p.rt.hipEventDestroy(e->hip);
    delete e;
  }
  p.events.clear();
}

}  // namespace wia::hip
