// SPDX-License-Identifier: Apache-2.0
// Heartbeats (docs/fault-tolerance.md, "Heartbeats"): an idle process
// communicator notices a SIGKILLed rank within collectives.heartbeat_timeout_ms
// (collectives.timeout_ms is 60 s here, so nothing else can be what
// notices), a rank busy outside the library is not declared failed, and
// heartbeat_ms 0 keeps the old behaviour (noticed only by an operation).
#include <doctest/doctest.h>

#include <sched.h>

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "process_harness.hpp"

using namespace wia::test::processes;

namespace {

std::int64_t now_ns() {  // CLOCK_MONOTONIC: one clock for every process
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// Where rank `rank` writes when it noticed the failure (the test's pid:
// set before the ranks are forked).
std::string stamp_prefix;
std::string stamp_path(int rank) { return stamp_prefix + std::to_string(rank); }

// An 8-element all-reduce of rank-dependent data, checked.
int checked_all_reduce(wia_communicator_t comm, int rank, int nranks) {
  std::vector<float> b(8);
  for (int i = 0; i < 8; ++i) b[i] = static_cast<float>(rank + i);
  wia_collective_config_t cfg{};
  cfg.datatype = WIA_FLOAT32;
  if (wia_all_reduce(comm, b.data(), b.data(), b.size(), &cfg, nullptr) != WIA_SUCCESS ||
      wia_stream_synchronize(nullptr) != WIA_SUCCESS) {
    std::fprintf(stderr, "rank %d: all-reduce: %s\n", rank, wia_get_last_error());
    return kApiError;
  }
  for (int i = 0; i < 8; ++i) {
    const float want = static_cast<float>(nranks * (nranks - 1) / 2 + nranks * i);
    if (b[i] != want) {
      std::fprintf(stderr, "rank %d: element %d is %g, not %g\n", rank, i, b[i], want);
      return kWrong;
    }
  }
  return kOk;
}

std::string hb_yaml(int heartbeat_ms, int collective_timeout_ms) {
  return base_yaml(collective_timeout_ms) + "  heartbeat_ms: " + std::to_string(heartbeat_ms) +
         "\n";
}

}  // namespace

TEST_CASE("heartbeats: every idle survivor names a SIGKILLed rank within the heartbeat timeout") {
  for (const char* transport : {"shm", "tcp"}) {
    INFO(transport);
    const auto before = shm_entries();
    constexpr int kRanks = 4, kVictim = 2;
    std::int64_t killed_at = 0;
    stamp_prefix = "/tmp/wia-hb-test-" + std::to_string(getpid()) + "-";
    // Default heartbeat (500 ms, timeout 1500 ms); a collective would take 60 s to notice.
    const auto st = run_ranks(
        kRanks, base_yaml(60000),
        [](int rank, int nranks) {
          wia_communicator_t comm = join(rank, nranks);
          if (!comm) return kApiError;
          if (const int rc = checked_all_reduce(comm, rank, nranks); rc != kOk) return rc;
          // Idle: only the cheap check, as a training loop would do it.
          const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
          while (!wia_detect_device_failure(comm)) {
            if (std::chrono::steady_clock::now() > until) {
              std::fprintf(stderr, "rank %d: no failure detected within 20 s\n", rank);
              return kNoError;
            }
            std::this_thread::sleep_for(std::chrono::milliseconds(10));
          }
          const std::int64_t detected_at = now_ns();
          int failed[4] = {-1, -1, -1, -1};
          int n = -1;
          if (wia_comm_get_failed(comm, failed, 4, &n) != WIA_SUCCESS || n != 1 ||
              failed[0] != kVictim) {
            std::fprintf(stderr, "rank %d: %d failed, first %d\n", rank, n, failed[0]);
            return kWrong;
          }
          // A later operation fails, naming the rank.
          std::vector<float> b(8, 1.0f);
          wia_collective_config_t cfg{};
          cfg.datatype = WIA_FLOAT32;
          std::string msg;
          if (wia_all_reduce(comm, b.data(), b.data(), b.size(), &cfg, nullptr) != WIA_SUCCESS ||
              wia_stream_synchronize(nullptr) != WIA_SUCCESS)
            msg = wia_get_last_error();
          wia_destroy_communicator(comm);
          if (msg.find("rank 2") == std::string::npos) {
            std::fprintf(stderr, "rank %d: the collective after the failure said '%s'\n", rank,
                         msg.c_str());
            return kWrong;
          }
          std::fprintf(stderr, "rank %d saw: %s\n", rank, msg.c_str());
          std::ofstream(stamp_path(rank)) << detected_at << "\n";
          return kSawError;
        },
        {{"TEST_WIA_ID", unique_id_env()}, {"WIA_TRANSPORT", transport}},
        [&killed_at](std::vector<pid_t>& pids) {
          std::this_thread::sleep_for(std::chrono::milliseconds(2000));
          kill(pids[kVictim], SIGKILL);
          killed_at = now_ns();
        },
        60);
    CHECK(st[kVictim] == -SIGKILL);
    for (int r = 0; r < kRanks; ++r) {
      if (r == kVictim) continue;
      INFO("rank " << r);
      CHECK(st[r] == kSawError);
      std::int64_t detected_at = 0;
      std::ifstream(stamp_path(r)) >> detected_at;
      std::remove(stamp_path(r).c_str());
      REQUIRE(detected_at > 0);
      const double secs = double(detected_at - killed_at) / 1e9;
      MESSAGE(transport << ": rank " << r << " detected the SIGKILL after " << secs << " s");
      CHECK(secs < 5.0);  // heartbeat_timeout_ms 1500 + a tick + a loaded machine
    }
    CHECK(shm_entries() == before);
  }
}

TEST_CASE("heartbeats: a collective waiting on a SIGKILLed rank fails within seconds, naming it") {
  // Ranks 0 and 1 wait in a small all-reduce (on one node: through the
  // node-shared windows, which poll no connection) for rank 2, which is
  // killed; collectives.timeout_ms is 60 s, so only the heartbeats (polled
  // by the waiting operation itself) can end the wait.
  const auto st = run_ranks(
      3, base_yaml(60000),
      [](int rank, int nranks) {
        wia_communicator_t comm = join(rank, nranks);
        if (!comm) return kApiError;
        if (const int rc = checked_all_reduce(comm, rank, nranks); rc != kOk) return rc;
        if (rank == 2) {
          std::this_thread::sleep_for(std::chrono::seconds(30));  // killed meanwhile
          return kNoError;
        }
        const auto start = std::chrono::steady_clock::now();
        std::vector<float> b(8, 1.0f);
        wia_collective_config_t cfg{};
        cfg.datatype = WIA_FLOAT32;
        if (wia_all_reduce(comm, b.data(), b.data(), b.size(), &cfg, nullptr) == WIA_SUCCESS &&
            wia_stream_synchronize(nullptr) == WIA_SUCCESS)
          return kNoError;
        const double secs =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        const std::string msg = wia_get_last_error();
        int failed[4] = {-1, -1, -1, -1};
        int n = -1;
        const bool listed = wia_comm_get_failed(comm, failed, 4, &n) == WIA_SUCCESS && n == 1 &&
                            failed[0] == 2 && wia_detect_device_failure(comm);
        wia_destroy_communicator(comm);
        std::fprintf(stderr, "rank %d failed after %.2f s: %s\n", rank, secs, msg.c_str());
        // The kill comes 1.5 s in; the heartbeat timeout is 1.5 s.
        return listed && secs < 8 && msg.find("rank 2") != std::string::npos ? kSawError : kWrong;
      },
      {{"TEST_WIA_ID", unique_id_env()}},
      [](std::vector<pid_t>& pids) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1500));
        kill(pids[2], SIGKILL);
      },
      60);
  CHECK(st[2] == -SIGKILL);
  CHECK(st[0] == kSawError);
  CHECK(st[1] == kSawError);
}

TEST_CASE("heartbeats: a rank busy 3 s outside the library is not declared failed") {
  // Rank 1 sleeps 3 s (twice the default heartbeat timeout) without calling
  // the library; rank 0 waits idle meanwhile, rank 2 inside an all-reduce
  // that needs rank 1. Its heartbeat thread keeps it alive for both.
  const auto st = run_ranks(
      3, base_yaml(60000),
      [](int rank, int nranks) {
        wia_communicator_t comm = join(rank, nranks);
        if (!comm) return kApiError;
        if (const int rc = checked_all_reduce(comm, rank, nranks); rc != kOk) return rc;
        if (rank == 1) {
          std::this_thread::sleep_for(std::chrono::milliseconds(3000));
        } else if (rank == 0) {
          const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(3000);
          while (std::chrono::steady_clock::now() < until) {
            if (wia_detect_device_failure(comm)) {
              std::fprintf(stderr, "rank 0: a failure was detected while rank 1 slept\n");
              return kWrong;
            }
            std::this_thread::sleep_for(std::chrono::milliseconds(20));
          }
        }
        if (const int rc = checked_all_reduce(comm, rank, nranks); rc != kOk) return rc;
        int failed[4];
        int n = -1;
        const bool detected = wia_detect_device_failure(comm);
        if (wia_comm_get_failed(comm, failed, 4, &n) != WIA_SUCCESS || n != 0 || detected) {
          std::fprintf(stderr, "rank %d: detected %d, %d failed\n", rank, detected, n);
          return kWrong;
        }
        return wia_destroy_communicator(comm) == WIA_SUCCESS ? kOk : kApiError;
      },
      {{"TEST_WIA_ID", unique_id_env()}}, {}, 60);
  check_all(st, kOk);
}

namespace {

// Pins the calling process to the first CPU it may run on: three ranks on
// one CPU are oversubscribed on any machine, so waiting ranks sleep.
void pin_to_one_cpu() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return;
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &set)) {
      CPU_ZERO(&set);
      CPU_SET(c, &set);
      sched_setaffinity(0, sizeof(set), &set);
      return;
    }
}

// Ranks 0 and 2 enter a 4 MiB all-reduce at once and wait inside it for
// rank 1, which comes 3 s late (twice the heartbeat timeout). The
// waiting ranks sleep (oversubscribed: every rank on one CPU), over tcp in
// poll(2) on their connections, over shm on the window's futex; they must
// still send heartbeats and answer for themselves, or rank 1's heartbeat
// thread declares them failed. The sum is checked element by element.
void late_rank_in_a_large_all_reduce(const char* transport, wia_algorithm_id_t algorithm) {
  const auto st = run_ranks(
      3, base_yaml(60000),
      [algorithm](int rank, int nranks) {
        wia_communicator_t comm = join(rank, nranks);
        if (!comm) return kApiError;
        if (rank == 1) std::this_thread::sleep_for(std::chrono::milliseconds(3000));
        const std::size_t n = std::size_t{1} << 20;
        std::vector<float> b(n);
        for (std::size_t i = 0; i < n; ++i) b[i] = static_cast<float>(rank * 8 + i % 8);
        wia_collective_config_t cfg{};
        cfg.datatype = WIA_FLOAT32;
        cfg.algorithm = algorithm;
        if (wia_all_reduce(comm, b.data(), b.data(), n, &cfg, nullptr) != WIA_SUCCESS ||
            wia_stream_synchronize(nullptr) != WIA_SUCCESS) {
          std::fprintf(stderr, "rank %d: all-reduce: %s\n", rank, wia_get_last_error());
          return kApiError;
        }
        for (std::size_t i = 0; i < n; ++i) {
          const float want = static_cast<float>(8 * (0 + 1 + 2) + nranks * (i % 8));
          if (b[i] != want) {
            std::fprintf(stderr, "rank %d: element %zu is %g, not %g\n", rank, i, b[i], want);
            return kWrong;
          }
        }
        int failed[4];
        int count = -1;
        if (wia_comm_get_failed(comm, failed, 4, &count) != WIA_SUCCESS || count != 0) {
          std::fprintf(stderr, "rank %d: %d rank(s) listed as failed\n", rank, count);
          return kWrong;
        }
        return wia_destroy_communicator(comm) == WIA_SUCCESS ? kOk : kApiError;
      },
      {{"TEST_WIA_ID", unique_id_env()}, {"WIA_TRANSPORT", transport}}, {}, 60,
      [](int) { pin_to_one_cpu(); });
  check_all(st, kOk);
}

}  // namespace

TEST_CASE("heartbeats: ranks sleeping inside a large all-reduce for a late rank stay alive") {
  SUBCASE("tcp, ring: the network engine sleeps in poll(2)") {
    late_rank_in_a_large_all_reduce("tcp", WIA_ALGORITHM_RING);
  }
  SUBCASE("shm, direct: through the node-shared windows") {
    late_rank_in_a_large_all_reduce("shm", WIA_ALGORITHM_DIRECT);
  }
}

TEST_CASE("heartbeats off: an idle communicator does not notice a SIGKILL; its next collective does") {
  const auto before = shm_entries();
  const auto st = run_ranks(
      3, hb_yaml(0, 3000),
      [](int rank, int nranks) {
        wia_communicator_t comm = join(rank, nranks);
        if (!comm) return kApiError;
        if (const int rc = checked_all_reduce(comm, rank, nranks); rc != kOk) return rc;
        // Rank 2 is killed 1 s from now; 3 s idle later nobody has noticed.
        const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(4000);
        while (std::chrono::steady_clock::now() < until) {
          if (wia_detect_device_failure(comm)) {
            std::fprintf(stderr, "rank %d: detected a failure without heartbeats\n", rank);
            return kWrong;
          }
          std::this_thread::sleep_for(std::chrono::milliseconds(20));
        }
        std::vector<float> b(8, 1.0f);
        wia_collective_config_t cfg{};
        cfg.datatype = WIA_FLOAT32;
        if (wia_all_reduce(comm, b.data(), b.data(), b.size(), &cfg, nullptr) == WIA_SUCCESS &&
            wia_stream_synchronize(nullptr) == WIA_SUCCESS)
          return kNoError;
        const std::string msg = wia_get_last_error();
        const bool detected = wia_detect_device_failure(comm);
        wia_destroy_communicator(comm);
        std::fprintf(stderr, "rank %d saw: %s\n", rank, msg.c_str());
        const bool named = msg.find("rank 2") != std::string::npos ||
                           msg.find("rank(s) 2") != std::string::npos;
        return detected && named ? kSawError : kWrong;
      },
      {{"TEST_WIA_ID", unique_id_env()}},
      [](std::vector<pid_t>& pids) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1500));
        kill(pids[2], SIGKILL);
      },
      60);
  CHECK(st[2] == -SIGKILL);
  CHECK(st[0] == kSawError);
  CHECK(st[1] == kSawError);
  CHECK(shm_entries() == before);
}
