// SPDX-License-Identifier: Apache-2.0
// reduce_async staged through host memory, for accelerator providers
// without device reduction kernels (hip without hipcc kernels, ze without
// SPIR-V kernels). On the caller's stream, in order: each source copied to a
// host staging block, a host function that reduces there with
// wia_cpu_kernels (the same code as the host provider and the core, so
// results are bit-identical), the result copied to dst, and a host
// function that frees the block.
//
// Header-only: a provider that includes it links wia_cpu_kernels (it
// already does for its argument checks). The provider says how to enqueue
// on its stream through `Queue`:
//   wia_status_t copy(void* dst, const void* src, std::size_t bytes, const char* what);
//   wia_status_t host_fn(wia_host_fn_t fn, void* data, const char* what);
//   void leak(std::size_t bytes);  // a warning: staging that can never be freed
//   wia_status_t no_staging_memory(std::size_t bytes);  // malloc failed
// Each sets the error message itself and returns the status to return.
#pragma once

#include <wia/provider.h>

#include <cstdlib>
#include <memory>
#include <vector>

#include "kernels/cpu_reduce.hpp"

namespace wia::common {

namespace staged_detail {

// One reduction's host memory, owned by the stream's work from the moment
// the first copy is enqueued until free_staging runs. Plain malloc memory:
// a vendor's pinned memory could only be freed by a vendor call, which a
// host function may not make.
struct Staging {
  unsigned char* block = nullptr;  // nsrcs slots of `bytes`
  std::vector<const void*> srcs;
  wia_reduce_args_v1_t args{};
  ~Staging() { std::free(block); }
};

inline void run_reduce(void* data) {
  // Arguments were validated at enqueue; the result lands in slot 0.
  kernels::reduce_unchecked(static_cast<Staging*>(data)->args);
}

inline void free_staging(void* data) { delete static_cast<Staging*>(data); }

}  // namespace staged_detail

// `args` must have passed kernels::reduce_args_error and have count > 0.
template <class Queue>
wia_status_t enqueue_staged_reduce(const wia_reduce_args_v1_t& args, Queue& q) {
  using staged_detail::Staging;
  const std::size_t bytes = static_cast<std::size_t>(args.count) * kernels::dtype_size(args.dtype);
  auto staging = std::make_unique<Staging>();
  staging->block = static_cast<unsigned char*>(std::malloc(bytes * args.nsrcs));
  if (staging->block == nullptr) return q.no_staging_memory(bytes * args.nsrcs);
  staging->srcs.resize(args.nsrcs);
  for (std::uint32_t i = 0; i < args.nsrcs; ++i) staging->srcs[i] = staging->block + i * bytes;
  staging->args = args;
  staging->args.struct_size = sizeof(wia_reduce_args_v1_t);
  staging->args.dst = staging->block;  // in place over slot 0, which reduce allows
  staging->args.srcs = staging->srcs.data();

  for (std::uint32_t i = 0; i < args.nsrcs; ++i) {
    const wia_status_t st =
        q.copy(staging->block + i * bytes, args.srcs[i], bytes, "copy of a source to host staging");
    if (st == WIA_SUCCESS) continue;
    // Copies already enqueued write into the block: it must outlive them,
    // so it is freed on the stream after them (or leaked when even that
    // cannot be enqueued, never freed early).
    if (i != 0) {
      if (q.host_fn(staged_detail::free_staging, staging.get(), "free the host staging") !=
          WIA_SUCCESS)
        q.leak(bytes * args.nsrcs);
      static_cast<void>(staging.release());
    }
    return st;
  }
  wia_status_t st = q.host_fn(staged_detail::run_reduce, staging.get(), "reduce on the host");
  if (st == WIA_SUCCESS)
    st = q.copy(args.dst, staging->block, bytes, "copy of the result from host staging");
  // The block is freed on the stream after everything that uses it, also
  // when an enqueue above failed (the copies before it still run).
  const wia_status_t freed =
      q.host_fn(staged_detail::free_staging, staging.get(), "free the host staging");
  if (freed != WIA_SUCCESS) q.leak(bytes * args.nsrcs);  // enqueued work still uses it
  static_cast<void>(staging.release());
  return st != WIA_SUCCESS ? st : freed;
}

}  // namespace wia::common
