// SPDX-License-Identifier: Apache-2.0
// wia_scale_<dtype>: buf[i] = buf[i] * factor, computed in double for
// float64 and in float otherwise (kernels/device_kernel_params.h); integers
// round to nearest even and saturate to their range (NaN becomes 0).
#include <type_traits>

#include "device_kernel_params.h"
#include "element_types.cuh"

namespace wia_cuda {

// The computation type of scaling: double for float64, float for the rest.
template <class Tag>
using ScaleT = std::conditional_t<std::is_same_v<Tag, double>, double, float>;

template <class Tag>
__device__ __forceinline__ typename Element<Tag>::A scale_one(typename Element<Tag>::A x,
                                                             ScaleT<Tag> factor) {
  using A = typename Element<Tag>::A;
  const ScaleT<Tag> r = static_cast<ScaleT<Tag>>(x) * factor;
  if constexpr (std::is_integral_v<A>) {
    const float rounded = rintf(r);
    if (rounded != rounded) return 0;
    constexpr int kBits = 8 * sizeof(A);
    // The exclusive upper bound and inclusive lower bound, both exact in
    // float: 2^(bits-1) and -2^(bits-1) signed, 2^bits and 0 unsigned.
    const float upper = std::is_signed_v<A> ? ldexpf(1.0f, kBits - 1) : ldexpf(1.0f, kBits);
    const float lower = std::is_signed_v<A> ? -upper : 0.0f;
    using U = std::make_unsigned_t<A>;
    constexpr A kMax = static_cast<A>(std::is_signed_v<A> ? static_cast<U>(~U{0}) >> 1 : ~U{0});
    constexpr A kMin = std::is_signed_v<A> ? static_cast<A>(-kMax - 1) : A{0};
    if (rounded >= upper) return kMax;
    if (rounded <= lower) return kMin;
    return static_cast<A>(rounded);
  } else {
    return static_cast<A>(r);
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
