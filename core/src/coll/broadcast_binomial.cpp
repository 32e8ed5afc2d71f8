// SPDX-License-Identifier: Apache-2.0
// Binomial-tree broadcast: ceil(log2 p) rounds; the root serves its largest
// subtree first so the deepest path starts earliest. Latency-optimal for
// small vectors; pipelined in num_chunks chunks for larger ones.
#include "coll/algorithms.hpp"

namespace wia::coll {

void emit_binomial_broadcast(RankBuilder& rb, const BinomialBroadcast& a) {
  const std::int32_t p = a.nranks;
  const std::int32_t vr = mod(rb.rank() - a.root, p);
  auto real = [&](std::int32_t v) { return mod(v + a.root, p); };
  // The parent is vr minus its lowest set bit; children are vr + m for the
  // powers of two m below that bit (below p for the root), largest first.
  std::int32_t mask = 1;
  while (mask < p && !(vr & mask)) mask <<= 1;
  const std::int32_t parent = vr == 0 ? -1 : vr - mask;
  std::int32_t children[32];
  int nchildren = 0;
  for (std::int32_t m = mask >> 1; m > 0; m >>= 1)
    if (vr + m < p) children[nchildren++] = vr + m;

  const bool root_copies = a.source.kind != a.output.kind || a.source.offset != a.output.offset ||
                           a.source.shard != a.output.shard;
  for (std::uint32_t c = 0; c < a.chunks; ++c) {
    const std::uint64_t off = block_offset(a.count, a.chunks, c);
    const std::uint64_t len = block_size(a.count, a.chunks, c);
    const std::uint32_t tag = a.tag_base + c;
    Region src = a.output;
    if (parent < 0) {
      src = a.source;
      if (root_copies) rb.copy(offset_by(a.source, off), offset_by(a.output, off), len);
    } else {
      rb.recv(real(parent), tag, offset_by(a.output, off), len);
    }
    for (int i = 0; i < nchildren; ++i) rb.send(real(children[i]), tag, offset_by(src, off), len);
  }
}

Schedule build_broadcast_binomial(const CollArgs& args, std::int32_t only_rank) {
  ScheduleBuilder sb(args, Algorithm::kBinomial, only_rank);
  const std::uint32_t k = effective_chunks(args.options.num_chunks, args.count);
  sb.set_num_chunks(k);
  for (std::int32_t r = 0; r < args.nranks; ++r) {
    if (!sb.wants(r)) continue;
    BinomialBroadcast phase;
    phase.nranks = args.nranks;
    phase.root = args.root;
    phase.count = args.count;
    phase.chunks = k;
    phase.source = sb.in_place() ? recv_buf(0) : send_buf(0);
    phase.output = recv_buf(0);
    emit_binomial_broadcast(sb.rank(r), phase);
  }
  return sb.finish();
}

}  // namespace wia::coll
