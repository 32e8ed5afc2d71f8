// SPDX-License-Identifier: Apache-2.0
// Binomial-tree all-reduce: binomial reduce to rank 0, then binomial
// broadcast from rank 0, chunk by chunk so that the broadcast of a chunk
// starts as soon as rank 0 has reduced it. 2 ceil(log2 p) latency terms
// and the whole vector per round: the classic small-message tree. Inner
// ranks accumulate directly in their recv buffer (it receives the result
// anyway), so no scratch is needed.
#include "coll/algorithms.hpp"

namespace wia::coll {

Schedule build_allreduce_binomial(const CollArgs& args, std::int32_t only_rank) {
  ScheduleBuilder sb(args, Algorithm::kBinomial, only_rank);
  const std::uint32_t k = effective_chunks(args.options.num_chunks, args.count);
  sb.set_num_chunks(k);
  for (std::int32_t r = 0; r < args.nranks; ++r) {
    if (!sb.wants(r)) continue;
    RankBuilder& rb = sb.rank(r);
    BinomialReduce up;
    up.nranks = args.nranks;
    up.root = 0;
    up.count = args.count;
    up.chunks = k;
    up.input = sb.in_place() ? recv_buf(0) : send_buf(0);
    up.accum = recv_buf(0);
    up.output = recv_buf(0);
    up.divisor = sb.final_divisor();
    up.tag_base = 0;
    emit_binomial_reduce(rb, up);
    BinomialBroadcast down;
    down.nranks = args.nranks;
    down.root = 0;
    down.count = args.count;
    down.chunks = k;
    down.source = recv_buf(0);
    down.output = recv_buf(0);
    down.tag_base = k;
    emit_binomial_broadcast(rb, down);
  }
  return sb.finish();
}

}  // namespace wia::coll
