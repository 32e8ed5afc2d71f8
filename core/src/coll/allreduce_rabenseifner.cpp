// SPDX-License-Identifier: Apache-2.0
// Rabenseifner all-reduce (spec 6.5.3): recursive-halving reduce-scatter
// followed by recursive-doubling all-gather, 2 log2(p) latency terms and
// the ring's 2 (p-1)/p n beta bandwidth term.
//
// Non-power-of-two p uses the standard fix-up (Fold in algorithms.hpp):
// the even rank of each of the first rem = p - 2^floor(log2 p) pairs first
// sends its whole vector to its odd partner, which reduces it into its own
// and takes part in the power-of-two algorithm; at the end the odd rank
// sends the result back. Costs 2 extra latency terms and 2 n beta on those
// pairs only.
//
// The vector is partitioned into q = 2^floor(log2 p) blocks (uneven:
// the first count % q blocks one element longer); all partial results are
// kept in recv, so no scratch is needed.
#include <vector>

#include "coll/algorithms.hpp"

namespace wia::coll {

Schedule build_allreduce_rabenseifner(const CollArgs& args, std::int32_t only_rank) {
  ScheduleBuilder sb(args, Algorithm::kRabenseifner, only_rank);
  const std::int32_t p = args.nranks;
  const std::uint64_t n = args.count;
  const Fold fold(p);
  sb.set_num_chunks(1);
  if (fold.rem == 0 && n >= static_cast<std::uint64_t>(fold.q)) sb.set_symmetry(Symmetry::kXor);
  const std::uint32_t steps = static_cast<std::uint32_t>(log2_exact(fold.q));
  const std::uint32_t unfold_tag = 1 + 2 * steps;
  std::vector<std::uint64_t> bounds(static_cast<std::size_t>(fold.q) + 1);
  for (std::int32_t v = 0; v <= fold.q; ++v)
    bounds[static_cast<std::size_t>(v)] = block_offset(n, fold.q, v);

  for (std::int32_t r = 0; r < p; ++r) {
    if (!sb.wants(r)) continue;
    RankBuilder& rb = sb.rank(r);
    const Region in = sb.in_place() ? recv_buf(0) : send_buf(0);
    if (p == 1) {
      if (!sb.in_place()) rb.copy(in, recv_buf(0), n);
      continue;
    }
    const std::int32_t v = fold.vrank(r);
    if (v < 0) {
      rb.send(r + 1, 0, in, n);
      rb.recv(r + 1, unfold_tag, recv_buf(0), n);
      continue;
    }
    const bool folded = r < 2 * fold.rem;
    Region input = in;
    if (folded) {
      rb.recv_reduce(r - 1, 0, in, recv_buf(0), n, 0);
      input = recv_buf(0);
    }
    RecursiveHalving rh;
    rh.fold = fold;
    rh.vrank = v;
    rh.bounds = bounds;
    rh.input = input;
    rh.work = recv_buf(0);
    rh.final_block = recv_buf(bounds[static_cast<std::size_t>(v)]);
    rh.divisor = sb.final_divisor();
    rh.tag_base = 1;
    emit_recursive_halving(rb, rh);
    RecursiveDoubling rd;
    rd.fold = fold;
    rd.vrank = v;
    rd.bounds = bounds;
    rd.buf = recv_buf(0);
    rd.tag_base = 1 + steps;
    emit_recursive_doubling_gather(rb, rd);
    if (folded) rb.send(r - 1, unfold_tag, recv_buf(0), n);
  }
  return sb.finish();
}

}  // namespace wia::coll
