// SPDX-License-Identifier: Apache-2.0
// Streams, events and host functions.
#include <wia/wia.h>

#include <exception>
#include <memory>

#include <fmt/format.h>

#include "api/guard.hpp"
#include "runtime/device_call.hpp"
#include "runtime/objects.hpp"

using namespace wia;

namespace {

wia_stream_t create_stream(wia_device_t device) {
  const Device& d = Runtime::get().device(device);
  auto s = std::make_unique<wia_stream_s>();
  s->device = device;
  device_call(d, "stream_create", [&](const wia_device_ops_v1_t& o, void* ctx) {
    return o.stream_create(ctx, d.local_index, &s->ps);
  });
  objects().streams.add(s.get());
  return s.release();
}

wia_event_s* live_event(wia_event_t event) {
  api::require_non_null(event, "event");
  if (!objects().events.contains(event))
    throw Error(WIA_ERROR_INVALID_HANDLE,
                fmt::format("event {} is not a live libwia event (destroyed, or never created)",
                            static_cast<const void*>(event)));
  return event;
}

// Bind the event to the stream's device, re-creating it on a change.
void bind_event(wia_event_s* e, const Device& d) {
  if (e->pe && e->device == d.id) return;
  if (e->pe) {
    const Device& old = Runtime::get().device(e->device);
    device_call(old, "event_destroy",
                [&](const wia_device_ops_v1_t& o, void* ctx) { return o.event_destroy(ctx, e->pe); });
    e->pe = nullptr;
  }
  device_call(d, "event_create", [&](const wia_device_ops_v1_t& o, void* ctx) {
    return o.event_create(ctx, d.local_index, &e->pe);
  });
  e->device = d.id;
}

void record(wia_event_s* e, wia_stream_s* s) {
  const Device& d = Runtime::get().device(s->device);
  bind_event(e, d);
  device_call(d, "event_record",
              [&](const wia_device_ops_v1_t& o, void* ctx) { return o.event_record(ctx, e->pe, s->ps); });
}

void wait_event(wia_stream_s* s, wia_event_s* e) {
  if (!e->pe) return;  // never recorded: nothing to wait for
  const Device& sd = Runtime::get().device(s->device);
  const Device& ed = Runtime::get().device(e->device);
  if (sd.provider == ed.provider) {
    device_call(sd, "stream_wait_event", [&](const wia_device_ops_v1_t& o, void* ctx) {
      return o.stream_wait_event(ctx, s->ps, e->pe);
    });
    return;
  }
  // Different providers cannot wait on each other's events: block the
  // host until the event completes, which orders everything after it.
  device_call(ed, "event_synchronize",
              [&](const wia_device_ops_v1_t& o, void* ctx) { return o.event_synchronize(ctx, e->pe); });
}

}  // namespace

extern "C" {

WIA_API wia_status_t wia_create_stream(wia_stream_t* stream) {
  return api::guard(__func__, [&] {
    api::require_non_null(stream, "stream");
    *stream = create_stream(current_device());
  });
}

WIA_API wia_status_t wia_create_stream_on(wia_device_t device, wia_stream_t* stream) {
  return api::guard(__func__, [&] {
    api::require_non_null(stream, "stream");
    *stream = create_stream(device);
  });
}

WIA_API wia_status_t wia_destroy_stream(wia_stream_t stream) {
  return api::guard(__func__, [&] {
    api::require_non_null(stream, "stream");
    if (!objects().streams.remove(stream))
      throw Error(WIA_ERROR_INVALID_HANDLE,
                  fmt::format("stream {} is not a live libwia stream (already destroyed?)",
                              static_cast<const void*>(stream)));
    std::unique_ptr<wia_stream_s> owned(stream);
    const Device& d = Runtime::get().device(stream->device);
    // Release the stream even when its work failed, then report the failure.
    std::exception_ptr pending;
    try {
      device_call(d, "stream_synchronize", [&](const wia_device_ops_v1_t& o, void* ctx) {
        return o.stream_synchronize(ctx, stream->ps);
      });
    } catch (...) {
      pending = std::current_exception();
    }
    if (stream->staging) ops_of(d).mem_free(d.provider->ctx(), d.local_index, stream->staging);
    device_call(d, "stream_destroy",
                [&](const wia_device_ops_v1_t& o, void* ctx) { return o.stream_destroy(ctx, stream->ps); });
    if (pending) std::rethrow_exception(pending);
  });
}

WIA_API wia_status_t wia_stream_get_device(wia_stream_t stream, wia_device_t* device) {
  return api::guard(__func__, [&] {
    api::require_non_null(device, "device");
    *device = resolve_stream(stream)->device;
  });
}

WIA_API wia_status_t wia_stream_synchronize(wia_stream_t stream) {
  return api::guard(__func__, [&] {
    wia_stream_s* s = resolve_stream(stream);
    const Device& d = Runtime::get().device(s->device);
    device_call(d, "stream_synchronize",
                [&](const wia_device_ops_v1_t& o, void* ctx) { return o.stream_synchronize(ctx, s->ps); });
    std::string message;
    const wia_status_t st = s->take_async_error(&message);
    if (st != WIA_SUCCESS) throw Error(st, message);
  });
}

WIA_API wia_status_t wia_stream_query(wia_stream_t stream) {
  return api::guard(__func__, [&] {
    wia_stream_s* s = resolve_stream(stream);
    const Device& d = Runtime::get().device(s->device);
    return device_call(d, "stream_query",
                       [&](const wia_device_ops_v1_t& o, void* ctx) { return o.stream_query(ctx, s->ps); });
  });
}

WIA_API wia_status_t wia_stream_wait_event(wia_stream_t stream, wia_event_t event) {
  return api::guard(__func__, [&] { wait_event(resolve_stream(stream), live_event(event)); });
}

WIA_API wia_status_t wia_stream_wait_stream(wia_stream_t waiting, wia_stream_t waited) {
  return api::guard(__func__, [&] {
    wia_stream_s* a = resolve_stream(waiting);
    wia_stream_s* b = resolve_stream(waited);
    if (a == b) return;
    // A private event per call: recorded on `waited`, waited on by
    // `waiting`, then released (providers keep the capture alive).
    wia_event_s e;
    try {
      record(&e, b);
      wait_event(a, &e);
    } catch (...) {
      if (e.pe) {
        const Device& d = Runtime::get().device(e.device);
        ops_of(d).event_destroy(d.provider->ctx(), e.pe);
      }
      throw;
    }
    const Device& d = Runtime::get().device(e.device);
    device_call(d, "event_destroy",
                [&](const wia_device_ops_v1_t& o, void* ctx) { return o.event_destroy(ctx, e.pe); });
  });
}

WIA_API wia_status_t wia_create_event(wia_event_t* event) {
  return api::guard(__func__, [&] {
    api::require_non_null(event, "event");
    Runtime::get();
    auto e = std::make_unique<wia_event_s>();
    objects().events.add(e.get());
    *event = e.release();
  });
}

WIA_API wia_status_t wia_destroy_event(wia_event_t event) {
  return api::guard(__func__, [&] {
    api::require_non_null(event, "event");
    if (!objects().events.remove(event))
      throw Error(WIA_ERROR_INVALID_HANDLE,
                  fmt::format("event {} is not a live libwia event (already destroyed?)",
                              static_cast<const void*>(event)));
    std::unique_ptr<wia_event_s> owned(event);
    if (event->pe) {
      const Device& d = Runtime::get().device(event->device);
      device_call(d, "event_destroy",
                  [&](const wia_device_ops_v1_t& o, void* ctx) { return o.event_destroy(ctx, event->pe); });
    }
  });
}

WIA_API wia_status_t wia_event_record(wia_event_t event, wia_stream_t stream) {
  return api::guard(__func__, [&] { record(live_event(event), resolve_stream(stream)); });
}

WIA_API wia_status_t wia_event_query(wia_event_t event) {
  return api::guard(__func__, [&] {
    wia_event_s* e = live_event(event);
    if (!e->pe) return static_cast<wia_status_t>(WIA_SUCCESS);
    const Device& d = Runtime::get().device(e->device);
    return device_call(d, "event_query",
                       [&](const wia_device_ops_v1_t& o, void* ctx) { return o.event_query(ctx, e->pe); });
  });
}

WIA_API wia_status_t wia_event_synchronize(wia_event_t event) {
  return api::guard(__func__, [&] {
    wia_event_s* e = live_event(event);
    if (!e->pe) return;
    const Device& d = Runtime::get().device(e->device);
    device_call(d, "event_synchronize",
                [&](const wia_device_ops_v1_t& o, void* ctx) { return o.event_synchronize(ctx, e->pe); });
  });
}

WIA_API wia_status_t wia_event_elapsed_time(float* ms, wia_event_t start, wia_event_t end) {
  return api::guard(__func__, [&] {
    api::require_non_null(ms, "ms");
    wia_event_s* a = live_event(start);
    wia_event_s* b = live_event(end);
    if (!a->pe || !b->pe)
      throw Error(WIA_ERROR_INVALID_ARGUMENT, "both events must have been recorded");
    if (a->device != b->device)
      throw Error(WIA_ERROR_INVALID_ARGUMENT,
                  fmt::format("events were recorded on different devices ({} and {})", a->device,
                              b->device));
    const Device& d = Runtime::get().device(a->device);
    if (!(ops_of(d).caps & WIA_DEVICE_CAP_EVENT_TIMING))
      throw Error(WIA_ERROR_NOT_SUPPORTED,
                  fmt::format("provider {} does not time events", d.provider->name()));
    device_call(d, "event_elapsed_ms", [&](const wia_device_ops_v1_t& o, void* ctx) {
      return o.event_elapsed_ms(ctx, a->pe, b->pe, ms);
    });
  });
}

WIA_API wia_status_t wia_launch_host_func(wia_stream_t stream, wia_host_fn_t fn, void* user_data) {
  return api::guard(__func__, [&] {
    api::require_non_null(reinterpret_cast<const void*>(fn), "fn");
    wia_stream_s* s = resolve_stream(stream);
    const Device& d = Runtime::get().device(s->device);
    if (!(ops_of(d).caps & WIA_DEVICE_CAP_HOST_FUNC))
      throw Error(WIA_ERROR_NOT_SUPPORTED,
                  fmt::format("provider {} cannot run host functions on a stream",
                              d.provider->name()));
    // While a communicator profiles, host functions are compute: timed.
    const bool timed = api::profile_host_fn(s->device, s->track(), &fn, &user_data);
    try {
      device_call(d, "launch_host_func", [&](const wia_device_ops_v1_t& o, void* ctx) {
        return o.launch_host_func(ctx, s->ps, fn, user_data);
      });
    } catch (...) {
      if (timed) api::discard_profiled_host_fn(user_data);
      throw;
    }
  });
}

}  // extern "C"
