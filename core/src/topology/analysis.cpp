// SPDX-License-Identifier: Apache-2.0
// Topology analysis: shortest paths, balanced cuts, the strategy rule.
#include "topology/analysis.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <limits>

namespace wia::topo {

namespace {

constexpr int kNoPath = std::numeric_limits<int>::max() / 4;

// Links within this factor of each other count as uniform.
constexpr double kUniformRatio = 2.0;
// Slowest link below this (GB/s, Ethernet class): only pipeline traffic
// (activations between neighbouring stages) should cross it.
constexpr double kSlowLinkGbps = 16.0;

}  // namespace

std::vector<int> shortest_hops(const Topology& t) {
  const int n = t.n;
  std::vector<int> d(static_cast<std::size_t>(n) * n, kNoPath);
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < n; ++j) {
      const auto k = t.at(i, j);
      if (i == j)
        d[k] = 0;
      else if (t.bandwidth[k] > 0.0 && t.hops[k] >= 1)
        d[k] = t.hops[k];
    }
  for (int m = 0; m < n; ++m) {
    const int* row_m = d.data() + static_cast<std::size_t>(m) * n;
    for (int i = 0; i < n; ++i) {
      int* row_i = d.data() + static_cast<std::size_t>(i) * n;
      const int im = row_i[m];
      if (im >= kNoPath) continue;
      for (int j = 0; j < n; ++j) row_i[j] = std::min(row_i[j], im + row_m[j]);
    }
  }
  for (int& v : d)
    if (v >= kNoPath) v = -1;
  return d;
}

double cut_bandwidth(const Topology& t, const std::vector<char>& side) {
  double sum = 0.0;
  for (int i = 0; i < t.n; ++i) {
    if (side[static_cast<std::size_t>(i)] != 0) continue;
    for (int j = 0; j < t.n; ++j)
      if (side[static_cast<std::size_t>(j)] != 0) sum += std::max(0.0, t.bandwidth[t.at(i, j)]);
  }
  return sum;
}

// Every subset of floor(n/2) devices that holds device 0 (the complement
// covers the rest: for odd n, sides of both sizes are tried).
double bisection_exact(const Topology& t) {
  const int n = t.n;
  if (n < 2) return 0.0;
  double best = std::numeric_limits<double>::infinity();
  const int half = n / 2;
  std::vector<char> side(static_cast<std::size_t>(n));
  for (unsigned mask = 0; mask < (1u << n); ++mask) {
    if ((mask & 1u) == 0) continue;  // device 0 on side 0
    const int ones = __builtin_popcount(mask);
    if (ones != half && ones != n - half) continue;
    for (int i = 0; i < n; ++i) side[static_cast<std::size_t>(i)] = (mask >> i) & 1u ? 0 : 1;
    best = std::min(best, cut_bandwidth(t, side));
  }
  return best;
}

// Heuristic above kExactBisectionMax: start from two balanced splits (the
// devices in listed order, which keeps whole nodes together when nodes are
// listed in turn, and nodes dealt alternately to the sides by size), then
// improve each by Kernighan-Lin style greedy swaps of one device from each
// side while a swap lowers the cut. The result is an upper bound on the
// true minimum.
double bisection_heuristic(const Topology& t) {
  const int n = t.n;
  if (n < 2) return 0.0;
  auto w = [&](int i, int j) {
    // Undirected weight of a pair as the cut counts it from either side.
    return std::max(0.0, t.bandwidth[t.at(i, j)]) + std::max(0.0, t.bandwidth[t.at(j, i)]);
  };
  auto refine = [&](std::vector<char> side) {
    // gain[v]: external minus internal weight of v (Kernighan-Lin's D).
    auto own_gain = [&](int v) {
      double g = 0.0;
      for (int u = 0; u < n; ++u)
        if (u != v)
          g += side[static_cast<std::size_t>(u)] != side[static_cast<std::size_t>(v)] ? w(u, v)
                                                                                      : -w(u, v);
      return g;
    };
    std::vector<double> d(static_cast<std::size_t>(n), 0.0);
    for (int v = 0; v < n; ++v) d[static_cast<std::size_t>(v)] = own_gain(v);
    for (int step = 0; step < n; ++step) {
      double best_gain = 1e-9;
      int ba = -1, bb = -1;
      for (int a = 0; a < n; ++a) {
        if (side[static_cast<std::size_t>(a)] != 0) continue;
        for (int b = 0; b < n; ++b) {
          if (side[static_cast<std::size_t>(b)] == 0) continue;
          const double g =
              d[static_cast<std::size_t>(a)] + d[static_cast<std::size_t>(b)] - 2 * w(a, b);
          if (g > best_gain) best_gain = g, ba = a, bb = b;
        }
      }
      if (ba < 0) break;
      side[static_cast<std::size_t>(ba)] = 1;
      side[static_cast<std::size_t>(bb)] = 0;
      for (int v = 0; v < n; ++v) {
        const auto uv = static_cast<std::size_t>(v);
        if (v == ba || v == bb) {
          d[uv] = own_gain(v);
          continue;
        }
        // ba moved 0 -> 1 and bb moved 1 -> 0: each became external to the
        // side it left and internal to the side it joined.
        const double s = side[uv] == 0 ? 1.0 : -1.0;
        d[uv] += s * 2 * w(v, ba) - s * 2 * w(v, bb);
      }
    }
    return cut_bandwidth(t, side);
  };
  const int half = n / 2;
  std::vector<char> by_order(static_cast<std::size_t>(n), 1);
  for (int i = 0; i < half; ++i) by_order[static_cast<std::size_t>(i)] = 0;
  double best = refine(by_order);
  // Whole nodes to side 0 until it holds half the devices.
  std::vector<char> by_node(static_cast<std::size_t>(n), 1);
  int filled = 0;
  for (int node = 0; node < t.num_nodes() && filled < half; ++node)
    for (int i = 0; i < n && filled < half; ++i)
      if (t.node_of[static_cast<std::size_t>(i)] == node)
        by_node[static_cast<std::size_t>(i)] = 0, ++filled;
  if (by_node != by_order) best = std::min(best, refine(by_node));
  return best;
}

Analysis analyze(const Topology& t) {
  Analysis a;
  a.multi_node = t.num_nodes() > 1;
  const auto d = shortest_hops(t);
  for (int v : d) {
    if (v < 0) {
      a.diameter = -1;
      break;
    }
    a.diameter = std::max(a.diameter, v);
  }
  a.bisection_exact = t.n <= kExactBisectionMax;
  a.bisection_gbps = a.bisection_exact ? bisection_exact(t) : bisection_heuristic(t);

  bool any = false;
  for (int i = 0; i < t.n; ++i)
    for (int j = 0; j < t.n; ++j) {
      if (i == j) continue;
      const double bw = t.bandwidth[t.at(i, j)];
      if (!any) a.min_bw = a.max_bw = bw, any = true;
      a.min_bw = std::min(a.min_bw, bw);
      a.max_bw = std::max(a.max_bw, bw);
    }

  // The strategy rule (docs/topology.md).
  if (!any) {
    a.strategy = "data_parallel";
    a.reason = "a single device: nothing to split";
  } else if (a.min_bw > 0.0 && a.max_bw <= kUniformRatio * a.min_bw) {
    a.strategy = "data_parallel";
    a.reason = fmt::format(
        "links are uniform ({:.4g}-{:.4g} GB/s, within {}x): gradients can be all-reduced "
        "across every device",
        a.min_bw, a.max_bw, kUniformRatio);
  } else if (a.min_bw < kSlowLinkGbps) {
    a.strategy = "pipeline_parallel";
    a.reason = fmt::format(
        "slowest links ({:.4g} GB/s) are below {} GB/s and {:.3g}x slower than the fastest "
        "({:.4g} GB/s): place pipeline stages so only activations cross them",
        a.min_bw, kSlowLinkGbps, a.min_bw > 0.0 ? a.max_bw / a.min_bw : 0.0, a.max_bw);
  } else {
    a.strategy = "hybrid";
    a.reason = fmt::format(
        "links differ by {:.3g}x ({:.4g}-{:.4g} GB/s){}: data or tensor parallel inside the "
        "fast groups, pipeline stages across the slower links",
        a.max_bw / a.min_bw, a.min_bw, a.max_bw, a.multi_node ? " between nodes" : "");
  }
  return a;
}

}  // namespace wia::topo
