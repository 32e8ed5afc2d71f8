/* SPDX-License-Identifier: Apache-2.0 */
/*
 * device_kernel_params.h - the parameter blocks of the cuda provider's own
 * device kernels (kernels/reduce.cu, scale.cu), shared by the kernels, the
 * provider that launches them and the driver test double
 * (tests/providers/fake-cuda), which recognises the kernels by name and runs
 * a CPU equivalent.
 *
 * Each kernel takes ONE parameter: its block, by value (kernelParams[0]
 * points at it). Plain C so that nvcc, g++ and the double agree on layout.
 */
#ifndef WIA_CUDA_DEVICE_KERNEL_PARAMS_H
#define WIA_CUDA_DEVICE_KERNEL_PARAMS_H

#include <stdint.h>

/* Sources one reduce launch reads; a reduction of more sources is a chain
 * of launches, each folding up to this many more into dst. */
#define WIA_CUDA_REDUCE_MAX_SRCS 8

/* Kernel "wia_reduce_<dtype>_<op>" (names from kernel_names in
 * cuda_kernels.cpp, e.g. wia_reduce_float32_sum):
 *   dst[i] = srcs[0][i] op ... op srcs[nsrcs-1][i], then / divisor when > 1.
 * dst may alias srcs[0]. Elements [0, count). */
typedef struct wia_cuda_reduce_params {
  void* dst;
  const void* srcs[WIA_CUDA_REDUCE_MAX_SRCS];
  uint32_t nsrcs;
  uint32_t pad;
  uint64_t count;
  uint64_t divisor; /* 0 or 1: none */
} wia_cuda_reduce_params_t;

/* Kernel "wia_scale_<dtype>": buf[i] = buf[i] * factor, exactly as the
 * core's host path (core/src/api/api_compute.cpp) computes it: float32 in
 * float; every other type in double, then stored as the host kernels'
 * store_element does (integers truncate toward zero through int64 and wrap
 * to their width; float16/bfloat16 round once from float). */
typedef struct wia_cuda_scale_params {
  void* buf;
  uint64_t count;
  double factor;
} wia_cuda_scale_params_t;

#endif /* WIA_CUDA_DEVICE_KERNEL_PARAMS_H */
