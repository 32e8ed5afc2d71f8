// SPDX-License-Identifier: Apache-2.0
// Recursive-doubling all-gather: log2(p) rounds, in round i ranks 2^i apart
// swap everything they have gathered so far. (p-1)/p n beta with log2(p)
// latency terms. Defined for power-of-two p; for other p the registry's
// "recursive_doubling" builds the Bruck all-gather instead (same log-depth
// latency, any p) and the schedule says so (algorithm = kBruck).
#include <vector>

#include "coll/algorithms.hpp"

namespace wia::coll {

void emit_recursive_doubling_gather(RankBuilder& rb, const RecursiveDoubling& a) {
  const int steps = log2_exact(a.fold.q);
  for (int i = 0; i < steps; ++i) {
    const std::int32_t m = 1 << i;
    const std::int32_t partner = a.fold.real(a.vrank ^ m);
    const std::int32_t own_lo = a.vrank & ~(m - 1);
    const std::int32_t peer_lo = own_lo ^ m;
    const std::uint32_t tag = a.tag_base + static_cast<std::uint32_t>(i);
    Region src = offset_by(a.buf, a.bounds[own_lo]);
    if (i == 0 && a.own_src.kind != BufferKind::kNone) src = a.own_src;
    rb.send(partner, tag, src, a.bounds[own_lo + m] - a.bounds[own_lo]);
    rb.recv(partner, tag, offset_by(a.buf, a.bounds[peer_lo]),
            a.bounds[peer_lo + m] - a.bounds[peer_lo]);
  }
}

Schedule build_allgather_recursive_doubling(const CollArgs& args, std::int32_t only_rank) {
  const std::int32_t p = args.nranks;
  if (!is_pow2(p)) return build_allgather_bruck(args, only_rank);
  ScheduleBuilder sb(args, Algorithm::kRecursiveDoubling, only_rank);
  const std::uint64_t c = args.count;
  sb.set_num_chunks(1);
  sb.set_symmetry(Symmetry::kXor);
  std::vector<std::uint64_t> bounds(static_cast<std::size_t>(p) + 1);
  for (std::int32_t v = 0; v <= p; ++v) bounds[static_cast<std::size_t>(v)] = c * v;
  for (std::int32_t r = 0; r < p; ++r) {
    if (!sb.wants(r)) continue;
    RankBuilder& rb = sb.rank(r);
    RecursiveDoubling rd;
    rd.fold = Fold(p);
    rd.vrank = r;
    rd.bounds = bounds;
    rd.buf = recv_buf(0);
    if (!sb.in_place()) {
      rb.copy(send_buf(0), recv_buf(bounds[static_cast<std::size_t>(r)]), c);
      rd.own_src = send_buf(0);
    }
    emit_recursive_doubling_gather(rb, rd);
  }
  return sb.finish();
}

}  // namespace wia::coll
