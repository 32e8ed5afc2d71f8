// SPDX-License-Identifier: Apache-2.0
// Shifted send-receive (MPI_Sendrecv on a ring): every rank sends its
// vector to r + peer_offset and receives one from r - peer_offset. With a
// shift that is a multiple of p it is a local copy. In place the incoming
// vector is staged in scratch: receiving straight into the buffer being
// sent would make every receive wait for its rank's send, and every send
// for its peer's receive.
#include "coll/algorithms.hpp"

namespace wia::coll {

Schedule build_sendrecv(const CollArgs& args, std::int32_t only_rank) {
  ScheduleBuilder sb(args, Algorithm::kDirect, only_rank);
  const std::int32_t p = args.nranks;
  const std::uint64_t n = args.count;
  const std::int32_t shift = args.options.peer_offset % p;
  sb.set_num_chunks(1);
  sb.set_symmetry(Symmetry::kRotation);
  for (std::int32_t r = 0; r < p; ++r) {
    if (!sb.wants(r)) continue;
    RankBuilder& rb = sb.rank(r);
    if (shift == 0) {
      if (!sb.in_place()) rb.copy(send_buf(0), recv_buf(0), n);
      continue;
    }
    const std::int32_t to = mod(r + shift, p);
    const std::int32_t from = mod(r - shift, p);
    if (!sb.in_place()) {
      rb.send(to, 0, send_buf(0), n);
      rb.recv(from, 0, recv_buf(0), n);
    } else {
      rb.send(to, 0, recv_buf(0), n);
      rb.recv(from, 0, scratch_buf(0), n);
      rb.copy(scratch_buf(0), recv_buf(0), n);
    }
  }
  return sb.finish();
}

}  // namespace wia::coll
