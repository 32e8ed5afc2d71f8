// SPDX-License-Identifier: Apache-2.0
// wia-compress-bench [--size BYTES] [--reps N] [--ranks P] [--only METHOD]
//
// The gradient-compression codecs (core/src/compress) on one thread, so
// one core: GB/s of fp32 gradient per second (--size bytes of fp32, default
// 64 MiB, divided by the CPU time of one call on its thread, best of
// --reps, default 5) for
// the encode and decode of each method, as the compressed all-reduce calls
// them, with the ratio to issue 23's goal where it has one. Every row runs
// twice: with the copies of the hot loops the CPU gets by default (AVX2
// where it has it) and with the baseline x86-64 copies. memcpy of the same
// bytes, measured in the same run, is the physical reference.
//
// "encode+EF" is the fused encode with error feedback (w = x + r, encode
// w, r = w - decoded); "decode" turns one message into the fp32 vector,
// "decode xP" sums P messages (one per rank) into it, and its GB/s counts
// the P vectors decoded. Exits 1 if a decoded vector breaks its codec's
// bound or the two copies of a loop disagree, so ctest can run it small.
#include <fmt/core.h>
#include <time.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "compress/codec.hpp"

namespace {
using namespace wia::compress;

[[noreturn]] void usage(const char* why) {
  std::fprintf(stderr,
               "wia-compress-bench: %s\nusage: wia-compress-bench [--size BYTES] [--reps N] "
               "[--ranks P] [--only METHOD]\n",
               why);
  std::exit(2);
}

std::size_t parse_size(const std::string& s) {
  char* end = nullptr;
  double v = std::strtod(s.c_str(), &end);
  const std::string unit = end ? end : "";
  if (unit == "K" || unit == "KiB")
    v *= 1024;
  else if (unit == "M" || unit == "MiB")
    v *= 1024 * 1024;
  else if (unit == "G" || unit == "GiB")
    v *= 1024.0 * 1024 * 1024;
  else if (!unit.empty())
    usage("bad --size");
  if (!(v >= 4)) usage("--size must be at least 4 bytes");
  return static_cast<std::size_t>(v);
}

// This thread's CPU time: on a machine shared with other work, the time
// the codec actually ran on its core, not the time it waited for one.
double cpu_seconds() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

// CPU seconds of the fastest of reps calls (one untimed call first).
double best_of(int reps, const std::function<void()>& f) {
  f();
  double best = 1e30;
  for (int i = 0; i < reps; ++i) {
    const double t0 = cpu_seconds();
    f();
    best = std::min(best, cpu_seconds() - t0);
  }
  return best;
}

// Gradient-like data: roughly Gaussian (sum of 4 uniforms), scale 1.
std::vector<float> gradient(std::size_t n, std::uint64_t seed) {
  std::vector<float> x(n);
  Rng rng(seed);
  for (auto& v : x) {
    const std::uint64_t b = rng.next();
    float s = 0;
    for (int k = 0; k < 4; ++k) s += static_cast<float>((b >> (16 * k)) & 0xffff) * 0x1p-16f;
    v = (s - 2.0f) * 1.7f;
  }
  return x;
}

struct Row {
  std::string method, op;
  double goal;         // GB/s per core, 0: none
  double vectors = 1;  // fp32 vectors of n entries one call processes
  std::function<void()> run;
};

int failures = 0;
void check(bool ok, const std::string& what) {
  if (!ok) {
    std::fprintf(stderr, "wia-compress-bench: FAILED: %s\n", what.c_str());
    ++failures;
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::size_t bytes = 64u << 20;
  int reps = 5, ranks = 4;
  std::string only;  // run the rows of this method only
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) usage(("missing value after " + a).c_str());
      return argv[++i];
    };
    if (a == "--size")
      bytes = parse_size(next());
    else if (a == "--reps")
      reps = std::max(1, std::atoi(next().c_str()));
    else if (a == "--ranks")
      ranks = std::max(1, std::atoi(next().c_str()));
    else if (a == "--only")
      only = next();
    else
      usage(("unknown argument " + a).c_str());
  }
  const std::size_t n = bytes / sizeof(float);
  const std::size_t P = static_cast<std::size_t>(ranks);
  const std::vector<float> x = gradient(n, 1);
  std::vector<float> r = gradient(n, 2), out(n), copy(n);
  for (auto& v : r) v *= 0.01f;

  // Messages, sized as the all-reduce sizes them.
  const std::size_t k = k_of(n, 0.01);
  std::vector<std::byte> q8(quantize_bytes(n, 8, kChunk)), q4(quantize_bytes(n, 4, kChunk));
  std::vector<std::byte> ob(onebit_bytes(n, WIA_FLOAT32));
  std::vector<Pair> pairs(k);
  std::vector<std::uint32_t> idx(k);
  std::vector<float> vals(k);
  std::vector<std::uint16_t> half(n);
  const LowrankShape shape = lowrank_shape(n, 0, 4);
  std::vector<float> lq(shape.cols * shape.rank), lp(shape.rows * shape.rank),
      lq2(shape.cols * shape.rank);
  lowrank_init_q(shape, 7, lq);
  std::uint64_t step = 0;
  auto many = [&](std::vector<std::byte>& m) { return std::vector<const std::byte*>(P, m.data()); };
  const auto q8s = many(q8), q4s = many(q4), obs = many(ob);
  const double vP = static_cast<double>(P);
  const std::string xP = fmt::format("decode x{}", P);

  std::vector<Row> rows = {
      {"int8", "encode", 2.0, 1, [&] { quantize_encode(x, 8, kChunk, ++step, q8); }},
      {"int8", "encode+EF", 2.0, 1, [&] { quantize_encode(x, 8, kChunk, ++step, q8, r); }},
      {"int8", "decode", 2.0, 1,
       [&] {
         quantize_decode_sum({q8s.data(), 1}, 8, kChunk, out);
       }},
      {"int8", xP, 2.0, vP, [&] { quantize_decode_sum(q8s, 8, kChunk, out); }},
      {"int4", "encode", 0, 1, [&] { quantize_encode(x, 4, kChunk, ++step, q4); }},
      {"int4", "decode", 0, 1,
       [&] {
         quantize_decode_sum({q4s.data(), 1}, 4, kChunk, out);
       }},
      {"1-bit", "encode+EF", 2.0, 1, [&] { onebit_encode(x, WIA_FLOAT32, ob, r); }},
      {"1-bit", "decode", 2.0, 1,
       [&] {
         onebit_decode_sum({obs.data(), 1}, WIA_FLOAT32, out);
       }},
      {"1-bit", xP, 2.0, vP, [&] { onebit_decode_sum(obs, WIA_FLOAT32, out); }},
      {"top-k 1%", "select", 0.5, 1, [&] { topk_select(x, k, true, pairs); }},
      {"top-k 1%", "select+EF", 0.5, 1, [&] { topk_select_ef(x, r, k, true, pairs); }},
      {"top-k 1%", xP, 0, vP,
       [&] {
         std::fill(out.begin(), out.end(), 0.0f);
         for (std::size_t p = 0; p < P; ++p) scatter_add(pairs, out);
       }},
      {"random-k 1%", "encode", 0, 1,
       [&] {
         randomk_indices(n, k, ++step, idx);
         randomk_gather(x, {}, idx, vals);
       }},
      {"random-k 1%", "encode+EF", 0, 1,
       [&] {
         randomk_indices(n, k, ++step, idx);
         randomk_gather(x, r, idx, vals);
       }},
      {"random-k 1%", "decode", 0, 1,
       [&] {
         std::fill(out.begin(), out.end(), 0.0f);
         for (std::size_t i = 0; i < k; ++i) out[idx[i]] = vals[i] * 100.0f;
       }},
      {"fp16", "encode", 0, 1, [&] { cast_encode(x, {}, WIA_FLOAT16, half.data()); }},
      {"fp16", "encode+EF", 0, 1, [&] { cast_encode(x, r, WIA_FLOAT16, half.data()); }},
      {"fp16", "decode", 0, 1, [&] { to_float(half.data(), WIA_FLOAT16, out); }},
      {"bf16", "encode", 0, 1, [&] { cast_encode(x, {}, WIA_BFLOAT16, half.data()); }},
      {"bf16", "encode+EF", 0, 1, [&] { cast_encode(x, r, WIA_BFLOAT16, half.data()); }},
      {"bf16", "decode", 0, 1, [&] { to_float(half.data(), WIA_BFLOAT16, out); }},
      {"lowrank:4", "encode (MQ)", 0, 1, [&] { lowrank_project(x, shape, lq, lp); }},
      {"lowrank:4", "middle+EF", 0, 1,
       [&] {
         lowrank_orthonormalise(lp, shape);
         lowrank_back_project(x, shape, lp, lq2);
         lowrank_residual(lp, lq2, shape, x, r);
       }},
      {"lowrank:4", "decode", 0, 1, [&] { lowrank_expand(lp, lq2, shape, out); }},
  };

  const bool have_avx2 = codec_force_baseline(false);
  const double gb = static_cast<double>(n * sizeof(float)) / 1e9;
  const double t_copy =
      best_of(reps, [&] { std::memcpy(copy.data(), x.data(), n * sizeof(float)); });
  std::printf(
      "# wia-compress-bench: %zu float32 (%.1f MiB), best of %d, one thread, "
      "thread CPU time\n",
      n, static_cast<double>(n * sizeof(float)) / (1 << 20), reps);
  std::printf("# memcpy of the same bytes: %.2f GB/s (the physical reference)\n", gb / t_copy);
  std::printf("# GB/s: fp32 gradient bytes per second on one core; '%s' column: %s\n",
              have_avx2 ? "avx2" : "default",
              have_avx2 ? "AVX2 copies (default here)" : "no AVX2 on this CPU: baseline only");
  std::printf("# %-12s %-12s %9s %9s %7s %9s %8s\n", "method", "op", have_avx2 ? "avx2" : "default",
              "baseline", "goal", "ratio", "memcpy%");
  for (const Row& row : rows) {
    if (!only.empty() && row.method != only) continue;
    codec_force_baseline(false);
    const double t = best_of(reps, row.run) / row.vectors;
    double tb = t;
    if (have_avx2) {
      codec_force_baseline(true);
      tb = best_of(reps, row.run) / row.vectors;
      codec_force_baseline(false);
    }
    const double g = gb / t;
    std::string goal = "-", ratio = "-";
    if (row.goal > 0) {
      goal = fmt::format("{:.1f}", row.goal);
      ratio = fmt::format("{:.2f}{}", g / row.goal, g >= row.goal ? "" : " (<1)");
    }
    std::printf("  %-12s %-12s %9.2f %9.2f %7s %9s %7.0f%%\n", row.method.c_str(), row.op.c_str(),
                g, gb / tb, goal.c_str(), ratio.c_str(), 100 * t_copy / t);
  }

  // Sanity: int8 of x decodes within one step of each chunk's range, and
  // the two copies of the loops write the same message.
  quantize_encode(x, 8, kChunk, 99, q8);
  quantize_decode_sum({q8s.data(), 1}, 8, kChunk, out);
  bool within = true;
  for (std::size_t b = 0; b < n; b += kChunk) {
    const auto [mn, mx] =
        std::minmax_element(x.begin() + static_cast<std::ptrdiff_t>(b),
                            x.begin() + static_cast<std::ptrdiff_t>(std::min(n, b + kChunk)));
    const double stepsz = (double(*mx) - *mn) / 255;
    for (std::size_t i = b; i < std::min(n, b + kChunk); ++i)
      within = within && std::fabs(double(out[i]) - x[i]) <= stepsz * (1 + 1e-5) + 1e-6;
  }
  check(within, "int8 decode outside one step of its chunk");
  if (have_avx2) {
    std::vector<std::byte> other(q8.size());
    codec_force_baseline(true);
    quantize_encode(x, 8, kChunk, 99, other);
    codec_force_baseline(false);
    check(other == q8, "int8 message differs between the baseline and AVX2 copies");
  }
  return failures ? 1 : 0;
}
