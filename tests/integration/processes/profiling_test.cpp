// SPDX-License-Identifier: Apache-2.0
// Communication profiling (spec 6.11) on 2 real processes: counts are
// exact, averages are totals over counts, times agree with the caller's own
// clock, compute is the host functions of known duration, overlap is near
// 0 for a serialized workload and near 1 when the collectives run under a
// long host function on another stream, and disabling stops the counting.
#include <doctest/doctest.h>
#include <wia/wia.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "process_harness.hpp"

namespace {
using namespace wia::test::processes;
using Clock = std::chrono::steady_clock;

void sleep_20ms(void*) { std::this_thread::sleep_for(std::chrono::milliseconds(20)); }
void sleep_400ms(void*) { std::this_thread::sleep_for(std::chrono::milliseconds(400)); }
void sleep_300ms(void*) { std::this_thread::sleep_for(std::chrono::milliseconds(300)); }
void sleep_100ms(void*) { std::this_thread::sleep_for(std::chrono::milliseconds(100)); }

#define EXPECT_R(cond)                                                               \
  do {                                                                               \
    if (!(cond)) {                                                                   \
      std::fprintf(stderr, "rank %d: %s:%d: %s\n", rank, __FILE__, __LINE__, #cond); \
      return kWrong;                                                                 \
    }                                                                                \
  } while (0)

// A file's whole text ("" when it cannot be read).
std::string file_text(const std::string& path) {
  std::string text;
  if (FILE* f = std::fopen(path.c_str(), "r")) {
    char chunk[4096];
    for (std::size_t n; (n = std::fread(chunk, 1, sizeof chunk, f)) > 0;) text.append(chunk, n);
    std::fclose(f);
  }
  return text;
}

// How many times `what` occurs in `text`.
int count_of(const std::string& text, const std::string& what) {
  int n = 0;
  for (std::size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

// Profiling enabled (all of it), then 3 float32 all-reduces of 4 MiB on
// the default stream: their report (nullptr when a call failed).
wia_comm_profile_report_t* profile_three_4mib_all_reduces(wia_communicator_t comm) {
  const wia_comm_profiling_t all = {true, true, true};
  if (wia_enable_comm_profiling(comm, &all) != WIA_SUCCESS) return nullptr;
  std::vector<float> big(std::size_t{1} << 20, 1.0f);  // 4 MiB
  wia_collective_config_t cfg{};
  cfg.datatype = WIA_FLOAT32;
  for (int i = 0; i < 3; ++i)
    if (wia_all_reduce(comm, big.data(), big.data(), big.size(), &cfg, nullptr) != WIA_SUCCESS)
      return nullptr;
  if (wia_stream_synchronize(nullptr) != WIA_SUCCESS) return nullptr;
  return wia_get_comm_profile(comm);
}

// How many suggestions contain `needle`.
int suggestions_with(const wia_comm_profile_report_t* r, const char* needle) {
  int n = 0;
  for (int i = 0; i < r->num_suggestions; ++i)
    if (std::strstr(r->suggestions[i], needle) != nullptr) ++n;
  return n;
}

// The speedup a suggestion states ("estimated 2.3x faster"); 0 when it
// states none.
double stated_speedup(const std::string& text) {
  const std::size_t at = text.find("estimated ");
  if (at == std::string::npos) return 0;
  char* end = nullptr;
  const double x = std::strtod(text.c_str() + at + 10, &end);
  return end != nullptr && std::strncmp(end, "x faster", 8) == 0 && std::isfinite(x) ? x : 0;
}

// The suggestions' phrases that tell them apart.
constexpr const char* kChunking = "chunks posted as the compute produces their data";
constexpr const char* kTransport = "which the configuration forced";

int profile(int rank, int nranks) {
  wia_communicator_t comm = join(rank, nranks);
  if (!comm) return kApiError;
  // A device communicator beside it is profiled too (device_profile
  // below), but has no job-wide summary: its ranks are all here.
  wia_device_t dev = 0;
  wia_communicator_t local = nullptr;
  const wia_comm_profiling_t all = {true, true, true};
  if (wia_create_communicator(&dev, 1, &local) == WIA_SUCCESS) {
    EXPECT_R(wia_enable_comm_profiling(local, &all) == WIA_SUCCESS);
    EXPECT_R(wia_get_comm_profile_job(local, 0) == nullptr);
    EXPECT_R(std::string(wia_get_last_error()).find("device communicator") != std::string::npos);
    wia_destroy_communicator(local);
  }
  EXPECT_R(wia_enable_comm_profiling(comm, &all) == WIA_SUCCESS);
  std::vector<float> buf(1 << 18, 1.0f);  // 1 MiB
  wia_collective_config_t cfg{};
  cfg.datatype = WIA_FLOAT32;

  // Serialized: 20 all-reduces, then 5 host functions of 20 ms.
  const auto t0 = Clock::now();
  for (int i = 0; i < 20; ++i) {
    EXPECT_R(wia_all_reduce(comm, buf.data(), buf.data(), buf.size(), &cfg, nullptr) ==
             WIA_SUCCESS);
    EXPECT_R(wia_stream_synchronize(nullptr) == WIA_SUCCESS);
  }
  EXPECT_R(wia_broadcast(comm, buf.data(), 1000, 0, WIA_FLOAT32, nullptr) == WIA_SUCCESS);
  for (int i = 0; i < 5; ++i)
    EXPECT_R(wia_launch_host_func(nullptr, sleep_20ms, nullptr) == WIA_SUCCESS);
  EXPECT_R(wia_stream_synchronize(nullptr) == WIA_SUCCESS);
  const double wall = std::chrono::duration<double>(Clock::now() - t0).count();
  wia_comm_profile_report_t* r = wia_get_comm_profile(comm);
  EXPECT_R(r != nullptr);
  EXPECT_R(r->num_collectives == 2);  // allreduce, broadcast
  const wia_collective_profile_t* ar = nullptr;
  for (int i = 0; i < r->num_collectives; ++i)
    if (std::string(r->collectives[i].name) == "allreduce") ar = &r->collectives[i];
  EXPECT_R(ar != nullptr);
  EXPECT_R(ar->invocation_count == 20);
  EXPECT_R(std::fabs(ar->avg_time * 20 - ar->total_time) < 1e-9);
  EXPECT_R(ar->total_time > 0 && ar->total_time < wall);
  EXPECT_R(ar->min_time <= ar->p50_time && ar->p50_time <= ar->p99_time &&
           ar->p99_time <= ar->max_time && ar->min_time > 0);
  EXPECT_R(ar->bytes == 20ull * buf.size() * sizeof(float));
  EXPECT_R(ar->avg_bandwidth > 0 && std::isfinite(ar->avg_bandwidth));
  EXPECT_R(std::strlen(ar->algorithm) > 0);
  EXPECT_R(r->total_comm_time >= ar->total_time && r->total_comm_time < wall);
  EXPECT_R(r->total_compute_time >= 0.099 && r->total_compute_time < wall);
  EXPECT_R(r->overlap_efficiency >= 0.0 && r->overlap_efficiency < 0.2);
  EXPECT_R(r->avg_bandwidth_utilization > 0 && std::isfinite(r->avg_bandwidth_utilization));
  EXPECT_R(r->num_suggestions == 0);
  std::fprintf(stderr,
               "rank %d: serialized: comm %.4f s, compute %.4f s, overlap %.3f, allreduce avg "
               "%.3f ms %.2f GB/s (%s), utilization %.3f\n",
               rank, r->total_comm_time, r->total_compute_time, r->overlap_efficiency,
               ar->avg_time * 1e3, ar->avg_bandwidth, ar->algorithm, r->avg_bandwidth_utilization);
  wia_free_comm_profile(r);

  // Overlapped: the collectives run while a 400 ms host function runs on
  // another stream of this device.
  EXPECT_R(wia_reset_comm_profile(comm) == WIA_SUCCESS);
  wia_stream_t compute = nullptr;
  EXPECT_R(wia_create_stream(&compute) == WIA_SUCCESS);
  EXPECT_R(wia_launch_host_func(compute, sleep_400ms, nullptr) == WIA_SUCCESS);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));  // it has started
  for (int i = 0; i < 5; ++i) {
    EXPECT_R(wia_all_reduce(comm, buf.data(), buf.data(), buf.size(), &cfg, nullptr) ==
             WIA_SUCCESS);
    EXPECT_R(wia_stream_synchronize(nullptr) == WIA_SUCCESS);
  }
  EXPECT_R(wia_stream_synchronize(compute) == WIA_SUCCESS);
  r = wia_get_comm_profile(comm);
  EXPECT_R(r != nullptr && r->num_collectives == 1 && r->collectives[0].invocation_count == 5);
  std::fprintf(stderr, "rank %d: overlapped: comm %.4f s, compute %.4f s, overlap %.3f\n", rank,
               r->total_comm_time, r->total_compute_time, r->overlap_efficiency);
  EXPECT_R(r->overlap_efficiency > 0.8 && r->overlap_efficiency <= 1.0 + 1e-9);
  EXPECT_R(r->total_compute_time >= 0.35);
  EXPECT_R(suggestions_with(r, kChunking) == 0);  // already overlapped
  wia_free_comm_profile(r);
  wia_destroy_stream(compute);

  // Disabled: nothing more is counted.
  EXPECT_R(wia_disable_comm_profiling(comm) == WIA_SUCCESS);
  EXPECT_R(wia_all_reduce(comm, buf.data(), buf.data(), 16, &cfg, nullptr) == WIA_SUCCESS);
  EXPECT_R(wia_stream_synchronize(nullptr) == WIA_SUCCESS);
  r = wia_get_comm_profile(comm);
  EXPECT_R(r != nullptr && r->collectives[0].invocation_count == 5);
  wia_free_comm_profile(r);
  wia_free_comm_profile(nullptr);
  wia_destroy_communicator(comm);
  return kOk;
}

// The transport each entry names: what WIA_TRANSPORT_EXPECT allows (a
// '|'-separated list) for the all-reduce, and exactly the link's for send
// and receive.
int transport_named(int rank, int nranks) {
  wia_communicator_t comm = join(rank, nranks);
  if (!comm) return kApiError;
  const std::string allowed = std::getenv("TEST_TRANSPORT_EXPECT");
  const wia_comm_profiling_t all = {true, true, true};
  EXPECT_R(wia_enable_comm_profiling(comm, &all) == WIA_SUCCESS);
  std::vector<float> buf(1024, 1.0f);
  wia_collective_config_t cfg{};
  cfg.datatype = WIA_FLOAT32;
  EXPECT_R(wia_all_reduce(comm, buf.data(), buf.data(), buf.size(), &cfg, nullptr) == WIA_SUCCESS);
  if (rank == 0)
    EXPECT_R(wia_comm_send(comm, buf.data(), 16, WIA_FLOAT32, 1, nullptr) == WIA_SUCCESS);
  else
    EXPECT_R(wia_comm_recv(comm, buf.data(), 16, WIA_FLOAT32, 0, nullptr) == WIA_SUCCESS);
  EXPECT_R(wia_stream_synchronize(nullptr) == WIA_SUCCESS);
  wia_comm_profile_report_t* r = wia_get_comm_profile(comm);
  EXPECT_R(r != nullptr && r->num_collectives == 2);
  std::string ar, p2p;
  for (int i = 0; i < r->num_collectives; ++i) {
    EXPECT_R(r->collectives[i].transport != nullptr);
    (std::string(r->collectives[i].name) == "allreduce" ? ar : p2p) = r->collectives[i].transport;
  }
  std::fprintf(stderr, "rank %d: allreduce over %s, point to point over %s\n", rank, ar.c_str(),
               p2p.c_str());
  wia_free_comm_profile(r);
  wia_destroy_communicator(comm);
  // Both names are one of the allowed ones; the point-to-point one is a
  // link's, never the windows.
  EXPECT_R(("|" + allowed + "|").find("|" + ar + "|") != std::string::npos);
  EXPECT_R(p2p != "windows" && ("|" + allowed + "|").find("|" + p2p + "|") != std::string::npos);
  return kOk;
}

// Writes this rank's timeline to TEST_TRACE_DIR/explicit.<rank>.json after
// 7 all-reduces, 3 broadcasts and one send/receive, and checks the errors.
int trace_explicit(int rank, int nranks) {
  wia_communicator_t comm = join(rank, nranks);
  if (!comm) return kApiError;
  const std::string dir = std::getenv("TEST_TRACE_DIR");
  const wia_comm_profiling_t all = {true, true, true};
  EXPECT_R(wia_enable_comm_profiling(comm, &all) == WIA_SUCCESS);
  std::vector<float> buf(1 << 16, 1.0f);
  wia_collective_config_t cfg{};
  cfg.datatype = WIA_FLOAT32;
  for (int i = 0; i < 7; ++i)
    EXPECT_R(wia_all_reduce(comm, buf.data(), buf.data(), std::size_t{16} << i, &cfg, nullptr) ==
             WIA_SUCCESS);
  for (int i = 0; i < 3; ++i)
    EXPECT_R(wia_broadcast(comm, buf.data(), 1000, 0, WIA_FLOAT32, nullptr) == WIA_SUCCESS);
  if (rank == 0)
    EXPECT_R(wia_comm_send(comm, buf.data(), 16, WIA_FLOAT32, 1, nullptr) == WIA_SUCCESS);
  else
    EXPECT_R(wia_comm_recv(comm, buf.data(), 16, WIA_FLOAT32, 0, nullptr) == WIA_SUCCESS);
  EXPECT_R(wia_stream_synchronize(nullptr) == WIA_SUCCESS);
  // Not recorded: profiling is off again.
  EXPECT_R(wia_disable_comm_profiling(comm) == WIA_SUCCESS);
  EXPECT_R(wia_all_reduce(comm, buf.data(), buf.data(), 16, &cfg, nullptr) == WIA_SUCCESS);
  EXPECT_R(wia_stream_synchronize(nullptr) == WIA_SUCCESS);

  const std::string path = dir + "/explicit." + std::to_string(rank) + ".json";
  EXPECT_R(wia_profile_write_trace(comm, path.c_str()) == WIA_SUCCESS);
  EXPECT_R(wia_profile_write_trace(comm, nullptr) == WIA_ERROR_INVALID_ARGUMENT);
  EXPECT_R(wia_profile_write_trace(comm, "") == WIA_ERROR_INVALID_ARGUMENT);
  const std::string bad = dir + "/no-such-dir/trace.json";
  EXPECT_R(wia_profile_write_trace(comm, bad.c_str()) == WIA_ERROR_IO);
  const std::string why = wia_get_last_error();
  EXPECT_R(why.find(bad) != std::string::npos);
  EXPECT_R(why.find(std::strerror(ENOENT)) != std::string::npos);
  wia_destroy_communicator(comm);
  return kOk;
}

// Asynchronous copies and sets on a stream are compute as host functions
// are: a memset and 6 copies of 64 MiB on a second stream, and meanwhile 3
// all-reduces of 1 MiB on the default stream. The report has compute and
// the all-reduces partly under it; the timeline has each of the 7 on the
// second stream's track (and the host function that says it runs).
int stream_work_is_compute(int rank, int nranks) {
  wia_communicator_t comm = join(rank, nranks);
  if (!comm) return kApiError;
  const std::string dir = std::getenv("TEST_TRACE_DIR");
  const wia_comm_profiling_t all = {true, true, true};
  EXPECT_R(wia_enable_comm_profiling(comm, &all) == WIA_SUCCESS);
  constexpr std::size_t kBytes = std::size_t{64} << 20;
  void* a = nullptr;
  void* b = nullptr;
  EXPECT_R(wia_malloc(&a, kBytes) == WIA_SUCCESS && wia_malloc(&b, kBytes) == WIA_SUCCESS);
  wia_stream_t work = nullptr;
  EXPECT_R(wia_create_stream(&work) == WIA_SUCCESS);
  std::vector<float> buf(1 << 18, 1.0f);  // 1 MiB
  wia_collective_config_t cfg{};
  cfg.datatype = WIA_FLOAT32;
  const auto t0 = Clock::now();
  // The all-reduces start once the stream runs (on a loaded machine its
  // thread may not run at once, and the copies would all come after).
  static std::atomic<bool> running{false};
  EXPECT_R(wia_launch_host_func(
               work, [](void*) { running.store(true); }, nullptr) == WIA_SUCCESS);
  EXPECT_R(wia_memset_async(a, 1, kBytes, work) == WIA_SUCCESS);
  for (int i = 0; i < 6; ++i) EXPECT_R(wia_memcpy_async(b, a, kBytes, work) == WIA_SUCCESS);
  const auto wait_until = Clock::now() + std::chrono::seconds(10);
  while (!running.load() && Clock::now() < wait_until) std::this_thread::yield();
  if (!running.load()) {
    std::fprintf(stderr, "rank %d: the stream of the copies did not run within 10 s\n", rank);
    return kWrong;
  }
  for (int i = 0; i < 3; ++i) {
    EXPECT_R(wia_all_reduce(comm, buf.data(), buf.data(), buf.size(), &cfg, nullptr) ==
             WIA_SUCCESS);
    EXPECT_R(wia_stream_synchronize(nullptr) == WIA_SUCCESS);
  }
  EXPECT_R(wia_stream_synchronize(work) == WIA_SUCCESS);
  const double wall = std::chrono::duration<double>(Clock::now() - t0).count();
  wia_comm_profile_report_t* r = wia_get_comm_profile(comm);
  EXPECT_R(r != nullptr);
  std::fprintf(stderr, "rank %d: copies as compute %.4f s of %.4f s, overlap %.3f\n", rank,
               r->total_compute_time, wall, r->overlap_efficiency);
  EXPECT_R(r->total_compute_time > 0 && r->total_compute_time <= wall);
  // Without the copies as compute it is 0; how much of the all-reduces
  // fall under them depends on the other rank's timing too.
  EXPECT_R(r->overlap_efficiency > 0.2);
  wia_free_comm_profile(r);
  const std::string path = dir + "/work." + std::to_string(rank) + ".json";
  EXPECT_R(wia_profile_write_trace(comm, path.c_str()) == WIA_SUCCESS);
  const std::string json = file_text(path);
  auto occurrences = [&](const std::string& what) { return count_of(json, what); };
  EXPECT_R(occurrences("\"name\":\"copy\",\"cat\":\"compute\"") == 6);
  EXPECT_R(occurrences("\"name\":\"memset\",\"cat\":\"compute\"") == 1);
  EXPECT_R(occurrences("\"compute_events\":8,") == 1);
  wia_destroy_stream(work);
  wia_free(a);
  wia_free(b);
  wia_destroy_communicator(comm);
  return kOk;
}

// Two faked hosts of 2 ranks (WIA_HOSTID), a link file with a slow link
// between them: 3 float32 all-reduces of 4 MiB get the suggestion to let
// them compress between hosts (compression.link_codec: auto), costed by
// the link codec's own estimate, and not the flat wia_all_reduce_compressed
// one; none when TEST_EXPECT_LINK_CODEC is 0 (the configuration already
// asks for it).
int link_codec_suggested(int rank, int nranks) {
  wia_communicator_t comm = join(rank, nranks);
  if (!comm) return kApiError;
  const bool expect = std::getenv("TEST_EXPECT_LINK_CODEC")[0] == '1';
  wia_comm_profile_report_t* r = profile_three_4mib_all_reduces(comm);
  EXPECT_R(r != nullptr);
  int across = 0, flat = 0;
  for (int i = 0; i < r->num_suggestions; ++i) {
    const std::string text = r->suggestions[i];
    std::fprintf(stderr, "rank %d: %s\n", rank, text.c_str());
    flat += text.find("wia_all_reduce_compressed") != std::string::npos;
    if (text.find("compression.link_codec: auto") == std::string::npos) continue;
    ++across;
    EXPECT_R(text.find("allreduce: 3 calls of float32 data") == 0);
    EXPECT_R(text.find("cross between 2 hosts") != std::string::npos);
    EXPECT_R(text.find("and int8 between hosts") != std::string::npos);  // under 10 GB/s
    EXPECT_R(text.find("2 hosts x 2 ranks") != std::string::npos);
    const std::size_t at = text.find("estimated ");
    EXPECT_R(at != std::string::npos);
    const double speedup = std::strtod(text.c_str() + at + 10, nullptr);
    EXPECT_R(speedup > 1.2 && std::isfinite(speedup));
  }
  EXPECT_R(across == (expect ? 1 : 0));
  EXPECT_R(flat == 0);
  wia_free_comm_profile(r);
  wia_destroy_communicator(comm);
  return kOk;
}

// Streams on the timeline, and a collective queued behind other work on
// its stream: on a second stream `work`, a 300 ms host function, then a
// 1 MiB all-reduce (timed from when its stream reaches it, so well under
// 300 ms and not overlapped with the host function it waited for); then a
// 100 ms host function on the default stream while another all-reduce
// runs on `work`. The trace, TEST_TRACE_DIR/streams.<rank>.json, is
// checked by the test case (kStreamTraceCheck).
int streams_on_timeline(int rank, int nranks) {
  wia_communicator_t comm = join(rank, nranks);
  if (!comm) return kApiError;
  const std::string dir = std::getenv("TEST_TRACE_DIR");
  const wia_comm_profiling_t all = {true, true, true};
  EXPECT_R(wia_enable_comm_profiling(comm, &all) == WIA_SUCCESS);
  std::vector<float> buf(1 << 18, 1.0f);  // 1 MiB
  wia_collective_config_t cfg{};
  cfg.datatype = WIA_FLOAT32;
  wia_stream_t work = nullptr;
  EXPECT_R(wia_create_stream(&work) == WIA_SUCCESS);
  EXPECT_R(wia_launch_host_func(work, sleep_300ms, nullptr) == WIA_SUCCESS);
  EXPECT_R(wia_all_reduce(comm, buf.data(), buf.data(), buf.size(), &cfg, work) == WIA_SUCCESS);
  EXPECT_R(wia_stream_synchronize(work) == WIA_SUCCESS);
  wia_comm_profile_report_t* r = wia_get_comm_profile(comm);
  EXPECT_R(r != nullptr && r->num_collectives == 1 && r->collectives[0].invocation_count == 1);
  std::fprintf(stderr, "rank %d: queued all-reduce %.4f s, compute %.4f s, overlap %.3f\n", rank,
               r->collectives[0].total_time, r->total_compute_time, r->overlap_efficiency);
  EXPECT_R(r->total_compute_time >= 0.299);
  EXPECT_R(r->collectives[0].total_time < 0.2);  // not the 300 ms it queued behind
  EXPECT_R(r->overlap_efficiency < 0.5);
  wia_free_comm_profile(r);

  EXPECT_R(wia_launch_host_func(nullptr, sleep_100ms, nullptr) == WIA_SUCCESS);
  EXPECT_R(wia_all_reduce(comm, buf.data(), buf.data(), buf.size(), &cfg, work) == WIA_SUCCESS);
  EXPECT_R(wia_stream_synchronize(work) == WIA_SUCCESS);
  EXPECT_R(wia_stream_synchronize(nullptr) == WIA_SUCCESS);
  const std::string path = dir + "/streams." + std::to_string(rank) + ".json";
  EXPECT_R(wia_profile_write_trace(comm, path.c_str()) == WIA_SUCCESS);
  wia_destroy_stream(work);
  wia_destroy_communicator(comm);
  return kOk;
}

// No profiling, WIA_TRACE set: every operation is on the timeline written
// at destroy, up to the bound; 5 more are counted as dropped.
int trace_from_env(int rank, int nranks) {
  wia_communicator_t comm = join(rank, nranks);
  if (!comm) return kApiError;
  float x = 1.0f;
  wia_collective_config_t cfg{};
  cfg.datatype = WIA_FLOAT32;
  // Synchronized now and then: an operation still pending when 4096 later
  // ones were posted is not recorded (docs/profiling.md), and a loaded
  // machine lets the posting run that far ahead.
  for (int i = 0; i < 65536 + 5; ++i) {
    EXPECT_R(wia_all_reduce(comm, &x, &x, 1, &cfg, nullptr) == WIA_SUCCESS);
    if (i % 1024 == 1023) EXPECT_R(wia_stream_synchronize(nullptr) == WIA_SUCCESS);
  }
  EXPECT_R(wia_stream_synchronize(nullptr) == WIA_SUCCESS);
  wia_destroy_communicator(comm);
  return kOk;
}

// The fusion suggestion: made for 200 all-reduces of 8 B, with an
// estimated speedup > 1.2 in its text, and not for 3 of 64 MiB; the
// algorithm suggestion: made when the ring is forced on 50 of 8 B, not
// when the tuner chose.
int fusion_suggested(int rank, int nranks) {
  wia_communicator_t comm = join(rank, nranks);
  if (!comm) return kApiError;
  const wia_comm_profiling_t all = {true, true, true};
  EXPECT_R(wia_enable_comm_profiling(comm, &all) == WIA_SUCCESS);
  wia_collective_config_t cfg{};
  cfg.datatype = WIA_FLOAT32;
  std::vector<float> small(2, 1.0f);
  for (int i = 0; i < 200; ++i)
    EXPECT_R(wia_all_reduce(comm, small.data(), small.data(), 2, &cfg, nullptr) == WIA_SUCCESS);
  EXPECT_R(wia_stream_synchronize(nullptr) == WIA_SUCCESS);
  // WIA_TRANSPORT=tcp between two processes of one node that have shm:
  // the transport suggestion too, after the collectives' own.
  const char* forced_env = std::getenv("WIA_TRANSPORT");
  const int forced = forced_env != nullptr && *forced_env != '\0' ? 1 : 0;
  wia_comm_profile_report_t* r = wia_get_comm_profile(comm);
  EXPECT_R(r != nullptr && r->num_suggestions == 1 + forced && r->suggestions != nullptr);
  EXPECT_R(suggestions_with(r, kTransport) == forced && suggestions_with(r, kChunking) == 0);
  // Utilization against the model's bound for 8 bytes (its latency), not
  // against the links' bandwidth, which 8-byte calls reach about 1e-3 of.
  std::fprintf(stderr, "rank %d: 8 B all-reduces: utilization %.3f\n", rank,
               r->avg_bandwidth_utilization);
  EXPECT_R(r->avg_bandwidth_utilization > 0.02 && std::isfinite(r->avg_bandwidth_utilization));
  const std::string text = r->suggestions[0];
  std::fprintf(stderr, "rank %d: %s\n", rank, text.c_str());
  EXPECT_R(text.find("allreduce: 200 calls") == 0 && text.find("fuse") != std::string::npos);
  const std::size_t at = text.find("estimated ");
  EXPECT_R(at != std::string::npos);
  const double speedup = std::strtod(text.c_str() + at + 10, nullptr);
  EXPECT_R(speedup > 1.2 && std::isfinite(speedup));
  EXPECT_R(text.compare(at + 10 + text.substr(at + 10).find('x'), 8, "x faster") == 0);
  wia_free_comm_profile(r);

  // Forced to the ring, 8 B all-reduces also hear that the tuner's choice
  // is faster (the tuner's own choice above did not).
  EXPECT_R(wia_reset_comm_profile(comm) == WIA_SUCCESS);
  wia_collective_config_t ring = cfg;
  ring.algorithm = WIA_ALGORITHM_RING;
  for (int i = 0; i < 50; ++i)
    EXPECT_R(wia_all_reduce(comm, small.data(), small.data(), 2, &ring, nullptr) == WIA_SUCCESS);
  EXPECT_R(wia_stream_synchronize(nullptr) == WIA_SUCCESS);
  r = wia_get_comm_profile(comm);
  EXPECT_R(r != nullptr && r->num_suggestions == 2 + forced);
  EXPECT_R(suggestions_with(r, kTransport) == forced);
  const std::string ring_text = r->suggestions[1];
  std::fprintf(stderr, "rank %d: %s\n", rank, ring_text.c_str());
  EXPECT_R(ring_text.find("allreduce: 50 calls ran as ring;") == 0);
  const std::size_t est = ring_text.find("is estimated ");
  EXPECT_R(est != std::string::npos && std::strtod(ring_text.c_str() + est + 13, nullptr) > 1.2);
  wia_free_comm_profile(r);

  EXPECT_R(wia_reset_comm_profile(comm) == WIA_SUCCESS);
  std::vector<float> large(std::size_t{16} << 20, 1.0f);  // 64 MiB
  for (int i = 0; i < 3; ++i)
    EXPECT_R(wia_all_reduce(comm, large.data(), large.data(), large.size(), &cfg, nullptr) ==
             WIA_SUCCESS);
  EXPECT_R(wia_stream_synchronize(nullptr) == WIA_SUCCESS);
  r = wia_get_comm_profile(comm);
  EXPECT_R(r != nullptr && r->num_collectives == 1 && r->collectives[0].invocation_count == 3);
  // Neither fusion nor another algorithm, nor chunking (no compute). Over
  // tcp (2.5 GB/s in the model) compression may be proposed where the
  // codecs are fast enough: that one is the model's call, tested on its
  // own; and the transport suggestion, since tcp was forced.
  EXPECT_R(suggestions_with(r, kTransport) == forced);
  for (int i = 0; i < r->num_suggestions; ++i)
    EXPECT_R(std::strstr(r->suggestions[i], "wia_all_reduce_compressed") != nullptr ||
             std::strstr(r->suggestions[i], kTransport) != nullptr);
  wia_free_comm_profile(r);
  wia_destroy_communicator(comm);
  return kOk;
}

// The job-wide summary on 3 ranks: rank 1 waits in every all-reduce (the
// others arrive 40 ms late), rank 2 in every broadcast, only rank 0 sends
// and only rank 1 receives. Every rank gets every rank's entries, the
// slowest rank named per collective, and the gathering itself is in no
// profile.
void sleep_ms(int ms) { std::this_thread::sleep_for(std::chrono::milliseconds(ms)); }

const wia_job_collective_profile_t* job_entry(const wia_comm_profile_report_t* r,
                                              const char* name) {
  for (int i = 0; i < r->num_job_collectives; ++i)
    if (std::strcmp(r->job_collectives[i].name, name) == 0) return &r->job_collectives[i];
  return nullptr;
}

int job_summary(int rank, int nranks) {
  wia_communicator_t comm = join(rank, nranks);
  if (!comm) return kApiError;
  const wia_comm_profiling_t all = {true, true, true};
  EXPECT_R(wia_enable_comm_profiling(comm, &all) == WIA_SUCCESS);
  wia_collective_config_t cfg{};
  cfg.datatype = WIA_FLOAT32;
  std::vector<float> buf(256, 1.0f);
  for (int i = 0; i < 4; ++i) {
    if (rank != 1) sleep_ms(40);
    EXPECT_R(wia_all_reduce(comm, buf.data(), buf.data(), 2, &cfg, nullptr) == WIA_SUCCESS);
    EXPECT_R(wia_stream_synchronize(nullptr) == WIA_SUCCESS);
  }
  for (int i = 0; i < 3; ++i) {
    if (rank != 2) sleep_ms(40);
    EXPECT_R(wia_broadcast(comm, buf.data(), buf.size(), 0, WIA_FLOAT32, nullptr) == WIA_SUCCESS);
    EXPECT_R(wia_stream_synchronize(nullptr) == WIA_SUCCESS);
  }
  if (rank == 0)
    EXPECT_R(wia_comm_send(comm, buf.data(), 16, WIA_FLOAT32, 1, nullptr) == WIA_SUCCESS);
  if (rank == 1)
    EXPECT_R(wia_comm_recv(comm, buf.data(), 16, WIA_FLOAT32, 0, nullptr) == WIA_SUCCESS);
  EXPECT_R(wia_stream_synchronize(nullptr) == WIA_SUCCESS);

  wia_comm_profile_report_t* r = wia_get_comm_profile_job(comm, 10000);
  if (r == nullptr) std::fprintf(stderr, "rank %d: %s\n", rank, wia_get_last_error());
  EXPECT_R(r != nullptr);
  EXPECT_R(r->job_nranks == nranks && r->num_job_collectives == 4);
  for (int i = 0; i < r->num_job_collectives; ++i) {
    const wia_job_collective_profile_t& j = r->job_collectives[i];
    std::fprintf(stderr, "rank %d: %-10s slowest rank %d (%.4f s), fastest rank %d (%.4f s)\n",
                 rank, j.name, j.slowest_rank, j.slowest_total_time, j.fastest_rank,
                 j.fastest_total_time);
    EXPECT_R(j.nranks == nranks && j.ranks != nullptr);
    double sum = 0;
    for (int q = 0; q < nranks; ++q) {
      sum += j.ranks[q].total_time;
      EXPECT_R(std::strcmp(j.ranks[q].name, j.name) == 0 && j.ranks[q].transport != nullptr);
      EXPECT_R(j.ranks[q].total_time <= j.slowest_total_time);
      EXPECT_R(j.ranks[q].total_time >= j.fastest_total_time);
    }
    EXPECT_R(std::fabs(j.mean_total_time - sum / nranks) < 1e-12);
    EXPECT_R(j.ranks[j.slowest_rank].total_time == j.slowest_total_time);
    EXPECT_R(j.ranks[j.fastest_rank].total_time == j.fastest_total_time);
  }
  // Rank `rank`'s column is its own report, exactly.
  EXPECT_R(r->num_collectives == (rank == 2 ? 2 : 3));
  for (int i = 0; i < r->num_collectives; ++i) {
    const wia_collective_profile_t& mine = r->collectives[i];
    const wia_job_collective_profile_t* j = job_entry(r, mine.name);
    EXPECT_R(j != nullptr);
    EXPECT_R(j->ranks[rank].invocation_count == mine.invocation_count);
    EXPECT_R(j->ranks[rank].total_time == mine.total_time);
    EXPECT_R(j->ranks[rank].p99_time == mine.p99_time && j->ranks[rank].bytes == mine.bytes);
    EXPECT_R(std::strcmp(j->ranks[rank].algorithm, mine.algorithm) == 0);
    EXPECT_R(std::strcmp(j->ranks[rank].transport, mine.transport) == 0);
  }
  const wia_job_collective_profile_t* ar = job_entry(r, "allreduce");
  const wia_job_collective_profile_t* bc = job_entry(r, "broadcast");
  const wia_job_collective_profile_t* sd = job_entry(r, "send");
  const wia_job_collective_profile_t* rv = job_entry(r, "recv");
  EXPECT_R(ar && bc && sd && rv);
  for (int q = 0; q < nranks; ++q) {
    EXPECT_R(ar->ranks[q].invocation_count == 4 && bc->ranks[q].invocation_count == 3);
    EXPECT_R(sd->ranks[q].invocation_count == (q == 0 ? 1 : 0));
    EXPECT_R(rv->ranks[q].invocation_count == (q == 1 ? 1 : 0));
  }
  // The rank the others kept waiting: 4 x 40 ms and 3 x 40 ms.
  EXPECT_R(ar->slowest_rank == 1 && ar->slowest_total_time > 0.12);
  EXPECT_R(ar->fastest_rank != 1 && ar->fastest_total_time < 0.5 * ar->slowest_total_time);
  EXPECT_R(bc->slowest_rank == 2 && bc->slowest_total_time > 0.09);
  EXPECT_R(bc->fastest_rank != 2 && bc->fastest_total_time < 0.5 * bc->slowest_total_time);
  EXPECT_R(sd->slowest_rank == 0 && rv->slowest_rank == 1);
  wia_free_comm_profile(r);

  // The gathering's all-gathers are in no profile; a plain report has no
  // job section; the communicator goes on working.
  r = wia_get_comm_profile(comm);
  EXPECT_R(r != nullptr && r->num_collectives == (rank == 2 ? 2 : 3));
  for (int i = 0; i < r->num_collectives; ++i)
    EXPECT_R(std::strcmp(r->collectives[i].name, "allgather") != 0);
  EXPECT_R(r->job_nranks == 0 && r->num_job_collectives == 0 && r->job_collectives == nullptr);
  wia_free_comm_profile(r);
  EXPECT_R(wia_all_reduce(comm, buf.data(), buf.data(), 2, &cfg, nullptr) == WIA_SUCCESS);
  EXPECT_R(wia_stream_synchronize(nullptr) == WIA_SUCCESS);
  r = wia_get_comm_profile(comm);
  EXPECT_R(r != nullptr && job_entry(r, "allreduce") == nullptr);
  for (int i = 0; i < r->num_collectives; ++i)
    if (std::strcmp(r->collectives[i].name, "allreduce") == 0)
      EXPECT_R(r->collectives[i].invocation_count == 5);
  wia_free_comm_profile(r);

  // Without profiling enabled anywhere there is nothing to gather: an
  // empty summary, not an error.
  EXPECT_R(wia_disable_comm_profiling(comm) == WIA_SUCCESS);
  EXPECT_R(wia_reset_comm_profile(comm) == WIA_SUCCESS);
  r = wia_get_comm_profile_job(comm, 10000);
  EXPECT_R(r != nullptr && r->job_nranks == nranks && r->num_job_collectives == 0);
  wia_free_comm_profile(r);
  wia_destroy_communicator(comm);
  return kOk;
}

// A rank that does not join the gathering within the timeout: the one
// waiting fails (NULL, the reason names the gathering), and so does the
// late one, from the communicator broken meanwhile.
int job_summary_timeout(int rank, int nranks) {
  wia_communicator_t comm = join(rank, nranks);
  if (!comm) return kApiError;
  const wia_comm_profiling_t all = {true, true, true};
  EXPECT_R(wia_enable_comm_profiling(comm, &all) == WIA_SUCCESS);
  if (rank == 1) sleep_ms(1500);
  const auto t0 = Clock::now();
  wia_comm_profile_report_t* r = wia_get_comm_profile_job(comm, 300);
  const double waited = std::chrono::duration<double>(Clock::now() - t0).count();
  const std::string why = wia_get_last_error();
  std::fprintf(stderr, "rank %d: after %.3f s: %s\n", rank, waited, why.c_str());
  EXPECT_R(r == nullptr);
  if (rank == 0) {
    EXPECT_R(why.find("gathering every rank's profile") != std::string::npos);
    EXPECT_R(waited > 0.25 && waited < 1.4);
  }
  wia_destroy_communicator(comm);
  return kOk;
}

// The compression suggestion: 3 all-reduces of 4 MiB of float32 get one
// (with its estimated speedup > 1.2) when TEST_EXPECT_COMPRESSION is 1 (a
// slow link built for it), none when 0; int32 data of the same size never.
int compression_suggested(int rank, int nranks) {
  wia_communicator_t comm = join(rank, nranks);
  if (!comm) return kApiError;
  const bool expect = std::getenv("TEST_EXPECT_COMPRESSION")[0] == '1';
  wia_comm_profile_report_t* r = profile_three_4mib_all_reduces(comm);
  EXPECT_R(r != nullptr && r->num_collectives == 1);
  std::fprintf(stderr, "rank %d: %s over %s: %d suggestion(s)\n", rank, r->collectives[0].name,
               r->collectives[0].transport, r->num_suggestions);
  int found = 0;
  for (int i = 0; i < r->num_suggestions; ++i) {
    const std::string text = r->suggestions[i];
    std::fprintf(stderr, "rank %d: %s\n", rank, text.c_str());
    if (text.find("wia_all_reduce_compressed") == std::string::npos) continue;
    ++found;
    EXPECT_R(text.find("allreduce: 3 calls of float32 data") == 0);
    EXPECT_R(text.find("int8 quantization") != std::string::npos ||
             text.find("bfloat16 cast") != std::string::npos);
    const std::size_t at = text.find("estimated ");
    EXPECT_R(at != std::string::npos);
    const double speedup = std::strtod(text.c_str() + at + 10, nullptr);
    EXPECT_R(speedup > 1.2 && std::isfinite(speedup));
  }
  EXPECT_R(found == (expect ? 1 : 0));
  wia_free_comm_profile(r);

  // Integers do not compress: no suggestion, however slow the link.
  EXPECT_R(wia_reset_comm_profile(comm) == WIA_SUCCESS);
  std::vector<std::int32_t> ints(std::size_t{1} << 20, 1);
  wia_collective_config_t icfg{};
  icfg.datatype = WIA_INT32;
  for (int i = 0; i < 3; ++i)
    EXPECT_R(wia_all_reduce(comm, ints.data(), ints.data(), ints.size(), &icfg, nullptr) ==
             WIA_SUCCESS);
  EXPECT_R(wia_stream_synchronize(nullptr) == WIA_SUCCESS);
  r = wia_get_comm_profile(comm);
  EXPECT_R(r != nullptr);
  for (int i = 0; i < r->num_suggestions; ++i)
    EXPECT_R(std::string(r->suggestions[i]).find("compressed") == std::string::npos);
  wia_free_comm_profile(r);
  wia_destroy_communicator(comm);
  return kOk;
}

// Sleeps *(int*)ms milliseconds: compute of a chosen length.
void sleep_for_ms(void* ms) {
  std::this_thread::sleep_for(std::chrono::milliseconds(*static_cast<int*>(ms)));
}

// The chunking suggestion: 6 all-reduces of 32 MiB each after a host
// function as long as one all-reduce, on one stream (nothing overlaps),
// get it with a speedup > 1.2; the same under one long host function on
// another stream (overlapped) and 64 KiB all-reduces after the same
// compute (not large) do not.
int chunking_suggested(int rank, int nranks) {
  wia_communicator_t comm = join(rank, nranks);
  if (!comm) return kApiError;
  const wia_comm_profiling_t all = {true, true, true};
  EXPECT_R(wia_enable_comm_profiling(comm, &all) == WIA_SUCCESS);
  std::vector<float> big(std::size_t{8} << 20, 1.0f);  // 32 MiB
  wia_collective_config_t cfg{};
  cfg.datatype = WIA_FLOAT32;
  auto all_reduce = [&](std::size_t count, wia_stream_t stream) {
    return wia_all_reduce(comm, big.data(), big.data(), count, &cfg, stream) == WIA_SUCCESS;
  };
  // The compute is as long as this machine's all-reduce: the case where
  // overlapping them gains most, whatever the load.
  EXPECT_R(all_reduce(big.size(), nullptr) && wia_stream_synchronize(nullptr) == WIA_SUCCESS);
  const auto t0 = Clock::now();
  for (int i = 0; i < 2; ++i) EXPECT_R(all_reduce(big.size(), nullptr));
  EXPECT_R(wia_stream_synchronize(nullptr) == WIA_SUCCESS);
  int ms = std::max(
      2,
      static_cast<int>(std::chrono::duration<double, std::milli>(Clock::now() - t0).count() / 2));

  auto serialized = [&](std::size_t count) {
    EXPECT_R(wia_reset_comm_profile(comm) == WIA_SUCCESS);
    // Each all-reduce is posted once its compute is done: posted behind
    // the host function, its time would run from its posting.
    // The next compute lasts as long as the last all-reduce took, so that
    // the two stay alike on a machine whose load changes between calls.
    for (int i = 0; i < 6; ++i) {
      EXPECT_R(wia_launch_host_func(nullptr, sleep_for_ms, &ms) == WIA_SUCCESS);
      EXPECT_R(wia_stream_synchronize(nullptr) == WIA_SUCCESS);
      const auto posted = Clock::now();
      EXPECT_R(all_reduce(count, nullptr));
      EXPECT_R(wia_stream_synchronize(nullptr) == WIA_SUCCESS);
      if (count == big.size())
        ms = std::max(
            2, static_cast<int>(
                   std::chrono::duration<double, std::milli>(Clock::now() - posted).count()));
    }
    return kOk;
  };
  EXPECT_R(serialized(big.size()) == kOk);
  wia_comm_profile_report_t* r = wia_get_comm_profile(comm);
  EXPECT_R(r != nullptr && r->overlap_efficiency < 0.2);
  std::fprintf(stderr, "rank %d: serialized, %d ms of compute per call: %d suggestion(s)\n", rank,
               ms, r->num_suggestions);
  for (int i = 0; i < r->num_suggestions; ++i)
    std::fprintf(stderr, "rank %d: %s\n", rank, r->suggestions[i]);
  EXPECT_R(r->num_suggestions == 1 && suggestions_with(r, kChunking) == 1);
  const std::string text = r->suggestions[0];
  EXPECT_R(text.find("allreduce: 6 calls of 4.0 MiB or more (average 32.0 MiB") == 0);
  EXPECT_R(stated_speedup(text) > 1.2);
  wia_free_comm_profile(r);

  // Overlapped: the same all-reduces under one host function on another
  // stream that outlasts them.
  EXPECT_R(wia_reset_comm_profile(comm) == WIA_SUCCESS);
  wia_stream_t compute = nullptr;
  EXPECT_R(wia_create_stream(&compute) == WIA_SUCCESS);
  int long_ms = 8 * ms + 300;
  EXPECT_R(wia_launch_host_func(compute, sleep_for_ms, &long_ms) == WIA_SUCCESS);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));  // it has started
  for (int i = 0; i < 6; ++i) EXPECT_R(all_reduce(big.size(), nullptr));
  EXPECT_R(wia_stream_synchronize(nullptr) == WIA_SUCCESS);
  EXPECT_R(wia_stream_synchronize(compute) == WIA_SUCCESS);
  r = wia_get_comm_profile(comm);
  EXPECT_R(r != nullptr);
  std::fprintf(stderr, "rank %d: overlapped: overlap %.3f, %d suggestion(s)\n", rank,
               r->overlap_efficiency, r->num_suggestions);
  EXPECT_R(r->overlap_efficiency > 0.8 && suggestions_with(r, kChunking) == 0);
  wia_free_comm_profile(r);
  wia_destroy_stream(compute);

  // Small all-reduces after the same compute: nothing worth chunking.
  EXPECT_R(serialized(std::size_t{16} << 10) == kOk);
  r = wia_get_comm_profile(comm);
  EXPECT_R(r != nullptr && r->collectives[0].invocation_count == 6);
  EXPECT_R(suggestions_with(r, kChunking) == 0);
  wia_free_comm_profile(r);
  wia_destroy_communicator(comm);
  return kOk;
}

// The transport suggestion: 100 all-reduces of 16 KiB and 20 sends of
// 16 KiB from rank 0 to rank 1 get it (with a speedup > 1.2, naming tcp
// and shm) when TEST_EXPECT_TRANSPORT is 1 (WIA_TRANSPORT=tcp on this
// node), none when 0.
int transport_suggested(int rank, int nranks) {
  wia_communicator_t comm = join(rank, nranks);
  if (!comm) return kApiError;
  const bool expect = std::getenv("TEST_EXPECT_TRANSPORT")[0] == '1';
  const wia_comm_profiling_t all = {true, true, true};
  EXPECT_R(wia_enable_comm_profiling(comm, &all) == WIA_SUCCESS);
  std::vector<float> buf(std::size_t{4} << 10, 1.0f);  // 16 KiB
  wia_collective_config_t cfg{};
  cfg.datatype = WIA_FLOAT32;
  for (int i = 0; i < 100; ++i)
    EXPECT_R(wia_all_reduce(comm, buf.data(), buf.data(), buf.size(), &cfg, nullptr) ==
             WIA_SUCCESS);
  for (int i = 0; i < 20; ++i)
    EXPECT_R((rank == 0 ? wia_comm_send(comm, buf.data(), buf.size(), WIA_FLOAT32, 1, nullptr)
                        : wia_comm_recv(comm, buf.data(), buf.size(), WIA_FLOAT32, 0, nullptr)) ==
             WIA_SUCCESS);
  EXPECT_R(wia_stream_synchronize(nullptr) == WIA_SUCCESS);
  wia_comm_profile_report_t* r = wia_get_comm_profile(comm);
  EXPECT_R(r != nullptr);
  for (int i = 0; i < r->num_suggestions; ++i)
    std::fprintf(stderr, "rank %d: %s\n", rank, r->suggestions[i]);
  EXPECT_R(suggestions_with(r, kTransport) == (expect ? 1 : 0));
  EXPECT_R(suggestions_with(r, kChunking) == 0);
  for (int i = 0; i < r->num_suggestions; ++i) {
    const std::string text = r->suggestions[i];
    if (text.find(kTransport) == std::string::npos) continue;
    EXPECT_R(text.find("transport: 120 calls (allreduce 100, ") == 0);
    EXPECT_R(text.find("used tcp") != std::string::npos);
    EXPECT_R(text.find("would choose shm") != std::string::npos);
    EXPECT_R(stated_speedup(text) > 1.2);
  }
  wia_free_comm_profile(r);
  wia_destroy_communicator(comm);
  return kOk;
}

// Sampling: 300 all-reduces of 8 B and 3 broadcasts are counted exactly
// (count, bytes, avg = total / count) whatever profiling.sample_every says;
// the timeline holds the timed ones only: all 303 at TEST_SAMPLE_EVERY 1,
// at the default 128 the first 16 all-reduces, a few more (the same calls
// on every rank), and every broadcast.
int sampled(int rank, int nranks) {
  wia_communicator_t comm = join(rank, nranks);
  if (!comm) return kApiError;
  const int every = std::atoi(std::getenv("TEST_SAMPLE_EVERY"));
  const wia_comm_profiling_t all = {true, true, true};
  EXPECT_R(wia_enable_comm_profiling(comm, &all) == WIA_SUCCESS);
  float x[2] = {1.0f, 2.0f};
  wia_collective_config_t cfg{};
  cfg.datatype = WIA_FLOAT32;
  const auto t0 = Clock::now();
  for (int i = 0; i < 300; ++i)
    EXPECT_R(wia_all_reduce(comm, x, x, 2, &cfg, nullptr) == WIA_SUCCESS);
  for (int i = 0; i < 3; ++i)
    EXPECT_R(wia_broadcast(comm, x, 2, 0, WIA_FLOAT32, nullptr) == WIA_SUCCESS);
  EXPECT_R(wia_stream_synchronize(nullptr) == WIA_SUCCESS);
  const double wall = std::chrono::duration<double>(Clock::now() - t0).count();
  wia_comm_profile_report_t* r = wia_get_comm_profile(comm);
  EXPECT_R(r != nullptr && r->num_collectives == 2);
  for (int i = 0; i < r->num_collectives; ++i) {
    const wia_collective_profile_t& c = r->collectives[i];
    const bool ar = std::string(c.name) == "allreduce";
    EXPECT_R(c.invocation_count == (ar ? 300 : 3));
    EXPECT_R(c.bytes == std::uint64_t(c.invocation_count) * sizeof x);
    EXPECT_R(std::fabs(c.avg_time * c.invocation_count - c.total_time) < 1e-9);
    // Exact times stay within the caller's; an extrapolated total may not
    // (one sampled call preempted stands for 60).
    EXPECT_R(c.total_time > 0 && (every != 1 || c.total_time < wall));
    EXPECT_R(c.min_time > 0 && c.min_time <= c.p50_time && c.p99_time <= c.max_time);
  }
  wia_free_comm_profile(r);
  const std::string path =
      std::string(std::getenv("TEST_TRACE_DIR")) + "/sampled." + std::to_string(rank) + ".json";
  EXPECT_R(wia_profile_write_trace(comm, path.c_str()) == WIA_SUCCESS);
  const std::string json = file_text(path);
  auto occurrences = [&](const std::string& what) { return count_of(json, what); };
  const int ar_events = occurrences("\"name\":\"allreduce\"");
  std::fprintf(stderr, "rank %d: sample_every %d: %d all-reduce events on the timeline\n", rank,
               every, ar_events);
  // Every rank drew the same gaps, so timed the same calls: as many
  // events on each rank (the largest and the smallest count agree).
  std::int32_t span[2] = {ar_events, -ar_events};
  wia_collective_config_t max{};
  max.datatype = WIA_INT32;
  max.reduction_op = WIA_REDUCE_MAX;
  EXPECT_R(wia_all_reduce(comm, span, span, 2, &max, nullptr) == WIA_SUCCESS &&
           wia_stream_synchronize(nullptr) == WIA_SUCCESS);
  EXPECT_R(span[0] == -span[1]);
  wia_destroy_communicator(comm);
  EXPECT_R(occurrences("\"name\":\"broadcast\"") == 3);
  EXPECT_R(json.find("\"sample_every\":" + std::to_string(every) + ",") != std::string::npos);
  if (every == 1)
    EXPECT_R(ar_events == 300);
  else  // the first 16, then one in `every` on average (gaps of 1 .. 2 every - 1) of
        // the other 284: at least one per longest gap
    EXPECT_R(ar_events >= 16 + 284 / (2 * every - 1) && ar_events < 50);
  return kOk;
}

// Checks a trace file with Python's json module (CI and this machine have
// python3): the events of each name, ts/dur, one track, ts monotonic on it,
// args present (a collective's peers: the other rank), and the metadata.
// Prints OK or what is wrong.
constexpr const char* kTraceCheck = R"PY(
import json, sys
path, rank, nranks, dropped = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
want = dict(a.split('=') for a in sys.argv[5:])
t = json.load(open(path))
ev = [e for e in t['traceEvents'] if e['ph'] == 'X']
got = {}
for e in ev:
    got[e['name']] = got.get(e['name'], 0) + 1
assert got == {k: int(v) for k, v in want.items()}, ('counts', got, want)
assert len({(e['pid'], e['tid']) for e in ev}) == 1, 'one track'
last_end = 0
for e in ev:
    assert e['pid'] == rank and e['dur'] >= 0 and 0 <= e['ts'] < 2 * 86400e6, e
    assert e['ts'] >= last_end - 2e-3, ('ts not monotonic', e)
    last_end = e['ts'] + e['dur']
    a = e['args']
    assert a['bytes'] > 0 and a['algorithm'] and a['transport'], e
    if e['cat'] == 'p2p':
        assert a['peer'] == 1 - rank, e
    else:
        assert a['nranks'] == nranks and a['peers'] == [1 - rank], e
o = t['otherData']
assert o['rank'] == rank and o['events'] == len(ev) and o['dropped_events'] == dropped, o
assert o['ts_origin_unix_us'] % 86400000000 == 0 and o['ts_origin_unix_us'] > 1.5e15, o
assert any(e['ph'] == 'M' and e['name'] == 'process_name' for e in t['traceEvents'])
print('OK')
)PY";

std::string check_trace(const std::string& dir, const std::string& file, int rank,
                        std::uint64_t dropped, const std::string& counts) {
  const std::string script = dir + "/check_trace.py";
  if (FILE* f = std::fopen(script.c_str(), "w")) {
    std::fputs(kTraceCheck, f);
    std::fclose(f);
  }
  return run_command("python3 " + script + " " + dir + "/" + file + " " + std::to_string(rank) +
                     " 2 " + std::to_string(dropped) + " " + counts + " 2>&1");
}

// streams_on_timeline's trace: one track per stream, named; the two
// all-reduces on `work`'s, the host functions on their streams' (`work`,
// the default stream), the queued all-reduce starting after the 300 ms
// host function before it on its stream has ended.
constexpr const char* kStreamTraceCheck = R"PY(
import json, sys
t = json.load(open(sys.argv[1]))
names = {e['tid']: e['args']['name'] for e in t['traceEvents']
         if e['ph'] == 'M' and e['name'] == 'thread_name'}
work = [tid for tid, n in names.items() if n.startswith('stream ') and '(device 0)' in n]
default = [tid for tid, n in names.items() if "(device 0's default stream)" in n]
assert len(work) == 1 and len(default) == 1, names
work, default = work[0], default[0]
ev = [e for e in t['traceEvents'] if e['ph'] == 'X']
ar = [e for e in ev if e['name'] == 'allreduce']
host = [e for e in ev if e['cat'] == 'compute']
assert len(ar) == 2 and all(e['tid'] == work for e in ar), ar
assert all(e['name'] == 'host function' and e['args']['device'] == 0 for e in host), host
long = [e for e in host if e['dur'] >= 299e3]
short = [e for e in host if 99e3 <= e['dur'] < 299e3]
assert len(host) == 2 and len(long) == 1 and len(short) == 1, host
assert long[0]['tid'] == work and short[0]['tid'] == default, host
assert ar[0]['ts'] >= long[0]['ts'] + long[0]['dur'] - 1, ('queued all-reduce', ar[0], long[0])
o = t['otherData']
assert o['events'] == 2 and o['compute_events'] == 2 and o['dropped_compute_events'] == 0, o
print('OK')
)PY";

// A device communicator's trace: the communicator's track (this process,
// tid = its number 1) with the events of each name, nranks, the devices;
// and each rank's track (tid 1000 + rank + 1) with the same collectives as
// that rank saw them: each starting no later than the communicator's event
// (which starts with its last rank) and ending within it.
constexpr const char* kDeviceTraceCheck = R"PY(
import json, sys
path, pid, nranks = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
want = dict(a.split('=') for a in sys.argv[4:])
t = json.load(open(path))
all_ev = [e for e in t['traceEvents'] if e['ph'] == 'X']
ev = [e for e in all_ev if e['tid'] == 1]
def counts(events):
    got = {}
    for e in events:
        got[e['name']] = got.get(e['name'], 0) + 1
    return got
assert counts(ev) == {k: int(v) for k, v in want.items()}, ('counts', counts(ev), want)
assert {e['tid'] for e in all_ev} == {1} | {1001 + r for r in range(nranks)}, 'tracks'
for r in range(nranks):
    mine = [e for e in all_ev if e['tid'] == 1001 + r]
    assert counts(mine) == counts(ev), ('rank', r, counts(mine))
    for e, c in zip(mine, ev):
        assert e['args']['rank'] == r and e['name'] == c['name'], (e, c)
        assert e['ts'] <= c['ts'] + 2e-3, (e, c)
        assert e['ts'] + e['dur'] <= c['ts'] + c['dur'] + 2e-3, (e, c)
last_end = 0
for e in ev:
    assert e['pid'] == pid and e['cat'] == 'collective' and e['dur'] > 0, e
    assert 0 <= e['ts'] < 2 * 86400e6, e
    assert e['ts'] >= last_end - 2e-3, ('ts not monotonic', e)
    last_end = e['ts'] + e['dur']
    a = e['args']
    assert a['bytes'] > 0 and a['algorithm'] and a['transport'] == 'host', e
    assert a['nranks'] == nranks, e
o = t['otherData']
assert o['devices'] == list(range(nranks)) and o['nranks'] == nranks, o
assert o['events'] == len(all_ev) and o['dropped_events'] == 0, o
assert o['ts_origin_unix_us'] % 86400000000 == 0 and o['ts_origin_unix_us'] > 1.5e15, o
names = [e for e in t['traceEvents'] if e['ph'] == 'M']
assert any(e['name'] == 'thread_name' and 'device communicator' in e['args']['name'] for e in names)
for r in range(nranks):
    assert any(e['name'] == 'thread_name' and e['tid'] == 1001 + r and
               e['args']['name'] == 'device %d: rank %d (device communicator 1)' % (r, r)
               for e in names), ('rank track name', r)
print('OK')
)PY";

std::string check_device_trace(const std::string& dir, const std::string& file, long pid,
                               const std::string& counts) {
  const std::string script = dir + "/check_device_trace.py";
  if (FILE* f = std::fopen(script.c_str(), "w")) {
    std::fputs(kDeviceTraceCheck, f);
    std::fclose(f);
  }
  return run_command("python3 " + script + " " + dir + "/" + file + " " + std::to_string(pid) +
                     " 4 " + counts + " 2>&1");
}

// Which part of a device communicator test fails, and why: the process
// exits kWrong after printing it.
#define EXPECT_D(cond)                                                        \
  do {                                                                        \
    if (!(cond)) {                                                            \
      std::fprintf(stderr, "device: %s:%d: %s\n", __FILE__, __LINE__, #cond); \
      return kWrong;                                                          \
    }                                                                         \
  } while (0)

// One process driving 4 host devices (one rank each): the collective
// `post` on every rank, then every stream synchronized; returns the
// wall time around both, by the steady clock.
struct DeviceRanks {
  wia_communicator_t comm = nullptr;
  std::vector<wia_stream_t> streams;
  std::vector<float*> buf;
  static constexpr int kRanks = 4;
  static constexpr std::size_t kFloats = std::size_t{1} << 18;  // 1 MiB
  bool open() {
    wia_device_t devs[kRanks] = {0, 1, 2, 3};
    if (wia_create_communicator(devs, kRanks, &comm) != WIA_SUCCESS) return false;
    streams.assign(kRanks, nullptr);
    buf.assign(kRanks, nullptr);
    for (int r = 0; r < kRanks; ++r) {
      if (wia_create_stream_on(r, &streams[r]) != WIA_SUCCESS) return false;
      // Room for an all-gather of 1 MiB per rank after the input.
      if (wia_malloc_on(r, reinterpret_cast<void**>(&buf[r]), kFloats * 4 * (kRanks + 1)) !=
          WIA_SUCCESS)
        return false;
      std::fill(buf[r], buf[r] + kFloats * (kRanks + 1), 1.0f);
    }
    return true;
  }
  void close() {
    for (float* b : buf) wia_free(b);
    for (wia_stream_t s : streams) wia_destroy_stream(s);
    wia_destroy_communicator(comm);
  }
  template <typename Post>
  double timed(Post&& post, bool* ok) {
    const auto t0 = Clock::now();
    for (int r = 0; r < kRanks; ++r) *ok = *ok && post(r) == WIA_SUCCESS;
    for (int r = 0; r < kRanks; ++r) *ok = *ok && wia_stream_synchronize(streams[r]) == WIA_SUCCESS;
    return std::chrono::duration<double>(Clock::now() - t0).count();
  }
};

// Profiling a device communicator of 4 host devices (collectives.engine
// from the configuration): exact counts per collective, avg = total /
// count, each time within the caller's own clock around the call, the
// trace (TEST_TRACE_DIR/device.json) written, a fusion suggestion after
// many small all-reduces, disable and reset, and the same errors as a
// process communicator's.
int device_profile(int, int) {
  const std::string dir = std::getenv("TEST_TRACE_DIR");
  DeviceRanks D;
  EXPECT_D(D.open());
  wia_collective_config_t cfg{};
  cfg.datatype = WIA_FLOAT32;
  auto allreduce = [&](std::size_t n) {
    return
        [&, n](int r) { return wia_all_reduce(D.comm, D.buf[r], D.buf[r], n, &cfg, D.streams[r]); };
  };
  bool ok = true;

  // Errors and the empty report before enabling, as on a process
  // communicator: nothing counted, the same messages.
  D.timed(allreduce(64), &ok);
  EXPECT_D(ok);
  wia_comm_profile_report_t* r = wia_get_comm_profile(D.comm);
  EXPECT_D(r != nullptr && r->num_collectives == 0 && r->total_comm_time == 0.0);
  wia_free_comm_profile(r);
  EXPECT_D(wia_enable_comm_profiling(D.comm, nullptr) == WIA_ERROR_INVALID_ARGUMENT);
  EXPECT_D(std::string(wia_get_last_error()).find("profiling is NULL") != std::string::npos);
  EXPECT_D(wia_profile_write_trace(D.comm, nullptr) == WIA_ERROR_INVALID_ARGUMENT);
  EXPECT_D(wia_profile_write_trace(D.comm, "") == WIA_ERROR_INVALID_ARGUMENT);
  const std::string bad = dir + "/no-such-dir/trace.json";
  EXPECT_D(wia_profile_write_trace(D.comm, bad.c_str()) == WIA_ERROR_IO);
  const std::string why = wia_get_last_error();
  EXPECT_D(why.find(bad) != std::string::npos &&
           why.find(std::strerror(ENOENT)) != std::string::npos);
  EXPECT_D(wia_get_comm_profile_job(D.comm, 0) == nullptr);
  EXPECT_D(std::string(wia_get_last_error()).find("device communicator") != std::string::npos);

  const wia_comm_profiling_t all = {true, true, true};
  EXPECT_D(wia_enable_comm_profiling(D.comm, &all) == WIA_SUCCESS);
  const auto t0 = Clock::now();
  double ar_walls = 0, ar_max_wall = 0, walls = 0;
  for (int i = 0; i < 12; ++i) {
    const double w = D.timed(allreduce(DeviceRanks::kFloats), &ok);
    ar_walls += w;
    ar_max_wall = std::max(ar_max_wall, w);
  }
  for (int i = 0; i < 3; ++i)
    walls += D.timed(
        [&](int k) { return wia_broadcast(D.comm, D.buf[k], 1000, 1, WIA_FLOAT32, D.streams[k]); },
        &ok);
  for (int i = 0; i < 2; ++i)
    walls += D.timed(
        [&](int k) {
          return wia_all_gather(D.comm, D.buf[k], D.buf[k] + DeviceRanks::kFloats,
                                DeviceRanks::kFloats, WIA_FLOAT32, D.streams[k]);
        },
        &ok);
  EXPECT_D(ok);
  walls += ar_walls;
  const double wall = std::chrono::duration<double>(Clock::now() - t0).count();
  r = wia_get_comm_profile(D.comm);
  EXPECT_D(r != nullptr);
  EXPECT_D(r->num_collectives == 3);
  const wia_collective_profile_t *ar = nullptr, *bc = nullptr, *ag = nullptr;
  double sum_totals = 0;
  for (int i = 0; i < r->num_collectives; ++i) {
    const wia_collective_profile_t& c = r->collectives[i];
    const std::string name = c.name;
    (name == "allreduce" ? ar : name == "broadcast" ? bc : ag) = &c;
    EXPECT_D(name == "allreduce" || name == "broadcast" || name == "allgather");
    EXPECT_D(std::fabs(c.avg_time * c.invocation_count - c.total_time) < 1e-9);
    EXPECT_D(c.min_time > 0 && c.min_time <= c.p50_time && c.p50_time <= c.p99_time &&
             c.p99_time <= c.max_time);
    EXPECT_D(c.avg_bandwidth > 0 && std::isfinite(c.avg_bandwidth));
    EXPECT_D(std::strlen(c.algorithm) > 0 && std::string(c.transport) == "host");
    sum_totals += c.total_time;
  }
  EXPECT_D(ar != nullptr && bc != nullptr && ag != nullptr);
  EXPECT_D(ar->invocation_count == 12 && bc->invocation_count == 3 && ag->invocation_count == 2);
  EXPECT_D(ar->bytes == 12ull * DeviceRanks::kFloats * 4);
  EXPECT_D(bc->bytes == 3ull * 1000 * 4 && ag->bytes == 2ull * DeviceRanks::kFloats * 4);
  // Each collective's time lies inside the caller's clock around its call.
  EXPECT_D(ar->total_time > 0 && ar->total_time <= ar_walls && ar->max_time <= ar_max_wall);
  EXPECT_D(std::fabs(r->total_comm_time - sum_totals) < 1e-9);
  EXPECT_D(r->total_comm_time <= walls && walls <= wall);
  EXPECT_D(r->avg_bandwidth_utilization > 0 && std::isfinite(r->avg_bandwidth_utilization));
  EXPECT_D(r->window_time >= wall);
  std::fprintf(
      stderr,
      "device: comm %.4f s of %.4f s called, allreduce avg %.3f ms %.2f GB/s (%s over %s), "
      "utilization %.3f, %d suggestion(s)\n",
      r->total_comm_time, walls, ar->avg_time * 1e3, ar->avg_bandwidth, ar->algorithm,
      ar->transport, r->avg_bandwidth_utilization, r->num_suggestions);
  wia_free_comm_profile(r);

  // The timeline: one event per collective.
  const std::string path = dir + "/device.json";
  EXPECT_D(wia_profile_write_trace(D.comm, path.c_str()) == WIA_SUCCESS);

  // Disabled: nothing more is counted; reset: an empty window.
  EXPECT_D(wia_disable_comm_profiling(D.comm) == WIA_SUCCESS);
  D.timed(allreduce(16), &ok);
  EXPECT_D(ok);
  r = wia_get_comm_profile(D.comm);
  EXPECT_D(r != nullptr && r->num_collectives == 3);
  for (int i = 0; i < r->num_collectives; ++i)
    if (std::string(r->collectives[i].name) == "allreduce")
      EXPECT_D(r->collectives[i].invocation_count == 12);
  wia_free_comm_profile(r);
  EXPECT_D(wia_reset_comm_profile(D.comm) == WIA_SUCCESS);
  r = wia_get_comm_profile(D.comm);
  EXPECT_D(r != nullptr && r->num_collectives == 0);
  wia_free_comm_profile(r);

  // Suggestions where they apply: 200 all-reduces of 8 B, fused by the
  // communicator's own cost model.
  EXPECT_D(wia_enable_comm_profiling(D.comm, &all) == WIA_SUCCESS);
  for (int i = 0; i < 200; ++i) {
    for (int k = 0; k < DeviceRanks::kRanks; ++k)
      ok = ok && wia_all_reduce(D.comm, D.buf[k], D.buf[k], 2, &cfg, D.streams[k]) == WIA_SUCCESS;
  }
  for (int k = 0; k < DeviceRanks::kRanks; ++k)
    ok = ok && wia_stream_synchronize(D.streams[k]) == WIA_SUCCESS;
  EXPECT_D(ok);
  r = wia_get_comm_profile(D.comm);
  EXPECT_D(r != nullptr && r->num_collectives == 1 && r->collectives[0].invocation_count == 200);
  int fused = 0;
  for (int i = 0; i < r->num_suggestions; ++i) {
    std::fprintf(stderr, "device: %s\n", r->suggestions[i]);
    if (std::string(r->suggestions[i]).find("allreduce: 200 calls under 1.0 MiB") == 0) ++fused;
  }
  EXPECT_D(fused == 1);
  wia_free_comm_profile(r);

  // Queued on every rank's stream behind a 300 ms host function: timed
  // from when the ranks' streams let it run (the device engine: the last
  // rank's input ready), not from when it was posted.
  EXPECT_D(wia_reset_comm_profile(D.comm) == WIA_SUCCESS);
  for (int k = 0; k < DeviceRanks::kRanks; ++k) {
    ok = ok && wia_launch_host_func(D.streams[k], sleep_300ms, nullptr) == WIA_SUCCESS;
    ok = ok && wia_all_reduce(D.comm, D.buf[k], D.buf[k], DeviceRanks::kFloats, &cfg,
                              D.streams[k]) == WIA_SUCCESS;
  }
  for (int k = 0; k < DeviceRanks::kRanks; ++k)
    ok = ok && wia_stream_synchronize(D.streams[k]) == WIA_SUCCESS;
  EXPECT_D(ok);
  r = wia_get_comm_profile(D.comm);
  EXPECT_D(r != nullptr && r->num_collectives == 1 && r->collectives[0].invocation_count == 1);
  std::fprintf(stderr, "device: queued all-reduce %.4f s\n", r->collectives[0].total_time);
  EXPECT_D(r->collectives[0].total_time < 0.2);
  wia_free_comm_profile(r);
  D.close();
  return kOk;
}

// Sends and receives on a device communicator of 4 host devices: rank 0
// sends 3 messages of 1 KiB to rank 1 beside one all-reduce of every
// rank; the report counts 3 sends and 3 receives with their bytes, and
// the timeline has them on the two devices' own tracks (named), the
// all-reduce on the communicator's.
int device_p2p_profiled(int, int) {
  const std::string dir = std::getenv("TEST_TRACE_DIR");
  DeviceRanks D;
  EXPECT_D(D.open());
  const wia_comm_profiling_t all = {true, true, true};
  EXPECT_D(wia_enable_comm_profiling(D.comm, &all) == WIA_SUCCESS);
  constexpr std::size_t kCount = 256;  // 1 KiB of float32
  for (int i = 0; i < 3; ++i) {
    EXPECT_D(wia_comm_send(D.comm, D.buf[0], kCount, WIA_FLOAT32, 1, D.streams[0]) == WIA_SUCCESS);
    EXPECT_D(wia_comm_recv(D.comm, D.buf[1], kCount, WIA_FLOAT32, 0, D.streams[1]) == WIA_SUCCESS);
  }
  wia_collective_config_t cfg{};
  cfg.datatype = WIA_FLOAT32;
  bool ok = true;
  D.timed([&](int r) { return wia_all_reduce(D.comm, D.buf[r], D.buf[r], 64, &cfg, D.streams[r]); },
          &ok);
  EXPECT_D(ok);
  wia_comm_profile_report_t* r = wia_get_comm_profile(D.comm);
  EXPECT_D(r != nullptr);
  int sends = 0, recvs = 0, allreduces = 0;
  for (int i = 0; i < r->num_collectives; ++i) {
    const wia_collective_profile_t& c = r->collectives[i];
    std::fprintf(stderr, "device: %s x %d, %llu B, %.6f s, %s over %s\n", c.name,
                 c.invocation_count, static_cast<unsigned long long>(c.bytes), c.total_time,
                 c.algorithm, c.transport);
    const std::string name = c.name;
    if (name == "send" || name == "recv") {
      EXPECT_D(c.invocation_count == 3 && c.bytes == 3 * kCount * 4);
      EXPECT_D(c.total_time > 0 && std::fabs(c.avg_time * 3 - c.total_time) < 1e-12);
      EXPECT_D(std::string(c.algorithm) == "host" && std::string(c.transport) == "host");
    }
    (name == "send" ? sends : name == "recv" ? recvs : allreduces) += c.invocation_count;
  }
  EXPECT_D(sends == 3 && recvs == 3 && allreduces == 1);
  wia_free_comm_profile(r);
  const std::string path = dir + "/device-p2p.json";
  EXPECT_D(wia_profile_write_trace(D.comm, path.c_str()) == WIA_SUCCESS);
  D.close();
  const std::string json = file_text(path);
  auto occurrences = [&](const std::string& what) { return count_of(json, what); };
  // Device communicator 1 of this process: tracks 1 (the communicator's),
  // 1001 (rank 0's device) and 1002 (rank 1's), ...; the all-reduce on the
  // communicator's and, as each of the 4 ranks saw it, on the ranks' tracks.
  EXPECT_D(occurrences("\"name\":\"send\",\"cat\":\"p2p\"") == 3);
  EXPECT_D(occurrences("\"name\":\"recv\",\"cat\":\"p2p\"") == 3);
  EXPECT_D(occurrences("\"tid\":1001,\"args\":{\"bytes\":1024") == 3);
  EXPECT_D(occurrences("\"tid\":1002,\"args\":{\"bytes\":1024") == 3);
  EXPECT_D(occurrences("\"name\":\"allreduce\",\"cat\":\"collective\"") == 1 + 4);
  EXPECT_D(occurrences("\"tid\":1,\"args\":{\"bytes\":") == 1);
  EXPECT_D(occurrences("device 0: rank 0 (device communicator 1)") == 1);
  EXPECT_D(occurrences("device 1: rank 1 (device communicator 1)") == 1);
  return kOk;
}

// WIA_TRACE and no profiling: a device communicator's timeline is written
// at destroy to <pattern>.devices.
int device_trace_from_env(int, int) {
  DeviceRanks D;
  EXPECT_D(D.open());
  wia_collective_config_t cfg{};
  cfg.datatype = WIA_FLOAT32;
  bool ok = true;
  for (int i = 0; i < 5; ++i)
    D.timed(
        [&](int k) { return wia_all_reduce(D.comm, D.buf[k], D.buf[k], 256, &cfg, D.streams[k]); },
        &ok);
  EXPECT_D(ok);
  D.close();
  return kOk;
}

std::string device_yaml(const char* engine) {
  return std::string("host:\n  devices: 4\ncollectives:\n  timeout_ms: 20000\n  engine: ") +
         engine + "\n";
}

// A directory for one test case's trace and link files, removed with
// everything in it when the case ends (after a failed REQUIRE too).
struct ScratchDir {
  std::string path;
  explicit ScratchDir(const char* name) {
    std::string t = std::string("/tmp/wia-") + name + "-XXXXXX";
    REQUIRE(mkdtemp(t.data()) != nullptr);
    path = t;
  }
  ~ScratchDir() { run_command("rm -rf " + path); }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
};

}  // namespace

TEST_CASE("profiling: the timeline trace is Chrome/Perfetto JSON, one event per operation") {
  const ScratchDir scratch("trace");
  const std::string& dir = scratch.path;
  SUBCASE("wia_profile_write_trace, while profiling is enabled") {
    check_all(run_ranks(2, base_yaml(), trace_explicit,
                        {{"TEST_WIA_ID", unique_id_env()}, {"TEST_TRACE_DIR", dir}}));
    for (int r = 0; r < 2; ++r) {
      INFO("rank " << r);
      CHECK(check_trace(dir, "explicit." + std::to_string(r) + ".json", r, 0,
                        std::string("allreduce=7 broadcast=3 ") + (r == 0 ? "send=1" : "recv=1")) ==
            "OK\n");
    }
  }
  SUBCASE("WIA_TRACE, written at destroy, one file per rank, bounded") {
    check_all(run_ranks(2, base_yaml(), trace_from_env,
                        {{"TEST_WIA_ID", unique_id_env()}, {"WIA_TRACE", dir + "/env.json"}}));
    for (int r = 0; r < 2; ++r) {
      INFO("rank " << r);
      CHECK(check_trace(dir, "env.json.rank" + std::to_string(r), r, 5, "allreduce=65536") ==
            "OK\n");
    }
  }
}

TEST_CASE("profiling: one track per stream, host functions on theirs, queued collectives") {
  const ScratchDir scratch("streams");
  const std::string& dir = scratch.path;
  check_all(run_ranks(2, base_yaml(), streams_on_timeline,
                      {{"TEST_WIA_ID", unique_id_env()}, {"TEST_TRACE_DIR", dir}}));
  const std::string script = dir + "/check_streams.py";
  if (FILE* f = std::fopen(script.c_str(), "w")) {
    std::fputs(kStreamTraceCheck, f);
    std::fclose(f);
  }
  for (int r = 0; r < 2; ++r)
    CHECK(run_command("python3 " + script + " " + dir + "/streams." + std::to_string(r) +
                      ".json 2>&1") == "OK\n");
}

TEST_CASE("profiling: suggestions carry the model's speedup and appear only where built for") {
  // Over shm the all-reduces run through the node-shared windows, over
  // tcp as messages: neither gets an algorithm suggestion unless forced.
  for (const char* forced : {"", "tcp"}) {
    INFO("WIA_TRANSPORT=" << forced);
    std::vector<std::pair<std::string, std::string>> env = {{"TEST_WIA_ID", unique_id_env()}};
    if (*forced) env.emplace_back("WIA_TRANSPORT", forced);
    check_all(run_ranks(2, base_yaml(), fusion_suggested, env));
  }
}

TEST_CASE("profiling: each entry names the transport its last call used") {
  // By default two processes of one node talk over shm (or the node-shared
  // windows for an all-reduce); WIA_TRANSPORT=tcp forces tcp everywhere.
  for (const char* forced : {"", "tcp"}) {
    INFO("WIA_TRANSPORT=" << forced);
    std::vector<std::pair<std::string, std::string>> env = {
        {"TEST_WIA_ID", unique_id_env()},
        {"TEST_TRANSPORT_EXPECT", *forced ? "tcp" : "shm|windows"}};
    if (*forced) env.emplace_back("WIA_TRANSPORT", forced);
    check_all(run_ranks(2, base_yaml(), transport_named, env));
  }
}

TEST_CASE("profiling: counts, times, compute, overlap near 0 and near 1, disable") {
  // Every call timed: the times are checked against the caller's clock.
  const auto st =
      run_ranks(2, base_yaml(), profile,
                {{"TEST_WIA_ID", unique_id_env()}, {"WIA_PROFILING_SAMPLE_EVERY", "1"}});
  check_all(st);
}

TEST_CASE("profiling: the job-wide summary names every rank's entries and the slowest rank") {
  check_all(run_ranks(3, base_yaml(), job_summary, {{"TEST_WIA_ID", unique_id_env()}}));
}

TEST_CASE("profiling: the job-wide summary is collective, bounded by its timeout") {
  check_all(run_ranks(2, base_yaml(), job_summary_timeout, {{"TEST_WIA_ID", unique_id_env()}}));
}

TEST_CASE("profiling: compression is suggested where the cost model's link is slow, not on shm") {
  // A recorded link file saying 10 MB/s between the two ranks (a slow
  // network). Over tcp the all-reduces use that link; by default the two
  // processes of this node talk over shm or the node-shared windows,
  // memory, where compression only adds work, whatever the file says.
  const ScratchDir scratch("slow-link");
  const std::string links = scratch.path + "/links.yaml";
  if (FILE* f = std::fopen(links.c_str(), "w")) {
    std::fputs(
        "nodes:\n  - {name: bench, devices: [\"rank0:host0\", \"rank1:host0\"]}\n"
        "links:\n  - {between: all, type: ethernet_100g, bandwidth_gbps: 0.01, latency_us: 50}\n",
        f);
    std::fclose(f);
  }
  const std::string slow = base_yaml() + "tuner:\n  link_file: " + links + "\n";
  SUBCASE("tcp over the slow link: suggested") {
    check_all(run_ranks(2, slow, compression_suggested,
                        {{"TEST_WIA_ID", unique_id_env()},
                         {"WIA_TRANSPORT", "tcp"},
                         {"TEST_EXPECT_COMPRESSION", "1"}}));
  }
  SUBCASE("shm with the same file: not suggested") {
    check_all(run_ranks(2, slow, compression_suggested,
                        {{"TEST_WIA_ID", unique_id_env()}, {"TEST_EXPECT_COMPRESSION", "0"}}));
  }
  SUBCASE("shm, the transports' own figures: not suggested") {
    check_all(run_ranks(2, base_yaml(), compression_suggested,
                        {{"TEST_WIA_ID", unique_id_env()}, {"TEST_EXPECT_COMPRESSION", "0"}}));
  }
}

TEST_CASE("profiling: asynchronous copies and sets on a stream are compute") {
  const ScratchDir scratch("work");
  check_all(run_ranks(2, base_yaml(), stream_work_is_compute,
                      {{"TEST_WIA_ID", unique_id_env()}, {"TEST_TRACE_DIR", scratch.path}}));
}

TEST_CASE("profiling: across hosts, compression is costed as the link codec would run it") {
  const ScratchDir scratch("link-codec");
  const std::string links = scratch.path + "/links.yaml";
  if (FILE* f = std::fopen(links.c_str(), "w")) {
    std::fputs(
        "nodes:\n  - {name: a, devices: [\"r0:host0\", \"r1:host0\"]}\n"
        "  - {name: b, devices: [\"r2:host0\", \"r3:host0\"]}\n"
        "links:\n  - {between: intra_node, type: shared_memory, bandwidth_gbps: 20, "
        "latency_us: 1}\n"
        "  - {between: inter_node, type: ethernet_100g, bandwidth_gbps: 0.125, latency_us: 50}\n",
        f);
    std::fclose(f);
  }
  const std::string yaml = base_yaml() + "tuner:\n  link_file: " + links + "\n";
  const auto two_hosts = [](int r) { setenv("WIA_HOSTID", r < 2 ? "hostA" : "hostB", 1); };
  SUBCASE("nothing asks for it: suggested, with the link codec's estimate") {
    check_all(run_ranks(4, yaml, link_codec_suggested,
                        {{"TEST_WIA_ID", unique_id_env()}, {"TEST_EXPECT_LINK_CODEC", "1"}}, {},
                        120, two_hosts));
  }
  SUBCASE("compression.link_codec: auto already: not suggested") {
    check_all(run_ranks(4, yaml + "compression:\n  link_codec: auto\n", link_codec_suggested,
                        {{"TEST_WIA_ID", unique_id_env()}, {"TEST_EXPECT_LINK_CODEC", "0"}}, {},
                        120, two_hosts));
  }
}

TEST_CASE("profiling: a device communicator of 4 host devices is profiled like a process one") {
  for (const char* engine : {"inline", "device"}) {
    INFO("collectives.engine " << engine);
    const ScratchDir scratch("devprof");
    const std::string& dir = scratch.path;
    // The rank's process writes its trace; its pid is the trace's.
    std::vector<pid_t> pids;
    const auto st = run_ranks(1, device_yaml(engine), device_profile, {{"TEST_TRACE_DIR", dir}},
                              [&](std::vector<pid_t>& p) { pids = p; });
    check_all(st);
    REQUIRE(pids.size() == 1);
    CHECK(check_device_trace(dir, "device.json", pids[0], "allreduce=12 broadcast=3 allgather=2") ==
          "OK\n");
  }
}

TEST_CASE("profiling: WIA_TRACE writes a device communicator's timeline at destroy") {
  const ScratchDir scratch("devtrace");
  const std::string& dir = scratch.path;
  std::vector<pid_t> pids;
  check_all(run_ranks(1, device_yaml("auto"), device_trace_from_env,
                      {{"TEST_TRACE_DIR", dir}, {"WIA_TRACE", dir + "/env.json"}},
                      [&](std::vector<pid_t>& p) { pids = p; }));
  REQUIRE(pids.size() == 1);
  CHECK(check_device_trace(dir, "env.json.devices", pids[0], "allreduce=5") == "OK\n");
}

TEST_CASE("profiling: chunking is suggested for large collectives not under compute, only there") {
  check_all(run_ranks(2, base_yaml(), chunking_suggested, {{"TEST_WIA_ID", unique_id_env()}}));
}

TEST_CASE("profiling: another transport is suggested where the configuration forced one") {
  SUBCASE("WIA_TRANSPORT=tcp on one node, where shm is there: suggested") {
    check_all(run_ranks(2, base_yaml(), transport_suggested,
                        {{"TEST_WIA_ID", unique_id_env()},
                         {"WIA_TRANSPORT", "tcp"},
                         {"TEST_EXPECT_TRANSPORT", "1"}}));
  }
  SUBCASE("the built-in rules' choice: not suggested") {
    check_all(run_ranks(2, base_yaml(), transport_suggested,
                        {{"TEST_WIA_ID", unique_id_env()}, {"TEST_EXPECT_TRANSPORT", "0"}}));
  }
}

TEST_CASE("profiling: sampled timing keeps counts and bytes exact; the timeline has the timed") {
  const ScratchDir scratch("sampled");
  for (const char* every : {"128", "1"}) {  // 128: the default
    INFO("profiling.sample_every " << every);
    std::vector<std::pair<std::string, std::string>> env = {{"TEST_WIA_ID", unique_id_env()},
                                                            {"TEST_TRACE_DIR", scratch.path},
                                                            {"TEST_SAMPLE_EVERY", every}};
    if (std::string(every) != "128") env.emplace_back("WIA_PROFILING_SAMPLE_EVERY", every);
    check_all(run_ranks(2, base_yaml(), sampled, env));
  }
}

TEST_CASE("profiling: a device communicator's sends and receives, on their devices' tracks") {
  const ScratchDir scratch("devp2p");
  check_all(
      run_ranks(1, device_yaml("inline"), device_p2p_profiled, {{"TEST_TRACE_DIR", scratch.path}}));
}
