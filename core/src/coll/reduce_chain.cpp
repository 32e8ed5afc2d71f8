// SPDX-License-Identifier: Apache-2.0
// Pipelined chain reduce: root+p-1 -> ... -> root+1 -> root, each rank
// adding its contribution to each chunk as it passes. Like the chain
// broadcast, every link carries the vector once, so for large vectors the
// time approaches n beta (plus the reduction) independently of p.
// Non-roots accumulate in scratch, never in user memory.
#include "coll/algorithms.hpp"

namespace wia::coll {

Schedule build_reduce_chain(const CollArgs& args, std::int32_t only_rank) {
  ScheduleBuilder sb(args, Algorithm::kChain, only_rank);
  const std::int32_t p = args.nranks;
  const std::uint64_t n = args.count;
  const std::uint32_t k = effective_chunks(args.options.num_chunks, n);
  sb.set_num_chunks(k);
  const std::uint32_t div = sb.final_divisor();
  for (std::int32_t r = 0; r < p; ++r) {
    if (!sb.wants(r)) continue;
    RankBuilder& rb = sb.rank(r);
    const Region in = sb.in_place() ? recv_buf(0) : send_buf(0);
    const std::int32_t vr = mod(r - args.root, p);
    const std::int32_t from = mod(r + 1, p);  // vr + 1
    const std::int32_t to = mod(r - 1, p);    // vr - 1
    for (std::uint32_t c = 0; c < k; ++c) {
      const std::uint64_t off = block_offset(n, k, c);
      const std::uint64_t len = block_size(n, k, c);
      if (p == 1) {
        if (!sb.in_place()) rb.copy(offset_by(in, off), recv_buf(off), len);
      } else if (vr == p - 1) {
        rb.send(to, c, offset_by(in, off), len);
      } else if (vr > 0) {
        rb.recv_reduce(from, c, offset_by(in, off), scratch_buf(off), len, 0);
        rb.send(to, c, scratch_buf(off), len);
      } else {
        rb.recv_reduce(from, c, offset_by(in, off), recv_buf(off), len, div);
      }
    }
  }
  return sb.finish();
}

}  // namespace wia::coll
