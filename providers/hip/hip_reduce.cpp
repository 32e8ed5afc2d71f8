// SPDX-License-Identifier: Apache-2.0
// reduce_async of the `hip` provider, staged through host memory: no
// hipcc kernels are built (docs/provider-hip.md). The staging itself
// (copies to a host block, a host function reducing with wia_cpu_kernels,
// the copy back, a host function freeing the block) is
// wia_common/staged_reduce.hpp, shared with the ze provider; this file says
// how to enqueue on a HIP stream. Correct on every device, and slow: two
// PCIe crossings per byte plus a CPU pass.
#include <cinttypes>

#include "hip_provider.hpp"
#include "kernels/cpu_reduce.hpp"
#include "wia_common/staged_reduce.hpp"

namespace wia::hip {

namespace {

// hipMemcpyAsync and host functions on one stream, for
// common::enqueue_staged_reduce.
struct StreamQueue {
  Provider& p;
  const Stream& s;
  wia_status_t copy(void* dst, const void* src, std::size_t bytes, const char* what) {
    const wia_hipError_t r = p.rt.hipMemcpyAsync(dst, src, bytes, WIA_hipMemcpyDefault, s.hip);
    if (r == WIA_hipSuccess) return WIA_SUCCESS;
    return p.fail_hip(r, s.device, "reduce_async: hipMemcpyAsync (%s, %zu bytes)", what, bytes);
  }
  wia_status_t host_fn(wia_host_fn_t fn, void* data, const char* what) {
    const wia_hipError_t r = p.rt.enqueue_host_fn(s.hip, fn, data);
    if (r == WIA_hipSuccess) return WIA_SUCCESS;
    return p.fail_hip(r, s.device, "reduce_async: %s(%s)", p.rt.host_fn_entry(), what);
  }
  void leak(std::size_t bytes) {
    p.log(WIA_LOG_WARN, "reduce_async on HIP device %d: %zu staging bytes leak", s.device, bytes);
  }
  wia_status_t no_staging_memory(std::size_t bytes) {
    return p.fail(WIA_ERROR_OUT_OF_MEMORY,
                  "reduce_async on HIP device %d: no host memory for %zu staging bytes", s.device,
                  bytes);
  }
};

}  // namespace

wia_status_t reduce_async(void* ctx, wia_provider_stream_t h,
                          const wia_reduce_args_v1_t* args) noexcept {
  return guarded(ctx, "reduce_async", [&](Provider& p) -> wia_status_t {
    Stream* s = p.find_stream(h, "reduce_async");
    if (s == nullptr) return WIA_ERROR_INVALID_HANDLE;
    if (args == nullptr)
      return p.fail(WIA_ERROR_INVALID_ARGUMENT, "reduce_async on HIP device %d: args is NULL",
                    s->device);
    if (const char* why = kernels::reduce_args_error(*args))
      return p.fail(WIA_ERROR_INVALID_ARGUMENT,
                    "reduce_async(%s %s, %u sources, %" PRIu64 " elements) on HIP device %d: %s",
                    kernels::dtype_name(args->dtype), kernels::reduce_op_name(args->op),
                    args->nsrcs, args->count, s->device, why);
    if (args->count == 0) return WIA_SUCCESS;
    if (const wia_status_t st = p.use_device(s->device, "reduce_async"); st != WIA_SUCCESS)
      return st;
    StreamQueue q{p, *s};
    return common::enqueue_staged_reduce(*args, q);
  });
}

}  // namespace wia::hip
