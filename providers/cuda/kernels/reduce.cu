// SPDX-License-Identifier: Apache-2.0
// wia_reduce_<dtype>_<op>: dst[i] = srcs[0][i] op ... op srcs[nsrcs-1][i],
// then / divisor when > 1, for every dtype and op of the CPU kernels
// (core/kernels), with the same results: integers wrap and divide
// truncating, float16/bfloat16 compute in float and round once, float
// MIN/MAX propagate NaN.
//
// Memory bound by design: each thread moves 16-byte vectors (when every
// pointer is 16-byte aligned) in a grid-stride loop, with the loads of all
// sources of one vector issued before any is combined, so each thread has
// up to 8 independent 16-byte loads in flight. __launch_bounds__(256, 4)
// keeps every kernel at <= 64 registers, so 4 blocks (1024 threads) stay
// resident per SM: on an H200 a 2-source float32 reduce of 64 MiB then runs
// at the speed of a device-to-device copy.
#include <type_traits>

#include "device_kernel_params.h"
#include "element_types.cuh"

namespace wia_cuda {

// Integer SUM/PROD in the unsigned type of the same width: wraps modulo
// 2^bits without the undefined behaviour of signed overflow.
template <class T>
__device__ __forceinline__ T wrap_add(T a, T b) {
  if constexpr (std::is_integral_v<T>) {
    using U = std::make_unsigned_t<T>;
    return static_cast<T>(static_cast<U>(static_cast<U>(a) + static_cast<U>(b)));
  } else {
    return a + b;
  }
}
template <class T>
__device__ __forceinline__ T wrap_mul(T a, T b) {
  if constexpr (std::is_integral_v<T>) {
    using U = std::make_unsigned_t<T>;
    // 8-bit values promote to int: 255 * 255 fits, the cast wraps.
    return static_cast<T>(static_cast<U>(static_cast<U>(a) * static_cast<U>(b)));
  } else {
    return a * b;
  }
}

struct Sum {
  template <class T>
  static __device__ __forceinline__ T apply(T a, T b) { return wrap_add(a, b); }
};
struct Prod {
  template <class T>
  static __device__ __forceinline__ T apply(T a, T b) { return wrap_mul(a, b); }
};
// Float MIN/MAX: a NaN on either side gives NaN (fminf would drop it).
struct Min {
  template <class T>
  static __device__ __forceinline__ T apply(T a, T b) {
    const T r = a < b ? a : b;  // b when either is NaN
    return a != a ? a : r;
  }
};
struct Max {
  template <class T>
  static __device__ __forceinline__ T apply(T a, T b) {
    const T r = a > b ? a : b;  // b when either is NaN
    return a != a ? a : r;
  }
};

// x / q with q >= 2: a true division for floats (correctly rounded, as
// the CPU kernels), truncation toward zero for integers.
template <class T>
__device__ __forceinline__ T divide(T x, uint64_t q) {
  if constexpr (std::is_floating_point_v<T>) {
    return x / static_cast<T>(q);
  } else if constexpr (std::is_unsigned_v<T>) {
    return static_cast<T>(x / q);
  } else if constexpr (sizeof(T) < sizeof(int64_t)) {
    const int64_t qs = q > static_cast<uint64_t>(INT64_MAX) ? INT64_MAX : static_cast<int64_t>(q);
    return static_cast<T>(static_cast<int64_t>(x) / qs);
  } else {
    // |x| <= 2^63 <= q: 0, except INT64_MIN / 2^63 = -1.
    if (q > static_cast<uint64_t>(INT64_MAX))
      return (x == INT64_MIN && q == (uint64_t{1} << 63)) ? -1 : 0;
    return x / static_cast<int64_t>(q);
  }
}

template <class Tag, class Op>
__device__ __forceinline__ void reduce(const wia_cuda_reduce_params_t& p) {
  using A = typename Element<Tag>::A;
  constexpr int kN = kPerVector<Tag>;
  const uint32_t nsrcs = p.nsrcs;
  const uint64_t count = p.count;
  const uint64_t divisor = p.divisor;
  const uint64_t stride = static_cast<uint64_t>(gridDim.x) * blockDim.x;
  const uint64_t first = static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x;

  bool vectors_ok = aligned16(p.dst);
#pragma unroll
  for (int s = 0; s < WIA_CUDA_REDUCE_MAX_SRCS; ++s)
    if (s < nsrcs) vectors_ok = vectors_ok && aligned16(p.srcs[s]);
  const uint64_t vectors = vectors_ok ? count / kN : 0;

  for (uint64_t v = first; v < vectors; v += stride) {
    // Every source's 16 bytes are loaded before the first is combined, and
    // kept as raw bits (4 registers each whatever the dtype): as many loads
    // in flight as sources, without the register cost of converting them
    // all at once (which would halve the resident threads for 16-bit and
    // 8-bit types). Unrolled with constant indices, so the parameter block
    // stays in the constant bank.
    uint4 raw[WIA_CUDA_REDUCE_MAX_SRCS];
#pragma unroll
    for (int s = 0; s < WIA_CUDA_REDUCE_MAX_SRCS; ++s)
      if (s < nsrcs) raw[s] = load_bits(p.srcs[s], v);
    A acc[kN];
    unpack<Tag>(raw[0], acc);
#pragma unroll
    for (int s = 1; s < WIA_CUDA_REDUCE_MAX_SRCS; ++s)
      if (s < nsrcs) {
        A in[kN];
        unpack<Tag>(raw[s], in);
#pragma unroll
        for (int i = 0; i < kN; ++i) acc[i] = Op::apply(acc[i], in[i]);
      }
    if (divisor > 1) {
#pragma unroll
      for (int i = 0; i < kN; ++i) acc[i] = divide(acc[i], divisor);
    }
    store_vector<Tag>(p.dst, v, acc);
  }

  // The elements after the last whole vector, or all of them when some
  // pointer is not 16-byte aligned.
  for (uint64_t i = vectors * kN + first; i < count; i += stride) {
    A acc = load_one<Tag>(p.srcs[0], i);
#pragma unroll
    for (int s = 1; s < WIA_CUDA_REDUCE_MAX_SRCS; ++s)
      if (s < nsrcs) acc = Op::apply(acc, load_one<Tag>(p.srcs[s], i));
    if (divisor > 1) acc = divide(acc, divisor);
    store_one<Tag>(p.dst, i, acc);
  }
}

}  // namespace wia_cuda

// One extern "C" kernel per (dtype, op); the names are the contract with
// cuda_kernels.cpp and the driver test double. __grid_constant__ keeps the
// parameter block in the constant bank instead of copying it per thread.
#define WIA_REDUCE_KERNEL(dtype, Tag, op, Op)                                      \
  extern "C" __global__ void __launch_bounds__(256, 4)                             \
      wia_reduce_##dtype##_##op(const __grid_constant__ wia_cuda_reduce_params_t p) { \
    wia_cuda::reduce<Tag, wia_cuda::Op>(p);                                        \
  }
#define WIA_REDUCE_KERNELS(dtype, Tag)        \
  WIA_REDUCE_KERNEL(dtype, Tag, sum, Sum)     \
  WIA_REDUCE_KERNEL(dtype, Tag, prod, Prod)   \
  WIA_REDUCE_KERNEL(dtype, Tag, min, Min)     \
  WIA_REDUCE_KERNEL(dtype, Tag, max, Max)

WIA_REDUCE_KERNELS(int8, int8_t)
WIA_REDUCE_KERNELS(uint8, uint8_t)
WIA_REDUCE_KERNELS(int32, int32_t)
WIA_REDUCE_KERNELS(uint32, uint32_t)
WIA_REDUCE_KERNELS(int64, int64_t)
WIA_REDUCE_KERNELS(uint64, uint64_t)
WIA_REDUCE_KERNELS(float16, wia_cuda::Half)
WIA_REDUCE_KERNELS(bfloat16, wia_cuda::BFloat16)
WIA_REDUCE_KERNELS(float32, float)
WIA_REDUCE_KERNELS(float64, double)

#undef WIA_REDUCE_KERNELS
#undef WIA_REDUCE_KERNEL
