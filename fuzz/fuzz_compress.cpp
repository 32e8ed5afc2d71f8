// SPDX-License-Identifier: Apache-2.0
// fuzz_compress: the gradient compression wire formats (docs/compression.md)
// as a rank receives them: quantized (1, 4, 8, 16 bits, per-chunk or one
// range), 1-bit (float32, float16, bfloat16 scales) and sparse (index,
// value) pairs, plus encode -> decode of fuzzed gradients.
//
// A message's size is fixed by (n, parameters), which every rank knows
// before the exchange; the harness gives each decoder a message of exactly
// that size with fuzzed contents (scales that are NaN, infinite, negative,
// levels beyond the range), as a corrupted or hostile peer would.
//
// Invariants beyond "no crash":
//  - a decoder writes only its n outputs (ASan guards the exact-size vector)
//    and a scatter skips, and counts, every index outside the output;
//  - decode_sum of messages gives the same bits as zeroing and decode_add
//    of each message in turn (codec.hpp promises it);
//  - encoding finite input and decoding it stays within the documented
//    error bound: |decoded - x| <= (max - min) / (2^bits - 1) of its chunk.
#include <algorithm>
#include <cmath>
#include <vector>

#include "compress/codec.hpp"
#include "fuzz_common.hpp"

namespace {

namespace cz = wia::compress;
using wia::fuzz::check;

constexpr int kBits[] = {1, 4, 8, 16};
constexpr wia_datatype_t kScales[] = {WIA_FLOAT32, WIA_FLOAT16, WIA_BFLOAT16};

std::vector<std::byte> message(wia::fuzz::Bytes& in, std::size_t bytes) {
  std::vector<std::byte> m(bytes);
  const auto got = in.take(bytes);
  std::memcpy(m.data(), got.data(), got.size());
  return m;
}

std::vector<float> floats(wia::fuzz::Bytes& in, std::size_t n) {
  std::vector<float> v(n);
  for (auto& f : v) {
    const std::uint32_t bits = in.u32();
    std::memcpy(&f, &bits, 4);
  }
  return v;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * 4) == 0;
}

// decode_sum against zeroing then decode_add of each message in turn.
template <typename Add, typename Sum>
void sum_matches_adds(const std::vector<std::byte>& m0, const std::vector<std::byte>& m1,
                      std::size_t n, Add add, Sum sum, const char* what) {
  std::vector<float> by_add(n, 0.0f);
  add(m0, by_add);
  add(m1, by_add);
  std::vector<float> by_sum(n, 1.0f);  // every entry must be written
  const std::byte* msgs[] = {m0.data(), m1.data()};
  sum(std::span<const std::byte* const>(msgs), by_sum);
  check(same_bits(by_add, by_sum), std::string(what) + ": decode_sum differs from decode_add");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  wia::fuzz::Bytes in(data, size);
  const std::uint8_t mode = in.u8();
  const std::size_t n = 1 + in.u16() % 2048;
  cz::codec_force_baseline((mode & 0x80) != 0);
  switch (mode & 0x7f) {
    case 0: {  // quantized messages from the wire
      const int bits = kBits[in.u8() % 4];
      const std::size_t chunk = (in.u8() & 1) ? cz::kChunk : n;
      const std::size_t bytes = cz::quantize_bytes(n, bits, chunk);
      const auto m0 = message(in, bytes);
      const auto m1 = message(in, bytes);
      sum_matches_adds(
          m0, m1, n,
          [&](const std::vector<std::byte>& m, std::vector<float>& acc) {
            cz::quantize_decode_add(m, bits, chunk, acc);
          },
          [&](std::span<const std::byte* const> msgs, std::vector<float>& out) {
            cz::quantize_decode_sum(msgs, bits, chunk, out);
          },
          "quantize");
      break;
    }
    case 1: {  // 1-bit messages from the wire
      const wia_datatype_t scale = kScales[in.u8() % 3];
      const std::size_t bytes = cz::onebit_bytes(n, scale);
      const auto m0 = message(in, bytes);
      const auto m1 = message(in, bytes);
      sum_matches_adds(
          m0, m1, n,
          [&](const std::vector<std::byte>& m, std::vector<float>& acc) {
            cz::onebit_decode_add(m, scale, acc);
          },
          [&](std::span<const std::byte* const> msgs, std::vector<float>& out) {
            cz::onebit_decode_sum(msgs, scale, out);
          },
          "onebit");
      break;
    }
    case 2: {  // sparse pairs from the wire
      std::vector<cz::Pair> pairs(in.remaining() / 8);
      std::size_t outside = 0;
      for (auto& p : pairs) {
        p.index = in.u32();
        const std::uint32_t bits = in.u32();
        std::memcpy(&p.value, &bits, 4);
        outside += p.index >= n ? 1 : 0;
      }
      std::vector<float> acc(n, 0.0f);
      check(cz::scatter_add(pairs, acc) == outside, "scatter_add: wrong count of skipped pairs");
      break;
    }
    case 3: {  // encode -> decode of a fuzzed gradient
      const int bits = kBits[in.u8() % 4];
      const std::size_t chunk = (in.u8() & 1) ? cz::kChunk : n;
      const std::uint64_t seed = in.u64();
      std::vector<float> x = floats(in, n);
      // Finite input with a finite range: the bound is a number.
      for (auto& f : x) f = std::isfinite(f) ? std::clamp(f, -1e30f, 1e30f) : 0.0f;
      std::vector<std::byte> msg(cz::quantize_bytes(n, bits, chunk));
      cz::quantize_encode(x, bits, chunk, seed, msg);
      std::vector<float> y(n, 0.0f);
      cz::quantize_decode_add(msg, bits, chunk, y);
      for (std::size_t c0 = 0; c0 < n; c0 += chunk) {
        const std::size_t c1 = std::min(n, c0 + chunk);
        const auto [lo, hi] = std::minmax_element(x.begin() + c0, x.begin() + c1);
        const double step = (static_cast<double>(*hi) - *lo) / ((1u << bits) - 1);
        for (std::size_t i = c0; i < c1; ++i) {
          const double err = std::fabs(static_cast<double>(y[i]) - x[i]);
          // float rounding of min + level * step adds a few ulps of the range.
          const double slack = 1e-5 * (std::fabs(*hi) + std::fabs(*lo)) + 1e-30;
          check(err <= step + slack, "quantize " + std::to_string(bits) + " bits: entry " +
                                         std::to_string(i) + " off by " + std::to_string(err) +
                                         ", step " + std::to_string(step));
        }
      }
      break;
    }
    case 4: {  // top-k selection of a fuzzed gradient
      std::vector<float> x = floats(in, n);
      const std::size_t k = 1 + in.u16() % n;
      std::vector<cz::Pair> out(k);
      cz::topk_select(x, k, true, out);
      for (std::size_t i = 0; i < k; ++i) {
        check(out[i].index < n, "topk: index outside the gradient");
        check(i == 0 || out[i - 1].index < out[i].index, "topk: indices not increasing");
      }
      break;
    }
    default:
      break;
  }
  return 0;
}
