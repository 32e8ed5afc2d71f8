// SPDX-License-Identifier: Apache-2.0
// Recursive-doubling all-reduce: log2(p) rounds, in each of which partners
// 2^i apart swap their whole partial vector and both reduce. The fewest
// latency terms of any all-reduce (log2 p), at log2(p) n beta: the choice
// for tiny vectors. Non-power-of-two p folds like Rabenseifner.
//
// Both partners compute a op b on identical operands (all ops are
// commutative), so every rank ends with bit-identical results.
//
// Why two work buffers: a round sends the current partial vector and
// receives the partner's. Reducing in place would make the receive wait
// for the send to complete (the send reads what the reduction overwrites),
// and with rendezvous sends both partners would wait for each other.
// Rounds therefore alternate between recv and scratch, arranged so that
// the last round lands in recv.
#include "coll/algorithms.hpp"

namespace wia::coll {

Schedule build_allreduce_recursive_doubling(const CollArgs& args, std::int32_t only_rank) {
  ScheduleBuilder sb(args, Algorithm::kRecursiveDoubling, only_rank);
  const std::int32_t p = args.nranks;
  const std::uint64_t n = args.count;
  const Fold fold(p);
  sb.set_num_chunks(1);
  if (fold.rem == 0) sb.set_symmetry(Symmetry::kXor);
  const int steps = log2_exact(fold.q);
  const std::uint32_t unfold_tag = 1 + static_cast<std::uint32_t>(steps);
  const Region x = recv_buf(0);
  const Region y = scratch_buf(0);
  // Work buffer after round i (1-based): the last one is recv.
  auto work = [&](int i) { return (steps - i) % 2 == 0 ? x : y; };

  for (std::int32_t r = 0; r < p; ++r) {
    if (!sb.wants(r)) continue;
    RankBuilder& rb = sb.rank(r);
    const Region in = sb.in_place() ? recv_buf(0) : send_buf(0);
    if (p == 1) {
      if (!sb.in_place()) rb.copy(in, x, n);
      continue;
    }
    const std::int32_t v = fold.vrank(r);
    if (v < 0) {
      rb.send(r + 1, 0, in, n);
      rb.recv(r + 1, unfold_tag, x, n);
      continue;
    }
    const bool folded = r < 2 * fold.rem;
    const bool first_in_x = work(1).kind == BufferKind::kUserRecv;
    Region w = in;
    if (folded) {
      w = first_in_x ? y : x;
      rb.recv_reduce(r - 1, 0, in, w, n, 0);
    } else if (sb.in_place() && first_in_x) {
      // The input sits where round 1 must write: move it aside first.
      rb.copy(x, y, n);
      w = y;
    }
    for (int i = 1; i <= steps; ++i) {
      const std::int32_t partner = fold.real(v ^ (1 << (i - 1)));
      const std::uint32_t tag = static_cast<std::uint32_t>(i);
      rb.send(partner, tag, w, n);
      rb.recv_reduce(partner, tag, w, work(i), n, i == steps ? sb.final_divisor() : 0);
      w = work(i);
    }
    if (folded) rb.send(r - 1, unfold_tag, x, n);
  }
  return sb.finish();
}

}  // namespace wia::coll
