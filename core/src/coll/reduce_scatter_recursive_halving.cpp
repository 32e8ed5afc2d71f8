// SPDX-License-Identifier: Apache-2.0
// Recursive-halving reduce-scatter (MPICH's commutative reduce-scatter).
// log2(p) rounds; in round i a rank exchanges half of what it still holds
// with the rank 2^(k-1-i) away and keeps reducing the other half, so the
// bandwidth term is (p-1)/p n beta with only log2(p) latency terms.
//
// Non-power-of-two p: the Fold scheme (algorithms.hpp). The even rank of
// each of the first rem pairs sends its whole input to its odd partner and
// at the end receives its block from it; the odd rank takes part with a
// block that is the union of the two real blocks, so the q participants
// still partition the vector in rank order.
#include <vector>

#include "coll/algorithms.hpp"

namespace wia::coll {

void emit_recursive_halving(RankBuilder& rb, const RecursiveHalving& a) {
  const std::int32_t q = a.fold.q;
  const int steps = log2_exact(q);
  std::int32_t lo = 0;
  std::int32_t hi = q;
  for (int i = 0; i < steps; ++i) {
    const std::int32_t m = q >> (i + 1);
    const std::int32_t partner = a.fold.real(a.vrank ^ m);
    const std::int32_t mid = lo + m;
    const bool keep_low = (a.vrank & m) == 0;
    const std::int32_t keep_lo = keep_low ? lo : mid;
    const std::int32_t keep_hi = keep_low ? mid : hi;
    const std::int32_t give_lo = keep_low ? mid : lo;
    const std::int32_t give_hi = keep_low ? hi : mid;
    const Region src = i == 0 ? a.input : a.work;
    const std::uint32_t tag = a.tag_base + static_cast<std::uint32_t>(i);
    rb.send(partner, tag, offset_by(src, a.bounds[give_lo]), a.bounds[give_hi] - a.bounds[give_lo]);
    const bool last = i + 1 == steps;
    const Region dst = last ? a.final_block : offset_by(a.work, a.bounds[keep_lo]);
    rb.recv_reduce(partner, tag, offset_by(src, a.bounds[keep_lo]), dst,
                   a.bounds[keep_hi] - a.bounds[keep_lo], last ? a.divisor : 0);
    lo = keep_lo;
    hi = keep_hi;
  }
}

Schedule build_reduce_scatter_recursive_halving(const CollArgs& args, std::int32_t only_rank) {
  ScheduleBuilder sb(args, Algorithm::kRecursiveHalving, only_rank);
  const std::int32_t p = args.nranks;
  const std::uint64_t c = args.count;
  const std::uint64_t total = c * static_cast<std::uint64_t>(p);
  const Fold fold(p);
  sb.set_num_chunks(1);
  if (fold.rem == 0) sb.set_symmetry(Symmetry::kXor);
  const std::uint32_t div = sb.final_divisor();
  const std::uint32_t unfold_tag = 1 + static_cast<std::uint32_t>(log2_exact(fold.q));

  // Participant v covers real blocks [first(v), first(v + 1)).
  std::vector<std::uint64_t> bounds(static_cast<std::size_t>(fold.q) + 1);
  for (std::int32_t v = 0; v <= fold.q; ++v)
    bounds[static_cast<std::size_t>(v)] =
        c * static_cast<std::uint64_t>(v < fold.rem ? 2 * v : v + fold.rem);

  for (std::int32_t r = 0; r < p; ++r) {
    if (!sb.wants(r)) continue;
    RankBuilder& rb = sb.rank(r);
    const Region in = sb.in_place() ? recv_buf(0) : send_buf(0);
    const Region out = sb.in_place() ? recv_buf(c * static_cast<std::uint64_t>(r)) : recv_buf(0);
    if (p == 1) {
      if (!sb.in_place()) rb.copy(in, out, c);
      continue;
    }
    const std::int32_t v = fold.vrank(r);
    if (v < 0) {  // folded away: hand over the input, get the block back
      rb.send(r + 1, 0, in, total);
      rb.recv(r + 1, unfold_tag, out, c);
      continue;
    }
    const bool folded = r < 2 * fold.rem;
    Region input = in;
    if (folded) {
      rb.recv_reduce(r - 1, 0, in, scratch_buf(0), total, 0);
      input = scratch_buf(0);
    }
    RecursiveHalving rh;
    rh.fold = fold;
    rh.vrank = v;
    rh.bounds = bounds;
    rh.input = input;
    rh.work = scratch_buf(0);
    // A folded rank's block spans two real blocks: finish it in scratch,
    // then split it between itself and its partner.
    rh.final_block = folded ? scratch_buf(bounds[static_cast<std::size_t>(v)]) : out;
    rh.divisor = div;
    rh.tag_base = 1;
    emit_recursive_halving(rb, rh);
    if (folded) {
      const std::uint64_t mine = c * static_cast<std::uint64_t>(r);
      rb.send(r - 1, unfold_tag, scratch_buf(mine - c), c);
      rb.copy(scratch_buf(mine), out, c);
    }
  }
  return sb.finish();
}

}  // namespace wia::coll
