// SPDX-License-Identifier: Apache-2.0
// The network engine's fast path for small one-shot all-reduces
// (coll/allreduce_one_shot.cpp): every rank sends one message to every
// peer, the collective's descriptor followed by its whole vector, and
// reduces the p vectors in rank order with one n-ary kernel call.
//
// Why a path of its own: at 8 bytes the general engine (NetExecution)
// spends most of a collective on bookkeeping and on the separate
// descriptor messages (two more transport messages per rank), which cost
// as much as the data. Here the descriptor rides in front of the data, so
// a 2-rank all-reduce is one message each way, and every peer's
// descriptor is checked, not only the predecessor's. Over a transport
// with inline messages (WIA_TRANSPORT_CAP_INLINE) no request objects are
// made at all: send_inline writes the message, recv_inline polls for the
// peer's, and only what the transport declines goes through isend/irecv
// (measured: 0.71 -> 0.56 us for 8 bytes between two processes over shm).
//
// Ranks that disagree about taking this path (different counts or
// configurations) still fail instead of hanging: the message travels with
// the descriptor tag, so a peer on the general path receives a message
// larger than the descriptor it expects (an error for that request), and
// this path receives a bare descriptor where it expects data (a mismatch
// naming the difference). Either error breaks the communicator on every
// rank through the control channel.
#pragma once

#include <wia/provider.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "engine/net_exec.hpp"

namespace wia::engine {

class EagerAllReduce {
 public:
  // Posts the messages of the collective `desc` describes: `count`
  // elements of `dtype` from `send` (may equal `recv`: in place) to every
  // rank but `rank`, over links[q]. Receives take messages of up to
  // `max_bytes` of data (the largest any rank sends on this path), so a
  // peer that called with another count is reported with the descriptors'
  // difference, not a transport's "buffer too small". Everything passed
  // by reference must outlive progress(), which also reports a failure to
  // post.
  void start(int rank, const Descriptor& desc, const void* send, void* recv,
             wia_reduce_op_t op, std::uint64_t max_bytes, std::vector<NetLink>& links,
             ControlChannel& control, const NetExecOptions& options);

  // WIA_SUCCESS when the result is in `recv`; WIA_IN_PROGRESS when peers
  // had not sent by `give_up_at` (call again); a negative status with
  // `error` naming the rank, the peer and the problem otherwise.
  wia_status_t progress(std::chrono::steady_clock::time_point give_up_at, std::string& error);

 private:
  bool run(std::chrono::steady_clock::time_point give_up_at);
  void post_all(const char* mine);
  void post_recv(int q);
  void check_posted(int q, wia_request_t req);
  bool test(int q, wia_request_t& req, bool is_send);
  bool test_inline(int q);
  void check_message(int q, std::uint64_t size);
  std::string timeout_message() const;
  char* slot(int q) { return buf_.data() + static_cast<std::size_t>(q) * slot_bytes_; }

  int rank_ = 0;
  int nranks_ = 0;
  Descriptor desc_{};
  void* recv_ = nullptr;
  wia_reduce_op_t op_{};
  std::uint64_t bytes_ = 0, msg_bytes_ = 0, slot_bytes_ = 0;
  std::vector<NetLink>* links_ = nullptr;
  ControlChannel* control_ = nullptr;
  const NetExecOptions* options_ = nullptr;
  // One message-sized slot per rank: this rank's own is the outgoing
  // message (its data is also its operand), the others receive.
  std::vector<char> buf_;
  std::vector<wia_request_t> sends_, recvs_;
  std::vector<std::uint8_t> inline_recv_;  // 1: expected from q through recv_inline
  std::vector<const void*> srcs_;
  int pending_ = 0;  // requests not yet completed
  wia_status_t failure_ = WIA_SUCCESS;  // of start(), reported by progress()
  std::string failure_text_;
  bool reduced_ = false;
};

}  // namespace wia::engine
