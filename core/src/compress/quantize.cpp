// SPDX-License-Identifier: Apache-2.0
// Quantization to 1, 4, 8 or 16 bits with a [min, max] range per chunk and
// stochastic rounding, which makes every decoded entry an unbiased
// estimate of the original.
//
// Speed: one pass over memory per call. Encoding reads x (and the
// residual), and for each chunk of 256 entries computes w = x + r, its
// range, the levels, the value a decoder will read and the new residual
// while the chunk is in L1; decoding sums every rank's chunk in L1 and
// writes each output entry once. The loops are branch-free over 256
// entries (compress/simd.hpp says how they are compiled).
#include <algorithm>
#include <cmath>
#include <cstring>

#include "compress/codec.hpp"
#include "compress/simd.hpp"

namespace wia::compress {
namespace {

constexpr std::size_t kHeader = 2 * sizeof(float);  // minimum, step
constexpr std::size_t kBlock = kChunk;              // entries held in L1 at a time

std::size_t level_bytes(std::size_t len, int bits) noexcept {
  return (len * static_cast<std::size_t>(bits) + 7) / 8;
}

// A strong 32-bit mix (Wellons' lowbias32): the rounding noise of entry i
// is lowbias32(i ^ seed_lo) ^ seed_hi, a function of (seed, i), not a
// sequence, so the loop vectorises. One round (two multiplies) is enough:
// a bijection of the index, so no two entries of a call share their noise,
// and its avalanche decorrelates ranks (seeds differ in every bit). Two
// rounds cost a quarter of int8's encoding speed.
WIA_CODEC_INLINE std::uint32_t mix32(std::uint32_t x) noexcept {
  x ^= x >> 16;
  x *= 0x7feb352du;
  x ^= x >> 15;
  x *= 0x846ca68bu;
  x ^= x >> 16;
  return x;
}

// A float's bits as an int32 that orders as the float does (NaNs land
// beyond the infinities, which makes the range NaN and the step 0). Integer
// min and max reductions vectorise without -ffast-math; float ones do not.
WIA_CODEC_INLINE std::int32_t order_bits(float v) noexcept {
  std::int32_t b;
  std::memcpy(&b, &v, 4);
  return b ^ ((b >> 31) & 0x7fffffff);
}
WIA_CODEC_INLINE float from_order_bits(std::int32_t k) noexcept {
  const std::int32_t b = k ^ ((k >> 31) & 0x7fffffff);
  float v;
  std::memcpy(&v, &b, 4);
  return v;
}

// w = x (+ r) over len entries, and its range [lo, hi].
template <bool kEf>
WIA_CODEC_INLINE void range_of(const float* __restrict x, const float* __restrict r,
                               float* __restrict w, std::size_t len, float& lo,
                               float& hi) noexcept {
  std::int32_t mn = 0x7fffffff, mx = -0x7fffffff - 1;
  for (std::size_t i = 0; i < len; ++i) {
    const float v = kEf ? x[i] + r[i] : x[i];
    w[i] = v;
    const std::int32_t k = order_bits(v);
    mn = k < mn ? k : mn;
    mx = k > mx ? k : mx;
  }
  lo = from_order_bits(mn);
  hi = from_order_bits(mx);
}

// Packs len levels (< 2^bits each) into bytes, little-endian within a byte.
template <int bits>
WIA_CODEC_INLINE void pack(const std::uint32_t* __restrict lv, std::size_t len,
                           std::byte* __restrict q) noexcept {
  if constexpr (bits == 8) {
    auto* o = reinterpret_cast<std::uint8_t*>(q);
    for (std::size_t i = 0; i < len; ++i) o[i] = static_cast<std::uint8_t>(lv[i]);
  } else if constexpr (bits == 16) {
    std::uint16_t h[kBlock];
    for (std::size_t i = 0; i < len; ++i) h[i] = static_cast<std::uint16_t>(lv[i]);
    std::memcpy(q, h, 2 * len);
  } else {
    constexpr std::size_t per = 8 / bits;
    auto* o = reinterpret_cast<std::uint8_t*>(q);
    const std::size_t full = len / per;
    for (std::size_t j = 0; j < full; ++j) {
      std::uint32_t b = 0;
      for (std::size_t k = 0; k < per; ++k) b |= lv[j * per + k] << (bits * k);
      o[j] = static_cast<std::uint8_t>(b);
    }
    if (len % per) {
      std::uint32_t b = 0;
      for (std::size_t k = 0; k < len % per; ++k) b |= lv[full * per + k] << (bits * k);
      o[full] = static_cast<std::uint8_t>(b);
    }
  }
}

// Unpacks len levels to floats.
template <int bits>
WIA_CODEC_INLINE void unpack(const std::byte* __restrict q, std::size_t len,
                             float* __restrict f) noexcept {
  const auto* b = reinterpret_cast<const std::uint8_t*>(q);
  if constexpr (bits == 8) {
    for (std::size_t i = 0; i < len; ++i) f[i] = static_cast<float>(b[i]);
  } else if constexpr (bits == 16) {
    std::uint16_t h[kBlock];
    std::memcpy(h, q, 2 * len);
    for (std::size_t i = 0; i < len; ++i) f[i] = static_cast<float>(h[i]);
  } else {
    constexpr std::size_t per = 8 / bits;
    constexpr std::uint32_t mask = (1u << bits) - 1;
    const std::size_t full = len / per;
    for (std::size_t j = 0; j < full; ++j)
      for (std::size_t k = 0; k < per; ++k)
        f[j * per + k] = static_cast<float>((std::uint32_t{b[j]} >> (bits * k)) & mask);
    for (std::size_t k = 0; k < len % per; ++k)
      f[full * per + k] = static_cast<float>((std::uint32_t{b[full]} >> (bits * k)) & mask);
  }
}

// Levels of a block of len <= kBlock corrected entries w (global index of
// w[0]: first), and with r the new residual r = w - (lo + q step), the
// value the decoder will read (computed as it computes it, from 0).
template <int bits, bool kEf>
WIA_CODEC_INLINE void encode_block(const float* __restrict w, float* __restrict r,
                                   std::uint32_t len, float lo, float step, float inv,
                                   std::uint32_t s0, std::uint32_t s1, std::uint32_t first,
                                   std::byte* __restrict q) noexcept {
  constexpr auto levels = static_cast<float>((std::uint32_t{1} << bits) - 1);
  std::uint32_t lv[kBlock];
  // 32-bit counters: a 64-bit index would cost a narrowing shuffle per
  // vector of entries.
  for (std::uint32_t i = 0; i < len; ++i) {
    const std::uint32_t h = mix32((first + i) ^ s0) ^ s1;
    const float u = static_cast<float>(static_cast<std::int32_t>(h >> 8)) * 0x1p-24f;
    // floor(v + u), u uniform in [0, 1): E = v, so E[lo + q step] = x.
    // v + u >= 0 after the clamp, so floor is truncation (cvttps2dq);
    // NaN compares false and becomes 0.
    float t = (w[i] - lo) * inv + u;
    t = t > 0.0f ? t : 0.0f;
    t = t < levels ? t : levels;
    const std::int32_t l = static_cast<std::int32_t>(t);
    lv[i] = static_cast<std::uint32_t>(l);
    if constexpr (kEf) r[i] = w[i] - (0.0f + (lo + static_cast<float>(l) * step));
  }
  pack<bits>(lv, len, q);
}

template <int bits, bool kEf>
WIA_CODEC_INLINE void encode_impl(const float* __restrict x, float* __restrict r, std::size_t n,
                                  std::size_t chunk, std::uint64_t seed,
                                  std::byte* __restrict p) noexcept {
  constexpr auto levels = static_cast<float>((std::uint32_t{1} << bits) - 1);
  const auto s0 = static_cast<std::uint32_t>(seed), s1 = static_cast<std::uint32_t>(seed >> 32);
  float wbuf[kBlock];
  for (std::size_t base = 0; base < n; base += chunk) {
    const std::size_t len = std::min(chunk, n - base);
    float lo, hi;
    if (len <= kBlock) {
      range_of<kEf>(x + base, kEf ? r + base : nullptr, wbuf, len, lo, hi);
    } else {  // one range over a long chunk: a first pass finds it
      lo = hi = x[base] + (kEf ? r[base] : 0.0f);
      for (std::size_t b = 0; b < len; b += kBlock) {
        const std::size_t m = std::min(kBlock, len - b);
        float l2, h2;
        range_of<kEf>(x + base + b, kEf ? r + base + b : nullptr, wbuf, m, l2, h2);
        lo = l2 < lo ? l2 : lo;
        hi = h2 > hi ? h2 : hi;
      }
    }
    float step = (hi - lo) / levels;
    if (!std::isfinite(step) || step <= 0) step = 0;
    std::memcpy(p, &lo, sizeof lo);
    std::memcpy(p + sizeof lo, &step, sizeof step);
    std::byte* q = p + kHeader;
    // inv 0 with step 0: every level is 0 and decodes to lo.
    const float inv = step > 0 ? 1.0f / step : 0.0f;
    for (std::size_t b = 0; b < len; b += kBlock) {
      const std::size_t m = std::min(kBlock, len - b);
      float unused;
      if (len > kBlock)
        range_of<kEf>(x + base + b, kEf ? r + base + b : nullptr, wbuf, m, unused, unused);
      encode_block<bits, kEf>(wbuf, kEf ? r + base + b : nullptr, static_cast<std::uint32_t>(m), lo,
                              step, inv, s0, s1, static_cast<std::uint32_t>(base + b),
                              q + b * bits / 8);
    }
    p = q + level_bytes(len, bits);
  }
}

WIA_CODEC_INLINE void encode_body(const float* x, float* r, std::size_t n, int bits,
                                  std::size_t chunk, std::uint64_t seed, std::byte* p) noexcept {
  if (r) switch (bits) {
      case 1:
        return encode_impl<1, true>(x, r, n, chunk, seed, p);
      case 4:
        return encode_impl<4, true>(x, r, n, chunk, seed, p);
      case 8:
        return encode_impl<8, true>(x, r, n, chunk, seed, p);
      default:
        return encode_impl<16, true>(x, r, n, chunk, seed, p);
    }
  switch (bits) {
    case 1:
      return encode_impl<1, false>(x, r, n, chunk, seed, p);
    case 4:
      return encode_impl<4, false>(x, r, n, chunk, seed, p);
    case 8:
      return encode_impl<8, false>(x, r, n, chunk, seed, p);
    default:
      return encode_impl<16, false>(x, r, n, chunk, seed, p);
  }
}

// out = the sum over msgs, in order from 0, of each decoded entry.
template <int bits>
WIA_CODEC_INLINE void decode_impl(const std::byte* const* msgs, std::size_t nmsgs, std::size_t n,
                                  std::size_t chunk, float* __restrict out,
                                  bool accumulate) noexcept {
  float f[kBlock], acc[kBlock];
  std::size_t offset = 0;  // of the current chunk in every message
  for (std::size_t base = 0; base < n; base += chunk) {
    const std::size_t len = std::min(chunk, n - base);
    for (std::size_t b = 0; b < len; b += kBlock) {
      const std::size_t m = std::min(kBlock, len - b);
      for (std::size_t i = 0; i < m; ++i) acc[i] = 0.0f;
      for (std::size_t k = 0; k < nmsgs; ++k) {
        const std::byte* p = msgs[k] + offset;
        float lo, step;
        std::memcpy(&lo, p, sizeof lo);
        std::memcpy(&step, p + sizeof lo, sizeof step);
        unpack<bits>(p + kHeader + b * bits / 8, m, f);
        for (std::size_t i = 0; i < m; ++i) acc[i] += lo + f[i] * step;
      }
      float* o = out + base + b;
      if (accumulate)
        for (std::size_t i = 0; i < m; ++i) o[i] += acc[i];
      else
        for (std::size_t i = 0; i < m; ++i) o[i] = acc[i];
    }
    offset += kHeader + level_bytes(len, bits);
  }
}

WIA_CODEC_INLINE void decode_body(const std::byte* const* msgs, std::size_t nmsgs, std::size_t n,
                                  int bits, std::size_t chunk, float* out,
                                  bool accumulate) noexcept {
  switch (bits) {
    case 1:
      return decode_impl<1>(msgs, nmsgs, n, chunk, out, accumulate);
    case 4:
      return decode_impl<4>(msgs, nmsgs, n, chunk, out, accumulate);
    case 8:
      return decode_impl<8>(msgs, nmsgs, n, chunk, out, accumulate);
    default:
      return decode_impl<16>(msgs, nmsgs, n, chunk, out, accumulate);
  }
}

WIA_CODEC_DISPATCH(void, encode,
                   (const float* x, float* r, std::size_t n, int bits, std::size_t chunk,
                    std::uint64_t seed, std::byte* p) noexcept,
                   (x, r, n, bits, chunk, seed, p))
WIA_CODEC_DISPATCH(void, decode,
                   (const std::byte* const* msgs, std::size_t nmsgs, std::size_t n, int bits,
                    std::size_t chunk, float* out, bool accumulate) noexcept,
                   (msgs, nmsgs, n, bits, chunk, out, accumulate))

}  // namespace

std::size_t quantize_bytes(std::size_t n, int bits, std::size_t chunk) noexcept {
  if (n == 0) return 0;
  chunk = std::max<std::size_t>(chunk, 1);
  const std::size_t full = n / chunk, tail = n % chunk;
  return full * (kHeader + level_bytes(chunk, bits)) +
         (tail ? kHeader + level_bytes(tail, bits) : 0);
}

void quantize_encode(std::span<const float> x, int bits, std::size_t chunk, std::uint64_t seed,
                     std::span<std::byte> out, std::span<float> residual) {
  chunk = std::max<std::size_t>(chunk, 1);
  encode(x.data(), residual.empty() ? nullptr : residual.data(), x.size(), bits, chunk, seed,
         out.data());
}

void quantize_decode_sum(std::span<const std::byte* const> msgs, int bits, std::size_t chunk,
                         std::span<float> out) {
  decode(msgs.data(), msgs.size(), out.size(), bits, std::max<std::size_t>(chunk, 1), out.data(),
         false);
}

void quantize_decode_add(std::span<const std::byte> msg, int bits, std::size_t chunk,
                         std::span<float> acc) {
  const std::byte* m = msg.data();
  decode(&m, 1, acc.size(), bits, std::max<std::size_t>(chunk, 1), acc.data(), true);
}

}  // namespace wia::compress
