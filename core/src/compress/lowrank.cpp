// SPDX-License-Identifier: Apache-2.0
// PowerSGD (Vogels et al., 2019): one step of subspace iteration per call.
// The gradient, viewed as a rows x cols matrix M, is sent as P = M Q
// (rows x r) and Q' = M^T P̂ (cols x r) with P̂ the orthonormalised sum of
// every rank's P; the estimate of the sum is P̂ (Σ Q')^T. Q is warm-started
// from the previous call's reduced Q', which is what makes one iteration
// per step enough. Every sum runs in a fixed order (the same in the
// baseline and AVX2 copies), so every rank, given the same reduced inputs,
// derives bit-identical P̂ and output; the orthonormalisation, on r
// columns only, runs in double.
//
// Speed: the products run in float with Q (and the accumulated Q')
// transposed to r rows of cols, so each is a plain loop along a row of M:
// a dot product in 8 lanes (M Q), an axpy (M^T P̂), or r axpys into a row
// block (P̂ Q^T), all of which vectorise.
#include <algorithm>
#include <cmath>

#include "compress/codec.hpp"
#include "compress/simd.hpp"

namespace wia::compress {

LowrankShape lowrank_shape(std::size_t n, std::size_t rows, int rank) noexcept {
  LowrankShape s;
  if (rows == 0) rows = static_cast<std::size_t>(std::ceil(std::sqrt(static_cast<double>(n))));
  s.rows = std::max<std::size_t>(rows, 1);
  s.cols = std::max<std::size_t>((n + s.rows - 1) / s.rows, 1);
  s.rank = static_cast<std::size_t>(
      std::clamp<long long>(rank, 1, static_cast<long long>(std::min(s.rows, s.cols))));
  return s;
}

void lowrank_init_q(const LowrankShape& s, std::uint64_t seed, std::span<float> q) {
  // Gaussian entries (Box-Muller): a random start spans a generic subspace.
  Rng rng(seed);
  for (std::size_t i = 0; i < s.cols * s.rank; ++i) {
    const double u1 = (static_cast<double>(rng.next() >> 11) + 1.0) * 0x1p-53;
    const double u2 = static_cast<double>(rng.next() >> 11) * 0x1p-53;
    q[i] = static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2));
  }
}

namespace {

constexpr std::size_t kLanes = 8;

// p (rows x r) = M q, with qt = q transposed (r rows of cols): per row and
// column of q a dot product in 8 float lanes, summed in a fixed order.
WIA_CODEC_INLINE void project_body(const float* __restrict x, std::size_t n, std::size_t rows,
                                   std::size_t cols, std::size_t r, const float* __restrict qt,
                                   float* __restrict p) noexcept {
  for (std::size_t i = 0; i < rows; ++i) {
    const std::size_t begin = std::min(i * cols, n);
    const std::size_t len = std::min(begin + cols, n) - begin;
    const float* xi = x + begin;
    for (std::size_t k = 0; k < r; ++k) {
      const float* q = qt + k * cols;
      float acc[kLanes] = {};
      std::size_t j = 0;
      for (; j + kLanes <= len; j += kLanes)
        for (std::size_t l = 0; l < kLanes; ++l) acc[l] += xi[j + l] * q[j + l];
      for (; j < len; ++j) acc[0] += xi[j] * q[j];
      float sum = 0.0f;
      for (std::size_t l = 0; l < kLanes; ++l) sum += acc[l];
      p[i * r + k] = sum;
    }
  }
}

// acc (r rows of cols) += M^T p, row by row: an axpy per row and column of
// p, so the sums run in the same order as a plain loop over rows.
WIA_CODEC_INLINE void back_project_body(const float* __restrict x, std::size_t n, std::size_t rows,
                                        std::size_t cols, std::size_t r, const float* __restrict p,
                                        float* __restrict acc) noexcept {
  for (std::size_t i = 0; i < rows; ++i) {
    const std::size_t begin = std::min(i * cols, n);
    const std::size_t len = std::min(begin + cols, n) - begin;
    const float* xi = x + begin;
    for (std::size_t k = 0; k < r; ++k) {
      const float pk = p[i * r + k];
      float* a = acc + k * cols;
      for (std::size_t j = 0; j < len; ++j) a[j] += xi[j] * pk;
    }
  }
}

// Entry e of P Q^T, computed as ((0 + p0 q0) + p1 q1) + ... with qt the
// columns of Q (r rows of cols). w null: out = the entry; else out = w -
// the entry (the residual).
WIA_CODEC_INLINE void expand_body(const float* __restrict p, const float* __restrict qt,
                                  std::size_t n, std::size_t cols, std::size_t r,
                                  const float* __restrict w, float* __restrict out) noexcept {
  float row[256];
  for (std::size_t begin = 0, i = 0; begin < n; begin += cols, ++i) {
    const std::size_t len = std::min(cols, n - begin);
    for (std::size_t jb = 0; jb < len; jb += 256) {
      const std::size_t m = std::min<std::size_t>(256, len - jb);
      for (std::size_t j = 0; j < m; ++j) row[j] = 0.0f;
      for (std::size_t k = 0; k < r; ++k) {
        const float pk = p[i * r + k];
        const float* q = qt + k * cols + jb;
        for (std::size_t j = 0; j < m; ++j) row[j] += pk * q[j];
      }
      float* o = out + begin + jb;
      if (w) {
        const float* ww = w + begin + jb;
        for (std::size_t j = 0; j < m; ++j) o[j] = ww[j] - row[j];
      } else {
        for (std::size_t j = 0; j < m; ++j) o[j] = row[j];
      }
    }
  }
}

WIA_CODEC_DISPATCH(void, project,
                   (const float* x, std::size_t n, std::size_t rows, std::size_t cols,
                    std::size_t r, const float* qt, float* p) noexcept,
                   (x, n, rows, cols, r, qt, p))
WIA_CODEC_DISPATCH(void, back_project,
                   (const float* x, std::size_t n, std::size_t rows, std::size_t cols,
                    std::size_t r, const float* p, float* acc) noexcept,
                   (x, n, rows, cols, r, p, acc))
WIA_CODEC_DISPATCH(void, expand,
                   (const float* p, const float* qt, std::size_t n, std::size_t cols, std::size_t r,
                    const float* w, float* out) noexcept,
                   (p, qt, n, cols, r, w, out))

// q (cols x r) transposed: r rows of cols.
std::vector<float> transposed(std::span<const float> q, const LowrankShape& s) {
  std::vector<float> qt(s.cols * s.rank);
  for (std::size_t j = 0; j < s.cols; ++j)
    for (std::size_t k = 0; k < s.rank; ++k) qt[k * s.cols + j] = q[j * s.rank + k];
  return qt;
}

void expand_to(std::span<const float> p, std::span<const float> q, const LowrankShape& s,
               const float* w, std::span<float> out) {
  const std::vector<float> qt = transposed(q, s);
  expand(p.data(), qt.data(), std::min(out.size(), s.rows * s.cols), s.cols, s.rank, w, out.data());
}

}  // namespace

// Entry (i, j) of M: x[i * cols + j], zero past the end of x (padding).
void lowrank_project(std::span<const float> x, const LowrankShape& s, std::span<const float> q,
                     std::span<float> p) {
  const std::vector<float> qt = transposed(q, s);
  project(x.data(), x.size(), s.rows, s.cols, s.rank, qt.data(), p.data());
}

void lowrank_orthonormalise(std::span<float> p, const LowrankShape& s) {
  // Gram-Schmidt in double, each column orthogonalised twice ("twice is
  // enough": one pass leaves errors that grow with the columns'
  // dependence). P arrives in fp32, so a column that keeps less than
  // kDependent of its norm is the rounding of a dependent one, not a new
  // direction: it is set to zero and carries nothing (exact when the data
  // has lower rank than r; error feedback keeps the rest otherwise).
  constexpr double kDependent = 1e-5;
  const std::size_t r = s.rank, rows = s.rows;
  std::vector<double> q(rows * r);  // column k at q[k * rows ...]
  for (std::size_t k = 0; k < r; ++k) {
    double* col = &q[k * rows];
    double before = 0;
    for (std::size_t i = 0; i < rows; ++i) {
      col[i] = p[i * r + k];
      before += col[i] * col[i];
    }
    for (int pass = 0; pass < 2; ++pass)
      for (std::size_t m = 0; m < k; ++m) {
        const double* prev = &q[m * rows];
        double dot = 0;
        for (std::size_t i = 0; i < rows; ++i) dot += col[i] * prev[i];
        for (std::size_t i = 0; i < rows; ++i) col[i] -= dot * prev[i];
      }
    double after = 0;
    for (std::size_t i = 0; i < rows; ++i) after += col[i] * col[i];
    const double inv =
        after > 0 && after > kDependent * kDependent * before ? 1.0 / std::sqrt(after) : 0.0;
    for (std::size_t i = 0; i < rows; ++i) col[i] *= inv;
  }
  for (std::size_t i = 0; i < rows; ++i)
    for (std::size_t k = 0; k < r; ++k) p[i * r + k] = static_cast<float>(q[k * rows + i]);
}

void lowrank_back_project(std::span<const float> x, const LowrankShape& s, std::span<const float> p,
                          std::span<float> q) {
  std::vector<float> acc(s.cols * s.rank, 0.0f);
  back_project(x.data(), x.size(), s.rows, s.cols, s.rank, p.data(), acc.data());
  for (std::size_t j = 0; j < s.cols; ++j)
    for (std::size_t k = 0; k < s.rank; ++k) q[j * s.rank + k] = acc[k * s.cols + j];
}

void lowrank_expand(std::span<const float> p, std::span<const float> q, const LowrankShape& s,
                    std::span<float> out) {
  expand_to(p, q, s, nullptr, out);
}

void lowrank_residual(std::span<const float> p, std::span<const float> q, const LowrankShape& s,
                      std::span<const float> w, std::span<float> residual) {
  expand_to(p, q, s, w.data(), residual);
}

}  // namespace wia::compress
