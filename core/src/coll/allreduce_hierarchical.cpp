// SPDX-License-Identifier: Apache-2.0
// Hierarchical all-reduce (spec 6.6.1) over a rank grouping (Options::
// groups, typically ranks -> node):
//   1. reduce inside each group to its leader (the group's lowest rank),
//   2. all-reduce among the leaders,
//   3. broadcast inside each group from its leader.
// Only the leaders' traffic crosses groups: with all ranks of a node behind
// one NIC, a flat algorithm pushes ~2n (ring) to ~p_node * n bytes
// (Rabenseifner's first exchanges) through each node's NIC per direction,
// this one 2 (L-1)/L n with L nodes. The price is two intra-group phases
// (~2 n beta_intra, pipelined) and leaders doing all the inter-node work.
//
// Each phase is an existing algorithm built by the registry for the
// sub-communicator (the group's members, the leaders) and embedded with
// embed_program: phase 1 a chain reduce (binomial below 64 KiB), phase 2
// recursive doubling below 16 KiB, else Rabenseifner for a power-of-two
// number of leaders and the ring otherwise, phase 3 a chain (binomial)
// broadcast. Options::num_chunks is the pipeline depth of phases 1 and 3.
// Phases chain by region hazards, so a leader starts phase 2 on a block as
// soon as phase 1 has reduced it, and phase 3 forwards elements as phase 2
// finalises them. Tags: phase 1 [0, k), phase 3 [k, 2k), phase 2 from 2k;
// phase 2 never shares a (src, dst) pair with the others anyway (one
// leader per group).
//
// AVG: phase 1 does not divide, phase 2 divides by nranks on the one step
// that finalises each element; with a single group there is no phase 2 and
// phase 1's final reduction divides instead.
//
// Degenerate groupings still give a correct all-reduce: no grouping (or
// every rank alone) is the leader algorithm over all ranks, one group is a
// reduce + broadcast. The tuner only considers this algorithm when the
// grouping has two groups or more and one of them two ranks or more
// (is_hierarchical).
#include <algorithm>
#include <numeric>
#include <span>
#include <vector>

#include "coll/algorithms.hpp"
#include "coll/embed.hpp"
#include "coll/registry.hpp"
#include "kernels/cpu_reduce.hpp"

namespace wia::coll {

namespace {
constexpr std::uint64_t kIntraTreeBelowBytes = 64 * 1024;
constexpr std::uint64_t kLeaderLatencyBelowBytes = 16 * 1024;

Algorithm leader_algorithm(std::uint64_t bytes, std::int32_t leaders) {
  if (bytes < kLeaderLatencyBelowBytes) return Algorithm::kRecursiveDoubling;
  return is_pow2(leaders) ? Algorithm::kRabenseifner : Algorithm::kRing;
}
}  // namespace

Schedule build_allreduce_hierarchical(const CollArgs& args, std::int32_t only_rank) {
  ScheduleBuilder sb(args, Algorithm::kHierarchical, only_rank);
  const std::int32_t p = args.nranks;
  const std::uint64_t n = args.count;
  std::shared_ptr<const RankGroups> groups = args.options.groups;
  if (!groups) {
    std::vector<std::int32_t> alone(static_cast<std::size_t>(p));
    std::iota(alone.begin(), alone.end(), 0);
    groups = std::make_shared<const RankGroups>(std::move(alone));
  }
  const std::int32_t ngroups = groups->ngroups();
  const std::uint64_t bytes = n * kernels::dtype_size(args.dtype);
  const std::uint32_t k = effective_chunks(args.options.num_chunks, n);
  sb.set_num_chunks(k);
  const Algorithm intra = bytes < kIntraTreeBelowBytes ? Algorithm::kBinomial : Algorithm::kChain;

  // A sub-communicator's schedule: built for all its ranks when the whole
  // schedule is wanted (once per group, shared by its members), else only
  // for the sub-rank `only_rank` plays.
  auto sub_schedule = [&](Collective c, Algorithm a, std::int32_t nsub, bool in_place,
                          std::uint32_t chunks, std::int32_t sub_only) {
    CollArgs sub = args;
    sub.collective = c;
    sub.algorithm = a;
    sub.nranks = nsub;
    sub.root = 0;
    sub.options.in_place = in_place;
    sub.options.num_chunks = chunks;
    sub.options.groups = nullptr;
    return build_schedule(sub, sub_only);
  };
  // Runs `fn(rank, sub_rank)` for the wanted ranks of `members`, after
  // building the sub-schedule they need.
  auto for_wanted = [&](std::span<const std::int32_t> members, auto&& build, auto&& fn) {
    std::int32_t sub_only = kAllRanks;
    if (only_rank != kAllRanks) {
      auto it = std::find(members.begin(), members.end(), only_rank);
      if (it == members.end()) return;
      sub_only = static_cast<std::int32_t>(it - members.begin());
    }
    const Schedule sub = build(static_cast<std::int32_t>(members.size()), sub_only);
    for (std::size_t i = 0; i < members.size(); ++i)
      if (sb.wants(members[i])) fn(sb.rank(members[i]), sub, static_cast<std::int32_t>(i));
  };

  // Phase 1: reduce to each group's leader.
  for (std::int32_t g = 0; g < ngroups; ++g) {
    const auto members = groups->members(g);
    for_wanted(
        members,
        [&](std::int32_t nsub, std::int32_t sub_only) {
          return sub_schedule(Collective::kReduce, intra, nsub, sb.in_place(), k, sub_only);
        },
        [&](RankBuilder& rb, const Schedule& sub, std::int32_t i) {
          SubEmbedding e;
          e.rank_map = members;
          e.tag_offset = 0;
          e.tag_span = k;
          e.replace_divisor = true;
          e.divisor = ngroups == 1 ? sb.final_divisor() : 0;
          embed_program(rb, sub, i, e);
        });
  }
  // Phase 2: all-reduce among the leaders, in place in their recv.
  if (ngroups > 1) {
    std::vector<std::int32_t> leaders(static_cast<std::size_t>(ngroups));
    for (std::int32_t g = 0; g < ngroups; ++g)
      leaders[static_cast<std::size_t>(g)] = groups->leader(g);
    for_wanted(
        leaders,
        [&](std::int32_t nsub, std::int32_t sub_only) {
          return sub_schedule(Collective::kAllReduce, leader_algorithm(bytes, nsub), nsub, true, 0,
                              sub_only);
        },
        [&](RankBuilder& rb, const Schedule& sub, std::int32_t i) {
          SubEmbedding e;
          e.rank_map = leaders;
          e.tag_offset = 2 * k;
          e.replace_divisor = true;
          e.divisor = sb.final_divisor();
          embed_program(rb, sub, i, e);
        });
  }
  // Phase 3: broadcast from each leader, in place in recv.
  for (std::int32_t g = 0; g < ngroups; ++g) {
    const auto members = groups->members(g);
    if (members.size() < 2) continue;
    for_wanted(
        members,
        [&](std::int32_t nsub, std::int32_t sub_only) {
          return sub_schedule(Collective::kBroadcast, intra, nsub, true, k, sub_only);
        },
        [&](RankBuilder& rb, const Schedule& sub, std::int32_t i) {
          SubEmbedding e;
          e.rank_map = members;
          e.tag_offset = k;
          e.tag_span = k;
          embed_program(rb, sub, i, e);
        });
  }
  return sb.finish();
}

}  // namespace wia::coll
