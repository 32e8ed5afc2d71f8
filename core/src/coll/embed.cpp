// SPDX-License-Identifier: Apache-2.0
#include "coll/embed.hpp"

#include <algorithm>
#include <limits>
#include <string>

#include "common/error.hpp"

namespace wia::coll {

namespace {
[[noreturn]] void embed_bug(const Schedule& sub, std::int32_t sub_rank, const std::string& what) {
  throw Error(WIA_ERROR_INTERNAL, "embedding sub-rank " + std::to_string(sub_rank) + " of " +
                                      sub.describe() + ": " + what);
}
}  // namespace

std::vector<std::uint32_t> embed_program(RankBuilder& rb, const Schedule& sub,
                                         std::int32_t sub_rank, const SubEmbedding& e) {
  if (e.rank_map.size() != static_cast<std::size_t>(sub.nranks))
    embed_bug(sub, sub_rank,
              "rank map has " + std::to_string(e.rank_map.size()) + " entries for " +
                  std::to_string(sub.nranks) + " sub-ranks");
  if (sub_rank < 0 || sub_rank >= sub.nranks ||
      !sub.programs[static_cast<std::size_t>(sub_rank)].built)
    embed_bug(sub, sub_rank, "sub-rank was not built");
  if (rb.rank() != e.rank_map[static_cast<std::size_t>(sub_rank)])
    embed_bug(sub, sub_rank,
              "builder is rank " + std::to_string(rb.rank()) + ", rank map says " +
                  std::to_string(e.rank_map[static_cast<std::size_t>(sub_rank)]));

  auto place = [&](Region r) -> Region {
    switch (r.kind) {
      case BufferKind::kUserSend:
        return offset_by(e.send, r.offset);
      case BufferKind::kUserRecv:
        return offset_by(e.recv, r.offset);
      case BufferKind::kScratch:
        return offset_by(e.scratch, r.offset);
      case BufferKind::kSendShard:
      case BufferKind::kRecvShard:
        if (r.shard >= e.rank_map.size())
          embed_bug(sub, sub_rank, "shard " + std::to_string(r.shard) + " out of range");
        r.shard = static_cast<std::uint32_t>(e.rank_map[r.shard]);
        return r;
      case BufferKind::kNone:
        break;
    }
    return r;
  };

  const RankProgram& prog = sub.programs[static_cast<std::size_t>(sub_rank)];
  std::vector<std::uint32_t> placed;
  placed.reserve(prog.steps.size());
  std::vector<std::uint32_t> deps;
  for (const Step& in : prog.steps) {
    Step st = in;
    if (st.is_send() || st.is_recv()) {
      if (st.peer < 0 || st.peer >= sub.nranks)
        embed_bug(sub, sub_rank, "peer " + std::to_string(st.peer) + " out of range");
      st.peer = e.rank_map[static_cast<std::size_t>(st.peer)];
      if (e.tag_span > 0 && st.tag >= e.tag_span)
        embed_bug(sub, sub_rank,
                  "tag " + std::to_string(st.tag) + " outside the phase's span " +
                      std::to_string(e.tag_span));
      if (st.tag > std::numeric_limits<std::uint32_t>::max() - e.tag_offset)
        embed_bug(sub, sub_rank, "tag " + std::to_string(st.tag) + " + offset overflows");
      st.tag += e.tag_offset;
    }
    if (st.reads_src()) st.src = place(st.src);
    if (st.writes_dst()) st.dst = place(st.dst);
    if (e.replace_divisor && st.divisor > 1) st.divisor = e.divisor;
    deps.clear();
    for (std::uint32_t d = 0; d < in.dep_count; ++d) deps.push_back(placed[prog.deps_of(in)[d]]);
    if (in.dep_count == 0) deps.insert(deps.end(), e.after.begin(), e.after.end());
    std::erase(deps, kNoStep);
    const std::uint32_t index = rb.emit(st, deps);
    if (index == kNoStep) embed_bug(sub, sub_rank, "a step with no elements");
    placed.push_back(index);
  }
  return placed;
}

std::uint32_t tag_extent(const Schedule& s) {
  std::uint32_t extent = 0;
  for (const RankProgram& prog : s.programs)
    for (const Step& st : prog.steps)
      if (st.is_send() || st.is_recv()) extent = std::max(extent, st.tag + 1);
  return extent;
}

}  // namespace wia::coll
