// SPDX-License-Identifier: Apache-2.0
// Direct all-to-all: every send and receive posted at once (peers in the
// order r+1, r+2, ... so that, at any moment, ranks target different
// peers). One latency term and (p-1) shards per rank; with a per-rank
// injection limit the sends serialise there, which is what the cost model
// charges.
//
// In place, a shard must be sent before it is overwritten, so incoming
// shards land in scratch ((p-1) shards) and are copied over once the
// outgoing shard to that peer has left.
#include "coll/algorithms.hpp"

namespace wia::coll {

Schedule build_alltoall_direct(const CollArgs& args, std::int32_t only_rank) {
  ScheduleBuilder sb(args, Algorithm::kDirect, only_rank);
  const std::int32_t p = args.nranks;
  const std::uint64_t c = args.count;
  sb.set_num_chunks(1);
  sb.set_symmetry(Symmetry::kRotation);
  for (std::int32_t r = 0; r < p; ++r) {
    if (!sb.wants(r)) continue;
    RankBuilder& rb = sb.rank(r);
    const auto self = static_cast<std::uint32_t>(r);
    if (!sb.in_place()) rb.copy(send_shard(self, 0), recv_shard(self, 0), c);
    for (std::int32_t k = 1; k < p; ++k) {
      const auto to = static_cast<std::uint32_t>(mod(r + k, p));
      const auto from = static_cast<std::uint32_t>(mod(r - k, p));
      if (!sb.in_place()) {
        rb.send(static_cast<std::int32_t>(to), 0, send_shard(to, 0), c);
        rb.recv(static_cast<std::int32_t>(from), 0, recv_shard(from, 0), c);
      } else {
        rb.send(static_cast<std::int32_t>(to), 0, recv_shard(to, 0), c);
        rb.recv(static_cast<std::int32_t>(from), 0, scratch_buf(c * (k - 1)), c);
      }
    }
    if (sb.in_place()) {
      for (std::int32_t k = 1; k < p; ++k) {
        const auto from = static_cast<std::uint32_t>(mod(r - k, p));
        rb.copy(scratch_buf(c * (k - 1)), recv_shard(from, 0), c);
      }
    }
  }
  return sb.finish();
}

}  // namespace wia::coll
