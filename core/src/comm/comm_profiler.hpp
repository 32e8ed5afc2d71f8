// SPDX-License-Identifier: Apache-2.0
// What wia_enable_comm_profiling records for a process communicator: each
// operation's start (its turn, or its posting when later) and end, its
// collective, bytes and chosen algorithm. Off, it costs one relaxed load
// per operation; on, a lock and two clock reads.
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
    std::vector<double> seconds;     // one per call
    std::vector<double> algbw_gbps;  // bytes / time, per call
    std::vector<double> busbw_gbps;  // algbw * the bus factor, per call
    std::uint64_t bytes = 0;
    std::string algorithm;
  };
  struct Snapshot {
    std::map<std::string, OpStats> ops;
    std::vector<Interval> intervals;  // every operation's, in end order
    Clock::time_point window_start;
    wia_comm_profiling_t settings{};
  };

  bool on() const { return on_.load(std::memory_order_relaxed); }
  // Whether this profiler counts in the API's "time host functions" switch
  // (overlap analysis on); set by the API only.
  std::atomic<bool> counts_compute{false};
  void enable(const wia_comm_profiling_t& settings);
  void disable() { on_.store(false); }
  void reset();
  // busbw_factor: nccl-tests' bus bandwidth factor of the collective.
  void posted(std::uint64_t seq, const char* op, std::uint64_t bytes, double busbw_factor);
  void finished(std::uint64_t seq, const char* algorithm);
  Snapshot snapshot() const;

 private:
  struct Pending {
    const char* op;
    std::uint64_t bytes;
    double busbw_factor;
    Clock::time_point posted;
  };
  std::atomic<bool> on_{false};
  mutable std::mutex mu_;
  wia_comm_profiling_t settings_{};
  Clock::time_point window_start_ = Clock::now();
  Clock::time_point last_end_{};
  std::unordered_map<std::uint64_t, Pending> pending_;
  std::map<std::string, OpStats> ops_;
  std::vector<Interval> intervals_;
};

}  // namespace wia::comm
