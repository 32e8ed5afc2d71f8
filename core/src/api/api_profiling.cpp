// SPDX-License-Identifier: Apache-2.0
// Communication profiling (spec 6.11): the C entry points, the compute
// timeline (host functions posted on streams while some communicator
// profiles, timed by a trampoline) and the report: per-collective
// statistics, comm time, compute time, overlap, bandwidth utilization.
#include <fmt/format.h>
#include <wia/wia.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "api/communicators.hpp"
#include "api/guard.hpp"
#include "comm/comm_profiler.hpp"
#include "comm/process_communicator.hpp"

namespace wia::api {
namespace {

using Clock = std::chrono::steady_clock;
using comm::CommProfiler;

// Host functions run while any communicator profiles, per device.
struct ComputeLog {
  std::mutex mu;
  std::vector<std::pair<wia_device_t, CommProfiler::Interval>> runs;
  std::atomic<int> profiling{0};  // communicators profiling now
};
ComputeLog& compute_log() {
  static auto* log = new ComputeLog();
  return *log;
}
constexpr std::size_t kMaxRuns = 1u << 20;

struct Timed {
  wia_host_fn_t fn;
  void* user_data;
  wia_device_t device;
};

void timed_host_fn(void* arg) {
  const Timed t = *static_cast<Timed*>(arg);
  delete static_cast<Timed*>(arg);
  const auto start = Clock::now();
  t.fn(t.user_data);
  const auto end = Clock::now();
  ComputeLog& log = compute_log();
  std::lock_guard lock(log.mu);
  if (log.runs.size() < kMaxRuns) log.runs.push_back({t.device, {start, end}});
}

CommProfiler& profiler_of(wia_communicator_t c) {
  CommProfiler* p = live(c).profiler();
  if (p == nullptr)
    throw Error(WIA_ERROR_NOT_SUPPORTED,
                "profiling covers process communicators (one rank per process) in this release");
  return *p;
}

// Length of the parts of [a, b] covered by the merged, sorted `runs`.
double covered(const std::vector<CommProfiler::Interval>& runs, Clock::time_point a,
               Clock::time_point b) {
  double s = 0;
  for (const auto& r : runs) {
    if (r.end <= a) continue;
    if (r.start >= b) break;
    s += std::chrono::duration<double>(std::min(r.end, b) - std::max(r.start, a)).count();
  }
  return s;
}

double percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const auto i = static_cast<std::size_t>(q * static_cast<double>(v.size() - 1) + 0.5);
  return v[std::min(i, v.size() - 1)];
}

}  // namespace

// Host functions are timed while at least one profiler wants them.
void count_compute(CommProfiler& p, bool want) {
  if (p.counts_compute.exchange(want) != want) compute_log().profiling.fetch_add(want ? 1 : -1);
}

void forget_profiling(comm::CommunicatorBase& c) noexcept {
  if (CommProfiler* p = c.profiler()) count_compute(*p, false);
}

// The trampoline wia_launch_host_func uses while a communicator profiles
// (api_stream.cpp); returns false (fn untouched) otherwise.
bool profile_host_fn(wia_device_t device, void (**fn)(void*), void** user_data) {
  if (compute_log().profiling.load(std::memory_order_relaxed) == 0) return false;
  *user_data = new Timed{*fn, *user_data, device};
  *fn = timed_host_fn;
  return true;
}

void discard_profiled_host_fn(void* user_data) noexcept { delete static_cast<Timed*>(user_data); }

}  // namespace wia::api

using namespace wia;

WIA_API wia_status_t wia_enable_comm_profiling(wia_communicator_t comm,
                                               const wia_comm_profiling_t* profiling) {
  return api::guard(__func__, [&] {
    api::require_non_null(profiling, "profiling");
    comm::CommProfiler& p = api::profiler_of(comm);
    api::count_compute(p, profiling->enable_overlap_analysis);
    p.enable(*profiling);
  });
}

WIA_API wia_status_t wia_disable_comm_profiling(wia_communicator_t comm) {
  return api::guard(__func__, [&] {
    comm::CommProfiler& p = api::profiler_of(comm);
    api::count_compute(p, false);
    p.disable();
  });
}

WIA_API wia_status_t wia_reset_comm_profile(wia_communicator_t comm) {
  return api::guard(__func__, [&] { api::profiler_of(comm).reset(); });
}

namespace wia::api {
namespace {

// A report and the storage its pointers lead into, kept until freed.
struct ReportBlock {
  wia_comm_profile_report_t report{};
  std::vector<wia_collective_profile_t> list;
  std::deque<std::string> strings;  // stable c_str()s
};
std::mutex& reports_mu() {
  static auto* mu = new std::mutex();
  return *mu;
}
std::map<const wia_comm_profile_report_t*, std::unique_ptr<ReportBlock>>& reports() {
  static auto* m = new std::map<const wia_comm_profile_report_t*, std::unique_ptr<ReportBlock>>();
  return *m;
}

double sum(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return s;
}

// Comm time hidden under this rank's device's host functions.
void overlap(const CommProfiler::Snapshot& s, comm::ProcessCommunicator& pc,
             wia_comm_profile_report_t& r) {
  std::vector<CommProfiler::Interval> runs;
  {
    ComputeLog& log = compute_log();
    std::lock_guard lock(log.mu);
    for (const auto& [dev, iv] : log.runs)
      if (pc.rank_of_device(dev) >= 0 && iv.end > s.window_start) runs.push_back(iv);
  }
  std::sort(runs.begin(), runs.end(),
            [](const auto& a, const auto& b) { return a.start < b.start; });
  std::vector<CommProfiler::Interval> merged;
  for (const auto& iv : runs) {
    if (!merged.empty() && iv.start <= merged.back().end)
      merged.back().end = std::max(merged.back().end, iv.end);
    else
      merged.push_back(iv);
  }
  for (const auto& iv : merged)
    r.total_compute_time +=
        std::chrono::duration<double>(iv.end - std::max(iv.start, s.window_start)).count();
  double hidden = 0;
  for (const auto& c : s.intervals) hidden += covered(merged, c.start, c.end);
  r.overlap_efficiency = r.total_comm_time > 0 ? hidden / r.total_comm_time : 0.0;
}

wia_comm_profile_report_t* build_report(wia_communicator_t comm) {
  CommProfiler& p = profiler_of(comm);
  auto& pc = dynamic_cast<comm::ProcessCommunicator&>(live(comm));
  const CommProfiler::Snapshot s = p.snapshot();
  auto block = std::make_unique<ReportBlock>();
  wia_comm_profile_report_t& r = block->report;
  r.window_time = std::chrono::duration<double>(Clock::now() - s.window_start).count();
  const double bound = s.settings.enable_bandwidth_tracking ? pc.slowest_link_gbps() : 0.0;
  double util = 0;
  std::size_t util_n = 0;
  for (const auto& o : s.ops) {
    wia_collective_profile_t c{};
    c.name = block->strings.emplace_back(o.name).c_str();
    c.algorithm = block->strings.emplace_back(o.algorithm).c_str();
    c.transport = o.transport;  // interned for the life of the process
    c.invocation_count = static_cast<int>(o.seconds.size());
    c.total_time = sum(o.seconds);
    c.avg_time = c.invocation_count > 0 ? c.total_time / c.invocation_count : 0.0;
    if (s.settings.enable_bandwidth_tracking && c.invocation_count > 0) {
      c.bytes = o.bytes;
      c.avg_bandwidth = sum(o.algbw_gbps) / c.invocation_count;
      if (bound > 0)
        for (double b : o.busbw_gbps) util += b / bound, ++util_n;
    }
    if (s.settings.enable_latency_tracking && c.invocation_count > 0) {
      c.min_time = *std::min_element(o.seconds.begin(), o.seconds.end());
      c.max_time = *std::max_element(o.seconds.begin(), o.seconds.end());
      c.p50_time = percentile(o.seconds, 0.50);
      c.p99_time = percentile(o.seconds, 0.99);
    }
    r.total_comm_time += c.total_time;
    block->list.push_back(c);
  }
  r.avg_bandwidth_utilization = util_n > 0 ? util / static_cast<double>(util_n) : 0.0;
  if (s.settings.enable_overlap_analysis) overlap(s, pc, r);
  r.num_collectives = static_cast<int>(block->list.size());
  r.collectives = block->list.data();
  r.num_suggestions = 0;
  r.suggestions = nullptr;
  wia_comm_profile_report_t* out = &block->report;
  std::lock_guard lock(reports_mu());
  reports()[out] = std::move(block);
  return out;
}

}  // namespace
}  // namespace wia::api

WIA_API wia_comm_profile_report_t* wia_get_comm_profile(wia_communicator_t comm) {
  wia_comm_profile_report_t* out = nullptr;
  api::guard(__func__, [&] { out = api::build_report(comm); });
  return out;
}

WIA_API void wia_free_comm_profile(wia_comm_profile_report_t* report) {
  std::lock_guard lock(api::reports_mu());
  api::reports().erase(report);  // unknown pointers (and NULL) are ignored
}
