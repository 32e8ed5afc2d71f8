// SPDX-License-Identifier: Apache-2.0
// Top-k sparsification: the k entries with the largest key (|x| or x).
//
// Speed: keys are int32 images of the floats that order as the floats do
// (NaN as -inf), so comparing them is branch-free. Above kTopkExactMax
// entries a threshold from a sample keeps about 1.25 k candidates in one
// streaming pass: each block of 256 keys is compared to it in a vectorised
// loop, and only a block holding a candidate is walked again to collect
// them (about 1 block in 40 at k = 1 %). With error feedback the same
// pass adds the residual (w = x + r, stored in r). The final selection
// runs over (key, index) packed into one uint64, so ties go to the lower
// index with a single integer compare, and the candidates, collected in
// index order, are filtered by the k-th best instead of sorted.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>

#include "compress/codec.hpp"
#include "compress/simd.hpp"

namespace wia::compress {
namespace {

constexpr std::size_t kBlock = 256;

// The key of v as an int32 that orders as key_of(v) did as a float:
// |v| (magnitude) or v, NaN as -inf, -0 as +0.
WIA_CODEC_INLINE std::int32_t key_bits(float v, bool magnitude) noexcept {
  std::uint32_t b;
  std::memcpy(&b, &v, 4);
  const std::uint32_t a = b & 0x7fffffffu;
  const bool nan = a > 0x7f800000u;
  if (magnitude) return nan ? -1 : static_cast<std::int32_t>(a);
  // Negative floats: larger magnitude is smaller, so flip their magnitude
  // bits below the sign; -0 (a == 0) is +0.
  const std::int32_t s =
      (b >> 31) && a ? static_cast<std::int32_t>(~a) : static_cast<std::int32_t>(a);
  constexpr std::int32_t kMinusInf = ~std::int32_t{0x7f800000};
  return nan ? kMinusInf : s;
}

// Larger is better: the key, then the lower index.
WIA_CODEC_INLINE std::uint64_t rank_of(std::int32_t key, std::uint32_t index) noexcept {
  return (std::uint64_t{static_cast<std::uint32_t>(key) ^ 0x80000000u} << 32) |
         (0xffffffffu - index);
}
WIA_CODEC_INLINE std::uint32_t index_of(std::uint64_t rank) noexcept {
  return 0xffffffffu - static_cast<std::uint32_t>(rank);
}

// One streaming pass: with r, w = x + r is stored in r first; every entry
// whose key is >= t is appended to cand as its rank. Returns false (and
// stops collecting) if more than cap pass: the caller then takes the
// exact path.
template <bool kEf>
WIA_CODEC_INLINE bool collect_body(const float* __restrict x, float* __restrict r, std::size_t n,
                                   bool magnitude, std::int32_t t, std::uint64_t* __restrict cand,
                                   std::size_t cap, std::size_t& found) noexcept {
  std::size_t m = 0;
  bool ok = true;
  for (std::size_t base = 0; base < n; base += kBlock) {
    const std::size_t len = std::min(kBlock, n - base);
    const float* w = x + base;
    if constexpr (kEf) {
      float* rr = r + base;
      const float* xx = x + base;
      for (std::size_t i = 0; i < len; ++i) rr[i] = xx[i] + rr[i];
      w = rr;
    }
    int any = 0;
    if (magnitude)
      for (std::size_t i = 0; i < len; ++i) any |= key_bits(w[i], true) >= t;
    else
      for (std::size_t i = 0; i < len; ++i) any |= key_bits(w[i], false) >= t;
    if (!any || !ok) continue;
    for (std::size_t i = 0; i < len; ++i) {
      const std::int32_t key = key_bits(w[i], magnitude);
      if (key < t) continue;
      if (m == cap) {
        ok = false;  // keep adding the residual, stop collecting
        break;
      }
      cand[m++] = rank_of(key, static_cast<std::uint32_t>(base + i));
    }
  }
  found = m;
  return ok;
}

WIA_CODEC_INLINE bool collect_fn_body(const float* x, float* r, std::size_t n, bool magnitude,
                                      std::int32_t t, std::uint64_t* cand, std::size_t cap,
                                      std::size_t* found) noexcept {
  return r ? collect_body<true>(x, r, n, magnitude, t, cand, cap, *found)
           : collect_body<false>(x, nullptr, n, magnitude, t, cand, cap, *found);
}

WIA_CODEC_DISPATCH(bool, collect_fn,
                   (const float* x, float* r, std::size_t n, bool magnitude, std::int32_t t,
                    std::uint64_t* cand, std::size_t cap, std::size_t* found) noexcept,
                   (x, r, n, magnitude, t, cand, cap, found))

// Buffers reused by the calls of one thread (a stream's worker): fresh
// ones of a few MiB per call would be faulted in page by page.
std::vector<std::uint64_t>& scratch(int i) {
  thread_local std::vector<std::uint64_t> s[2];
  return s[i];
}

// The k best of cand (ranks in increasing index order) into out, values
// from w. Ranks are distinct, so exactly k are >= the k-th best, found on a
// copy; keeping those in their order gives them by index with no sort.
void finish(std::span<const std::uint64_t> cand, std::size_t k, const float* w,
            std::span<Pair> out) {
  std::uint64_t t = 0;
  if (k < cand.size()) {
    auto& tmp = scratch(1);
    if (tmp.size() < cand.size()) tmp.resize(cand.size());
    std::copy(cand.begin(), cand.end(), tmp.begin());
    const auto kth = tmp.begin() + static_cast<std::ptrdiff_t>(k - 1);
    std::nth_element(tmp.begin(), kth, tmp.begin() + static_cast<std::ptrdiff_t>(cand.size()),
                     std::greater<std::uint64_t>());
    t = *kth;
  }
  std::size_t j = 0;
  for (const std::uint64_t c : cand)
    if (c >= t) {
      const std::uint32_t i = index_of(c);
      out[j++] = Pair{i, w[i]};
    }
}

// x, or with r (error feedback) w = x + r, which is left in r with the
// selected entries zeroed.
void select(std::span<const float> x, std::span<float> r, std::size_t k, bool magnitude,
            std::span<Pair> out) {
  const std::size_t n = x.size();
  const bool ef = !r.empty();
  if (k == 0) {
    if (ef) add_residual(r, x);
    return;
  }
  auto& cand = scratch(0);
  auto zero_selected = [&] {
    if (ef)
      for (std::size_t j = 0; j < k; ++j) r[out[j].index] = 0;
  };
  // With error feedback the first pass leaves w in r; later passes read it.
  const float* src = x.data();
  float* add = ef ? r.data() : nullptr;
  if (topk_uses_sampling(n) && k < n) {
    // The threshold is the sample's key at rank ~1.25 k/n from the top
    // (plus a few), so that usually somewhat more than k entries pass; an
    // unlucky sample is retried at 4 times the rank, then the exact path.
    Rng rng(derive_seed(n, k, 0x70706bULL));
    std::vector<std::int32_t> sample(kTopkSample);
    for (auto& s : sample) {
      const std::size_t i = rng.below(n);
      s = key_bits(ef ? x[i] + r[i] : x[i], magnitude);
    }
    const double want = 1.25 * static_cast<double>(k) / static_cast<double>(n);
    for (std::size_t q = static_cast<std::size_t>(want * kTopkSample) + 8; q < kTopkSample;
         q *= 4) {
      std::nth_element(sample.begin(), sample.begin() + static_cast<std::ptrdiff_t>(q),
                       sample.end(), std::greater<std::int32_t>());
      const std::int32_t t = sample[q];
      // About q/kTopkSample of the entries pass; room for twice that.
      const std::size_t expect = static_cast<std::size_t>(
          static_cast<double>(q) / static_cast<double>(kTopkSample) * static_cast<double>(n));
      const std::size_t cap = std::min(n, std::max(2 * expect, k) + 4096);
      if (cand.size() < cap) cand.resize(cap);
      std::size_t found = 0;
      const bool ok = collect_fn(src, add, n, magnitude, t, cand.data(), cap, &found);
      if (add) src = add, add = nullptr;
      // Every entry left out has a key < t <= every candidate's, so when at
      // least k passed the top k are all among them: still exact.
      if (ok && found >= k) {
        finish({cand.data(), found}, k, src, out);
        return zero_selected();
      }
    }
  }
  if (add) {
    add_residual(r, x);
    src = r.data();
  }
  if (cand.size() < n) cand.resize(n);
  for (std::size_t i = 0; i < n; ++i)
    cand[i] = rank_of(key_bits(src[i], magnitude), static_cast<std::uint32_t>(i));
  finish({cand.data(), n}, k, src, out);
  zero_selected();
  if (n > kTopkExactMax) {  // rare: do not keep 16 bytes per entry for the thread's life
    std::vector<std::uint64_t>().swap(cand);
    std::vector<std::uint64_t>().swap(scratch(1));
  }
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
  select(x, {}, k, magnitude, out);
}

void topk_select_ef(std::span<const float> x, std::span<float> residual, std::size_t k,
                    bool magnitude, std::span<Pair> out) {
  select(x, residual, k, magnitude, out);
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
