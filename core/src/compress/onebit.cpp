// SPDX-License-Identifier: Apache-2.0
// 1-bit compression (DeepSpeed's 1-bit Adam style): a sign per entry and
// one scale per chunk. Biased on its own; error feedback makes it converge.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "compress/codec.hpp"
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

}  // namespace

std::size_t onebit_bytes(std::size_t n, wia_datatype_t scale_type) noexcept {
  const std::size_t chunks = (n + kChunk - 1) / kChunk;
  return chunks * scale_bytes(scale_type) + (n / kChunk) * (kChunk / 8) + ((n % kChunk) + 7) / 8;
}

void onebit_encode(std::span<const float> x, wia_datatype_t scale_type, std::span<std::byte> out) {
  std::byte* p = out.data();
  for (std::size_t base = 0; base < x.size(); base += kChunk) {
    const std::size_t len = std::min(kChunk, x.size() - base);
    double sum = 0;
    for (std::size_t i = 0; i < len; ++i) sum += std::fabs(x[base + i]);
    put_scale(p, static_cast<float>(sum / static_cast<double>(len)), scale_type);
    std::byte* b = p + scale_bytes(scale_type);
    const std::size_t nb = (len + 7) / 8;
    std::memset(b, 0, nb);
    for (std::size_t i = 0; i < len; ++i)
      if (x[base + i] >= 0) b[i / 8] |= static_cast<std::byte>(1u << (i % 8));
    p = b + nb;
  }
}

void onebit_decode_add(std::span<const std::byte> msg, wia_datatype_t scale_type,
                       std::span<float> acc) {
  const std::byte* p = msg.data();
  for (std::size_t base = 0; base < acc.size(); base += kChunk) {
    const std::size_t len = std::min(kChunk, acc.size() - base);
    const float s = get_scale(p, scale_type);
    const std::byte* b = p + scale_bytes(scale_type);
    for (std::size_t i = 0; i < len; ++i)
      acc[base + i] += ((std::to_integer<unsigned>(b[i / 8]) >> (i % 8)) & 1u) ? s : -s;
    p = b + (len + 7) / 8;
  }
}

}  // namespace wia::compress
