// SPDX-License-Identifier: Apache-2.0
// The compression codecs against references computed here in double:
// selection against a full sort, unbiasedness as a mean over many seeds,
// error bounds entry by entry, and error feedback losing nothing over time.
#include "compress/codec.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <set>
#include <vector>

#include "compress/state.hpp"

using namespace wia::compress;

namespace {

std::vector<float> gaussian(std::size_t n, std::uint64_t seed, float scale = 1.0f) {
  Rng rng(seed);
  std::vector<float> x(n);
  for (auto& v : x) {
    // Box-Muller in double.
    const double u1 = (static_cast<double>(rng.next() >> 11) + 1) * 0x1p-53;
    const double u2 = static_cast<double>(rng.next() >> 11) * 0x1p-53;
    v = scale * static_cast<float>(std::sqrt(-2 * std::log(u1)) * std::cos(2 * M_PI * u2));
  }
  return x;
}

// The reference top-k: a full stable sort by (key desc, index asc).
std::vector<std::uint32_t> reference_topk(const std::vector<float>& x, std::size_t k, bool mag) {
  std::vector<std::uint32_t> idx(x.size());
  std::iota(idx.begin(), idx.end(), 0u);
  // NaN ranks below every number (as -inf), as the codec documents.
  auto key = [&](std::uint32_t i) {
    if (std::isnan(x[i])) return -std::numeric_limits<double>::infinity();
    return mag ? std::fabs(double(x[i])) : double(x[i]);
  };
  std::stable_sort(idx.begin(), idx.end(), [&](auto a, auto b) { return key(a) > key(b); });
  idx.resize(k);
  std::sort(idx.begin(), idx.end());
  return idx;
}

}  // namespace

TEST_CASE("k_of rounds up and stays in [1, n]") {
  CHECK(k_of(1000, 0.01) == 10);
  CHECK(k_of(1001, 0.01) == 11);
  CHECK(k_of(10, 1e-9) == 1);
  CHECK(k_of(10, 1.0) == 10);
  CHECK(k_of(0, 0.5) == 0);
}

TEST_CASE(
    "top-k returns exactly the reference's k entries on both the exact and the sampled path") {
  for (std::size_t n : {std::size_t{1}, std::size_t{37}, std::size_t{5000}, kTopkExactMax + 1,
                        std::size_t{300000}}) {
    for (double ratio : {0.001, 0.01, 0.3, 1.0}) {
      for (bool mag : {true, false}) {
        INFO("n " << n << " ratio " << ratio << " magnitude " << mag);
        auto x = gaussian(n, n * 31 + static_cast<std::uint64_t>(ratio * 1000));
        // Ties: repeat some values so the lower-index rule is exercised.
        for (std::size_t i = 0; i + 7 < n; i += 7) x[i + 3] = x[i];
        const std::size_t k = k_of(n, ratio);
        std::vector<Pair> out(k);
        topk_select(x, k, mag, out);
        const auto ref = reference_topk(x, k, mag);
        REQUIRE(out.size() == ref.size());
        bool same = true;
        for (std::size_t j = 0; j < k; ++j)
          same = same && out[j].index == ref[j] && out[j].value == x[ref[j]];
        CHECK(same);
      }
    }
  }
  CHECK_FALSE(topk_uses_sampling(kTopkExactMax));
  CHECK(topk_uses_sampling(kTopkExactMax + 1));
}

TEST_CASE("top-k never prefers a NaN to a number") {
  std::vector<float> x{NAN, 1.0f, -3.0f, NAN, 0.5f};
  std::vector<Pair> out(2);
  topk_select(x, 2, true, out);
  CHECK(out[0].index == 1);
  CHECK(out[1].index == 2);
}

TEST_CASE("random-k indices: k distinct, increasing, the same for a seed, uniform over seeds") {
  const std::size_t n = 200, k = 20;
  std::vector<std::uint32_t> a(k), b(k), c(k);
  randomk_indices(n, k, 42, a);
  randomk_indices(n, k, 42, b);
  randomk_indices(n, k, 43, c);
  CHECK(a == b);
  CHECK(a != c);
  CHECK(std::is_sorted(a.begin(), a.end()));
  CHECK(std::set<std::uint32_t>(a.begin(), a.end()).size() == k);
  CHECK(a.back() < n);
  // Over T seeds each index is chosen T k / n times on average; its count
  // is binomial, sd = sqrt(T p (1-p)) ~ 29.4 at T = 10000; 5 sd bounds.
  const int trials = 10000;
  std::vector<int> hits(n, 0);
  for (int t = 0; t < trials; ++t) {
    randomk_indices(n, k, derive_seed(7, t, 0), a);
    for (auto i : a) ++hits[i];
  }
  const double expect = trials * double(k) / n, sd = std::sqrt(expect * (1 - double(k) / n));
  for (std::size_t i = 0; i < n; ++i) {
    INFO("index " << i << " hits " << hits[i]);
    CHECK(std::fabs(hits[i] - expect) < 5 * sd);
  }
  std::vector<std::uint32_t> all(n);
  randomk_indices(n, n, 1, all);
  for (std::size_t i = 0; i < n; ++i) CHECK(all[i] == i);
}

TEST_CASE("random-k scaled by n/k is unbiased: the mean over many steps is the exact vector") {
  const std::size_t n = 64, k = 8;
  const auto x = gaussian(n, 5);
  std::vector<double> mean(n, 0);
  const int steps = 40000;
  std::vector<std::uint32_t> idx(k);
  for (int s = 0; s < steps; ++s) {
    randomk_indices(n, k, derive_seed(42, s, 0), idx);
    for (auto i : idx) mean[i] += double(x[i]) * n / k;
  }
  // Per entry the estimate is x n/k with probability k/n, else 0:
  // sd of the mean = |x| sqrt(n/k - 1) / sqrt(steps).
  for (std::size_t i = 0; i < n; ++i) {
    const double m = mean[i] / steps,
                 sd = std::fabs(x[i]) * std::sqrt(double(n) / k - 1) / std::sqrt(double(steps));
    CHECK(std::fabs(m - x[i]) <= 5 * sd + 1e-12);
  }
}

TEST_CASE("quantize: every entry within one step of its chunk, unbiased over seeds") {
  for (int bits : {1, 4, 8, 16}) {
    for (std::size_t chunk : {kChunk, std::size_t{1000}}) {
      INFO("bits " << bits << " chunk " << chunk);
      const std::size_t n = 1000;
      auto x = gaussian(n, 11, 3.0f);
      x[500] = 40.0f;  // an outlier widens only its own chunk's range
      std::vector<std::byte> msg(quantize_bytes(n, bits, chunk));
      const double levels = std::pow(2.0, bits) - 1;
      std::vector<double> mean(n, 0);
      const int trials = bits == 16 ? 50 : 4000;
      bool within = true;
      for (int t = 0; t < trials; ++t) {
        quantize_encode(x, bits, chunk, derive_seed(3, t, 9), msg);
        std::vector<float> y(n, 0.0f);
        quantize_decode_add(msg, bits, chunk, y);
        for (std::size_t base = 0; base < n; base += chunk) {
          const std::size_t len = std::min(chunk, n - base);
          const auto [mn, mx] = std::minmax_element(x.begin() + base, x.begin() + base + len);
          const double step = (double(*mx) - *mn) / levels;
          for (std::size_t i = base; i < base + len; ++i) {
            within = within && std::fabs(double(y[i]) - x[i]) <= step * (1 + 1e-5) + 1e-6;
            mean[i] += y[i];
          }
        }
      }
      CHECK(within);
      // Unbiased: the rounding of each entry is Bernoulli between two
      // levels one step apart, sd <= step / 2 / sqrt(trials).
      bool unbiased = true;
      for (std::size_t base = 0; base < n; base += chunk) {
        const std::size_t len = std::min(chunk, n - base);
        const auto [mn, mx] = std::minmax_element(x.begin() + base, x.begin() + base + len);
        const double step = (double(*mx) - *mn) / levels;
        for (std::size_t i = base; i < base + len; ++i)
          unbiased = unbiased && std::fabs(mean[i] / trials - x[i]) <=
                                     5 * step / 2 / std::sqrt(double(trials)) + 1e-5;
      }
      CHECK(unbiased);
    }
  }
  CHECK(quantize_bytes(1000, 8, kChunk) == 3 * (8 + 256) + 8 + 232);
  CHECK(quantize_bytes(1000, 4, kChunk) == 3 * (8 + 128) + 8 + 116);
  CHECK(quantize_bytes(1000, 1, 1000) == 8 + 125);
}

TEST_CASE("quantize: a constant chunk decodes exactly") {
  std::vector<float> x(300, 2.5f);
  std::vector<std::byte> msg(quantize_bytes(300, 4, kChunk));
  quantize_encode(x, 4, kChunk, 1, msg);
  std::vector<float> y(300, 1.0f);
  quantize_decode_add(msg, 4, kChunk, y);
  CHECK(std::all_of(y.begin(), y.end(), [](float v) { return v == 3.5f; }));
}

TEST_CASE("1-bit: sign times the chunk's mean magnitude, in each scale precision") {
  const std::size_t n = 600;
  const auto x = gaussian(n, 17);
  for (wia_datatype_t t : {WIA_FLOAT32, WIA_FLOAT16, WIA_BFLOAT16}) {
    INFO("scale type " << int(t));
    std::vector<std::byte> msg(onebit_bytes(n, t));
    CHECK(msg.size() == 3 * (t == WIA_FLOAT32 ? 4 : 2) + 32 + 32 + 11);
    onebit_encode(x, t, msg);
    std::vector<float> y(n, 0.0f);
    onebit_decode_add(msg, t, y);
    const double tol = t == WIA_FLOAT32 ? 1e-6 : t == WIA_FLOAT16 ? 1e-3 : 8e-3;
    bool ok = true;
    for (std::size_t base = 0; base < n; base += kChunk) {
      const std::size_t len = std::min(kChunk, n - base);
      double s = 0;
      for (std::size_t i = base; i < base + len; ++i) s += std::fabs(double(x[i]));
      s /= double(len);
      for (std::size_t i = base; i < base + len; ++i)
        ok = ok && std::fabs(y[i] - (x[i] >= 0 ? s : -s)) <= tol * s;
    }
    CHECK(ok);
  }
}

// Error feedback: after T steps, (sum of what was sent) + residual equals
// T x exactly (up to rounding), so the average sent converges to x.
template <typename Codec>
void check_error_feedback(Codec&& codec, std::size_t n, int steps, double tol) {
  const auto x = gaussian(n, 23);
  std::vector<float> r(n, 0.0f), w(n), sent(n);
  std::vector<double> total(n, 0);
  double max_residual = 0;
  for (int s = 0; s < steps; ++s) {
    w = x;
    add_residual(w, r);
    std::fill(sent.begin(), sent.end(), 0.0f);
    codec(w, sent, s);
    update_residual(w, sent, r);
    for (std::size_t i = 0; i < n; ++i) total[i] += sent[i];
  }
  double err = 0, ref = 0;
  for (std::size_t i = 0; i < n; ++i) {
    max_residual = std::max(max_residual, std::fabs(double(r[i])));
    err += std::pow(total[i] / steps - x[i], 2);
    ref += std::pow(double(x[i]), 2);
    CHECK(std::fabs(total[i] + r[i] - double(steps) * x[i]) <= 1e-3 * steps);
  }
  // The residual stays bounded, so the mean of the sent updates -> x.
  CHECK(std::sqrt(err / ref) < tol);
}

TEST_CASE("top-k with error feedback: accumulated updates converge to the dense vector") {
  const std::size_t n = 1000, k = 10;
  check_error_feedback(
      [&](const std::vector<float>& w, std::vector<float>& sent, int) {
        std::vector<Pair> p(k);
        topk_select(w, k, true, p);
        scatter_add(p, sent);
      },
      n, 4000, 0.05);
}

TEST_CASE("1-bit with error feedback: accumulated updates converge to the dense vector") {
  const std::size_t n = 1000;
  check_error_feedback(
      [&](const std::vector<float>& w, std::vector<float>& sent, int) {
        std::vector<std::byte> msg(onebit_bytes(n, WIA_FLOAT32));
        onebit_encode(w, WIA_FLOAT32, msg);
        onebit_decode_add(msg, WIA_FLOAT32, sent);
      },
      n, 2000, 0.05);
}

TEST_CASE("scatter_add sums duplicates and counts indices out of range") {
  std::vector<Pair> p{{1, 2.0f}, {1, 3.0f}, {4, 1.0f}, {9, 7.0f}};
  std::vector<float> acc(5, 0.0f);
  CHECK(scatter_add(p, acc) == 1);
  CHECK(acc == std::vector<float>{0, 5, 0, 0, 1});
}

TEST_CASE("casts round to nearest even and widen exactly") {
  const std::vector<float> x{1.0f, 1.0f + 0x1p-11f, 1.0f + 0x1p-8f, -65504.0f, 3.0e-8f};
  std::vector<std::uint16_t> h(x.size());
  std::vector<float> y(x.size());
  from_float(x, WIA_FLOAT16, h.data());
  to_float(h.data(), WIA_FLOAT16, y);
  CHECK(y[0] == 1.0f);
  CHECK(y[1] == 1.0f);  // a tie rounds to even
  CHECK(y[2] == 1.0f + 0x1p-8f);
  CHECK(y[3] == -65504.0f);
  from_float(x, WIA_BFLOAT16, h.data());
  to_float(h.data(), WIA_BFLOAT16, y);
  CHECK(y[2] == 1.0f);  // bfloat16 keeps 7 fraction bits: 2^-8 is a tie to even
  CHECK(float_type_size(WIA_FLOAT32) == 4);
  CHECK(float_type_size(WIA_BFLOAT16) == 2);
}

TEST_CASE(
    "the state store: one state per (owner, buffer), forgotten per owner, errors taken once") {
  StateStore s;
  int a = 0, b = 0, buf1 = 0, buf2 = 0;
  auto x = s.get(&a, &buf1);
  CHECK(s.get(&a, &buf1) == x);
  CHECK(s.get(&a, &buf2) != x);
  CHECK(s.get(&b, &buf1) != x);
  s.record_error(&a, "first");
  s.record_error(&a, "second");
  s.forget(&b);
  CHECK(s.find(&a, &buf1) == x);
  CHECK(s.find(&b, &buf1) == nullptr);
  CHECK(s.take_error(&a) == "first");
  CHECK(s.take_error(&a).empty());
  s.forget(&a);
  CHECK(s.find(&a, &buf1) == nullptr);
  CHECK(s.find(&a, &buf2) == nullptr);
}

TEST_CASE("low rank: orthonormal P, dependent columns dropped, expand = P Q^T") {
  // Independent columns come out orthonormal (P^T P = I to fp32 rounding).
  const LowrankShape s = lowrank_shape(50 * 8, 50, 4);
  REQUIRE(s.rows == 50);
  REQUIRE(s.cols == 8);
  REQUIRE(s.rank == 4);
  std::vector<float> p = gaussian(s.rows * s.rank, 3);
  // Column 2 = 2 x column 0 - column 1: dependent, so it must vanish.
  for (std::size_t i = 0; i < s.rows; ++i) p[i * 4 + 2] = 2 * p[i * 4 + 0] - p[i * 4 + 1];
  lowrank_orthonormalise(p, s);
  for (std::size_t a = 0; a < 4; ++a)
    for (std::size_t b = 0; b < 4; ++b) {
      double dot = 0;
      for (std::size_t i = 0; i < s.rows; ++i) dot += double(p[i * 4 + a]) * p[i * 4 + b];
      const double want = a == b && a != 2 ? 1.0 : 0.0;
      INFO(a << "," << b);
      CHECK(std::fabs(dot - want) < 1e-5);
    }
  // project / back_project / expand against a triple loop in double, with a
  // vector shorter than rows x cols (zero padding).
  const std::size_t n = s.rows * s.cols - 5;
  const std::vector<float> x = gaussian(n, 9);
  std::vector<float> q = gaussian(s.cols * s.rank, 11), pp(s.rows * s.rank), qq(s.cols * s.rank);
  lowrank_project(x, s, q, pp);
  lowrank_back_project(x, s, pp, qq);
  std::vector<float> out(n);
  lowrank_expand(pp, qq, s, out);
  auto m = [&](std::size_t i, std::size_t j) {
    const std::size_t e = i * s.cols + j;
    return e < n ? double(x[e]) : 0.0;
  };
  double worst = 0;
  for (std::size_t i = 0; i < s.rows; ++i)
    for (std::size_t k = 0; k < s.rank; ++k) {
      double v = 0;
      for (std::size_t j = 0; j < s.cols; ++j) v += m(i, j) * q[j * s.rank + k];
      worst = std::max(worst, std::fabs(v - pp[i * s.rank + k]));
    }
  for (std::size_t j = 0; j < s.cols; ++j)
    for (std::size_t k = 0; k < s.rank; ++k) {
      double v = 0;
      for (std::size_t i = 0; i < s.rows; ++i) v += m(i, j) * pp[i * s.rank + k];
      worst = std::max(worst, std::fabs(v - qq[j * s.rank + k]) / 10);
    }
  for (std::size_t e = 0; e < n; ++e) {
    double v = 0;
    for (std::size_t k = 0; k < s.rank; ++k)
      v += double(pp[(e / s.cols) * s.rank + k]) * qq[(e % s.cols) * s.rank + k];
    worst = std::max(worst, std::fabs(v - out[e]) / 100);
  }
  CHECK(worst < 1e-4);
  // Near-square default shape and rank clamping.
  const LowrankShape d = lowrank_shape(1000, 0, 64);
  CHECK(d.rows == 32);
  CHECK(d.cols == 32);
  CHECK(d.rank == 32);
}

// --- the fast paths (compress/simd.hpp) ---------------------------------------

namespace {

// Runs f with the baseline copies of the hot loops forced, then restores
// the default (the widest the CPU has).
template <typename F>
void with_baseline(F&& f) {
  codec_force_baseline(true);
  f();
  codec_force_baseline(false);
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace

TEST_CASE("the baseline and AVX2 copies of every codec loop give the same bits") {
  const bool avx2 = codec_force_baseline(false);
  if (!avx2) MESSAGE("this CPU has no AVX2: both runs take the baseline copies");
  // 2000 entries: whole chunks, a short last chunk, and for chunk 1000 the
  // one-range-over-a-long-chunk path.
  const std::size_t n = 2000 + 77;
  const auto x = gaussian(n, 31, 2.0f);
  const auto r0 = gaussian(n, 32, 0.1f);
  for (int bits : {1, 4, 8, 16})
    for (std::size_t chunk : {kChunk, std::size_t{1000}})
      for (bool ef : {false, true}) {
        INFO("quantize bits " << bits << " chunk " << chunk << " ef " << ef);
        std::vector<std::byte> m1(quantize_bytes(n, bits, chunk)), m2(m1.size());
        std::vector<float> r1 = r0, r2 = r0, d1(n), d2(n);
        quantize_encode(x, bits, chunk, 5, m1, ef ? std::span<float>(r1) : std::span<float>());
        with_baseline([&] {
          quantize_encode(x, bits, chunk, 5, m2, ef ? std::span<float>(r2) : std::span<float>());
        });
        CHECK(m1 == m2);
        CHECK(same_bits(r1, r2));
        const std::byte* msgs[] = {m1.data(), m1.data(), m1.data()};
        quantize_decode_sum(msgs, bits, chunk, d1);
        with_baseline([&] { quantize_decode_sum(msgs, bits, chunk, d2); });
        CHECK(same_bits(d1, d2));
      }
  for (wia_datatype_t t : {WIA_FLOAT32, WIA_FLOAT16, WIA_BFLOAT16}) {
    INFO("1-bit scale type " << int(t));
    std::vector<std::byte> m1(onebit_bytes(n, t)), m2(m1.size());
    std::vector<float> r1 = r0, r2 = r0, d1(n), d2(n);
    onebit_encode(x, t, m1, r1);
    with_baseline([&] { onebit_encode(x, t, m2, r2); });
    CHECK(m1 == m2);
    CHECK(same_bits(r1, r2));
    const std::byte* msgs[] = {m1.data(), m1.data()};
    onebit_decode_sum(msgs, t, d1);
    with_baseline([&] { onebit_decode_sum(msgs, t, d2); });
    CHECK(same_bits(d1, d2));
  }
  {
    const std::size_t big = kTopkExactMax * 3 + 5, k = k_of(big, 0.01);
    const auto xb = gaussian(big, 33), rb = gaussian(big, 34, 0.5f);
    std::vector<float> r1 = rb, r2 = rb;
    std::vector<Pair> p1(k), p2(k);
    topk_select_ef(xb, r1, k, true, p1);
    with_baseline([&] { topk_select_ef(xb, r2, k, true, p2); });
    bool same = true;
    for (std::size_t j = 0; j < k; ++j)
      same = same && p1[j].index == p2[j].index && p1[j].value == p2[j].value;
    CHECK(same);
    CHECK(same_bits(r1, r2));
  }
  {
    const LowrankShape s = lowrank_shape(n, 0, 4);
    std::vector<float> q = gaussian(s.cols * s.rank, 35), p1(s.rows * s.rank), p2(p1.size()),
                       q1(q.size()), q2(q.size()), e1(n), e2(n);
    lowrank_project(x, s, q, p1);
    lowrank_back_project(x, s, p1, q1);
    lowrank_residual(p1, q1, s, x, e1);
    with_baseline([&] {
      lowrank_project(x, s, q, p2);
      lowrank_back_project(x, s, p2, q2);
      lowrank_residual(p2, q2, s, x, e2);
    });
    CHECK(same_bits(p1, p2));
    CHECK(same_bits(q1, q2));
    CHECK(same_bits(e1, e2));
  }
}

TEST_CASE("fused error feedback: the message of x + r, and r = (x + r) - its decoding, exactly") {
  const std::size_t n = 1000;
  const auto x = gaussian(n, 41, 1.5f);
  const auto r0 = gaussian(n, 42, 0.2f);
  std::vector<float> w(n);
  for (std::size_t i = 0; i < n; ++i) w[i] = x[i] + r0[i];
  // quantize (both range modes) and 1-bit: same message as encoding w
  // alone, residual bit-exact against the separate decode.
  for (int bits : {1, 4, 8, 16})
    for (std::size_t chunk : {kChunk, n}) {
      INFO("quantize bits " << bits << " chunk " << chunk);
      std::vector<std::byte> fused(quantize_bytes(n, bits, chunk)), plain(fused.size());
      std::vector<float> r = r0, sent(n, 0.0f), want(n);
      quantize_encode(x, bits, chunk, 77, fused, r);
      quantize_encode(w, bits, chunk, 77, plain);
      CHECK(fused == plain);
      quantize_decode_add(plain, bits, chunk, sent);
      for (std::size_t i = 0; i < n; ++i) want[i] = w[i] - sent[i];
      CHECK(same_bits(r, want));
    }
  for (wia_datatype_t t : {WIA_FLOAT32, WIA_FLOAT16, WIA_BFLOAT16}) {
    INFO("1-bit scale type " << int(t));
    std::vector<std::byte> fused(onebit_bytes(n, t)), plain(fused.size());
    std::vector<float> r = r0, sent(n, 0.0f), want(n);
    onebit_encode(x, t, fused, r);
    onebit_encode(w, t, plain);
    CHECK(fused == plain);
    onebit_decode_add(plain, t, sent);
    for (std::size_t i = 0; i < n; ++i) want[i] = w[i] - sent[i];
    CHECK(same_bits(r, want));
  }
  // top-k on both paths: the pairs of w, and w with the selected zeroed.
  for (std::size_t m : {n, kTopkExactMax + 1000}) {
    INFO("top-k n " << m);
    const auto xm = gaussian(m, 43), rm = gaussian(m, 44, 0.3f);
    std::vector<float> wm(m);
    for (std::size_t i = 0; i < m; ++i) wm[i] = xm[i] + rm[i];
    const std::size_t k = k_of(m, 0.01);
    std::vector<Pair> fused(k), plain(k);
    std::vector<float> r = rm;
    topk_select_ef(xm, r, k, true, fused);
    topk_select(wm, k, true, plain);
    bool same = true;
    for (std::size_t j = 0; j < k; ++j) {
      same = same && fused[j].index == plain[j].index && fused[j].value == plain[j].value;
      wm[plain[j].index] = 0;
    }
    CHECK(same);
    CHECK(same_bits(r, wm));
  }
  // random-k: the values at idx, the residual w with them zeroed.
  {
    std::vector<std::uint32_t> idx(10);
    randomk_indices(n, 10, 9, idx);
    std::vector<float> r = r0, vals(10), want = w;
    randomk_gather(x, r, idx, vals);
    for (std::size_t j = 0; j < 10; ++j) {
      CHECK(vals[j] == w[idx[j]]);
      want[idx[j]] = 0;
    }
    CHECK(same_bits(r, want));
  }
  // casts: the half of w, r = w - the half widened.
  for (wia_datatype_t t : {WIA_FLOAT16, WIA_BFLOAT16}) {
    std::vector<std::uint16_t> fused(n), plain(n);
    std::vector<float> r = r0, back(n), want(n);
    cast_encode(x, r, t, fused.data());
    from_float(w, t, plain.data());
    CHECK(fused == plain);
    to_float(plain.data(), t, back);
    for (std::size_t i = 0; i < n; ++i) want[i] = w[i] - back[i];
    CHECK(same_bits(r, want));
  }
  // low rank: residual = w - expand, entry by entry.
  {
    const LowrankShape s = lowrank_shape(n, 0, 3);
    const auto p = gaussian(s.rows * s.rank, 45), q = gaussian(s.cols * s.rank, 46);
    std::vector<float> e(n), r(n), want(n);
    lowrank_expand(p, q, s, e);
    lowrank_residual(p, q, s, w, r);
    for (std::size_t i = 0; i < n; ++i) want[i] = w[i] - e[i];
    CHECK(same_bits(r, want));
  }
}

TEST_CASE("decode_sum equals zeroing and adding each message in rank order, bit for bit") {
  const std::size_t n = 700;
  for (int bits : {1, 4, 8, 16}) {
    INFO("bits " << bits);
    std::vector<std::vector<std::byte>> m(3,
                                          std::vector<std::byte>(quantize_bytes(n, bits, kChunk)));
    std::vector<const std::byte*> ptrs;
    for (std::size_t k = 0; k < m.size(); ++k) {
      quantize_encode(gaussian(n, 50 + k), bits, kChunk, k, m[k]);
      ptrs.push_back(m[k].data());
    }
    std::vector<float> sum(n, 123.0f), want(n, 0.0f);
    quantize_decode_sum(ptrs, bits, kChunk, sum);
    for (auto& msg : m) quantize_decode_add(msg, bits, kChunk, want);
    CHECK(same_bits(sum, want));
  }
  std::vector<std::vector<std::byte>> m(4, std::vector<std::byte>(onebit_bytes(n, WIA_FLOAT16)));
  std::vector<const std::byte*> ptrs;
  for (std::size_t k = 0; k < m.size(); ++k) {
    onebit_encode(gaussian(n, 60 + k), WIA_FLOAT16, m[k]);
    ptrs.push_back(m[k].data());
  }
  std::vector<float> sum(n, -1.0f), want(n, 0.0f);
  onebit_decode_sum(ptrs, WIA_FLOAT16, sum);
  for (auto& msg : m) onebit_decode_add(msg, WIA_FLOAT16, want);
  CHECK(same_bits(sum, want));
}

TEST_CASE("top-k by signed value: -0 ties +0, NaN ties -inf, ties to the lower index") {
  const float inf = std::numeric_limits<float>::infinity();
  // Reference order (key desc, index asc), NaN as -inf:
  //   3.0 (5), 0.0 (1), -0.0 (2) [tie: lower index first], -1 (0),
  //   -inf (3), NaN (4) [tie with -inf: lower index first].
  const std::vector<float> x{-1.0f, 0.0f, -0.0f, -inf, NAN, 3.0f};
  const std::vector<std::vector<std::uint32_t>> want{
      {5}, {1, 5}, {1, 2, 5}, {0, 1, 2, 5}, {0, 1, 2, 3, 5}, {0, 1, 2, 3, 4, 5}};
  for (std::size_t k = 1; k <= x.size(); ++k) {
    INFO("k " << k);
    std::vector<Pair> out(k);
    topk_select(x, k, false, out);
    std::vector<std::uint32_t> got;
    for (auto& p : out) got.push_back(p.index);
    CHECK(got == want[k - 1]);
  }
  // Magnitude: NaN below 0, -0 ties +0.
  std::vector<Pair> out(3);
  topk_select(std::vector<float>{NAN, -0.0f, 0.0f, -2.0f}, 3, true, out);
  CHECK(out[0].index == 1);
  CHECK(out[1].index == 2);
  CHECK(out[2].index == 3);
}

TEST_CASE("top-k stays exact when the sample misleads the threshold (retries, then exact)") {
  // Make every sampled entry (the sample's positions are derived from
  // (n, k) as topk.cpp derives them) the largest: each threshold then
  // lets about 4096 entries pass, fewer than k, so every retry fails and
  // the exact path must still return the reference's k entries.
  const std::size_t n = 1000000, k = k_of(n, 0.01);
  REQUIRE(k > kTopkSample);
  auto x = gaussian(n, 71);
  Rng rng(derive_seed(n, k, 0x70706bULL));
  for (std::size_t s = 0; s < kTopkSample; ++s) x[rng.below(n)] = 1000.0f + float(s % 97);
  const auto ref = reference_topk(x, k, true);
  for (bool ef : {false, true}) {
    INFO("error feedback " << ef);
    std::vector<Pair> out(k);
    std::vector<float> r(n, 0.0f);
    if (ef)
      topk_select_ef(x, r, k, true, out);
    else
      topk_select(x, k, true, out);
    bool same = true;
    for (std::size_t j = 0; j < k; ++j)
      same = same && out[j].index == ref[j] && out[j].value == x[ref[j]];
    CHECK(same);
    if (ef) {
      std::vector<float> want = x;
      for (auto i : ref) want[i] = 0;
      CHECK(same_bits(r, want));
    }
  }
}

TEST_CASE("top-k with massive ties at the threshold: the candidate buffer grows, still exact") {
  // Values in {-4, ..., 4} (wia-bench's pattern): the threshold is |4| and
  // 2/9 of the entries pass, far more than the buffer sized for ~1.25 k.
  const std::size_t n = 300000, k = k_of(n, 0.01);
  std::vector<float> x(n);
  for (std::size_t i = 0; i < n; ++i) x[i] = static_cast<float>((i * 7 + 3) % 9) - 4.0f;
  const auto ref = reference_topk(x, k, true);
  for (bool ef : {false, true}) {
    INFO("error feedback " << ef);
    std::vector<Pair> out(k);
    std::vector<float> r(n, 0.0f);
    if (ef)
      topk_select_ef(x, r, k, true, out);
    else
      topk_select(x, k, true, out);
    bool same = true;
    for (std::size_t j = 0; j < k; ++j)
      same = same && out[j].index == ref[j] && out[j].value == x[ref[j]];
    CHECK(same);
    if (ef) {
      std::vector<float> want = x;
      for (auto i : ref) want[i] = 0;
      CHECK(same_bits(r, want));
    }
  }
}

TEST_CASE("quantize: rounding noise is fair within a call and independent across ranks") {
  // Chunks of 256 with range [0, 1] (first entry 0, last 1) and every other
  // entry 0.5: at 1 bit each rounds up with probability 1/2. Over 100
  // chunks, within a call the fraction rounded up and across two ranks'
  // seeds (as the all-reduce derives them) the correlation of the
  // decisions must be what independent fair coins give (5 sd).
  const std::size_t chunks = 100, n = chunks * kChunk;
  std::vector<float> x(n, 0.5f);
  for (std::size_t c = 0; c < chunks; ++c) x[c * kChunk] = 0.0f, x[c * kChunk + kChunk - 1] = 1.0f;
  std::vector<std::byte> ma(quantize_bytes(n, 1, kChunk)), mb(ma.size());
  for (std::uint64_t step : {0u, 1u, 12345u}) {
    INFO("step " << step);
    quantize_encode(x, 1, kChunk, derive_seed(0, step, 0x5155), ma);
    quantize_encode(x, 1, kChunk, derive_seed(1, step, 0x5155), mb);
    std::vector<float> ya(n, 0.0f), yb(n, 0.0f);
    quantize_decode_add(ma, 1, kChunk, ya);
    quantize_decode_add(mb, 1, kChunk, yb);
    double m = 0, sa = 0, sb = 0, sab = 0;
    for (std::size_t i = 0; i < n; ++i) {
      if (i % kChunk == 0 || i % kChunk == kChunk - 1) continue;
      const double a = ya[i], b = yb[i];  // 0 or 1
      sa += a, sb += b, sab += a * b, m += 1;
    }
    const double pa = sa / m, pb = sb / m;
    const double corr = (sab / m - pa * pb) / std::sqrt(pa * (1 - pa) * pb * (1 - pb));
    CHECK(std::fabs(pa - 0.5) < 5 * 0.5 / std::sqrt(m));
    CHECK(std::fabs(pb - 0.5) < 5 * 0.5 / std::sqrt(m));
    CHECK(std::fabs(corr) < 5 / std::sqrt(m));
  }
}

TEST_CASE("top-k of a mostly-zero vector: every nonzero, then the lowest-index zeros") {
  // 0.3 % nonzero, k = 1 %: the sample's threshold is |x| = 0, so only the
  // nonzeros are collected and the zeros complete them; with 3 % nonzero
  // the nonzeros alone suffice. NaNs rank below the zeros.
  for (std::size_t every : {std::size_t{333}, std::size_t{33}}) {
    const std::size_t n = 400000, k = k_of(n, 0.01);
    std::vector<float> x(n, 0.0f);
    for (std::size_t i = 5; i < n; i += every) x[i] = static_cast<float>(i % 13) - 6.5f;
    x[7] = NAN;
    x[9] = -0.0f;
    const auto ref = reference_topk(x, k, true);
    for (bool ef : {false, true}) {
      INFO("nonzero every " << every << ", error feedback " << ef);
      std::vector<Pair> out(k);
      std::vector<float> r(n, 0.0f);
      if (ef)
        topk_select_ef(x, r, k, true, out);
      else
        topk_select(x, k, true, out);
      bool same = true;
      for (std::size_t j = 0; j < k; ++j) same = same && out[j].index == ref[j];
      CHECK(same);
    }
  }
}
