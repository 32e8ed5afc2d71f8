// SPDX-License-Identifier: Apache-2.0
// Entry points of the algorithm files (one builder per file) and the phases
// some of them share. Internal to core/coll: users go through registry.hpp.
//
// Every build_* function takes validated arguments whose
// options.num_chunks has been resolved (>= 1) and builds every rank, or
// only `only_rank` (so a process of a large communicator, or the cost
// model, materialises just the program it needs).
#pragma once

#include <cstdint>
#include <span>

#include "coll/builder.hpp"
#include "coll/schedule.hpp"

namespace wia::coll {

using BuildFn = Schedule (*)(const CollArgs& args, std::int32_t only_rank);

Schedule build_allreduce_ring(const CollArgs& args, std::int32_t only_rank);
Schedule build_allreduce_tree(const CollArgs& args, std::int32_t only_rank);
Schedule build_allreduce_binomial(const CollArgs& args, std::int32_t only_rank);
Schedule build_allreduce_rabenseifner(const CollArgs& args, std::int32_t only_rank);
Schedule build_allreduce_recursive_doubling(const CollArgs& args, std::int32_t only_rank);
Schedule build_allreduce_direct(const CollArgs& args, std::int32_t only_rank);
Schedule build_allreduce_hierarchical(const CollArgs& args, std::int32_t only_rank);
Schedule build_allreduce_one_shot(const CollArgs& args, std::int32_t only_rank);
Schedule build_broadcast_binomial(const CollArgs& args, std::int32_t only_rank);
Schedule build_broadcast_chain(const CollArgs& args, std::int32_t only_rank);
Schedule build_broadcast_scatter_allgather(const CollArgs& args, std::int32_t only_rank);
Schedule build_reduce_binomial(const CollArgs& args, std::int32_t only_rank);
Schedule build_reduce_chain(const CollArgs& args, std::int32_t only_rank);
Schedule build_allgather_ring(const CollArgs& args, std::int32_t only_rank);
Schedule build_allgather_recursive_doubling(const CollArgs& args, std::int32_t only_rank);
Schedule build_allgather_bruck(const CollArgs& args, std::int32_t only_rank);
Schedule build_reduce_scatter_ring(const CollArgs& args, std::int32_t only_rank);
Schedule build_reduce_scatter_recursive_halving(const CollArgs& args, std::int32_t only_rank);
Schedule build_alltoall_direct(const CollArgs& args, std::int32_t only_rank);
Schedule build_alltoall_pairwise(const CollArgs& args, std::int32_t only_rank);
Schedule build_sendrecv(const CollArgs& args, std::int32_t only_rank);

// ---- shared phases --------------------------------------------------------

// Binomial-tree reduction of `count` elements to `root` (relative ranks
// vr = (r - root) mod p; vr receives from vr + 2^i for every 2^i below its
// lowest set bit, then sends to vr - lowbit(vr)), pipelined in `chunks`.
// Inner ranks accumulate in `accum`; the root writes the result to
// `output` and applies `divisor` on its last reduction. With no children
// the root copies input to output (unless they are the same region).
struct BinomialReduce {
  std::int32_t nranks = 1;
  std::int32_t root = 0;
  std::uint64_t count = 0;
  std::uint32_t chunks = 1;
  Region input;
  Region accum;   // non-roots with children: count elements
  Region output;  // root only
  std::uint32_t divisor = 0;
  std::uint32_t tag_base = 0;  // uses [tag_base, tag_base + chunks)
};
void emit_binomial_reduce(RankBuilder& rb, const BinomialReduce& a);

// Binomial-tree broadcast of `count` elements from `root`, largest subtree
// first, pipelined in `chunks`. The root sends from `source` (and copies it
// to `output` when they differ); the others receive into `output` and
// forward from there.
struct BinomialBroadcast {
  std::int32_t nranks = 1;
  std::int32_t root = 0;
  std::uint64_t count = 0;
  std::uint32_t chunks = 1;
  Region source;  // root only
  Region output;
  std::uint32_t tag_base = 0;  // uses [tag_base, tag_base + chunks)
};
void emit_binomial_broadcast(RankBuilder& rb, const BinomialBroadcast& a);

// Non-power-of-two fold used by the recursive algorithms (MPICH's scheme):
// with q = pow2_floor(p) and rem = p - q, the first 2*rem ranks pair up
// (even r hands its data to r + 1) and the odd one of each pair takes part
// as virtual rank r / 2; ranks >= 2*rem take part as r - rem.
struct Fold {
  std::int32_t q = 1;
  std::int32_t rem = 0;
  explicit Fold(std::int32_t p) : q(pow2_floor(p)), rem(p - pow2_floor(p)) {}
  // -1 for an even rank folded away.
  std::int32_t vrank(std::int32_t r) const {
    if (r < 2 * rem) return (r % 2) ? r / 2 : -1;
    return r - rem;
  }
  std::int32_t real(std::int32_t v) const { return v < rem ? 2 * v + 1 : v + rem; }
};

// Recursive-halving reduce-scatter among q = 2^k participants (this rank is
// virtual rank `vrank`, real ranks from `fold`). Blocks are element ranges
// [bounds[i], bounds[i+1]); rank v ends up owning block v. Distance halves
// (q/2 first) so that block order equals rank order. Element e of the
// vector is at input.offset + e before the first step and at
// work.offset + e afterwards; the owned block's result is written at
// final_block (+ e - bounds[vrank]) with `divisor`.
struct RecursiveHalving {
  Fold fold{1};
  std::int32_t vrank = 0;
  std::span<const std::uint64_t> bounds;  // q + 1 entries
  Region input;
  Region work;
  Region final_block;
  std::uint32_t divisor = 0;
  std::uint32_t tag_base = 0;  // uses [tag_base, tag_base + log2 q)
};
void emit_recursive_halving(RankBuilder& rb, const RecursiveHalving& a);

// Recursive-doubling all-gather among q = 2^k participants: rank v starts
// owning block v of `buf` (element e at buf.offset + e) and after log2 q
// exchanges (distance 1 first) owns every block. `own_src`, when set, is
// where block v is read from for the first exchange (so out-of-place
// all-gather need not wait for its local copy).
struct RecursiveDoubling {
  Fold fold{1};
  std::int32_t vrank = 0;
  std::span<const std::uint64_t> bounds;  // q + 1 entries
  Region buf;
  Region own_src;              // kind kNone = read from buf
  std::uint32_t tag_base = 0;  // uses [tag_base, tag_base + log2 q)
};
void emit_recursive_doubling_gather(RankBuilder& rb, const RecursiveDoubling& a);

}  // namespace wia::coll
