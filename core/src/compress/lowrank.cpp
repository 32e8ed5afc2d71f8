// SPDX-License-Identifier: Apache-2.0
// PowerSGD (Vogels et al., 2019): one step of subspace iteration per call.
// The gradient, viewed as a rows x cols matrix M, is sent as P = M Q
// (rows x r) and Q' = M^T P̂ (cols x r) with P̂ the orthonormalised sum of
// every rank's P; the estimate of the sum is P̂ (Σ Q')^T. Q is warm-started
// from the previous call's reduced Q', which is what makes one iteration
// per step enough. All products are row-major and accumulate in double so
// every rank, given the same reduced inputs, derives bit-identical P̂.
#include <algorithm>
#include <cmath>

#include "compress/codec.hpp"

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

// Entry (i, j) of M: x[i * cols + j], zero past the end of x (padding).
void lowrank_project(std::span<const float> x, const LowrankShape& s, std::span<const float> q,
                     std::span<float> p) {
  const std::size_t r = s.rank;
  std::vector<double> acc(r);
  for (std::size_t i = 0; i < s.rows; ++i) {
    std::fill(acc.begin(), acc.end(), 0.0);
    const std::size_t begin = i * s.cols;
    const std::size_t end = std::min(begin + s.cols, x.size());
    for (std::size_t e = begin; e < end; ++e) {
      const double v = x[e];
      const float* qj = &q[(e - begin) * r];
      for (std::size_t k = 0; k < r; ++k) acc[k] += v * qj[k];
    }
    for (std::size_t k = 0; k < r; ++k) p[i * r + k] = static_cast<float>(acc[k]);
  }
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
  const std::size_t r = s.rank;
  std::vector<double> acc(s.cols * r, 0.0);
  for (std::size_t i = 0; i < s.rows; ++i) {
    const std::size_t begin = i * s.cols;
    const std::size_t end = std::min(begin + s.cols, x.size());
    const float* pi = &p[i * r];
    for (std::size_t e = begin; e < end; ++e) {
      const double v = x[e];
      double* qj = &acc[(e - begin) * r];
      for (std::size_t k = 0; k < r; ++k) qj[k] += v * pi[k];
    }
  }
  for (std::size_t i = 0; i < acc.size(); ++i) q[i] = static_cast<float>(acc[i]);
}

void lowrank_expand(std::span<const float> p, std::span<const float> q, const LowrankShape& s,
                    std::span<float> out) {
  const std::size_t r = s.rank;
  for (std::size_t e = 0; e < out.size(); ++e) {
    const float* pi = &p[(e / s.cols) * r];
    const float* qj = &q[(e % s.cols) * r];
    double v = 0;
    for (std::size_t k = 0; k < r; ++k) v += static_cast<double>(pi[k]) * qj[k];
    out[e] = static_cast<float>(v);
  }
}

}  // namespace wia::compress
