// SPDX-License-Identifier: Apache-2.0
// Ring all-gather: p-1 steps, rank r forwarding at step s the block of rank
// r - s to r + 1. (p-1)/p n beta, (p-1) latency terms; each block split
// into num_chunks pieces that flow independently.
#include "coll/algorithms.hpp"

namespace wia::coll {

Schedule build_allgather_ring(const CollArgs& args, std::int32_t only_rank) {
  ScheduleBuilder sb(args, Algorithm::kRing, only_rank);
  const std::int32_t p = args.nranks;
  const std::uint64_t c = args.count;
  const std::uint32_t k = effective_chunks(args.options.num_chunks, c);
  sb.set_num_chunks(k);
  sb.set_symmetry(Symmetry::kRotation);
  for (std::int32_t r = 0; r < p; ++r) {
    if (!sb.wants(r)) continue;
    RankBuilder& rb = sb.rank(r);
    const std::uint64_t own = c * static_cast<std::uint64_t>(r);
    const Region in = sb.in_place() ? recv_buf(own) : send_buf(0);
    if (!sb.in_place()) rb.copy(in, recv_buf(own), c);
    const std::int32_t next = mod(r + 1, p);
    const std::int32_t prev = mod(r - 1, p);
    for (std::int32_t s = 0; s + 1 < p; ++s) {
      const std::uint64_t send_off = c * static_cast<std::uint64_t>(mod(r - s, p));
      const std::uint64_t recv_off = c * static_cast<std::uint64_t>(mod(r - s - 1, p));
      for (std::uint32_t ch = 0; ch < k; ++ch) {
        const std::uint32_t tag = static_cast<std::uint32_t>(s) * k + ch;
        const std::uint64_t off = block_offset(c, k, ch);
        const std::uint64_t len = block_size(c, k, ch);
        // Step 0 forwards the own block straight from the input.
        rb.send(next, tag, s == 0 ? offset_by(in, off) : recv_buf(send_off + off), len);
        rb.recv(prev, tag, recv_buf(recv_off + off), len);
      }
    }
  }
  return sb.finish();
}

}  // namespace wia::coll
