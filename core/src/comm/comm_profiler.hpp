// SPDX-License-Identifier: Apache-2.0
// What wia_enable_comm_profiling records for a process communicator: each
// operation's start (its turn, or its posting when later) and end, its
// collective, bytes, chosen algorithm and transport, as statistics and as
// a bounded timeline (wia_profile_write_trace; WIA_TRACE records the
// timeline alone). Off, it costs one relaxed load and one flag read per
// operation; on, two clock reads and a lock at completion (a ring of
// pending operations; statistics keyed by the static name of the
// collective; per-call vectors and the timeline grow by appending).
#pragma once

#include <wia/wia.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

namespace wia::comm {

class CommProfiler {
 public:
  using Clock = std::chrono::steady_clock;
  struct Interval {
    Clock::time_point start, end;
  };
  struct OpStats {
    const char* name = "";           // static storage (coll::collective_name, "send", "recv")
    std::vector<double> seconds;     // one per call
    std::vector<double> algbw_gbps;  // bytes / time, per call
    std::vector<double> busbw_gbps;  // algbw * the bus factor, per call
    std::vector<std::uint64_t> call_bytes;  // per call (the suggestions cost them)
    std::vector<const char*> call_algorithm;  // per call, static storage ("" unknown)
    std::vector<const char*> call_transport;  // per call, as `transport`
    std::vector<wia_datatype_t> call_dtype;   // per call (the compression suggestion)
    std::uint64_t bytes = 0;
    const char* algorithm = "";  // static storage (coll::algorithm_name)
    const char* transport = "";  // static storage (intern_transport): the last call's
  };
  // One operation on the timeline (wia_profile_write_trace, WIA_TRACE).
  struct TraceEvent {
    Clock::time_point start, end;
    const char* name;       // as OpStats::name
    const char* algorithm;  // static storage
    const char* transport;  // static storage
    std::uint64_t bytes;
    std::int32_t peer;  // point to point: the other rank; collectives: -1
  };
  struct Trace {
    std::vector<TraceEvent> events;  // in end order (and start order: operations run in turn)
    std::uint64_t dropped = 0;       // operations that ended with the buffer full
  };
  // Events kept: 65536 (about 3.5 MiB). Later operations are counted as
  // dropped, not recorded: the start of a run is kept whole.
  static constexpr std::size_t kMaxTraceEvents = 1u << 16;

  struct Snapshot {
    std::vector<OpStats> ops;
    std::vector<Interval> intervals;  // every operation's, in end order
    Clock::time_point window_start;
    wia_comm_profiling_t settings{};
  };

  // WIA_TRACE (read once per communicator, here): when set, the timeline
  // is recorded from creation on, whatever enable/disable say.
  CommProfiler();
  // Whether operations are to be reported to posted()/finished(): profiling
  // enabled, or the timeline always on.
  bool on() const { return on_.load(std::memory_order_relaxed) || traced_always_; }
  // The WIA_TRACE pattern this communicator writes at destroy ("" = none).
  const std::string& trace_at_destroy() const { return trace_at_destroy_; }
  // Whether this profiler counts in the API's "time host functions" switch
  // (overlap analysis on); set by the API only.
  std::atomic<bool> counts_compute{false};
  void enable(const wia_comm_profiling_t& settings);
  void disable() { on_.store(false); }
  void reset();
  // While one lives, operations the constructing thread posts are not
  // recorded (statistics and timeline) on any communicator: the all-gathers
  // of wia_get_comm_profile_job, which are the profiler's, not the
  // application's.
  class UnrecordedOnThisThread {
   public:
    UnrecordedOnThisThread();
    ~UnrecordedOnThisThread();
    UnrecordedOnThisThread(const UnrecordedOnThisThread&) = delete;
    UnrecordedOnThisThread& operator=(const UnrecordedOnThisThread&) = delete;

   private:
    bool was_;
  };
  // busbw_factor: nccl-tests' bus bandwidth factor of the collective.
  // `algorithm` (static storage), when set, is what the report shows for
  // this operation instead of finished()'s (point to point: its path);
  // `transport` likewise (point to point: its link's, known when posted);
  // `peer`: point to point's other rank, for the timeline; `dtype`: the
  // elements' type (the compression suggestion looks for float data).
  void posted(std::uint64_t seq, const char* op, std::uint64_t bytes, double busbw_factor,
              const char* algorithm = nullptr, const char* transport = nullptr,
              std::int32_t peer = -1, wia_datatype_t dtype = WIA_UINT8);
  // `transport`: the links the operation used ("shm", "shm+tcp",
  // "windows", "host"; static storage), unless posted() named them.
  void finished(std::uint64_t seq, const char* algorithm, const char* transport = nullptr);
  Snapshot snapshot() const;
  Trace trace() const;

  // A transport name, or several joined by '+', in storage that lives as
  // long as the process (a report may outlive the communicator). Thread
  // safe; callers cache the result, it takes a lock.
  static const char* intern_transport(const std::string& name);

 private:
  struct Pending {
    const char* op;
    std::uint64_t bytes;
    double busbw_factor;
    Clock::time_point posted;
    const char* algorithm;
    const char* transport;
    std::int32_t peer;
    wia_datatype_t dtype;
  };
  std::atomic<bool> on_{false};
  std::string trace_at_destroy_;
  bool traced_always_ = false;  // set once, in the constructor
  mutable std::mutex mu_;
  wia_comm_profiling_t settings_{};
  Clock::time_point window_start_ = Clock::now();
  Clock::time_point last_end_{};
  // Operations posted and not finished, by sequence number modulo the
  // ring's size: one still pending when 4096 later ones have been posted
  // is not counted (docs/profiling.md).
  static constexpr std::size_t kRing = 4096;
  struct Slot {
    std::atomic<std::uint64_t> seq_plus_one{0};
    Pending p{};
  };
  std::vector<Slot> ring_ = std::vector<Slot>(kRing);
  std::vector<OpStats> ops_;
  std::vector<Interval> intervals_;
  std::vector<TraceEvent> trace_;  // reserved lazily, up to kMaxTraceEvents
  std::uint64_t trace_dropped_ = 0;
};

}  // namespace wia::comm
