// SPDX-License-Identifier: Apache-2.0
// One-shot all-reduce: every rank sends its whole vector to every other
// rank and reduces all p vectors itself. One communication round whatever
// the rank count (latency: alpha, with p-1 partners at once), at (p-1) n
// bytes per rank: the choice for tiny vectors among few ranks, where the
// round trips of log2(p) exchanges cost more than the extra bytes, and
// above all when ranks outnumber cores (every round is a context switch).
//
// Every rank folds the vectors in rank order, ((v0 op v1) op v2) ..., so
// all ranks compute bit-identical results whatever the op.
//
// The process communicator's network engine runs small instances of this
// schedule on a fast path (engine/eager_allreduce.hpp) that carries the
// collective's descriptor in front of each message.
#include "coll/algorithms.hpp"

namespace wia::coll {

Schedule build_allreduce_one_shot(const CollArgs& args, std::int32_t only_rank) {
  ScheduleBuilder sb(args, Algorithm::kOneShot, only_rank);
  const std::int32_t p = args.nranks;
  const std::uint64_t n = args.count;
  sb.set_num_chunks(1);
  const Region acc = recv_buf(0);
  for (std::int32_t r = 0; r < p; ++r) {
    if (!sb.wants(r)) continue;
    RankBuilder& rb = sb.rank(r);
    if (p == 1) {
      if (!sb.in_place()) rb.copy(send_buf(0), acc, n);
      continue;
    }
    // In place, the input is moved aside first: folding into recv while
    // sends still read it would make the receives wait for the sends,
    // which with rendezvous sends deadlocks every pair of ranks.
    Region mine = send_buf(0);
    if (sb.in_place()) {
      mine = scratch_buf(0);
      rb.copy(acc, mine, n);
    }
    for (std::int32_t s = 1; s < p; ++s) rb.send(mod(r + s, p), 0, mine, n);
    for (std::int32_t q = 0; q < p; ++q) {
      const std::uint32_t div = q + 1 == p ? sb.final_divisor() : 0;
      if (q == 0) {
        if (r == 0) {
          if (!sb.in_place()) rb.copy(mine, acc, n);  // in place, acc holds it still
        } else {
          rb.recv(0, 0, acc, n);
        }
      } else if (q == r) {
        rb.reduce(mine, acc, n, div);
      } else {
        rb.recv_reduce(q, 0, acc, acc, n, div);
      }
    }
  }
  return sb.finish();
}

}  // namespace wia::coll
