// SPDX-License-Identifier: Apache-2.0
// wia_benchmark_bandwidth (spec 6.2.2): copies between two devices through
// the public peer-copy API, so it measures exactly what applications get
// (direct peer copies, or host staging where the pair cannot peer).
//
// Method: buffers on both devices, one stream per device. Each figure is
// the median of repeats after warm-up copies (first-touch page faults and
// lazy provider setup are not what a steady-state loop sees):
//   latency_small: one 4 KiB copy a -> b, enqueue to stream complete (us);
//   latency_large: the same for 1 MiB;
//   unidirectional_gbps: 32 MiB a -> b / copy time;
//   bidirectional_gbps: 32 MiB a -> b and 32 MiB b -> a started together,
//     2 x 32 MiB / time until both are done.
#include <fmt/format.h>
#include <wia/topology.h>
#include <wia/wia.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <vector>

#include "common/error.hpp"
#include "discovery/discovery.hpp"

namespace wia::discovery {

namespace {

constexpr std::size_t kSmall = 4096;
constexpr std::size_t kLarge = 1 << 20;
constexpr std::size_t kBulk = 32u << 20;
constexpr int kWarmup = 2;
constexpr int kLatencyRepeats = 15;
constexpr int kBulkRepeats = 5;

void check(wia_status_t st, const char* what) {
  if (st != WIA_SUCCESS)
    throw Error(st, fmt::format("bandwidth benchmark: {}: {}", what, wia_get_last_error()));
}

// Owns what the benchmark allocates, released on every path.
struct Resources {
  std::vector<void*> buffers;
  std::vector<wia_stream_t> streams;
  ~Resources() {
    for (auto s : streams) wia_destroy_stream(s);
    for (auto b : buffers) wia_free(b);
  }
  void* alloc(std::int32_t dev, std::size_t size) {
    void* p = nullptr;
    check(wia_malloc_on(dev, &p, size), "allocate");
    buffers.push_back(p);
    check(wia_memset(p, 1, size), "fill");
    return p;
  }
  wia_stream_t stream(std::int32_t dev) {
    wia_stream_t s = nullptr;
    check(wia_create_stream_on(dev, &s), "create stream");
    streams.push_back(s);
    return s;
  }
};

double median_us(int warmup, int repeats, const std::function<void()>& once) {
  for (int i = 0; i < warmup; ++i) once();
  std::vector<double> t;
  for (int i = 0; i < repeats; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    once();
    t.push_back(
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
  }
  std::nth_element(t.begin(), t.begin() + static_cast<std::ptrdiff_t>(t.size() / 2), t.end());
  return t[t.size() / 2];
}

}  // namespace

wia_bandwidth_benchmark_t benchmark_bandwidth(std::int32_t a, std::int32_t b) {
  Resources r;
  void* src_a = r.alloc(a, kBulk);
  void* dst_b = r.alloc(b, kBulk);
  void* src_b = r.alloc(b, kBulk);
  void* dst_a = r.alloc(a, kBulk);
  wia_stream_t sa = r.stream(a);
  wia_stream_t sb = r.stream(b);
  auto copy = [&](void* dst, const void* src, std::size_t n, wia_stream_t s) {
    check(wia_memcpy_peer_async(dst, src, n, s), "peer copy");
  };
  auto sync = [&](wia_stream_t s) { check(wia_stream_synchronize(s), "synchronize"); };

  wia_bandwidth_benchmark_t out{};
  out.latency_small = median_us(kWarmup, kLatencyRepeats, [&] {
    copy(dst_b, src_a, kSmall, sa);
    sync(sa);
  });
  out.latency_large = median_us(kWarmup, kLatencyRepeats, [&] {
    copy(dst_b, src_a, kLarge, sa);
    sync(sa);
  });
  const double uni_us = median_us(kWarmup, kBulkRepeats, [&] {
    copy(dst_b, src_a, kBulk, sa);
    sync(sa);
  });
  const double bi_us = median_us(kWarmup, kBulkRepeats, [&] {
    copy(dst_b, src_a, kBulk, sa);
    copy(dst_a, src_b, kBulk, sb);
    sync(sa);
    sync(sb);
  });
  out.unidirectional_gbps = static_cast<double>(kBulk) / (uni_us * 1e3);
  out.bidirectional_gbps = 2.0 * static_cast<double>(kBulk) / (bi_us * 1e3);
  return out;
}

double alpha_from(const wia_bandwidth_benchmark_t& bench) {
  // Two points of t(n) = alpha + n / B: 4 KiB and 1 MiB.
  const double per_byte =
      (bench.latency_large - bench.latency_small) / static_cast<double>(kLarge - kSmall);
  const double alpha = bench.latency_small - per_byte * static_cast<double>(kSmall);
  return std::max(alpha, 0.01);
}

}  // namespace wia::discovery
