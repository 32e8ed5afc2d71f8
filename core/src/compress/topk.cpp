// SPDX-License-Identifier: Apache-2.0
// Top-k sparsification: the k entries with the largest key (|x| or x).
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "compress/codec.hpp"

namespace wia::compress {
namespace {

// NaN sorts below every number, so it is never preferred to one.
inline float key_of(float v, bool magnitude) noexcept {
  if (std::isnan(v)) return -std::numeric_limits<float>::infinity();
  return magnitude ? std::fabs(v) : v;
}

// The k best of `idx` (by key, then lower index) into out, by index.
void select_among(std::span<const float> x, bool magnitude, std::vector<std::uint32_t>& idx,
                  std::size_t k, std::span<Pair> out) {
  auto better = [&](std::uint32_t a, std::uint32_t b) {
    const float ka = key_of(x[a], magnitude), kb = key_of(x[b], magnitude);
    return ka > kb || (ka == kb && a < b);
  };
  if (k < idx.size()) std::nth_element(idx.begin(), idx.begin() + k, idx.end(), better);
  idx.resize(k);
  std::sort(idx.begin(), idx.end());
  for (std::size_t j = 0; j < k; ++j) out[j] = Pair{idx[j], x[idx[j]]};
}

}  // namespace

std::size_t k_of(std::size_t n, double ratio) noexcept {
  if (n == 0) return 0;
  const double k = std::ceil(ratio * static_cast<double>(n));
  if (!(k >= 1)) return 1;
  if (k >= static_cast<double>(n)) return n;
  return static_cast<std::size_t>(k);
}

bool topk_uses_sampling(std::size_t n) noexcept { return n > kTopkExactMax; }

void topk_select(std::span<const float> x, std::size_t k, bool magnitude, std::span<Pair> out) {
  const std::size_t n = x.size();
  if (k == 0) return;
  std::vector<std::uint32_t> idx;
  if (topk_uses_sampling(n) && k < n) {
    // The sample's key at rank ~1.25 k/n from the top (plus a few), so that
    // usually somewhat more than k entries pass and one small nth_element
    // finishes; an unlucky sample falls back to the exact path below.
    Rng rng(derive_seed(n, k, 0x70706bULL));
    std::vector<float> sample(kTopkSample);
    for (float& s : sample) s = key_of(x[rng.below(n)], magnitude);
    const double want = 1.25 * static_cast<double>(k) / static_cast<double>(n);
    const std::size_t q = static_cast<std::size_t>(want * kTopkSample) + 8;
    if (q < kTopkSample) {
      std::nth_element(sample.begin(), sample.begin() + q, sample.end(), std::greater<float>());
      const float t = sample[q];
      idx.reserve(static_cast<std::size_t>(1.5 * static_cast<double>(k)) + 64);
      for (std::size_t i = 0; i < n; ++i)
        if (key_of(x[i], magnitude) >= t) idx.push_back(static_cast<std::uint32_t>(i));
      // Every entry left out has a key < t <= every candidate's, so when at
      // least k passed the top k are all among them: still exact.
      if (idx.size() >= k) return select_among(x, magnitude, idx, k, out);
    }
  }
  idx.resize(n);
  std::iota(idx.begin(), idx.end(), std::uint32_t{0});
  select_among(x, magnitude, idx, k, out);
}

std::size_t scatter_add(std::span<const Pair> pairs, std::span<float> acc) noexcept {
  std::size_t dropped = 0;
  for (const Pair& p : pairs) {
    if (p.index < acc.size())
      acc[p.index] += p.value;
    else
      ++dropped;
  }
  return dropped;
}

}  // namespace wia::compress
