// SPDX-License-Identifier: Apache-2.0
// CPU reduction kernels (core/kernels/include/kernels/cpu_reduce.hpp) against a
// reference computed independently: exact integer arithmetic in __int128
// for the integer types, long double for the floating types, and
// conversions decoded with ldexp rather than bit tricks.
//
// Tolerances, and why:
//  - Integers, MIN and MAX: exact (bit-for-bit for floats, NaN aside).
//  - float32/float64 SUM and AVG: the kernel adds left to right in the
//    element type, so the error bound of recursive summation applies:
//    |got - ref| <= (n - 1) * u * sum(|x_i|), plus one rounding for the
//    division (u = unit roundoff, 2^-24 or 2^-53). PROD: (n + 1) * u * |ref|.
//    This is tighter than any fixed ulp count when there is no
//    cancellation, and still sound when there is.
//  - float16/bfloat16: the kernel accumulates in float32 and rounds once,
//    so the result is within 1 ulp of the output type of the long-double
//    reference rounded to that type, plus the float32 accumulation bound
//    above (which only matters under heavy cancellation).
#include <doctest/doctest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <ios>
#include <limits>
#include <string>
#include <vector>

#include "kernels/cpu_reduce.hpp"

namespace {

using wia::kernels::bfloat16_to_float;
using wia::kernels::float_to_bfloat16;
using wia::kernels::float_to_half;
using wia::kernels::half_to_float;
using i128 = __int128;
using u128 = unsigned __int128;

constexpr wia_datatype_t kAllTypes[] = {WIA_INT8,    WIA_UINT8,  WIA_INT32,   WIA_UINT32,
                                        WIA_INT64,   WIA_UINT64, WIA_FLOAT16, WIA_BFLOAT16,
                                        WIA_FLOAT32, WIA_FLOAT64};
constexpr wia_reduce_op_t kAllOps[] = {WIA_REDUCE_SUM, WIA_REDUCE_PROD, WIA_REDUCE_MIN,
                                       WIA_REDUCE_MAX, WIA_REDUCE_AVG};

// Every float16 implementation this CPU can run (portable bit tricks,
// F16C 256-bit, F16C 512-bit), so one machine tests them all.
std::vector<wia::kernels::Float16Path> float16_paths() {
  using wia::kernels::Float16Path;
  std::vector<Float16Path> paths;
  for (auto p : {Float16Path::kPortable, Float16Path::kF16c256, Float16Path::kF16c512})
    if (wia::kernels::force_float16_path_for_testing(p)) paths.push_back(p);
  wia::kernels::force_float16_path_for_testing(Float16Path::kAuto);
  return paths;
}

// Runs body(full) once per float16 implementation (once for other types).
// `full` is true for one run per type: the implementation this CPU uses by
// default; the others get the cheaper shapes, to keep the test quick.
template <class Body>
void for_each_float16_path(wia_datatype_t dtype, Body&& body) {
  if (dtype != WIA_FLOAT16) {
    body(true);
    return;
  }
  const auto paths = float16_paths();
  for (const auto path : paths) {
    CAPTURE(static_cast<int>(path));
    wia::kernels::force_float16_path_for_testing(path);
    body(path == paths.back());  // the best one is the default
  }
  wia::kernels::force_float16_path_for_testing(wia::kernels::Float16Path::kAuto);
}

// ---------------------------------------------------------------------------
// Independent reference conversions.

long double decode_half(std::uint16_t h) {
  const int sign = h >> 15;
  const int exp = (h >> 10) & 0x1f;
  const int mant = h & 0x3ff;
  long double v;
  if (exp == 0x1f)
    v = mant != 0 ? std::numeric_limits<long double>::quiet_NaN()
                  : std::numeric_limits<long double>::infinity();
  else if (exp == 0)
    v = std::ldexp(static_cast<long double>(mant), -24);
  else
    v = std::ldexp(static_cast<long double>(mant + 1024), exp - 25);
  return sign ? -v : v;
}

long double decode_bf16(std::uint16_t b) {
  const int sign = b >> 15;
  const int exp = (b >> 7) & 0xff;
  const int mant = b & 0x7f;
  long double v;
  if (exp == 0xff)
    v = mant != 0 ? std::numeric_limits<long double>::quiet_NaN()
                  : std::numeric_limits<long double>::infinity();
  else if (exp == 0)
    v = std::ldexp(static_cast<long double>(mant), -133);
  else
    v = std::ldexp(static_cast<long double>(mant + 128), exp - 134);
  return sign ? -v : v;
}

struct Format {
  int precision;  // significand bits including the implicit one
  int emin;       // exponent of the smallest normal
  int emax;       // exponent of the largest finite
};
constexpr Format kHalf{11, -14, 15};
constexpr Format kBf16{8, -126, 127};

// Rounds v to the format, nearest-even, overflow to infinity, in long
// double (64-bit significand: every float is exact, and the scaling by
// powers of two below is exact).
long double round_to(long double v, Format f) {
  if (v == 0 || std::isnan(v) || std::isinf(v)) return v;
  const long double a = std::fabs(v);
  int e = 0;
  std::frexp(a, &e);  // a = m * 2^e, m in [0.5, 1)
  const int exp = std::max(e - 1, f.emin);
  const long double quantum = std::ldexp(1.0L, exp - (f.precision - 1));
  long double r = std::nearbyint(a / quantum) * quantum;  // default mode: nearest even
  if (r >= std::ldexp(1.0L, f.emax + 1)) r = std::numeric_limits<long double>::infinity();
  return v < 0 ? -r : r;
}

// Encodes a value already representable in the format.
std::uint16_t encode(long double v, Format f) {
  const std::uint16_t sign = std::signbit(v) ? 0x8000 : 0;
  const int mant_bits = f.precision - 1;
  const int bias = 1 - f.emin;  // 15 or 127
  const long double a = std::fabs(v);
  if (std::isinf(a)) return sign | static_cast<std::uint16_t>((2 * bias + 1) << mant_bits);
  if (a < std::ldexp(1.0L, f.emin))
    return sign | static_cast<std::uint16_t>(a / std::ldexp(1.0L, f.emin - mant_bits));
  int e = 0;
  std::frexp(a, &e);
  const int exp = e - 1;
  const auto mant =
      static_cast<unsigned>(a / std::ldexp(1.0L, exp - mant_bits)) - (1u << mant_bits);
  return sign | static_cast<std::uint16_t>(((exp + bias) << mant_bits) | mant);
}

long double ulp_of(long double v, Format f) {
  const long double a = std::fabs(v);
  int e = 0;
  std::frexp(a, &e);
  const int exp = std::max(e - 1, f.emin);
  return std::ldexp(1.0L, exp - (f.precision - 1));
}

// ---------------------------------------------------------------------------
// Typed access to raw buffers.

bool is_int(wia_datatype_t t) { return t <= WIA_UINT64; }
bool is_signed_int(wia_datatype_t t) { return t == WIA_INT8 || t == WIA_INT32 || t == WIA_INT64; }
int int_bits(wia_datatype_t t) { return static_cast<int>(wia::kernels::dtype_size(t)) * 8; }

i128 load_int(wia_datatype_t t, const void* p, std::size_t i) {
  switch (t) {
    case WIA_INT8:
      return static_cast<const std::int8_t*>(p)[i];
    case WIA_UINT8:
      return static_cast<const std::uint8_t*>(p)[i];
    case WIA_INT32:
      return static_cast<const std::int32_t*>(p)[i];
    case WIA_UINT32:
      return static_cast<const std::uint32_t*>(p)[i];
    case WIA_INT64:
      return static_cast<const std::int64_t*>(p)[i];
    default:
      return static_cast<const std::uint64_t*>(p)[i];
  }
}

// Reduces v modulo 2^bits into the type's range (two's complement).
i128 wrap(i128 v, wia_datatype_t t) {
  const int bits = int_bits(t);
  const u128 mask = bits == 64 ? ~static_cast<u128>(0) >> 64 : (static_cast<u128>(1) << bits) - 1;
  u128 u = static_cast<u128>(v) & mask;
  if (is_signed_int(t) && (u >> (bits - 1)) != 0)
    return static_cast<i128>(u) - (static_cast<i128>(1) << bits);
  return static_cast<i128>(u);
}

long double load_float(wia_datatype_t t, const void* p, std::size_t i) {
  switch (t) {
    case WIA_FLOAT16:
      return decode_half(static_cast<const std::uint16_t*>(p)[i]);
    case WIA_BFLOAT16:
      return decode_bf16(static_cast<const std::uint16_t*>(p)[i]);
    case WIA_FLOAT32:
      return static_cast<const float*>(p)[i];
    default:
      return static_cast<const double*>(p)[i];
  }
}

// ---------------------------------------------------------------------------
// Test data.

// SplitMix64: fast and good enough for test data (std::mt19937_64 with
// distributions dominated the run time).
struct Rng {
  std::uint64_t state;
  std::uint64_t operator()() {
    std::uint64_t z = (state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  // Uniform in [lo, hi).
  double uniform(double lo, double hi) {
    return lo + (hi - lo) * static_cast<double>((*this)() >> 11) * 0x1.0p-53;
  }
};

void fill(wia_datatype_t t, wia_reduce_op_t op, void* p, std::size_t n, Rng& rng) {
  // Mixed signs (cancellation) for sums; factors near 1 for products so
  // that nothing overflows and the relative bound stays meaningful.
  auto value = [&]() -> double {
    if (op == WIA_REDUCE_PROD) return (rng() & 1 ? -1.0 : 1.0) * rng.uniform(0.5, 2.0);
    return rng.uniform(-4.0, 4.0);
  };
  switch (t) {
    case WIA_FLOAT16:
      for (std::size_t i = 0; i < n; ++i)
        static_cast<std::uint16_t*>(p)[i] = float_to_half(static_cast<float>(value()));
      break;
    case WIA_BFLOAT16:
      for (std::size_t i = 0; i < n; ++i)
        static_cast<std::uint16_t*>(p)[i] = float_to_bfloat16(static_cast<float>(value()));
      break;
    case WIA_FLOAT32:
      for (std::size_t i = 0; i < n; ++i) static_cast<float*>(p)[i] = static_cast<float>(value());
      break;
    case WIA_FLOAT64:
      for (std::size_t i = 0; i < n; ++i) static_cast<double*>(p)[i] = value();
      break;
    default: {
      // Full-range bit patterns: sums and products wrap, signs mix.
      auto* b = static_cast<std::uint8_t*>(p);
      const std::size_t bytes = n * wia::kernels::dtype_size(t);
      for (std::size_t i = 0; i < bytes; i += 8) {
        const std::uint64_t r = rng();
        std::memcpy(b + i, &r, std::min<std::size_t>(8, bytes - i));
      }
      break;
    }
  }
}

struct Case {
  wia_datatype_t dtype;
  wia_reduce_op_t op;
  std::uint32_t nsrcs;
  std::size_t count;
  bool in_place;
  std::uint64_t divisor;
};

std::string describe(const Case& c) {
  return std::string(wia::kernels::dtype_name(c.dtype)) + " " + wia::kernels::reduce_op_name(c.op) +
         " nsrcs=" + std::to_string(c.nsrcs) + " count=" + std::to_string(c.count) +
         (c.in_place ? " in-place" : "") + " divisor=" + std::to_string(c.divisor);
}

// Runs one case; returns the number of mismatching elements (and reports
// the first few).
std::size_t run_case(const Case& c, Rng& rng) {
  const std::size_t es = wia::kernels::dtype_size(c.dtype);
  // One element of slack at the front of every buffer: the kernels must
  // not assume any alignment beyond the element's.
  std::vector<std::vector<unsigned char>> store(
      c.nsrcs + 1, std::vector<unsigned char>((c.count + 1) * es + 64));
  std::vector<void*> bufs;
  for (auto& s : store) bufs.push_back(s.data() + es);
  for (std::uint32_t k = 0; k < c.nsrcs; ++k) fill(c.dtype, c.op, bufs[k], c.count, rng);
  // Keep pristine copies of the inputs (an in-place run overwrites srcs[0]).
  std::vector<std::vector<unsigned char>> inputs;
  for (std::uint32_t k = 0; k < c.nsrcs; ++k)
    inputs.emplace_back(static_cast<unsigned char*>(bufs[k]),
                        static_cast<unsigned char*>(bufs[k]) + c.count * es);
  void* dst = c.in_place ? bufs[0] : bufs[c.nsrcs];
  std::vector<const void*> srcs(bufs.begin(), bufs.begin() + c.nsrcs);

  wia_reduce_args_v1_t args{};
  args.struct_size = sizeof(args);
  args.dtype = c.dtype;
  args.op = c.op;
  args.nsrcs = c.nsrcs;
  args.count = c.count;
  args.divisor = c.divisor;
  args.dst = dst;
  args.srcs = srcs.data();
  REQUIRE(wia::kernels::reduce(args) == WIA_SUCCESS);

  std::uint64_t div = c.divisor;
  if (c.op == WIA_REDUCE_AVG && div == 0) div = c.nsrcs;
  const bool sum_like = c.op == WIA_REDUCE_SUM || c.op == WIA_REDUCE_AVG;

  std::size_t bad = 0;
  for (std::size_t i = 0; i < c.count; ++i) {
    bool ok = true;
    long double want_value = 0, got_value = 0;
    if (is_int(c.dtype)) {
      i128 acc = load_int(c.dtype, inputs[0].data(), i);
      for (std::uint32_t k = 1; k < c.nsrcs; ++k) {
        const i128 x = load_int(c.dtype, inputs[k].data(), i);
        switch (c.op) {
          case WIA_REDUCE_SUM:
          case WIA_REDUCE_AVG:
            acc = wrap(acc + x, c.dtype);
            break;
          case WIA_REDUCE_PROD:
            // Both factors are below 2^64 in magnitude: the product fits.
            acc = wrap(static_cast<i128>(static_cast<u128>(acc) * static_cast<u128>(x)), c.dtype);
            break;
          case WIA_REDUCE_MIN:
            acc = x < acc ? x : acc;
            break;
          default:
            acc = x > acc ? x : acc;
            break;
        }
      }
      if (div > 1) acc = acc / static_cast<i128>(div);  // truncates toward zero
      const i128 got = load_int(c.dtype, dst, i);
      ok = got == acc;
      want_value = static_cast<long double>(acc);
      got_value = static_cast<long double>(got);
    } else {
      const bool narrow = c.dtype == WIA_FLOAT16 || c.dtype == WIA_BFLOAT16;
      long double acc = load_float(c.dtype, inputs[0].data(), i);
      long double magnitude = std::fabs(acc);
      for (std::uint32_t k = 1; k < c.nsrcs; ++k) {
        const long double x = load_float(c.dtype, inputs[k].data(), i);
        magnitude += std::fabs(x);
        switch (c.op) {
          case WIA_REDUCE_SUM:
          case WIA_REDUCE_AVG:
            acc += x;
            break;
          case WIA_REDUCE_PROD:
            acc *= x;
            break;
          case WIA_REDUCE_MIN:
            acc = x < acc ? x : acc;
            break;
          default:
            acc = x > acc ? x : acc;
            break;
        }
      }
      if (div > 1) {
        acc /= static_cast<long double>(div);
        magnitude /= static_cast<long double>(div);
      }
      const long double got = load_float(c.dtype, dst, i);
      // Unit roundoff of the type the kernel accumulates in.
      const long double u = c.dtype == WIA_FLOAT64 ? std::ldexp(1.0L, -53) : std::ldexp(1.0L, -24);
      const long double n = static_cast<long double>(c.nsrcs);
      long double tol = 0;
      if (sum_like)
        tol = (n - 1) * u * magnitude + u * std::fabs(acc);
      else if (c.op == WIA_REDUCE_PROD)
        tol = (n + 1) * u * std::fabs(acc);
      // MIN/MAX are exact; a divisor adds one rounding of the quotient.
      const bool exact = (c.op == WIA_REDUCE_MIN || c.op == WIA_REDUCE_MAX) && div <= 1;
      if (!exact && !sum_like && c.op != WIA_REDUCE_PROD) tol += u * std::fabs(acc);
      long double want = acc;
      if (narrow) {
        const Format f = c.dtype == WIA_FLOAT16 ? kHalf : kBf16;
        want = round_to(acc, f);
        if (!exact) tol += ulp_of(want, f);
      } else if (c.dtype == WIA_FLOAT32 && exact) {
        want = static_cast<float>(acc);
      }
      ok = std::fabs(got - want) <= tol;
      want_value = want;
      got_value = got;
    }
    if (!ok && ++bad <= 3)
      FAIL_CHECK(describe(c) << " element " << i << ": got " << static_cast<double>(got_value)
                             << ", want " << static_cast<double>(want_value));
  }
  return bad;
}

}  // namespace

TEST_CASE("dtype and op names and sizes") {
  CHECK(wia::kernels::dtype_size(WIA_INT8) == 1);
  CHECK(wia::kernels::dtype_size(WIA_BFLOAT16) == 2);
  CHECK(wia::kernels::dtype_size(WIA_UINT32) == 4);
  CHECK(wia::kernels::dtype_size(WIA_FLOAT64) == 8);
  CHECK(wia::kernels::dtype_size(static_cast<wia_datatype_t>(42)) == 0);
  CHECK(std::string(wia::kernels::dtype_name(WIA_BFLOAT16)) == "bfloat16");
  CHECK(std::string(wia::kernels::dtype_name(static_cast<wia_datatype_t>(-1))) == "invalid");
  CHECK(std::string(wia::kernels::reduce_op_name(WIA_REDUCE_AVG)) == "avg");
  CHECK(std::string(wia::kernels::reduce_op_name(WIA_REDUCE_OP_COUNT)) == "invalid");
}

TEST_CASE("half_to_float decodes every float16 exactly, specials included") {
  for (std::uint32_t h = 0; h <= 0xffff; ++h) {
    const long double want = decode_half(static_cast<std::uint16_t>(h));
    const float got = half_to_float(static_cast<std::uint16_t>(h));
    if (std::isnan(want)) {
      CHECK(std::isnan(got));
      CHECK(std::signbit(got) == ((h & 0x8000) != 0));
    } else if (static_cast<long double>(got) != want || std::signbit(got) != std::signbit(want)) {
      FAIL_CHECK("half 0x" << std::hex << h << ": got " << got);
    }
  }
}

TEST_CASE("bfloat16_to_float decodes every bfloat16 exactly, specials included") {
  for (std::uint32_t b = 0; b <= 0xffff; ++b) {
    const long double want = decode_bf16(static_cast<std::uint16_t>(b));
    const float got = bfloat16_to_float(static_cast<std::uint16_t>(b));
    if (std::isnan(want)) {
      CHECK(std::isnan(got));
    } else if (static_cast<long double>(got) != want || std::signbit(got) != std::signbit(want)) {
      FAIL_CHECK("bfloat16 0x" << std::hex << b << ": got " << got);
    }
  }
}

namespace {

// Every float whose rounding to a 16-bit format is interesting: a stride
// through all bit patterns, plus each midpoint between neighbours of the
// target format and the floats right next to it (where ties-to-even and
// off-by-one errors show), plus the specials.
std::vector<float> conversion_probes(bool half) {
  std::vector<float> v;
  for (std::uint64_t u = 0; u <= 0xffffffffull; u += 4099) {
    float f;
    const auto bits = static_cast<std::uint32_t>(u);
    std::memcpy(&f, &bits, sizeof(f));
    v.push_back(f);
  }
  for (std::uint32_t h = 0; h < 0x7fff; ++h) {
    const long double a = half ? decode_half(static_cast<std::uint16_t>(h))
                               : decode_bf16(static_cast<std::uint16_t>(h));
    const long double b = half ? decode_half(static_cast<std::uint16_t>(h + 1))
                               : decode_bf16(static_cast<std::uint16_t>(h + 1));
    if (std::isnan(a) || std::isnan(b)) continue;
    const long double hi = std::isinf(b) ? std::ldexp(1.0L, half ? 16 : 128) : b;
    const auto mid = static_cast<float>((a + hi) / 2);
    for (float f : {mid, std::nextafter(mid, 0.0f), std::nextafter(mid, INFINITY)}) {
      v.push_back(f);
      v.push_back(-f);
    }
  }
  for (float f : {0.0f, -0.0f, INFINITY, -INFINITY, 65504.0f, 65519.99f, 65520.0f, 1e-8f,
                  std::numeric_limits<float>::denorm_min(), std::numeric_limits<float>::max()})
    v.push_back(f);
  return v;
}

}  // namespace

TEST_CASE("float_to_half rounds to nearest even, with subnormals, overflow and NaN") {
  std::size_t bad = 0;
  for (const float f : conversion_probes(true)) {
    const std::uint16_t got = float_to_half(f);
    if (std::isnan(f)) {
      CHECK(std::isnan(decode_half(got)));
      continue;
    }
    const std::uint16_t want = encode(round_to(f, kHalf), kHalf);
    if (got != want && ++bad <= 5)
      FAIL_CHECK("float " << f << ": got 0x" << std::hex << got << ", want 0x" << want);
  }
  CHECK(bad == 0);
  CHECK(float_to_half(65504.0f) == 0x7bff);
  CHECK(float_to_half(65520.0f) == 0x7c00);  // the tie above the largest finite goes to Inf
  CHECK(float_to_half(std::ldexp(1.0f, -24)) == 0x0001);  // smallest subnormal
  CHECK(float_to_half(std::ldexp(1.0f, -25)) == 0x0000);  // tie to even: zero
  CHECK(float_to_half(-0.0f) == 0x8000);
  CHECK((float_to_half(NAN) & 0x7e00) == 0x7e00);  // quiet NaN
  // A signalling NaN whose payload lives only in the low bits stays NaN.
  float snan;
  const std::uint32_t snan_bits = 0x7f800001u;
  std::memcpy(&snan, &snan_bits, sizeof(snan));
  CHECK(std::isnan(half_to_float(float_to_half(snan))));
}

TEST_CASE("float_to_bfloat16 rounds to nearest even, with subnormals, overflow and NaN") {
  std::size_t bad = 0;
  for (const float f : conversion_probes(false)) {
    const std::uint16_t got = float_to_bfloat16(f);
    if (std::isnan(f)) {
      if (!std::isnan(decode_bf16(got)) && ++bad <= 5) FAIL_CHECK("NaN lost for " << f);
      continue;
    }
    const std::uint16_t want = encode(round_to(f, kBf16), kBf16);
    if (got != want && ++bad <= 5)
      FAIL_CHECK("float " << f << ": got 0x" << std::hex << got << ", want 0x" << want);
  }
  CHECK(bad == 0);
  CHECK(float_to_bfloat16(std::numeric_limits<float>::max()) == 0x7f80);  // rounds to Inf
  float snan;
  const std::uint32_t snan_bits = 0x7f800001u;  // payload only in the dropped half
  std::memcpy(&snan, &snan_bits, sizeof(snan));
  CHECK(std::isnan(bfloat16_to_float(float_to_bfloat16(snan))));
}

TEST_CASE("reduce: every dtype x op x nsrcs x count, in place and not") {
  Rng rng{20240601};
  std::size_t bad = 0;
  for (const auto dtype : kAllTypes) {
    for_each_float16_path(dtype, [&](bool full) {
      for (const auto op : kAllOps) {
        for (const std::uint32_t nsrcs : {1u, 2u, 3u, 5u}) {
          for (const std::size_t count : {0ul, 1ul, 7ul, 4099ul, 100003ul}) {
            if (!full && count > 4099) continue;
            bad += run_case({dtype, op, nsrcs, count, false, 0}, rng);
            // In place: 4099 already spans several blocks of every type.
            if (count <= 4099) bad += run_case({dtype, op, nsrcs, count, true, 0}, rng);
          }
        }
        // Shapes that reach every fused kernel (4 + 2, 4 + 3, 4 + 3 + 2).
        for (const std::uint32_t nsrcs : {4u, 6u, 7u, 9u}) {
          for (const bool in_place : {false, true})
            bad += run_case({dtype, op, nsrcs, 4099, in_place, 0}, rng);
        }
      }
    });
  }
  CHECK(bad == 0);
}

TEST_CASE("reduce: explicit divisors apply to every op and truncate integers") {
  Rng rng{7};
  std::size_t bad = 0;
  for (const auto dtype : kAllTypes) {
    for_each_float16_path(dtype, [&](bool /*full*/) {
      for (const auto op : kAllOps) {
        for (const std::uint64_t divisor : {1ull, 3ull, 7ull, 1000ull}) {
          bad += run_case({dtype, op, 3, 4099, false, divisor}, rng);
          bad += run_case({dtype, op, 2, 33, true, divisor}, rng);
        }
      }
    });
  }
  CHECK(bad == 0);
}

TEST_CASE("reduce: integer AVG truncates toward zero and handles huge divisors") {
  auto avg64 = [](std::int64_t a, std::int64_t b, std::uint64_t divisor) {
    const std::int64_t in0[] = {a};
    const std::int64_t in1[] = {b};
    std::int64_t out = 12345;
    const void* srcs[] = {in0, in1};
    wia_reduce_args_v1_t args{sizeof(args), WIA_INT64, WIA_REDUCE_AVG, 2, 1, divisor, &out, srcs};
    REQUIRE(wia::kernels::reduce(args) == WIA_SUCCESS);
    return out;
  };
  CHECK(avg64(-3, 0, 0) == -1);  // -3 / 2 truncates to -1, not -2
  CHECK(avg64(3, 0, 0) == 1);
  CHECK(avg64(INT64_MIN, 0, 1ull << 63) == -1);
  CHECK(avg64(INT64_MIN + 1, 0, 1ull << 63) == 0);
  CHECK(avg64(INT64_MAX, 0, ~0ull) == 0);
  CHECK(avg64(INT64_MAX, 1, 2) == INT64_MIN / 2);  // wrapped sum, then divided

  const std::int8_t a8[] = {-128, 100};
  const std::int8_t b8[] = {-1, 100};
  std::int8_t out8[2];
  const void* srcs8[] = {a8, b8};
  wia_reduce_args_v1_t args{sizeof(args), WIA_INT8, WIA_REDUCE_AVG, 2, 2, 0, out8, srcs8};
  REQUIRE(wia::kernels::reduce(args) == WIA_SUCCESS);
  CHECK(out8[0] == 63);   // -129 wraps to 127, 127 / 2 = 63
  CHECK(out8[1] == -28);  // 200 wraps to -56, -56 / 2 = -28
}

TEST_CASE("reduce: float MIN/MAX propagate NaN from any source position") {
  for (const auto dtype : {WIA_FLOAT16, WIA_BFLOAT16, WIA_FLOAT32, WIA_FLOAT64}) {
    for_each_float16_path(dtype, [&](bool /*full*/) {
      for (const auto op : {WIA_REDUCE_MIN, WIA_REDUCE_MAX, WIA_REDUCE_SUM}) {
        for (std::uint32_t nan_at = 0; nan_at < 5; ++nan_at) {
          constexpr std::size_t kCount = 37;
          std::vector<std::vector<double>> raw(5, std::vector<double>(kCount, 1.5));
          for (std::size_t i = 0; i < kCount; ++i) raw[nan_at][i] = NAN;
          std::vector<std::vector<unsigned char>> bufs;
          std::vector<const void*> srcs;
          const std::size_t es = wia::kernels::dtype_size(dtype);
          for (auto& r : raw) {
            bufs.emplace_back(kCount * es);
            for (std::size_t i = 0; i < kCount; ++i) {
              const float f = static_cast<float>(r[i]);
              std::uint16_t h = dtype == WIA_FLOAT16 ? float_to_half(f) : float_to_bfloat16(f);
              if (dtype == WIA_FLOAT32)
                std::memcpy(&bufs.back()[i * es], &f, es);
              else if (dtype == WIA_FLOAT64)
                std::memcpy(&bufs.back()[i * es], &r[i], es);
              else
                std::memcpy(&bufs.back()[i * es], &h, es);
            }
            srcs.push_back(bufs.back().data());
          }
          std::vector<unsigned char> dst(kCount * es);
          wia_reduce_args_v1_t args{sizeof(args), dtype, op, 5, kCount, 0, dst.data(), srcs.data()};
          REQUIRE(wia::kernels::reduce(args) == WIA_SUCCESS);
          for (std::size_t i = 0; i < kCount; ++i)
            CHECK_MESSAGE(std::isnan(load_float(dtype, dst.data(), i)),
                          wia::kernels::dtype_name(dtype)
                              << " " << wia::kernels::reduce_op_name(op) << " NaN at " << nan_at);
        }
      }
    });
  }
}

TEST_CASE("reduce: infinities follow IEEE (inf + -inf is NaN, min picks -inf)") {
  const float a[] = {INFINITY, INFINITY, 1.0f};
  const float b[] = {-INFINITY, 1.0f, -INFINITY};
  float out[3];
  const void* srcs[] = {a, b};
  wia_reduce_args_v1_t args{sizeof(args), WIA_FLOAT32, WIA_REDUCE_SUM, 2, 3, 0, out, srcs};
  REQUIRE(wia::kernels::reduce(args) == WIA_SUCCESS);
  CHECK(std::isnan(out[0]));
  CHECK(out[1] == INFINITY);
  CHECK(out[2] == -INFINITY);
  args.op = WIA_REDUCE_MIN;
  REQUIRE(wia::kernels::reduce(args) == WIA_SUCCESS);
  CHECK(out[0] == -INFINITY);
  CHECK(out[1] == 1.0f);
  CHECK(out[2] == -INFINITY);
}

TEST_CASE("reduce: invalid arguments are rejected before touching memory") {
  float a[4] = {1, 2, 3, 4};
  float b[4] = {1, 2, 3, 4};
  float out[4];
  const void* srcs[] = {a, b};
  wia_reduce_args_v1_t ok{sizeof(ok), WIA_FLOAT32, WIA_REDUCE_SUM, 2, 4, 0, out, srcs};
  CHECK(wia::kernels::reduce_args_error(ok) == nullptr);

  auto rejected = [](wia_reduce_args_v1_t args) {
    return wia::kernels::reduce_args_error(args) != nullptr &&
           wia::kernels::reduce(args) == WIA_ERROR_INVALID_ARGUMENT;
  };
  auto bad = ok;
  bad.struct_size = 8;
  CHECK(rejected(bad));
  bad = ok;
  bad.dtype = static_cast<wia_datatype_t>(WIA_DATATYPE_COUNT);
  CHECK(rejected(bad));
  bad = ok;
  bad.op = static_cast<wia_reduce_op_t>(WIA_REDUCE_OP_COUNT);
  CHECK(rejected(bad));
  bad = ok;
  bad.nsrcs = 0;
  CHECK(rejected(bad));
  bad = ok;
  bad.dst = nullptr;
  CHECK(rejected(bad));
  bad = ok;
  bad.srcs = nullptr;
  CHECK(rejected(bad));
  const void* null_src[] = {a, nullptr};
  bad = ok;
  bad.srcs = null_src;
  CHECK(rejected(bad));
  // dst may alias srcs[0] exactly, nothing else.
  const void* alias1[] = {a, out};
  bad = ok;
  bad.srcs = alias1;
  CHECK(rejected(bad));
  const void* partial[] = {out + 1, b};
  bad = ok;
  bad.srcs = partial;
  CHECK(rejected(bad));
  const void* in_place[] = {out, b};
  auto good = ok;
  good.srcs = in_place;
  CHECK(wia::kernels::reduce_args_error(good) == nullptr);
  // count 0 is a no-op whatever the pointers.
  wia_reduce_args_v1_t empty{sizeof(empty), WIA_FLOAT32, WIA_REDUCE_SUM, 3, 0, 0, nullptr, nullptr};
  CHECK(wia::kernels::reduce(empty) == WIA_SUCCESS);
}

TEST_CASE("reduce: float16/bfloat16 blocks round-trip every bit pattern (identity ops)") {
  // Adding +0 and multiplying by 1 are exact, so the result must be each
  // input again: this drives every code, subnormals and specials included,
  // through the block widen/narrow paths (hardware F16C where available).
  for (const auto dtype : {WIA_FLOAT16, WIA_BFLOAT16}) {
    std::vector<std::uint16_t> all(65536), zero(65536, 0), one(65536), out(65536);
    const std::uint16_t one_bits = dtype == WIA_FLOAT16 ? 0x3c00 : 0x3f80;
    for (std::uint32_t i = 0; i < 65536; ++i) {
      all[i] = static_cast<std::uint16_t>(i);
      one[i] = one_bits;
    }
    auto decode = [&](std::uint16_t b) {
      return dtype == WIA_FLOAT16 ? decode_half(b) : decode_bf16(b);
    };
    for_each_float16_path(dtype, [&](bool /*full*/) {
      for (const auto op : {WIA_REDUCE_SUM, WIA_REDUCE_PROD, WIA_REDUCE_MIN, WIA_REDUCE_MAX}) {
        const void* srcs[] = {all.data(), op == WIA_REDUCE_PROD ? one.data() : all.data()};
        const std::uint32_t nsrcs = op == WIA_REDUCE_SUM ? 1 : 2;
        wia_reduce_args_v1_t args{sizeof(args), dtype, op, nsrcs, 65536, 0, out.data(), srcs};
        REQUIRE(wia::kernels::reduce(args) == WIA_SUCCESS);
        std::size_t bad = 0;
        for (std::uint32_t i = 0; i < 65536; ++i) {
          const long double want = decode(all[i]);
          const long double got = decode(out[i]);
          const bool ok = std::isnan(want)
                              ? std::isnan(got)
                              : (got == want && std::signbit(got) == std::signbit(want));
          if (!ok && ++bad <= 3)
            FAIL_CHECK(wia::kernels::dtype_name(dtype)
                       << " " << wia::kernels::reduce_op_name(op) << " 0x" << std::hex << i
                       << " -> 0x" << out[i]);
        }
        CHECK(bad == 0);
      }
    });
  }
}

TEST_CASE("float16 implementations: the forced path is honoured and restorable") {
  using wia::kernels::Float16Path;
  CHECK(wia::kernels::force_float16_path_for_testing(Float16Path::kPortable));
  CHECK(wia::kernels::force_float16_path_for_testing(Float16Path::kAuto));
  MESSAGE("float16 implementations on this CPU: " << float16_paths().size());
}

TEST_CASE("pair_reduce: bit for bit what reduce gives two sources, or empty") {
  // The resolved two-source kernel (a small all-reduce between two ranks)
  // must agree with reduce() exactly, or the ranks taking it and those
  // taking reduce() would disagree; AVG, float16 and bfloat16 need more
  // than one kernel call and get none.
  Rng rng{20261201};
  for (const auto dtype : kAllTypes) {
    for (const auto op : kAllOps) {
      INFO(wia::kernels::dtype_name(dtype) << " " << wia::kernels::reduce_op_name(op));
      const wia::kernels::PairReduce pair = wia::kernels::pair_reduce(dtype, op);
      const bool expected = op != WIA_REDUCE_AVG && dtype != WIA_FLOAT16 && dtype != WIA_BFLOAT16;
      REQUIRE(static_cast<bool>(pair) == expected);
      if (!pair) continue;
      for (const std::size_t count : {0ul, 1ul, 3ul, 4099ul}) {
        const std::size_t bytes = count * wia::kernels::dtype_size(dtype);
        std::vector<unsigned char> a(bytes + 1), b(bytes + 1), want(bytes + 1),
            got(bytes + 1, 0xA5);
        fill(dtype, op, a.data(), count, rng);
        fill(dtype, op, b.data(), count, rng);
        const void* srcs[2] = {a.data(), b.data()};
        wia_reduce_args_v1_t args{};
        args.struct_size = sizeof(args);
        args.dtype = dtype;
        args.op = op;
        args.nsrcs = 2;
        args.count = count;
        args.dst = want.data();
        args.srcs = srcs;
        REQUIRE(wia::kernels::reduce(args) == WIA_SUCCESS);
        pair(got.data(), a.data(), b.data(), count);
        CHECK(std::memcmp(got.data(), want.data(), bytes) == 0);
        CHECK(got[bytes] == 0xA5);  // nothing written past the vector
      }
    }
  }
}

TEST_CASE("bulk conversions equal the scalar ones, on every float16 path") {
  // Every 16-bit pattern widens as the scalar form does (bit for bit, NaN
  // for NaN: F16C quiets a signalling NaN's payload), and floats around every half/bfloat16
  // rounding boundary narrow alike; odd lengths exercise the vector loops' tails.
  std::vector<std::uint16_t> bits(65536 + 7);
  for (std::size_t i = 0; i < bits.size(); ++i) bits[i] = static_cast<std::uint16_t>(i * 40503u);
  std::vector<float> floats;
  for (std::uint32_t e = 0; e < 256; e += 3)
    for (std::uint32_t m : {0u, 1u, 0xfffu, 0x1000u, 0x1001u, 0x7fffu, 0x8000u, 0x8001u, 0x7fffffu})
      for (std::uint32_t sign : {0u, 0x80000000u})
        floats.push_back(std::bit_cast<float>(sign | e << 23 | m));
  for (const auto path : float16_paths()) {
    CAPTURE(static_cast<int>(path));
    wia::kernels::force_float16_path_for_testing(path);
    std::vector<float> wide(bits.size());
    wia::kernels::half_to_float_n(bits.data(), wide.data(), bits.size());
    for (std::size_t i = 0; i < bits.size(); ++i) {
      const float want = wia::kernels::half_to_float(bits[i]);
      if (std::isnan(want))  // F16C quiets signalling NaNs; still NaN
        REQUIRE(std::isnan(wide[i]));
      else
        REQUIRE(std::bit_cast<std::uint32_t>(wide[i]) == std::bit_cast<std::uint32_t>(want));
    }
    std::vector<std::uint16_t> narrow(floats.size());
    wia::kernels::float_to_half_n(floats.data(), narrow.data(), floats.size());
    for (std::size_t i = 0; i < floats.size(); ++i) {
      const std::uint16_t want = wia::kernels::float_to_half(floats[i]);
      if (std::isnan(floats[i]))
        REQUIRE((narrow[i] & 0x7c00u) == 0x7c00u);
      else
        REQUIRE(narrow[i] == want);
    }
  }
  wia::kernels::force_float16_path_for_testing(wia::kernels::Float16Path::kAuto);
  std::vector<float> wide(bits.size());
  wia::kernels::bfloat16_to_float_n(bits.data(), wide.data(), bits.size());
  for (std::size_t i = 0; i < bits.size(); ++i)
    REQUIRE(std::bit_cast<std::uint32_t>(wide[i]) ==
            std::bit_cast<std::uint32_t>(wia::kernels::bfloat16_to_float(bits[i])));
  std::vector<std::uint16_t> narrow(floats.size());
  wia::kernels::float_to_bfloat16_n(floats.data(), narrow.data(), floats.size());
  for (std::size_t i = 0; i < floats.size(); ++i)
    REQUIRE(narrow[i] == wia::kernels::float_to_bfloat16(floats[i]));
}
