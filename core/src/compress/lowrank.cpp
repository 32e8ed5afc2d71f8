// SPDX-License-Identifier: Apache-2.0
// PowerSGD (Vogels et al., 2019): one step of subspace iteration per call.
// The gradient, viewed as a rows x cols matrix M, is sent as P = M Q
// (rows x r) and Q' = M^T P̂ (cols x r) with P̂ the orthonormalised sum of
// every rank's P; the estimate of the sum is P̂ (Σ Q')^T. Q is warm-started
// from the previous call's reduced Q', which is what makes one iteration
// per step enough. All products accumulate in double in a fixed order, so
// every rank, given the same reduced inputs, derives bit-identical P̂ and
// output.
//
// Speed: the rank is a template argument for 1, 2, 4 and 8 (the inner loop
// over it then vectorises), the projection keeps two sets of accumulators
// (even and odd columns) so its adds do not wait on each other, and the
// expansion runs along a row with the columns of Q widened and transposed
// once, so its loop vectorises over the columns.
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

// R: the rank, or 0 for any rank (r at run time).
template <std::size_t R>
WIA_CODEC_INLINE void project_body(const float* __restrict x, std::size_t n, std::size_t rows,
                                   std::size_t cols, std::size_t r, const float* __restrict q,
                                   float* __restrict p, double* __restrict a0,
                                   double* __restrict a1) noexcept {
  if constexpr (R != 0) r = R;
  for (std::size_t i = 0; i < rows; ++i) {
    for (std::size_t k = 0; k < r; ++k) a0[k] = a1[k] = 0.0;
    const std::size_t begin = std::min(i * cols, n);
    const std::size_t len = std::min(begin + cols, n) - begin;
    const float* xi = x + begin;
    std::size_t j = 0;
    for (; j + 2 <= len; j += 2) {
      const double v0 = xi[j], v1 = xi[j + 1];
      const float* q0 = q + j * r;
      const float* q1 = q0 + r;
      for (std::size_t k = 0; k < r; ++k) {
        a0[k] += v0 * static_cast<double>(q0[k]);
        a1[k] += v1 * static_cast<double>(q1[k]);
      }
    }
    if (j < len) {
      const double v0 = xi[j];
      for (std::size_t k = 0; k < r; ++k) a0[k] += v0 * static_cast<double>(q[j * r + k]);
    }
    for (std::size_t k = 0; k < r; ++k) p[i * r + k] = static_cast<float>(a0[k] + a1[k]);
  }
}

// scratch: 2 r doubles.
WIA_CODEC_INLINE void project_fn_body(const float* x, std::size_t n, std::size_t rows,
                                      std::size_t cols, std::size_t r, const float* q, float* p,
                                      double* scratch) noexcept {
  double* a0 = scratch;
  double* a1 = scratch + r;
  switch (r) {
    case 1:
      return project_body<1>(x, n, rows, cols, r, q, p, a0, a1);
    case 2:
      return project_body<2>(x, n, rows, cols, r, q, p, a0, a1);
    case 4:
      return project_body<4>(x, n, rows, cols, r, q, p, a0, a1);
    case 8:
      return project_body<8>(x, n, rows, cols, r, q, p, a0, a1);
    default:
      return project_body<0>(x, n, rows, cols, r, q, p, a0, a1);
  }
}

// acc (cols x r, double) += M^T p, row by row: the same order of sums as
// a plain loop over rows.
template <std::size_t R>
WIA_CODEC_INLINE void back_project_body(const float* __restrict x, std::size_t n, std::size_t rows,
                                        std::size_t cols, std::size_t r, const float* __restrict p,
                                        double* __restrict acc, double* __restrict pi) noexcept {
  if constexpr (R != 0) r = R;
  for (std::size_t i = 0; i < rows; ++i) {
    for (std::size_t k = 0; k < r; ++k) pi[k] = p[i * r + k];
    const std::size_t begin = std::min(i * cols, n);
    const std::size_t len = std::min(begin + cols, n) - begin;
    const float* xi = x + begin;
    for (std::size_t j = 0; j < len; ++j) {
      const double v = xi[j];
      double* a = acc + j * r;
      for (std::size_t k = 0; k < r; ++k) a[k] += v * pi[k];
    }
  }
}

// scratch: r doubles.
WIA_CODEC_INLINE void back_project_fn_body(const float* x, std::size_t n, std::size_t rows,
                                           std::size_t cols, std::size_t r, const float* p,
                                           double* acc, double* scratch) noexcept {
  switch (r) {
    case 1:
      return back_project_body<1>(x, n, rows, cols, r, p, acc, scratch);
    case 2:
      return back_project_body<2>(x, n, rows, cols, r, p, acc, scratch);
    case 4:
      return back_project_body<4>(x, n, rows, cols, r, p, acc, scratch);
    case 8:
      return back_project_body<8>(x, n, rows, cols, r, p, acc, scratch);
    default:
      return back_project_body<0>(x, n, rows, cols, r, p, acc, scratch);
  }
}

// Entry e of P Q^T, computed as ((0 + p0 q0) + p1 q1) + ... in double,
// with qt the columns of Q in double (r rows of cols). w null: out = the
// entry; else out = w - the entry (the residual).
WIA_CODEC_INLINE void expand_body(const float* __restrict p, const double* __restrict qt,
                                  std::size_t n, std::size_t cols, std::size_t r,
                                  const float* __restrict w, float* __restrict out) noexcept {
  double row[256];
  for (std::size_t begin = 0, i = 0; begin < n; begin += cols, ++i) {
    const std::size_t len = std::min(cols, n - begin);
    for (std::size_t jb = 0; jb < len; jb += 256) {
      const std::size_t m = std::min<std::size_t>(256, len - jb);
      for (std::size_t j = 0; j < m; ++j) row[j] = 0.0;
      for (std::size_t k = 0; k < r; ++k) {
        const double pk = p[i * r + k];
        const double* q = qt + k * cols + jb;
        for (std::size_t j = 0; j < m; ++j) row[j] += pk * q[j];
      }
      float* o = out + begin + jb;
      if (w) {
        const float* ww = w + begin + jb;
        for (std::size_t j = 0; j < m; ++j) o[j] = ww[j] - static_cast<float>(row[j]);
      } else {
        for (std::size_t j = 0; j < m; ++j) o[j] = static_cast<float>(row[j]);
      }
    }
  }
}

WIA_CODEC_INLINE void expand_fn_body(const float* p, const double* qt, std::size_t n,
                                     std::size_t cols, std::size_t r, const float* w,
                                     float* out) noexcept {
  expand_body(p, qt, n, cols, r, w, out);
}

WIA_CODEC_DISPATCH(void, project_fn,
                   (const float* x, std::size_t n, std::size_t rows, std::size_t cols,
                    std::size_t r, const float* q, float* p, double* scratch) noexcept,
                   (x, n, rows, cols, r, q, p, scratch))
WIA_CODEC_DISPATCH(void, back_project_fn,
                   (const float* x, std::size_t n, std::size_t rows, std::size_t cols,
                    std::size_t r, const float* p, double* acc, double* scratch) noexcept,
                   (x, n, rows, cols, r, p, acc, scratch))
WIA_CODEC_DISPATCH(void, expand_fn,
                   (const float* p, const double* qt, std::size_t n, std::size_t cols,
                    std::size_t r, const float* w, float* out) noexcept,
                   (p, qt, n, cols, r, w, out))

void expand(std::span<const float> p, std::span<const float> q, const LowrankShape& s,
            const float* w, std::span<float> out) {
  const std::size_t r = s.rank;
  std::vector<double> qt(s.cols * r);
  for (std::size_t j = 0; j < s.cols; ++j)
    for (std::size_t k = 0; k < r; ++k) qt[k * s.cols + j] = q[j * r + k];
  expand_fn(p.data(), qt.data(), std::min(out.size(), s.rows * s.cols), s.cols, r, w, out.data());
}

}  // namespace

// Entry (i, j) of M: x[i * cols + j], zero past the end of x (padding).
void lowrank_project(std::span<const float> x, const LowrankShape& s, std::span<const float> q,
                     std::span<float> p) {
  std::vector<double> scratch(2 * s.rank);
  project_fn(x.data(), x.size(), s.rows, s.cols, s.rank, q.data(), p.data(), scratch.data());
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
  std::vector<double> acc(s.cols * s.rank, 0.0);
  std::vector<double> scratch(s.rank);
  back_project_fn(x.data(), x.size(), s.rows, s.cols, s.rank, p.data(), acc.data(), scratch.data());
  for (std::size_t i = 0; i < acc.size(); ++i) q[i] = static_cast<float>(acc[i]);
}

void lowrank_expand(std::span<const float> p, std::span<const float> q, const LowrankShape& s,
                    std::span<float> out) {
  expand(p, q, s, nullptr, out);
}

void lowrank_residual(std::span<const float> p, std::span<const float> q, const LowrankShape& s,
                      std::span<const float> w, std::span<float> residual) {
  expand(p, q, s, w.data(), residual);
}

}  // namespace wia::compress
