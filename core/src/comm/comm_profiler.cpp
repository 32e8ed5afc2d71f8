// SPDX-License-Identifier: Apache-2.0
#include "comm/comm_profiler.hpp"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <set>

#include "common/thread_sanitizer.hpp"

namespace wia::comm {

namespace {
// Intervals kept for the overlap analysis; the statistics keep every
// timed call.
constexpr std::size_t kMaxIntervals = 1u << 20;

// UnrecordedOnThisThread: this thread's flag (CommProfiler::
// unrecorded_threads_ counts the threads that have it set, so that posting
// reads thread-local storage only while one does).
thread_local bool t_unrecorded = false;

// The kinds of operation numbered so far (CommProfiler::kind_id), for the
// process: a name's number is the same on every communicator. Looked up by
// the name's address first: every address seen so far (the same name
// from several call sites has several) with its kind.
std::mutex g_kinds_mu;
std::array<std::atomic<const char*>, CommProfiler::kMaxKinds> g_kind_names{};
std::atomic<std::uint32_t> g_kinds_used{0};
constexpr std::size_t kMaxAddresses = 4 * CommProfiler::kMaxKinds;
std::array<std::atomic<const char*>, kMaxAddresses> g_addresses{};
std::array<std::atomic<std::uint32_t>, kMaxAddresses> g_address_kinds{};
std::atomic<std::uint32_t> g_addresses_used{0};
}  // namespace

CommProfiler::UnrecordedOnThisThread::UnrecordedOnThisThread() : was_(t_unrecorded) {
  t_unrecorded = true;
  unrecorded_threads_.fetch_add(1);
}
CommProfiler::UnrecordedOnThisThread::~UnrecordedOnThisThread() {
  t_unrecorded = was_;
  unrecorded_threads_.fetch_sub(1);
}

CommProfiler::CommProfiler() {
  ops_index_.fill(-1);
  if (const char* path = std::getenv("WIA_TRACE"); path != nullptr && *path != '\0') {
    trace_at_destroy_ = path;
    traced_always_ = true;
  }
}

void CommProfiler::enable(const wia_comm_profiling_t& settings, std::uint32_t sample_every) {
  std::lock_guard lock(mu_);
  settings_ = settings;
  sample_every_.store(std::max<std::uint32_t>(1, sample_every), std::memory_order_relaxed);
  // The next operation of each kind goes through posted(), which sets
  // the gap for this sample_every.
  for (Kind& k : kinds_) k.countdown.store(1, std::memory_order_relaxed);
  // Off, no operation wrote its word: clear what finished while off left,
  // so that an operation posted before enabling never meets a stale word.
  if (!on_.load())
    for (auto& w : ring_) w.store(0, std::memory_order_relaxed);
  on_.store(true);
}

void CommProfiler::reset() {
  std::lock_guard lock(mu_);
  // An operation counts in the window it ends in. A timed one posted
  // before now is counted but not timed when it ends (finished_timed
  // compares its epoch): its start belongs to the old window. The ring is
  // not cleared: an operation posted between the bump and a clearing
  // would be lost.
  epoch_.fetch_add(1, std::memory_order_relaxed);
  for (Kind& k : kinds_) {
    k.count_at_reset = k.count.load(std::memory_order_relaxed);
    k.bytes_at_reset = k.bytes.load(std::memory_order_relaxed);
    k.posted.store(0, std::memory_order_relaxed);  // the first ones are timed again
    k.countdown.store(1, std::memory_order_relaxed);
    k.rng.store(0, std::memory_order_relaxed);  // and the same gaps as on the other ranks
  }
  ops_index_.fill(-1);
  ops_.clear();
  intervals_.clear();
  trace_.clear();
  trace_dropped_ = 0;
  window_start_ = Clock::now();
  last_end_ns_.store(0, std::memory_order_relaxed);
}

std::uint32_t CommProfiler::kind_id(const char* op) {
  std::uint32_t used = g_addresses_used.load(std::memory_order_acquire);
  for (std::uint32_t i = 0; i < used; ++i)
    if (g_addresses[i].load(std::memory_order_relaxed) == op)
      return g_address_kinds[i].load(std::memory_order_relaxed);
  std::lock_guard lock(g_kinds_mu);  // a new address: a handful per process
  used = g_addresses_used.load(std::memory_order_relaxed);
  for (std::uint32_t i = 0; i < used; ++i)
    if (g_addresses[i].load(std::memory_order_relaxed) == op)
      return g_address_kinds[i].load(std::memory_order_relaxed);
  std::uint32_t kind = 0;
  const std::uint32_t kinds = g_kinds_used.load(std::memory_order_relaxed);
  while (kind < kinds && std::strcmp(g_kind_names[kind].load(std::memory_order_relaxed), op) != 0)
    ++kind;
  if (kind == kMaxKinds) return kMaxKinds;
  if (kind == kinds) {
    g_kind_names[kind].store(op, std::memory_order_relaxed);
    g_kinds_used.store(kind + 1, std::memory_order_release);
  }
  if (used < kMaxAddresses) {  // else looked up by name every time: still right
    g_addresses[used].store(op, std::memory_order_relaxed);
    g_address_kinds[used].store(kind, std::memory_order_relaxed);
    g_addresses_used.store(used + 1, std::memory_order_release);
  }
  return kind;
}

const char* CommProfiler::kind_name(std::uint32_t kind) {
  return kind < g_kinds_used.load(std::memory_order_acquire)
             ? g_kind_names[kind].load(std::memory_order_relaxed)
             : "";
}

std::uint32_t CommProfiler::next_gap(std::uint32_t kind, std::uint64_t every) {
  // A random gap of 1 .. 2 every - 1 (mean `every`): a fixed stride would
  // see only one size of a workload that repeats every `every` calls. The
  // same gaps on every rank (seeded from the kind's name, again at each
  // reset): ranks that post the same collectives in the same order time
  // the same calls, so that a timed call's extra work delays a collective
  // once, not once per rank that times it at a different call (the ranks
  // of a small collective wait for each other), and the job-wide summary
  // compares the same calls.
  Kind& k = kinds_[kind];
  std::uint64_t x = k.rng.load(std::memory_order_relaxed);
  if (x == 0) {
    x = 0xcbf29ce484222325ull;  // FNV-1a of the name
    for (const char* c = kind_name(kind); *c != '\0'; ++c)
      x = (x ^ static_cast<unsigned char>(*c)) * 0x100000001b3ull;
    if (x == 0) x = 0x9e3779b97f4a7c15ull;
  }
  x ^= x << 13;
  x ^= x >> 7;
  x ^= x << 17;
  k.rng.store(x, std::memory_order_relaxed);
  return static_cast<std::uint32_t>(1 + x % (2 * every - 1));
}

void CommProfiler::store_details(Details& to, const Details& d) {
  std::atomic_ref(to.bytes).store(d.bytes, std::memory_order_relaxed);
  std::atomic_ref(to.posted_ns).store(d.posted_ns, std::memory_order_relaxed);
  std::atomic_ref(to.busbw_factor).store(d.busbw_factor, std::memory_order_relaxed);
  std::atomic_ref(to.algorithm).store(d.algorithm, std::memory_order_relaxed);
  std::atomic_ref(to.transport).store(d.transport, std::memory_order_relaxed);
  std::atomic_ref(to.epoch).store(d.epoch, std::memory_order_relaxed);
  std::atomic_ref(to.prefix).store(d.prefix, std::memory_order_relaxed);
  std::atomic_ref(to.peer).store(d.peer, std::memory_order_relaxed);
  std::atomic_ref(to.dtype).store(d.dtype, std::memory_order_relaxed);
  std::atomic_ref(to.stream).store(d.stream, std::memory_order_relaxed);
}

CommProfiler::Details CommProfiler::load_details(const Details& from) {
  // atomic_ref of const T is C++26: the fields are only read here.
  Details& f = const_cast<Details&>(from);
  return Details{std::atomic_ref(f.bytes).load(std::memory_order_relaxed),
                 std::atomic_ref(f.posted_ns).load(std::memory_order_relaxed),
                 std::atomic_ref(f.busbw_factor).load(std::memory_order_relaxed),
                 std::atomic_ref(f.algorithm).load(std::memory_order_relaxed),
                 std::atomic_ref(f.transport).load(std::memory_order_relaxed),
                 std::atomic_ref(f.epoch).load(std::memory_order_relaxed),
                 std::atomic_ref(f.prefix).load(std::memory_order_relaxed),
                 std::atomic_ref(f.peer).load(std::memory_order_relaxed),
                 std::atomic_ref(f.dtype).load(std::memory_order_relaxed),
                 std::atomic_ref(f.stream).load(std::memory_order_relaxed)};
}

void CommProfiler::posted(std::uint64_t seq, std::uint32_t kind, std::uint64_t bytes,
                          double busbw_factor, const char* algorithm, const char* transport,
                          std::int32_t peer, wia_datatype_t dtype, std::uint32_t stream) {
  if (!on()) return;
  std::atomic<std::uint64_t>& word = ring_[seq % kRing];
  if (kind >= kMaxKinds ||
      (unrecorded_threads_.load(std::memory_order_relaxed) != 0 && t_unrecorded)) {
    word.store(0, std::memory_order_relaxed);  // finished() finds no word of this seq
    return;
  }
  Kind& k = kinds_[kind];
  // The sampling decision: every one of the first kTimedFirst of the
  // window (or every one at all), then one after each random gap. A call
  // too large for the word's bytes field is timed too.
  bool prefix = true;
  const std::uint64_t every = sample_every_.load(std::memory_order_relaxed);
  if (every > 1 && !traced_always_) {
    const std::uint64_t n = k.posted.load(std::memory_order_relaxed);
    k.posted.store(n + 1, std::memory_order_relaxed);
    if (n + 1 >= kTimedFirst) {
      const std::uint32_t left = k.countdown.load(std::memory_order_relaxed);
      if (n >= kTimedFirst && left > 1 && bytes > kWordBytesMask) {
        prefix = false;  // between two samples, timed for its size: the gap goes on
      } else {
        prefix = n < kTimedFirst;
        k.countdown.store(next_gap(kind, every), std::memory_order_relaxed);
      }
    }
  }
  // Marked as being written first, so that a reader of the operation
  // 4096 earlier that raced with this one sees the change (seqlock).
  word.store(0, std::memory_order_relaxed);
#if !WIA_THREAD_SANITIZER  // (no fences under TSan, common/thread_sanitizer.hpp)
  std::atomic_thread_fence(std::memory_order_release);
#endif
  store_details(details_[seq % kRing],
                Details{bytes, ns_of(Clock::now()), busbw_factor, algorithm, transport,
                        epoch_.load(std::memory_order_relaxed), prefix ? 1u : 0u, peer,
                        static_cast<std::int32_t>(dtype), stream});
  word.store(word_of(seq, kind, bytes, true), std::memory_order_release);
}

void CommProfiler::note_end_before_timed() {
  last_end_ns_.store(ns_of(Clock::now()), std::memory_order_relaxed);
}

void CommProfiler::finished_timed(std::uint64_t seq, std::uint64_t word, const char* algorithm,
                                  const char* transport, RankEnds rank_ends, const char* peers) {
  if (!on()) return;
  const Details d = load_details(details_[seq % kRing]);
  const Clock::time_point now = Clock::now();
  // Overwritten while read by an operation 4096 later: drop this one.
#if WIA_THREAD_SANITIZER  // an acquire load in place of the fence
  if (ring_[seq % kRing].load(std::memory_order_acquire) != word) return;
#else
  std::atomic_thread_fence(std::memory_order_acquire);
  if (ring_[seq % kRing].load(std::memory_order_relaxed) != word) return;
#endif
  const auto kind = static_cast<std::uint32_t>((word >> kWordKindShift) & kWordKindMask);
  if (d.epoch == epoch_.load(std::memory_order_relaxed)) {
    record_timed(kind, d, now, algorithm, transport, rank_ends, peers);
  } else if (on_.load(std::memory_order_relaxed)) {
    count(kind, d.bytes);  // posted before a reset: counted, as an untimed one, not timed
  }
}

CommProfiler::OpStats& CommProfiler::ops_entry(std::uint32_t kind) {
  std::int16_t& i = ops_index_[kind];
  if (i < 0) {
    i = static_cast<std::int16_t>(ops_.size());
    ops_.emplace_back();
    ops_.back().name = kind_name(kind);
  }
  return ops_[static_cast<std::size_t>(i)];
}

void CommProfiler::record_timed(std::uint32_t kind, const Details& d, Clock::time_point now,
                                const char* algorithm, const char* transport,
                                RankEnds rank_ends, const char* peers) {
  std::lock_guard lock(mu_);
  // Operations run one after another: one queued behind another starts
  // when that one ends, not when it was posted.
  const Clock::time_point last_end{std::chrono::nanoseconds(last_end_ns_.load())};
  auto start = std::max(Clock::time_point{std::chrono::nanoseconds(d.posted_ns)}, last_end);
  // A device communicator's collective starts when its last rank's part
  // can (the device engine: its inputs are ready), not when it was queued.
  auto rank_start = [&](int r) {
    const std::int64_t ns =
        rank_ends.start_ns != nullptr ? rank_ends.start_ns[r].load(std::memory_order_acquire) : 0;
    return Clock::time_point{std::chrono::nanoseconds(ns)};
  };
  for (int r = 0; r < rank_ends.count; ++r) start = std::max(start, std::min(rank_start(r), now));
  last_end_ns_.store(ns_of(now), std::memory_order_relaxed);
  const char* const algo = d.algorithm != nullptr ? d.algorithm : algorithm;
  const char* const via = d.transport != nullptr ? d.transport : transport;
  const TraceEvent event{start,     now,    kind_name(kind), algo != nullptr ? algo : "",
                         via != nullptr ? via : "", d.bytes, d.peer, -1, d.stream,
                         peers != nullptr ? peers : ""};
  push_trace(event);
  // A device communicator's collective as each rank saw it: from the
  // collective's start to that rank's end, on the rank's device's track.
  for (int r = 0; r < rank_ends.count; ++r) {
    const std::int64_t end_ns = rank_ends.ns[r].load(std::memory_order_acquire);
    if (end_ns == 0) continue;
    TraceEvent mine = event;
    const Clock::time_point own_start = rank_start(r);
    if (own_start != Clock::time_point{}) mine.start = std::min(own_start, start);
    mine.end = std::clamp(Clock::time_point{std::chrono::nanoseconds(end_ns)}, mine.start, now);
    mine.track = r;
    push_trace(mine);
  }
  if (!on_.load(std::memory_order_relaxed)) return;  // the timeline only (WIA_TRACE)
  const double s = std::chrono::duration<double>(now - start).count();
  OpStats& o = ops_entry(kind);
  // Prefix calls come first (the first of their kind in the window); one
  // that ends after a sampled one, from racing posting threads, counts as
  // sampled.
  if (d.prefix != 0 && o.prefix == o.seconds.size()) ++o.prefix;
  o.seconds.push_back(s);
  const double algbw = s > 0 ? static_cast<double>(d.bytes) / s / 1e9 : 0.0;
  o.algbw_gbps.push_back(algbw);
  o.busbw_gbps.push_back(algbw * d.busbw_factor);
  o.call_bytes.push_back(d.bytes);
  o.call_algorithm.push_back(algo != nullptr ? algo : "");
  o.call_transport.push_back(via != nullptr ? via : "");
  o.call_dtype.push_back(static_cast<wia_datatype_t>(d.dtype));
  if (algo != nullptr) o.algorithm = algo;
  if (via != nullptr) o.transport = via;
  if (intervals_.size() < kMaxIntervals) intervals_.push_back({start, now});
  count(kind, d.bytes);  // under the lock: a snapshot sees the call with its time
}

void CommProfiler::record_beside(const char* op, std::uint64_t bytes, Clock::time_point start,
                                 Clock::time_point end, const char* algorithm,
                                 const char* transport, std::int32_t peer, std::int32_t rank,
                                 wia_datatype_t dtype) {
  if (!on()) return;
  const std::uint32_t kind = kind_id(op);
  if (kind == kMaxKinds) return;
  const char* const algo = algorithm != nullptr ? algorithm : "";
  const char* const via = transport != nullptr ? transport : "";
  std::lock_guard lock(mu_);
  push_trace({start, end, op, algo, via, bytes, peer, rank});
  if (!on_.load(std::memory_order_relaxed)) return;  // the timeline only (WIA_TRACE)
  OpStats& o = ops_entry(kind);
  const double s = std::chrono::duration<double>(end - start).count();
  const double algbw = s > 0 ? static_cast<double>(bytes) / s / 1e9 : 0.0;
  if (o.prefix == o.seconds.size()) ++o.prefix;  // every one timed
  o.seconds.push_back(s);
  o.algbw_gbps.push_back(algbw);
  o.busbw_gbps.push_back(algbw);  // point to point: factor 1
  o.call_bytes.push_back(bytes);
  o.call_algorithm.push_back(algo);
  o.call_transport.push_back(via);
  o.call_dtype.push_back(dtype);
  o.algorithm = algo;
  o.transport = via;
  count(kind, bytes);  // under the lock
}

void CommProfiler::push_trace(const TraceEvent& e) {
  if (trace_.size() < kMaxTraceEvents) {
    if (trace_.capacity() == 0) trace_.reserve(1024);
    trace_.push_back(e);
  } else {
    ++trace_dropped_;
  }
}

CommProfiler::Snapshot CommProfiler::snapshot() const {
  std::lock_guard lock(mu_);
  Snapshot s{ops_, intervals_, window_start_, settings_,
             sample_every_.load(std::memory_order_relaxed)};
  // The exact counts; a kind counted and never timed (a window that began
  // with disable and enable) reports its count with no times.
  for (std::uint32_t i = 0; i < kMaxKinds; ++i) {
    const Kind& k = kinds_[i];
    const std::uint64_t calls = k.count.load(std::memory_order_relaxed) - k.count_at_reset;
    if (calls == 0) continue;
    const char* name = kind_name(i);
    auto it =
        std::find_if(s.ops.begin(), s.ops.end(), [&](const OpStats& o) { return o.name == name; });
    if (it == s.ops.end()) {
      s.ops.emplace_back();
      s.ops.back().name = name;
      it = s.ops.end() - 1;
    }
    it->count = calls;
    it->bytes = k.bytes.load(std::memory_order_relaxed) - k.bytes_at_reset;
  }
  return s;
}

CommProfiler::Trace CommProfiler::trace() const {
  std::lock_guard lock(mu_);
  return Trace{trace_, trace_dropped_,
               traced_always_ ? 1u : sample_every_.load(std::memory_order_relaxed),
               window_start_};
}

const char* CommProfiler::intern_transport(const std::string& name) {
  // Never freed: reports and profilers of destroyed communicators point here.
  static auto* mu = new std::mutex();
  static auto* names = new std::set<std::string>();
  std::lock_guard lock(*mu);
  return names->insert(name).first->c_str();
}

}  // namespace wia::comm
