// SPDX-License-Identifier: Apache-2.0
// wia_scale_<dtype>: buf[i] = buf[i] * factor with the results of the
// core's host path (core/src/api/api_compute.cpp), so wia_scale gives the
// same bits on every device: float32 in float; every other type in
// double, then float16/bfloat16 rounded once from float, and integers
// truncated toward zero through int64 and wrapped to their width (values
// beyond int64 are undefined on the host too).
#include <type_traits>

#include "device_kernel_params.h"
#include "element_types.cuh"

namespace wia_cuda {

// The computation type: float for float32, double for the rest.
template <class Tag>
using ScaleT = std::conditional_t<std::is_same_v<Tag, float>, float, double>;

template <class Tag>
__device__ __forceinline__ typename Element<Tag>::A scale_one(typename Element<Tag>::A x,
                                                             ScaleT<Tag> factor) {
  using A = typename Element<Tag>::A;
  const ScaleT<Tag> r = static_cast<ScaleT<Tag>>(x) * factor;
  if constexpr (std::is_integral_v<A>) {
    using U = std::make_unsigned_t<A>;
    return static_cast<A>(static_cast<U>(static_cast<unsigned long long>(static_cast<long long>(r))));
  } else {
    return static_cast<A>(r);  // half types: A is float, rounded to 16 bits on store
  }
}

template <class Tag>
__device__ __forceinline__ void scale(const wia_cuda_scale_params_t& p) {
  using A = typename Element<Tag>::A;
  constexpr int kN = kPerVector<Tag>;
  const ScaleT<Tag> factor = static_cast<ScaleT<Tag>>(p.factor);
  const uint64_t count = p.count;
  const uint64_t stride = static_cast<uint64_t>(gridDim.x) * blockDim.x;
  const uint64_t first = static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const uint64_t vectors = aligned16(p.buf) ? count / kN : 0;
  for (uint64_t v = first; v < vectors; v += stride) {
    A x[kN];
    unpack<Tag>(load_bits(p.buf, v), x);
#pragma unroll
    for (int i = 0; i < kN; ++i) x[i] = scale_one<Tag>(x[i], factor);
    store_vector<Tag>(p.buf, v, x);
  }
  for (uint64_t i = vectors * kN + first; i < count; i += stride)
    store_one<Tag>(p.buf, i, scale_one<Tag>(load_one<Tag>(p.buf, i), factor));
}

}  // namespace wia_cuda

#define WIA_SCALE_KERNEL(dtype, Tag)                                                           \
  extern "C" __global__ void __launch_bounds__(256)                                            \
      wia_scale_##dtype(const __grid_constant__ wia_cuda_scale_params_t p) {                  \
    wia_cuda::scale<Tag>(p);                                                                   \
  }

WIA_SCALE_KERNEL(int8, int8_t)
WIA_SCALE_KERNEL(uint8, uint8_t)
WIA_SCALE_KERNEL(int32, int32_t)
WIA_SCALE_KERNEL(uint32, uint32_t)
WIA_SCALE_KERNEL(int64, int64_t)
WIA_SCALE_KERNEL(uint64, uint64_t)
WIA_SCALE_KERNEL(float16, wia_cuda::Half)
WIA_SCALE_KERNEL(bfloat16, wia_cuda::BFloat16)
WIA_SCALE_KERNEL(float32, float)
WIA_SCALE_KERNEL(float64, double)

#undef WIA_SCALE_KERNEL
