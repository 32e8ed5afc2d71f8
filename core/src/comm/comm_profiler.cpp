// SPDX-License-Identifier: Apache-2.0
#include "comm/comm_profiler.hpp"

#include <algorithm>

namespace wia::comm {

namespace {
// Intervals kept for the overlap analysis; the statistics keep every call.
constexpr std::size_t kMaxIntervals = 1u << 20;
}  // namespace

void CommProfiler::enable(const wia_comm_profiling_t& settings) {
  std::lock_guard lock(mu_);
  settings_ = settings;
  on_.store(true);
}

void CommProfiler::reset() {
  std::lock_guard lock(mu_);
  pending_.clear();
  ops_.clear();
  intervals_.clear();
  window_start_ = Clock::now();
  last_end_ = {};
}

void CommProfiler::posted(std::uint64_t seq, const char* op, std::uint64_t bytes,
                          double busbw_factor) {
  if (!on()) return;
  const auto now = Clock::now();
  std::lock_guard lock(mu_);
  pending_[seq] = Pending{op, bytes, busbw_factor, now};
}

void CommProfiler::finished(std::uint64_t seq, const char* algorithm) {
  if (!on()) return;
  const auto now = Clock::now();
  std::lock_guard lock(mu_);
  const auto it = pending_.find(seq);
  if (it == pending_.end()) return;  // posted before profiling began
  const Pending p = it->second;
  pending_.erase(it);
  // Operations run one after another: one queued behind another starts
  // when that one ends, not when it was posted.
  const auto start = std::max(p.posted, last_end_);
  last_end_ = now;
  const double s = std::chrono::duration<double>(now - start).count();
  OpStats& o = ops_[p.op];
  o.seconds.push_back(s);
  const double algbw = s > 0 ? static_cast<double>(p.bytes) / s / 1e9 : 0.0;
  o.algbw_gbps.push_back(algbw);
  o.busbw_gbps.push_back(algbw * p.busbw_factor);
  o.bytes += p.bytes;
  if (algorithm != nullptr) o.algorithm = algorithm;
  if (intervals_.size() < kMaxIntervals) intervals_.push_back({start, now});
}

CommProfiler::Snapshot CommProfiler::snapshot() const {
  std::lock_guard lock(mu_);
  return Snapshot{ops_, intervals_, window_start_, settings_};
}

}  // namespace wia::comm
