// SPDX-License-Identifier: Apache-2.0
// Binomial-tree reduce to a root: ceil(log2 p) rounds, each rank sending
// once. Latency-optimal for small vectors; every inner rank touches the
// whole vector once per child, so it is not bandwidth-optimal (use the
// chain for large vectors). Pipelined in num_chunks chunks.
//
// Non-root ranks never write user memory: they accumulate in scratch (the
// NCCL contract leaves recvbuff of non-roots unused, possibly NULL).
#include "coll/algorithms.hpp"

namespace wia::coll {

void emit_binomial_reduce(RankBuilder& rb, const BinomialReduce& a) {
  const std::int32_t p = a.nranks;
  const std::int32_t vr = mod(rb.rank() - a.root, p);
  auto real = [&](std::int32_t v) { return mod(v + a.root, p); };
  // Children in the order their subtrees complete (smallest first).
  std::int32_t parent = -1;
  std::int32_t children[32];
  int nchildren = 0;
  for (std::int32_t mask = 1; mask < p; mask <<= 1) {
    if (vr & mask) {
      parent = vr - mask;
      break;
    }
    if (vr + mask < p) children[nchildren++] = vr + mask;
  }
  for (std::uint32_t c = 0; c < a.chunks; ++c) {
    const std::uint64_t off = block_offset(a.count, a.chunks, c);
    const std::uint64_t len = block_size(a.count, a.chunks, c);
    const std::uint32_t tag = a.tag_base + c;
    if (nchildren == 0) {
      if (parent >= 0) {
        rb.send(real(parent), tag, offset_by(a.input, off), len);
      } else if (!same_region(a.input, a.output)) {
        rb.copy(offset_by(a.input, off), offset_by(a.output, off), len);
      }
      continue;
    }
    const Region dst = parent < 0 ? a.output : a.accum;
    Region local = a.input;
    for (int i = 0; i < nchildren; ++i) {
      const bool final_sum = parent < 0 && i + 1 == nchildren;
      rb.recv_reduce(real(children[i]), tag, offset_by(local, off), offset_by(dst, off), len,
                     final_sum ? a.divisor : 0);
      local = dst;
    }
    if (parent >= 0) rb.send(real(parent), tag, offset_by(dst, off), len);
  }
}

Schedule build_reduce_binomial(const CollArgs& args, std::int32_t only_rank) {
  ScheduleBuilder sb(args, Algorithm::kBinomial, only_rank);
  const std::uint32_t k = effective_chunks(args.options.num_chunks, args.count);
  sb.set_num_chunks(k);
  for (std::int32_t r = 0; r < args.nranks; ++r) {
    if (!sb.wants(r)) continue;
    BinomialReduce phase;
    phase.nranks = args.nranks;
    phase.root = args.root;
    phase.count = args.count;
    phase.chunks = k;
    phase.input = sb.in_place() ? recv_buf(0) : send_buf(0);
    phase.accum = scratch_buf(0);
    phase.output = recv_buf(0);
    phase.divisor = sb.final_divisor();
    emit_binomial_reduce(sb.rank(r), phase);
  }
  return sb.finish();
}

}  // namespace wia::coll
