// SPDX-License-Identifier: Apache-2.0
// Topology analysis (spec 6.2.1): diameter, bisection bandwidth, the
// recommended parallelism strategy and why. Rules in docs/topology.md.
#pragma once

#include <string>
#include <vector>

#include "topology/topology.hpp"

namespace wia::topo {

// Largest bisection computed exactly; above it the heuristic runs.
inline constexpr int kExactBisectionMax = 16;

struct Analysis {
  bool multi_node = false;
  int diameter = 0;  // -1 when some pair has no path
  double bisection_gbps = 0.0;
  bool bisection_exact = true;
  double min_bw = 0.0, max_bw = 0.0;
  const char* strategy = "data_parallel";
  std::string reason;
};

// All-pairs fewest hops (Floyd-Warshall; a pair with bandwidth <= 0 or
// hop_count < 1 is no direct link). -1 marks no path.
std::vector<int> shortest_hops(const Topology& t);
// Cut value of a split: sum of bandwidth[i][j], i in side 0, j in side 1.
double cut_bandwidth(const Topology& t, const std::vector<char>& side);
double bisection_exact(const Topology& t);
double bisection_heuristic(const Topology& t);
Analysis analyze(const Topology& t);

}  // namespace wia::topo
