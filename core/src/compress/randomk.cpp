// SPDX-License-Identifier: Apache-2.0
// Random-k sparsification: indices from a seed every rank shares, so the
// k values can be all-reduced densely with no index on the wire.
#include "compress/codec.hpp"

namespace wia::compress {

void randomk_indices(std::size_t n, std::size_t k, std::uint64_t seed,
                     std::span<std::uint32_t> out) {
  // Floyd's algorithm: k draws give a uniformly random k-subset; a bitmap
  // both records it and yields it in increasing order.
  std::vector<std::uint64_t> bits((n + 63) / 64, 0);
  Rng rng(seed);
  auto test_set = [&](std::size_t i) {
    const std::uint64_t m = std::uint64_t{1} << (i % 64);
    const bool was = bits[i / 64] & m;
    bits[i / 64] |= m;
    return was;
  };
  for (std::size_t j = n - k; j < n; ++j) {
    const std::size_t t = rng.below(j + 1);
    if (test_set(t)) test_set(j);
  }
  std::size_t o = 0;
  for (std::size_t w = 0; w < bits.size(); ++w)
    for (std::uint64_t b = bits[w]; b; b &= b - 1)
      out[o++] = static_cast<std::uint32_t>(w * 64 + static_cast<unsigned>(__builtin_ctzll(b)));
}

void randomk_gather(std::span<const float> x, std::span<float> residual,
                    std::span<const std::uint32_t> idx, std::span<float> out) noexcept {
  if (residual.empty()) {
    for (std::size_t j = 0; j < idx.size(); ++j) out[j] = x[idx[j]];
    return;
  }
  add_residual(residual, x);  // w = x + r, kept in r
  for (std::size_t j = 0; j < idx.size(); ++j) {
    out[j] = residual[idx[j]];
    residual[idx[j]] = 0;
  }
}

}  // namespace wia::compress
