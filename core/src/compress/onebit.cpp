// SPDX-License-Identifier: Apache-2.0
// 1-bit compression (DeepSpeed's 1-bit Adam style): a sign per entry and
// one scale per chunk. Biased on its own; error feedback makes it converge.
//
// Speed: like quantize.cpp, one pass over memory. Per chunk of 256 the
// corrected entries w = x + r, their mean magnitude (8 double lanes in a
// fixed order), the signs and the new residual are computed in L1; signs
// are packed 8 at a time by one multiply (each 0/1 byte lands on its own
// bit) and unpacked through a table of 256 byte patterns.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>

#include "compress/codec.hpp"
#include "compress/simd.hpp"
#include "kernels/cpu_reduce.hpp"

namespace wia::compress {
namespace {

std::size_t scale_bytes(wia_datatype_t t) noexcept { return t == WIA_FLOAT32 ? 4 : 2; }

// Stores s in the scale type and returns the value a decoder will read.
float put_scale(std::byte* p, float s, wia_datatype_t t) noexcept {
  if (t == WIA_FLOAT32) {
    std::memcpy(p, &s, 4);
    return s;
  }
  const std::uint16_t h =
      t == WIA_FLOAT16 ? kernels::float_to_half(s) : kernels::float_to_bfloat16(s);
  std::memcpy(p, &h, 2);
  return t == WIA_FLOAT16 ? kernels::half_to_float(h) : kernels::bfloat16_to_float(h);
}

float get_scale(const std::byte* p, wia_datatype_t t) noexcept {
  if (t == WIA_FLOAT32) {
    float s;
    std::memcpy(&s, p, 4);
    return s;
  }
  std::uint16_t h;
  std::memcpy(&h, p, 2);
  return t == WIA_FLOAT16 ? kernels::half_to_float(h) : kernels::bfloat16_to_float(h);
}

// Byte b as 8 bytes of 0 or 1, bit k in byte k (little-endian).
constexpr std::array<std::uint64_t, 256> kSpread = [] {
  std::array<std::uint64_t, 256> t{};
  for (unsigned b = 0; b < 256; ++b)
    for (unsigned k = 0; k < 8; ++k) t[b] |= std::uint64_t{(b >> k) & 1u} << (8 * k);
  return t;
}();

// 8 bytes of 0 or 1 (byte k) to one byte with bit k set from byte k: in
// the product, byte k's bit lands at 56 + k and no two terms share a bit
// at or above 56, nor carry into them.
WIA_CODEC_INLINE std::uint8_t gather_bits(std::uint64_t v) noexcept {
  return static_cast<std::uint8_t>((v * 0x0102040810204080ULL) >> 56);
}

// The first part of a chunk: w = x (+ r), sum of |w| in 8 double lanes.
template <bool kEf>
WIA_CODEC_INLINE double load_chunk(const float* __restrict x, const float* __restrict r,
                                   float* __restrict w, std::size_t len) noexcept {
  constexpr std::size_t kLanes = 8;
  double s[kLanes] = {};
  std::size_t i = 0;
  for (; i + kLanes <= len; i += kLanes)
    for (std::size_t l = 0; l < kLanes; ++l) {
      const float v = kEf ? x[i + l] + r[i + l] : x[i + l];
      w[i + l] = v;
      s[l] += static_cast<double>(std::fabs(v));
    }
  for (; i < len; ++i) {
    const float v = kEf ? x[i] + r[i] : x[i];
    w[i] = v;
    s[0] += static_cast<double>(std::fabs(v));
  }
  double sum = 0;
  for (std::size_t l = 0; l < kLanes; ++l) sum += s[l];
  return sum;
}

template <bool kEf>
WIA_CODEC_INLINE void encode_impl(const float* __restrict x, float* __restrict r, std::size_t n,
                                  wia_datatype_t scale_type, std::byte* __restrict p) noexcept {
  const std::size_t sb = scale_bytes(scale_type);
  alignas(64) float w[kChunk];
  alignas(64) std::uint8_t m[kChunk];
  for (std::size_t base = 0; base < n; base += kChunk) {
    const std::size_t len = std::min(kChunk, n - base);
    const double sum = load_chunk<kEf>(x + base, kEf ? r + base : nullptr, w, len);
    const float s = put_scale(p, static_cast<float>(sum / static_cast<double>(len)), scale_type);
    std::byte* b = p + sb;
    for (std::size_t i = 0; i < len; ++i) m[i] = w[i] >= 0.0f ? 1 : 0;
    if constexpr (kEf) {
      float* rr = r + base;
      for (std::size_t i = 0; i < len; ++i) rr[i] = w[i] - (0.0f + (m[i] ? s : -s));
    }
    const std::size_t nb = (len + 7) / 8;
    for (std::size_t i = len; i < nb * 8; ++i) m[i] = 0;
    for (std::size_t j = 0; j < nb; ++j) {
      std::uint64_t v;
      std::memcpy(&v, m + 8 * j, 8);
      b[j] = static_cast<std::byte>(gather_bits(v));
    }
    p = b + nb;
  }
}

WIA_CODEC_INLINE void encode_body(const float* x, float* r, std::size_t n,
                                  wia_datatype_t scale_type, std::byte* p) noexcept {
  if (r)
    encode_impl<true>(x, r, n, scale_type, p);
  else
    encode_impl<false>(x, nullptr, n, scale_type, p);
}

// out = the sum over msgs, in order from 0, of each decoded entry (or out
// += that sum).
WIA_CODEC_INLINE void decode_body(const std::byte* const* msgs, std::size_t nmsgs, std::size_t n,
                                  wia_datatype_t scale_type, float* __restrict out,
                                  bool accumulate) noexcept {
  const std::size_t sb = scale_bytes(scale_type);
  alignas(64) float acc[kChunk];
  alignas(64) std::uint8_t m[kChunk];
  std::size_t offset = 0;
  for (std::size_t base = 0; base < n; base += kChunk) {
    const std::size_t len = std::min(kChunk, n - base);
    const std::size_t nb = (len + 7) / 8;
    for (std::size_t i = 0; i < len; ++i) acc[i] = 0.0f;
    for (std::size_t k = 0; k < nmsgs; ++k) {
      const std::byte* p = msgs[k] + offset;
      const float s = get_scale(p, scale_type);
      const auto* b = reinterpret_cast<const std::uint8_t*>(p + sb);
      for (std::size_t j = 0; j < nb; ++j) std::memcpy(m + 8 * j, &kSpread[b[j]], 8);
      for (std::size_t i = 0; i < len; ++i) acc[i] += m[i] ? s : -s;
    }
    float* o = out + base;
    if (accumulate)
      for (std::size_t i = 0; i < len; ++i) o[i] += acc[i];
    else
      for (std::size_t i = 0; i < len; ++i) o[i] = acc[i];
    offset += sb + nb;
  }
}

WIA_CODEC_DISPATCH(void, encode,
                   (const float* x, float* r, std::size_t n, wia_datatype_t scale_type,
                    std::byte* p) noexcept,
                   (x, r, n, scale_type, p))
WIA_CODEC_DISPATCH(void, decode,
                   (const std::byte* const* msgs, std::size_t nmsgs, std::size_t n,
                    wia_datatype_t scale_type, float* out, bool accumulate) noexcept,
                   (msgs, nmsgs, n, scale_type, out, accumulate))

}  // namespace

std::size_t onebit_bytes(std::size_t n, wia_datatype_t scale_type) noexcept {
  const std::size_t chunks = (n + kChunk - 1) / kChunk;
  return chunks * scale_bytes(scale_type) + (n / kChunk) * (kChunk / 8) + ((n % kChunk) + 7) / 8;
}

void onebit_encode(std::span<const float> x, wia_datatype_t scale_type, std::span<std::byte> out,
                   std::span<float> residual) {
  encode(x.data(), residual.empty() ? nullptr : residual.data(), x.size(), scale_type, out.data());
}

void onebit_decode_sum(std::span<const std::byte* const> msgs, wia_datatype_t scale_type,
                       std::span<float> out) {
  decode(msgs.data(), msgs.size(), out.size(), scale_type, out.data(), false);
}

void onebit_decode_add(std::span<const std::byte> msg, wia_datatype_t scale_type,
                       std::span<float> acc) {
  const std::byte* m = msg.data();
  decode(&m, 1, acc.size(), scale_type, acc.data(), true);
}

}  // namespace wia::compress
