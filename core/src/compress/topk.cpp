// SPDX-License-Identifier: Apache-2.0
// Top-k sparsification: the k entries with the largest key (|x| or x).
//
// Speed: keys are int32 images of the floats that order as the floats do
// (NaN as -inf), so comparing them is branch-free. Above kTopkExactMax
// entries a threshold from a sample keeps about 1.25 k candidates in one
// streaming pass (collect_body says how). With error feedback the same
// pass adds the residual (w = x + r, stored in r). The final selection
// runs over (key, index) packed into one uint64, so ties go to the lower
// index with a single integer compare, and the candidates, collected in
// index order, are filtered by the k-th best key (a radix select) instead
// of sorted.
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

// One streaming pass from entry `begin` (a multiple of kBlock): with r,
// w = x + r is stored in r first; every entry whose key is >= t is
// appended to cand[found...] as its rank, in index order. Per block the
// keys and a 0/1 pass flag are computed in a vectorised loop; groups of 16
// flags are tested 8 bytes at a time and only a group holding a candidate
// is compacted (branch-free). Returns n, or the first block it could not
// collect without passing cap (the residual is still added to the end):
// the caller grows cand and resumes there on the summed w.
template <bool kEf>
WIA_CODEC_INLINE std::size_t collect_body(const float* __restrict x, float* __restrict r,
                                          std::size_t n, std::size_t begin, bool magnitude,
                                          std::int32_t t, std::uint64_t* __restrict cand,
                                          std::size_t cap, std::size_t& found) noexcept {
  constexpr std::size_t kGroup = 16;
  alignas(64) std::int32_t keys[kBlock];
  alignas(64) std::uint8_t pass[kBlock + kGroup] = {};
  std::size_t m = found, stop = n;
  for (std::size_t base = begin; base < n; base += kBlock) {
    const std::size_t len = std::min(kBlock, n - base);
    const float* w = x + base;
    if constexpr (kEf) {
      float* rr = r + base;
      const float* xx = x + base;
      for (std::size_t i = 0; i < len; ++i) rr[i] = xx[i] + rr[i];
      w = rr;
    }
    if (stop != n) continue;  // only adding the residual
    if (m + len > cap) {
      stop = base;
      continue;
    }
    if (magnitude)
      for (std::size_t i = 0; i < len; ++i) keys[i] = key_bits(w[i], true);
    else
      for (std::size_t i = 0; i < len; ++i) keys[i] = key_bits(w[i], false);
    for (std::size_t i = 0; i < len; ++i) pass[i] = keys[i] >= t ? 1 : 0;
    for (std::size_t i = len; i < kBlock; ++i) pass[i] = 0;
    for (std::size_t g = 0; g < len; g += kGroup) {
      std::uint64_t a, b;
      std::memcpy(&a, pass + g, 8);
      std::memcpy(&b, pass + g + 8, 8);
      if ((a | b) == 0) continue;
      const std::size_t end = std::min(g + kGroup, len);
      for (std::size_t i = g; i < end; ++i) {
        cand[m] = rank_of(keys[i], static_cast<std::uint32_t>(base + i));
        m += pass[i];
      }
    }
  }
  found = m;
  return stop;
}

WIA_CODEC_INLINE std::size_t collect_fn_body(const float* x, float* r, std::size_t n,
                                             std::size_t begin, bool magnitude, std::int32_t t,
                                             std::uint64_t* cand, std::size_t cap,
                                             std::size_t* found) noexcept {
  return r ? collect_body<true>(x, r, n, begin, magnitude, t, cand, cap, *found)
           : collect_body<false>(x, nullptr, n, begin, magnitude, t, cand, cap, *found);
}

WIA_CODEC_DISPATCH(std::size_t, collect_fn,
                   (const float* x, float* r, std::size_t n, std::size_t begin, bool magnitude,
                    std::int32_t t, std::uint64_t* cand, std::size_t cap,
                    std::size_t* found) noexcept,
                   (x, r, n, begin, magnitude, t, cand, cap, found))

// Buffers reused by the calls of one thread (a stream's worker): fresh
// ones of a few MiB per call would be faulted in page by page.
std::vector<std::uint64_t>& scratch() {
  thread_local std::vector<std::uint64_t> s;
  return s;
}

// The k best of cand (ranks in increasing index order) into out, values
// from w. The k-th best key K is found by a radix select on the 32-bit
// keys (a histogram of the high 16 bits, then of the low 16 bits under the
// chosen high half): two passes of counting, whatever the ties. Then one
// pass in index order keeps every key above K and the first ones (the
// lower indices) at K until k are kept: out comes in index order, no sort.
void finish(std::span<const std::uint64_t> cand, std::size_t k, const float* w,
            std::span<Pair> out) {
  auto key_of_rank = [](std::uint64_t c) { return static_cast<std::uint32_t>(c >> 32); };
  std::uint32_t kth = 0;  // the k-th largest key (biased, as in the rank)
  std::size_t above = 0;  // candidates with a key > kth
  if (k < cand.size()) {
    thread_local std::vector<std::uint32_t> hist(65536);
    std::fill(hist.begin(), hist.end(), 0u);
    for (const std::uint64_t c : cand) ++hist[key_of_rank(c) >> 16];
    std::uint32_t hi = 65535;
    for (;; --hi) {
      if (above + hist[hi] >= k) break;
      above += hist[hi];
    }
    std::fill(hist.begin(), hist.end(), 0u);
    for (const std::uint64_t c : cand)
      if ((key_of_rank(c) >> 16) == hi) ++hist[key_of_rank(c) & 0xffff];
    std::uint32_t lo = 65535;
    for (;; --lo) {
      if (above + hist[lo] >= k) break;
      above += hist[lo];
    }
    kth = hi << 16 | lo;
  }
  std::size_t at_kth = k - above;  // how many of the ties at kth are kept
  std::size_t j = 0;
  for (const std::uint64_t c : cand) {
    const std::uint32_t key = key_of_rank(c);
    if (key > kth || (key == kth && at_kth > 0)) {
      if (key == kth) --at_kth;
      const std::uint32_t i = index_of(c);
      out[j++] = Pair{i, w[i]};
    }
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
  auto& cand = scratch();
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
      std::int32_t t = sample[q];
      // Mostly exact zeros (a sparse gradient): |x| = 0 would let nearly
      // every entry through. Collect the nonzeros only; if fewer than k,
      // the zeros complete them below.
      const bool nonzeros_only = magnitude && t <= 0;
      if (nonzeros_only) t = 1;
      // About q/kTopkSample of the entries pass; room for twice that, more
      // when ties at the threshold let many more through.
      const std::size_t expect = static_cast<std::size_t>(
          static_cast<double>(q) / static_cast<double>(kTopkSample) * static_cast<double>(n));
      if (cand.size() < 2 * expect + k + 4096) cand.resize(2 * expect + k + 4096);
      std::size_t found = 0;
      for (std::size_t at = 0;;) {
        at = collect_fn(src, add, n, at, magnitude, t, cand.data(), cand.size(), &found);
        if (add) src = add, add = nullptr;
        if (at == n) break;
        cand.resize(std::max(2 * cand.size(), found + 2 * kBlock));
      }
      // Every entry left out has a key < t <= every candidate's, so when at
      // least k passed the top k are all among them: still exact.
      if (found >= k) {
        finish({cand.data(), found}, k, src, out);
        zero_selected();
        // Grown by ties, it is kept for the next call on similar data, up
        // to 4 bytes per entry (about what a residual costs).
        if (cand.size() > n / 2) std::vector<std::uint64_t>().swap(cand);
        return;
      }
      if (nonzeros_only) {
        // All found (every nonzero), then the zeros by lowest index (ties
        // at |x| = 0), merged in index order in one pass. If zeros run out
        // too, NaNs (ranked below 0) are needed: the exact path.
        std::size_t zeros = k - found, c = 0, j = 0;
        for (std::size_t i = 0; i < n && j < k; ++i) {
          if (c < found && index_of(cand[c]) == i) {
            out[j++] = Pair{static_cast<std::uint32_t>(i), src[i]};
            ++c;
          } else if (zeros > 0 && key_bits(src[i], true) == 0) {
            out[j++] = Pair{static_cast<std::uint32_t>(i), src[i]};
            --zeros;
          }
        }
        if (j == k) return zero_selected();
        break;
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
