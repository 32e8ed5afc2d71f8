// SPDX-License-Identifier: Apache-2.0
// Element-wise work the spec's snippets call on a stream: wia_scale (6.4.1
// averages gradients with it). It runs as a host function on the stream,
// in order with the collectives before it, on memory the host can address
// (plain host memory, or device memory of a provider whose devices are
// host-accessible); on other devices it is the provider's scale_async
// kernel (WIA_DEVICE_CAP_SCALE), or NOT_SUPPORTED naming the device.
#include <fmt/format.h>
#include <wia/wia.h>

#include <cstdint>
#include <memory>

#include "api/guard.hpp"
#include "kernels/cpu_reduce.hpp"
#include "kernels/element_access.hpp"
#include "runtime/device_call.hpp"
#include "runtime/objects.hpp"
#include "runtime/runtime.hpp"

namespace wia::api {
namespace {

struct ScaleTask {
  void* buffer;
  double factor;
  std::size_t count;
  wia_datatype_t dtype;
};

void run_scale(void* arg) {
  std::unique_ptr<ScaleTask> t(static_cast<ScaleTask*>(arg));
  switch (t->dtype) {
    case WIA_FLOAT32: {
      auto* p = static_cast<float*>(t->buffer);
      const auto f = static_cast<float>(t->factor);
      for (std::size_t i = 0; i < t->count; ++i) p[i] *= f;
      return;
    }
    case WIA_FLOAT64: {
      auto* p = static_cast<double*>(t->buffer);
      for (std::size_t i = 0; i < t->count; ++i) p[i] *= t->factor;
      return;
    }
    default:  // half types (rounded once per element) and integers (truncated)
      for (std::size_t i = 0; i < t->count; ++i)
        kernels::store_element(t->buffer, i, t->dtype,
                               kernels::load_element(t->buffer, i, t->dtype) * t->factor);
  }
}

// Memory the core cannot address: the provider's own kernel, on the
// stream, which must belong to the same provider.
void scale_on_device(const Device& dev, void* buffer, double factor, std::size_t count,
                     wia_datatype_t dtype, wia_stream_t stream) {
  if (!(ops_of(dev).caps & WIA_DEVICE_CAP_SCALE))
    throw Error(WIA_ERROR_NOT_SUPPORTED,
                fmt::format("device {} ({}): its memory is not host-addressable and the "
                            "provider has no scale kernel (WIA_DEVICE_CAP_SCALE)",
                            dev.id, dev.provider->name()));
  wia_stream_s* s = resolve_stream(stream);
  const Device& sd = Runtime::get().device(s->device);
  // The kernel runs on the stream's device: it must be the memory's own
  // (a kernel of one GPU touching another's memory without peer access
  // is an illegal address, fatal to the whole context).
  if (sd.id != dev.id)
    throw Error(WIA_ERROR_INVALID_ARGUMENT,
                fmt::format("the memory is on device {} ({}), the stream on device {} ({}): "
                            "scale on a stream of the memory's device",
                            dev.id, dev.provider->name(), sd.id, sd.provider->name()));
  device_call(sd, "scale_async", [&](const wia_device_ops_v1_t& o, void* ctx) {
    return o.scale_async(ctx, s->ps, buffer, count, dtype, factor);
  });
}

void scale(void* buffer, double factor, std::size_t count, const wia_datatype_t& datatype,
           wia_stream_t stream) {
  const wia_datatype_t d = checked_enum(datatype, WIA_DATATYPE_COUNT, "datatype");
  if (count == 0) return;
  require_non_null(buffer, "buffer");
  Runtime::get();
  if (const auto a = objects().allocations.find(buffer)) {
    // In elements, so a huge count cannot wrap the end address.
    const std::uint64_t room =
        (a->base + a->size - reinterpret_cast<std::uintptr_t>(buffer)) / kernels::dtype_size(d);
    if (count > room)
      throw Error(WIA_ERROR_INVALID_ARGUMENT,
                  fmt::format("{} elements of {} at {} run past the end of its {}-byte allocation",
                              count, kernels::dtype_name(d), buffer, a->size));
    const Device& dev = Runtime::get().device(a->device);
    if (a->kind != WIA_MEM_HOST_PINNED && !(dev.props.flags & WIA_DEVICE_FLAG_HOST_ACCESSIBLE)) {
      scale_on_device(dev, buffer, factor, count, d, stream);
      return;
    }
  } else {
    // Not libwia's: the host path runs on the CPU, which must not touch
    // memory of a device the core cannot address (a cudaMalloc pointer,
    // say). Scaled on that device by its provider, or refused.
    const Device& sd = Runtime::get().device(resolve_stream(stream)->device);
    if (!(sd.props.flags & WIA_DEVICE_FLAG_HOST_ACCESSIBLE)) {
      scale_on_device(sd, buffer, factor, count, d, stream);
      return;
    }
  }
  auto* task = new ScaleTask{buffer, factor, count, d};
  const wia_status_t st = wia_launch_host_func(stream, run_scale, task);
  if (st != WIA_SUCCESS) {
    delete task;
    throw Error(st, wia_get_last_error());
  }
}

}  // namespace
}  // namespace wia::api

using namespace wia;

WIA_API wia_status_t wia_scale(void* buffer, double factor, size_t count, wia_stream_t stream) {
  return api::guard(__func__, [&] { api::scale(buffer, factor, count, WIA_FLOAT32, stream); });
}

WIA_API wia_status_t wia_scale_ex(void* buffer, double factor, size_t count,
                                  wia_datatype_t datatype, wia_stream_t stream) {
  return api::guard(__func__, [&] { api::scale(buffer, factor, count, datatype, stream); });
}
