// SPDX-License-Identifier: Apache-2.0
// Ring reduce-scatter: p-1 steps; at step s rank r sends its partial sum of
// block (r - s - 1) to r + 1 and receive-reduces block (r - s - 2) from
// r - 1, so that after the last step it holds block r fully reduced.
// (p-1)/p n beta, p-1 latency terms; blocks split into num_chunks pieces.
//
// Partial sums live in two scratch slots of one block each, alternating by
// step: the slot a step writes was last read by the send two steps back,
// which is the only ordering constraint the reuse adds.
#include "coll/algorithms.hpp"

namespace wia::coll {

Schedule build_reduce_scatter_ring(const CollArgs& args, std::int32_t only_rank) {
  ScheduleBuilder sb(args, Algorithm::kRing, only_rank);
  const std::int32_t p = args.nranks;
  const std::uint64_t c = args.count;
  const std::uint32_t k = effective_chunks(args.options.num_chunks, c);
  sb.set_num_chunks(k);
  sb.set_symmetry(Symmetry::kRotation);
  const std::uint32_t div = sb.final_divisor();
  for (std::int32_t r = 0; r < p; ++r) {
    if (!sb.wants(r)) continue;
    RankBuilder& rb = sb.rank(r);
    const Region in = sb.in_place() ? recv_buf(0) : send_buf(0);
    const Region out = sb.in_place() ? recv_buf(c * static_cast<std::uint64_t>(r)) : recv_buf(0);
    if (p == 1) {
      if (!sb.in_place()) rb.copy(in, out, c);
      continue;
    }
    auto slot = [&](std::int32_t s) { return scratch_buf(c * static_cast<std::uint64_t>(s % 2)); };
    const std::int32_t next = mod(r + 1, p);
    const std::int32_t prev = mod(r - 1, p);
    for (std::int32_t s = 0; s + 1 < p; ++s) {
      const std::uint64_t send_block = c * static_cast<std::uint64_t>(mod(r - s - 1, p));
      const std::uint64_t recv_block = c * static_cast<std::uint64_t>(mod(r - s - 2, p));
      const bool last = s + 2 == p;
      for (std::uint32_t ch = 0; ch < k; ++ch) {
        const std::uint32_t tag = static_cast<std::uint32_t>(s) * k + ch;
        const std::uint64_t off = block_offset(c, k, ch);
        const std::uint64_t len = block_size(c, k, ch);
        const Region src = s == 0 ? offset_by(in, send_block + off) : offset_by(slot(s - 1), off);
        rb.send(next, tag, src, len);
        const Region dst = last ? offset_by(out, off) : offset_by(slot(s), off);
        rb.recv_reduce(prev, tag, offset_by(in, recv_block + off), dst, len, last ? div : 0);
      }
    }
  }
  return sb.finish();
}

}  // namespace wia::coll
