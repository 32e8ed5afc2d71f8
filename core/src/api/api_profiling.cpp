// SPDX-License-Identifier: Apache-2.0
// Communication profiling (spec 6.11): the C entry points, the compute
// timeline (host functions posted on streams while some communicator
// profiles, timed by a trampoline) and the report: per-collective
// statistics, comm time, compute time, overlap, bandwidth utilization.
#include <fmt/format.h>
#include <unistd.h>
#include <wia/wia.h>

#include <algorithm>
#include <climits>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <type_traits>
#include <vector>

#include "api/communicators.hpp"
#include "api/compress_job.hpp"
#include "api/guard.hpp"
#include "api/profile_suggestions.hpp"
#include "coll/registry.hpp"
#include "coll/schedule.hpp"
#include "comm/comm_profiler.hpp"
#include "comm/device_communicator.hpp"
#include "comm/process_communicator.hpp"
#include "common/log.hpp"
#include "compress/codec.hpp"
#include "kernels/cpu_reduce.hpp"
#include "runtime/device_call.hpp"
#include "runtime/objects.hpp"
#include "runtime/runtime.hpp"
#include "tuner/cost_model.hpp"
#include "tuner/link_codec.hpp"

namespace wia::api {
namespace {

using Clock = std::chrono::steady_clock;
using comm::CommProfiler;

// Compute that ran on a stream while some communicator profiled: a host
// function, or a kernel, copy or set between two ComputeBracket marks.
struct ComputeRun {
  wia_device_t device;
  std::uint32_t stream;  // wia_stream_s::track(): the timeline's track
  CommProfiler::Interval interval;
  const char* what;  // the timeline's name: "host function", "copy", "kernel <name>", ...
};
// Compute run while any communicator profiles (the first 2^20 runs).
struct ComputeLog {
  std::mutex mu;
  std::vector<ComputeRun> runs;
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
  std::uint32_t stream;
};

void timed_host_fn(void* arg) {
  const Timed t = *static_cast<Timed*>(arg);
  delete static_cast<Timed*>(arg);
  const auto start = Clock::now();
  t.fn(t.user_data);
  const auto end = Clock::now();
  ComputeLog& log = compute_log();
  std::lock_guard lock(log.mu);
  if (log.runs.size() < kMaxRuns)
    log.runs.push_back({t.device, t.stream, {start, end}, "host function"});
}

// ComputeBracket's marks: the first sets the start when the stream
// reaches the work, the second records the run when the work is done
// (the stream runs in order) and frees the record.
struct BracketRun {
  ComputeRun run;
  std::atomic<bool> record{false};  // the work was posted
};
void bracket_start(void* arg) { static_cast<BracketRun*>(arg)->run.interval.start = Clock::now(); }
void bracket_end(void* arg) {
  std::unique_ptr<BracketRun> b(static_cast<BracketRun*>(arg));
  if (!b->record.load(std::memory_order_acquire)) return;
  b->run.interval.end = Clock::now();
  ComputeLog& log = compute_log();
  std::lock_guard lock(log.mu);
  if (log.runs.size() < kMaxRuns) log.runs.push_back(b->run);
}

void launch_mark(::wia_stream_s* s, void (*fn)(void*), void* arg) {
  const Device& d = Runtime::get().device(s->device);
  device_call(d, "launch_host_func(profiling mark)", [&](const wia_device_ops_v1_t& o, void* ctx) {
    return o.launch_host_func(ctx, s->ps, fn, arg);
  });
}

CommProfiler& profiler_of(comm::CommunicatorBase& c) {
  CommProfiler* p = c.profiler();
  if (p == nullptr) throw Error(WIA_ERROR_NOT_SUPPORTED, "this communicator keeps no profile");
  return *p;
}
CommProfiler& profiler_of(wia_communicator_t c) { return profiler_of(live(c)); }

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

// profiling.sample_every (docs/profiling.md, "Sampling").
static std::uint32_t configured_sample_every() {
  return static_cast<std::uint32_t>(
      std::max<std::int64_t>(1, Runtime::get().config().get_int("profiling.sample_every")));
}

// Host functions are timed while at least one profiler wants them.
void count_compute(CommProfiler& p, bool want) {
  if (p.counts_compute.exchange(want) != want) compute_log().profiling.fetch_add(want ? 1 : -1);
}

void forget_profiling(comm::CommunicatorBase& c) noexcept {
  if (CommProfiler* p = c.profiler()) count_compute(*p, false);
}

// The trampoline wia_launch_host_func uses while a communicator profiles
// (api_stream.cpp); returns false (fn untouched) otherwise.
bool profile_host_fn(wia_device_t device, std::uint32_t stream, void (**fn)(void*),
                     void** user_data) {
  if (compute_log().profiling.load(std::memory_order_relaxed) == 0) return false;
  *user_data = new Timed{*fn, *user_data, device, stream};
  *fn = timed_host_fn;
  return true;
}

void discard_profiled_host_fn(void* user_data) noexcept { delete static_cast<Timed*>(user_data); }

ComputeBracket::ComputeBracket(wia_stream_t stream, const char* what) {
  if (compute_log().profiling.load(std::memory_order_relaxed) == 0) return;
  ::wia_stream_s* s = resolve_stream(stream);
  if (!(ops_of(Runtime::get().device(s->device)).caps & WIA_DEVICE_CAP_HOST_FUNC)) return;
  auto run = std::make_unique<BracketRun>();
  run->run = {s->device, s->track(), {}, what};
  launch_mark(s, bracket_start, run.get());  // throws before anything is posted
  stream_ = s;
  run_ = run.release();
}

ComputeBracket::~ComputeBracket() {
  if (run_ == nullptr) return;
  auto* run = static_cast<BracketRun*>(run_);
  run->record.store(posted_, std::memory_order_release);
  try {
    launch_mark(stream_, bracket_end, run);
  } catch (const Error& e) {
    // The start mark may still run: the record stays (a few bytes).
    log::warn("profile", "a profiling mark after {} could not be posted: {}", run->run.what,
              e.what());
  }
}

const char* kernel_compute_name(const std::string& kernel) {
  static std::mutex mu;
  static auto* names = new std::set<std::string>();
  std::lock_guard lock(mu);
  return names->insert("kernel " + kernel).first->c_str();
}

}  // namespace wia::api

namespace wia::api {
namespace {

// JSON string contents: names come from providers and callers.
std::string json_escape(const char* s) {
  std::string out;
  for (; s != nullptr && *s != '\0'; ++s) {
    const auto c = static_cast<unsigned char>(*s);
    if (c == '"' || c == '\\')
      out += {'\\', static_cast<char>(c)};
    else if (c < 0x20)
      out += fmt::format("\\u{:04x}", c);
    else
      out += static_cast<char>(c);
  }
  return out;
}

// Where a communicator's timeline goes in a trace (docs/profiling.md): a
// process communicator's rank is the trace's process, a device
// communicator's process is the operating system's (it holds every rank).
struct Track {
  int pid = 0;
  int tid = 0;  // the communicator's number in this process
  int nranks = 0;
  std::string process_name;
  std::string thread_name;  // a device communicator's own track (a process one has none)
  std::string other;  // otherData members naming it, each followed by ','
  std::vector<int> device_of_rank;  // a device communicator's: its ranks' own tracks
  int device = -1;                  // a process communicator's (its streams' tracks)
};

// The tid of rank r's own track (a device communicator's sends and
// receives, CommProfiler::record_beside), beside the communicator's.
int rank_track_tid(const Track& t, int r) { return t.tid * 1000 + r + 1; }

Track track_of(const comm::CommunicatorBase& c) {
  Track t;
  t.nranks = c.size();
  if (const auto* pc = dynamic_cast<const comm::ProcessCommunicator*>(&c)) {
    t.pid = pc->rank();
    t.tid = pc->index_in_process();
    t.device = pc->device();
    t.process_name = fmt::format("rank {}", t.pid);
    t.other = fmt::format("\"rank\":{},", t.pid);
    return t;
  }
  const auto& dc = dynamic_cast<const comm::DeviceCommunicator&>(c);
  std::string devices;
  for (int r = 0; r < dc.size(); ++r) {
    devices += fmt::format("{}{}", r == 0 ? "" : ",", dc.device_of_rank(r));
    t.device_of_rank.push_back(dc.device_of_rank(r));
  }
  t.pid = static_cast<int>(::getpid());
  t.tid = dc.index_in_process();
  t.process_name = fmt::format("process {}", t.pid);
  t.thread_name = fmt::format("device communicator {} ({} ranks: devices {}, {} engine)", t.tid,
                              t.nranks, devices, comm::engine_name(dc.engine()));
  t.other =
      fmt::format("\"devices\":[{}],\"engine\":\"{}\",", devices, comm::engine_name(dc.engine()));
  return t;
}

// The tid of a stream's track: one per stream (wia_stream_s::ordinal),
// apart from the communicator's and its ranks' numbers; 0 for operations
// posted outside any stream.
constexpr int kStreamTidBase = 1 << 20;
int stream_tid(std::uint32_t stream) {
  return stream == 0 ? 0
                     : kStreamTidBase + static_cast<int>(stream & ~wia_stream_s::kDefaultStreamBit);
}
std::string stream_track_name(std::uint32_t stream, int device) {
  if (stream == 0) return "outside any stream";
  const std::uint32_t ordinal = stream & ~wia_stream_s::kDefaultStreamBit;
  if (stream & wia_stream_s::kDefaultStreamBit)
    return fmt::format("stream {} (device {}'s default stream)", ordinal, device);
  return fmt::format("stream {} (device {})", ordinal, device);
}

// Chrome/Perfetto trace JSON (docs/profiling.md): one complete event per
// operation. A process communicator's go on one track per stream they
// were posted on (pid = rank); a device communicator's on its own track
// (tid = its number in this process) and, as each rank saw them, on the
// ranks' tracks. Host functions timed as compute (`compute`: this
// communicator's devices', from the window's start) go on their streams'
// tracks. ts counts microseconds from 00:00 UTC of the day of the first
// event, by the wall clock, so the files of all ranks line up when loaded
// together; not from the Unix epoch, because readers parse ts as a
// double, which at 1.8e15 us keeps only quarter-microsecond steps.
std::string trace_json(const CommProfiler::Trace& t, const Track& track,
                       const std::vector<ComputeRun>& compute, std::uint64_t compute_dropped) {
  using std::chrono::nanoseconds;
  const int rank = track.pid;
  const int tid = track.tid;
  const bool device_comm = !track.device_of_rank.empty();
  // The steady clock times the operations; the wall clock places them.
  const auto steady_now = Clock::now();
  const std::int64_t wall_now_ns =
      std::chrono::duration_cast<nanoseconds>(std::chrono::system_clock::now().time_since_epoch())
          .count();
  auto wall_ns = [&](Clock::time_point tp) {
    return wall_now_ns + std::chrono::duration_cast<nanoseconds>(tp - steady_now).count();
  };
  constexpr std::int64_t kDayNs = 86'400'000'000'000;
  Clock::time_point first = t.events.empty() ? steady_now : t.events.front().start;
  if (!compute.empty()) first = std::min(first, compute.front().interval.start);
  const std::int64_t first_ns = wall_ns(first);
  const std::int64_t origin_ns = first_ns - first_ns % kDayNs;
  auto ts_us = [&](Clock::time_point tp) {
    return static_cast<double>(wall_ns(tp) - origin_ns) / 1e3;
  };
  auto dur_us = [](Clock::time_point a, Clock::time_point b) {
    return std::chrono::duration<double, std::micro>(b - a).count();
  };
  std::string out = "{\"traceEvents\":[\n";
  out += fmt::format(
      "{{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":{0},\"tid\":{1},"
      "\"args\":{{\"name\":\"{2}\"}}}}",
      rank, tid, json_escape(track.process_name.c_str()));
  auto name_track = [&](int id, const std::string& name) {
    out += fmt::format(
        ",\n{{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":{},\"tid\":{},"
        "\"args\":{{\"name\":\"{}\"}}}}",
        rank, id, json_escape(name.c_str()));
  };
  // Each track named once: the communicator's (a device communicator's),
  // the ranks', the streams'.
  if (device_comm) name_track(tid, track.thread_name);
  std::vector<bool> rank_track_named(static_cast<std::size_t>(std::max(track.nranks, 0)));
  std::set<int> streams_named;
  auto name_stream = [&](std::uint32_t stream, int device) {
    if (streams_named.insert(stream_tid(stream)).second)
      name_track(stream_tid(stream),
                 stream == 0 ? fmt::format("communicator {}: outside any stream", tid)
                             : stream_track_name(stream, device));
  };
  for (const CommProfiler::TraceEvent& e : t.events) {
    const auto r = static_cast<std::size_t>(e.track);
    if (e.track >= 0 && r < rank_track_named.size() && !rank_track_named[r]) {
      rank_track_named[r] = true;
      const int device = r < track.device_of_rank.size() ? track.device_of_rank[r] : -1;
      name_track(rank_track_tid(track, e.track),
                 fmt::format("device {}: rank {} (device communicator {})", device, e.track, tid));
    } else if (e.track < 0 && !device_comm) {
      name_stream(e.stream, track.device);
    }
  }
  for (const ComputeRun& c : compute) name_stream(c.stream, c.device);
  for (const CommProfiler::TraceEvent& e : t.events) {
    const bool p2p = e.peer >= 0;
    const int on = e.track >= 0 ? rank_track_tid(track, e.track)
                   : device_comm ? tid
                                 : stream_tid(e.stream);
    out += fmt::format(
        ",\n{{\"name\":\"{}\",\"cat\":\"{}\",\"ph\":\"X\",\"ts\":{:.3f},\"dur\":{:.3f},"
        "\"pid\":{},\"tid\":{},\"args\":{{\"bytes\":{},\"algorithm\":\"{}\","
        "\"transport\":\"{}\",\"{}\":{}{}{}}}}}",
        json_escape(e.name), p2p ? "p2p" : "collective", ts_us(e.start), dur_us(e.start, e.end),
        rank, on, e.bytes, json_escape(e.algorithm), json_escape(e.transport),
        p2p ? "peer" : "nranks", p2p ? e.peer : track.nranks,
        !p2p && e.track >= 0 ? fmt::format(",\"rank\":{}", e.track) : std::string(),
        !p2p && e.peers != nullptr && e.track < 0 && !device_comm
            ? fmt::format(",\"peers\":[{}]", json_escape(e.peers))
            : std::string());
  }
  for (const ComputeRun& c : compute)
    out += fmt::format(
        ",\n{{\"name\":\"{}\",\"cat\":\"compute\",\"ph\":\"X\",\"ts\":{:.3f},"
        "\"dur\":{:.3f},\"pid\":{},\"tid\":{},\"args\":{{\"device\":{}}}}}",
        json_escape(c.what), ts_us(c.interval.start), dur_us(c.interval.start, c.interval.end), rank,
        stream_tid(c.stream), c.device);
  out += fmt::format(
      "\n],\n\"displayTimeUnit\":\"ms\",\n\"otherData\":{{{}\"nranks\":{},"
      "\"communicator\":{},\"events\":{},\"dropped_events\":{},\"max_events\":{},"
      "\"compute_events\":{},\"dropped_compute_events\":{},"
      "\"sample_every\":{},\"ts_origin_unix_us\":{}}}}}\n",
      track.other, track.nranks, tid, t.events.size(), t.dropped, CommProfiler::kMaxTraceEvents,
      compute.size(), compute_dropped, t.sample_every, origin_ns / 1000);
  return out;
}

// The host functions timed as compute on `c`'s devices since the trace's
// window started, in start order, at most kMaxTraceEvents (`dropped`
// counts the later ones).
std::vector<ComputeRun> compute_for_trace(const comm::CommunicatorBase& c,
                                          Clock::time_point since, std::uint64_t& dropped) {
  std::vector<ComputeRun> runs;
  dropped = 0;
  {
    ComputeLog& log = compute_log();
    std::lock_guard lock(log.mu);
    for (const ComputeRun& run : log.runs)
      if (run.interval.end > since && c.rank_of_device(run.device) >= 0) runs.push_back(run);
  }
  std::sort(runs.begin(), runs.end(), [](const ComputeRun& a, const ComputeRun& b) {
    return a.interval.start < b.interval.start;
  });
  if (runs.size() > CommProfiler::kMaxTraceEvents) {
    dropped = runs.size() - CommProfiler::kMaxTraceEvents;
    runs.resize(CommProfiler::kMaxTraceEvents);
  }
  return runs;
}

void write_trace(comm::CommunicatorBase& c, const std::string& path) {
  CommProfiler& p = profiler_of(c);
  if (auto* dc = dynamic_cast<comm::DeviceCommunicator*>(&c)) dc->settle_profile();
  const CommProfiler::Trace trace = p.trace();
  std::uint64_t compute_dropped = 0;
  const std::vector<ComputeRun> compute =
      compute_for_trace(c, trace.window_start, compute_dropped);
  const std::string json = trace_json(trace, track_of(c), compute, compute_dropped);
  // Written whole to a temporary name, then renamed: a reader never sees
  // half a trace.
  const std::string tmp = path + ".tmp";
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  if (f == nullptr)
    throw Error(WIA_ERROR_IO,
                fmt::format("trace {}: cannot create it: {}", path, std::strerror(errno)));
  const bool written = std::fwrite(json.data(), 1, json.size(), f) == json.size();
  const int write_errno = errno;
  if (std::fclose(f) != 0 || !written) {
    std::remove(tmp.c_str());
    throw Error(WIA_ERROR_IO, fmt::format("trace {}: writing: {}", path,
                                          std::strerror(written ? errno : write_errno)));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int e = errno;
    std::remove(tmp.c_str());
    throw Error(WIA_ERROR_IO, fmt::format("trace {}: {}", path, std::strerror(e)));
  }
}

// WIA_TRACE's file for this rank: "%r" becomes the rank and "%c" the
// communicator's number in the process; without "%r", ".rank<N>" is
// appended, and without "%c", ".comm<K>" for communicators after the
// process's first. A device communicator holds every rank: "devices"
// stands for the rank, and its number counts device communicators.
std::string trace_path_for(const std::string& pattern, const comm::CommunicatorBase& c) {
  const auto* pc = dynamic_cast<const comm::ProcessCommunicator*>(&c);
  const std::string rank_part = pc != nullptr ? std::to_string(pc->rank()) : std::string("devices");
  const int index = pc != nullptr
                        ? pc->index_in_process()
                        : dynamic_cast<const comm::DeviceCommunicator&>(c).index_in_process();
  std::string out;
  bool has_rank = false, has_comm = false;
  for (std::size_t i = 0; i < pattern.size(); ++i) {
    if (pattern[i] == '%' && i + 1 < pattern.size() &&
        (pattern[i + 1] == 'r' || pattern[i + 1] == 'c')) {
      const bool rank = pattern[++i] == 'r';
      (rank ? has_rank : has_comm) = true;
      out += rank ? rank_part : std::to_string(index);
    } else {
      out += pattern[i];
    }
  }
  if (!has_comm && index > 1) out += ".comm" + std::to_string(index);
  if (!has_rank) out += pc != nullptr ? ".rank" + rank_part : "." + rank_part;
  return out;
}

}  // namespace
}  // namespace wia::api

namespace wia::api {

void write_trace_at_destroy(comm::CommunicatorBase& c) noexcept {
  CommProfiler* p = c.profiler();
  if (p == nullptr || p->trace_at_destroy().empty()) return;
  try {
    write_trace(c, trace_path_for(p->trace_at_destroy(), c));
  } catch (const std::exception& e) {
    const auto* pc = dynamic_cast<const comm::ProcessCommunicator*>(&c);
    if (pc != nullptr)
      log::error("profile", "rank {}: WIA_TRACE: {}", pc->rank(), e.what());
    else
      log::error("profile", "device communicator: WIA_TRACE: {}", e.what());
  }
}

}  // namespace wia::api

using namespace wia;

WIA_API wia_status_t wia_profile_write_trace(wia_communicator_t comm, const char* path) {
  return api::guard(__func__, [&] {
    api::require_non_null(path, "path");
    if (*path == '\0') throw Error(WIA_ERROR_INVALID_ARGUMENT, "path: empty");
    api::write_trace(api::live(comm), path);
  });
}

WIA_API wia_status_t wia_enable_comm_profiling(wia_communicator_t comm,
                                               const wia_comm_profiling_t* profiling) {
  return api::guard(__func__, [&] {
    api::require_non_null(profiling, "profiling");
    comm::CommProfiler& p = api::profiler_of(comm);
    api::count_compute(p, profiling->enable_overlap_analysis);
    p.enable(*profiling, api::configured_sample_every());
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
  std::vector<const char*> suggestions;
  // The job-wide summary (wia_get_comm_profile_job): entries, and each
  // entry's per-rank array.
  std::vector<wia_job_collective_profile_t> job;
  std::vector<std::vector<wia_collective_profile_t>> job_ranks;
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
void overlap(const CommProfiler::Snapshot& s, const comm::CommunicatorBase& pc,
             wia_comm_profile_report_t& r) {
  std::vector<CommProfiler::Interval> runs;
  {
    ComputeLog& log = compute_log();
    std::lock_guard lock(log.mu);
    for (const ComputeRun& run : log.runs)
      if (pc.rank_of_device(run.device) >= 0 && run.interval.end > s.window_start)
        runs.push_back(run.interval);
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
  // Over the timed operations (every one at sample_every 1): the share of
  // their time under compute.
  double hidden = 0, timed = 0;
  for (const auto& c : s.intervals) {
    hidden += covered(merged, c.start, c.end);
    timed += std::chrono::duration<double>(c.end - c.start).count();
  }
  r.overlap_efficiency = timed > 0 ? hidden / timed : 0.0;
}

// Suggestions (docs/profiling.md): each costed by the communicator's own
// model (core/src/tuner), the estimated speedup in its text.

// All-reduces below this size are fusion candidates; buckets are filled up
// to kFusionBucketBytes (PyTorch DDP's default bucket). A suggestion is made
// when the model expects the fused run kMinSpeedup times faster or more.
constexpr std::uint64_t kFusionCandidateBytes = 1u << 20;
constexpr std::uint64_t kFusionBucketBytes = 25u << 20;
constexpr double kMinSpeedup = kMinSuggestedSpeedup;

// The model's time for one all-reduce of `bytes` (float32 elements).
double allreduce_us(tuner::Selector& model, std::uint64_t bytes) {
  const std::uint64_t count = std::max<std::uint64_t>(1, bytes / 4);
  return model.select(coll::Collective::kAllReduce, count, WIA_FLOAT32).estimated_ms * 1e3;
}

std::string fmt_bytes(double b) {
  if (b >= 1 << 20) return fmt::format("{:.1f} MiB", b / (1 << 20));
  if (b >= 1 << 10) return fmt::format("{:.1f} KiB", b / (1 << 10));
  return fmt::format("{:.0f} B", b);
}

// Many small all-reduces: the model's time for them one by one against the
// same bytes fused into buckets.
void suggest_fusion(const CommProfiler::OpStats& o, tuner::Selector& model,
                    std::vector<std::string>& out) {
  std::map<std::uint64_t, double> calls_of_size;
  double calls = 0, total = 0;
  double measured_s = 0;
  for (std::size_t i = 0; i < o.call_bytes.size(); ++i) {
    if (o.call_bytes[i] >= kFusionCandidateBytes) continue;
    // Timed call i stands for weight_at(i) calls (sampling: docs/profiling.md).
    const double w = o.weight_at(i);
    calls_of_size[o.call_bytes[i]] += w;
    calls += w;
    total += w * static_cast<double>(o.call_bytes[i]);
    measured_s += w * o.seconds[i];
  }
  if (calls < 1.5) return;
  double separate_us = 0;
  for (const auto& [bytes, n] : calls_of_size) separate_us += n * allreduce_us(model, bytes);
  const auto fused_bytes = static_cast<std::uint64_t>(std::llround(total));
  const std::uint64_t buckets = (fused_bytes + kFusionBucketBytes - 1) / kFusionBucketBytes;
  const double fused_us =
      static_cast<double>(buckets - 1) * allreduce_us(model, kFusionBucketBytes) +
      allreduce_us(model, fused_bytes - (buckets - 1) * kFusionBucketBytes);
  if (fused_us <= 0 || separate_us < kMinSpeedup * fused_us) return;
  out.push_back(fmt::format(
      "{}: {:.0f} calls under {} (average {}, {:.3f} ms measured in all): fuse them into {} "
      "bucket{} of up to {}: estimated {:.1f}x faster (cost model: {:.3f} ms one by one, "
      "{:.3f} ms fused)",
      o.name, calls, fmt_bytes(kFusionCandidateBytes), fmt_bytes(total / calls), measured_s * 1e3,
      buckets, buckets == 1 ? "" : "s", fmt_bytes(kFusionBucketBytes), separate_us / fused_us,
      separate_us / 1e3, fused_us / 1e3));
}

// Calls that ran an algorithm the model rates slower than its own choice
// for their sizes (a configuration rule, WIA_ALGO or the call's config
// forced it): the model's time of each call with the algorithm it ran
// against with the algorithm the tuner would pick. Calls through the
// node-shared windows are left out: the model costs messages on links,
// and the windows are chosen over its choice on purpose.
void suggest_algorithm(const CommProfiler::OpStats& o, coll::Collective c,
                       const tuner::LinkModel& links, tuner::Selector& model,
                       std::vector<std::string>& out) {
  // (ran, bytes) -> calls, each timed call standing for weight_at(i) calls
  std::map<std::pair<std::string, std::uint64_t>, double> calls;
  for (std::size_t i = 0; i < o.call_bytes.size(); ++i)
    if (std::strcmp(o.call_transport[i], "windows") != 0)
      calls[{o.call_algorithm[i], o.call_bytes[i]}] += o.weight_at(i);
  double ran_us = 0, best_us = 0;
  double n_calls = 0;
  std::string ran_names, best_names;
  auto note = [](std::string& names, const char* name) {
    if (("," + names + ",").find("," + std::string(name) + ",") == std::string::npos)
      names += (names.empty() ? "" : ",") + std::string(name);
  };
  for (const auto& [key, n] : calls) {
    const coll::AlgorithmInfo* info = coll::find_algorithm(c, key.first);
    if (info == nullptr) return;  // not one the model knows: nothing to compare
    coll::CollArgs args;
    args.collective = c;
    args.count = std::max<std::uint64_t>(1, key.second / 4);
    args.nranks = links.nranks;
    const tuner::Selection& best = model.select(c, args.count, WIA_FLOAT32);
    ran_us += n * tuner::select_chunks(args, info->algorithm, links).estimated_ms * 1e3;
    best_us += n * best.estimated_ms * 1e3;
    n_calls += n;
    note(ran_names, info->name);
    note(best_names, best.name);
  }
  if (best_us <= 0 || ran_us < kMinSpeedup * best_us) return;
  out.push_back(fmt::format(
      "{}: {:.0f} calls ran as {}; the cost model's choice for their sizes, {}, is estimated "
      "{:.1f}x faster (cost model: {:.3f} ms -> {:.3f} ms): let the tuner choose (remove the "
      "forced algorithm: configuration rule, WIA_ALGO or the call's config)",
      o.name, n_calls, ran_names, best_names, ran_us / best_us, ran_us / 1e3, best_us / 1e3));
}

// Compression where a link is slow: all-reduces of float data of at
// least kCompressionMinBytes, over links that are not memory (shm, the
// node-shared windows, one process), when the cost model's slowest link is
// under kSlowLinkGbps. Each call is costed plain and compressed by the same
// alpha-beta formula: 2 (p - 1) alpha + the bytes one rank puts on the
// wire (wia_compression_wire_bytes, headers included) / the link's
// bandwidth, plus, compressed, the codec's CPU time per entry, timed on
// this machine once per process (codec_ns). Only methods that keep the
// result close to the exact sum are proposed: int8 quantization and, for
// float32, a bfloat16 cast (top-k, 1-bit and low rank need error feedback
// and a convergence check: docs/compression.md).
constexpr std::uint64_t kCompressionMinBytes = 1u << 20;
constexpr double kSlowLinkGbps = 10.0;

// Nanoseconds per entry of the codecs, best of 3 over 256 Ki entries.
struct CodecNs {
  double int8_encode = 0, int8_decode = 0, bf16_narrow = 0, bf16_widen = 0;
};
const CodecNs& codec_ns() {
  static const CodecNs measured = [] {
    constexpr std::size_t n = 1u << 18;
    std::vector<float> x(n), acc(n);
    for (std::size_t i = 0; i < n; ++i) x[i] = std::sin(static_cast<float>(i) * 1e-3f);
    std::vector<std::byte> msg(compress::quantize_bytes(n, 8, compress::kChunk));
    std::vector<std::uint16_t> half(n);
    auto best = [&](auto&& run) {
      double fastest = 1e300;
      for (int r = 0; r < 3; ++r) {
        const auto t0 = Clock::now();
        run();
        fastest = std::min(fastest, std::chrono::duration<double>(Clock::now() - t0).count());
      }
      return fastest * 1e9 / static_cast<double>(n);
    };
    CodecNs c;
    c.int8_encode = best([&] { compress::quantize_encode(x, 8, compress::kChunk, 1, msg); });
    const std::byte* msgs[1] = {msg.data()};
    c.int8_decode = best([&] { compress::quantize_decode_sum(msgs, 8, compress::kChunk, acc); });
    c.bf16_narrow = best([&] { compress::from_float(x, WIA_BFLOAT16, half.data()); });
    c.bf16_widen = best([&] { compress::to_float(half.data(), WIA_BFLOAT16, acc); });
    return c;
  }();
  return measured;
}

// Whether a call's links are all memory: "shm", "windows", "host", or
// several of them joined by '+'.
bool memory_links(const std::string& transport) {
  for (std::size_t at = 0; at <= transport.size();) {
    const std::size_t plus = std::min(transport.find('+', at), transport.size());
    const std::string t = transport.substr(at, plus - at);
    if (t != "shm" && t != "windows" && t != "host") return false;
    at = plus + 1;
  }
  return true;
}

std::size_t wire_bytes(std::uint64_t count, wia_datatype_t dtype,
                       const wia_compression_config_t& cfg, int p) {
  std::size_t b = 0;
  if (wia_compression_wire_bytes(count, dtype, &cfg, p, &b) != WIA_SUCCESS)
    throw Error(WIA_ERROR_INTERNAL, wia_get_last_error());
  return b;
}

// A process communicator of several hosts with equally many ranks, where
// a plain float32 all-reduce can run dense inside hosts and compressed
// between them (docs/compression.md, "Compression between hosts").
struct HostsShape {
  int hosts = 1, per_host = 0;  // per_host 0: not equally many
  std::string link_codec = "none";  // what already asks for it (LinkCodecPolicy)
};

// Float32 all-reduces on such a communicator: costed by the estimate the
// link codec itself decides with (tuner::choose_link_codec), so that the
// suggestion promises what `compression.link_codec: auto` would do.
// Returns the calls it costed (the flat suggestion leaves them out).
double suggest_link_codec(const CommProfiler::OpStats& o, const tuner::LinkModel& links,
                          const HostsShape& hosts, std::vector<std::string>& out) {
  const auto min_bytes = static_cast<std::uint64_t>(
      Runtime::get().config().get_int("compression.link_codec_min_bytes"));
  double calls = 0, bytes = 0, measured_s = 0, plain_us = 0, coded_us = 0, between_gbps = 0;
  std::string codecs;
  for (std::size_t i = 0; i < o.call_bytes.size(); ++i) {
    const wia_datatype_t t = i < o.call_dtype.size() ? o.call_dtype[i] : WIA_UINT8;
    // Whatever this rank's own links were (a hierarchical schedule's
    // other ranks use only their host's): the call crosses between hosts.
    if (t != WIA_FLOAT32 || o.call_bytes[i] < min_bytes) continue;
    tuner::LinkCodecCall call;
    call.hosts = hosts.hosts;
    call.per_host = hosts.per_host;
    call.count = o.call_bytes[i] / 4;
    const tuner::LinkCodecChoice choice = tuner::choose_link_codec(links, call);
    const double weight = o.weight_at(i);
    calls += weight;
    bytes += weight * static_cast<double>(o.call_bytes[i]);
    measured_s += weight * o.seconds[i];
    plain_us += weight * choice.plain_us;
    coded_us += weight * (choice.codec == tuner::LinkCodec::kInt8   ? choice.int8_us
                          : choice.codec == tuner::LinkCodec::kBf16 ? choice.bf16_us
                                                                    : choice.plain_us);
    between_gbps = choice.between_gbps;
    const std::string name = tuner::link_codec_name(choice.codec);
    if (choice.codec != tuner::LinkCodec::kNone && codecs.find(name) == std::string::npos)
      codecs += (codecs.empty() ? "" : " or ") + name;
  }
  // Already asked for (the link codec chose with the same estimate), or
  // not worth it.
  if (calls <= 0 || hosts.link_codec != "none" || codecs.empty() || coded_us <= 0 ||
      plain_us < kMinSpeedup * coded_us)
    return calls;
  out.push_back(fmt::format(
      "{}: {:.0f} calls of float32 data of {} or more (average {}, {:.3f} ms measured in all) "
      "cross between {} hosts, over a slow link in the cost model ({:.3g} GB/s between "
      "hosts): set compression.link_codec: auto (or a selector rule's compress key, or "
      "WIA_NET_COMPRESS_AUTO) so that these plain all-reduces run dense inside each host and "
      "{} between hosts: estimated {:.1f}x faster (cost model, {} hosts x {} ranks: {:.3f} ms "
      "plain -> {:.3f} ms)",
      o.name, calls, fmt_bytes(min_bytes), fmt_bytes(bytes / calls), measured_s * 1e3,
      hosts.hosts, between_gbps, codecs, plain_us / coded_us, hosts.hosts, hosts.per_host,
      plain_us / 1e3, coded_us / 1e3));
  return calls;
}

void suggest_compression(const CommProfiler::OpStats& o, const tuner::LinkModel& links,
                         const HostsShape& hosts, std::vector<std::string>& out) {
  // On several hosts, float32 calls compress between hosts by themselves
  // once asked: that estimate, not the flat compressed call's.
  const bool across_hosts = hosts.hosts >= 2 && hosts.per_host >= 1;
  if (across_hosts) suggest_link_codec(o, links, hosts, out);
  const int p = links.nranks;
  double gbps = links.gbps, alpha_us = links.alpha_us;
  if (!links.gbps_matrix.empty()) {
    gbps = 0;
    for (int a = 0; a < p; ++a)
      for (int b = 0; b < p; ++b)
        if (a != b && (gbps == 0 || links.bandwidth(a, b) < gbps)) gbps = links.bandwidth(a, b);
  }
  if (!links.alpha_matrix_us.empty()) {
    alpha_us = 0;
    for (int a = 0; a < p; ++a)
      for (int b = 0; b < p; ++b)
        if (a != b) alpha_us = std::max(alpha_us, links.alpha(a, b));
  }
  if (p < 2 || gbps <= 0 || gbps >= kSlowLinkGbps) return;
  struct Method {
    const char* text = "";
    wia_compression_config_t cfg{};
    double us = 0, codec_us = 0, wire = 0;
  };
  Method int8, bf16;
  int8.text = "int8 quantization (WIA_COMPRESS_QUANTIZE, num_bits 8, use_dynamic_range)";
  int8.cfg.method = WIA_COMPRESS_QUANTIZE;
  int8.cfg.parameters.quantize.num_bits = 8;
  int8.cfg.parameters.quantize.use_dynamic_range = true;
  bf16.text = "a bfloat16 cast (WIA_COMPRESS_BF16)";
  bf16.cfg.method = WIA_COMPRESS_BF16;
  wia_compression_config_t none{};
  none.method = WIA_COMPRESS_NONE;
  const CodecNs* ns = nullptr;
  double plain_us = 0, plain_wire = 0, measured_s = 0;
  double calls = 0, bytes = 0;
  bool all_fp32 = true;
  const char* via = "";
  wia_datatype_t dtype = WIA_FLOAT32;
  const double rounds_us = 2.0 * (p - 1) * alpha_us;
  for (std::size_t i = 0; i < o.call_bytes.size(); ++i) {
    const wia_datatype_t t = i < o.call_dtype.size() ? o.call_dtype[i] : WIA_UINT8;
    if (o.call_bytes[i] < kCompressionMinBytes ||
        (t != WIA_FLOAT32 && t != WIA_FLOAT16 && t != WIA_BFLOAT16) ||
        (across_hosts && t == WIA_FLOAT32) || memory_links(o.call_transport[i]))
      continue;
    if (ns == nullptr) ns = &codec_ns();
    const double weight = o.weight_at(i);  // calls this timed call stands for
    const std::uint64_t n = o.call_bytes[i] / compress::float_type_size(t);
    calls += weight;
    bytes += weight * static_cast<double>(o.call_bytes[i]);
    measured_s += weight * o.seconds[i];
    via = o.call_transport[i];
    dtype = t;
    all_fp32 = all_fp32 && t == WIA_FLOAT32;
    const double w = static_cast<double>(wire_bytes(n, t, none, p));
    plain_wire += weight * w;
    plain_us += weight * (rounds_us + w / (gbps * 1e3));
    // Quantized in shards (no error feedback): each rank encodes and
    // decodes about twice its vector (its input, then its reduced shard
    // gathered by all); charged as two encodes and two decodes of it.
    const double dn = static_cast<double>(n);
    Method* ms[] = {&int8, &bf16};
    for (Method* m : ms) {
      const double mw = static_cast<double>(wire_bytes(n, t, m->cfg, p));
      const double codec = m == &int8 ? dn * 2 * (ns->int8_encode + ns->int8_decode) / 1e3
                                      : dn * (ns->bf16_narrow + ns->bf16_widen) / 1e3;
      m->wire += weight * mw;
      m->codec_us += weight * codec;
      m->us += weight * (rounds_us + mw / (gbps * 1e3) + codec);
    }
  }
  if (calls <= 0) return;
  const Method* best = &int8;
  if (all_fp32 && bf16.us < int8.us) best = &bf16;  // the cast gains nothing on 16-bit data
  if (best->us <= 0 || plain_us < kMinSpeedup * best->us) return;
  const char* type = dtype == WIA_FLOAT32   ? "float32"
                     : dtype == WIA_FLOAT16 ? "float16"
                                            : "bfloat16";
  out.push_back(fmt::format(
      "{}: {:.0f} calls of {}{} data of {} or more (average {}, {:.3f} ms measured in all) "
      "over {}, a slow link in the cost model ({:.3g} GB/s, {:.3g} us): compress them with "
      "wia_all_reduce_compressed{}, {}: estimated {:.1f}x faster (cost model: {:.3f} ms plain "
      "-> {:.3f} ms, {:.1f}x fewer bytes on the wire, {:.3f} ms of it encoding and decoding as "
      "timed here)",
      o.name, calls, type, all_fp32 ? "" : " (or other float)", fmt_bytes(kCompressionMinBytes),
      fmt_bytes(bytes / calls), measured_s * 1e3, via, gbps, alpha_us, all_fp32 ? "" : "_ex",
      best->text, plain_us / best->us, plain_us / 1e3, best->us / 1e3,
      best->wire > 0 ? plain_wire / best->wire : 0.0, best->codec_us / 1e3));
}

// `forced`: a process communicator's links whose transport the
// configuration forced (nullptr for a device communicator).
std::vector<std::string> suggestions(
    const CommProfiler::Snapshot& s, std::optional<tuner::LinkModel> m, int nranks,
    const MeasuredWindow& window,
    const std::vector<comm::ProcessCommunicator::ForcedTransport>* forced,
    const HostsShape& hosts) {
  std::vector<std::string> out;
  if (!m || nranks < 2) return out;
  const tuner::LinkModel links = *m;
  tuner::Selector model(std::move(*m));
  for (const auto& o : s.ops) {
    for (int i = 0; i < coll::kCollectiveCount; ++i) {
      const auto c = static_cast<coll::Collective>(i);
      if (c == coll::Collective::kSendRecv || std::strcmp(o.name, coll::collective_name(c)) != 0)
        continue;
      if (c == coll::Collective::kAllReduce) suggest_fusion(o, model, out);
      try {
        suggest_algorithm(o, c, links, model, out);
      } catch (const Error& e) {  // a size the model cannot cost: no suggestion
        log::debug("profile", "{}: no algorithm suggestion: {}", o.name, e.what());
      }
      if (c == coll::Collective::kAllReduce) {
        try {
          suggest_compression(o, links, hosts, out);
        } catch (const Error& e) {
          log::debug("profile", "{}: no compression suggestion: {}", o.name, e.what());
        }
      }
    }
  }
  // Over every collective and point to point of the window.
  try {
    suggest_chunking(s, window, model, out);
  } catch (const Error& e) {
    log::debug("profile", "no chunking suggestion: {}", e.what());
  }
  if (forced != nullptr) {
    try {
      suggest_transport(s, *forced, links, out);
    } catch (const Error& e) {
      log::debug("profile", "no transport suggestion: {}", e.what());
    }
  }
  return out;
}

std::unique_ptr<ReportBlock> build_block(wia_communicator_t comm) {
  CommProfiler& p = profiler_of(comm);
  comm::CommunicatorBase& base = live(comm);
  auto* pc = dynamic_cast<comm::ProcessCommunicator*>(&base);
  auto* dc = dynamic_cast<comm::DeviceCommunicator*>(&base);
  if (dc != nullptr) dc->settle_profile();
  const CommProfiler::Snapshot s = p.snapshot();
  auto block = std::make_unique<ReportBlock>();
  wia_comm_profile_report_t& r = block->report;
  r.window_time = std::chrono::duration<double>(Clock::now() - s.window_start).count();
  // Bandwidth utilization: a collective's bus bandwidth over the bound the
  // tuner's cost model gives for its size (the bus bandwidth of the best
  // algorithm's estimated time, latency included), which is the model's
  // time over the measured one; a send or receive's over the slowest
  // link's bandwidth.
  const double bound = !s.settings.enable_bandwidth_tracking ? 0.0
                       : pc != nullptr                       ? pc->slowest_link_gbps()
                       : dc != nullptr                       ? dc->slowest_link_gbps()
                                                             : 0.0;
  std::optional<tuner::LinkModel> model;
  if (pc != nullptr) model = pc->cost_model();
  if (dc != nullptr) model = dc->cost_model();
  std::optional<tuner::Selector> bound_model;
  if (model && s.settings.enable_bandwidth_tracking && base.size() > 1) bound_model.emplace(*model);
  auto model_seconds = [&](const CommProfiler::OpStats& o, std::size_t i) -> double {
    if (!bound_model) return 0.0;
    for (int k = 0; k < coll::kCollectiveCount; ++k) {
      const auto c = static_cast<coll::Collective>(k);
      if (c == coll::Collective::kSendRecv || std::strcmp(o.name, coll::collective_name(c)) != 0)
        continue;
      const wia_datatype_t t = i < o.call_dtype.size() ? o.call_dtype[i] : WIA_UINT8;
      const std::uint64_t count =
          std::max<std::uint64_t>(1, o.call_bytes[i] / kernels::dtype_size(t));
      try {
        return bound_model->select(c, count, t).estimated_ms * 1e-3;
      } catch (const Error&) {
        return 0.0;  // a size the model cannot cost: not counted
      }
    }
    return -1.0;  // point to point
  };
  double util = 0;
  std::size_t util_n = 0;
  for (const auto& o : s.ops) {
    wia_collective_profile_t c{};
    c.name = block->strings.emplace_back(o.name).c_str();
    c.algorithm = block->strings.emplace_back(o.algorithm).c_str();
    c.transport = o.transport;  // interned for the life of the process
    // Counts and bytes are exact; times are the timed calls' (all of them
    // at sample_every 1), the total extrapolated to every call.
    const auto timed = static_cast<double>(o.seconds.size());
    // The spec's field is an int: saturated, not wrapped negative; the
    // average uses the exact 64-bit count.
    c.invocation_count = static_cast<int>(
        std::min<std::uint64_t>(o.count, static_cast<std::uint64_t>(INT_MAX)));
    c.total_time = o.total_seconds();
    c.avg_time = o.count > 0 ? c.total_time / static_cast<double>(o.count) : 0.0;
    if (s.settings.enable_bandwidth_tracking && c.invocation_count > 0) {
      c.bytes = o.bytes;
      c.avg_bandwidth = timed > 0 ? sum(o.algbw_gbps) / timed : 0.0;
      for (std::size_t i = 0; i < o.seconds.size(); ++i) {
        const double t_model = model_seconds(o, i);
        if (t_model > 0 && o.seconds[i] > 0)
          util += t_model / o.seconds[i], ++util_n;
        else if (t_model < 0 && bound > 0)
          util += o.busbw_gbps[i] / bound, ++util_n;
      }
    }
    if (s.settings.enable_latency_tracking && timed > 0) {
      c.min_time = *std::min_element(o.seconds.begin(), o.seconds.end());
      c.max_time = *std::max_element(o.seconds.begin(), o.seconds.end());
      c.p50_time = percentile(o.seconds, 0.50);
      c.p99_time = percentile(o.seconds, 0.99);
    }
    r.total_comm_time += c.total_time;
    block->list.push_back(c);
  }
  r.avg_bandwidth_utilization = util_n > 0 ? util / static_cast<double>(util_n) : 0.0;
  if (s.settings.enable_overlap_analysis) overlap(s, base, r);
  r.num_collectives = static_cast<int>(block->list.size());
  r.collectives = block->list.data();
  const MeasuredWindow window{s.settings.enable_overlap_analysis != 0, r.total_compute_time,
                              r.overlap_efficiency};
  HostsShape hosts;
  if (pc != nullptr) {
    hosts.hosts = pc->node_count();
    hosts.per_host = compressed::ranks_per_host(*pc);
    hosts.link_codec = compressed::link_codec_policy(comm, *pc).policy;
  }
  for (const std::string& text :
       suggestions(s, std::move(model), base.size(), window,
                   pc != nullptr ? &pc->forced_transports() : nullptr, hosts))
    block->suggestions.push_back(block->strings.emplace_back(text).c_str());
  r.num_suggestions = static_cast<int>(block->suggestions.size());
  r.suggestions = block->suggestions.empty() ? nullptr : block->suggestions.data();
  return block;
}

wia_comm_profile_report_t* keep(std::unique_ptr<ReportBlock> block) {
  wia_comm_profile_report_t* out = &block->report;
  std::lock_guard lock(reports_mu());
  reports()[out] = std::move(block);
  return out;
}

wia_comm_profile_report_t* build_report(wia_communicator_t comm) { return keep(build_block(comm)); }

// wia_get_comm_profile_job: one rank's entry of one collective as it
// travels, fixed size, names truncated to their arrays (the longest today,
// "recv_staged" and transports like "ofi+shm+tcp", fit with room).
struct WireEntry {
  char name[32];
  char algorithm[32];
  char transport[64];
  std::int64_t invocation_count;
  double total_time, avg_time, avg_bandwidth, min_time, p50_time, p99_time, max_time;
  std::uint64_t bytes;
};
static_assert(std::is_trivially_copyable_v<WireEntry>);

WireEntry to_wire(const wia_collective_profile_t& c) {
  WireEntry w{};
  std::snprintf(w.name, sizeof(w.name), "%s", c.name != nullptr ? c.name : "");
  std::snprintf(w.algorithm, sizeof(w.algorithm), "%s", c.algorithm != nullptr ? c.algorithm : "");
  std::snprintf(w.transport, sizeof(w.transport), "%s", c.transport != nullptr ? c.transport : "");
  w.invocation_count = c.invocation_count;
  w.total_time = c.total_time;
  w.avg_time = c.avg_time;
  w.avg_bandwidth = c.avg_bandwidth;
  w.min_time = c.min_time;
  w.p50_time = c.p50_time;
  w.p99_time = c.p99_time;
  w.max_time = c.max_time;
  w.bytes = c.bytes;
  return w;
}

// An all-gather of `bytes` bytes per rank over the communicator, now, on
// this thread, bounded by `timeout_ms` (0 = the configured default).
void all_gather_now(comm::ProcessCommunicator& pc, const void* mine, void* all, std::uint64_t bytes,
                    std::uint32_t timeout_ms) {
  comm::Call c;
  c.collective = coll::Collective::kAllGather;
  c.dtype = WIA_UINT8;
  c.count = bytes;
  c.timeout_ms = timeout_ms;
  c.buffers.send = const_cast<char*>(static_cast<const char*>(mine));
  c.buffers.recv = static_cast<char*>(all);
  pc.run_now(c);
}

// Every rank's entries, [rank][i]: how many each has, then all of them
// padded to the longest list. Two all-gathers, not recorded.
std::vector<std::vector<WireEntry>> gather_entries(
    comm::ProcessCommunicator& pc, const std::vector<wia_collective_profile_t>& mine,
    std::uint32_t timeout_ms) {
  const CommProfiler::UnrecordedOnThisThread unrecorded;
  const auto p = static_cast<std::size_t>(pc.size());
  const std::uint64_t n = mine.size();
  std::vector<std::uint64_t> counts(p);
  all_gather_now(pc, &n, counts.data(), sizeof n, timeout_ms);
  const std::uint64_t longest = *std::max_element(counts.begin(), counts.end());
  std::vector<std::vector<WireEntry>> out(p);
  if (longest == 0) return out;
  if (longest > 4096)
    throw Error(WIA_ERROR_REMOTE,
                fmt::format("a rank reported {} profile entries: not a profile", longest));
  std::vector<WireEntry> padded(longest, WireEntry{});
  for (std::size_t i = 0; i < mine.size(); ++i) padded[i] = to_wire(mine[i]);
  std::vector<WireEntry> all(longest * p);
  all_gather_now(pc, padded.data(), all.data(), longest * sizeof(WireEntry), timeout_ms);
  for (std::size_t r = 0; r < p; ++r)
    out[r].assign(all.begin() + static_cast<std::ptrdiff_t>(r * longest),
                  all.begin() + static_cast<std::ptrdiff_t>(r * longest + counts[r]));
  return out;
}

// The job-wide summary into `b`, from every rank's entries.
void fill_job(ReportBlock& b, const std::vector<std::vector<WireEntry>>& ranks) {
  const int p = static_cast<int>(ranks.size());
  std::vector<std::string> names;  // first appearance, rank 0's first
  for (const auto& list : ranks)
    for (const WireEntry& w : list)
      if (std::find(names.begin(), names.end(), w.name) == names.end()) names.emplace_back(w.name);
  b.job.assign(names.size(), wia_job_collective_profile_t{});
  b.job_ranks.assign(names.size(), std::vector<wia_collective_profile_t>(ranks.size()));
  for (std::size_t k = 0; k < names.size(); ++k) {
    wia_job_collective_profile_t& j = b.job[k];
    j.name = b.strings.emplace_back(names[k]).c_str();
    j.nranks = p;
    j.ranks = b.job_ranks[k].data();
    double sum_total = 0;
    for (int r = 0; r < p; ++r) {
      wia_collective_profile_t& c = b.job_ranks[k][static_cast<std::size_t>(r)];
      c.name = j.name;
      c.algorithm = "";
      c.transport = "";
      for (const WireEntry& w : ranks[static_cast<std::size_t>(r)]) {
        if (names[k] != w.name) continue;
        c.invocation_count = static_cast<int>(w.invocation_count);
        c.total_time = w.total_time;
        c.avg_time = w.avg_time;
        c.avg_bandwidth = w.avg_bandwidth;
        c.min_time = w.min_time;
        c.p50_time = w.p50_time;
        c.p99_time = w.p99_time;
        c.max_time = w.max_time;
        c.bytes = w.bytes;
        c.algorithm = b.strings.emplace_back(w.algorithm).c_str();
        c.transport = CommProfiler::intern_transport(w.transport);
      }
      sum_total += c.total_time;
      if (r == 0 || c.total_time > j.slowest_total_time)
        j.slowest_rank = r, j.slowest_total_time = c.total_time;
      if (r == 0 || c.total_time < j.fastest_total_time)
        j.fastest_rank = r, j.fastest_total_time = c.total_time;
    }
    j.mean_total_time = p > 0 ? sum_total / p : 0.0;
  }
  b.report.job_nranks = p;
  b.report.num_job_collectives = static_cast<int>(b.job.size());
  b.report.job_collectives = b.job.empty() ? nullptr : b.job.data();
}

wia_comm_profile_report_t* build_job_report(wia_communicator_t comm, std::uint32_t timeout_ms) {
  auto* process = dynamic_cast<comm::ProcessCommunicator*>(&live(comm));
  if (process == nullptr)
    throw Error(WIA_ERROR_NOT_SUPPORTED,
                "a device communicator's ranks are all in this process: wia_get_comm_profile "
                "already reports the whole communicator (the job-wide summary gathers the "
                "reports of process communicators)");
  std::unique_ptr<ReportBlock> block = build_block(comm);  // this rank's, before gathering
  comm::ProcessCommunicator& pc = *process;
  std::vector<std::vector<WireEntry>> ranks;
  try {
    ranks = gather_entries(pc, block->list, timeout_ms);
  } catch (const Error& e) {
    throw Error(e.status(),
                fmt::format("rank {}: gathering every rank's profile: {}", pc.rank(), e.what()));
  }
  fill_job(*block, ranks);
  return keep(std::move(block));
}

}  // namespace
}  // namespace wia::api

WIA_API wia_comm_profile_report_t* wia_get_comm_profile(wia_communicator_t comm) {
  wia_comm_profile_report_t* out = nullptr;
  api::guard(__func__, [&] { out = api::build_report(comm); });
  return out;
}

WIA_API wia_comm_profile_report_t* wia_get_comm_profile_job(wia_communicator_t comm,
                                                            uint32_t timeout_ms) {
  wia_comm_profile_report_t* out = nullptr;
  api::guard(__func__, [&] { out = api::build_job_report(comm, timeout_ms); });
  return out;
}

WIA_API void wia_free_comm_profile(wia_comm_profile_report_t* report) {
  std::lock_guard lock(api::reports_mu());
  api::reports().erase(report);  // unknown pointers (and NULL) are ignored
}
