// SPDX-License-Identifier: Apache-2.0
// Pipelined chain broadcast: root -> root+1 -> ... -> root+p-1, the vector
// cut into num_chunks chunks that each rank forwards as soon as it has
// received them. Time ~ (p - 2 + k) (alpha + n beta / k): every link
// carries the vector once, so for large vectors it approaches n beta
// independently of p (NCCL's ring broadcast is this chain).
#include "coll/algorithms.hpp"

namespace wia::coll {

Schedule build_broadcast_chain(const CollArgs& args, std::int32_t only_rank) {
  ScheduleBuilder sb(args, Algorithm::kChain, only_rank);
  const std::int32_t p = args.nranks;
  const std::uint64_t n = args.count;
  const std::uint32_t k = effective_chunks(args.options.num_chunks, n);
  sb.set_num_chunks(k);
  for (std::int32_t r = 0; r < p; ++r) {
    if (!sb.wants(r)) continue;
    RankBuilder& rb = sb.rank(r);
    const std::int32_t vr = mod(r - args.root, p);
    const std::int32_t prev = mod(r - 1, p);
    const std::int32_t next = vr + 1 < p ? mod(r + 1, p) : -1;
    for (std::uint32_t c = 0; c < k; ++c) {
      const std::uint64_t off = block_offset(n, k, c);
      const std::uint64_t len = block_size(n, k, c);
      Region src = recv_buf(off);
      if (vr == 0) {
        if (!sb.in_place()) {
          src = send_buf(off);
          rb.copy(src, recv_buf(off), len);
        }
      } else {
        rb.recv(prev, c, recv_buf(off), len);
      }
      if (next >= 0) rb.send(next, c, src, len);
    }
  }
  return sb.finish();
}

}  // namespace wia::coll
