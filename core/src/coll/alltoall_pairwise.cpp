// SPDX-License-Identifier: Apache-2.0
// Pairwise-exchange all-to-all: p-1 rounds, one send and one receive in
// flight per rank per round (round k: partner r XOR k for power-of-two p,
// otherwise send to r+k and receive from r-k). Each round waits for the
// previous one on purpose (ordering-only dependencies): this bounds the
// memory and the network contention that the direct algorithm creates, at
// the price of p-1 latency terms.
//
// In place, the shard received in round k may only overwrite its slot once
// the shard previously there has been sent; it is staged in scratch and
// copied right after that send (the same round with XOR partners, round
// p-k otherwise).
#include <vector>

#include "coll/algorithms.hpp"

namespace wia::coll {

Schedule build_alltoall_pairwise(const CollArgs& args, std::int32_t only_rank) {
  ScheduleBuilder sb(args, Algorithm::kPairwise, only_rank);
  const std::int32_t p = args.nranks;
  const std::uint64_t c = args.count;
  const bool xor_pairs = is_pow2(p);
  sb.set_num_chunks(1);
  sb.set_symmetry(xor_pairs ? Symmetry::kXor : Symmetry::kRotation);
  for (std::int32_t r = 0; r < p; ++r) {
    if (!sb.wants(r)) continue;
    RankBuilder& rb = sb.rank(r);
    const auto self = static_cast<std::uint32_t>(r);
    if (!sb.in_place()) rb.copy(send_shard(self, 0), recv_shard(self, 0), c);
    // In place: staged shard of round k to copy after round `after`'s send.
    std::vector<std::vector<std::int32_t>> pending(static_cast<std::size_t>(p));
    auto flush = [&](std::int32_t round) {
      for (std::int32_t k : pending[static_cast<std::size_t>(round)]) {
        const auto from = static_cast<std::uint32_t>(xor_pairs ? (r ^ k) : mod(r - k, p));
        rb.copy(scratch_buf(c * (k - 1)), recv_shard(from, 0), c);
      }
    };
    std::uint32_t prev_send = kNoStep;
    std::uint32_t prev_recv = kNoStep;
    for (std::int32_t k = 1; k < p; ++k) {
      const std::int32_t to = xor_pairs ? (r ^ k) : mod(r + k, p);
      const std::int32_t from = xor_pairs ? (r ^ k) : mod(r - k, p);
      const auto to_u = static_cast<std::uint32_t>(to);
      const auto from_u = static_cast<std::uint32_t>(from);
      if (!sb.in_place()) {
        const std::uint32_t s = rb.send(to, 0, send_shard(to_u, 0), c, {prev_send, prev_recv});
        const std::uint32_t v = rb.recv(from, 0, recv_shard(from_u, 0), c, {prev_send, prev_recv});
        prev_send = s;
        prev_recv = v;
        continue;
      }
      const std::uint32_t s = rb.send(to, 0, recv_shard(to_u, 0), c, {prev_send, prev_recv});
      const std::uint32_t v = rb.recv(from, 0, scratch_buf(c * (k - 1)), c, {prev_send, prev_recv});
      prev_send = s;
      prev_recv = v;
      // The shard for `from` leaves in the round whose target is `from`.
      const std::int32_t leaves = xor_pairs ? k : p - k;
      pending[static_cast<std::size_t>(leaves < k ? k : leaves)].push_back(k);
      flush(k);
      pending[static_cast<std::size_t>(k)].clear();
    }
  }
  return sb.finish();
}

}  // namespace wia::coll
