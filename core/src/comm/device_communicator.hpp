// SPDX-License-Identifier: Apache-2.0
// Device-based communicators: one process drives N devices, rank i being
// devices[i]. A collective call posts a stream task (a host function) on
// the caller's stream and returns; the task runs when the stream reaches
// it and executes that rank's program of the collective's schedule
// (engine/). Calls are matched across ranks by a per-rank sequence number,
// and their descriptors are compared so mismatched calls become an error
// on every rank.
#pragma once

#include <wia/wia.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "coll/schedule.hpp"
#include "comm/comm_profiler.hpp"
#include "comm/communicator_base.hpp"
#include "common/error.hpp"
#include "engine/device_exec.hpp"
#include "engine/exec_plan.hpp"
#include "engine/progress_signal.hpp"
#include "runtime/runtime.hpp"
#include "tuner/cost_model.hpp"

struct wia_stream_s;

namespace wia::comm {

class DeviceCommunicator;

// Who moves the data of a collective (config collectives.engine):
//   kInline  the core's threads, straight between host-addressable
//            buffers (engine/exec_plan.hpp): the fast path on host devices.
//   kDevice  provider operations on per-rank internal streams
//            (engine/device_exec.hpp): required for device memory the core
//            cannot address; selectable on host devices for testing.
enum class Engine : std::uint8_t { kInline, kDevice };
const char* engine_name(Engine e) noexcept;

// One collective across all ranks, from the first post to the last rank's
// completion.
struct Operation {
  std::uint64_t seq = 0;
  std::vector<Call> calls;                       // per rank
  std::vector<bool> posted;                      // per rank
  int posted_count = 0;                          // guarded by DeviceCommunicator::mu_
  std::shared_ptr<const engine::ExecPlan> plan;  // set when all posted
  std::atomic<bool> ready{false};                // plan (or error) is set
  std::vector<engine::RankBuffers> buffers;      // per rank, set when all posted
  engine::OpSync sync;                           // step flags, error, signal
  // Stream tasks that reached the operation on their stream, and ranks whose
  // program is complete (sized nranks when the operation is created).
  std::atomic<int> arrived{0};
  std::unique_ptr<std::atomic<std::uint8_t>[]> task_arrived;
  std::unique_ptr<std::atomic<std::uint8_t>[]> rank_done;
  // When each rank's part ended (steady clock, ns; 0: not yet), for the
  // profiler's per-device tracks: its stream task saw its program complete
  // (inline engine), or the completion thread its done event (device).
  std::unique_ptr<std::atomic<std::int64_t>[]> rank_end_ns;
  // When each rank's part started (0: not known): the device engine's
  // internal stream reached it, its input ready (timed operations only).
  std::unique_ptr<std::atomic<std::int64_t>[]> rank_start_ns;
  static std::int64_t now_ns() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }
  void note_rank_end(int rank) { rank_end_ns[rank].store(now_ns(), std::memory_order_release); }
  std::atomic<int> finished{0};
  std::chrono::steady_clock::time_point deadline;
  // Inline engine: stream tasks about to arrive; the last one tells the
  // profiler the operation starts before it lets the others run it.
  std::atomic<int> arriving{0};

  // Device engine only.
  std::vector<engine::DeviceRank> device_ranks;  // input_ready recorded at post
  engine::DevicePools::Lease lease;              // guarded by DeviceCommunicator::enqueue_mu_
  std::atomic<bool> enqueued{false};
  // Set once a rank's in-flight count was released (completion callback,
  // or failure before the enqueue), so it is released exactly once.
  std::unique_ptr<std::atomic<std::uint8_t>[]> accounted;
  struct DoneArg {
    DeviceCommunicator* comm;
    Operation* op;
    int rank;
  };
  std::vector<DoneArg> done_args;
};

class DeviceCommunicator final : public CommunicatorBase {
 public:
  DeviceCommunicator(std::vector<wia_device_t> devices);
  ~DeviceCommunicator() override;
  DeviceCommunicator(const DeviceCommunicator&) = delete;
  DeviceCommunicator& operator=(const DeviceCommunicator&) = delete;

  int size() const override { return static_cast<int>(devices_.size()); }
  int node_rank(int) const override { return 0; }
  int local_rank(int rank) const override { return rank; }
  int node_count() const override { return 1; }
  Engine engine() const { return engine_; }
  int rank_of_device(wia_device_t device) const override;
  wia_device_t device_of_rank(int rank) const { return devices_[rank]; }

  // Validates and posts rank `rank`'s call on `stream`. Returns
  // WIA_ERROR_MISMATCH when this call completes a set that does not match
  // (every rank's stream gets the same error). Throws for bad arguments.
  wia_status_t post(int rank, Call call, wia_stream_s* stream) override;

  // Point-to-point (comm/point_to_point.cpp): the n-th send from rank a
  // to rank b matches the n-th receive on b from a. Counts and datatypes
  // must agree; a disagreement fails both sides. Non-blocking like post().
  void post_send(int rank, int peer, const void* buf, std::uint64_t count, wia_datatype_t dtype,
                 std::uint32_t timeout_ms, wia_stream_s* stream) override;
  void post_recv(int rank, int peer, void* buf, std::uint64_t count, wia_datatype_t dtype,
                 std::uint32_t timeout_ms, wia_stream_s* stream) override;

  // Waits until every posted operation has finished, at most twice the
  // collective timeout; false if some are still queued then (their streams
  // never reached them).
  bool drain() override;
  int in_flight() const override;

  wia_status_t async_error() const override;
  void record_async_error(wia_status_t status, const std::string& message);
  // Throws the first error any rank's internal stream reported, now or
  // earlier (device_engine.cpp).
  void check_internal_stream(int rank);
  // `rank`: the rank whose device failed, -1 when not known.
  void record_device_failure(wia_status_t status, const std::string& message, int rank = -1);
  // Adds the ranks whose device fails a query to the failed set.
  void note_broken_devices();
  // wia_comm_revoke: every operation not yet complete, and every later
  // one, fails with WIA_ERROR_ABORTED.
  void revoke();
  void check_revoked() const {
    if (revoked_.load(std::memory_order_acquire))
      throw Error(WIA_ERROR_ABORTED, "the communicator was revoked (wia_comm_revoke)");
  }
  // Ranks whose device reported a failure, or that wia_report_failure named.
  std::vector<int> failed_ranks() const override;
  void report_failed(int rank) override;
  // What a shrink keeps (api_recovery.cpp): each rank's origin rank.
  void set_origin(std::vector<int> origin_of_rank, int origin_size);
  int origin_rank(int rank) const override {
    return origin_of_rank_.empty() ? rank : origin_of_rank_[static_cast<std::size_t>(rank)];
  }
  int origin_size() const override { return origin_of_rank_.empty() ? size() : origin_size_; }

  wia_algorithm_t last_selected() const override;

  // Communication profiling (docs/profiling.md): one record per collective
  // of the communicator, from the engine's start of it (every rank's stream
  // reached it: inline engine; it was put on the internal streams: device
  // engine) to its end on the last rank.
  CommProfiler* profiler() override { return &profiler_; }
  // 1, 2, ... in creation order among the process's device communicators.
  int index_in_process() const { return comm_index_; }
  // The cost model's slowest link between two ranks (GB/s), and the model.
  double slowest_link_gbps() const;
  tuner::LinkModel cost_model() const;
  // Waits until the profiler has the end of every collective whose work is
  // complete on the devices (the device engine's completion thread reports
  // it a little after the users' streams may see it); at most 1 s.
  void settle_profile();

 private:
  struct Message;
  // The work item a send or receive posts on its stream
  // (point_to_point.cpp); p2p_stream_task is the host function it runs as.
  struct P2pStreamTask;
  static void p2p_stream_task(void* arg);
  void run_p2p_stream_task(P2pStreamTask& g);
  // A delivered send or receive, for profiling (CommProfiler::record_beside).
  void record_p2p(const P2pStreamTask& g, const Message& m,
                  std::chrono::steady_clock::time_point started);
  void post_p2p(int rank, int peer, bool is_send, void* buf, std::uint64_t count,
                wia_datatype_t dtype, std::uint32_t timeout_ms, wia_stream_s* stream);
  std::uint32_t timeout_or_default(std::uint32_t ms) const { return ms ? ms : default_timeout_ms_; }
  // The work item a collective posts on a user's stream (a host
  // function: stream_task, or device_stream_task for the device engine).
  struct StreamTask {
    DeviceCommunicator* comm;
    std::shared_ptr<Operation> op;
    int rank;
    wia_stream_s* stream;
  };
  static void stream_task(void* arg);
  void run_stream_task(StreamTask& g);
  // Matching of a completed set: mismatch check, plan, buffers. Returns
  // the failure status (also recorded in op.sync) or WIA_SUCCESS.
  wia_status_t complete_set(Operation& op);
  std::shared_ptr<Operation> new_operation(std::uint64_t seq) const;
  // Puts `fn` (stream_task or device_stream_task) for `rank` of `op` on the user's
  // stream; on failure, fails the operation for its peers and throws.
  void launch_stream_task(wia_host_fn_t fn, const std::shared_ptr<Operation>& op, int rank,
                          wia_stream_s* stream);
  // Device engine (comm/device_engine.cpp).
  void init_device_engine();
  void shutdown_device_engine() noexcept;
  wia_status_t post_device(int rank, Call call, wia_stream_s* stream);
  void attach_to_stream(const std::shared_ptr<Operation>& op, int rank, wia_stream_s* stream);
  void enqueue_ready_ops();     // holds enqueue_mu_
  void reclaim_finished_ops();  // holds enqueue_mu_
  void release_rank(Operation& op, int rank);
  static void device_rank_done(void* arg);
  static void device_rank_started(void* arg);  // the profiler's rank start
  void completion_loop();
  static void device_stream_task(void* arg);
  void run_device_stream_task(StreamTask& g);
  std::shared_ptr<const engine::ExecPlan> plan_for(const Operation& op);
  std::string describe_mismatch(const Operation& op) const;
  void* scratch_for(int rank, std::uint64_t bytes);
  static void stage_input(const coll::Schedule& s, int rank, engine::RankBuffers& mine,
                          std::vector<char>& staged);

  std::vector<wia_device_t> devices_;
  Engine engine_ = Engine::kInline;
  bool all_host_accessible_ = true;
  bool oversubscribed_ = false;
  int workers_ = 1;
  bool tmp_patient_ = false;  // threads that execute an operation: min(ranks, cores)
  std::uint32_t default_timeout_ms_ = 0;

  mutable std::mutex mu_;
  std::vector<std::uint64_t> next_seq_;                      // per rank, guarded by mu_
  std::map<std::uint64_t, std::shared_ptr<Operation>> ops_;  // guarded by mu_
  engine::PlanCache plans_;                                  // guarded by mu_
  tuner::Selector selector_;                                 // guarded by mu_
  std::vector<std::atomic<std::uint64_t>> completed_;        // per rank: ops done
  engine::ProgressSignal completion_signal_;
  // Point-to-point state, guarded by mu_: messages by (src, dst, n), and
  // how many sends/receives each ordered pair has posted.
  std::map<std::tuple<int, int, std::uint64_t>, std::shared_ptr<Message>> messages_;
  std::map<std::pair<int, int>, std::uint64_t> sends_posted_, recvs_posted_;
  engine::ProgressSignal p2p_signal_;
  std::atomic<int> in_flight_{0};

  // Per-rank scratch, grown on demand, reused across operations (a rank's
  // operations run one at a time, and a rank finishes an operation only
  // after its peers consumed everything it sent).
  std::vector<void*> scratch_;
  std::vector<std::uint64_t> scratch_size_;

  // Device engine state: per-rank internal streams, which receiver reads
  // which sender directly, pooled events and buffers, and the operations
  // enqueued in sequence order (an operation is enqueued only after every
  // earlier one, so each rank's stream sees them in posting order).
  std::vector<wia_provider_stream_t> internal_streams_;
  engine::PeerMatrix direct_;
  std::unique_ptr<engine::DevicePools> pools_;
  std::mutex enqueue_mu_;
  std::uint64_t next_enqueue_seq_ = 0;                                // guarded by enqueue_mu_
  std::map<std::uint64_t, std::shared_ptr<Operation>> complete_ops_;  // guarded by enqueue_mu_
  std::deque<std::shared_ptr<Operation>> running_ops_;                // guarded by enqueue_mu_
  // Completion of the enqueued work: one thread waits for each rank's done
  // event in enqueue order (event_synchronize, outside any stream) and then
  // signals the rank. Not a host function at the end of the internal
  // streams: a driver that runs every host function of the process on one
  // thread (CUDA does) would queue it behind a user stream's task that is
  // waiting for exactly that signal, and both would wait out the timeout.
  std::thread completion_thread_;
  std::mutex completion_mu_;
  std::condition_variable completion_cv_;
  std::deque<std::pair<std::shared_ptr<Operation>, int>> completion_queue_;  // completion_mu_
  bool completion_stop_ = false;                                             // completion_mu_
  bool completion_busy_ = false;  // completion_mu_: an entry is taken and not yet reported

  mutable std::mutex err_mu_;
  wia_status_t async_error_ = WIA_SUCCESS;
  // The first error a rank's internal stream reported: sticky.
  wia_status_t device_failure_ = WIA_SUCCESS;
  std::string device_failure_message_;
  std::set<int> failed_ranks_;  // err_mu_
  std::atomic<bool> revoked_{false};
  std::vector<int> origin_of_rank_;
  int origin_size_ = 0;
  wia_algorithm_t last_selected_{};

  // Profiling: a collective's start is reported by whoever starts it on
  // the engine (record_start), its end by whoever sees the last rank done
  // (record_end).
  void record_start(const Operation& op);
  void record_end(const Operation& op);
  CommProfiler profiler_;
  int comm_index_ = 0;
  // What the profile names as the collectives' transport: "host" for the
  // inline engine (the core's threads copy in host memory), the devices'
  // provider for the device engine. Static storage (intern_transport).
  const char* transport_ = "host";
};

}  // namespace wia::comm
