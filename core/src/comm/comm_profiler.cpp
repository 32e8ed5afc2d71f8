// SPDX-License-Identifier: Apache-2.0
#include "comm/comm_profiler.hpp"

#include <algorithm>
#include <cstdlib>
#include <set>

namespace wia::comm {

namespace {
// Intervals kept for the overlap analysis; the statistics keep every call.
constexpr std::size_t kMaxIntervals = 1u << 20;
thread_local bool t_unrecorded = false;
}  // namespace

CommProfiler::UnrecordedOnThisThread::UnrecordedOnThisThread() : was_(t_unrecorded) {
  t_unrecorded = true;
}
CommProfiler::UnrecordedOnThisThread::~UnrecordedOnThisThread() { t_unrecorded = was_; }

CommProfiler::CommProfiler() {
  if (const char* path = std::getenv("WIA_TRACE"); path != nullptr && *path != '\0') {
    trace_at_destroy_ = path;
    traced_always_ = true;
  }
}

void CommProfiler::enable(const wia_comm_profiling_t& settings) {
  std::lock_guard lock(mu_);
  settings_ = settings;
  on_.store(true);
}

void CommProfiler::reset() {
  std::lock_guard lock(mu_);
  for (Slot& slot : ring_) slot.seq_plus_one.store(0);
  ops_.clear();
  intervals_.clear();
  trace_.clear();
  trace_dropped_ = 0;
  window_start_ = Clock::now();
  last_end_ = {};
}

void CommProfiler::posted(std::uint64_t seq, const char* op, std::uint64_t bytes,
                          double busbw_factor, const char* algorithm, const char* transport,
                          std::int32_t peer, wia_datatype_t dtype) {
  if (!on() || t_unrecorded) return;  // finished() then finds no slot of this seq
  // The posting thread owns this slot until finished() takes it: no lock.
  Slot& slot = ring_[seq % kRing];
  slot.p = Pending{op, bytes, busbw_factor, Clock::now(), algorithm, transport, peer, dtype};
  slot.seq_plus_one.store(seq + 1, std::memory_order_release);
}

void CommProfiler::finished(std::uint64_t seq, const char* algorithm, const char* transport) {
  if (!on()) return;
  const auto now = Clock::now();
  Slot& slot = ring_[seq % kRing];
  if (slot.seq_plus_one.load(std::memory_order_acquire) != seq + 1) return;  // posted before
  const Pending p = slot.p;
  // Overwritten meanwhile by an operation 4096 later: drop this one.
  if (slot.seq_plus_one.exchange(0, std::memory_order_acq_rel) != seq + 1) return;
  std::lock_guard lock(mu_);
  // Operations run one after another: one queued behind another starts
  // when that one ends, not when it was posted.
  const auto start = std::max(p.posted, last_end_);
  last_end_ = now;
  const char* const algo = p.algorithm != nullptr ? p.algorithm : algorithm;
  const char* const via = p.transport != nullptr ? p.transport : transport;
  if (trace_.size() < kMaxTraceEvents) {
    if (trace_.capacity() == 0) trace_.reserve(1024);
    trace_.push_back({start, now, p.op, algo != nullptr ? algo : "", via != nullptr ? via : "",
                      p.bytes, p.peer});
  } else {
    ++trace_dropped_;
  }
  if (!on_.load(std::memory_order_relaxed)) return;  // the timeline only (WIA_TRACE)
  const double s = std::chrono::duration<double>(now - start).count();
  OpStats* found = nullptr;
  for (OpStats& o : ops_)  // a handful of kinds: a scan beats a map
    if (o.name == p.op) found = &o;
  if (found == nullptr) {
    ops_.emplace_back();
    ops_.back().name = p.op;
    found = &ops_.back();
  }
  OpStats& o = *found;
  o.seconds.push_back(s);
  const double algbw = s > 0 ? static_cast<double>(p.bytes) / s / 1e9 : 0.0;
  o.algbw_gbps.push_back(algbw);
  o.busbw_gbps.push_back(algbw * p.busbw_factor);
  o.call_bytes.push_back(p.bytes);
  o.call_algorithm.push_back(algo != nullptr ? algo : "");
  o.call_transport.push_back(via != nullptr ? via : "");
  o.call_dtype.push_back(p.dtype);
  o.bytes += p.bytes;
  if (algo != nullptr) o.algorithm = algo;
  if (via != nullptr) o.transport = via;
  if (intervals_.size() < kMaxIntervals) intervals_.push_back({start, now});
}

CommProfiler::Snapshot CommProfiler::snapshot() const {
  std::lock_guard lock(mu_);
  return Snapshot{ops_, intervals_, window_start_, settings_};
}

CommProfiler::Trace CommProfiler::trace() const {
  std::lock_guard lock(mu_);
  return Trace{trace_, trace_dropped_};
}

const char* CommProfiler::intern_transport(const std::string& name) {
  // Never freed: reports and profilers of destroyed communicators point here.
  static auto* mu = new std::mutex();
  static auto* names = new std::set<std::string>();
  std::lock_guard lock(*mu);
  return names->insert(name).first->c_str();
}

}  // namespace wia::comm
