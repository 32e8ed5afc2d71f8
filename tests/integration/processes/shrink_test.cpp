// SPDX-License-Identifier: Apache-2.0
// Revoke, agree, shrink (docs/fault-tolerance.md, "Revoke, agree,
// shrink"), with real processes and SIGKILL, over shm and tcp: the
// survivors of a killed rank (rank 0, the bootstrap root, too) revoke,
// agree and shrink, and the new communicator's collectives are checked
// against references computed here from the survivors' original ranks;
// the torture kills one of 6 ranks per step down to 1, each step bounded,
// without /dev/shm or descriptor leaks.
#include <dirent.h>
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "process_harness.hpp"

using namespace wia::test::processes;

namespace {

using Clock = std::chrono::steady_clock;

std::int64_t now_ns() {  // CLOCK_MONOTONIC: one clock for every process
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch())
      .count();
}

std::string fd_list() {
  std::string out;
  if (DIR* d = opendir("/proc/self/fd")) {
    while (dirent* e = readdir(d)) {
      if (e->d_name[0] == '.') continue;
      char target[256] = {};
      const std::string link = std::string("/proc/self/fd/") + e->d_name;
      if (readlink(link.c_str(), target, sizeof target - 1) < 0) continue;
      out += std::string(e->d_name) + "=" + target + " ";
    }
    closedir(d);
  }
  return out;
}

// Open descriptors, less the directory's own and the host device's memory
// (a memfd the host provider opens on the first allocation and keeps until
// wia_finalize: the process's, not a communicator's).
int open_fds() {
  int n = 0;
  if (DIR* d = opendir("/proc/self/fd")) {
    while (dirent* e = readdir(d)) {
      if (e->d_name[0] == '.') continue;
      char target[256] = {};
      const std::string link = std::string("/proc/self/fd/") + e->d_name;
      if (readlink(link.c_str(), target, sizeof target - 1) > 0 &&
          std::strncmp(target, "/memfd:wia-host-dev", 19) == 0)
        continue;
      ++n;
    }
    closedir(d);
  }
  return n - 1;
}

// Files the ranks and the test share (the test's pid keeps runs apart).
std::string prefix;
std::string stamp(const std::string& what) { return prefix + what; }
void write_stamp(const std::string& what, const std::string& text) {
  const std::string tmp = stamp(what) + ".tmp";
  std::ofstream(tmp) << text << "\n";
  std::rename(tmp.c_str(), stamp(what).c_str());
}
bool has_stamp(const std::string& what) { return std::ifstream(stamp(what)).good(); }
std::string read_stamp(const std::string& what) {
  std::string s;
  std::getline(std::ifstream(stamp(what)), s);
  return s;
}
void remove_stamps() {
  const std::string dir = "/tmp", base = prefix.substr(5);
  if (DIR* d = opendir(dir.c_str())) {
    while (dirent* e = readdir(d))
      if (std::string(e->d_name).rfind(base, 0) == 0) std::remove((dir + "/" + e->d_name).c_str());
    closedir(d);
  }
}

// Element i of the input of the rank that was `orig` at the start, in
// iteration `it`: small integers, so float sums are exact.
float value(int orig, std::uint64_t i, int it) {
  return static_cast<float>(static_cast<int>((i * 7 + orig * 13 + it * 5) % 23) - 11);
}

bool ok(wia_status_t s) {
  return s == WIA_SUCCESS && wia_stream_synchronize(nullptr) == WIA_SUCCESS;
}

// The original ranks of comm's members, gathered, in new-rank order; they
// must ascend (dense renumbering in old-rank order) and hold `orig` at
// this rank's place. Empty on failure (printed).
std::vector<int> member_origins(wia_communicator_t comm, int orig) {
  const int n = wia_comm_size(comm), me = wia_comm_rank(comm);
  std::vector<std::int32_t> all(n, -1);
  std::int32_t mine = orig;
  if (!ok(wia_all_gather(comm, &mine, all.data(), 1, WIA_INT32, nullptr))) {
    std::fprintf(stderr, "rank %d: all-gather of the origins: %s\n", orig, wia_get_last_error());
    return {};
  }
  if (!std::is_sorted(all.begin(), all.end()) ||
      std::adjacent_find(all.begin(), all.end()) != all.end() || all[me] != orig) {
    std::fprintf(stderr, "rank %d (new rank %d of %d): members out of order\n", orig, me, n);
    return {};
  }
  return {all.begin(), all.end()};
}

// One checked collective on comm: all-reduce (sum), broadcast from a root
// that changes, or all-gather, by `it`; `origins` are the members'
// original ranks. kOk, kWrong (data), or -1 when the call failed.
int checked_collective(wia_communicator_t comm, const std::vector<int>& origins, int it,
                       std::uint64_t count) {
  const int n = static_cast<int>(origins.size()), me = wia_comm_rank(comm);
  const int orig = origins[me];
  std::vector<float> in(count), out;
  for (std::uint64_t i = 0; i < count; ++i) in[i] = value(orig, i, it);
  const int kind = it % 3;
  if (kind == 0) {
    wia_collective_config_t cfg{};
    cfg.datatype = WIA_FLOAT32;
    cfg.reduction_op = WIA_REDUCE_SUM;
    out.assign(count, -1.0f);
    if (!ok(wia_all_reduce(comm, in.data(), out.data(), count, &cfg, nullptr))) return -1;
    for (std::uint64_t i = 0; i < count; ++i) {
      float want = 0;
      for (int o : origins) want += value(o, i, it);
      if (out[i] != want) {
        std::fprintf(stderr, "rank %d: all-reduce #%d element %llu is %g, not %g\n", orig, it,
                     static_cast<unsigned long long>(i), out[i], want);
        return kWrong;
      }
    }
  } else if (kind == 1) {
    const int root = it % n;
    out = in;
    if (!ok(wia_broadcast(comm, out.data(), count, root, WIA_FLOAT32, nullptr))) return -1;
    for (std::uint64_t i = 0; i < count; ++i)
      if (out[i] != value(origins[root], i, it)) {
        std::fprintf(stderr, "rank %d: broadcast #%d from %d: element %llu is %g\n", orig, it, root,
                     static_cast<unsigned long long>(i), out[i]);
        return kWrong;
      }
  } else {
    out.assign(count * n, -1.0f);
    if (!ok(wia_all_gather(comm, in.data(), out.data(), count, WIA_FLOAT32, nullptr))) return -1;
    for (int j = 0; j < n; ++j)
      for (std::uint64_t i = 0; i < count; ++i)
        if (out[j * count + i] != value(origins[j], i, it)) {
          std::fprintf(stderr, "rank %d: all-gather #%d block %d element %llu is %g\n", orig, it, j,
                       static_cast<unsigned long long>(i), out[j * count + i]);
          return kWrong;
        }
  }
  return kOk;
}

// Sizes that take the small (one-shot, windows) and the large paths.
std::uint64_t count_of(int it) {
  static const std::uint64_t counts[] = {8, 1000, 65536, 300000, 3};
  return counts[(it / 3) % 5];
}

// Collectives on comm until one fails (-1 returned) or `limit` passes.
int until_failure(wia_communicator_t comm, const std::vector<int>& origins, int orig,
                  Clock::duration limit) {
  const auto until = Clock::now() + limit;
  for (int it = 0;; ++it) {
    const int rc = checked_collective(comm, origins, it, count_of(it));
    if (rc == -1) {
      std::fprintf(stderr, "rank %d: collective #%d failed: %s\n", orig, it, wia_get_last_error());
      return -1;
    }
    if (rc != kOk) return rc;
    if (Clock::now() > until) {
      std::fprintf(stderr, "rank %d: no failure within the step's limit\n", orig);
      return kNoError;
    }
  }
}

// The new communicator's members' collectives, each kind, several sizes.
int check_new_comm(wia_communicator_t comm, const std::vector<int>& origins) {
  for (int it = 0; it < 15; ++it)
    if (const int rc = checked_collective(comm, origins, it, count_of(it)); rc != kOk) {
      if (rc == -1)
        std::fprintf(stderr, "rank %d: collective #%d on the new communicator: %s\n",
                     origins[wia_comm_rank(comm)], it, wia_get_last_error());
      return rc == -1 ? kApiError : rc;
    }
  return kOk;
}

std::string ft_yaml() {
  // 20 s: shorter than the test's limits, far longer than any step should take.
  return base_yaml(20000);
}

}  // namespace

TEST_CASE(
    "shrink: survivors of a rank SIGKILLed in a loop of collectives revoke, shrink to 3, and "
    "their collectives are right") {
  for (const char* transport : {"shm", "tcp"}) {
    for (const int victim : {1, 0}) {  // rank 0 hosts the bootstrap root
      INFO(std::string(transport) << ", rank " << victim << " killed");
      const auto shm_before = shm_entries();
      prefix = "/tmp/wia-shrink-test-" + std::to_string(getpid()) + "-";
      std::int64_t killed_at = 0;
      const auto st = run_ranks(
          4, ft_yaml(),
          [victim](int rank, int nranks) {
            wia_communicator_t comm = join(rank, nranks);
            if (!comm) return kApiError;
            std::vector<int> origins = member_origins(comm, rank);
            if (origins.empty()) return kApiError;
            write_stamp("up" + std::to_string(rank), "1");
            if (const int rc = until_failure(comm, origins, rank, std::chrono::seconds(30));
                rc != -1)
              return rc;
            const std::int64_t failed_at = now_ns();
            // The rank that noticed tells the others; a second revoke
            // (the others') and a revoke of a broken communicator are
            // harmless.
            if (wia_comm_revoke(comm) != WIA_SUCCESS || !wia_detect_device_failure(comm)) {
              std::fprintf(stderr, "rank %d: revoke: %s\n", rank, wia_get_last_error());
              return kApiError;
            }
            wia_communicator_t next = nullptr;
            if (wia_comm_shrink(comm, &next) != WIA_SUCCESS || !next) {
              std::fprintf(stderr, "rank %d: shrink: %s\n", rank, wia_get_last_error());
              return kApiError;
            }
            const std::int64_t shrunk_at = now_ns();
            int failed[4] = {-1, -1, -1, -1}, nfailed = -1;
            wia_comm_get_failed(comm, failed, 4, &nfailed);
            const int want_rank = rank - (victim < rank ? 1 : 0);
            if (nfailed != 1 || failed[0] != victim || wia_comm_size(next) != 3 ||
                wia_comm_rank(next) != want_rank || wia_detect_device_failure(next)) {
              std::fprintf(stderr, "rank %d: %d failed (first %d), new size %d, new rank %d\n",
                           rank, nfailed, failed[0], wia_comm_size(next), wia_comm_rank(next));
              return kWrong;
            }
            if (wia_destroy_communicator(comm) != WIA_SUCCESS) return kApiError;
            origins = member_origins(next, rank);
            if (origins.empty()) return kApiError;
            if (const int rc = check_new_comm(next, origins); rc != kOk) return rc;
            if (wia_destroy_communicator(next) != WIA_SUCCESS) return kApiError;
            write_stamp("t" + std::to_string(rank),
                        std::to_string(failed_at) + " " + std::to_string(shrunk_at));
            return kOk;
          },
          {{"TEST_WIA_ID", unique_id_env()}, {"WIA_TRANSPORT", transport}},
          [&killed_at, victim](std::vector<pid_t>& pids) {
            const auto until = Clock::now() + std::chrono::seconds(60);
            for (int r = 0; r < 4 && Clock::now() < until; ++r)
              while (!has_stamp("up" + std::to_string(r)) && Clock::now() < until)
                std::this_thread::sleep_for(std::chrono::milliseconds(5));
            std::this_thread::sleep_for(std::chrono::milliseconds(700));  // in the loop
            kill(pids[victim], SIGKILL);
            killed_at = now_ns();
          },
          120);
      CHECK(st[victim] == -SIGKILL);
      for (int r = 0; r < 4; ++r) {
        if (r == victim) continue;
        INFO("rank " << r);
        CHECK(st[r] == kOk);
        std::int64_t failed_at = 0, shrunk_at = 0;
        std::istringstream(read_stamp("t" + std::to_string(r))) >> failed_at >> shrunk_at;
        if (st[r] != kOk) continue;
        const double detect = double(failed_at - killed_at) / 1e9;
        const double shrink = double(shrunk_at - failed_at) / 1e9;
        MESSAGE(std::string(transport)
                << ", rank " << victim << " killed: rank " << r << " failed after " << detect
                << " s, shrunk " << shrink << " s later");
        CHECK(detect < 8.0);   // heartbeat_timeout_ms 1500 on a loaded 2-core machine
        CHECK(shrink < 10.0);  // collectives.timeout_ms is 20 s
      }
      remove_stamps();
      CHECK(shm_entries() == shm_before);
    }
  }
}

TEST_CASE(
    "shrink over two faked hosts: node and local ranks are recomputed, shm inside a node and tcp "
    "between them") {
  // Ranks 0, 1 on hostA and 2, 3, 4 on hostB; rank 2, hostB's first, dies.
  // The survivors 0, 1 | 3, 4 become ranks 0, 1 on node 0 and 2, 3 on node 1.
  prefix = "/tmp/wia-hosts-test-" + std::to_string(getpid()) + "-";
  constexpr int kVictim = 2;
  const auto st = run_ranks(
      5, ft_yaml(),
      [](int rank, int nranks) {
        setenv("WIA_HOSTID", rank < 2 ? "hostA" : "hostB", 1);
        wia_communicator_t comm = join(rank, nranks);
        if (!comm) return kApiError;
        std::vector<int> origins = member_origins(comm, rank);
        if (origins.empty()) return kApiError;
        write_stamp("up" + std::to_string(rank), "1");
        if (const int rc = until_failure(comm, origins, rank, std::chrono::seconds(30)); rc != -1)
          return rc;
        wia_comm_revoke(comm);
        wia_communicator_t next = nullptr;
        if (wia_comm_shrink(comm, &next) != WIA_SUCCESS) {
          std::fprintf(stderr, "rank %d: shrink: %s\n", rank, wia_get_last_error());
          return kApiError;
        }
        wia_destroy_communicator(comm);
        const int me = rank < kVictim ? rank : rank - 1;
        bool ok = wia_comm_size(next) == 4 && wia_comm_rank(next) == me &&
                  wia_comm_node_count(next) == 2 && wia_comm_node_rank(next) == me / 2 &&
                  wia_comm_local_rank(next) == me % 2;
        wia_topology_t topo;
        if (ok && wia_comm_discover_topology(next, &topo) == WIA_SUCCESS) {
          ok = topo.num_devices == 4 && std::string(topo.link_type[0][1]) == "shared_memory" &&
               std::string(topo.link_type[2][3]) == "shared_memory" &&
               std::string(topo.link_type[1][2]) == "tcp" &&
               std::string(topo.link_type[3][0]) == "tcp";
          wia_free_topology(&topo);
        } else {
          ok = false;
        }
        if (!ok) {
          std::fprintf(stderr, "rank %d: new rank %d of %d, node %d of %d, local rank %d\n", rank,
                       wia_comm_rank(next), wia_comm_size(next), wia_comm_node_rank(next),
                       wia_comm_node_count(next), wia_comm_local_rank(next));
          return kWrong;
        }
        origins = member_origins(next, rank);
        if (origins.empty()) return kApiError;
        const int rc = check_new_comm(next, origins);
        wia_destroy_communicator(next);
        return rc;
      },
      {{"TEST_WIA_ID", unique_id_env()}},
      [](std::vector<pid_t>& pids) {
        const auto until = Clock::now() + std::chrono::seconds(60);
        for (int r = 0; r < 5 && Clock::now() < until; ++r)
          while (!has_stamp("up" + std::to_string(r)) && Clock::now() < until)
            std::this_thread::sleep_for(std::chrono::milliseconds(5));
        std::this_thread::sleep_for(std::chrono::milliseconds(500));
        kill(pids[kVictim], SIGKILL);
      },
      120);
  remove_stamps();
  CHECK(st[kVictim] == -SIGKILL);
  for (int r = 0; r < 5; ++r) {
    if (r == kVictim) continue;
    INFO("rank " << r);
    CHECK(st[r] == kOk);
  }
}

TEST_CASE(
    "agree: survivors of a dead rank 0 agree on the AND of their flags and on the failed set") {
  prefix = "/tmp/wia-agree-test-" + std::to_string(getpid()) + "-";
  const auto st = run_ranks(
      4, ft_yaml(),
      [](int rank, int nranks) {
        wia_communicator_t comm = join(rank, nranks);
        if (!comm) return kApiError;
        if (member_origins(comm, rank).empty()) return kApiError;
        write_stamp("up" + std::to_string(rank), "1");
        if (rank == 0) {
          std::this_thread::sleep_for(std::chrono::seconds(30));  // killed meanwhile
          return kNoError;
        }
        const auto until = Clock::now() + std::chrono::seconds(20);
        while (!wia_detect_device_failure(comm)) {
          if (Clock::now() > until) {
            std::fprintf(stderr, "rank %d: rank 0's death not detected within 20 s\n", rank);
            return kNoError;
          }
          std::this_thread::sleep_for(std::chrono::milliseconds(10));
        }
        // Ranks 1 and 3 call at once, rank 2 a second later: the
        // agreement waits for it.
        if (rank == 2) std::this_thread::sleep_for(std::chrono::seconds(1));
        int flag = rank == 2 ? 0x5 : 0x7;
        int failed[4] = {-1, -1, -1, -1}, nfailed = -1;
        if (wia_comm_agree_failed(comm, &flag, failed, 4, &nfailed) != WIA_SUCCESS) {
          std::fprintf(stderr, "rank %d: agree: %s\n", rank, wia_get_last_error());
          return kApiError;
        }
        if (flag != 0x5 || nfailed != 1 || failed[0] != 0) {
          std::fprintf(stderr, "rank %d: agreed flag %#x, %d failed (first %d)\n", rank, flag,
                       nfailed, failed[0]);
          return kWrong;
        }
        // A second agreement, in step.
        flag = rank == 3 ? 0 : 1;
        if (wia_comm_agree(comm, &flag) != WIA_SUCCESS || flag != 0) {
          std::fprintf(stderr, "rank %d: second agree: flag %d: %s\n", rank, flag,
                       wia_get_last_error());
          return kWrong;
        }
        wia_destroy_communicator(comm);
        return kOk;
      },
      {{"TEST_WIA_ID", unique_id_env()}},
      [](std::vector<pid_t>& pids) {
        const auto until = Clock::now() + std::chrono::seconds(60);
        for (int r = 0; r < 4 && Clock::now() < until; ++r)
          while (!has_stamp("up" + std::to_string(r)) && Clock::now() < until)
            std::this_thread::sleep_for(std::chrono::milliseconds(5));
        kill(pids[0], SIGKILL);
      },
      90);
  remove_stamps();
  CHECK(st[0] == -SIGKILL);
  for (int r = 1; r < 4; ++r) {
    INFO("rank " << r);
    CHECK(st[r] == kOk);
  }
}

// The coordinator decides, tells some participants and dies
// (WIA_TEST_AGREE_EXIT_AFTER_SENDING_TO): the others must still return
// that same decision, not one of their own. "1": the rank told is the
// next coordinator, whose heartbeat thread hands the decision to the
// others. "3": the next coordinator (rank 1) was not told; it asks the
// ranks it waits for and adopts rank 3's. Rank 0's flag (0x3) is in the
// decision and rank 0 is not in its failed set: a survivor that decided
// anew would return 0x5 (not 0x1) and rank 0 failed.
TEST_CASE("agree: a coordinator that dies after telling some participants leaves one answer") {
  for (const char* told : {"1", "3"}) {
    INFO("rank 0 told rank(s) " << told << " before dying");
    const auto st = run_ranks(
        4, ft_yaml(),
        [told](int rank, int nranks) {
          wia_communicator_t comm = join(rank, nranks);
          if (!comm) return kApiError;
          if (rank == 0) setenv("WIA_TEST_AGREE_EXIT_AFTER_SENDING_TO", told, 1);
          int flag = rank == 0 ? 0x3 : rank == 2 ? 0x5 : 0x7;
          int failed[4] = {-1, -1, -1, -1}, nfailed = -1;
          if (wia_comm_agree_failed(comm, &flag, failed, 4, &nfailed) != WIA_SUCCESS) {
            std::fprintf(stderr, "rank %d: agree: %s\n", rank, wia_get_last_error());
            return kApiError;
          }
          if (flag != 0x1 || nfailed != 0) {
            std::fprintf(stderr, "rank %d: agreed flag %#x, %d failed (first %d)\n", rank, flag,
                         nfailed, failed[0]);
            return kWrong;
          }
          // The next agreement counts the dead coordinator.
          flag = rank == 3 ? 0x2 : 0x3;
          if (wia_comm_agree_failed(comm, &flag, failed, 4, &nfailed) != WIA_SUCCESS ||
              flag != 0x2 || nfailed != 1 || failed[0] != 0) {
            std::fprintf(stderr, "rank %d: second agree: flag %#x, %d failed (first %d): %s\n",
                         rank, flag, nfailed, failed[0], wia_get_last_error());
            return kWrong;
          }
          wia_destroy_communicator(comm);
          return kOk;
        },
        {{"TEST_WIA_ID", unique_id_env()}}, nullptr, 90);
    CHECK(st[0] == -SIGKILL);
    for (int r = 1; r < 4; ++r) {
      INFO("rank " << r);
      CHECK(st[r] == kOk);
    }
  }
}

// A shrink whose coordinator dies so: its decision names rank 0 alive, so
// the set-up of that communicator fails on every survivor; they agree
// again (counting rank 0) and build one of 3, whose collectives work.
TEST_CASE("shrink: a coordinator that dies after telling some participants costs one retry") {
  const auto st = run_ranks(
      4, ft_yaml(),
      [](int rank, int nranks) {
        wia_communicator_t comm = join(rank, nranks);
        if (!comm) return kApiError;
        if (rank == 0) setenv("WIA_TEST_AGREE_EXIT_AFTER_SENDING_TO", "3", 1);
        wia_communicator_t next = nullptr;
        if (wia_comm_shrink(comm, &next) != WIA_SUCCESS || !next) {
          std::fprintf(stderr, "rank %d: shrink: %s\n", rank, wia_get_last_error());
          return kApiError;
        }
        if (wia_comm_size(next) != 3 || wia_comm_rank(next) != rank - 1) {
          std::fprintf(stderr, "rank %d: new size %d, new rank %d\n", rank, wia_comm_size(next),
                       wia_comm_rank(next));
          return kWrong;
        }
        wia_destroy_communicator(comm);
        const std::vector<int> origins = member_origins(next, rank);
        if (origins.empty()) return kApiError;
        const int rc = check_new_comm(next, origins);
        wia_destroy_communicator(next);
        return rc;
      },
      {{"TEST_WIA_ID", unique_id_env()}}, nullptr, 90);
  CHECK(st[0] == -SIGKILL);
  for (int r = 1; r < 4; ++r) {
    INFO("rank " << r);
    CHECK(st[r] == kOk);
  }
}

TEST_CASE(
    "shrink: when the coordinator (rank 0) dies during the agreement, the next lowest survivor "
    "takes over") {
  // Rank 1 dies; ranks 2 and 3 start a shrink, whose coordinator is rank 0,
  // which has not called it yet and is then killed too: they must turn to
  // rank 2 and end with a communicator of two.
  prefix = "/tmp/wia-failover-test-" + std::to_string(getpid()) + "-";
  const auto st = run_ranks(
      4, ft_yaml(),
      [](int rank, int nranks) {
        wia_communicator_t comm = join(rank, nranks);
        if (!comm) return kApiError;
        if (member_origins(comm, rank).empty()) return kApiError;
        write_stamp("up" + std::to_string(rank), "1");
        if (rank == 1) {
          std::this_thread::sleep_for(std::chrono::seconds(30));  // killed meanwhile
          return kNoError;
        }
        const auto until = Clock::now() + std::chrono::seconds(20);
        while (!wia_detect_device_failure(comm)) {
          if (Clock::now() > until) {
            std::fprintf(stderr, "rank %d: rank 1's death not detected within 20 s\n", rank);
            return kNoError;
          }
          std::this_thread::sleep_for(std::chrono::milliseconds(10));
        }
        if (rank == 0) {
          std::this_thread::sleep_for(std::chrono::seconds(30));  // killed meanwhile
          return kNoError;
        }
        write_stamp("in" + std::to_string(rank), "1");
        wia_communicator_t next = nullptr;
        if (wia_comm_shrink(comm, &next) != WIA_SUCCESS) {
          std::fprintf(stderr, "rank %d: shrink: %s\n", rank, wia_get_last_error());
          return kApiError;
        }
        write_stamp("t" + std::to_string(rank), std::to_string(now_ns()));
        int failed[4] = {-1, -1, -1, -1}, nfailed = -1;
        wia_comm_get_failed(comm, failed, 4, &nfailed);
        if (nfailed != 2 || failed[0] != 0 || failed[1] != 1 || wia_comm_size(next) != 2 ||
            wia_comm_rank(next) != rank - 2) {
          std::fprintf(stderr, "rank %d: %d failed (%d, %d), new size %d, new rank %d\n", rank,
                       nfailed, failed[0], failed[1], wia_comm_size(next), wia_comm_rank(next));
          return kWrong;
        }
        wia_destroy_communicator(comm);
        const std::vector<int> origins = member_origins(next, rank);
        if (origins.empty()) return kApiError;
        const int rc = check_new_comm(next, origins);
        wia_destroy_communicator(next);
        return rc;
      },
      {{"TEST_WIA_ID", unique_id_env()}},
      [](std::vector<pid_t>& pids) {
        const auto until = Clock::now() + std::chrono::seconds(60);
        for (int r = 0; r < 4 && Clock::now() < until; ++r)
          while (!has_stamp("up" + std::to_string(r)) && Clock::now() < until)
            std::this_thread::sleep_for(std::chrono::milliseconds(5));
        kill(pids[1], SIGKILL);
        for (int r = 2; r < 4 && Clock::now() < until; ++r)
          while (!has_stamp("in" + std::to_string(r)) && Clock::now() < until)
            std::this_thread::sleep_for(std::chrono::milliseconds(5));
        std::this_thread::sleep_for(std::chrono::milliseconds(500));  // inside the shrink
        kill(pids[0], SIGKILL);
        write_stamp("k0", std::to_string(now_ns()));
      },
      90);
  const std::int64_t killed_at = std::stoll("0" + read_stamp("k0"));
  for (int r = 2; r < 4; ++r) {
    INFO("rank " << r);
    CHECK(st[r] == kOk);
    const std::int64_t done_at = std::stoll("0" + read_stamp("t" + std::to_string(r)));
    if (st[r] != kOk || done_at == 0) continue;
    const double secs = double(done_at - killed_at) / 1e9;
    MESSAGE("rank " << r << " shrunk " << secs << " s after the coordinator's death");
    CHECK(secs < 5.0);
  }
  remove_stamps();
  CHECK(st[0] == -SIGKILL);
  CHECK(st[1] == -SIGKILL);
}

TEST_CASE(
    "revoke: a rank's revoke fails the others' waiting collective and an idle rank's next one "
    "with WIA_ERROR_ABORTED; a shrink without failures keeps every rank") {
  const auto st = run_ranks(
      4, ft_yaml(),
      [](int rank, int nranks) {
        wia_communicator_t comm = join(rank, nranks);
        if (!comm) return kApiError;
        std::vector<int> origins = member_origins(comm, rank);
        if (origins.empty()) return kApiError;
        if (rank == 3) {
          // Idle: only the cheap check; the heartbeat thread reads the
          // revoke and breaks the communicator here too.
          const auto until = Clock::now() + std::chrono::seconds(10);
          while (!wia_detect_device_failure(comm) && Clock::now() < until)
            std::this_thread::sleep_for(std::chrono::milliseconds(10));
          float b = 1;
          wia_collective_config_t cfg{};
          cfg.datatype = WIA_FLOAT32;
          const wia_status_t s = wia_all_reduce(comm, &b, &b, 1, &cfg, nullptr);
          if (wia_comm_get_async_error(comm) != WIA_ERROR_ABORTED || s != WIA_ERROR_ABORTED) {
            std::fprintf(stderr, "rank 3: async error %d, a collective after the revoke %d\n",
                         wia_comm_get_async_error(comm), s);
            return kWrong;
          }
        } else if (rank == 2) {
          // Ranks 0 and 1 wait in an all-reduce that ranks 2 and 3 never post.
          std::this_thread::sleep_for(std::chrono::milliseconds(500));
          if (wia_comm_revoke(comm) != WIA_SUCCESS) return kApiError;
          float b = 1;
          wia_collective_config_t cfg{};
          cfg.datatype = WIA_FLOAT32;
          const wia_status_t s = wia_all_reduce(comm, &b, &b, 1, &cfg, nullptr);
          if (s != WIA_ERROR_ABORTED || !wia_detect_device_failure(comm)) {
            std::fprintf(stderr, "rank 2: a collective after revoke returned %d\n", s);
            return kWrong;
          }
        } else {
          const auto start = Clock::now();
          float b = 1;
          wia_collective_config_t cfg{};
          cfg.datatype = WIA_FLOAT32;
          wia_all_reduce(comm, &b, &b, 1, &cfg, nullptr);
          const wia_status_t s = wia_stream_synchronize(nullptr);
          const std::string msg = wia_get_last_error();
          const double secs = std::chrono::duration<double>(Clock::now() - start).count();
          std::fprintf(stderr, "rank %d: after %.2f s: %d %s\n", rank, secs, s, msg.c_str());
          if (s != WIA_ERROR_ABORTED ||
              msg.find("wia_comm_revoke was called on rank 2") == std::string::npos || secs > 5)
            return kWrong;
          int n = -1;
          if (wia_comm_get_failed(comm, nullptr, 0, &n) != WIA_SUCCESS || n != 0) return kWrong;
        }
        wia_communicator_t next = nullptr;
        if (wia_create_communicator_fault_tolerant(&next, comm) != WIA_SUCCESS) {
          std::fprintf(stderr, "rank %d: shrink: %s\n", rank, wia_get_last_error());
          return kApiError;
        }
        wia_destroy_communicator(comm);
        if (wia_comm_size(next) != nranks || wia_comm_rank(next) != rank) return kWrong;
        origins = member_origins(next, rank);
        if (origins.empty()) return kApiError;
        const int rc = check_new_comm(next, origins);
        wia_destroy_communicator(next);
        return rc;
      },
      {{"TEST_WIA_ID", unique_id_env()}}, {}, 90);
  check_all(st, kOk);
}

// A second survivor dies while the survivors of the first build their
// new communicator: wia_comm_shrink agrees again by itself and still
// returns a working communicator (of 3), or one of 4 when the death came
// after it was built, which the next collective reports as usual. The
// kill lands at a spread of delays after the victim enters the shrink;
// the survivors' logs show how many times the library agreed again.
TEST_CASE("shrink: a survivor SIGKILLed during the shrink costs the others no retry") {
  constexpr int kRanks = 5, kFirst = 4, kSecond = 2;
  int retries = 0;
  for (const int delay_ms : {0, 2, 5, 10, 20, 40}) {
    const char* transport = delay_ms % 4 == 0 ? "shm" : "tcp";
    INFO(transport << ", second kill " << delay_ms << " ms into the shrink");
    prefix = "/tmp/wia-shrink2-test-" + std::to_string(getpid()) + "-";
    const auto st = run_ranks(
        kRanks, ft_yaml(),
        [](int rank, int nranks) {
          // The log goes to a file the test reads (the retry's warning).
          const std::string log = stamp("log" + std::to_string(rank));
          if (FILE* f = std::fopen(log.c_str(), "w")) {
            dup2(fileno(f), 2);
            std::fclose(f);
          }
          wia_communicator_t comm = join(rank, nranks);
          if (!comm) return kApiError;
          std::vector<int> origins = member_origins(comm, rank);
          if (origins.empty()) return kApiError;
          write_stamp("up" + std::to_string(rank), "1");
          int shrinks = 0;
          while (wia_comm_size(comm) > 3) {
            // The second victim may die just after a shrink that still
            // counted it: then already the origins' all-gather fails.
            const int rc = shrinks == 0 || !origins.empty()
                               ? until_failure(comm, origins, rank, std::chrono::seconds(30))
                               : -1;
            if (rc != -1) return rc;
            wia_stream_synchronize(nullptr);
            write_stamp("shrinking" + std::to_string(rank), "1");
            wia_comm_revoke(comm);
            wia_communicator_t next = nullptr;
            if (wia_comm_shrink(comm, &next) != WIA_SUCCESS) {
              std::fprintf(stderr, "rank %d: shrink %d: %s\n", rank, shrinks,
                           wia_get_last_error());
              return kApiError;
            }
            ++shrinks;
            wia_destroy_communicator(comm);
            comm = next;
            if (shrinks > 2) return kWrong;
            origins = member_origins(comm, rank);
          }
          if (origins.empty()) origins = member_origins(comm, rank);
          if (origins != std::vector<int>{0, 1, 3}) return kWrong;
          if (const int rc = check_new_comm(comm, origins); rc != kOk) return rc;
          wia_destroy_communicator(comm);
          return kOk;
        },
        {{"TEST_WIA_ID", unique_id_env()}, {"WIA_TRANSPORT", transport}},
        [delay_ms](std::vector<pid_t>& pids) {
          const auto until = Clock::now() + std::chrono::seconds(60);
          for (int r = 0; r < kRanks && Clock::now() < until; ++r)
            while (!has_stamp("up" + std::to_string(r)) && Clock::now() < until)
              std::this_thread::sleep_for(std::chrono::milliseconds(5));
          std::this_thread::sleep_for(std::chrono::milliseconds(300));
          kill(pids[kFirst], SIGKILL);
          while (!has_stamp("shrinking" + std::to_string(kSecond)) && Clock::now() < until)
            std::this_thread::sleep_for(std::chrono::microseconds(200));
          std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
          kill(pids[kSecond], SIGKILL);
        },
        120);
    CHECK(st[kFirst] == -SIGKILL);
    CHECK(st[kSecond] == -SIGKILL);
    int again = 0;
    for (int r : {0, 1, 3}) {
      INFO("rank " << r);
      CHECK(st[r] == kOk);
      std::ifstream log(stamp("log" + std::to_string(r)));
      const std::string text((std::istreambuf_iterator<char>(log)), {});
      for (std::size_t at = 0; (at = text.find("agreeing on the survivors again", at)) !=
                               std::string::npos;
           ++at)
        ++again;
      if (st[r] != kOk) MESSAGE("rank " << r << "'s log:\n" << text);
    }
    MESSAGE(std::string(transport) << ", " << delay_ms << " ms: " << again
                                   << " agreement(s) again");
    retries += again;
    remove_stamps();
  }
  MESSAGE(retries << " agreement(s) again over all delays");
}

TEST_CASE(
    "torture: 6 ranks, one SIGKILLed at a random point of a random collective per step, "
    "shrunk down to 1, every step checked and bounded, nothing leaked") {
  for (const char* transport : {"shm", "tcp"}) {
    INFO(std::string(transport));
    const auto shm_before = shm_entries();
    prefix = "/tmp/wia-torture-test-" + std::to_string(getpid()) + "-";
    // WIA_TEST_SEED replays a run.
    const char* replay = std::getenv("WIA_TEST_SEED");
    const unsigned seed =
        replay ? static_cast<unsigned>(std::stoul(replay)) : static_cast<unsigned>(now_ns());
    MESSAGE(std::string(transport) << ": seed " << seed);
    constexpr int kRanks = 6;
    const auto st = run_ranks(
        kRanks, ft_yaml(),
        [](int rank, int nranks) {
          // Counted once the unique id exists: rank 0 hosts the bootstrap
          // root, whose descriptors are the process's until it exits.
          wia_unique_id_t id;
          if (!exchange_id(rank, std::getenv("TEST_WIA_ID"), &id)) return kApiError;
          const int fds_before = open_fds();
          const std::string fds_before_list = fd_list();
          wia_communicator_t comm = nullptr;
          if (wia_create_communicator_from_id(&id, nranks, rank, &comm) != WIA_SUCCESS) {
            std::fprintf(stderr, "rank %d: create: %s\n", rank, wia_get_last_error());
            return kApiError;
          }
          int fds_with_one = -1;  // descriptors held with one communicator, at each step
          for (int step = 0;; ++step) {
            if (wia_comm_size(comm) != nranks - step) {
              std::fprintf(stderr, "rank %d: step %d has %d ranks\n", rank, step,
                           wia_comm_size(comm));
              return kWrong;
            }
            const std::vector<int> origins = member_origins(comm, rank);
            if (origins.empty()) return kApiError;
            const int fds = open_fds();
            if (fds_with_one >= 0 && fds > fds_with_one) {
              std::fprintf(stderr, "rank %d: step %d holds %d descriptors, step %d held %d\n", rank,
                           step, fds, step - 1, fds_with_one);
              return kWrong;
            }
            fds_with_one = fds;
            write_stamp("s" + std::to_string(step) + "-" + std::to_string(rank), "1");
            if (origins.size() == 1) {
              if (const int rc = check_new_comm(comm, origins); rc != kOk) return rc;
              wia_destroy_communicator(comm);
              const int fds_after = open_fds();
              // The bootstrap's client and hosted root hold none once the
              // communicator is made; nothing of the 5 communicators may stay.
              if (fds_after > fds_before) {
                std::fprintf(stderr,
                             "rank %d: %d descriptors open at the end (%s), %d at the start\n",
                             rank, fds_after, fd_list().c_str(), fds_before);
                std::fprintf(stderr, "rank %d: at the start: %s\n", rank, fds_before_list.c_str());
                return kWrong;
              }
              return kOk;
            }
            if (const int rc = until_failure(comm, origins, rank, std::chrono::seconds(40));
                rc != -1)
              return rc;
            const auto failed_at = Clock::now();
            wia_comm_revoke(comm);
            wia_communicator_t next = nullptr;
            if (wia_comm_shrink(comm, &next) != WIA_SUCCESS) {
              std::fprintf(stderr, "rank %d: step %d: shrink: %s\n", rank, step,
                           wia_get_last_error());
              return kApiError;
            }
            const double secs = std::chrono::duration<double>(Clock::now() - failed_at).count();
            std::fprintf(stderr, "rank %d: step %d: shrunk to %d in %.2f s\n", rank, step,
                         wia_comm_size(next), secs);
            if (secs > 10) return kWrong;  // the per-step bound
            wia_destroy_communicator(comm);
            comm = next;
          }
        },
        {{"TEST_WIA_ID", unique_id_env()}, {"WIA_TRANSPORT", transport}},
        [seed](std::vector<pid_t>& pids) {
          std::mt19937 rng(seed);
          std::vector<int> alive;
          for (int r = 0; r < kRanks; ++r) alive.push_back(r);
          for (int step = 0; alive.size() > 1; ++step) {
            // Every survivor runs this step's collectives; then a random
            // one dies at a random moment.
            const auto until = Clock::now() + std::chrono::seconds(60);
            for (int r : alive)
              while (!has_stamp("s" + std::to_string(step) + "-" + std::to_string(r)) &&
                     Clock::now() < until)
                std::this_thread::sleep_for(std::chrono::milliseconds(5));
            if (Clock::now() >= until) return;  // the ranks' statuses say what went wrong
            std::this_thread::sleep_for(std::chrono::milliseconds(rng() % 600));
            const std::size_t v = rng() % alive.size();
            kill(pids[alive[v]], SIGKILL);
            alive.erase(alive.begin() + static_cast<std::ptrdiff_t>(v));
          }
        },
        240);
    remove_stamps();
    int killed = 0, finished = 0;
    for (int r = 0; r < kRanks; ++r) {
      INFO("rank " << r << " status " << st[r]);
      CHECK((st[r] == -SIGKILL || st[r] == kOk));
      killed += st[r] == -SIGKILL;
      finished += st[r] == kOk;
    }
    CHECK(killed == kRanks - 1);
    CHECK(finished == 1);
    const auto shm_after = shm_entries();
    for (const std::string& e : shm_after)
      if (std::find(shm_before.begin(), shm_before.end(), e) == shm_before.end())
        MESSAGE("left in /dev/shm: " << e);
    CHECK(shm_after == shm_before);
  }
}

TEST_CASE("revoke, agree and shrink on a device-based communicator act for the whole process") {
  // No device failed: agree returns the flag and no failed rank, shrink a
  // communicator of every device, and revoke fails the old one's later
  // collectives with WIA_ERROR_ABORTED. (A lost GPU: provider_cuda_fake's
  // device_lost_shrink.)
  const auto st = run_ranks(1, "host:\n  devices: 2\n", [](int, int) {
    const wia_device_t devices[2] = {0, 1};
    wia_communicator_t comm = nullptr;
    if (wia_create_communicator(devices, 2, &comm) != WIA_SUCCESS) return kApiError;
    int flag = 5, failed[2] = {-1, -1}, nfailed = -1;
    wia_communicator_t next = nullptr;
    const bool agreed =
        wia_comm_agree_failed(comm, &flag, failed, 2, &nfailed) == WIA_SUCCESS && flag == 5 &&
        nfailed == 0;
    const bool shrunk = wia_comm_shrink(comm, &next) == WIA_SUCCESS && next &&
                        wia_comm_size(next) == 2 && !wia_detect_device_failure(next);
    float x[2][4] = {{1, 2, 3, 4}, {10, 20, 30, 40}};
    wia_collective_config_t cfg{};
    cfg.datatype = WIA_FLOAT32;
    cfg.reduction_op = WIA_REDUCE_SUM;
    wia_stream_t s[2] = {};
    bool summed = true;
    for (int r = 0; r < 2; ++r) summed = summed && wia_create_stream_on(r, &s[r]) == WIA_SUCCESS;
    float* buf[2] = {};
    for (int r = 0; r < 2 && summed; ++r)
      summed = wia_malloc_on(r, reinterpret_cast<void**>(&buf[r]), sizeof x[r]) == WIA_SUCCESS &&
               wia_memcpy(buf[r], x[r], sizeof x[r]) == WIA_SUCCESS;
    wia_group_start();
    for (int r = 0; r < 2 && summed; ++r)
      summed = wia_all_reduce(next, buf[r], buf[r], 4, &cfg, s[r]) == WIA_SUCCESS;
    wia_group_end();
    for (int r = 0; r < 2 && summed; ++r) {
      float out[4] = {};
      summed = wia_stream_synchronize(s[r]) == WIA_SUCCESS &&
               wia_memcpy(out, buf[r], sizeof out) == WIA_SUCCESS && out[0] == 11 &&
               out[3] == 44;
    }
    const bool revoked = wia_comm_revoke(comm) == WIA_SUCCESS &&
                         wia_all_reduce(comm, buf[0], buf[0], 4, &cfg, s[0]) != WIA_SUCCESS &&
                         std::string(wia_get_last_error()).find("wia_comm_revoke") !=
                             std::string::npos;
    wia_stream_synchronize(s[0]);
    const bool bad_args = wia_comm_agree(comm, nullptr) == WIA_ERROR_INVALID_ARGUMENT &&
                          wia_comm_shrink(comm, nullptr) == WIA_ERROR_INVALID_ARGUMENT &&
                          wia_comm_revoke(nullptr) == WIA_ERROR_INVALID_ARGUMENT;
    wia_destroy_communicator(comm);
    wia_destroy_communicator(next);
    std::fprintf(stderr, "agreed %d shrunk %d summed %d revoked %d bad_args %d\n", agreed, shrunk,
                 summed, revoked, bad_args);
    return agreed && shrunk && summed && revoked && bad_args ? kOk : kWrong;
  });
  check_all(st, kOk);
}
