// SPDX-License-Identifier: Apache-2.0
// Element types of the cuda provider's kernels: how each wia_datatype_t is
// stored, what it is computed in, and 16-byte vector loads and stores.
// Shared by reduce.cu and scale.cu (compiled as one unit: wia_cuda_kernels.cu).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

namespace wia_cuda {

// Tags for the two 16-bit float formats, stored as raw bits.
struct Half {};
struct BFloat16 {};

// Storage type S, compute type A, and the conversions. float16/bfloat16
// compute in float (the ABI: accumulate in float32, round once per element).
template <class Tag>
struct Element {
  using S = Tag;
  using A = Tag;
  static __device__ __forceinline__ A load(S s) { return s; }
  static __device__ __forceinline__ S store(A a) { return a; }
};
template <>
struct Element<Half> {
  using S = uint16_t;
  using A = float;
  static __device__ __forceinline__ A load(S s) { return __half2float(__ushort_as_half(s)); }
  // Round to nearest even, as the CPU kernels do.
  static __device__ __forceinline__ S store(A a) { return __half_as_ushort(__float2half_rn(a)); }
};
template <>
struct Element<BFloat16> {
  using S = uint16_t;
  using A = float;
  static __device__ __forceinline__ A load(S s) {
    return __bfloat162float(__ushort_as_bfloat16(s));
  }
  static __device__ __forceinline__ S store(A a) {
    return __bfloat16_as_ushort(__float2bfloat16_rn(a));
  }
};

// Elements per 16-byte vector.
template <class Tag>
constexpr int kPerVector = 16 / static_cast<int>(sizeof(typename Element<Tag>::S));

// Vector v (16 bytes) of `base`, as raw bits. `base` is 16-byte aligned
// (the callers check before taking the vector path).
__device__ __forceinline__ uint4 load_bits(const void* base, uint64_t v) {
  return static_cast<const uint4*>(base)[v];
}

// The elements of one 16-byte vector as compute values.
template <class Tag>
__device__ __forceinline__ void unpack(const uint4& bits,
                                       typename Element<Tag>::A (&out)[kPerVector<Tag>]) {
  using S = typename Element<Tag>::S;
  S s[kPerVector<Tag>];
  memcpy(s, &bits, sizeof(bits));
#pragma unroll
  for (int i = 0; i < kPerVector<Tag>; ++i) out[i] = Element<Tag>::load(s[i]);
}

template <class Tag>
__device__ __forceinline__ void store_vector(void* base, uint64_t v,
                                             const typename Element<Tag>::A (&in)[kPerVector<Tag>]) {
  using S = typename Element<Tag>::S;
  S s[kPerVector<Tag>];
#pragma unroll
  for (int i = 0; i < kPerVector<Tag>; ++i) s[i] = Element<Tag>::store(in[i]);
  uint4 bits;
  memcpy(&bits, s, sizeof(bits));
  static_cast<uint4*>(base)[v] = bits;
}

template <class Tag>
__device__ __forceinline__ typename Element<Tag>::A load_one(const void* base, uint64_t i) {
  return Element<Tag>::load(static_cast<const typename Element<Tag>::S*>(base)[i]);
}

template <class Tag>
__device__ __forceinline__ void store_one(void* base, uint64_t i, typename Element<Tag>::A a) {
  static_cast<typename Element<Tag>::S*>(base)[i] = Element<Tag>::store(a);
}

__device__ __forceinline__ bool aligned16(const void* p) {
  return (reinterpret_cast<uintptr_t>(p) & 15u) == 0;
}

}  // namespace wia_cuda
