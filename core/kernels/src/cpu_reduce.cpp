// SPDX-License-Identifier: Apache-2.0
// CPU reduction kernels (see cpu_reduce.hpp for the contract).
//
// Shape of the implementation, and why:
//  - The inner loops are plain loops over __restrict pointers with a
//    branch-free element operation, so GCC and Clang auto-vectorise them
//    at -O3 (this library is always built with -O3). The same source
//    serves every ISA; the one exception is float16, where the CPU's own
//    conversion instructions (F16C) beat any portable code (see below).
//  - Each hot loop is a non-template function marked WIA_HOT, which on
//    x86-64 is target_clones("avx512f", "avx2", "default"): the loader
//    picks the widest clone the CPU supports through an ifunc, so one
//    binary uses AVX-512 on the build machines and still runs on any
//    x86-64. (Clang rejects multiversioned templates, hence the small
//    non-template wrappers around the template bodies.)
//  - n-ary reductions walk the buffers in blocks of kBlockBytes. Within a
//    block the first up-to-4 sources are fused into one pass that writes
//    dst, further sources are folded in 3 at a time while the dst block is
//    still in L1, and the divisor is applied last. Every source byte is
//    therefore read from memory once and dst written once, whatever nsrcs.
//  - float16/bfloat16 are widened to float32 per block (a fused
//    convert-and-combine loop), accumulated in float32 and rounded to
//    nearest-even once per element when the block is stored. Subnormal
//    halves are normal floats, so an application that sets FTZ/DAZ does
//    not change float16 results.
//  - Integer SUM/PROD wrap modulo 2^bits: they run on the unsigned type of
//    the same width (signed overflow would be UB; the bit pattern of the
//    wrapped result is the same). MIN/MAX run on the signed type.
#include "kernels/cpu_reduce.hpp"

#include <algorithm>
#include <atomic>
#include <bit>
#include <cstring>
#include <limits>
#include <type_traits>

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#endif

// Not under ThreadSanitizer: GCC instruments the ifunc resolvers that
// target_clones generates, and the dynamic loader runs them while
// relocating libwia.so, before the TSan runtime is initialised: every
// program crashed at load. The baseline clone keeps the kernels' memory
// accesses instrumented, which is what TSan is there to check.
#if defined(__x86_64__) && defined(__linux__) && defined(__has_attribute) && \
    !defined(__SANITIZE_THREAD__)
#if __has_attribute(target_clones)
#define WIA_HOT __attribute__((target_clones("avx512f", "avx2", "default")))
#endif
#endif
#ifndef WIA_HOT
// Other architectures (or a compiler without ifunc-based multiversioning):
// one baseline version, still auto-vectorised for the baseline ISA.
#define WIA_HOT
#endif

#define WIA_INLINE inline __attribute__((always_inline))

namespace wia::kernels {
namespace {

// 8 KiB: a dst block plus the source blocks of a fused pass fit well
// inside a 32-48 KiB L1D, and per-block call overhead stays below 1%.
constexpr std::size_t kBlockBytes = 8192;
// float16/bfloat16 blocks are widened into a float32 scratch of this many
// elements (8 KiB on the stack).
constexpr std::size_t kWideBlock = 2048;

// --------------------------------------------------------------------------
// Scalar conversions. Branch-free: every candidate is computed, then one is
// picked with a bit mask. GCC turns ternaries here into control flow that
// its vectoriser rejects ("control flow in loop"), and with -ftrapping-math
// it may not speculate a float add that sits behind a branch; the masks
// keep the loops that call these vectorised under both compilers.

WIA_INLINE std::uint32_t select(bool c, std::uint32_t a, std::uint32_t b) {
  const std::uint32_t m = 0u - static_cast<std::uint32_t>(c);
  return (a & m) | (b & ~m);
}

WIA_INLINE float h2f(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  // Exponent and mantissa moved to their float32 positions.
  const std::uint32_t em = static_cast<std::uint32_t>(h & 0x7fffu) << 13;
  const std::uint32_t exp = em & (0x7c00u << 13);
  // Normal numbers: rebias the exponent from 15 to 127.
  const std::uint32_t normal = em + ((127u - 15u) << 23);
  // Inf/NaN: exponent all ones in both formats; the NaN payload is kept.
  const std::uint32_t infnan = em + ((255u - 31u) << 23);
  // Subnormals (and zero): m * 2^-24 computed exactly as
  // 2^-14 * (1 + m/1024) - 2^-14 (Fabian Giesen's "magic" trick).
  const float magic = std::bit_cast<float>(113u << 23);
  const std::uint32_t sub =
      std::bit_cast<std::uint32_t>(std::bit_cast<float>(em + (113u << 23)) - magic);
  std::uint32_t out = select(exp == (0x7c00u << 13), infnan, normal);
  out = select(exp == 0, sub, out);
  return std::bit_cast<float>(out | sign);
}

WIA_INLINE std::uint16_t f2h(float f) {
  std::uint32_t u = std::bit_cast<std::uint32_t>(f);
  const std::uint32_t sign = u & 0x80000000u;
  u ^= sign;
  // |f| >= 65536 (out of range whatever the rounding) or Inf/NaN. NaN
  // stays NaN: quiet bit set, top payload bits kept.
  const std::uint32_t nan = 0x7e00u | ((u >> 13) & 0x3ffu);
  const std::uint32_t big = select(u > 0x7f800000u, nan, 0x7c00u);
  // Result is subnormal or zero (|f| < 2^-14): adding 0.5 lines the ten
  // mantissa bits up at the bottom of the float, the FPU rounds to nearest
  // even, and the low bits are the half's bits (0x400 = smallest normal,
  // which is the correct encoding when rounding carries).
  const float denorm_magic = 0.5f;
  const std::uint32_t small = std::bit_cast<std::uint32_t>(std::bit_cast<float>(u) + denorm_magic) -
                              std::bit_cast<std::uint32_t>(denorm_magic);
  // Normal: rebias, add 0x0fff plus the lowest kept bit (round to nearest,
  // ties to even) and drop 13 bits. A carry into the exponent is the right
  // answer, including overflow to infinity (0x7c00).
  const std::uint32_t odd = (u >> 13) & 1u;
  const std::uint32_t normal =
      (u + (static_cast<std::uint32_t>(15 - 127) << 23) + 0xfffu + odd) >> 13;
  std::uint32_t out = select(u >= (113u << 23), normal, small);
  out = select(u >= ((127u + 16u) << 23), big, out);
  return static_cast<std::uint16_t>(out | (sign >> 16));
}

WIA_INLINE float b2f(std::uint16_t b) {
  return std::bit_cast<float>(static_cast<std::uint32_t>(b) << 16);
}

WIA_INLINE std::uint16_t f2b(float f) {
  const std::uint32_t u = std::bit_cast<std::uint32_t>(f);
  // NaN: truncating could clear every payload bit left and produce Inf, so
  // force the quiet bit instead.
  const std::uint32_t nan = (u >> 16) | 0x40u;
  // Round to nearest even; the carry into the exponent handles overflow to
  // infinity.
  const std::uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  return static_cast<std::uint16_t>(select((u & 0x7fffffffu) > 0x7f800000u, nan, rounded));
}

// --------------------------------------------------------------------------
// Element operations.
//
// Float MIN/MAX propagate NaN: if any input is NaN the result is NaN (the
// IEEE 754-2019 minimum/maximum semantics, as torch.minimum/maximum; unlike
// C's fmin, which drops a NaN). That way a NaN produced on one rank can
// never be silently hidden by a reduction. Between +0 and -0, which compare
// equal, the later operand wins; callers must not rely on the sign of zero.
// Written as two selects with one compare each: GCC 12 vectorises that,
// but not a select on `(a < b) | (a != a)`.

struct Sum {
  template <class T>
  static WIA_INLINE T apply(T a, T b) {
    return static_cast<T>(a + b);
  }
};
struct Prod {
  template <class T>
  static WIA_INLINE T apply(T a, T b) {
    // uint8 promotes to int (255 * 255 fits); uint32/uint64 wrap as
    // unsigned; floats round as IEEE says.
    return static_cast<T>(a * b);
  }
};
struct Min {
  template <class T>
  static WIA_INLINE T apply(T a, T b) {
    if constexpr (std::is_floating_point_v<T>) {
      const T r = a < b ? a : b;  // b when either is NaN
      return a != a ? a : r;      // so pick a NaN a explicitly
    } else {
      return a < b ? a : b;
    }
  }
};
struct Max {
  template <class T>
  static WIA_INLINE T apply(T a, T b) {
    if constexpr (std::is_floating_point_v<T>) {
      const T r = a > b ? a : b;  // b when either is NaN
      return a != a ? a : r;      // so pick a NaN a explicitly
    } else {
      return a > b ? a : b;
    }
  }
};

// --------------------------------------------------------------------------
// Template loop bodies. "first" kernels write dst from 2-4 sources; "acc"
// kernels fold 1-3 more sources into dst (dst is then also an input, and
// may be the caller's srcs[0] when reducing in place).

template <class T, class Op>
WIA_INLINE void first2(T* __restrict d, const T* __restrict a, const T* __restrict b,
                       std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) d[i] = Op::apply(a[i], b[i]);
}
template <class T, class Op>
WIA_INLINE void first3(T* __restrict d, const T* __restrict a, const T* __restrict b,
                       const T* __restrict c, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) d[i] = Op::apply(Op::apply(a[i], b[i]), c[i]);
}
template <class T, class Op>
WIA_INLINE void first4(T* __restrict d, const T* __restrict a, const T* __restrict b,
                       const T* __restrict c, const T* __restrict e, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i)
    d[i] = Op::apply(Op::apply(Op::apply(a[i], b[i]), c[i]), e[i]);
}
template <class T, class Op>
WIA_INLINE void acc1(T* __restrict d, const T* __restrict a, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) d[i] = Op::apply(d[i], a[i]);
}
template <class T, class Op>
WIA_INLINE void acc2(T* __restrict d, const T* __restrict a, const T* __restrict b, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) d[i] = Op::apply(Op::apply(d[i], a[i]), b[i]);
}
template <class T, class Op>
WIA_INLINE void acc3(T* __restrict d, const T* __restrict a, const T* __restrict b,
                     const T* __restrict c, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i)
    d[i] = Op::apply(Op::apply(Op::apply(d[i], a[i]), b[i]), c[i]);
}

template <class T>
struct KernelSet {
  void (*first2)(T* __restrict, const T* __restrict, const T* __restrict, std::size_t);
  void (*first3)(T* __restrict, const T* __restrict, const T* __restrict, const T* __restrict,
                 std::size_t);
  void (*first4)(T* __restrict, const T* __restrict, const T* __restrict, const T* __restrict,
                 const T* __restrict, std::size_t);
  void (*acc1)(T* __restrict, const T* __restrict, std::size_t);
  void (*acc2)(T* __restrict, const T* __restrict, const T* __restrict, std::size_t);
  void (*acc3)(T* __restrict, const T* __restrict, const T* __restrict, const T* __restrict,
               std::size_t);
};

// One multiversioned wrapper per (type, op, kernel shape).
#define WIA_KERNEL_SET(NAME, T, OP)                                                         \
  WIA_HOT void NAME##_first2(T* __restrict d, const T* __restrict a, const T* __restrict b, \
                             std::size_t n) {                                               \
    first2<T, OP>(d, a, b, n);                                                              \
  }                                                                                         \
  WIA_HOT void NAME##_first3(T* __restrict d, const T* __restrict a, const T* __restrict b, \
                             const T* __restrict c, std::size_t n) {                        \
    first3<T, OP>(d, a, b, c, n);                                                           \
  }                                                                                         \
  WIA_HOT void NAME##_first4(T* __restrict d, const T* __restrict a, const T* __restrict b, \
                             const T* __restrict c, const T* __restrict e, std::size_t n) { \
    first4<T, OP>(d, a, b, c, e, n);                                                        \
  }                                                                                         \
  WIA_HOT void NAME##_acc1(T* __restrict d, const T* __restrict a, std::size_t n) {         \
    acc1<T, OP>(d, a, n);                                                                   \
  }                                                                                         \
  WIA_HOT void NAME##_acc2(T* __restrict d, const T* __restrict a, const T* __restrict b,   \
                           std::size_t n) {                                                 \
    acc2<T, OP>(d, a, b, n);                                                                \
  }                                                                                         \
  WIA_HOT void NAME##_acc3(T* __restrict d, const T* __restrict a, const T* __restrict b,   \
                           const T* __restrict c, std::size_t n) {                          \
    acc3<T, OP>(d, a, b, c, n);                                                             \
  }                                                                                         \
  const KernelSet<T> NAME = {&NAME##_first2, &NAME##_first3, &NAME##_first4,                \
                             &NAME##_acc1,   &NAME##_acc2,   &NAME##_acc3};

// Wrapping SUM/PROD on unsigned types serve both signednesses.
WIA_KERNEL_SET(k_u8_sum, std::uint8_t, Sum)
WIA_KERNEL_SET(k_u8_prod, std::uint8_t, Prod)
WIA_KERNEL_SET(k_u8_min, std::uint8_t, Min)
WIA_KERNEL_SET(k_u8_max, std::uint8_t, Max)
WIA_KERNEL_SET(k_i8_min, std::int8_t, Min)
WIA_KERNEL_SET(k_i8_max, std::int8_t, Max)
WIA_KERNEL_SET(k_u32_sum, std::uint32_t, Sum)
WIA_KERNEL_SET(k_u32_prod, std::uint32_t, Prod)
WIA_KERNEL_SET(k_u32_min, std::uint32_t, Min)
WIA_KERNEL_SET(k_u32_max, std::uint32_t, Max)
WIA_KERNEL_SET(k_i32_min, std::int32_t, Min)
WIA_KERNEL_SET(k_i32_max, std::int32_t, Max)
WIA_KERNEL_SET(k_u64_sum, std::uint64_t, Sum)
WIA_KERNEL_SET(k_u64_prod, std::uint64_t, Prod)
WIA_KERNEL_SET(k_u64_min, std::uint64_t, Min)
WIA_KERNEL_SET(k_u64_max, std::uint64_t, Max)
WIA_KERNEL_SET(k_i64_min, std::int64_t, Min)
WIA_KERNEL_SET(k_i64_max, std::int64_t, Max)
WIA_KERNEL_SET(k_f32_sum, float, Sum)
WIA_KERNEL_SET(k_f32_prod, float, Prod)
WIA_KERNEL_SET(k_f32_min, float, Min)
WIA_KERNEL_SET(k_f32_max, float, Max)
WIA_KERNEL_SET(k_f64_sum, double, Sum)
WIA_KERNEL_SET(k_f64_prod, double, Prod)
WIA_KERNEL_SET(k_f64_min, double, Min)
WIA_KERNEL_SET(k_f64_max, double, Max)
#undef WIA_KERNEL_SET

// Float division by the divisor. A true division (not a multiplication by
// the reciprocal) so the quotient is correctly rounded.
WIA_HOT void div_f32(float* __restrict d, float q, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) d[i] = d[i] / q;
}
WIA_HOT void div_f64(double* __restrict d, double q, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) d[i] = d[i] / q;
}

// Integer division by a 64-bit divisor >= 2, truncating toward zero as C
// does. There is no SIMD integer division on x86, and AVG over integers is
// rare, so this stays a scalar loop.
template <class T>
void div_int(T* d, std::uint64_t q, std::size_t n) {
  if constexpr (std::is_unsigned_v<T>) {
    for (std::size_t i = 0; i < n; ++i) d[i] = static_cast<T>(d[i] / q);
  } else if constexpr (sizeof(T) < sizeof(std::int64_t)) {
    // |x| <= 2^31, so clamping q to INT64_MAX keeps every quotient exact
    // and avoids the signed/unsigned conversion of x / uint64_t.
    const auto qs = static_cast<std::int64_t>(
        std::min<std::uint64_t>(q, static_cast<std::uint64_t>(INT64_MAX)));
    for (std::size_t i = 0; i < n; ++i) d[i] = static_cast<T>(static_cast<std::int64_t>(d[i]) / qs);
  } else {
    if (q > static_cast<std::uint64_t>(INT64_MAX)) {
      // |x| <= 2^63 <= q: the quotient is 0, except INT64_MIN / 2^63 = -1.
      for (std::size_t i = 0; i < n; ++i)
        d[i] = (d[i] == INT64_MIN && q == (std::uint64_t{1} << 63)) ? -1 : 0;
    } else {
      const auto qs = static_cast<std::int64_t>(q);
      for (std::size_t i = 0; i < n; ++i) d[i] = d[i] / qs;
    }
  }
}

template <class T>
void divide(T* d, std::uint64_t q, std::size_t n) {
  if constexpr (std::is_same_v<T, float>) {
    div_f32(d, static_cast<float>(q), n);
  } else if constexpr (std::is_same_v<T, double>) {
    div_f64(d, static_cast<double>(q), n);
  } else {
    div_int(d, q, n);
  }
}

// The block driver for every element type reduced in its own width. DivT
// is the type the divisor applies to: the signed type when a signed SUM/AVG
// ran on the unsigned kernels (same width, so the aliasing is allowed).
template <class T, class DivT = T>
void run_native(const KernelSet<T>& k, void* dst_v, const void* const* srcs_v, std::uint32_t n,
                std::size_t count, std::uint64_t divisor) {
  T* const dst = static_cast<T*>(dst_v);
  const bool in_place = srcs_v[0] == dst_v;
  constexpr std::size_t kBlock = kBlockBytes / sizeof(T);
  auto src = [&](std::uint32_t i, std::size_t off) {
    return static_cast<const T*>(srcs_v[i]) + off;
  };
  for (std::size_t off = 0; off < count; off += kBlock) {
    const std::size_t len = std::min(kBlock, count - off);
    T* const d = dst + off;
    std::uint32_t next;
    if (in_place) {
      next = 1;  // d already holds srcs[0]
    } else if (n == 1) {
      std::memcpy(d, src(0, off), len * sizeof(T));
      next = 1;
    } else if (n == 2) {
      k.first2(d, src(0, off), src(1, off), len);
      next = 2;
    } else if (n == 3) {
      k.first3(d, src(0, off), src(1, off), src(2, off), len);
      next = 3;
    } else {
      k.first4(d, src(0, off), src(1, off), src(2, off), src(3, off), len);
      next = 4;
    }
    while (next < n) {
      const std::uint32_t left = n - next;
      if (left >= 3) {
        k.acc3(d, src(next, off), src(next + 1, off), src(next + 2, off), len);
        next += 3;
      } else if (left == 2) {
        k.acc2(d, src(next, off), src(next + 1, off), len);
        next += 2;
      } else {
        k.acc1(d, src(next, off), len);
        next += 1;
      }
    }
    if (divisor > 1) divide(reinterpret_cast<DivT*>(d), divisor, len);
  }
}

// --------------------------------------------------------------------------
// float16 / bfloat16: fused widen-and-combine into a float32 block.

#define WIA_WIDE_KERNELS(NAME, CVT_IN, CVT_OUT)                                       \
  WIA_HOT void NAME##_load(float* __restrict acc, const std::uint16_t* __restrict s,  \
                           std::size_t n) {                                           \
    for (std::size_t i = 0; i < n; ++i) acc[i] = CVT_IN(s[i]);                        \
  }                                                                                   \
  WIA_HOT void NAME##_store(std::uint16_t* __restrict d, const float* __restrict acc, \
                            std::size_t n) {                                          \
    for (std::size_t i = 0; i < n; ++i) d[i] = CVT_OUT(acc[i]);                       \
  }                                                                                   \
  WIA_HOT void NAME##_sum(float* __restrict acc, const std::uint16_t* __restrict s,   \
                          std::size_t n) {                                            \
    for (std::size_t i = 0; i < n; ++i) acc[i] = Sum::apply(acc[i], CVT_IN(s[i]));    \
  }                                                                                   \
  WIA_HOT void NAME##_prod(float* __restrict acc, const std::uint16_t* __restrict s,  \
                           std::size_t n) {                                           \
    for (std::size_t i = 0; i < n; ++i) acc[i] = Prod::apply(acc[i], CVT_IN(s[i]));   \
  }                                                                                   \
  WIA_HOT void NAME##_min(float* __restrict acc, const std::uint16_t* __restrict s,   \
                          std::size_t n) {                                            \
    for (std::size_t i = 0; i < n; ++i) acc[i] = Min::apply(acc[i], CVT_IN(s[i]));    \
  }                                                                                   \
  WIA_HOT void NAME##_max(float* __restrict acc, const std::uint16_t* __restrict s,   \
                          std::size_t n) {                                            \
    for (std::size_t i = 0; i < n; ++i) acc[i] = Max::apply(acc[i], CVT_IN(s[i]));    \
  }

WIA_WIDE_KERNELS(k_f16, h2f, f2h)
WIA_WIDE_KERNELS(k_bf16, b2f, f2b)
#undef WIA_WIDE_KERNELS

// float16 with the CPU's own conversion instructions (F16C: vcvtph2ps /
// vcvtps2ph, round to nearest even, NaN kept quiet, subnormals exact):
// about 2x faster than the portable bit tricks above, which GCC can only
// vectorise at 256 bits without AVX-512BW. Selected once at run time (by
// hand: target_clones cannot choose between intrinsics); AVX-512F does not
// imply F16C as a compiler target, so both are named. (The maskz forms
// with a full mask avoid GCC 12's false maybe-uninitialized warning in the
// unmasked intrinsics.)
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define WIA_HAVE_F16C 1

__attribute__((target("avx512f,f16c"))) void h2f_avx512(float* __restrict d,
                                                        const std::uint16_t* __restrict s,
                                                        std::size_t n) {
  std::size_t i = 0;
  for (; i + 16 <= n; i += 16)
    _mm512_storeu_ps(
        d + i,
        _mm512_maskz_cvtph_ps(0xffff, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i))));
  for (; i < n; ++i) d[i] = h2f(s[i]);
}
__attribute__((target("avx512f,f16c"))) void f2h_avx512(std::uint16_t* __restrict d,
                                                        const float* __restrict s, std::size_t n) {
  std::size_t i = 0;
  for (; i + 16 <= n; i += 16)
    _mm256_storeu_si256(
        reinterpret_cast<__m256i*>(d + i),
        _mm512_maskz_cvtps_ph(0xffff, _mm512_loadu_ps(s + i), _MM_FROUND_TO_NEAREST_INT));
  for (; i < n; ++i) d[i] = f2h(s[i]);
}
__attribute__((target("avx,f16c"))) void h2f_f16c(float* __restrict d,
                                                  const std::uint16_t* __restrict s,
                                                  std::size_t n) {
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(d + i,
                     _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i))));
  for (; i < n; ++i) d[i] = h2f(s[i]);
}
__attribute__((target("avx,f16c"))) void f2h_f16c(std::uint16_t* __restrict d,
                                                  const float* __restrict s, std::size_t n) {
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(d + i),
                     _mm256_cvtps_ph(_mm256_loadu_ps(s + i), _MM_FROUND_TO_NEAREST_INT));
  for (; i < n; ++i) d[i] = f2h(s[i]);
}

// Fused widen-and-combine: acc[i] = acc[i] op float(s[i]). The vector
// forms reproduce Op::apply exactly: x86 MIN/MAX return their second
// operand when the comparison fails, which is `a < b ? a : b`, and a NaN
// accumulator is put back explicitly (NaN propagates).
#define WIA_F16C_COMBINE(NAME, OP, EXPR512, EXPR256)                                              \
  __attribute__((target("avx512f,f16c"))) void NAME##_avx512(                                     \
      float* __restrict acc, const std::uint16_t* __restrict s, std::size_t n) {                  \
    std::size_t i = 0;                                                                            \
    for (; i + 16 <= n; i += 16) {                                                                \
      const __m512 a = _mm512_loadu_ps(acc + i);                                                  \
      const __m512 b = _mm512_maskz_cvtph_ps(                                                     \
          0xffff, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i)));                   \
      _mm512_storeu_ps(acc + i, EXPR512);                                                         \
    }                                                                                             \
    for (; i < n; ++i) acc[i] = OP::apply(acc[i], h2f(s[i]));                                     \
  }                                                                                               \
  __attribute__((target("avx,f16c"))) void NAME##_f16c(                                           \
      float* __restrict acc, const std::uint16_t* __restrict s, std::size_t n) {                  \
    std::size_t i = 0;                                                                            \
    for (; i + 8 <= n; i += 8) {                                                                  \
      const __m256 a = _mm256_loadu_ps(acc + i);                                                  \
      const __m256 b = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i))); \
      _mm256_storeu_ps(acc + i, EXPR256);                                                         \
    }                                                                                             \
    for (; i < n; ++i) acc[i] = OP::apply(acc[i], h2f(s[i]));                                     \
  }

WIA_F16C_COMBINE(f16c_sum, Sum, _mm512_add_ps(a, b), _mm256_add_ps(a, b))
WIA_F16C_COMBINE(f16c_prod, Prod, _mm512_mul_ps(a, b), _mm256_mul_ps(a, b))
WIA_F16C_COMBINE(f16c_min, Min,
                 _mm512_mask_mov_ps(_mm512_maskz_min_ps(0xffff, a, b),
                                    _mm512_cmp_ps_mask(a, a, _CMP_UNORD_Q), a),
                 _mm256_blendv_ps(_mm256_min_ps(a, b), a, _mm256_cmp_ps(a, a, _CMP_UNORD_Q)))
WIA_F16C_COMBINE(f16c_max, Max,
                 _mm512_mask_mov_ps(_mm512_maskz_max_ps(0xffff, a, b),
                                    _mm512_cmp_ps_mask(a, a, _CMP_UNORD_Q), a),
                 _mm256_blendv_ps(_mm256_max_ps(a, b), a, _mm256_cmp_ps(a, a, _CMP_UNORD_Q)))
#undef WIA_F16C_COMBINE

using WideFn = void (*)(float* __restrict, const std::uint16_t* __restrict, std::size_t);
using NarrowFn = void (*)(std::uint16_t* __restrict, const float* __restrict, std::size_t);

struct HalfHw {
  WideFn widen;
  NarrowFn narrow;
  WideFn combine[4];  // indexed like wia_reduce_op_t: sum, prod, min, max
};

const HalfHw kHalf512{&h2f_avx512,
                      &f2h_avx512,
                      {&f16c_sum_avx512, &f16c_prod_avx512, &f16c_min_avx512, &f16c_max_avx512}};
const HalfHw kHalf256{
    &h2f_f16c, &f2h_f16c, {&f16c_sum_f16c, &f16c_prod_f16c, &f16c_min_f16c, &f16c_max_f16c}};

// F16C is CPUID.1:ECX bit 29. Asked directly because Clang 14's
// __builtin_cpu_supports does not know "f16c"; "avx" and "avx512f" are
// asked of the builtin, which also checks that the OS saves the registers.
bool cpu_has_f16c() noexcept {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  return __get_cpuid(1, &eax, &ebx, &ecx, &edx) != 0 && (ecx & (1u << 29)) != 0;
}
bool cpu_has_f16c_avx512() noexcept {
  __builtin_cpu_init();
  return cpu_has_f16c() && __builtin_cpu_supports("avx512f");
}
bool cpu_has_f16c_avx() noexcept {
  __builtin_cpu_init();
  return cpu_has_f16c() && __builtin_cpu_supports("avx");
}

// The best implementation for this CPU, chosen once.
const HalfHw* best_half_hw() noexcept {
  static const HalfHw* const hw = cpu_has_f16c_avx512() ? &kHalf512
                                  : cpu_has_f16c_avx()  ? &kHalf256
                                                        : nullptr;
  return hw;
}

// Set only by force_float16_path_for_testing; kAuto in production.
std::atomic<int> g_forced_half_path{static_cast<int>(Float16Path::kAuto)};

const HalfHw* half_hw() noexcept {
  switch (static_cast<Float16Path>(g_forced_half_path.load(std::memory_order_relaxed))) {
    case Float16Path::kPortable:
      return nullptr;
    case Float16Path::kF16c256:
      return &kHalf256;
    case Float16Path::kF16c512:
      return &kHalf512;
    default:
      return best_half_hw();
  }
}

void run_half_hw(const HalfHw& hw, wia_reduce_op_t op, void* dst_v, const void* const* srcs_v,
                 std::uint32_t n, std::size_t count, std::uint64_t divisor) {
  auto* const dst = static_cast<std::uint16_t*>(dst_v);
  const WideFn combine = hw.combine[op == WIA_REDUCE_AVG ? WIA_REDUCE_SUM : op];
  alignas(64) float acc[kWideBlock];
  const float q = static_cast<float>(divisor);
  for (std::size_t off = 0; off < count; off += kWideBlock) {
    const std::size_t len = std::min(kWideBlock, count - off);
    hw.widen(acc, static_cast<const std::uint16_t*>(srcs_v[0]) + off, len);
    for (std::uint32_t i = 1; i < n; ++i)
      combine(acc, static_cast<const std::uint16_t*>(srcs_v[i]) + off, len);
    if (divisor > 1) div_f32(acc, q, len);
    hw.narrow(dst + off, acc, len);
  }
}
#endif

using WideLoad = void (*)(float* __restrict, const std::uint16_t* __restrict, std::size_t);
using WideStore = void (*)(std::uint16_t* __restrict, const float* __restrict, std::size_t);

void run_wide(WideLoad load, WideLoad combine, WideStore store, void* dst_v,
              const void* const* srcs_v, std::uint32_t n, std::size_t count,
              std::uint64_t divisor) {
  auto* const dst = static_cast<std::uint16_t*>(dst_v);
  alignas(64) float acc[kWideBlock];
  const float q = static_cast<float>(divisor);
  for (std::size_t off = 0; off < count; off += kWideBlock) {
    const std::size_t len = std::min(kWideBlock, count - off);
    // Reading srcs[0] into acc before dst is written makes dst == srcs[0]
    // safe without a special case.
    load(acc, static_cast<const std::uint16_t*>(srcs_v[0]) + off, len);
    for (std::uint32_t i = 1; i < n; ++i)
      combine(acc, static_cast<const std::uint16_t*>(srcs_v[i]) + off, len);
    if (divisor > 1) div_f32(acc, q, len);
    store(dst + off, acc, len);
  }
}

template <class T>
const KernelSet<T>* pick(wia_reduce_op_t op, const KernelSet<T>& sum, const KernelSet<T>& prod,
                         const KernelSet<T>& mn, const KernelSet<T>& mx) {
  switch (op) {
    case WIA_REDUCE_SUM:
    case WIA_REDUCE_AVG:
      return &sum;
    case WIA_REDUCE_PROD:
      return &prod;
    case WIA_REDUCE_MIN:
      return &mn;
    case WIA_REDUCE_MAX:
      return &mx;
    default:
      return nullptr;
  }
}

// Calls visit.template operator()<T, DivT>(kernel set) with the kernels
// of a native dtype and op (T: the element type the kernels compute in,
// DivT: the type AVG divides in) and returns what it returns; returns
// false-like (a value-initialised result) for float16, bfloat16 or a bad
// dtype or op. Integer SUM/AVG/PROD reuse the unsigned kernels for signed
// types: the wrapped bits are right for them too; only the division needs
// the signed interpretation.
template <class Visit>
auto with_native_kernels(wia_datatype_t dtype, wia_reduce_op_t op, Visit&& visit)
    -> decltype(visit.template operator()<float, float>(k_f32_sum)) {
  using Result = decltype(visit.template operator()<float, float>(k_f32_sum));
  const bool wrapping = op == WIA_REDUCE_SUM || op == WIA_REDUCE_AVG || op == WIA_REDUCE_PROD;
  auto run = [&]<class T, class DivT = T>(const KernelSet<T>* k)->Result {
    if (k == nullptr) return Result{};
    return visit.template operator()<T, DivT>(*k);
  };
  switch (dtype) {
    case WIA_UINT8:
      return run.template operator()<std::uint8_t>(
          pick(op, k_u8_sum, k_u8_prod, k_u8_min, k_u8_max));
    case WIA_INT8:
      if (wrapping)
        return run.template operator()<std::uint8_t, std::int8_t>(
            pick(op, k_u8_sum, k_u8_prod, k_u8_min, k_u8_max));
      return run.template operator()<std::int8_t>(pick(op, k_i8_min, k_i8_min, k_i8_min, k_i8_max));
    case WIA_UINT32:
      return run.template operator()<std::uint32_t>(
          pick(op, k_u32_sum, k_u32_prod, k_u32_min, k_u32_max));
    case WIA_INT32:
      if (wrapping)
        return run.template operator()<std::uint32_t, std::int32_t>(
            pick(op, k_u32_sum, k_u32_prod, k_u32_min, k_u32_max));
      return run.template operator()<std::int32_t>(
          pick(op, k_i32_min, k_i32_min, k_i32_min, k_i32_max));
    case WIA_UINT64:
      return run.template operator()<std::uint64_t>(
          pick(op, k_u64_sum, k_u64_prod, k_u64_min, k_u64_max));
    case WIA_INT64:
      if (wrapping)
        return run.template operator()<std::uint64_t, std::int64_t>(
            pick(op, k_u64_sum, k_u64_prod, k_u64_min, k_u64_max));
      return run.template operator()<std::int64_t>(
          pick(op, k_i64_min, k_i64_min, k_i64_min, k_i64_max));
    case WIA_FLOAT32:
      return run.template operator()<float>(pick(op, k_f32_sum, k_f32_prod, k_f32_min, k_f32_max));
    case WIA_FLOAT64:
      return run.template operator()<double>(pick(op, k_f64_sum, k_f64_prod, k_f64_min, k_f64_max));
    default:
      return Result{};
  }
}

template <class T>
void pair_first2(const void* set, void* dst, const void* a, const void* b, std::size_t count) {
  static_cast<const KernelSet<T>*>(set)->first2(static_cast<T*>(dst), static_cast<const T*>(a),
                                                static_cast<const T*>(b), count);
}

bool ranges_overlap(const void* a, const void* b, std::uint64_t bytes) {
  const auto x = reinterpret_cast<std::uintptr_t>(a);
  const auto y = reinterpret_cast<std::uintptr_t>(b);
  return x < y + bytes && y < x + bytes;
}

}  // namespace

// ----------------------------------------------------------------------------
// Public entry points.

std::size_t dtype_size(wia_datatype_t dtype) noexcept {
  switch (dtype) {
    case WIA_INT8:
    case WIA_UINT8:
      return 1;
    case WIA_FLOAT16:
    case WIA_BFLOAT16:
      return 2;
    case WIA_INT32:
    case WIA_UINT32:
    case WIA_FLOAT32:
      return 4;
    case WIA_INT64:
    case WIA_UINT64:
    case WIA_FLOAT64:
      return 8;
    default:
      return 0;
  }
}

const char* dtype_name(wia_datatype_t dtype) noexcept {
  switch (dtype) {
    case WIA_INT8:
      return "int8";
    case WIA_UINT8:
      return "uint8";
    case WIA_INT32:
      return "int32";
    case WIA_UINT32:
      return "uint32";
    case WIA_INT64:
      return "int64";
    case WIA_UINT64:
      return "uint64";
    case WIA_FLOAT16:
      return "float16";
    case WIA_BFLOAT16:
      return "bfloat16";
    case WIA_FLOAT32:
      return "float32";
    case WIA_FLOAT64:
      return "float64";
    default:
      return "invalid";
  }
}

const char* reduce_op_name(wia_reduce_op_t op) noexcept {
  switch (op) {
    case WIA_REDUCE_SUM:
      return "sum";
    case WIA_REDUCE_PROD:
      return "prod";
    case WIA_REDUCE_MIN:
      return "min";
    case WIA_REDUCE_MAX:
      return "max";
    case WIA_REDUCE_AVG:
      return "avg";
    default:
      return "invalid";
  }
}

const char* reduce_args_error(const wia_reduce_args_v1_t& args) noexcept {
  if (!WIA_ABI_HAS_FIELD(wia_reduce_args_v1_t, args.struct_size, srcs))
    return "struct_size is smaller than wia_reduce_args_v1_t";
  const std::size_t esize = dtype_size(args.dtype);
  if (esize == 0) return "unknown datatype";
  if (static_cast<std::uint32_t>(args.op) >= WIA_REDUCE_OP_COUNT)
    return "unknown reduction operator";
  if (args.nsrcs == 0) return "nsrcs is 0";
  if (args.count == 0) return nullptr;
  if (args.dst == nullptr) return "dst is NULL";
  if (args.srcs == nullptr) return "srcs is NULL";
  if (args.count > std::numeric_limits<std::uint64_t>::max() / esize ||
      args.count * esize > std::numeric_limits<std::uintptr_t>::max() / 2)
    return "count * element size overflows the address space";
  const std::uint64_t bytes = args.count * esize;
  for (std::uint32_t i = 0; i < args.nsrcs; ++i) {
    const void* s = args.srcs[i];
    if (s == nullptr) return "a source pointer is NULL";
    if (i == 0 && s == args.dst) continue;  // the one allowed alias: in place
    if (ranges_overlap(s, args.dst, bytes))
      return "dst overlaps a source (only dst == srcs[0] exactly is allowed)";
  }
  return nullptr;
}

wia_status_t reduce(const wia_reduce_args_v1_t& args) noexcept {
  if (reduce_args_error(args) != nullptr) return WIA_ERROR_INVALID_ARGUMENT;
  return reduce_unchecked(args);
}

wia_status_t reduce_unchecked(const wia_reduce_args_v1_t& args) noexcept {
  if (args.count == 0) return WIA_SUCCESS;
  const std::size_t count = static_cast<std::size_t>(args.count);
  const std::uint32_t n = args.nsrcs;
  std::uint64_t divisor = args.divisor;
  if (args.op == WIA_REDUCE_AVG && divisor == 0) divisor = n;
  const wia_reduce_op_t op = args.op;
  void* dst = args.dst;
  const void* const* srcs = args.srcs;
  // Native types: the kernel set the dtype and op name.
  if (with_native_kernels(args.dtype, op, [&]<class T, class DivT>(const KernelSet<T>& k) {
        run_native<T, DivT>(k, dst, srcs, n, count, divisor);
        return true;
      }))
    return WIA_SUCCESS;
  switch (args.dtype) {
    case WIA_FLOAT16:
    case WIA_BFLOAT16: {
      const bool half = args.dtype == WIA_FLOAT16;
#ifdef WIA_HAVE_F16C
      if (half) {
        if (const HalfHw* hw = half_hw()) {
          run_half_hw(*hw, op, dst, srcs, n, count, divisor);
          break;
        }
      }
#endif
      WideLoad combine = nullptr;
      switch (op) {
        case WIA_REDUCE_SUM:
        case WIA_REDUCE_AVG:
          combine = half ? &k_f16_sum : &k_bf16_sum;
          break;
        case WIA_REDUCE_PROD:
          combine = half ? &k_f16_prod : &k_bf16_prod;
          break;
        case WIA_REDUCE_MIN:
          combine = half ? &k_f16_min : &k_bf16_min;
          break;
        case WIA_REDUCE_MAX:
          combine = half ? &k_f16_max : &k_bf16_max;
          break;
        default:
          return WIA_ERROR_INVALID_ARGUMENT;
      }
      run_wide(half ? &k_f16_load : &k_bf16_load, combine, half ? &k_f16_store : &k_bf16_store, dst,
               srcs, n, count, divisor);
      break;
    }
    default:
      return WIA_ERROR_INVALID_ARGUMENT;
  }
  return WIA_SUCCESS;
}

PairReduce pair_reduce(wia_datatype_t dtype, wia_reduce_op_t op) noexcept {
  if (op == WIA_REDUCE_AVG) return {};  // divides after combining
  return with_native_kernels(dtype, op, []<class T, class DivT>(const KernelSet<T>& k) {
    return PairReduce{&k, &pair_first2<T>};
  });
}

bool force_float16_path_for_testing(Float16Path path) noexcept {
#ifdef WIA_HAVE_F16C
  if (path == Float16Path::kF16c512 && !cpu_has_f16c_avx512()) return false;
  if (path == Float16Path::kF16c256 && !cpu_has_f16c_avx()) return false;
  g_forced_half_path.store(static_cast<int>(path), std::memory_order_relaxed);
  return true;
#else
  return path == Float16Path::kAuto || path == Float16Path::kPortable;
#endif
}

float half_to_float(std::uint16_t h) noexcept { return h2f(h); }
std::uint16_t float_to_half(float f) noexcept { return f2h(f); }
float bfloat16_to_float(std::uint16_t b) noexcept { return b2f(b); }
std::uint16_t float_to_bfloat16(float f) noexcept { return f2b(f); }

void half_to_float_n(const std::uint16_t* in, float* out, std::size_t n) noexcept {
#ifdef WIA_HAVE_F16C
  if (const HalfHw* hw = half_hw()) return hw->widen(out, in, n);
#endif
  for (std::size_t i = 0; i < n; ++i) out[i] = h2f(in[i]);
}
void float_to_half_n(const float* in, std::uint16_t* out, std::size_t n) noexcept {
#ifdef WIA_HAVE_F16C
  if (const HalfHw* hw = half_hw()) return hw->narrow(out, in, n);
#endif
  for (std::size_t i = 0; i < n; ++i) out[i] = f2h(in[i]);
}
// The bit operations of b2f and f2b vectorise as they are.
void bfloat16_to_float_n(const std::uint16_t* in, float* out, std::size_t n) noexcept {
  for (std::size_t i = 0; i < n; ++i) out[i] = b2f(in[i]);
}
void float_to_bfloat16_n(const float* in, std::uint16_t* out, std::size_t n) noexcept {
  for (std::size_t i = 0; i < n; ++i) out[i] = f2b(in[i]);
}

}  // namespace wia::kernels
