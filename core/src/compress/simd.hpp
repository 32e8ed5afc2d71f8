// SPDX-License-Identifier: Apache-2.0
// How the codecs' hot loops are compiled twice and one copy chosen at run
// time. Each loop is an always-inline body written as a plain loop over
// __restrict pointers with no branch per entry, which GCC and Clang
// vectorise at -O3 for whatever ISA the function around it targets:
//   WIA_CODEC_DISPATCH(name, params, args) defines name_base (baseline
//   x86-64, SSE2) and, on x86-64, name_avx2 (target "avx2": 8 float lanes
//   and a 32-bit vector multiply, which the rounding noise's hash needs and
//   SSE2 lacks), and name(params) that calls the one use_avx2() picks.
// Neither copy may use FMA ("avx2" does not enable it, and the sources are
// built with -ffp-contract=off): every entry's arithmetic is then the same
// IEEE operations in the same order in both copies, so a message, a
// residual and a decoded sum are bit-for-bit the same whichever copy ran,
// on every rank (codec_test checks it). Reductions keep a fixed lane order.
#pragma once

#include <cstddef>
#include <cstdint>

#define WIA_CODEC_INLINE inline __attribute__((always_inline))

#if defined(__x86_64__) && defined(__GNUC__)
#define WIA_CODEC_HAVE_AVX2 1
#define WIA_CODEC_DISPATCH(ret, name, params, args)                                   \
  ret name##_base params { return name##_body args; }                                 \
  __attribute__((target("avx2"))) ret name##_avx2 params { return name##_body args; } \
  ret name params { return ::wia::compress::use_avx2() ? name##_avx2 args : name##_base args; }
#else
#define WIA_CODEC_DISPATCH(ret, name, params, args) \
  ret name params { return name##_body args; }
#endif

namespace wia::compress {

// Whether the AVX2 copies run: the CPU has AVX2 and force_baseline was not
// set. Read once per codec call, not per entry.
bool use_avx2() noexcept;

}  // namespace wia::compress
