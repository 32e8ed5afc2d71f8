// SPDX-License-Identifier: Apache-2.0
#include "coll/registry.hpp"

#include <algorithm>
#include <string>

#include "common/error.hpp"
#include "kernels/cpu_reduce.hpp"

namespace wia::coll {

namespace {
using C = Collective;
using A = Algorithm;

constexpr AlgorithmInfo kAlgorithms[] = {
    {C::kAllReduce, A::kRing, "ring", "ring reduce-scatter + ring all-gather, chunk-pipelined",
     build_allreduce_ring, true, true},
    {C::kAllReduce, A::kTree, "tree", "pipelined binary tree: reduce up, broadcast down",
     build_allreduce_tree, true, true},
    {C::kAllReduce, A::kBinomial, "binomial", "binomial reduce to rank 0 + binomial broadcast",
     build_allreduce_binomial, true, true},
    {C::kAllReduce, A::kRabenseifner, "rabenseifner",
     "recursive halving + recursive doubling, non-power-of-two fold", build_allreduce_rabenseifner,
     false, true},
    {C::kAllReduce, A::kRecursiveDoubling, "recursive_doubling",
     "log2(p) full-vector exchanges, non-power-of-two fold", build_allreduce_recursive_doubling,
     false, true},
    {C::kAllReduce, A::kDirect, "direct",
     "every rank reduces its own block from all peers, then sends it to all peers",
     build_allreduce_direct, true, true},
    {C::kAllReduce, A::kHierarchical, "hierarchical",
     "reduce inside each node, all-reduce among node leaders, broadcast inside each node",
     build_allreduce_hierarchical, true, true},
    {C::kAllReduce, A::kOneShot, "one_shot",
     "every rank sends its whole vector to all peers and reduces them all, one round",
     build_allreduce_one_shot, false, true},
    {C::kBroadcast, A::kBinomial, "binomial", "binomial tree, chunk-pipelined",
     build_broadcast_binomial, true, true},
    {C::kBroadcast, A::kChain, "chain", "pipelined chain from the root", build_broadcast_chain,
     true, true},
    {C::kBroadcast, A::kScatterAllGather, "scatter_allgather",
     "binomial scatter + ring all-gather (van de Geijn)", build_broadcast_scatter_allgather, false,
     true},
    {C::kReduce, A::kBinomial, "binomial", "binomial tree, chunk-pipelined", build_reduce_binomial,
     true, true},
    {C::kReduce, A::kChain, "chain", "pipelined chain to the root", build_reduce_chain, true, true},
    {C::kAllGather, A::kRing, "ring", "ring, chunk-pipelined", build_allgather_ring, true, true},
    {C::kAllGather, A::kRecursiveDoubling, "recursive_doubling",
     "recursive doubling (power-of-two p), Bruck otherwise", build_allgather_recursive_doubling,
     false, true},
    {C::kAllGather, A::kBruck, "bruck", "Bruck dissemination, any p, no scratch",
     build_allgather_bruck, false, true},
    {C::kReduceScatter, A::kRing, "ring", "ring, chunk-pipelined", build_reduce_scatter_ring, true,
     true},
    {C::kReduceScatter, A::kRecursiveHalving, "recursive_halving",
     "recursive halving, non-power-of-two fold", build_reduce_scatter_recursive_halving, false,
     true},
    {C::kAllToAll, A::kDirect, "direct", "all exchanges posted at once", build_alltoall_direct,
     false, true},
    {C::kAllToAll, A::kPairwise, "pairwise", "one exchange per round, p-1 rounds",
     build_alltoall_pairwise, false, true},
    {C::kSendRecv, A::kDirect, "direct", "send to r+offset, receive from r-offset", build_sendrecv,
     false, true},
};
}  // namespace

std::span<const AlgorithmInfo> algorithms() noexcept { return kAlgorithms; }

std::vector<const AlgorithmInfo*> algorithms_for(Collective c) {
  std::vector<const AlgorithmInfo*> out;
  for (const auto& a : kAlgorithms)
    if (a.collective == c) out.push_back(&a);
  return out;
}

const AlgorithmInfo* find_algorithm(Collective c, Algorithm a) noexcept {
  for (const auto& info : kAlgorithms)
    if (info.collective == c && info.algorithm == a) return &info;
  return nullptr;
}

const AlgorithmInfo* find_algorithm(Collective c, std::string_view name) noexcept {
  for (const auto& info : kAlgorithms)
    if (info.collective == c && name == info.name) return &info;
  return nullptr;
}

bool tuner_candidate(const AlgorithmInfo& info, const CollArgs& args) noexcept {
  if (info.algorithm == Algorithm::kHierarchical) return is_hierarchical(args.options.groups.get());
  // One-shot issues p-1 messages per rank; the cost model's links carry
  // them concurrently, but each still costs its sender time to issue,
  // which the model does not count: past a few ranks log2(p) rounds win.
  if (info.algorithm == Algorithm::kOneShot) return args.nranks <= kOneShotMaxRanks;
  return true;
}

std::uint32_t default_chunks(Collective c, Algorithm a, std::uint64_t bytes, std::int32_t nranks) {
  (void)nranks;
  const AlgorithmInfo* info = find_algorithm(c, a);
  if (info == nullptr || !info->pipelined) return 1;
  // Rings are pipelined across blocks already; more chunks only add
  // latency terms unless the reduction is slow (the tuner can ask).
  if (a == Algorithm::kRing) return 1;
  constexpr std::uint64_t kChunkBytes = 128 * 1024;
  return static_cast<std::uint32_t>(std::clamp<std::uint64_t>(bytes / kChunkBytes, 1, 64));
}

Algorithm heuristic_algorithm(Collective c, std::uint64_t bytes, std::int32_t nranks) {
  switch (c) {
    case Collective::kAllReduce:
      if (bytes < 16 * 1024) return Algorithm::kRecursiveDoubling;
      if (bytes < 64 * 1024) return Algorithm::kTree;
      return Algorithm::kRing;
    case Collective::kBroadcast:
      if (bytes < 64 * 1024 || nranks < 4) return Algorithm::kBinomial;
      return Algorithm::kScatterAllGather;
    case Collective::kReduce:
      return bytes < 64 * 1024 ? Algorithm::kBinomial : Algorithm::kChain;
    case Collective::kAllGather:
      return bytes < 64 * 1024 ? Algorithm::kRecursiveDoubling : Algorithm::kRing;
    case Collective::kReduceScatter:
      return bytes < 64 * 1024 ? Algorithm::kRecursiveHalving : Algorithm::kRing;
    case Collective::kAllToAll:
      return nranks > 16 ? Algorithm::kPairwise : Algorithm::kDirect;
    case Collective::kSendRecv:
      return Algorithm::kDirect;
  }
  return Algorithm::kRing;
}

Schedule build_schedule(const CollArgs& in_args, std::int32_t only_rank) {
  validate_args(in_args);
  // The op of a non-reducing collective is meaningless (and may be any
  // value a C caller left there): normalise it while copying. CollArgs is
  // not trivially copyable (Options holds a shared_ptr), so a plain copy
  // would load that out-of-range value as the enum type, which is
  // undefined: copy field by field instead (keep in step with CollArgs).
  CollArgs args;
  args.collective = in_args.collective;
  args.algorithm = in_args.algorithm;
  if (is_reducing(in_args.collective)) args.op = in_args.op;
  args.dtype = in_args.dtype;
  args.count = in_args.count;
  args.nranks = in_args.nranks;
  args.root = in_args.root;
  args.options = in_args.options;
  if (only_rank != kAllRanks && (only_rank < 0 || only_rank >= args.nranks))
    throw Error(WIA_ERROR_INVALID_ARGUMENT, std::string(collective_name(args.collective)) +
                                                ": rank " + std::to_string(only_rank) +
                                                " to build is out of range [0, " +
                                                std::to_string(args.nranks) + ")");
  const std::uint64_t bytes = args.count * kernels::dtype_size(args.dtype);
  if (args.algorithm == Algorithm::kAuto)
    args.algorithm = heuristic_algorithm(args.collective, bytes, args.nranks);
  const AlgorithmInfo* info = find_algorithm(args.collective, args.algorithm);
  if (info == nullptr)
    throw Error(WIA_ERROR_INVALID_ARGUMENT,
                std::string(collective_name(args.collective)) + ": algorithm " +
                    std::to_string(static_cast<int>(args.algorithm)) + " (" +
                    algorithm_name(args.algorithm) + ") is not available for this collective");
  if (args.options.num_chunks == 0)
    args.options.num_chunks = default_chunks(args.collective, args.algorithm, bytes, args.nranks);
  // Tags are step * chunks + chunk over at most 2p steps: keep them in 31 bits.
  const std::uint64_t max_chunks = std::max<std::uint64_t>(
      1, (std::uint64_t{1} << 30) / (2 * static_cast<std::uint64_t>(args.nranks)));
  args.options.num_chunks =
      static_cast<std::uint32_t>(std::min<std::uint64_t>(args.options.num_chunks, max_chunks));
  return info->build(args, only_rank);
}

}  // namespace wia::coll
