// SPDX-License-Identifier: Apache-2.0
// Checks of measured links across processes (tests.cmake runs them):
//
//   measured_links_check file FILE TRANSPORT
//       FILE (written by wia-bw --procs 2 --output) holds 2 ranks on one
//       node, each link with a positive bandwidth and latency and the link
//       type of TRANSPORT (shm -> shared_memory, tcp -> tcp).
//   measured_links_check --procs 2 comm measured|transport [FILE_RANK1]
//       2 ranks (spawned as wia-bench does) create a process communicator
//       with WIA_TUNER_LINK_FILE as set (rank 1 reads FILE_RANK1 instead
//       when given); rank 0 checks the figures the communicator's cost model
//       uses (wia_comm_discover_topology reports them): exactly those of
//       data/two-ranks.yaml ("measured"), or not those ("transport"); and an
//       all-reduce over the communicator still gives the right sum.
#include <wia/topology.h>
#include <wia/wia.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "tool_ranks.hpp"

namespace {

int failures = 0;

void expect(bool ok, const std::string& what) {
  if (!ok) {
    std::fprintf(stderr, "FAILED: %s\n", what.c_str());
    ++failures;
  }
}

int check_file(const char* path, const std::string& transport) {
  wia_topology_t t{};
  if (wia_load_topology_yaml(path, &t) != WIA_SUCCESS) {
    std::fprintf(stderr, "FAILED: loading %s: %s\n", path, wia_get_last_error());
    return 1;
  }
  const std::string type = transport == "shm" ? "shared_memory" : transport;
  expect(t.num_devices == 2, "2 devices (one per rank), got " + std::to_string(t.num_devices));
  expect(t.num_nodes == 1, "1 node, got " + std::to_string(t.num_nodes));
  for (int r = 0; r < t.num_devices && r < 2; ++r) {
    const std::string name = t.device_names[r];
    expect(name.find("/rank" + std::to_string(r) + ":") != std::string::npos,
           "device " + std::to_string(r) + " is named after rank " + std::to_string(r) + ", got '" +
               name + "'");
  }
  if (t.num_devices == 2)
    for (const auto& [a, b] : {std::pair{0, 1}, std::pair{1, 0}}) {
      const std::string link = std::to_string(a) + " -> " + std::to_string(b);
      expect(t.bandwidth_gbps[a][b] > 0,
             link + ": bandwidth > 0, got " + std::to_string(t.bandwidth_gbps[a][b]));
      expect(t.latency_us[a][b] > 0,
             link + ": latency > 0, got " + std::to_string(t.latency_us[a][b]));
      expect(type == t.link_type[a][b],
             link + ": link type " + type + ", got " + t.link_type[a][b]);
    }
  std::printf("%s: %d device(s), 0->1 %.3f GB/s %.2f us, 1->0 %.3f GB/s %.2f us\n", path,
              t.num_devices, t.bandwidth_gbps[0][1], t.latency_us[0][1], t.bandwidth_gbps[1][0],
              t.latency_us[1][0]);
  wia_free_topology(&t);
  return failures ? 1 : 0;
}

int run_rank(const std::string& expect_figures, const char* file_rank1) {
  const char* rank_var = std::getenv("WIA_RANK");
  if (file_rank1 && rank_var && std::atoi(rank_var) == 1)
    setenv("WIA_TUNER_LINK_FILE", file_rank1, 1);
  wia::tools::default_one_device_per_process();
  wia_communicator_t comm = nullptr;
  if (wia::tools::join_job("measured_links_check", &comm) != WIA_SUCCESS) {
    std::fprintf(stderr, "FAILED: joining: %s\n", wia_get_last_error());
    return 1;
  }
  const int me = wia_comm_rank(comm);
  wia_topology_t t{};
  expect(wia_comm_discover_topology(comm, &t) == WIA_SUCCESS,
         std::string("wia_comm_discover_topology: ") + wia_get_last_error());
  if (me == 0 && t.num_devices == 2) {
    std::printf("rank 0: model 0->1 %.3f GB/s %.3f us, 1->0 %.3f GB/s %.3f us\n",
                t.bandwidth_gbps[0][1], t.latency_us[0][1], t.bandwidth_gbps[1][0],
                t.latency_us[1][0]);
    // data/two-ranks.yaml, exactly (the figures are copied, not computed).
    const bool from_file = t.bandwidth_gbps[0][1] == 123.5 && t.latency_us[0][1] == 0.77 &&
                           t.bandwidth_gbps[1][0] == 45.25 && t.latency_us[1][0] == 3.5;
    if (expect_figures == "measured")
      expect(from_file, "the communicator uses the measured figures of the link file");
    else
      expect(!from_file && t.bandwidth_gbps[0][1] > 0 && t.bandwidth_gbps[0][1] != 77.5,
             "the communicator uses the transports' figures");
  }
  wia_free_topology(&t);
  // The ranks still cost schedules alike: a collective completes.
  double v = me + 1.0;
  wia_collective_config_t cfg{};
  cfg.operation = WIA_COLLECTIVE_ALLREDUCE;
  cfg.datatype = WIA_FLOAT64;
  cfg.reduction_op = WIA_REDUCE_SUM;
  expect(wia_all_reduce(comm, &v, &v, 1, &cfg, nullptr) == WIA_SUCCESS &&
             wia_stream_synchronize(nullptr) == WIA_SUCCESS,
         std::string("all-reduce: ") + wia_get_last_error());
  expect(v == 3.0, "all-reduce of 1 + 2 gives 3, got " + std::to_string(v));
  wia_destroy_communicator(comm);
  wia_finalize();
  return failures ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 4 && !std::strcmp(argv[1], "file")) return check_file(argv[2], argv[3]);
  if (argc >= 5 && !std::strcmp(argv[1], "--procs") && !std::strcmp(argv[3], "comm"))
    return wia::tools::spawn_local_ranks("measured_links_check", std::atoi(argv[2]), argc, argv);
  // A spawned rank: "comm EXPECT [FILE_RANK1] --procs-from-env".
  if (argc >= 4 && !std::strcmp(argv[1], "comm") &&
      !std::strcmp(argv[argc - 1], "--procs-from-env"))
    return run_rank(argv[2], argc == 5 ? argv[3] : nullptr);
  std::fprintf(stderr,
               "usage: measured_links_check file FILE shm|tcp\n"
               "       measured_links_check --procs 2 comm measured|transport [FILE_RANK1]\n");
  return 2;
}
