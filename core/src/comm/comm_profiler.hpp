// SPDX-License-Identifier: Apache-2.0
// What wia_enable_comm_profiling records for a communicator: each
// operation's collective and bytes, counted exactly, and for a sample of
// them (every one of the first kTimedFirst of each kind, then one in
// `sample_every` on average, at random gaps so that a periodic workload is
// not aliased) the start (its turn, or its posting when later), the end,
// the chosen algorithm and transport, as statistics and as a bounded
// timeline (wia_profile_write_trace; WIA_TRACE records every operation's
// timeline alone). Off, it costs one relaxed load and one flag read per
// operation. On, an operation that is not timed costs no lock, no clock
// read, no thread-local lookup and no read-modify-write: a few plain
// stores when posted and a few loads when it ends; a timed one costs two
// clock reads and a lock.
#pragma once

#include <wia/wia.h>

#include <array>
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
    const char* name = "";    // static storage (coll::collective_name, "send", "recv")
    std::uint64_t count = 0;  // every call ended in the window: exact
    std::uint64_t bytes = 0;  // every call's, summed: exact
    // Per timed call (all of them at sample_every 1):
    std::vector<double> seconds;              // one per timed call
    std::vector<double> algbw_gbps;           // bytes / time, per timed call
    std::vector<double> busbw_gbps;           // algbw * the bus factor, per timed call
    std::vector<std::uint64_t> call_bytes;    // per timed call (the suggestions cost them)
    std::vector<const char*> call_algorithm;  // per timed call, static storage ("" unknown)
    std::vector<const char*> call_transport;  // per timed call, as `transport`
    std::vector<wia_datatype_t> call_dtype;   // per timed call (the compression suggestion)
    const char* algorithm = "";  // static storage (coll::algorithm_name): the last timed call's
    const char* transport = "";  // static storage (intern_transport): the last timed call's
    // Timed calls that were timed because they were among the first
    // kTimedFirst of their kind (or every call is timed): the first
    // `prefix` entries of the vectors above; the others are a random
    // sample of the later calls.
    std::uint64_t prefix = 0;
    // How many calls timed call i stands for: 1 in the prefix, the later
    // calls over the later timed calls after it, so that a slow start
    // (the first calls set up connections) is not extrapolated. Times the
    // calls' times, it sums to the window's total; over i, to count.
    double weight_at(std::size_t i) const {
      const auto timed = static_cast<double>(seconds.size());
      if (timed == 0) return 0.0;
      const auto p = static_cast<double>(prefix), n = static_cast<double>(count);
      if (p >= timed) return n / timed;  // no later call timed yet: all alike
      return static_cast<double>(i) < p ? 1.0 : (n - p) / (timed - p);
    }
    // The window's time in these calls: exact at sample_every 1.
    double total_seconds() const {
      double t = 0;
      for (std::size_t i = 0; i < seconds.size(); ++i) t += weight_at(i) * seconds[i];
      return t;
    }
  };
  // One operation on the timeline (wia_profile_write_trace, WIA_TRACE).
  struct TraceEvent {
    Clock::time_point start, end;
    const char* name;       // as OpStats::name
    const char* algorithm;  // static storage
    const char* transport;  // static storage
    std::uint64_t bytes;
    std::int32_t peer;        // point to point: the other rank; collectives: -1
    std::int32_t track = -1;  // -1: the communicator's; r: rank r's device (record_beside)
  };
  struct Trace {
    std::vector<TraceEvent> events;  // in end order (and start order: operations run in turn)
    std::uint64_t dropped = 0;       // operations that ended with the buffer full
    std::uint32_t sample_every = 1;  // events are the timed operations only when > 1
  };
  // Events kept: 65536 (about 3.5 MiB). Later operations are counted as
  // dropped, not recorded: the start of a run is kept whole.
  static constexpr std::size_t kMaxTraceEvents = 1u << 16;
  // Kinds of operation one profiler tells apart (collectives and the
  // point-to-point names: about 15 in use); more are not recorded.
  static constexpr std::size_t kMaxKinds = 32;  // < 256: Pending::kind
  // Operations of each kind timed first in a window, whatever
  // sample_every says: a short window is timed whole.
  static constexpr std::uint64_t kTimedFirst = 16;

  struct Snapshot {
    std::vector<OpStats> ops;
    std::vector<Interval> intervals;  // every timed operation's, in end order
    Clock::time_point window_start;
    wia_comm_profiling_t settings{};
    std::uint32_t sample_every = 1;
  };

  // WIA_TRACE (read once per communicator, here): when set, the timeline
  // is recorded from creation on, whatever enable/disable say, and every
  // operation is timed.
  CommProfiler();
  // Whether operations are to be reported to posted()/finished(): profiling
  // enabled, or the timeline always on.
  bool on() const { return on_.load(std::memory_order_relaxed) || traced_always_; }
  // The WIA_TRACE pattern this communicator writes at destroy ("" = none).
  const std::string& trace_at_destroy() const { return trace_at_destroy_; }
  // Whether this profiler counts in the API's "time host functions" switch
  // (overlap analysis on); set by the API only.
  std::atomic<bool> counts_compute{false};
  // sample_every (config profiling.sample_every, >= 1): time every one of
  // the first kTimedFirst operations of each kind in the window, then
  // about one in sample_every; 1 = time every operation.
  void enable(const wia_comm_profiling_t& settings, std::uint32_t sample_every = 1);
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
  // May be called by several threads at once (each its own seq).
  void posted(std::uint64_t seq, const char* op, std::uint64_t bytes, double busbw_factor,
              const char* algorithm = nullptr, const char* transport = nullptr,
              std::int32_t peer = -1, wia_datatype_t dtype = WIA_UINT8);
  // Whether operation `seq` is timed: its caller need only work out
  // finished()'s algorithm and transport then (nullptr otherwise).
  // Inline: it is on every operation's path.
  bool timed(std::uint64_t seq) const {
    const Slot& slot = ring_[seq % kRing];
    return slot.seq_plus_one.load(std::memory_order_acquire) == seq + 1 && slot.p.timed;
  }
  // `transport`: the links the operation used ("shm", "shm+tcp",
  // "windows", "host"; static storage), unless posted() named them.
  // Calls never overlap: operations of a communicator end one after
  // another, each before the next can end (the fast path relies on it).
  void finished(std::uint64_t seq, const char* algorithm, const char* transport = nullptr);
  // An operation that runs beside the communicator's sequence, not in
  // it: a device communicator's send or receive, which the ranks' streams
  // run while collectives and other sends run. Timed by the caller
  // (`start`, `end`) and always (not sampled), counted and put on the
  // timeline on rank `rank`'s own track; not in the overlap analysis.
  // Takes the lock; any thread. `op` must not be a kind that posted()
  // and finished() record on this profiler (their counters are written
  // without a lock).
  void record_beside(const char* op, std::uint64_t bytes, Clock::time_point start,
                     Clock::time_point end, const char* algorithm, const char* transport,
                     std::int32_t peer, std::int32_t rank, wia_datatype_t dtype);
  Snapshot snapshot() const;
  Trace trace() const;

  // A transport name, or several joined by '+', in storage that lives as
  // long as the process (a report may outlive the communicator). Thread
  // safe; callers cache the result, it takes a lock.
  static const char* intern_transport(const std::string& name);

 private:
  // What counting an operation needs: written at every posting, read at
  // every end.
  struct Pending {
    std::uint64_t bytes;
    std::uint32_t epoch;  // reset()s before it was posted
    std::uint8_t kind;    // index into kinds_
    bool timed;
    bool prefix;  // timed as one of the first of its kind (OpStats::prefix)
  };
  // What a timed operation adds: written and read for those only.
  struct Details {
    const char* op;
    double busbw_factor;
    Clock::time_point posted;
    const char* algorithm;
    const char* transport;
    std::int32_t peer;
    wia_datatype_t dtype;
  };
  // One kind of operation's exact counters. finished() is their only
  // writer (its calls never overlap), with plain stores; reset() does not
  // write them but moves the baselines, so an operation ending during a
  // reset is counted in one window or the other, never lost.
  struct Kind {
    std::atomic<const char*> name{nullptr};
    std::atomic<std::uint64_t> count{0}, bytes{0};
    std::uint64_t count_at_reset = 0, bytes_at_reset = 0;  // under mu_
    // The sampling decision, at posting (racy between posting threads on
    // purpose: a lost update only moves the next sample).
    std::atomic<std::uint64_t> posted{0}, next_timed{0}, rng{0};
  };
  enum class Timing : std::uint8_t { kCounted, kSampled, kPrefix };
  Timing decide_timing(Kind& k);
  std::uint32_t kind_of(const char* op);  // kMaxKinds when full
  void count(const Pending& p);
  void record_timed(const Pending& p, const Details& d, Clock::time_point end,
                    const char* algorithm, const char* transport);
  // Reads the clock at the end of `seq` when the next operation is timed
  // and already waits: it starts when this one ends.
  void note_end_if_next_timed(std::uint64_t seq);

  std::atomic<bool> on_{false};
  std::string trace_at_destroy_;
  bool traced_always_ = false;  // set once, in the constructor
  std::atomic<std::uint32_t> sample_every_{1};
  std::atomic<std::uint32_t> epoch_{0};  // reset()s so far
  mutable std::mutex mu_;
  wia_comm_profiling_t settings_{};
  Clock::time_point window_start_ = Clock::now();
  // The end of the last operation whose end was timed (steady clock, ns).
  std::atomic<std::int64_t> last_end_ns_{0};
  std::array<Kind, kMaxKinds> kinds_{};
  std::atomic<std::uint32_t> kinds_used_{0};
  // Operations posted and not finished, by sequence number modulo the
  // ring's size: one still pending when 4096 later ones have been posted
  // is not counted (docs/profiling.md). A slot is written by its posting
  // thread alone and read, seqlock-style, at the end: no lock and no
  // read-modify-write on either side.
  static constexpr std::size_t kRing = 4096;
  // 24 bytes a slot: the ring's lines an 8-byte all-reduce loop cycles
  // through stay in the first-level cache; the timed operations' details
  // live apart, at the same index.
  struct Slot {
    std::atomic<std::uint64_t> seq_plus_one{0};  // 0 while being written
    Pending p{};
  };
  std::vector<Slot> ring_ = std::vector<Slot>(kRing);
  // Whether `p`, read from `slot`, is still operation seq's and of this
  // window (the seqlock's second look).
  bool still_posted(const Slot& slot, std::uint64_t seq, const Pending& p) const;
  std::vector<Details> details_ = std::vector<Details>(kRing);
  std::vector<OpStats> ops_;  // the timed calls' statistics (counts: kinds_)
  std::vector<Interval> intervals_;
  std::vector<TraceEvent> trace_;  // reserved lazily, up to kMaxTraceEvents
  std::uint64_t trace_dropped_ = 0;
};

}  // namespace wia::comm
