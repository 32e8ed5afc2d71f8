// SPDX-License-Identifier: Apache-2.0
// Direct all-reduce: every rank owns one block; it receives that block of
// every other rank's input and reduces them (a direct reduce-scatter), then
// sends its reduced block to every other rank (a direct all-gather). Two
// communication rounds whatever the rank count, p-1 messages per rank per
// round: latency 2 alpha with p-1 concurrent partners, and the same
// 2(p-1)/p n bytes per rank as the ring.
//
// It suits a fully connected fabric where a rank can talk to all peers at
// once, above all ranks sharing one memory: there the engine fuses the
// chain of receive-reduces of a block into one n-ary reduction, which
// reads each input block once and writes the result once.
//
// Rank r's reduce-scatter receives go round the peers starting at r+1, so
// at any moment the ranks read different peers' blocks.
#include "coll/algorithms.hpp"

namespace wia::coll {

Schedule build_allreduce_direct(const CollArgs& args, std::int32_t only_rank) {
  ScheduleBuilder sb(args, Algorithm::kDirect, only_rank);
  const std::int32_t p = args.nranks;
  const std::uint64_t n = args.count;
  sb.set_num_chunks(1);
  const std::uint32_t div = sb.final_divisor();
  constexpr std::uint32_t kScatterTag = 0;
  constexpr std::uint32_t kGatherTag = 1;

  for (std::int32_t r = 0; r < p; ++r) {
    if (!sb.wants(r)) continue;
    RankBuilder& rb = sb.rank(r);
    const Region in = sb.in_place() ? recv_buf(0) : send_buf(0);
    if (p == 1) {
      if (!sb.in_place()) rb.copy(in, recv_buf(0), n);
      continue;
    }
    const std::uint64_t mine_off = block_offset(n, p, r);
    const std::uint64_t mine_len = block_size(n, p, r);
    // Reduce-scatter: offer block q of the input to its owner q ...
    for (std::int32_t s = 1; s < p; ++s) {
      const std::int32_t q = mod(r + s, p);
      rb.send(q, kScatterTag, offset_by(in, block_offset(n, p, q)), block_size(n, p, q));
    }
    // ... and reduce block r of every peer's input into recv block r.
    for (std::int32_t s = 1; s < p; ++s) {
      const std::int32_t q = mod(r - s, p);
      const Region local = s == 1 ? offset_by(in, mine_off) : recv_buf(mine_off);
      rb.recv_reduce(q, kScatterTag, local, recv_buf(mine_off), mine_len, s + 1 == p ? div : 0);
    }
    // All-gather: the reduced block r to everyone, everyone's block to us.
    for (std::int32_t s = 1; s < p; ++s)
      rb.send(mod(r + s, p), kGatherTag, recv_buf(mine_off), mine_len);
    for (std::int32_t s = 1; s < p; ++s) {
      const std::int32_t q = mod(r - s, p);
      rb.recv(q, kGatherTag, recv_buf(block_offset(n, p, q)), block_size(n, p, q));
    }
  }
  return sb.finish();
}

}  // namespace wia::coll
