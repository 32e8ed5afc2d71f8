// SPDX-License-Identifier: Apache-2.0
// Bruck all-gather (dissemination): ceil(log2 p) rounds for any p. In round
// k rank r sends the blocks of ranks r .. r+cnt-1 (mod p) it holds to
// r - 2^k and receives those of r + 2^k .. from r + 2^k, cnt = min(2^k,
// p - 2^k). The textbook algorithm works in a rotated scratch buffer and
// rotates at the end; here every block lands directly at its final place
// in recv, so there is no scratch and no final pass: a run of blocks that
// wraps past rank p-1 is sent as two messages (tags 2k and 2k+1), which
// both ends compute identically.
#include <algorithm>

#include "coll/algorithms.hpp"

namespace wia::coll {

Schedule build_allgather_bruck(const CollArgs& args, std::int32_t only_rank) {
  ScheduleBuilder sb(args, Algorithm::kBruck, only_rank);
  const std::int32_t p = args.nranks;
  const std::uint64_t c = args.count;
  sb.set_num_chunks(1);
  for (std::int32_t r = 0; r < p; ++r) {
    if (!sb.wants(r)) continue;
    RankBuilder& rb = sb.rank(r);
    const std::uint64_t own = c * static_cast<std::uint64_t>(r);
    if (!sb.in_place()) rb.copy(send_buf(0), recv_buf(own), c);
    int round = 0;
    for (std::int32_t dist = 1; dist < p; dist *= 2, ++round) {
      const std::int32_t cnt = std::min(dist, p - dist);
      // Blocks [first, first + cnt) mod p as at most two contiguous runs.
      auto runs = [&](std::int32_t first, auto&& fn) {
        const std::int32_t head = std::min(cnt, p - first);
        fn(0, first, head);
        if (head < cnt) fn(1, 0, cnt - head);
      };
      const std::uint32_t tag = 2 * static_cast<std::uint32_t>(round);
      runs(r, [&](std::uint32_t part, std::int32_t b, std::int32_t nb) {
        // The first round sends only the own block: read it from the
        // input so the send need not wait for the local copy.
        const Region src = (round == 0 && !sb.in_place()) ? send_buf(0) : recv_buf(c * b);
        rb.send(mod(r - dist, p), tag + part, src, c * static_cast<std::uint64_t>(nb));
      });
      runs(mod(r + dist, p), [&](std::uint32_t part, std::int32_t b, std::int32_t nb) {
        rb.recv(mod(r + dist, p), tag + part, recv_buf(c * b), c * static_cast<std::uint64_t>(nb));
      });
    }
  }
  return sb.finish();
}

}  // namespace wia::coll
