// SPDX-License-Identifier: Apache-2.0
// Quantization to 1, 4, 8 or 16 bits with a [min, max] range per chunk and
// stochastic rounding, which makes every decoded entry an unbiased
// estimate of the original.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "compress/codec.hpp"

namespace wia::compress {
namespace {

constexpr std::size_t kHeader = 2 * sizeof(float);  // minimum, step

std::size_t level_bytes(std::size_t len, int bits) noexcept {
  return (len * static_cast<std::size_t>(bits) + 7) / 8;
}

template <int bits>
inline void put_level(std::byte* p, std::size_t i, std::uint32_t q) noexcept {
  switch (bits) {
    case 1:
      p[i / 8] |= static_cast<std::byte>(q << (i % 8));
      break;
    case 4:
      p[i / 2] |= static_cast<std::byte>(q << (4 * (i % 2)));
      break;
    case 8:
      p[i] = static_cast<std::byte>(q);
      break;
    default: {
      const auto v = static_cast<std::uint16_t>(q);
      std::memcpy(p + 2 * i, &v, 2);
    }
  }
}

template <int bits>
inline std::uint32_t get_level(const std::byte* p, std::size_t i) noexcept {
  switch (bits) {
    case 1:
      return (std::to_integer<std::uint32_t>(p[i / 8]) >> (i % 8)) & 1u;
    case 4:
      return (std::to_integer<std::uint32_t>(p[i / 2]) >> (4 * (i % 2))) & 15u;
    case 8:
      return std::to_integer<std::uint32_t>(p[i]);
    default: {
      std::uint16_t v;
      std::memcpy(&v, p + 2 * i, 2);
      return v;
    }
  }
}

}  // namespace

std::size_t quantize_bytes(std::size_t n, int bits, std::size_t chunk) noexcept {
  if (n == 0) return 0;
  chunk = std::max<std::size_t>(chunk, 1);
  const std::size_t full = n / chunk, tail = n % chunk;
  return full * (kHeader + level_bytes(chunk, bits)) +
         (tail ? kHeader + level_bytes(tail, bits) : 0);
}

// A strong 32-bit mix (Wellons' lowbias32): the rounding noise of entry i
// is a function of (seed, i), not a sequence, so the loop vectorises.
inline std::uint32_t mix32(std::uint32_t x) noexcept {
  x ^= x >> 16;
  x *= 0x7feb352du;
  x ^= x >> 15;
  x *= 0x846ca68bu;
  x ^= x >> 16;
  return x;
}

// One chunk's levels (entries first.. of the vector); bits is a template
// argument so each width's loop is compiled on its own.
template <int bits>
void encode_levels(std::span<const float> c, float lo, float inv, float levels, std::uint64_t seed,
                   std::size_t first, std::byte* q) noexcept {
  const auto s0 = static_cast<std::uint32_t>(seed), s1 = static_cast<std::uint32_t>(seed >> 32);
  for (std::size_t i = 0; i < c.size(); ++i) {
    const std::uint32_t h = mix32(mix32(static_cast<std::uint32_t>(first + i) ^ s0) + s1);
    const float u = static_cast<float>(h >> 8) * 0x1p-24f;  // uniform in [0, 1)
    // floor(v + u), u uniform in [0, 1): E = v, so E[lo + q step] = x.
    // v + u >= 0, so floor is truncation (cvttps2dq vectorises, floor does
    // not without SSE4.1); clamped first, NaN to 0.
    float t = (c[i] - lo) * inv + u;
    t = t < levels ? t : levels;
    t = t > 0.0f ? t : 0.0f;
    put_level<bits>(q, i, static_cast<std::uint32_t>(static_cast<std::int32_t>(t)));
  }
}

template <int bits>
void decode_levels(const std::byte* q, float lo, float step, std::span<float> acc) noexcept {
  for (std::size_t i = 0; i < acc.size(); ++i)
    acc[i] += lo + static_cast<float>(get_level<bits>(q, i)) * step;
}

void quantize_encode(std::span<const float> x, int bits, std::size_t chunk, std::uint64_t seed,
                     std::span<std::byte> out) {
  chunk = std::max<std::size_t>(chunk, 1);
  const auto levels = static_cast<float>((std::uint32_t{1} << bits) - 1);
  std::byte* p = out.data();
  for (std::size_t base = 0; base < x.size(); base += chunk) {
    const std::size_t len = std::min(chunk, x.size() - base);
    const auto c = x.subspan(base, len);
    const auto [mn, mx] = std::minmax_element(c.begin(), c.end());
    const float lo = *mn;
    float step = (*mx - lo) / levels;
    if (!std::isfinite(step) || step <= 0) step = 0;
    std::memcpy(p, &lo, sizeof lo);
    std::memcpy(p + sizeof lo, &step, sizeof step);
    std::byte* q = p + kHeader;
    const std::size_t nb = level_bytes(len, bits);
    std::memset(q, 0, nb);
    if (step > 0) {
      const float inv = 1.0f / step;
      switch (bits) {
        case 1:
          encode_levels<1>(c, lo, inv, levels, seed, base, q);
          break;
        case 4:
          encode_levels<4>(c, lo, inv, levels, seed, base, q);
          break;
        case 8:
          encode_levels<8>(c, lo, inv, levels, seed, base, q);
          break;
        default:
          encode_levels<16>(c, lo, inv, levels, seed, base, q);
          break;
      }
    }
    p = q + nb;
  }
}

void quantize_decode_add(std::span<const std::byte> msg, int bits, std::size_t chunk,
                         std::span<float> acc) {
  chunk = std::max<std::size_t>(chunk, 1);
  const std::byte* p = msg.data();
  for (std::size_t base = 0; base < acc.size(); base += chunk) {
    const std::size_t len = std::min(chunk, acc.size() - base);
    float lo, step;
    std::memcpy(&lo, p, sizeof lo);
    std::memcpy(&step, p + sizeof lo, sizeof step);
    const std::byte* q = p + kHeader;
    const auto a = acc.subspan(base, len);
    switch (bits) {
      case 1:
        decode_levels<1>(q, lo, step, a);
        break;
      case 4:
        decode_levels<4>(q, lo, step, a);
        break;
      case 8:
        decode_levels<8>(q, lo, step, a);
        break;
      default:
        decode_levels<16>(q, lo, step, a);
        break;
    }
    p = q + level_bytes(len, bits);
  }
}

}  // namespace wia::compress
