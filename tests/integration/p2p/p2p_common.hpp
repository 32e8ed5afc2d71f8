// SPDX-License-Identifier: Apache-2.0
// What the point-to-point tests (p2p_send_test.cpp, p2p_dmabuf_test.cpp,
// the ofi provider's p2p_hmem_test.cpp) share: finding a device by
// provider, each rank's log in a file, finding an entry of a profiling
// report, a byte pattern, and a rank that joins with GPUDirect and
// profiling on.
#pragma once

#include <doctest/doctest.h>
#include <unistd.h>
#include <wia/wia.h>

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include "process_harness.hpp"

namespace wia::test::p2p {

// The first device of `provider` ("host", "cuda"), or -1.
inline int device_of(const char* provider) {
  int n = 0;
  wia_get_device_count(&n);
  for (int d = 0; d < n; ++d) {
    wia_device_properties_t p;
    if (wia_get_device_properties(d, &p) == WIA_SUCCESS && std::string(p.provider) == provider)
      return d;
  }
  return -1;
}

inline std::string read_file(const std::string& path) {
  std::ifstream f(path);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

// The report's entry named `name` ("send_direct", ...), or nullptr.
inline const wia_collective_profile_t* entry(const wia_comm_profile_report_t* r, const char* name) {
  for (int i = 0; r && i < r->num_collectives; ++i)
    if (std::string(r->collectives[i].name) == name) return &r->collectives[i];
  return nullptr;
}

// A byte of transfer `round` at offset i: differs between rounds and
// offsets, so a slice written at the wrong place or from the wrong
// transfer shows.
inline std::uint8_t pattern(int round, std::size_t i) {
  std::uint64_t x = i * 2654435761u ^ static_cast<std::uint64_t>(round) * 0x9E3779B97F4A7C15ull;
  x ^= x >> 29;
  return static_cast<std::uint8_t>(x * 0xBF58476D1CE4E5B9ull >> 56);
}

inline int fail(int rank, const char* what) {
  std::fprintf(stderr, "rank %d: %s: %s\n", rank, what, wia_get_last_error());
  return processes::kApiError;
}

// Each rank's stderr in <base>.<rank> (the ranks' logs, read back by the
// test): `base` a fresh temporary name, removed with the logs.
struct RankLogs {
  std::string base;
  RankLogs() {
    char tmpl[] = "/tmp/wia-p2p-log-XXXXXX";
    const int fd = mkstemp(tmpl);
    REQUIRE(fd >= 0);
    close(fd);
    base = tmpl;
  }
  RankLogs(const RankLogs&) = delete;
  RankLogs& operator=(const RankLogs&) = delete;
  std::string of(int rank) const { return read_file(base + "." + std::to_string(rank)); }
  // run_ranks' before_init: sends this rank's stderr to its file.
  static void redirect(const std::string& base, int rank) {
    const std::string path = base + "." + std::to_string(rank);
    if (!std::freopen(path.c_str(), "w", stderr)) _exit(processes::kApiError);
    std::setvbuf(stderr, nullptr, _IONBF, 0);  // ranks end with _exit
  }
  ~RankLogs() {
    std::remove(base.c_str());
    std::remove((base + ".0").c_str());
    std::remove((base + ".1").c_str());
  }
};

// Joins on the host device, turns GPUDirect RDMA and bandwidth profiling
// on and finds the cuda device (*gpu); nullptr after a message.
inline wia_communicator_t join_with_gpudirect(int rank, int n, int* gpu) {
  *gpu = device_of("cuda");
  const int host = device_of("host");
  if (host < 0 || *gpu < 0 || wia_set_device(host) != WIA_SUCCESS) {
    std::fprintf(stderr, "rank %d: host device %d, cuda device %d\n", rank, host, *gpu);
    return nullptr;
  }
  wia_communicator_t comm = processes::join(rank, n);
  if (!comm) return nullptr;
  wia_distributed_config_t dist_cfg = {};
  wia_gpudirect_config_t g = {.enable_rdma = true,
                              .enable_async_copy = false,
                              .max_inline_size = 0,
                              .use_write_semantics = true};
  wia_comm_profiling_t prof = {.enable_bandwidth_tracking = true,
                               .enable_latency_tracking = false,
                               .enable_overlap_analysis = false};
  if (wia_enable_gpudirect_rdma(&dist_cfg, &g) != WIA_SUCCESS ||
      wia_enable_comm_profiling(comm, &prof) != WIA_SUCCESS) {
    fail(rank, "gpudirect or profiling");
    return nullptr;
  }
  return comm;
}

}  // namespace wia::test::p2p
