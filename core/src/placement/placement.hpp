// SPDX-License-Identifier: Apache-2.0
// Placement of a model's parts onto the devices of a topology (spec 6.2.1;
// docs/placement.md).
//
// Objective: minimise sum over ordered part pairs (a, b) of
//   traffic[a][b] x cost(dev(a), dev(b)),
// cost(i, i) = 0, cost(i, j) = 1 / bandwidth(i, j) (BANDWIDTH_OPTIMAL:
// seconds per byte) or latency(i, j) for every pair that exchanges
// anything (LATENCY_OPTIMAL), subject to capacity: at most max_per_device
// parts and device_memory bytes of parts per device. With
// cross_node_first, placements compare first by the bytes that cross
// nodes, then by that cost (lexicographic).
//
// Search: exhaustive branch and bound while it stays under a node budget
// (exact), else greedy construction from two starts (sequential packing;
// heaviest-affinity growth) refined by best-improvement moves and swaps
// until none helps (a local optimum, not proven optimal).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "topology/topology.hpp"

namespace wia::place {

enum class Objective { kBandwidth, kLatency };

struct Problem {
  Objective objective = Objective::kBandwidth;
  int parts = 0;
  int devices = 0;
  std::vector<double> traffic;        // [parts * parts]
  std::vector<std::uint64_t> memory;  // [parts]
  std::vector<std::string> names;     // [parts], may be empty
  std::vector<double> link_cost;      // [devices * devices], diagonal 0
  std::vector<int> node_of;           // [devices]
  bool cross_node_first = false;
  int max_per_device = 1;
  std::uint64_t device_memory = 0;  // 0 = unlimited

  // From a topology: link cost by objective (a pair without bandwidth
  // costs kNoLink per byte, so it is used only when nothing else fits).
  static Problem from(const topo::Topology& t, Objective objective);
};

inline constexpr double kNoLink = 1e6;

struct Score {
  double cross_node_bytes = 0.0;
  double cost = 0.0;
};
// a better than b under the problem's ordering (with a relative epsilon).
bool better(const Problem& p, const Score& a, const Score& b);
Score evaluate(const Problem& p, const std::vector<int>& device_of);
// Empty when the assignment respects every capacity, else why not.
std::string violation(const Problem& p, const std::vector<int>& device_of);

struct Result {
  std::vector<int> device_of;
  Score score;
  bool optimal = false;
  std::string method;  // "exhaustive (N nodes)", "greedy + swaps (N improvements)"
};

enum class Method { kAuto, kExhaustive, kHeuristic, kSequential };
// Throws wia::Error(INVALID_ARGUMENT) when the parts cannot fit.
Result solve(const Problem& p, Method method = Method::kAuto);

// Branch-and-bound budget under kAuto (part-on-device evaluations, each
// O(parts)); beyond it the heuristic's answer stands, not proven optimal.
inline constexpr std::uint64_t kExhaustiveBudget = 2'000'000;

// A model file (YAML, docs/placement.md) for the tools: parts with memory
// and traffic. Throws wia::Error(WIA_ERROR_CONFIG) with file:line:col.
struct ModelFile {
  std::vector<std::string> names;
  std::vector<std::uint64_t> memory;
  std::vector<double> traffic;  // [parts * parts]
};
ModelFile load_model_yaml(const std::string& path);

}  // namespace wia::place
