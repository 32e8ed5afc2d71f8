// SPDX-License-Identifier: Apache-2.0
// Which algorithm runs a collective, in order of precedence:
//   1. the algorithm in the call's wia_collective_config_t (when not AUTO),
//   2. WIA_ALGO (NCCL_ALGO style: one name, or rules as below),
//   3. YAML collectives.algorithm rules "collective:algorithm[:MIN-MAX]",
//   4. the tuner's cost model over the candidate schedules.
// Every decision carries its reason, so it can be logged and shown.
#pragma once

#include <string>

#include "coll/schedule.hpp"
#include "tuner/cost_model.hpp"

namespace wia::comm {

struct AlgorithmChoice {
  coll::Algorithm algorithm = coll::Algorithm::kAuto;
  std::uint32_t num_chunks = 0;  // 0 = builder default
  double estimated_ms = 0;  // cost-model estimate (0 when not costed)
  std::string reason;       // "call config", "WIA_ALGO=ring", "rule #2 (file:line)", "cost model"
  bool by_cost_model = false;  // nothing asked for an algorithm
};

// `requested` is the call's algorithm (kAuto when not given). `selector`
// holds the communicator's link model and caches cost-model decisions; the
// caller serialises access to it.
AlgorithmChoice choose_algorithm(const coll::CollArgs& args, coll::Algorithm requested,
                                 tuner::Selector& selector);

// Link model of ranks in one process: a "link" is the receiving thread
// copying from the peer's memory, so alpha is the cross-thread hand-off
// and bandwidth that of a memory copy on this class of machine
// (docs/performance.md); local reductions run at the reduce-kernel rate.
tuner::LinkModel in_process_link_model(std::int32_t nranks);

// Parses one rule; throws wia::Error(WIA_ERROR_CONFIG) naming the rule and
// what is wrong (unknown collective or algorithm, bad size range).
struct AlgorithmRule {
  bool any_collective = false;
  coll::Collective collective = coll::Collective::kAllReduce;
  std::string algorithm_name;
  std::uint64_t min_bytes = 0;
  std::uint64_t max_bytes = UINT64_MAX;  // exclusive
};
AlgorithmRule parse_algorithm_rule(const std::string& text);

}  // namespace wia::comm
