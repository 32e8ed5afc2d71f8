// SPDX-License-Identifier: Apache-2.0
// Ring all-reduce (spec 6.5.1): a ring reduce-scatter over nranks blocks
// followed by a ring all-gather. Every rank sends and receives one block
// per step, so each link carries 2(p-1)/p of the vector: bandwidth-optimal,
// with 2(p-1) latency terms. Each block is further split into num_chunks
// pieces that flow independently (the dependencies are per piece), which
// lets transfers of one piece overlap the reduction of another.
//
// Rank r at reduce-scatter step s sends block (r - s) and receive-reduces
// block (r - s - 1); after p - 1 steps it holds block (r + 1) fully reduced
// (divided there for AVG). The all-gather then circulates the reduced
// blocks; rank r receives block (r - s) at all-gather step s.
#include "coll/algorithms.hpp"

namespace wia::coll {

Schedule build_allreduce_ring(const CollArgs& args, std::int32_t only_rank) {
  ScheduleBuilder sb(args, Algorithm::kRing, only_rank);
  const std::int32_t p = args.nranks;
  const std::uint64_t n = args.count;
  const std::uint32_t k = effective_chunks(args.options.num_chunks, block_size(n, p, 0));
  sb.set_num_chunks(k);
  // Rotation-symmetric as long as no chunk is empty (an empty chunk's
  // steps are skipped on some ranks only).
  if (n / static_cast<std::uint64_t>(p) >= k) sb.set_symmetry(Symmetry::kRotation);
  const std::uint32_t div = sb.final_divisor();

  for (std::int32_t r = 0; r < p; ++r) {
    if (!sb.wants(r)) continue;
    RankBuilder& rb = sb.rank(r);
    const Region in = sb.in_place() ? recv_buf(0) : send_buf(0);
    if (p == 1) {
      if (!sb.in_place()) rb.copy(in, recv_buf(0), n);
      continue;
    }
    const std::int32_t next = mod(r + 1, p);
    const std::int32_t prev = mod(r - 1, p);
    // Element range of chunk c of block b.
    auto piece = [&](std::int32_t b, std::uint32_t c, std::uint64_t* off) {
      return block_chunk(n, static_cast<std::uint64_t>(p), static_cast<std::uint64_t>(b), k, c,
                         off);
    };
    std::uint64_t off = 0;
    for (std::int32_t s = 0; s + 1 < p; ++s) {
      const std::int32_t send_block = mod(r - s, p);
      const std::int32_t recv_block = mod(r - s - 1, p);
      const bool last = s + 2 == p;
      for (std::uint32_t c = 0; c < k; ++c) {
        const std::uint32_t tag = static_cast<std::uint32_t>(s) * k + c;
        // Step 0 sends the raw input; later steps forward what the previous
        // step reduced into recv.
        std::uint64_t len = piece(send_block, c, &off);
        rb.send(next, tag, offset_by(s == 0 ? in : recv_buf(0), off), len);
        len = piece(recv_block, c, &off);
        rb.recv_reduce(prev, tag, offset_by(in, off), recv_buf(off), len, last ? div : 0);
      }
    }
    for (std::int32_t s = 0; s + 1 < p; ++s) {
      const std::int32_t send_block = mod(r + 1 - s, p);
      const std::int32_t recv_block = mod(r - s, p);
      for (std::uint32_t c = 0; c < k; ++c) {
        const std::uint32_t tag = static_cast<std::uint32_t>(p - 1 + s) * k + c;
        std::uint64_t len = piece(send_block, c, &off);
        rb.send(next, tag, recv_buf(off), len);
        len = piece(recv_block, c, &off);
        rb.recv(prev, tag, recv_buf(off), len);
      }
    }
  }
  return sb.finish();
}

}  // namespace wia::coll
