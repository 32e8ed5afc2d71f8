// SPDX-License-Identifier: Apache-2.0
#include "comm/comm_profiler.hpp"

#include <algorithm>
#include <cstdlib>
#include <set>

#include "common/thread_sanitizer.hpp"

namespace wia::comm {

namespace {
// Intervals kept for the overlap analysis; the statistics keep every
// timed call.
constexpr std::size_t kMaxIntervals = 1u << 20;

// UnrecordedOnThisThread: this thread's flag, and how many threads have it
// set, so that posting reads thread-local storage only while one does.
thread_local bool t_unrecorded = false;
std::atomic<int> g_unrecorded_threads{0};

std::int64_t ns_of(CommProfiler::Clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
}
}  // namespace

CommProfiler::UnrecordedOnThisThread::UnrecordedOnThisThread() : was_(t_unrecorded) {
  t_unrecorded = true;
  g_unrecorded_threads.fetch_add(1);
}
CommProfiler::UnrecordedOnThisThread::~UnrecordedOnThisThread() {
  t_unrecorded = was_;
  g_unrecorded_threads.fetch_sub(1);
}

CommProfiler::CommProfiler() {
  if (const char* path = std::getenv("WIA_TRACE"); path != nullptr && *path != '\0') {
    trace_at_destroy_ = path;
    traced_always_ = true;
  }
}

void CommProfiler::enable(const wia_comm_profiling_t& settings, std::uint32_t sample_every) {
  std::lock_guard lock(mu_);
  settings_ = settings;
  sample_every_.store(std::max<std::uint32_t>(1, sample_every), std::memory_order_relaxed);
  on_.store(true);
}

void CommProfiler::reset() {
  std::lock_guard lock(mu_);
  // Operations posted before now are not counted when they end
  // (still_posted compares their epoch). The slots are not cleared: an
  // operation posted between the bump and a clearing would be lost.
  epoch_.fetch_add(1, std::memory_order_relaxed);
  const std::uint32_t used = kinds_used_.load(std::memory_order_acquire);
  for (std::uint32_t i = 0; i < used; ++i) {
    Kind& k = kinds_[i];
    k.count_at_reset = k.count.load(std::memory_order_relaxed);
    k.bytes_at_reset = k.bytes.load(std::memory_order_relaxed);
    k.posted.store(0, std::memory_order_relaxed);  // the first ones are timed again
    k.next_timed.store(0, std::memory_order_relaxed);
  }
  ops_.clear();
  intervals_.clear();
  trace_.clear();
  trace_dropped_ = 0;
  window_start_ = Clock::now();
  last_end_ns_.store(0, std::memory_order_relaxed);
}

std::uint32_t CommProfiler::kind_of(const char* op) {
  std::uint32_t used = kinds_used_.load(std::memory_order_acquire);
  for (std::uint32_t i = 0; i < used; ++i)
    if (kinds_[i].name.load(std::memory_order_relaxed) == op) return i;
  std::lock_guard lock(mu_);  // a new kind: a handful per communicator
  used = kinds_used_.load(std::memory_order_relaxed);
  for (std::uint32_t i = 0; i < used; ++i)
    if (kinds_[i].name.load(std::memory_order_relaxed) == op) return i;
  if (used == kMaxKinds) return kMaxKinds;
  kinds_[used].name.store(op, std::memory_order_relaxed);
  kinds_used_.store(used + 1, std::memory_order_release);
  return used;
}

CommProfiler::Timing CommProfiler::decide_timing(Kind& k) {
  const std::uint64_t every = sample_every_.load(std::memory_order_relaxed);
  if (every <= 1 || traced_always_) return Timing::kPrefix;
  const std::uint64_t n = k.posted.load(std::memory_order_relaxed);
  k.posted.store(n + 1, std::memory_order_relaxed);
  if (n < kTimedFirst) return Timing::kPrefix;  // short windows stay whole
  if (n < k.next_timed.load(std::memory_order_relaxed)) return Timing::kCounted;
  // The next one after a random gap of 1 .. 2 every - 1 (mean `every`):
  // a fixed stride would see only one size of a workload that repeats
  // every `every` calls.
  std::uint64_t x = k.rng.load(std::memory_order_relaxed);
  if (x == 0) x = 0x9e3779b97f4a7c15ull ^ reinterpret_cast<std::uintptr_t>(&k);
  x ^= x << 13;
  x ^= x >> 7;
  x ^= x << 17;
  k.rng.store(x, std::memory_order_relaxed);
  k.next_timed.store(n + 1 + x % (2 * every - 1), std::memory_order_relaxed);
  return Timing::kSampled;
}

void CommProfiler::posted(std::uint64_t seq, const char* op, std::uint64_t bytes,
                          double busbw_factor, const char* algorithm, const char* transport,
                          std::int32_t peer, wia_datatype_t dtype) {
  if (!on()) return;
  if (g_unrecorded_threads.load(std::memory_order_relaxed) != 0 && t_unrecorded)
    return;  // finished() then finds no slot of this seq
  const std::uint32_t kind = kind_of(op);
  if (kind == kMaxKinds) return;
  const Timing timing = decide_timing(kinds_[kind]);
  const bool timed = timing != Timing::kCounted;
  // The posting thread owns this slot until finished() reads it: no lock.
  // Marked as being written first, so that a reader that raced with an
  // operation 4096 later sees the change (seqlock).
  Slot& slot = ring_[seq % kRing];
  slot.seq_plus_one.store(0, std::memory_order_relaxed);
#if !WIA_THREAD_SANITIZER  // (no fences under TSan, common/thread_sanitizer.hpp)
  std::atomic_thread_fence(std::memory_order_release);
#endif
  slot.p = Pending{bytes, epoch_.load(std::memory_order_relaxed), static_cast<std::uint8_t>(kind),
                   timed, timing == Timing::kPrefix};
  if (timed)
    details_[seq % kRing] =
        Details{op, busbw_factor, Clock::now(), algorithm, transport, peer, dtype};
  slot.seq_plus_one.store(seq + 1, std::memory_order_release);
}

void CommProfiler::count(const Pending& p) {
  // finished() is the only writer and its calls never overlap: plain
  // stores, no read-modify-write.
  Kind& k = kinds_[p.kind];
  k.count.store(k.count.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
  k.bytes.store(k.bytes.load(std::memory_order_relaxed) + p.bytes, std::memory_order_relaxed);
}

void CommProfiler::note_end_if_next_timed(std::uint64_t seq) {
  const Slot& next = ring_[(seq + 1) % kRing];
  if (next.seq_plus_one.load(std::memory_order_acquire) == seq + 2 && next.p.timed)
    last_end_ns_.store(ns_of(Clock::now()), std::memory_order_relaxed);
}

void CommProfiler::finished(std::uint64_t seq, const char* algorithm, const char* transport) {
  if (!on()) return;
  const Slot& slot = ring_[seq % kRing];
  if (slot.seq_plus_one.load(std::memory_order_acquire) != seq + 1) return;  // posted before
  // Field by field, as posted() stored them: one 16-byte load of fields
  // stored apart cannot be forwarded from the store buffer and stalls
  // when the operation ends right after its posting.
  const Pending p{slot.p.bytes, slot.p.epoch, slot.p.kind, slot.p.timed, slot.p.prefix};
  if (p.timed) {
    const Details d = details_[seq % kRing];
    if (still_posted(slot, seq, p)) record_timed(p, d, Clock::now(), algorithm, transport);
    return;
  }
  if (!still_posted(slot, seq, p)) return;
  if (on_.load(std::memory_order_relaxed)) count(p);
  note_end_if_next_timed(seq);
}

bool CommProfiler::still_posted(const Slot& slot, std::uint64_t seq, const Pending& p) const {
  // Overwritten while read by an operation 4096 later: drop this one. The
  // slot is not cleared: finished() is called once per operation.
#if WIA_THREAD_SANITIZER  // an acquire load in place of the fence
  if (slot.seq_plus_one.load(std::memory_order_acquire) != seq + 1) return false;
#else
  std::atomic_thread_fence(std::memory_order_acquire);
  if (slot.seq_plus_one.load(std::memory_order_relaxed) != seq + 1) return false;
#endif
  return p.epoch == epoch_.load(std::memory_order_relaxed);  // else posted before a reset
}

void CommProfiler::record_timed(const Pending& p, const Details& d, Clock::time_point now,
                                const char* algorithm, const char* transport) {
  std::lock_guard lock(mu_);
  // Operations run one after another: one queued behind another starts
  // when that one ends, not when it was posted.
  const Clock::time_point last_end{std::chrono::nanoseconds(last_end_ns_.load())};
  const auto start = std::max(d.posted, last_end);
  last_end_ns_.store(ns_of(now), std::memory_order_relaxed);
  const char* const algo = d.algorithm != nullptr ? d.algorithm : algorithm;
  const char* const via = d.transport != nullptr ? d.transport : transport;
  if (trace_.size() < kMaxTraceEvents) {
    if (trace_.capacity() == 0) trace_.reserve(1024);
    trace_.push_back({start, now, d.op, algo != nullptr ? algo : "", via != nullptr ? via : "",
                      p.bytes, d.peer, -1});
  } else {
    ++trace_dropped_;
  }
  if (!on_.load(std::memory_order_relaxed)) return;  // the timeline only (WIA_TRACE)
  const double s = std::chrono::duration<double>(now - start).count();
  OpStats* found = nullptr;
  for (OpStats& o : ops_)  // a handful of kinds: a scan beats a map
    if (o.name == d.op) found = &o;
  if (found == nullptr) {
    ops_.emplace_back();
    ops_.back().name = d.op;
    found = &ops_.back();
  }
  OpStats& o = *found;
  // Prefix calls come first (the first of their kind in the window); one
  // that ends after a sampled one, from racing posting threads, counts as
  // sampled.
  if (p.prefix && o.prefix == o.seconds.size()) ++o.prefix;
  o.seconds.push_back(s);
  const double algbw = s > 0 ? static_cast<double>(p.bytes) / s / 1e9 : 0.0;
  o.algbw_gbps.push_back(algbw);
  o.busbw_gbps.push_back(algbw * d.busbw_factor);
  o.call_bytes.push_back(p.bytes);
  o.call_algorithm.push_back(algo != nullptr ? algo : "");
  o.call_transport.push_back(via != nullptr ? via : "");
  o.call_dtype.push_back(d.dtype);
  if (algo != nullptr) o.algorithm = algo;
  if (via != nullptr) o.transport = via;
  if (intervals_.size() < kMaxIntervals) intervals_.push_back({start, now});
  count(p);  // under the lock: a snapshot sees the call with its time
}

void CommProfiler::record_beside(const char* op, std::uint64_t bytes, Clock::time_point start,
                                 Clock::time_point end, const char* algorithm,
                                 const char* transport, std::int32_t peer, std::int32_t rank,
                                 wia_datatype_t dtype) {
  if (!on()) return;
  const std::uint32_t kind = kind_of(op);  // before the lock: it may take it
  if (kind == kMaxKinds) return;
  const char* const algo = algorithm != nullptr ? algorithm : "";
  const char* const via = transport != nullptr ? transport : "";
  std::lock_guard lock(mu_);
  if (trace_.size() < kMaxTraceEvents) {
    if (trace_.capacity() == 0) trace_.reserve(1024);
    trace_.push_back({start, end, op, algo, via, bytes, peer, rank});
  } else {
    ++trace_dropped_;
  }
  if (!on_.load(std::memory_order_relaxed)) return;  // the timeline only (WIA_TRACE)
  OpStats* found = nullptr;
  for (OpStats& o : ops_)
    if (o.name == op) found = &o;
  if (found == nullptr) {
    ops_.emplace_back();
    ops_.back().name = op;
    found = &ops_.back();
  }
  OpStats& o = *found;
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
  count(Pending{bytes, 0, static_cast<std::uint8_t>(kind), true, true});  // under the lock
}

CommProfiler::Snapshot CommProfiler::snapshot() const {
  std::lock_guard lock(mu_);
  Snapshot s{ops_, intervals_, window_start_, settings_,
             sample_every_.load(std::memory_order_relaxed)};
  // The exact counts; a kind counted and never timed (a window that began
  // with disable and enable) reports its count with no times.
  const std::uint32_t used = kinds_used_.load(std::memory_order_acquire);
  for (std::uint32_t i = 0; i < used; ++i) {
    const Kind& k = kinds_[i];
    const std::uint64_t calls = k.count.load(std::memory_order_relaxed) - k.count_at_reset;
    if (calls == 0) continue;
    const char* name = k.name.load(std::memory_order_relaxed);
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
               traced_always_ ? 1u : sample_every_.load(std::memory_order_relaxed)};
}

const char* CommProfiler::intern_transport(const std::string& name) {
  // Never freed: reports and profilers of destroyed communicators point here.
  static auto* mu = new std::mutex();
  static auto* names = new std::set<std::string>();
  std::lock_guard lock(*mu);
  return names->insert(name).first->c_str();
}

}  // namespace wia::comm
