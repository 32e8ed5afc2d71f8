// SPDX-License-Identifier: Apache-2.0
// The algorithm registry: which algorithms exist for which collective, their
// names, and the one entry point that validates arguments and builds a
// schedule. The tuner (core/tuner) enumerates candidates from here; the
// engine builds what the tuner (or the user) chose.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "coll/algorithms.hpp"
#include "coll/schedule.hpp"

namespace wia::coll {

struct AlgorithmInfo {
  Collective collective;
  Algorithm algorithm;
  const char* name;     // algorithm_name(algorithm)
  const char* summary;  // one line for wia-info / logs
  BuildFn build;
  bool pipelined;  // honours Options::num_chunks
  bool supports_in_place;
};

// Every (collective, algorithm) pair, grouped by collective.
std::span<const AlgorithmInfo> algorithms() noexcept;
std::vector<const AlgorithmInfo*> algorithms_for(Collective c);
const AlgorithmInfo* find_algorithm(Collective c, Algorithm a) noexcept;
// By name ("ring"), nullptr if the collective has no such algorithm.
const AlgorithmInfo* find_algorithm(Collective c, std::string_view name) noexcept;

// Whether the tuner should cost `info` for `args`. Every algorithm builds
// a correct schedule for any valid arguments, but some only pay off in
// some settings: kHierarchical needs a grouping (Options::groups) with two
// groups or more and one of two ranks or more (is_hierarchical); without
// one it degenerates to its leader algorithm over all ranks (no grouping,
// every rank alone) or to reduce + broadcast (one group), which an
// explicit request still gets.
// kOneShot is a candidate up to kOneShotMaxRanks ranks.
bool tuner_candidate(const AlgorithmInfo& info, const CollArgs& args) noexcept;
inline constexpr std::int32_t kOneShotMaxRanks = 8;

// Pipeline depth used when Options::num_chunks is 0: chunks of about
// 128 KiB for the pipelined tree/chain algorithms (capped at 64), one
// chunk otherwise. The tuner may try others.
std::uint32_t default_chunks(Collective c, Algorithm a, std::uint64_t bytes, std::int32_t nranks);

// A fixed size-based choice for Algorithm::kAuto when no tuner is at hand
// (the spec's example thresholds). The tuner's select_algorithm is the real
// policy.
Algorithm heuristic_algorithm(Collective c, std::uint64_t bytes, std::int32_t nranks);

// Validates `args` (throws wia::Error, WIA_ERROR_INVALID_ARGUMENT, naming
// the bad value), resolves kAuto and num_chunks, and builds the schedule
// for every rank or only for `only_rank`.
Schedule build_schedule(const CollArgs& args, std::int32_t only_rank = kAllRanks);

}  // namespace wia::coll
