// SPDX-License-Identifier: Apache-2.0
// Pipelined binary-tree all-reduce (spec 6.5.2). Ranks form a binary heap
// rooted at rank 0 (children 2r+1, 2r+2, depth floor(log2 p)): each chunk
// is reduced up the tree and broadcast back down. Chunks flow
// independently, so the broadcast of chunk c overlaps the reduction of
// chunk c+1: the latency term is 2 log2(p) alpha (per chunk in flight) and,
// with enough chunks, every link carries the vector once per direction.
// The bandwidth term thus tends to n beta on dedicated links; behind one
// NIC per rank it tends to 3 n beta, as an inner rank sends n up and 2n
// down (the spec's 2 n beta sits between; the cost model models both).
// Best for small and medium vectors.
//
// An inner node receive-reduces its children's chunk into recv (its own
// input as the first operand), sends the partial sum up, and later
// receives the final chunk from its parent into the same place: that
// receive depends on the upward send having completed, never the reverse,
// so there is no cycle even with rendezvous sends.
#include "coll/algorithms.hpp"

namespace wia::coll {

Schedule build_allreduce_tree(const CollArgs& args, std::int32_t only_rank) {
  ScheduleBuilder sb(args, Algorithm::kTree, only_rank);
  const std::int32_t p = args.nranks;
  const std::uint64_t n = args.count;
  const std::uint32_t k = effective_chunks(args.options.num_chunks, n);
  sb.set_num_chunks(k);
  const std::uint32_t div = sb.final_divisor();

  for (std::int32_t r = 0; r < p; ++r) {
    if (!sb.wants(r)) continue;
    RankBuilder& rb = sb.rank(r);
    const Region in = sb.in_place() ? recv_buf(0) : send_buf(0);
    if (p == 1) {
      if (!sb.in_place()) rb.copy(in, recv_buf(0), n);
      continue;
    }
    const std::int32_t parent = r == 0 ? -1 : (r - 1) / 2;
    std::int32_t children[2];
    int nchildren = 0;
    for (std::int32_t c = 2 * r + 1; c <= 2 * r + 2 && c < p; ++c) children[nchildren++] = c;

    for (std::uint32_t c = 0; c < k; ++c) {
      const std::uint64_t off = block_offset(n, k, c);
      const std::uint64_t len = block_size(n, k, c);
      const std::uint32_t up_tag = c;
      const std::uint32_t down_tag = k + c;
      if (nchildren == 0) {
        rb.send(parent, up_tag, offset_by(in, off), len);
      } else {
        Region local = offset_by(in, off);
        for (int i = 0; i < nchildren; ++i) {
          const bool final_sum = parent < 0 && i + 1 == nchildren;
          rb.recv_reduce(children[i], up_tag, local, recv_buf(off), len, final_sum ? div : 0);
          local = recv_buf(off);
        }
        if (parent >= 0) rb.send(parent, up_tag, recv_buf(off), len);
      }
      if (parent >= 0) rb.recv(parent, down_tag, recv_buf(off), len);
      for (int i = 0; i < nchildren; ++i) rb.send(children[i], down_tag, recv_buf(off), len);
    }
  }
  return sb.finish();
}

}  // namespace wia::coll
