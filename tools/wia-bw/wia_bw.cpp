// SPDX-License-Identifier: Apache-2.0
// wia-bw: bandwidth and latency of peer copies between every pair of
// devices (wia_benchmark_bandwidth, spec 6.2.2), as matrices, and
// optionally as a topology file with the measured figures:
//   wia-bw                      four matrices (GB/s uni, GB/s bidi, us 4 KiB, us 1 MiB)
//   wia-bw --output links.yaml  also write the discovered topology with each
//                               link's bandwidth_gbps = unidirectional GB/s and
//                               latency_us = alpha fitted through 4 KiB and 1 MiB
// The file has the schema of docs/topology.md: wia-info --topology-file
// shows it, --topology-diff compares it with a declared topology, and the
// tuner reads it through tuner.link_file (WIA_TUNER_LINK_FILE).
#include <fmt/core.h>
#include <wia/topology.h>
#include <wia/wia.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "common/error.hpp"
#include "topology/topology.hpp"

namespace {

void usage(FILE* out) {
  std::fputs(
      "usage: wia-bw [--output FILE] [--help]\n"
      "  Measures peer copies between every ordered pair of devices (warm-up, then\n"
      "  medians): unidirectional and bidirectional GB/s at 32 MiB, latency of a\n"
      "  4 KiB and a 1 MiB copy in us.\n"
      "  --output FILE  write the discovered topology with measured links (schema of\n"
      "                 docs/topology.md) for tuner.link_file / WIA_TUNER_LINK_FILE\n",
      out);
}

}  // namespace

int main(int argc, char** argv) {
  const char* output = nullptr;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--output") && i + 1 < argc) {
      output = argv[++i];
    } else if (!std::strcmp(argv[i], "--help") || !std::strcmp(argv[i], "-h")) {
      usage(stdout);
      return 0;
    } else {
      std::fprintf(stderr, "wia-bw: unknown option '%s'\n", argv[i]);
      usage(stderr);
      return 2;
    }
  }
  int n = 0;
  if (wia_get_device_count(&n) != WIA_SUCCESS) {
    std::fprintf(stderr, "wia-bw: %s\n", wia_get_last_error());
    return 1;
  }
  if (n < 2) {
    std::fprintf(stderr, "wia-bw: %d device(s); at least 2 are needed (e.g. WIA_HOST_DEVICES=2)\n",
                 n);
    return 1;
  }
  const auto un = static_cast<std::size_t>(n);
  std::vector<wia_bandwidth_benchmark_t> m(un * un);
  for (int a = 0; a < n; ++a)
    for (int b = 0; b < n; ++b) {
      if (a == b) continue;
      if (wia_benchmark_bandwidth(a, b, &m[static_cast<std::size_t>(a) * un + b]) != WIA_SUCCESS) {
        std::fprintf(stderr, "wia-bw: device %d -> %d: %s\n", a, b, wia_get_last_error());
        return 1;
      }
    }
  auto matrix = [&](const char* title, auto cell) {
    fmt::print("{}\n{:>8}", title, "");
    for (int b = 0; b < n; ++b) fmt::print("{:>10}", fmt::format("d{}", b));
    fmt::print("\n");
    for (int a = 0; a < n; ++a) {
      fmt::print("{:>8}", fmt::format("d{}", a));
      for (int b = 0; b < n; ++b)
        fmt::print("{:>10}",
                   a == b ? std::string("-")
                          : fmt::format("{:.2f}", cell(m[static_cast<std::size_t>(a) * un + b])));
      fmt::print("\n");
    }
    fmt::print("\n");
  };
  matrix("Unidirectional (GB/s, 32 MiB):", [](const auto& x) { return x.unidirectional_gbps; });
  matrix("Bidirectional (GB/s, both ways together):",
         [](const auto& x) { return x.bidirectional_gbps; });
  matrix("Latency 4 KiB (us):", [](const auto& x) { return x.latency_small; });
  matrix("Latency 1 MiB (us):", [](const auto& x) { return x.latency_large; });

  if (output != nullptr) {
    try {
      wia::topo::Topology t = wia::topo::discover();
      if (t.n != n) throw wia::Error(WIA_ERROR_INTERNAL, "device count changed during the run");
      for (int a = 0; a < n; ++a)
        for (int b = 0; b < n; ++b) {
          if (a == b) continue;
          const auto& x = m[static_cast<std::size_t>(a) * un + b];
          t.bandwidth[t.at(a, b)] = x.unidirectional_gbps;
          t.latency[t.at(a, b)] = wia::topo::alpha_from(x);
        }
      wia::topo::export_yaml(t, output);
      fmt::print("wrote {} (bandwidth_gbps = unidirectional, latency_us = fitted alpha)\n", output);
    } catch (const wia::Error& e) {
      std::fprintf(stderr, "wia-bw: %s\n", e.what());
      return 1;
    }
  }
  wia_finalize();
  return 0;
}
