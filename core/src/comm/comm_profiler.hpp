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
// read, no lookup, no thread-local access and no read-modify-write: inline,
// a counter decrement and one 8-byte store when posted, two loads and two
// counter stores when it ends; a timed one costs two clock reads and a
// lock.
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
    std::int32_t track = -1;  // -1: the communicator's; r: rank r's device (record_beside,
                              // and a device communicator's collective as rank r saw it)
    std::uint32_t stream = 0;  // wia_stream_s::track() it was posted on; 0: none known
    const char* peers = "";    // a collective's: the ranks it exchanged with ("1,3")
  };
  // Each rank's start and end of a device communicator's collective
  // (steady clock, ns; 0: not seen), for one event per rank on its
  // device's track. A collective starts no earlier than its last rank.
  struct RankEnds {
    const std::atomic<std::int64_t>* start_ns;  // nullptr: none known
    const std::atomic<std::int64_t>* ns;
    int count;
  };
  struct Trace {
    std::vector<TraceEvent> events;  // in end order (and start order: operations run in turn)
    std::uint64_t dropped = 0;       // operations that ended with the buffer full
    std::uint32_t sample_every = 1;  // events are the timed operations only when > 1
    Clock::time_point window_start;  // of the statistics (wia_reset_comm_profile)
  };
  // Events kept: 65536 (about 3.5 MiB). Later operations are counted as
  // dropped, not recorded: the start of a run is kept whole.
  static constexpr std::size_t kMaxTraceEvents = 1u << 16;
  // Kinds of operation one profiler tells apart (collectives and the
  // point-to-point names: about 15 in use, numbered for the whole
  // process: kind_id); more are not recorded.
  static constexpr std::size_t kMaxKinds = 32;  // <= 128: the ring word's kind field
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
  // Kinds of operation ("allreduce", "send", ...) are numbered once for
  // the process, by name (the same text from two call sites is one kind),
  // so that a call site resolves its kind once (a static) and posting does
  // no lookup. kMaxKinds when that many are numbered already: not recorded.
  static std::uint32_t kind_id(const char* op);
  // The name of kind `kind` (static storage; the first spelling numbered).
  static const char* kind_name(std::uint32_t kind);

  // Posting operation `seq` of kind `kind` (kind_id) and `bytes`: the fast
  // path, inline, for the operations that are only counted (not timed).
  // True when it recorded the operation (or there was nothing to record);
  // false when the caller must call posted() below with the details, which
  // decides whether it is timed. Costs a counter decrement and one 8-byte
  // store: no lookup, no lock, no clock read, no read-modify-write. Call
  // it only when on().
  bool post_counted(std::uint64_t seq, std::uint32_t kind, std::uint64_t bytes) {
    if (kind >= kMaxKinds) return true;
    Kind& k = kinds_[kind];
    const std::uint32_t left = k.countdown.load(std::memory_order_relaxed);
    if (left <= 1 || bytes > kWordBytesMask ||
        unrecorded_threads_.load(std::memory_order_relaxed) != 0)
      return false;  // the one to time, the first ones, a huge call, or maybe not to record
    k.countdown.store(left - 1, std::memory_order_relaxed);
    ring_[seq % kRing].store(word_of(seq, kind, bytes, false), std::memory_order_release);
    return true;
  }
  // The rest of posting, after post_counted() said false (or in place of
  // it): the sampling decision and, for a timed operation, its details.
  // busbw_factor: nccl-tests' bus bandwidth factor of the collective.
  // `algorithm` (static storage), when set, is what the report shows for
  // this operation instead of finished()'s (point to point: its path);
  // `transport` likewise (point to point: its link's, known when posted);
  // `peer`: point to point's other rank, for the timeline; `dtype`: the
  // elements' type (the compression suggestion looks for float data).
  // May be called by several threads at once (each its own seq).
  // `stream`: the wia_stream_s::track() it was posted on (0: none), the
  // timeline's track.
  void posted(std::uint64_t seq, std::uint32_t kind, std::uint64_t bytes, double busbw_factor,
              const char* algorithm = nullptr, const char* transport = nullptr,
              std::int32_t peer = -1, wia_datatype_t dtype = WIA_UINT8, std::uint32_t stream = 0);
  // Both, for callers off the fast path (a device communicator): `op`'s
  // kind looked up on every call.
  void posted(std::uint64_t seq, const char* op, std::uint64_t bytes, double busbw_factor,
              const char* algorithm = nullptr, const char* transport = nullptr,
              std::int32_t peer = -1, wia_datatype_t dtype = WIA_UINT8) {
    if (!on()) return;
    const std::uint32_t kind = kind_id(op);
    if (!post_counted(seq, kind, bytes))
      posted(seq, kind, bytes, busbw_factor, algorithm, transport, peer, dtype, 0);
  }
  // The stream reached operation `seq`, posted behind other work on it: a
  // timed one starts no earlier than now (not at its posting), so the wait
  // for that work is neither its time nor overlap with it.
  void reached(std::uint64_t seq) {
    if (!timed(seq)) return;
    std::atomic_ref(details_[seq % kRing].posted_ns)
        .store(ns_of(Clock::now()), std::memory_order_relaxed);
  }
  // Whether operation `seq` is timed: its caller need only work out
  // finished()'s algorithm and transport then (nullptr otherwise).
  // Inline: it is on every operation's path.
  bool timed(std::uint64_t seq) const {
    const std::uint64_t w = ring_[seq % kRing].load(std::memory_order_acquire);
    return (w & ~kWordPayloadMask) == tag_of(seq) && (w & kWordTimed) != 0;
  }
  // `transport`: the links the operation used ("shm", "shm+tcp",
  // "windows", "host"; static storage), unless posted() named them.
  // Calls never overlap: operations of a communicator end one after
  // another, each before the next can end (the fast path relies on it).
  // Inline for an operation that is only counted: one load of its ring
  // word, two counters, and one load of the next operation's word.
  // `rank_ends`: a device communicator's per-rank ends; `peers`: a
  // collective's ranks it exchanged with, "1,3" (static storage); both
  // for the timeline only.
  void finished(std::uint64_t seq, const char* algorithm, const char* transport = nullptr,
                RankEnds rank_ends = {nullptr, nullptr, 0}, const char* peers = nullptr) {
    const std::uint64_t w = ring_[seq % kRing].load(std::memory_order_acquire);
    if ((w & ~kWordPayloadMask) != tag_of(seq)) return;  // posted while off, or 4096 before
    if ((w & kWordTimed) != 0)
      return finished_timed(seq, w, algorithm, transport, rank_ends, peers);
    if (!on_.load(std::memory_order_relaxed)) return;  // disabled since
    count(static_cast<std::uint32_t>((w >> kWordKindShift) & kWordKindMask), w & kWordBytesMask);
    // The next operation, when timed and already waiting, starts now.
    const std::uint64_t next = ring_[(seq + 1) % kRing].load(std::memory_order_relaxed);
    if ((next & ~kWordPayloadMask) == tag_of(seq + 1) && (next & kWordTimed) != 0)
      note_end_before_timed();
  }
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
  // Operations posted and not finished, by sequence number modulo the
  // ring's size, one 8-byte word each: the operation's bytes, kind,
  // whether it is timed, and a tag of its sequence number, so that a word
  // left by an operation posted 4096 (or any multiple of 4096 up to 2^27)
  // earlier is told apart. One still pending when 4096 later ones have
  // been posted is not counted (docs/profiling.md). A word is written by
  // its posting thread alone and read at the end: no lock and no
  // read-modify-write on either side; a single atomic word needs no
  // second look, only a timed operation's details do (a seqlock).
  static constexpr std::size_t kRing = 4096;
  static constexpr std::uint64_t kWordBytesMask = (std::uint64_t{1} << 40) - 1;
  static constexpr unsigned kWordKindShift = 40;
  static constexpr std::uint64_t kWordKindMask = 0x7f;  // kMaxKinds <= 128
  static constexpr std::uint64_t kWordTimed = std::uint64_t{1} << 47;
  static constexpr std::uint64_t kWordPayloadMask = (std::uint64_t{1} << 48) - 1;
  static_assert(kMaxKinds <= kWordKindMask + 1);
  // The tag of `seq`'s word: its ring cycle's 15 low bits, and a high bit
  // so that no tag is 0 (a word 0 is no operation's).
  static constexpr std::uint64_t tag_of(std::uint64_t seq) {
    return (((seq / kRing) & 0x7fff) | 0x8000) << 48;
  }
  static constexpr std::uint64_t word_of(std::uint64_t seq, std::uint32_t kind, std::uint64_t bytes,
                                         bool timed) {
    return tag_of(seq) | (timed ? kWordTimed : 0) |
           (static_cast<std::uint64_t>(kind) << kWordKindShift) | (bytes & kWordBytesMask);
  }
  // What a timed operation adds, at the same index as its word: written
  // and read for those only, every field through a relaxed
  // std::atomic_ref (store_details, load_details), so that the reader of
  // an operation racing with the one 4096 later that overwrites it reads
  // atomically and then sees, by its word's second look, that it lost.
  struct Details {
    std::uint64_t bytes;     // exact (the word's field holds 40 bits)
    std::int64_t posted_ns;  // steady clock
    double busbw_factor;
    const char* algorithm;
    const char* transport;
    std::uint32_t epoch;   // reset()s before it was posted
    std::uint32_t prefix;  // 1: timed as one of the first of its kind (OpStats::prefix)
    std::int32_t peer;
    std::int32_t dtype;  // wia_datatype_t
    std::uint32_t stream;  // TraceEvent::stream
  };
  static void store_details(Details& to, const Details& d);
  static Details load_details(const Details& from);
  // One kind of operation's exact counters. finished() is their only
  // writer (its calls never overlap), with plain stores; reset() does not
  // write them but moves the baselines, so an operation ending during a
  // reset is counted in one window or the other, never lost.
  struct Kind {
    std::atomic<std::uint64_t> count{0}, bytes{0};
    std::uint64_t count_at_reset = 0, bytes_at_reset = 0;  // under mu_
    // The sampling decision, at posting (racy between posting threads on
    // purpose: a lost update only moves the next sample). post_counted()
    // takes the fast path while countdown > 1, decrementing it; posted()
    // decides the others and sets it to the gap to the next timed one
    // (1: every one goes through posted(), the first ones and
    // sample_every 1).
    std::atomic<std::uint32_t> countdown{1};
    std::atomic<std::uint64_t> posted{0}, rng{0};  // posted()'s calls in the window
  };
  void count(std::uint32_t kind, std::uint64_t bytes) {
    // finished() is the only writer and its calls never overlap: plain
    // stores, no read-modify-write.
    Kind& k = kinds_[kind];
    k.count.store(k.count.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
    k.bytes.store(k.bytes.load(std::memory_order_relaxed) + bytes, std::memory_order_relaxed);
  }
  // The gap to the next timed operation of kind `kind`: 1 .. 2
  // sample_every - 1, the same sequence on every rank.
  std::uint32_t next_gap(std::uint32_t kind, std::uint64_t every);
  void finished_timed(std::uint64_t seq, std::uint64_t word, const char* algorithm,
                      const char* transport, RankEnds rank_ends, const char* peers);
  void record_timed(std::uint32_t kind, const Details& d, Clock::time_point end,
                    const char* algorithm, const char* transport, RankEnds rank_ends,
                    const char* peers);
  static std::int64_t ns_of(Clock::time_point t) {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
  }
  OpStats& ops_entry(std::uint32_t kind);  // under mu_
  void push_trace(const TraceEvent& e);    // under mu_: kept, or counted as dropped
  // Reads the clock at the end of an operation when the next one is timed
  // and already waits: it starts when this one ends.
  void note_end_before_timed();

  // Threads with an UnrecordedOnThisThread alive: posting looks at its
  // thread's flag only while one is.
  static inline std::atomic<int> unrecorded_threads_{0};
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
  std::vector<std::atomic<std::uint64_t>> ring_ = std::vector<std::atomic<std::uint64_t>>(kRing);
  std::vector<Details> details_ = std::vector<Details>(kRing);
  std::array<std::int16_t, kMaxKinds> ops_index_;  // kind -> ops_ (-1: none); under mu_
  std::vector<OpStats> ops_;                       // the timed calls' statistics (counts: kinds_)
  std::vector<Interval> intervals_;
  std::vector<TraceEvent> trace_;  // reserved lazily, up to kMaxTraceEvents
  std::uint64_t trace_dropped_ = 0;
};

}  // namespace wia::comm
