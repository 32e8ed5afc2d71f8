// SPDX-License-Identifier: Apache-2.0
// Gradient compression codecs (spec 6.8): pure functions over host
// buffers of float32. They know nothing of communicators or streams; the
// API layer (api/api_compress.cpp) moves their messages with the ordinary
// collectives. Every encoder writes a message whose size depends only on
// (n, parameters), so every rank can post the exchange before compressing.
// docs/compression.md states each wire format and error bound.
#pragma once

#include <wia/status.h>

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace wia::compress {

// Entries per scale of the quantize and 1-bit codecs (per-chunk range).
inline constexpr std::size_t kChunk = 256;

// Error feedback, fused: the encoders below that take a `residual` span
// encode w = x + residual and leave residual = w - (what the message
// decodes to), in the same pass; an empty span means no error feedback.
// The hot loops exist as a baseline x86-64 copy and an AVX2 copy that give
// the same bits (compress/simd.hpp). codec_force_baseline(true) makes the
// baseline copies run (tests, wia-compress-bench); false restores the
// default, the widest the CPU has. Returns whether the CPU has AVX2.
bool codec_force_baseline(bool on) noexcept;

// --- random numbers: counter-based, so every rank derives the same stream ---

// SplitMix64's finaliser: a strong 64-bit mix of x.
std::uint64_t mix64(std::uint64_t x) noexcept;
// A seed for (a, b, c): independent streams per rank and step.
std::uint64_t derive_seed(std::uint64_t a, std::uint64_t b, std::uint64_t c) noexcept;

// xoshiro256** seeded by SplitMix64.
class Rng {
 public:
  explicit Rng(std::uint64_t seed) noexcept;
  std::uint64_t next() noexcept {  // inline: codecs draw one per entry
    auto rotl = [](std::uint64_t x, int k) { return (x << k) | (x >> (64 - k)); };
    const std::uint64_t result = rotl(s_[1] * 5, 7) * 9;
    const std::uint64_t t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = rotl(s_[3], 45);
    return result;
  }
  // Uniform in [0, bound) (Lemire's multiply-shift, bias < 2^-32 for bound < 2^32).
  std::uint64_t below(std::uint64_t bound) noexcept;
  // Uniform in [0, 1) with 24 random bits (float's mantissa).
  float unit() noexcept { return static_cast<float>(next() >> 40) * 0x1p-24f; }

 private:
  std::uint64_t s_[4];
};

// --- sparsification ----------------------------------------------------------

// k = ceil(ratio * n), at least 1 and at most n (0 when n is 0).
std::size_t k_of(std::size_t n, double ratio) noexcept;

// An entry of a sparse message: 8 bytes on the wire.
struct Pair {
  std::uint32_t index;
  float value;
};

// Up to this many entries every entry is a top-k candidate; above it a
// threshold from a sample of kTopkSample entries first keeps only the
// candidates at or above it. Both paths return exactly the k largest keys
// (the sample only narrows the search; if too few entries pass, it is
// retried lower, then every entry is a candidate), so the result never
// depends on the path.
inline constexpr std::size_t kTopkExactMax = std::size_t{1} << 16;
inline constexpr std::size_t kTopkSample = 4096;

// The k entries of x with the largest |x| (magnitude) or x, as pairs in
// increasing index order. Ties are broken by the lower index. NaNs are
// never selected over numbers. Requires k <= x.size() < 2^32.
void topk_select(std::span<const float> x, std::size_t k, bool magnitude, std::span<Pair> out);
// The same selection over w = x + residual; residual becomes w with the k
// selected entries set to 0 (what was not sent).
void topk_select_ef(std::span<const float> x, std::span<float> residual, std::size_t k,
                    bool magnitude, std::span<Pair> out);
// Whether topk_select takes the sampled-threshold path for n entries.
bool topk_uses_sampling(std::size_t n) noexcept;

// k distinct indices in [0, n), increasing, drawn uniformly (Floyd's
// algorithm) from `seed`: the same on every rank for the same seed.
void randomk_indices(std::size_t n, std::size_t k, std::uint64_t seed,
                     std::span<std::uint32_t> out);
// out[j] = w[idx[j]] with w = x (+ residual); with a residual, it becomes
// w with the entries at idx set to 0.
void randomk_gather(std::span<const float> x, std::span<float> residual,
                    std::span<const std::uint32_t> idx, std::span<float> out) noexcept;

// acc[p.index] += p.value for every pair (indices >= acc.size() are
// skipped and counted: the return value).
std::size_t scatter_add(std::span<const Pair> pairs, std::span<float> acc) noexcept;

// --- quantization ------------------------------------------------------------

// Bytes of a quantized message of n entries: per chunk a float minimum and
// a float step, then ceil(len * bits / 8) bytes of levels.
// chunk = kChunk with a dynamic range per chunk, or n for one range.
std::size_t quantize_bytes(std::size_t n, int bits, std::size_t chunk) noexcept;
// Stochastic rounding to 2^bits - 1 steps over [min, max] of each chunk:
// E[decoded] = x, |decoded - x| < (max - min) / (2^bits - 1) of its chunk.
// bits is 1, 4, 8 or 16. The noise of entry i is a hash of (seed, i).
void quantize_encode(std::span<const float> x, int bits, std::size_t chunk, std::uint64_t seed,
                     std::span<std::byte> out, std::span<float> residual = {});
// acc[i] += decoded entry i of a message of acc.size() entries.
void quantize_decode_add(std::span<const std::byte> msg, int bits, std::size_t chunk,
                         std::span<float> acc);
// out[i] = 0 + (entry i of msgs[0]) + (entry i of msgs[1]) + ..., summed in
// that order (the same bits as zeroing out and quantize_decode_add of each
// message in turn), each output entry written once.
void quantize_decode_sum(std::span<const std::byte* const> msgs, int bits, std::size_t chunk,
                         std::span<float> out);

// --- 1-bit -------------------------------------------------------------------

// Bytes of a 1-bit message: per chunk of kChunk one scale (4 bytes in
// float32, 2 in float16/bfloat16), then one bit per entry.
std::size_t onebit_bytes(std::size_t n, wia_datatype_t scale_type) noexcept;
// Entry i becomes +s or -s (s = mean |x| of its chunk, the s that
// minimises the chunk's squared error for fixed signs; x >= 0 is +).
// With a residual, the scale is taken over w = x + residual and the
// residual is taken against the scale as rounded to scale_type.
void onebit_encode(std::span<const float> x, wia_datatype_t scale_type, std::span<std::byte> out,
                   std::span<float> residual = {});
void onebit_decode_add(std::span<const std::byte> msg, wia_datatype_t scale_type,
                       std::span<float> acc);
// As quantize_decode_sum.
void onebit_decode_sum(std::span<const std::byte* const> msgs, wia_datatype_t scale_type,
                       std::span<float> out);

// --- low rank (PowerSGD) -----------------------------------------------------

// The matrix view of a vector of n entries: rows x cols >= n, row-major,
// zero-padded; rows 0 = ceil(sqrt(n)) (near square). rank is clamped to
// [1, min(rows, cols)].
struct LowrankShape {
  std::size_t rows = 1, cols = 1, rank = 1;
};
LowrankShape lowrank_shape(std::size_t n, std::size_t rows, int rank) noexcept;
// A Gaussian cols x rank start for Q, the same on every rank for one seed.
void lowrank_init_q(const LowrankShape& s, std::uint64_t seed, std::span<float> q);
// p (rows x rank) = M q, M the matrix view of x.
void lowrank_project(std::span<const float> x, const LowrankShape& s, std::span<const float> q,
                     std::span<float> p);
// Orthonormalises p's columns in place (modified Gram-Schmidt in double).
void lowrank_orthonormalise(std::span<float> p, const LowrankShape& s);
// q (cols x rank) = M^T p.
void lowrank_back_project(std::span<const float> x, const LowrankShape& s, std::span<const float> p,
                          std::span<float> q);
// out (the first out.size() entries of the matrix view) = p q^T.
void lowrank_expand(std::span<const float> p, std::span<const float> q, const LowrankShape& s,
                    std::span<float> out);
// residual = w - (p q^T), entry by entry as lowrank_expand computes it.
void lowrank_residual(std::span<const float> p, std::span<const float> q, const LowrankShape& s,
                      std::span<const float> w, std::span<float> residual);

// --- casts -------------------------------------------------------------------

// dtype is WIA_FLOAT32, WIA_FLOAT16 or WIA_BFLOAT16 (round to nearest even).
void to_float(const void* in, wia_datatype_t dtype, std::span<float> out) noexcept;
void from_float(std::span<const float> in, wia_datatype_t dtype, void* out) noexcept;
std::size_t float_type_size(wia_datatype_t dtype) noexcept;
// out = the half (dtype WIA_FLOAT16 or WIA_BFLOAT16) of w = x (+ residual),
// residual = w - its half widened back.
void cast_encode(std::span<const float> x, std::span<float> residual, wia_datatype_t dtype,
                 void* out) noexcept;

// --- error feedback ----------------------------------------------------------

// x[i] += r[i].
void add_residual(std::span<float> x, std::span<const float> r) noexcept;
// w[i] = x[i] + r[i] (w distinct from both).
void add_into(std::span<const float> x, std::span<const float> r, std::span<float> w) noexcept;
// r[i] = corrected[i] - sent[i]: what this step's compression dropped.
void update_residual(std::span<const float> corrected, std::span<const float> sent,
                     std::span<float> r) noexcept;

}  // namespace wia::compress
