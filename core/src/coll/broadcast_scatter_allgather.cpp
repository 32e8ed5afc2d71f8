// SPDX-License-Identifier: Apache-2.0
// Scatter + all-gather broadcast (van de Geijn; MPICH's large-message
// broadcast): the root scatters nranks blocks down a binomial tree, then a
// ring all-gather over relative ranks completes every copy. About
// 2 n beta with log2(p) + p - 1 latency terms: bandwidth-optimal without
// pipelining, at the price of many latency terms.
//
// After the scatter a rank already holds every block of its binomial
// subtree (it forwarded them), and the root holds everything; the ring
// step that would deliver a block its receiver already has is skipped at
// both ends, and the forwarding rank sends that block from its own copy.
#include <algorithm>

#include "coll/algorithms.hpp"

namespace wia::coll {

Schedule build_broadcast_scatter_allgather(const CollArgs& args, std::int32_t only_rank) {
  ScheduleBuilder sb(args, Algorithm::kScatterAllGather, only_rank);
  const std::int32_t p = args.nranks;
  const std::uint64_t n = args.count;
  sb.set_num_chunks(1);
  auto bound = [&](std::int32_t block) { return block_offset(n, p, block); };
  // Blocks [lo, hi) in the binomial subtree of relative rank v.
  auto subtree_hi = [&](std::int32_t v) {
    if (v == 0) return p;
    return std::min(p, v + (v & -v));
  };
  auto has = [&](std::int32_t v, std::int32_t block) {
    return v == 0 || (block >= v && block < subtree_hi(v));
  };
  for (std::int32_t r = 0; r < p; ++r) {
    if (!sb.wants(r)) continue;
    RankBuilder& rb = sb.rank(r);
    const std::int32_t vr = mod(r - args.root, p);
    auto real = [&](std::int32_t v) { return mod(v + args.root, p); };
    const Region root_src = sb.in_place() ? recv_buf(0) : send_buf(0);

    // Scatter down the binomial tree, largest subtree first.
    std::int32_t mask = 1;
    while (mask < p && !(vr & mask)) mask <<= 1;
    Region src = recv_buf(0);
    if (vr == 0) {
      src = root_src;
      if (!sb.in_place()) rb.copy(send_buf(0), recv_buf(0), n);
    } else {
      const std::uint64_t lo = bound(vr);
      rb.recv(real(vr - mask), 0, recv_buf(lo), bound(subtree_hi(vr)) - lo);
    }
    for (std::int32_t m = mask >> 1; m > 0; m >>= 1) {
      const std::int32_t child = vr + m;
      if (child >= p) continue;
      const std::uint64_t lo = bound(child);
      rb.send(real(child), 0, offset_by(src, lo), bound(subtree_hi(child)) - lo);
    }

    // Ring all-gather over relative ranks.
    if (p == 1) continue;
    const std::int32_t next_v = (vr + 1) % p;
    const std::int32_t prev_v = (vr + p - 1) % p;
    for (std::int32_t s = 0; s + 1 < p; ++s) {
      const std::uint32_t tag = 1 + static_cast<std::uint32_t>(s);
      const std::int32_t sb_idx = mod(vr - s, p);
      const std::int32_t rb_idx = mod(vr - s - 1, p);
      if (!has(next_v, sb_idx))
        rb.send(real(next_v), tag, offset_by(src, bound(sb_idx)),
                bound(sb_idx + 1) - bound(sb_idx));
      if (!has(vr, rb_idx))
        rb.recv(real(prev_v), tag, recv_buf(bound(rb_idx)), bound(rb_idx + 1) - bound(rb_idx));
    }
  }
  return sb.finish();
}

}  // namespace wia::coll
