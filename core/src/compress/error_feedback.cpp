// SPDX-License-Identifier: Apache-2.0
// Error feedback (spec 6.8.2): the residual is what compression dropped,
// added back to the next step's input, so nothing is lost for good.
#include "compress/codec.hpp"

namespace wia::compress {

void add_residual(std::span<float> x, std::span<const float> r) noexcept {
  for (std::size_t i = 0; i < x.size(); ++i) x[i] += r[i];
}

void update_residual(std::span<const float> corrected, std::span<const float> sent,
                     std::span<float> r) noexcept {
  for (std::size_t i = 0; i < r.size(); ++i) r[i] = corrected[i] - sent[i];
}

void add_into(std::span<const float> x, std::span<const float> r, std::span<float> w) noexcept {
  const float* __restrict a = x.data();
  const float* __restrict b = r.data();
  float* __restrict o = w.data();
  for (std::size_t i = 0; i < w.size(); ++i) o[i] = a[i] + b[i];
}

}  // namespace wia::compress
