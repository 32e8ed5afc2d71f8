// SPDX-License-Identifier: Apache-2.0
// Embedding a schedule built for a sub-communicator into a larger schedule:
// the building block of hierarchical collectives, which run an existing
// algorithm among a subset of the ranks (the members of a node, the node
// leaders) as one phase of a bigger schedule.
//
// The sub-schedule is built by the registry for `nsub` ranks as usual; its
// program for sub-rank s is then appended to the RankBuilder of rank
// rank_map[s] with peers mapped through rank_map, tags shifted into a range
// of their own, and buffers placed where the caller says. Steps go through
// RankBuilder::emit, so besides the sub-program's own dependencies (kept,
// remapped) every step also gets the region hazards against what the
// enclosing rank did before (an earlier phase writing the buffer this phase
// reads, ...): phases chain correctly element by element, and pipeline
// where their regions allow it, without the caller listing dependencies.
// `after` adds ordering-only dependencies on top.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "coll/builder.hpp"
#include "coll/schedule.hpp"

namespace wia::coll {

struct SubEmbedding {
  // rank_map[s] = rank of the enclosing schedule that plays sub-rank s
  // (distinct ranks; size = the sub-schedule's nranks).
  std::span<const std::int32_t> rank_map;
  // Added to every tag. With tag_span > 0 every tag of the sub-schedule
  // must be < tag_span (checked): give each phase [tag_offset,
  // tag_offset + tag_span) of its own and (src, dst, tag) stays unique.
  std::uint32_t tag_offset = 0;
  std::uint32_t tag_span = 0;
  // Where the sub-schedule's buffers land: a sub region (kind, shard, off)
  // becomes (to.kind, to.shard, to.offset + off) for to = send/recv/scratch
  // below. Shard buffers keep their kind; sub shard j becomes shard
  // rank_map[j] (shards are indexed by peer).
  Region send = send_buf(0);
  Region recv = recv_buf(0);
  Region scratch = scratch_buf(0);
  // When set, every dividing step (divisor > 1) divides by `divisor`
  // instead (0 = not at all): a sub-communicator of q ranks divides AVG by
  // q, the enclosing collective by its own rank count, or not in this phase.
  bool replace_divisor = false;
  std::uint32_t divisor = 0;
  // Extra dependencies (indices in the enclosing rank's program) of the
  // sub-program's steps that have none of their own.
  std::span<const std::uint32_t> after;
};

// Appends the program of `sub_rank` in `sub` to `rb`, which must be the
// builder of rank rank_map[sub_rank]. Returns the indices the steps got in
// rb's program, in order. Throws wia::Error(WIA_ERROR_INTERNAL) on a
// mismatch (unbuilt sub-rank, wrong builder, rank_map size, a tag outside
// the span, a peer outside the enclosing communicator).
std::vector<std::uint32_t> embed_program(RankBuilder& rb, const Schedule& sub,
                                         std::int32_t sub_rank, const SubEmbedding& e);

// 1 + the largest tag any built program of `s` uses (0 without messages).
std::uint32_t tag_extent(const Schedule& s);

}  // namespace wia::coll
