// SPDX-License-Identifier: Apache-2.0
// Bisection: the heuristic never beats the exact minimum (it is an upper
// bound) and finds it on node-structured topologies.
#include "topology/analysis.hpp"

#include <doctest/doctest.h>

#include <random>

using namespace wia::topo;

namespace {

Topology make(int nodes, int per_node, double intra, double inter) {
  Topology t;
  for (int k = 0; k < nodes; ++k) t.node_names.push_back("n" + std::to_string(k));
  for (int k = 0; k < nodes * per_node; ++k) {
    t.device_names.push_back("d" + std::to_string(k));
    t.node_of.push_back(k / per_node);
  }
  t.resize(nodes * per_node);
  const int a = t.type_index("intra"), b = t.type_index("inter");
  for (int i = 0; i < t.n; ++i)
    for (int j = 0; j < t.n; ++j) {
      if (i == j) continue;
      const bool same =
          t.node_of[static_cast<std::size_t>(i)] == t.node_of[static_cast<std::size_t>(j)];
      const auto k = t.at(i, j);
      t.type[k] = same ? a : b;
      t.bandwidth[k] = same ? intra : inter;
      t.latency[k] = 1.0;
      t.hops[k] = same ? 1 : 2;
    }
  return t;
}

}  // namespace

TEST_CASE("heuristic bisection is an upper bound and exact on node structure") {
  std::mt19937 rng(42);
  std::uniform_real_distribution<double> bw(1.0, 100.0);
  for (int n = 2; n <= 12; ++n) {
    Topology t = make(1, n, 1.0, 1.0);
    for (int i = 0; i < n; ++i)
      for (int j = i + 1; j < n; ++j) t.bandwidth[t.at(i, j)] = t.bandwidth[t.at(j, i)] = bw(rng);
    const double exact = bisection_exact(t);
    CHECK(bisection_heuristic(t) >= exact - 1e-9);
  }
  const Topology nodes = make(4, 4, 300.0, 25.0);
  CHECK(bisection_exact(nodes) == doctest::Approx(64 * 25.0));
  CHECK(bisection_heuristic(nodes) == doctest::Approx(64 * 25.0));
}

TEST_CASE("diameter follows shortest paths, not direct links") {
  Topology t = make(1, 3, 10.0, 10.0);
  t.hops[t.at(0, 2)] = t.hops[t.at(2, 0)] = 5;  // 0 -> 1 -> 2 is 2 hops
  CHECK(analyze(t).diameter == 2);
  t.bandwidth[t.at(0, 1)] = t.bandwidth[t.at(1, 0)] = 0.0;  // no direct link 0-1
  t.bandwidth[t.at(0, 2)] = t.bandwidth[t.at(2, 0)] = 0.0;
  CHECK(analyze(t).diameter == -1);  // 0 unreachable
}
