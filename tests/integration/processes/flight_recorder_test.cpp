// SPDX-License-Identifier: Apache-2.0
// The flight recorder with 3 real processes: rank 2 skips a collective,
// so ranks 0 and 1 time out in it and rank 2 fails later in a receive;
// every rank dumps its recorder, and `wia-info --analyse` names rank 2 as
// the one that never joined collective #2. A second job where rank 2 calls
// another collective instead shows the ranks disagreeing on it.
#include <doctest/doctest.h>
#include <wia/wia.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "process_harness.hpp"

namespace {
using namespace wia::test::processes;
namespace fs = std::filesystem;

// Collectives #0 and #1 on every rank; #2 is an all-reduce of 4096 floats
// that rank 2 skips (then it sleeps past the others' timeout and either
// waits for a message nobody sends, or calls a broadcast instead).
int skip_one(int rank, int nranks, bool broadcast_instead) {
  wia_communicator_t comm = join(rank, nranks);
  if (!comm) return kApiError;
  std::vector<float> buf(4096, 1.0f);
  wia_collective_config_t cfg{};
  cfg.datatype = WIA_FLOAT32;
  cfg.reduction_op = WIA_REDUCE_SUM;
  if (wia_all_reduce(comm, buf.data(), buf.data(), 16, &cfg, nullptr) != WIA_SUCCESS ||
      wia_broadcast(comm, buf.data(), 8, 0, WIA_FLOAT32, nullptr) != WIA_SUCCESS ||
      wia_stream_synchronize(nullptr) != WIA_SUCCESS)
    return kApiError;
  if (rank != 2) {
    wia_all_reduce(comm, buf.data(), buf.data(), buf.size(), &cfg, nullptr);
  } else {
    std::this_thread::sleep_for(std::chrono::milliseconds(2500));
    if (broadcast_instead)
      wia_broadcast(comm, buf.data(), 10, 0, WIA_FLOAT32, nullptr);
    else
      wia_comm_recv(comm, buf.data(), 1, WIA_FLOAT32, 0, nullptr);
  }
  const wia_status_t st = wia_stream_synchronize(nullptr);
  wia_destroy_communicator(comm);
  return st == WIA_SUCCESS ? kNoError : kSawError;
}

std::string yaml_with_dir(const std::string& dir) {
  return base_yaml(1500) + "flight_recorder:\n  dir: \"" + dir + "\"\n";
}

}  // namespace

TEST_CASE("flight recorder: every rank dumps, the analyser names the rank that never joined") {
  for (bool broadcast_instead : {false, true}) {
    CAPTURE(broadcast_instead);
    std::string dir = "/tmp/wia_flight_XXXXXX";
    REQUIRE(mkdtemp(dir.data()) != nullptr);
    const auto st = run_ranks(3, yaml_with_dir(dir),
                              [&](int r, int n) { return skip_one(r, n, broadcast_instead); },
                              {{"TEST_WIA_ID", unique_id_env()}, {"WIA_LOG_LEVEL", "off"}});
    check_all(st, kSawError);
    for (int r = 0; r < 3; ++r)
      CHECK(fs::exists(dir + "/wia-flight-comm1-rank" + std::to_string(r) + ".yaml"));
    const std::string report = run_command(std::string(WIA_TEST_WIA_INFO) + " --analyse " + dir);
    INFO(report);
    CHECK(report.find("communicator 1 (3 ranks, 3 dumps)") != std::string::npos);
    if (!broadcast_instead) {
      CHECK(report.find("the job stopped at collective #2 (allreduce of 4096 x float32): "
                        "posted by ranks 0, 1") != std::string::npos);
      CHECK(report.find("rank 2 never joined it (its last operation: p2p recv of 1 x float32 "
                        "with rank 0") != std::string::npos);
    } else {
      CHECK(report.find("the ranks disagree on it") != std::string::npos);
      CHECK(report.find("broadcast of 10 x float32 (root 0): rank(s) 2") != std::string::npos);
      CHECK(report.find("allreduce of 4096 x float32: rank(s) 0, 1") != std::string::npos);
    }
    std::error_code ec;
    fs::remove_all(dir, ec);
  }
  // A directory without dumps is an error that says how to get them.
  const std::string none = run_command(std::string(WIA_TEST_WIA_INFO) + " --analyse /tmp 2>&1");
  CHECK(none.find("set flight_recorder.dir") != std::string::npos);
}
