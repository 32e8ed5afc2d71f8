// SPDX-License-Identifier: Apache-2.0
// reduce_async of the `hip` provider, staged through host memory: no
// hipcc kernels are built (docs/provider-hip.md). On the caller's stream,
// in order: each source copied to a host staging block, a host function
// that reduces there with wia_cpu_kernels (the same code as the host
// provider and the core, so results are bit-identical), the result copied
// to dst, and a host function that frees the block. Correct on every
// device, and slow: two PCIe crossings per byte plus a CPU pass.
#include <cinttypes>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "hip_provider.hpp"
#include "kernels/cpu_reduce.hpp"

namespace wia::hip {

namespace {

// One reduction's host memory, owned by the stream's work from the moment
// the first copy is enqueued until free_staging runs. Plain malloc memory:
// the runtime's pinned memory could only be freed by a HIP call, which a
// host function may not make.
struct Staging {
  unsigned char* block = nullptr;  // nsrcs slots of `bytes`
  std::vector<const void*> srcs;
  wia_reduce_args_v1_t args{};
  ~Staging() { std::free(block); }
};

void run_reduce(void* data) {
  auto* st = static_cast<Staging*>(data);
  // Arguments were validated at enqueue; the result lands in slot 0.
  kernels::reduce_unchecked(st->args);
}

void free_staging(void* data) { delete static_cast<Staging*>(data); }

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
    const std::size_t bytes =
        static_cast<std::size_t>(args->count) * kernels::dtype_size(args->dtype);
    auto staging = std::make_unique<Staging>();
    staging->block = static_cast<unsigned char*>(std::malloc(bytes * args->nsrcs));
    if (staging->block == nullptr)
      return p.fail(WIA_ERROR_OUT_OF_MEMORY,
                    "reduce_async on HIP device %d: no host memory for %u x %zu staging bytes",
                    s->device, args->nsrcs, bytes);
    staging->srcs.resize(args->nsrcs);
    for (std::uint32_t i = 0; i < args->nsrcs; ++i) staging->srcs[i] = staging->block + i * bytes;
    staging->args = *args;
    staging->args.struct_size = sizeof(wia_reduce_args_v1_t);
    staging->args.dst = staging->block;  // in place over slot 0, which reduce allows
    staging->args.srcs = staging->srcs.data();

    for (std::uint32_t i = 0; i < args->nsrcs; ++i) {
      const wia_hipError_t r = p.rt.hipMemcpyAsync(staging->block + i * bytes, args->srcs[i], bytes,
                                                   WIA_hipMemcpyDefault, s->hip);
      if (r == WIA_hipSuccess) continue;
      // Copies already enqueued write into the block: it must outlive
      // them, so it is freed on the stream after them (or leaked when even
      // that cannot be enqueued, never freed early).
      if (i != 0) {
        if (p.rt.hipLaunchHostFunc(s->hip, free_staging, staging.get()) != WIA_hipSuccess)
          p.log(WIA_LOG_WARN, "reduce_async on HIP device %d: %zu staging bytes leak", s->device,
                bytes * args->nsrcs);
        static_cast<void>(staging.release());
      }
      return p.fail_hip(r, s->device,
                        "reduce_async: hipMemcpyAsync of source %u (%zu bytes) to host staging", i,
                        bytes);
    }
    wia_hipError_t r = p.rt.hipLaunchHostFunc(s->hip, run_reduce, staging.get());
    const char* failed = "hipLaunchHostFunc(reduce on the host)";
    if (r == WIA_hipSuccess) {
      r = p.rt.hipMemcpyAsync(args->dst, staging->block, bytes, WIA_hipMemcpyDefault, s->hip);
      failed = "hipMemcpyAsync of the result from host staging";
    }
    // The block is freed on the stream after everything that uses it, also
    // when an enqueue above failed (the copies before it still run).
    const wia_hipError_t freed = p.rt.hipLaunchHostFunc(s->hip, free_staging, staging.get());
    if (freed == WIA_hipSuccess)
      static_cast<void>(staging.release());
    else if (r == WIA_hipSuccess) {
      r = freed;
      failed = "hipLaunchHostFunc(free the host staging)";
      static_cast<void>(staging.release());  // enqueued work still uses it: leak, never free early
      p.log(WIA_LOG_WARN, "reduce_async on HIP device %d: %zu staging bytes leak", s->device,
            bytes * args->nsrcs);
    } else {
      static_cast<void>(staging.release());
    }
    if (r != WIA_hipSuccess)
      return p.fail_hip(r, s->device, "reduce_async(%s %s, %" PRIu64 " elements): %s",
                        kernels::dtype_name(args->dtype), kernels::reduce_op_name(args->op),
                        args->count, failed);
    return WIA_SUCCESS;
  });
}

}  // namespace wia::hip
