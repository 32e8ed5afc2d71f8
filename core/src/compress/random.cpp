// SPDX-License-Identifier: Apache-2.0
// Counter-based random numbers for random-k indices and stochastic
// rounding: a rank and a step name a stream, so ranks agree without talking.
#include "compress/codec.hpp"

namespace wia::compress {

std::uint64_t mix64(std::uint64_t x) noexcept {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

std::uint64_t derive_seed(std::uint64_t a, std::uint64_t b, std::uint64_t c) noexcept {
  return mix64(mix64(mix64(a) ^ b) ^ c);
}

Rng::Rng(std::uint64_t seed) noexcept {
  for (auto& s : s_) s = seed = mix64(seed);
}

std::uint64_t Rng::below(std::uint64_t bound) noexcept {
  // 64x64 -> 128-bit multiply keeps the high word: uniform up to 2^-64 bias
  // per unit of bound.
  return static_cast<std::uint64_t>((static_cast<unsigned __int128>(next()) * bound) >> 64);
}

}  // namespace wia::compress
