// SPDX-License-Identifier: Apache-2.0
// float32 <-> float16 / bfloat16 for the cast methods and for half inputs,
// which every other codec widens to float32 first.
#include <algorithm>
#include <cstring>

#include "compress/codec.hpp"
#include "kernels/cpu_reduce.hpp"

namespace wia::compress {

std::size_t float_type_size(wia_datatype_t dtype) noexcept { return dtype == WIA_FLOAT32 ? 4 : 2; }

void to_float(const void* in, wia_datatype_t dtype, std::span<float> out) noexcept {
  if (dtype == WIA_FLOAT32) {
    if (!out.empty()) std::memcpy(out.data(), in, out.size() * sizeof(float));
    return;
  }
  const auto* h = static_cast<const std::uint16_t*>(in);
  if (dtype == WIA_FLOAT16)
    kernels::half_to_float_n(h, out.data(), out.size());
  else
    kernels::bfloat16_to_float_n(h, out.data(), out.size());
}

void from_float(std::span<const float> in, wia_datatype_t dtype, void* out) noexcept {
  if (dtype == WIA_FLOAT32) {
    if (!in.empty()) std::memmove(out, in.data(), in.size() * sizeof(float));
    return;
  }
  auto* h = static_cast<std::uint16_t*>(out);
  if (dtype == WIA_FLOAT16)
    kernels::float_to_half_n(in.data(), h, in.size());
  else
    kernels::float_to_bfloat16_n(in.data(), h, in.size());
}

void cast_encode(std::span<const float> x, std::span<float> residual, wia_datatype_t dtype,
                 void* out) noexcept {
  if (residual.empty()) return from_float(x, dtype, out);
  // Per block in L1: w = x + r, its half, the half widened back, and
  // r = w - that: one pass over memory instead of four.
  constexpr std::size_t kBlock = 2048;
  float w[kBlock], sent[kBlock];
  auto* h = static_cast<std::uint16_t*>(out);
  for (std::size_t b = 0; b < x.size(); b += kBlock) {
    const std::size_t m = std::min(kBlock, x.size() - b);
    const float* __restrict xx = x.data() + b;
    float* __restrict r = residual.data() + b;
    for (std::size_t i = 0; i < m; ++i) w[i] = xx[i] + r[i];
    from_float({w, m}, dtype, h + b);
    to_float(h + b, dtype, {sent, m});
    for (std::size_t i = 0; i < m; ++i) r[i] = w[i] - sent[i];
  }
}

}  // namespace wia::compress
