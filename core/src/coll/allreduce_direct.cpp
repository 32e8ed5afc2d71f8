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
// Rank r's reduce-scatter receives go round the peers starting at r-1, so
// at any moment the ranks read different peers' blocks. Blocks are split
// into num_chunks chunks, each reduced and then sent on while in cache.
#include <algorithm>

#include "coll/algorithms.hpp"

namespace wia::coll {

Schedule build_allreduce_direct(const CollArgs& args, std::int32_t only_rank) {
  ScheduleBuilder sb(args, Algorithm::kDirect, only_rank);
  const std::int32_t p = args.nranks;
  const std::uint64_t n = args.count;
  // Each block is split into k chunks that go through both rounds one
  // after the other, so a chunk is still in cache when it is sent on.
  // Every chunk costs 3(p-1) steps per rank; more than ~2K steps per rank
  // buys no more cache locality but makes costing and execution slower.
  const std::uint32_t max_chunks =
      std::max<std::uint32_t>(1, 2048 / (3 * static_cast<std::uint32_t>(std::max(p - 1, 1))));
  const std::uint32_t k = effective_chunks(std::min(args.options.num_chunks, max_chunks),
                                           block_size(n, p, 0));
  sb.set_num_chunks(k);
  // Rotation-symmetric (rank r is rank 0 with peers shifted by r) as long
  // as no chunk is empty, which lets the cost model simulate rank 0 only.
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
    // Element range of chunk c of block b.
    auto piece = [&](std::int32_t b, std::uint32_t c, std::uint64_t* off) {
      return block_chunk(n, static_cast<std::uint64_t>(p), static_cast<std::uint64_t>(b), k, c,
                         off);
    };
    // Reduce-scatter sends: chunk c of block q of the input to its owner q.
    std::uint64_t off = 0;
    for (std::uint32_t c = 0; c < k; ++c)
      for (std::int32_t s = 1; s < p; ++s) {
        const std::int32_t q = mod(r + s, p);
        const std::uint64_t len = piece(q, c, &off);
        rb.send(q, 2 * c, offset_by(in, off), len);
      }
    for (std::uint32_t c = 0; c < k; ++c) {
      // Reduce chunk c of block r of every peer's input into recv ...
      const std::uint64_t len = piece(r, c, &off);
      for (std::int32_t s = 1; s < p; ++s) {
        const std::int32_t q = mod(r - s, p);
        const Region local = s == 1 ? offset_by(in, off) : recv_buf(off);
        rb.recv_reduce(q, 2 * c, local, recv_buf(off), len, s + 1 == p ? div : 0);
      }
      // ... send the reduced chunk to everyone, and take theirs.
      for (std::int32_t s = 1; s < p; ++s) rb.send(mod(r + s, p), 2 * c + 1, recv_buf(off), len);
      for (std::int32_t s = 1; s < p; ++s) {
        const std::int32_t q = mod(r - s, p);
        std::uint64_t qoff = 0;
        const std::uint64_t qlen = piece(q, c, &qoff);
        rb.recv(q, 2 * c + 1, recv_buf(qoff), qlen);
      }
    }
  }
  return sb.finish();
}

}  // namespace wia::coll
