// SPDX-License-Identifier: Apache-2.0
// What the C API sees of a communicator. Two kinds implement it:
//   DeviceCommunicator   (device_communicator.hpp) one process drives N
//                        devices, one rank per device;
//   ProcessCommunicator  (process_communicator.hpp) one rank per process,
//                        peers reached through transport providers.
// Both post a collective on the caller's stream and return at once.
#pragma once

#include <wia/wia.h>

#include <cstdint>

#include "coll/schedule.hpp"
#include "engine/exec_plan.hpp"

struct wia_stream_s;

namespace wia::comm {

// What one rank passed to a collective call.
struct Call {
  coll::Collective collective = coll::Collective::kAllReduce;
  coll::Algorithm algorithm = coll::Algorithm::kAuto;  // as requested
  wia_reduce_op_t op = WIA_REDUCE_SUM;
  wia_datatype_t dtype = WIA_FLOAT32;
  std::uint64_t count = 0;
  std::int32_t root = 0;
  std::uint32_t num_chunks = 0;
  std::uint32_t timeout_ms = 0;
  bool in_place = false;
  engine::RankBuffers buffers;
  // Point to point on a process communicator (wia_send_ex): the caller's
  // tag, the name the profiler and the flight recorder give the operation
  // (static storage; nullptr = "send" / "recv"), and the path its data
  // takes, the profile's `algorithm` (nullptr = "host").
  std::uint32_t tag = 0;
  const char* p2p_name = nullptr;
  const char* p2p_path = nullptr;
  // The buffer's transport registration (device memory registered through
  // its dma-buf, runtime/device_registrations.hpp); nullptr: none needed.
  wia_mr_t p2p_mr = nullptr;
};

class CommunicatorBase {
 public:
  virtual ~CommunicatorBase() = default;

  virtual int size() const = 0;
  // The rank a call made on a stream of `device` acts for; -1 when the
  // device is not a member (in this process).
  virtual int rank_of_device(wia_device_t device) const = 0;
  // Node of the calling process's rank and its rank inside the node, and
  // the number of nodes (device-based communicators: one node).
  virtual int node_rank(int rank) const = 0;
  virtual int local_rank(int rank) const = 0;
  virtual int node_count() const = 0;
  // The rank `rank` had in the communicator this one was shrunk from (a
  // bootstrap's or a split's, never a shrink's), and that one's size:
  // shrinks renumber densely, redundant gradients' shards keep this numbering.
  virtual int origin_rank(int rank) const { return rank; }
  virtual int origin_size() const { return size(); }

  // Validates and posts `rank`'s call on `stream`. Throws for bad
  // arguments and for failures known at once.
  virtual wia_status_t post(int rank, Call call, wia_stream_s* stream) = 0;
  // The shortest way to post `call` when it repeats the last call this
  // thread posted, already validated then (the API's memo): true when it
  // is posted, false to go through post().
  virtual bool try_post_repeat(int /*rank*/, const Call& /*call*/, wia_stream_s* /*stream*/) {
    return false;
  }
  virtual void post_send(int rank, int peer, const void* buf, std::uint64_t count,
                         wia_datatype_t dtype, std::uint32_t timeout_ms, wia_stream_s* stream) = 0;
  virtual void post_recv(int rank, int peer, void* buf, std::uint64_t count, wia_datatype_t dtype,
                         std::uint32_t timeout_ms, wia_stream_s* stream) = 0;

  // Waits (bounded) until every posted operation has finished; false if
  // some are still queued then.
  virtual bool drain() = 0;
  virtual int in_flight() const = 0;
  virtual wia_status_t async_error() const = 0;
  // Ranks known to have failed: died, lost their connection, or did not
  // answer within the timeout (process communicators; empty otherwise).
  virtual std::vector<int> failed_ranks() const { return {}; }
  // wia_comm_abort: operations running or queued fail with
  // WIA_ERROR_ABORTED at their next look at the control channel (any
  // thread may call it). Device communicators: nothing to interrupt.
  virtual void request_abort() {}
  // wia_report_failure: `rank` counts as failed in this rank's view.
  // Device communicators keep no failed set.
  virtual void report_failed(int /*rank*/) {}
  // wia_enable_comm_profiling: nullptr where the communicator cannot profile.
  virtual class CommProfiler* profiler() { return nullptr; }
  virtual wia_algorithm_t last_selected() const = 0;
};

}  // namespace wia::comm
