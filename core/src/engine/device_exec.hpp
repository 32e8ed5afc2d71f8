// SPDX-License-Identifier: Apache-2.0
// Executing a collective's schedule with provider operations only (the
// "device engine", collectives.engine: device). It is what runs when the
// core must not touch device memory itself (devices without
// WIA_DEVICE_FLAG_HOST_ACCESSIBLE: GPUs), and it can be forced on host
// devices to test it on any machine.
//
// Every rank has one internal provider stream on its device. When the last
// rank posts a collective, all ranks' programs are enqueued at once: a
// rank's steps go on its stream in program order (a valid order for the
// schedule's intra-rank dependencies, schedule.hpp), and cross-rank order
// is carried by provider events:
//
//   send s on rank a        record S(a,s) on a's stream: a's earlier work,
//                           which produced the region, is done by then
//   matching recv k on b    b's stream waits for S(a,s), then copies a's
//                           region (memcpy_peer_async), or reduces reading
//                           it (reduce_async), and records R(b,k)
//   a step of a that        a's stream waits for R(b,k) first: the region
//   depends on send s       of send s may be overwritten only once read
//   end of rank a           a's stream waits for R of each of its sends,
//                           records the rank's done event and runs the
//                           completion callback (a host function)
//
// A wait on an event that was never recorded is a no-op in CUDA, so the
// enqueue order must record every event before any stream waits on it:
// ranks are advanced round-robin, each as far as the events it needs
// exist. Schedules are deadlock-free under rendezvous semantics, so this
// always finishes; if it does not, the schedule is broken and the enqueue
// throws instead of producing a stream that would hang.
//
// Device pairs that cannot access each other's memory go through host
// memory: the sender copies its region to a (pinned) host buffer on its own
// stream before recording S, and the receiver copies from there.
#pragma once

#include <wia/provider.h>

#include <cstdint>
#include <map>
#include <mutex>
#include <utility>
#include <vector>

#include "engine/exec_plan.hpp"
#include "runtime/runtime.hpp"

namespace wia::engine {

// Provider events and buffers of each rank's device, reused across
// operations so a collective does not allocate in the common case.
class DevicePools {
 public:
  explicit DevicePools(std::vector<const Device*> devices) : devices_(std::move(devices)) {}
  ~DevicePools();  // callers synchronise the streams that used them first
  DevicePools(const DevicePools&) = delete;
  DevicePools& operator=(const DevicePools&) = delete;

  struct Buffer {
    int rank = 0;
    std::uint32_t kind = WIA_MEM_DEVICE;  // or WIA_MEM_HOST_PINNED, or kMalloc
    std::uint64_t size = 0;
    void* ptr = nullptr;
  };
  // Host memory from malloc, for providers without pinned host memory.
  static constexpr std::uint32_t kMalloc = 0xFFFFFFFFu;

  // What one operation borrowed; returned with give_back once every rank
  // of the operation has completed (its streams no longer use them).
  struct Lease {
    std::vector<std::pair<int, wia_provider_event_t>> events;
    std::vector<Buffer> buffers;
  };

  wia_provider_event_t take_event(int rank, Lease& lease);
  void* take_buffer(int rank, std::uint64_t bytes, std::uint32_t kind, Lease& lease);
  void give_back(Lease& lease);

 private:
  void free_buffer(const Buffer& b) noexcept;

  std::vector<const Device*> devices_;
  std::mutex mu_;
  std::map<int, std::vector<wia_provider_event_t>> events_;        // per rank
  std::multimap<std::uint64_t, Buffer> buffers_;                   // free, by size
};

// What the communicator gives the engine about each rank.
struct DeviceRank {
  const Device* device = nullptr;
  wia_provider_stream_t stream = nullptr;      // the rank's internal stream
  wia_provider_event_t input_ready = nullptr;  // recorded on the user's stream
  // An in-place call inside an out-of-place schedule: the input is
  // snapshotted first, because the schedule may write the output before
  // it has read all of the input.
  bool snapshot_input = false;
  wia_provider_event_t done = nullptr;  // out: recorded when the rank finished
  // When set, run on the rank's stream once its input is ready, before its
  // work (the profiler's start of the rank's part).
  wia_host_fn_t on_start = nullptr;
  void* start_arg = nullptr;
};

// [receiver][sender]: 1 when the receiver's device can read the sender's
// memory directly (peer access enabled), 0 to stage through host memory.
using PeerMatrix = std::vector<std::vector<std::uint8_t>>;

// Enqueues every rank's program of `plan` (see the file comment). On
// return, ranks[r].done is recorded on rank r's stream after its work, and
// on_done(done_args[r]) will run there unless on_done is NULL (the caller
// then waits for the done events itself). Throws wia::Error when a provider
// call fails; work already enqueued then still runs to completion (it only
// waits on recorded events), so synchronising the streams is safe.
void enqueue_on_device_streams(const ExecPlan& plan, std::vector<RankBuffers> buffers,
                               std::vector<DeviceRank>& ranks, const PeerMatrix& direct,
                               DevicePools& pools, DevicePools::Lease& lease,
                               wia_host_fn_t on_done, void* const* done_args);

}  // namespace wia::engine
