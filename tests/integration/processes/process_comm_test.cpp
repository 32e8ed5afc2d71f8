// SPDX-License-Identifier: Apache-2.0
// Process communicators end to end: real processes (fork), the real
// bootstrap (a unique id, or torchrun-style variables), the real shm and
// tcp transport providers, the public C API. Each rank checks every result
// against a reference it computes itself from the inputs every rank derives
// from (rank, index), with integer-valued inputs so that float sums are
// exact, and exits with a status the parent asserts.
#include <doctest/doctest.h>
#include <wia/wia.h>

#include <dirent.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <mutex>
#include <new>
#include <utility>
#include <string>
#include <thread>
#include <vector>

#include "engine/window_allreduce.hpp"
#include "process_harness.hpp"

namespace {
using namespace wia::test::processes;

double input(int rank, std::uint64_t i) { return static_cast<double>((i * 7 + rank * 13) % 23) - 11; }

// Every collective over the communicator, with a few sizes, checked.
int all_collectives(int rank, int nranks) {
  wia_communicator_t comm = join(rank, nranks);
  if (!comm) return kApiError;
  if (wia_comm_size(comm) != nranks || wia_comm_rank(comm) != rank) {
    std::fprintf(stderr, "rank %d: size %d rank %d\n", rank, wia_comm_size(comm),
                 wia_comm_rank(comm));
    return kWrong;
  }
  int wrong = 0;
  const std::uint64_t counts[] = {0, 1, 7, 4099, 262147};
  for (std::uint64_t n : counts) {
    const std::uint64_t all = n * static_cast<std::uint64_t>(nranks);
    std::vector<float> in(all + 1), out(all + 1);
    wia_collective_config_t cfg{};
    cfg.datatype = WIA_FLOAT32;
    cfg.reduction_op = WIA_REDUCE_SUM;
    // all-reduce, every algorithm
    const wia_algorithm_id_t algos[] = {WIA_ALGORITHM_AUTO, WIA_ALGORITHM_RING,
                                        WIA_ALGORITHM_TREE, WIA_ALGORITHM_RABENSEIFNER,
                                        WIA_ALGORITHM_RECURSIVE_DOUBLING, WIA_ALGORITHM_BINOMIAL};
    for (auto algo : algos) {
      for (bool in_place : {false, true}) {
        for (std::uint64_t i = 0; i < n; ++i) in[i] = static_cast<float>(input(rank, i));
        std::fill(out.begin(), out.end(), -1e9f);
        if (in_place) std::copy(in.begin(), in.begin() + n, out.begin());
        cfg.algorithm = algo;
        if (wia_all_reduce(comm, in_place ? out.data() : in.data(), out.data(), n, &cfg, nullptr) !=
                WIA_SUCCESS ||
            wia_stream_synchronize(nullptr) != WIA_SUCCESS) {
          std::fprintf(stderr, "rank %d: all_reduce: %s\n", rank, wia_get_last_error());
          return kApiError;
        }
        for (std::uint64_t i = 0; i < n; ++i) {
          double ref = 0;
          for (int q = 0; q < nranks; ++q) ref += input(q, i);
          if (out[i] != static_cast<float>(ref)) {
            if (wrong++ < 3)
              std::fprintf(stderr, "rank %d: all_reduce algo %d n %llu [%llu] = %g, want %g\n",
                           rank, algo, static_cast<unsigned long long>(n),
                           static_cast<unsigned long long>(i), out[i], ref);
          }
        }
      }
    }
    cfg.algorithm = WIA_ALGORITHM_AUTO;
    // broadcast from the last rank
    const int root = nranks - 1;
    for (std::uint64_t i = 0; i < n; ++i) out[i] = rank == root ? static_cast<float>(input(root, i)) : -1;
    cfg.operation = WIA_COLLECTIVE_BROADCAST;
    if (wia_broadcast(comm, out.data(), n, root, WIA_FLOAT32, nullptr) != WIA_SUCCESS ||
        wia_stream_synchronize(nullptr) != WIA_SUCCESS) {
      std::fprintf(stderr, "rank %d: broadcast: %s\n", rank, wia_get_last_error());
      return kApiError;
    }
    for (std::uint64_t i = 0; i < n; ++i) wrong += out[i] != static_cast<float>(input(root, i));
    // all-gather
    for (std::uint64_t i = 0; i < n; ++i) in[i] = static_cast<float>(input(rank, i));
    cfg.operation = WIA_COLLECTIVE_ALLGATHER;
    if (wia_all_gather_ex(comm, in.data(), out.data(), n, &cfg, nullptr) != WIA_SUCCESS ||
        wia_stream_synchronize(nullptr) != WIA_SUCCESS) {
      std::fprintf(stderr, "rank %d: all_gather: %s\n", rank, wia_get_last_error());
      return kApiError;
    }
    for (int q = 0; q < nranks; ++q)
      for (std::uint64_t i = 0; i < n; ++i) wrong += out[q * n + i] != static_cast<float>(input(q, i));
    // reduce-scatter (MAX)
    for (std::uint64_t i = 0; i < all; ++i) in[i] = static_cast<float>(input(rank, i));
    cfg.operation = WIA_COLLECTIVE_REDUCE_SCATTER;
    cfg.reduction_op = WIA_REDUCE_MAX;
    if (wia_reduce_scatter(comm, in.data(), out.data(), n, &cfg, nullptr) != WIA_SUCCESS ||
        wia_stream_synchronize(nullptr) != WIA_SUCCESS) {
      std::fprintf(stderr, "rank %d: reduce_scatter: %s\n", rank, wia_get_last_error());
      return kApiError;
    }
    for (std::uint64_t i = 0; i < n; ++i) {
      double ref = -1e300;
      for (int q = 0; q < nranks; ++q) ref = std::max(ref, input(q, rank * n + i));
      wrong += out[i] != static_cast<float>(ref);
    }
    // all-to-all (contiguous)
    for (std::uint64_t i = 0; i < all; ++i) in[i] = static_cast<float>(input(rank, i));
    cfg.operation = WIA_COLLECTIVE_ALLTOALL;
    if (wia_all_to_all_contiguous(comm, in.data(), out.data(), n, &cfg, nullptr) != WIA_SUCCESS ||
        wia_stream_synchronize(nullptr) != WIA_SUCCESS) {
      std::fprintf(stderr, "rank %d: all_to_all: %s\n", rank, wia_get_last_error());
      return kApiError;
    }
    // shard q of my output is shard `rank` of q's input.
    for (int q = 0; q < nranks; ++q)
      for (std::uint64_t i = 0; i < n; ++i)
        wrong += out[q * n + i] != static_cast<float>(input(q, rank * n + i));
    // reduce (int32 sum) to rank 0
    std::vector<std::int32_t> iin(n + 1), iout(n + 1, -7);
    for (std::uint64_t i = 0; i < n; ++i) iin[i] = static_cast<std::int32_t>(input(rank, i));
    cfg.operation = WIA_COLLECTIVE_REDUCE;
    cfg.datatype = WIA_INT32;
    cfg.reduction_op = WIA_REDUCE_SUM;
    if (wia_reduce(comm, iin.data(), iout.data(), n, 0, &cfg, nullptr) != WIA_SUCCESS ||
        wia_stream_synchronize(nullptr) != WIA_SUCCESS) {
      std::fprintf(stderr, "rank %d: reduce: %s\n", rank, wia_get_last_error());
      return kApiError;
    }
    if (rank == 0)
      for (std::uint64_t i = 0; i < n; ++i) {
        double ref = 0;
        for (int q = 0; q < nranks; ++q) ref += input(q, i);
        wrong += iout[i] != static_cast<std::int32_t>(ref);
      }
  }
  if (wia_destroy_communicator(comm) != WIA_SUCCESS) return kApiError;
  if (wrong) std::fprintf(stderr, "rank %d: %d wrong\n", rank, wrong);
  return wrong ? kWrong : kOk;
}

// An in-place all-reduce and a synchronize: their status and the last
// error message.
struct Outcome {
  wia_status_t status;
  std::string message;
};
Outcome all_reduce_in_place(wia_communicator_t comm, void* buf, std::size_t count,
                            const wia_collective_config_t& cfg) {
  wia_all_reduce(comm, buf, buf, count, &cfg, nullptr);
  const wia_status_t s = wia_stream_synchronize(nullptr);
  return {s, wia_get_last_error()};
}

// For a rank whose call had to fail: kNoError if it succeeded, kSawError
// if the error names one of `needles`, kWrong otherwise (what it saw is
// printed either way).
int error_naming(int rank, wia_status_t status, const std::string& msg,
                 std::initializer_list<const char*> needles) {
  std::fprintf(stderr, "rank %d saw: %s\n", rank, msg.c_str());
  if (status == WIA_SUCCESS) return kNoError;
  for (const char* n : needles)
    if (msg.find(n) != std::string::npos) return kSawError;
  return kWrong;
}

std::vector<std::string> shm_entries() {
  std::vector<std::string> names;
  if (DIR* d = opendir("/dev/shm")) {
    while (dirent* e = readdir(d))
      if (std::strncmp(e->d_name, "wia", 3) == 0) names.push_back(e->d_name);
    closedir(d);
  }
  return names;
}

}  // namespace

TEST_CASE("every collective across 2, 3 and 4 processes over shm and over tcp") {
  for (const char* transport : {"shm", "tcp"})
    for (int n : {2, 3, 4}) {
      INFO(transport << " with " << n << " processes");
      const auto st = run_ranks(n, base_yaml(), all_collectives,
                                {{"WIA_TRANSPORT", transport}, {"TEST_WIA_ID", unique_id_env()}});
      check_all(st);
    }
}

// The ofi provider over libfabric's tcp;ofi_rxm, forced as the transport of
// every link (config/examples/ofi.yaml does the same from YAML). Run by the
// ctest entry process_comm_ofi (tests/providers/ofi/tests.cmake), which
// sets WIA_TEST_OFI=1 when the provider is built.
TEST_CASE("every collective across 2, 3 and 4 processes over ofi (tcp;ofi_rxm)") {
  if (std::getenv("WIA_TEST_OFI") == nullptr) {
    MESSAGE("skipped: WIA_TEST_OFI is not set (ctest runs it as process_comm_ofi)");
    return;
  }
  const std::string yaml = base_yaml() +
                           "selector:\n  transport: ofi\nofi:\n  provider: \"tcp;ofi_rxm\"\n"
                           "  inter_node: all\n";
  for (int n : {2, 3, 4}) {
    INFO("ofi with " << n << " processes");
    const auto st = run_ranks(n, yaml, all_collectives, {{"TEST_WIA_ID", unique_id_env()}});
    check_all(st);
  }
}

TEST_CASE("torchrun-style variables: MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE") {
  // Find a free port for the root (MASTER_PORT + 1 is the bootstrap's).
  const int port = 20000 + static_cast<int>(getpid() % 20000);
  const auto st = run_ranks(
      3, base_yaml(),
      [](int rank, int nranks) {
        setenv("RANK", std::to_string(rank).c_str(), 1);
        setenv("LOCAL_RANK", std::to_string(rank).c_str(), 1);
        wia_communicator_t comm = join(rank, nranks);
        if (!comm) return kApiError;
        int ok = wia_comm_size(comm) == 3 && wia_comm_rank(comm) == rank &&
                 wia_comm_node_count(comm) == 1 && wia_comm_node_rank(comm) == 0 &&
                 wia_comm_local_rank(comm) == rank;
        std::int64_t v = rank + 1, sum = 0;
        wia_collective_config_t cfg{};
        cfg.datatype = WIA_INT64;
        ok &= wia_all_reduce(comm, &v, &sum, 1, &cfg, nullptr) == WIA_SUCCESS &&
              wia_stream_synchronize(nullptr) == WIA_SUCCESS && sum == 6;
        wia_destroy_communicator(comm);
        return ok ? kOk : kWrong;
      },
      {{"MASTER_ADDR", "127.0.0.1"},
       {"MASTER_PORT", std::to_string(port)},
       {"WORLD_SIZE", "3"}});
  check_all(st);
}

TEST_CASE("mismatched calls across processes fail on every rank, naming the difference") {
  // Over tcp messages, and through the node-shared windows over shm.
  struct Variant {
    const char* transport;
    std::uint64_t count;  // rank 1 calls with one more
    // Messages: a rank whose data step saw the wrong size first may say
    // so instead (which one wins is a race). Windows: every rank compares
    // every peer's descriptor, so each names the count.
    bool size_may_come_first;
  };
  // shm with 4 elements: the vectors ride in the windows' header lines
  // (WindowAllReduce::run_in_header), which check descriptors too.
  for (const Variant v :
       {Variant{"tcp", 99, true}, Variant{"shm", 100000, false}, Variant{"shm", 4, false}}) {
    INFO(v.transport << " " << v.count);
    const auto st = run_ranks(
        3, base_yaml(),
        [v](int rank, int nranks) {
          wia_communicator_t comm = join(rank, nranks);
          if (!comm) return kApiError;
          std::vector<float> b(v.count + 1, 1.0f);
          wia_collective_config_t cfg{};
          cfg.datatype = WIA_FLOAT32;
          const auto [s, msg] =
              all_reduce_in_place(comm, b.data(), rank == 1 ? v.count + 1 : v.count, cfg);
          if (s == WIA_SUCCESS) return kNoError;
          std::fprintf(stderr, "rank %d saw: %s\n", rank, msg.c_str());
          const std::string c = std::to_string(v.count), c1 = std::to_string(v.count + 1);
          const bool named = msg.find("count " + c + " vs " + c1) != std::string::npos ||
                             msg.find("count " + c1 + " vs " + c) != std::string::npos ||
                             (v.size_may_come_first &&
                              msg.find("the ranks' calls differ") != std::string::npos);
          // Later calls fail at once: the communicator is unusable.
          const bool after =
              wia_all_reduce(comm, b.data(), b.data(), 1, &cfg, nullptr) != WIA_SUCCESS;
          wia_destroy_communicator(comm);
          return named && after ? kSawError : kWrong;
        },
        {{"TEST_WIA_ID", unique_id_env()}, {"WIA_TRANSPORT", v.transport}});
    check_all(st, kSawError);
  }
}

TEST_CASE("a rank that never calls becomes a timeout on every other rank, naming it") {
  const auto st = run_ranks(
      3, base_yaml(1500),
      [](int rank, int nranks) {
        wia_communicator_t comm = join(rank, nranks);
        if (!comm) return kApiError;
        if (rank == 2) {
          // Stays alive (its connections open) without calling.
          std::this_thread::sleep_for(std::chrono::seconds(4));
          wia_destroy_communicator(comm);
          return kSawError;
        }
        float v = 1;
        wia_collective_config_t cfg{};
        cfg.datatype = WIA_FLOAT32;
        const auto [s, msg] = all_reduce_in_place(comm, &v, 1, cfg);
        int failed[2] = {-1, -1};
        int n = -1;
        const bool listed = wia_comm_get_failed(comm, failed, 2, &n) == WIA_SUCCESS && n == 1 &&
                            failed[0] == 2 && wia_detect_device_failure(comm);
        wia_destroy_communicator(comm);
        if (!listed) std::fprintf(stderr, "rank %d: %d failed, first %d\n", rank, n, failed[0]);
        return listed ? error_naming(rank, s, msg, {"rank(s) 2", "rank 2"}) : kWrong;
      },
      {{"TEST_WIA_ID", unique_id_env()}, {"WIA_TRANSPORT", "shm"}});
  check_all(st, kSawError);
}

TEST_CASE("kill -9 of a rank in a large all-reduce: every survivor fails within the timeout") {
  for (const char* transport : {"shm", "tcp"}) {
    INFO(transport);
    const auto before = shm_entries();
    const auto start = std::chrono::steady_clock::now();
    const auto st = run_ranks(
        3, base_yaml(15000),
        [](int rank, int nranks) {
          wia_communicator_t comm = join(rank, nranks);
          if (!comm) return kApiError;
          std::vector<float> b(8u << 20, 1.0f);  // 32 MiB
          wia_collective_config_t cfg{};
          cfg.datatype = WIA_FLOAT32;
          if (wia_detect_device_failure(comm)) return kWrong;
          for (int it = 0; it < 1000; ++it) {
            if (wia_all_reduce(comm, b.data(), b.data(), b.size(), &cfg, nullptr) != WIA_SUCCESS ||
                wia_stream_synchronize(nullptr) != WIA_SUCCESS) {
              std::fprintf(stderr, "rank %d saw: %s\n", rank, wia_get_last_error());
              // Spec 6.9's check and the failed set: exactly the killed rank.
              int failed[4] = {-1, -1, -1, -1};
              int n = -1;
              const bool detected = wia_detect_device_failure(comm);
              const wia_status_t gs = wia_comm_get_failed(comm, failed, 4, &n);
              wia_destroy_communicator(comm);
              if (!detected || gs != WIA_SUCCESS || n != 1 || failed[0] != 1) {
                std::fprintf(stderr, "rank %d: detected %d, %d failed, first %d\n", rank,
                             detected, n, failed[0]);
                return kWrong;
              }
              return kSawError;
            }
          }
          return kNoError;
        },
        {{"TEST_WIA_ID", unique_id_env()}, {"WIA_TRANSPORT", transport}},
        [](std::vector<pid_t>& pids) {
          std::this_thread::sleep_for(std::chrono::milliseconds(1500));
          kill(pids[1], SIGKILL);
        },
        60);
    const double secs =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    CHECK(st[1] == -SIGKILL);
    CHECK(st[0] == kSawError);
    CHECK(st[2] == kSawError);
    CHECK(secs < 30);
    CHECK(shm_entries() == before);
  }
}

TEST_CASE("wia_comm_split and the two-level hierarchy over faked hosts") {
  // Four processes on "two hosts" (WIA_HOSTID), two per host.
  const std::string id = unique_id_env();
  const auto st = run_ranks(
      4, base_yaml(),
      [](int rank, int nranks) {
        setenv("WIA_HOSTID", rank < 2 ? "hostA" : "hostB", 1);
        wia_communicator_t comm = join(rank, nranks);
        if (!comm) return kApiError;
        int ok = wia_comm_node_count(comm) == 2 && wia_comm_node_rank(comm) == rank / 2 &&
                 wia_comm_local_rank(comm) == rank % 2;
        // The communicator's topology: ranks as devices on two nodes, shm
        // inside a node, tcp between (the figures measured at setup).
        wia_topology_t topo;
        ok &= wia_comm_discover_topology(comm, &topo) == WIA_SUCCESS;
        if (ok) {
          ok &= topo.num_devices == 4;
          ok &= std::string(topo.link_type[0][1]) == "shared_memory" &&
                std::string(topo.link_type[0][2]) == "tcp" &&
                std::string(topo.link_type[3][1]) == "tcp";
          ok &= topo.bandwidth_gbps[0][2] > 0 && topo.latency_us[0][2] > 0 &&
                topo.hop_count[0][2] == 2 && topo.hop_count[2][3] == 1;
          wia_topology_analysis_t analysis;
          ok &= wia_analyze_topology(&topo, &analysis) == WIA_SUCCESS &&
                std::string(analysis.topology_type) == "multi_node";
          if (!ok) std::fprintf(stderr, "rank %d: topology %d devices, [0][1]=%s [0][2]=%s\n", rank,
                                topo.num_devices, topo.link_type[0][1], topo.link_type[0][2]);
          wia_free_topology(&topo);
        }
        // Split by parity, reversed order by key.
        wia_communicator_t half = nullptr;
        ok &= wia_comm_split(comm, rank % 2, -rank, &half) == WIA_SUCCESS && half != nullptr;
        ok &= wia_comm_size(half) == 2 && wia_comm_rank(half) == (rank < 2 ? 1 : 0);
        std::int32_t v = rank, sum = 0;
        wia_collective_config_t cfg{};
        cfg.datatype = WIA_INT32;
        ok &= wia_all_reduce(half, &v, &sum, 1, &cfg, nullptr) == WIA_SUCCESS &&
              wia_stream_synchronize(nullptr) == WIA_SUCCESS;
        ok &= sum == (rank % 2 == 0 ? 0 + 2 : 1 + 3);
        wia_communicator_t none = reinterpret_cast<wia_communicator_t>(1);
        ok &= wia_comm_split(comm, rank == 0 ? 5 : WIA_COMM_SPLIT_NOCOLOR, 0, &none) ==
              WIA_SUCCESS;
        ok &= rank == 0 ? (none != nullptr && wia_comm_size(none) == 1) : none == nullptr;
        if (none) wia_destroy_communicator(none);
        // Spec 6.6.1: reduce inside the node, all-reduce across leaders,
        // broadcast inside the node.
        wia_comm_hierarchy_t h;
        ok &= wia_comm_create_hierarchy(comm, &h) == WIA_SUCCESS;
        ok &= h.num_nodes == 2 && h.my_node == rank / 2 &&
              h.is_node_representative == (rank % 2 == 0);
        std::int32_t local = rank + 1, node_sum = 0, global = 0;
        ok &= wia_all_reduce(h.node_comms[h.my_node], &local, &node_sum, 1, &cfg, nullptr) ==
              WIA_SUCCESS;
        if (h.is_node_representative)
          ok &= wia_all_reduce(h.inter_node_comm, &node_sum, &global, 1, &cfg, nullptr) ==
                WIA_SUCCESS;
        ok &= wia_broadcast(h.node_comms[h.my_node], &global, 1, 0, WIA_INT32, nullptr) ==
              WIA_SUCCESS;
        ok &= wia_stream_synchronize(nullptr) == WIA_SUCCESS && global == 10;
        ok &= (h.inter_node_comm != nullptr) == h.is_node_representative;
        ok &= wia_comm_destroy_hierarchy(&h) == WIA_SUCCESS;
        wia_destroy_communicator(half);
        wia_destroy_communicator(comm);
        if (!ok) std::fprintf(stderr, "rank %d: %s\n", rank, wia_get_last_error());
        return ok ? kOk : kWrong;
      },
      {{"TEST_WIA_ID", id}});
  check_all(st);
}

TEST_CASE("point to point between processes: ordered matching, and a size mismatch is an error") {
  // Over both transports: shm's eager and rendezvous paths, tcp's stream.
  for (const char* transport : {"tcp", "shm"}) {
    INFO(transport);
    const auto st = run_ranks(
        2, base_yaml(5000),
        [](int rank, int nranks) {
          wia_communicator_t comm = join(rank, nranks);
          if (!comm) return kApiError;
          int ok = 1;
          // Three messages each way, received in order; sizes 0, 5 and 300000.
          const std::size_t sizes[3] = {0, 5, 300000};
          std::vector<std::vector<std::int32_t>> out(3), in(3);
          for (int m = 0; m < 3; ++m) {
            out[m].assign(sizes[m] + 1, rank * 1000 + m);
            in[m].assign(sizes[m] + 1, -1);
          }
          const int peer = 1 - rank;
          for (int m = 0; m < 3; ++m) {
            if (rank == 0) {
              ok &= wia_comm_send(comm, out[m].data(), sizes[m], WIA_INT32, peer, nullptr) == WIA_SUCCESS;
              ok &= wia_comm_recv(comm, in[m].data(), sizes[m], WIA_INT32, peer, nullptr) == WIA_SUCCESS;
            } else {
              ok &= wia_comm_recv(comm, in[m].data(), sizes[m], WIA_INT32, peer, nullptr) == WIA_SUCCESS;
              ok &= wia_comm_send(comm, out[m].data(), sizes[m], WIA_INT32, peer, nullptr) == WIA_SUCCESS;
            }
          }
          ok &= wia_stream_synchronize(nullptr) == WIA_SUCCESS;
          for (int m = 0; m < 3; ++m)
            for (std::size_t i = 0; i < sizes[m]; ++i) ok &= in[m][i] == peer * 1000 + m;
          if (!ok) {
            std::fprintf(stderr, "rank %d: p2p: %s\n", rank, wia_get_last_error());
            return kWrong;
          }
          // Rank 1 expects 4 elements where rank 0 sends 3.
          std::int32_t buf[4] = {0, 0, 0, 0};
          if (rank == 0)
            wia_comm_send(comm, buf, 3, WIA_INT32, 1, nullptr);
          else
            wia_comm_recv(comm, buf, 4, WIA_INT32, 0, nullptr);
          const wia_status_t s = wia_stream_synchronize(nullptr);
          const std::string msg = wia_get_last_error();
          wia_destroy_communicator(comm);
          if (rank == 1) {
            std::fprintf(stderr, "rank 1 saw: %s\n", msg.c_str());
            return s == WIA_ERROR_MISMATCH && msg.find("sent 12 B") != std::string::npos ? kSawError
                                                                                     : kWrong;
          }
          return kSawError;  // the sender may or may not see the failure
        },
        {{"TEST_WIA_ID", unique_id_env()}, {"WIA_TRANSPORT", transport}});
    check_all(st, kSawError);
  }
}

// Point to point involves some ranks only: a collective after it must still
// match on every rank (the descriptor counts collectives, not operations).
TEST_CASE("point to point between some ranks, then collectives on all of them") {
  const auto st = run_ranks(
      3, base_yaml(10000),
      [](int rank, int nranks) {
        wia_communicator_t comm = join(rank, nranks);
        if (!comm) return kApiError;
        int ok = 1;
        std::int32_t msg[2] = {rank == 0 ? 41 : -1, rank == 0 ? 42 : -1};
        if (rank == 0) {
          ok &= wia_comm_send(comm, &msg[0], 1, WIA_INT32, 1, nullptr) == WIA_SUCCESS;
          ok &= wia_comm_send(comm, &msg[1], 1, WIA_INT32, 1, nullptr) == WIA_SUCCESS;
        } else if (rank == 1) {
          ok &= wia_comm_recv(comm, &msg[0], 1, WIA_INT32, 0, nullptr) == WIA_SUCCESS;
          ok &= wia_comm_recv(comm, &msg[1], 1, WIA_INT32, 0, nullptr) == WIA_SUCCESS;
        }
        // A small all-reduce (run by the posting thread) and a large one
        // (through the stream), each summing rank + 1.
        for (const std::size_t n : {std::size_t{3}, std::size_t{200000}}) {
          std::vector<double> v(n, rank + 1.0);
          wia_collective_config_t cfg{};
          cfg.operation = WIA_COLLECTIVE_ALLREDUCE;
          cfg.datatype = WIA_FLOAT64;
          cfg.reduction_op = WIA_REDUCE_SUM;
          ok &= wia_all_reduce(comm, v.data(), v.data(), n, &cfg, nullptr) == WIA_SUCCESS;
          ok &= wia_stream_synchronize(nullptr) == WIA_SUCCESS;
          const double want = nranks * (nranks + 1) / 2.0;
          for (double x : v) ok &= x == want;
        }
        if (rank == 1) ok &= msg[0] == 41 && msg[1] == 42;
        if (!ok) std::fprintf(stderr, "rank %d: %s\n", rank, wia_get_last_error());
        wia_destroy_communicator(comm);
        return ok ? kOk : kWrong;
      },
      {{"TEST_WIA_ID", unique_id_env()}, {"WIA_TRANSPORT", "shm"}});
  check_all(st, kOk);
}

// A small collective posted on an idle stream is started by the posting
// thread; when a peer is late it is handed to the stream where it stopped.
// Work posted after it on the same stream must still see its result, with
// or without the hand-over, and a burst of calls must all complete.
TEST_CASE("collectives started by the posting thread keep stream order when peers are late") {
  const auto st = run_ranks(
      2, base_yaml(10000),
      [](int rank, int nranks) {
        wia_communicator_t comm = join(rank, nranks);
        if (!comm) return kApiError;
        int ok = 1;
        wia_collective_config_t cfg{};
        cfg.operation = WIA_COLLECTIVE_ALLREDUCE;
        cfg.datatype = WIA_INT64;
        cfg.reduction_op = WIA_REDUCE_SUM;
        for (int round = 0; round < 3; ++round) {
          // Rank 1 arrives 30 ms late in round 1: rank 0's call is handed over.
          if (rank == 1 && round == 1) usleep(30000);
          std::int64_t v[4] = {rank + 1, 10 * (rank + 1), round, 7};
          std::int64_t copy[4] = {0, 0, 0, 0};
          ok &= wia_all_reduce(comm, v, v, 4, &cfg, nullptr) == WIA_SUCCESS;
          // Queued behind the collective on the same stream.
          ok &= wia_memcpy_async(copy, v, sizeof(v), nullptr) == WIA_SUCCESS;
          ok &= wia_stream_synchronize(nullptr) == WIA_SUCCESS;
          ok &= copy[0] == 3 && copy[1] == 30 && copy[2] == 2 * round && copy[3] == 14;
        }
        // A burst of 200 back-to-back calls, one synchronize at the end;
        // rank 0 starts late so that the first calls are handed over.
        if (rank == 0) usleep(20000);
        std::vector<std::int64_t> burst(200 * 2);
        for (int i = 0; i < 200; ++i) {
          burst[2 * i] = i, burst[2 * i + 1] = rank;
          ok &= wia_all_reduce(comm, &burst[2 * i], &burst[2 * i], 2, &cfg, nullptr) == WIA_SUCCESS;
        }
        ok &= wia_stream_synchronize(nullptr) == WIA_SUCCESS;
        for (int i = 0; i < 200; ++i) ok &= burst[2 * i] == 2 * i && burst[2 * i + 1] == 1;
        if (!ok) std::fprintf(stderr, "rank %d: %s\n", rank, wia_get_last_error());
        wia_destroy_communicator(comm);
        return ok ? kOk : kWrong;
      },
      {{"TEST_WIA_ID", unique_id_env()}, {"WIA_TRANSPORT", "shm"}});
  check_all(st, kOk);
}

namespace {

// Input of rank r at index i for the one-shot tests: small integers (exact
// in every type, products of up to 4 ranks stay small).
double small_input(int r, std::uint64_t i) { return static_cast<double>((r + 2 * i) % 3 + 1); }

// Where a test's buffers live: the heap, or libwia device memory (host
// devices: addressable here), which node-shared windows read in place.
enum class Memory { kHeap, kDevice };

// `n` elements of T in `memory`, freed on destruction.
template <typename T>
class Buffer {
 public:
  Buffer(std::uint64_t n, Memory memory) : n_(n) {
    if (memory == Memory::kHeap) {
      heap_.resize(n);
      p_ = heap_.data();
    } else if (wia_malloc(reinterpret_cast<void**>(&p_), std::max<std::uint64_t>(n, 1) * sizeof(T)) !=
               WIA_SUCCESS) {
      p_ = nullptr;
    }
    device_ = memory == Memory::kDevice;
  }
  ~Buffer() {
    if (device_ && p_) wia_free(p_);
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  T* data() { return p_; }
  T& operator[](std::uint64_t i) { return p_[i]; }

 private:
  std::uint64_t n_;
  std::vector<T> heap_;
  T* p_ = nullptr;
  bool device_ = false;
};

// Checks one all-reduce against a reference, and that `algorithm` ran it.
template <typename T>
int check_all_reduce(wia_communicator_t comm, int rank, int nranks, wia_datatype_t dtype,
                     wia_reduce_op_t op, std::uint64_t n, bool in_place,
                     const char* algorithm = "one_shot", Memory memory = Memory::kHeap) {
  Buffer<T> in(n, memory), out(n, memory);
  if (!in.data() || !out.data()) {
    std::fprintf(stderr, "rank %d: wia_malloc: %s\n", rank, wia_get_last_error());
    return -1;
  }
  for (std::uint64_t i = 0; i < n; ++i) in[i] = static_cast<T>(small_input(rank, i)), out[i] = T(-9);
  wia_collective_config_t cfg{};
  cfg.operation = WIA_COLLECTIVE_ALLREDUCE;
  cfg.datatype = dtype;
  cfg.reduction_op = op;
  T* dst = in_place ? in.data() : out.data();
  if (wia_all_reduce(comm, in.data(), dst, n, &cfg, nullptr) != WIA_SUCCESS ||
      wia_stream_synchronize(nullptr) != WIA_SUCCESS) {
    std::fprintf(stderr, "rank %d: all_reduce: %s\n", rank, wia_get_last_error());
    return -1;
  }
  int wrong = 0;
  for (std::uint64_t i = 0; i < n; ++i) {
    // The reference in double, by a different route: every rank's input
    // recomputed here.
    double ref = op == WIA_REDUCE_PROD ? 1 : op == WIA_REDUCE_MIN ? 1e300 : op == WIA_REDUCE_MAX ? -1e300 : 0;
    for (int q = 0; q < nranks; ++q) {
      const double v = small_input(q, i);
      if (op == WIA_REDUCE_PROD) ref *= v;
      else if (op == WIA_REDUCE_MIN) ref = std::min(ref, v);
      else if (op == WIA_REDUCE_MAX) ref = std::max(ref, v);
      else ref += v;
    }
    if (op == WIA_REDUCE_AVG) ref = std::is_integral_v<T> ? std::trunc(ref / nranks) : ref / nranks;
    const double got = static_cast<double>(dst[i]);
    if (std::fabs(got - ref) > 1e-6 * std::max(1.0, std::fabs(ref))) ++wrong;
  }
  const wia_algorithm_t algo = wia_get_selected_algorithm(comm);
  if (!algo.name || std::string(algo.name) != algorithm) {
    std::fprintf(stderr, "rank %d: selected %s, not %s\n", rank, algo.name ? algo.name : "?",
                 algorithm);
    ++wrong;
  }
  return wrong;
}

// check_all_reduce for every op and four dtypes, each of `counts`, in
// and out of place; `algorithm(count)` names what must have run. The
// wrong results, or -1 on an API error.
template <typename AlgorithmOf>
int check_every_op(wia_communicator_t comm, int rank, int nranks,
                   std::initializer_list<std::uint64_t> counts, AlgorithmOf algorithm,
                   Memory memory = Memory::kHeap) {
  int wrong = 0;
  for (wia_reduce_op_t op :
       {WIA_REDUCE_SUM, WIA_REDUCE_PROD, WIA_REDUCE_MIN, WIA_REDUCE_MAX, WIA_REDUCE_AVG})
    for (std::uint64_t count : counts)
      for (bool in_place : {false, true}) {
        const char* algo = algorithm(count);
        int w = check_all_reduce<float>(comm, rank, nranks, WIA_FLOAT32, op, count, in_place, algo,
                                        memory);
        w += check_all_reduce<double>(comm, rank, nranks, WIA_FLOAT64, op, count, in_place, algo,
                                      memory);
        w += check_all_reduce<std::int32_t>(comm, rank, nranks, WIA_INT32, op, count, in_place,
                                            algo, memory);
        w += check_all_reduce<std::int64_t>(comm, rank, nranks, WIA_INT64, op, count, in_place,
                                            algo, memory);
        if (w < 0) return -1;
        wrong += w;
      }
  return wrong;
}

// Every rank holds the same bits, even where rounding depends on the order
// of the sum: an all-reduce of `len` floats, its results gathered and
// compared. The ranks whose results differ from rank 0's, or -1 on an API
// error.
int same_bits_everywhere(wia_communicator_t comm, int rank, int nranks, std::size_t len) {
  std::vector<float> x(len), all(len * nranks);
  for (std::size_t i = 0; i < len; ++i)
    x[i] = 0.1f * static_cast<float>(rank + 1) + 1e-7f * static_cast<float>(i);
  wia_collective_config_t cfg{};
  cfg.datatype = WIA_FLOAT32;
  cfg.reduction_op = WIA_REDUCE_SUM;
  int ok = wia_all_reduce(comm, x.data(), x.data(), len, &cfg, nullptr) == WIA_SUCCESS;
  cfg.operation = WIA_COLLECTIVE_ALLGATHER;
  ok &= wia_all_gather_ex(comm, x.data(), all.data(), len, &cfg, nullptr) == WIA_SUCCESS;
  ok &= wia_stream_synchronize(nullptr) == WIA_SUCCESS;
  if (!ok) return -1;
  int differ = 0;
  for (int q = 1; q < nranks; ++q)
    differ += std::memcmp(all.data(), all.data() + len * q, len * sizeof(float)) != 0;
  return differ;
}

}  // namespace

// Over shm by default through the node-shared windows; with them off,
// through shm messages (inline ones); over tcp, through its messages.
TEST_CASE("small all-reduces run one-shot: every op, four dtypes, in and out of place") {
  for (const char* variant : {"shm", "shm-messages", "tcp"})
    for (int n : {2, 3}) {
      INFO(variant << " with " << n << " processes");
      const bool windows_off = std::string(variant) == "shm-messages";
      const char* transport = std::string(variant) == "tcp" ? "tcp" : "shm";
      const auto st = run_ranks(
          n, base_yaml() + (windows_off ? "  node_window_chunk_bytes: 0\n" : ""),
          [](int rank, int nranks) {
            wia_communicator_t comm = join(rank, nranks);
            if (!comm) return kApiError;
            const int wrong = check_every_op(comm, rank, nranks, {1, 7, 1000},
                                             [](std::uint64_t) { return "one_shot"; });
            const int differ = same_bits_everywhere(comm, rank, nranks, 64);
            wia_destroy_communicator(comm);
            if (wrong < 0 || differ < 0) return kApiError;
            if (wrong || differ)
              std::fprintf(stderr, "rank %d: %d wrong, %d ranks differ\n", rank, wrong, differ);
            return wrong || differ ? kWrong : kOk;
          },
          {{"WIA_TRANSPORT", transport}, {"TEST_WIA_ID", unique_id_env()}});
      check_all(st);
    }
}

TEST_CASE("one-shot over shm messages larger than its eager size: declined inline, sent by isend") {
  // shm takes messages above eager_size by rendezvous: send_inline and
  // recv_inline decline them, and the one-shot path falls back to
  // isend/irecv per peer. 1000 floats = 4 KiB > 1 KiB.
  const auto st = run_ranks(
      3, base_yaml() + "  node_window_chunk_bytes: 0\nshm:\n  eager_size: 1024\n",
      [](int rank, int nranks) {
        wia_communicator_t comm = join(rank, nranks);
        if (!comm) return kApiError;
        int wrong = 0;
        for (bool in_place : {false, true}) {
          // 2 floats still fit inline: both kinds of message in one run.
          for (std::uint64_t count : {1000, 2}) {
            const int w = check_all_reduce<float>(comm, rank, nranks, WIA_FLOAT32,
                                                  WIA_REDUCE_SUM, count, in_place);
            if (w < 0) return kApiError;
            wrong += w;
          }
        }
        wia_destroy_communicator(comm);
        return wrong ? kWrong : kOk;
      },
      {{"TEST_WIA_ID", unique_id_env()}, {"WIA_TRANSPORT", "shm"}});
  check_all(st);
}

TEST_CASE("a rank on the one-shot path and ranks on the general path fail, never hang") {
  // Rank 1's count is small (one-shot), the others' large (the general
  // engine): every rank must report an error within the timeout.
  for (int n : {2, 3})
  for (const char* windows : {"", "  node_window_chunk_bytes: 0\n"}) {
    INFO(n << " processes" << (*windows ? ", node-shared windows off" : ""));
    const auto start = std::chrono::steady_clock::now();
    const auto st = run_ranks(
        n, base_yaml(5000) + windows,
        [](int rank, int nranks) {
          wia_communicator_t comm = join(rank, nranks);
          if (!comm) return kApiError;
          std::vector<float> b(100000, 1.0f);
          wia_collective_config_t cfg{};
          cfg.datatype = WIA_FLOAT32;
          const auto [s, msg] = all_reduce_in_place(comm, b.data(), rank == 1 ? 2 : 100000, cfg);
          wia_destroy_communicator(comm);
          return error_naming(rank, s, msg, {""});  // any error will do
        },
        {{"TEST_WIA_ID", unique_id_env()}, {"WIA_TRANSPORT", "shm"}});
    check_all(st, kSawError);
    CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(20));
  }
}

TEST_CASE("one-shot ranks that disagree on the op fail on every rank, naming it") {
  const auto st = run_ranks(
      3, base_yaml(),
      [](int rank, int nranks) {
        wia_communicator_t comm = join(rank, nranks);
        if (!comm) return kApiError;
        float v[2] = {1, 2};
        wia_collective_config_t cfg{};
        cfg.datatype = WIA_FLOAT32;
        cfg.reduction_op = rank == 2 ? WIA_REDUCE_MAX : WIA_REDUCE_SUM;
        const auto [s, msg] = all_reduce_in_place(comm, v, 2, cfg);
        wia_destroy_communicator(comm);
        return error_naming(rank, s, msg, {"op sum vs max", "op max vs sum"});
      },
      {{"TEST_WIA_ID", unique_id_env()}, {"WIA_TRANSPORT", "tcp"}});
  check_all(st, kSawError);
}

// With node-shared windows the direct algorithm through them takes small
// all-reduces instead (the windows test covers that): off here.
TEST_CASE("collectives.one_shot_max_bytes = 0 leaves small all-reduces to the cost model") {
  const auto st = run_ranks(
      2, base_yaml() + "  one_shot_max_bytes: 0\n  node_window_chunk_bytes: 0\n",
      [](int rank, int nranks) {
        wia_communicator_t comm = join(rank, nranks);
        if (!comm) return kApiError;
        float v[2] = {1, 2};
        wia_collective_config_t cfg{};
        cfg.datatype = WIA_FLOAT32;
        const int ok = wia_all_reduce(comm, v, v, 2, &cfg, nullptr) == WIA_SUCCESS &&
                       wia_stream_synchronize(nullptr) == WIA_SUCCESS && v[0] == 2 && v[1] == 4;
        const wia_algorithm_t algo = wia_get_selected_algorithm(comm);
        const bool general = algo.name && std::string(algo.name) != "one_shot";
        wia_destroy_communicator(comm);
        return ok && general ? kOk : kWrong;
      },
      {{"TEST_WIA_ID", unique_id_env()}, {"WIA_TRANSPORT", "shm"}});
  check_all(st);
}

// All ranks on one node over shm: all-reduces run through the node-shared
// windows (engine/window_allreduce.hpp). Banks of 4 KiB make the larger
// counts tens of chunks, so both banks are reused many times per call,
// and counts that do not divide by the ranks leave uneven slices; the
// float64 1000-element one-shot call takes two chunks. With 2 ranks every
// size runs one-shot.
TEST_CASE("all-reduces through node-shared windows: many chunks, every op, four dtypes") {
  for (int n : {2, 3, 4}) {
    // With 3 the peers' windows are mapped through /proc/<pid>/fd, the
    // host provider's fallback where pidfd_getfd is refused.
    const char* ipc_open = n == 3 ? "proc" : "auto";
    INFO(n << " processes, host.ipc_open " << ipc_open);
    const auto st = run_ranks(
        n, base_yaml() + "  node_window_chunk_bytes: 4096\n",
        [](int rank, int nranks) {
          wia_communicator_t comm = join(rank, nranks);
          if (!comm) return kApiError;
          int wrong = check_every_op(comm, rank, nranks, {3, 1000, 5000, 20011},
                                     [nranks](std::uint64_t count) {
                                       return count <= 1000 || nranks == 2 ? "one_shot" : "direct";
                                     });
          if (wrong < 0) return kApiError;
          // The same small call again and again (a training loop's
          // pattern) takes the repeat lane: new data every time, and a
          // broadcast in between must not confuse what is reported.
          for (int it = 0; it < 300; ++it) {
            std::int64_t v[3] = {rank + it, rank * it, -it}, sum[3] = {};
            wia_collective_config_t c{};
            c.datatype = WIA_INT64;
            if (wia_all_reduce(comm, v, sum, 3, &c, nullptr) != WIA_SUCCESS ||
                wia_stream_synchronize(nullptr) != WIA_SUCCESS)
              return kApiError;
            const std::int64_t p = nranks, ranks_sum = p * (p - 1) / 2;
            wrong += sum[0] != ranks_sum + p * it || sum[1] != ranks_sum * it || sum[2] != -p * it;
            if (it == 150) {
              std::int64_t b = rank == 0 ? 42 : 0;
              if (wia_broadcast(comm, &b, 1, 0, WIA_INT64, nullptr) != WIA_SUCCESS ||
                  wia_stream_synchronize(nullptr) != WIA_SUCCESS)
                return kApiError;
              wrong += b != 42;
            }
          }
          const wia_algorithm_t last = wia_get_selected_algorithm(comm);
          wrong += !last.name || std::string(last.name) != "one_shot" ||
                   std::string(last.collective ? last.collective : "") != "allreduce";
          const int differ = same_bits_everywhere(comm, rank, nranks, 3001);
          const bool ok = differ >= 0;
          wrong += std::max(differ, 0);
          wia_destroy_communicator(comm);
          if (!ok) return kApiError;
          if (wrong) std::fprintf(stderr, "rank %d: %d wrong\n", rank, wrong);
          return wrong ? kWrong : kOk;
        },
        {{"TEST_WIA_ID", unique_id_env()}, {"WIA_TRANSPORT", "shm"}, {"WIA_HOST_IPC_OPEN", ipc_open}});
    check_all(st);
  }
}

// An all-reduce of `count` floats from a fresh device allocation into
// another, both freed after: x = input(rank, i + shift). The wrong
// results, or -1 on an API error; `reused` counts inputs that came back at
// an address an earlier call's buffer had (`seen`).
int fresh_buffers_all_reduce(wia_communicator_t comm, int rank, int nranks, std::uint64_t count,
                             std::uint64_t shift, std::vector<const void*>& seen, int& reused) {
  float* x = nullptr;
  float* y = nullptr;
  if (wia_malloc(reinterpret_cast<void**>(&x), count * sizeof(float)) != WIA_SUCCESS ||
      wia_malloc(reinterpret_cast<void**>(&y), count * sizeof(float)) != WIA_SUCCESS)
    return -1;
  reused += std::find(seen.begin(), seen.end(), x) != seen.end();
  seen.push_back(x);
  seen.push_back(y);
  for (std::uint64_t i = 0; i < count; ++i) x[i] = static_cast<float>(input(rank, i + shift));
  wia_collective_config_t cfg{};
  cfg.datatype = WIA_FLOAT32;
  int wrong = 0;
  if (wia_all_reduce(comm, x, y, count, &cfg, nullptr) != WIA_SUCCESS ||
      wia_stream_synchronize(nullptr) != WIA_SUCCESS) {
    std::fprintf(stderr, "rank %d: all_reduce: %s\n", rank, wia_get_last_error());
    wrong = -1;
  }
  for (std::uint64_t i = 0; wrong >= 0 && i < count; ++i) {
    double ref = 0;
    for (int q = 0; q < nranks; ++q) ref += input(q, i + shift);
    wrong += y[i] != static_cast<float>(ref);
  }
  wia_free(x);
  wia_free(y);
  return wrong;
}

// Inputs in libwia device memory are read by the peers in place
// (docs/processes.md, "Reading inputs in place"): every op and dtype, in
// place (copied by the one-shot schedule, read in place by the direct
// one) and not, over many 4 KiB chunks with uneven slices. Then
// buffers freed and allocated again between calls: the same address comes
// back holding other memory, and a peer that kept reading its old mapping
// would compute with the old data.
TEST_CASE("all-reduces read inputs in device memory in place, across frees and reallocations") {
  for (int n : {2, 3, 4}) {
    INFO(n << " processes");
    const auto st = run_ranks(
        n,
        base_yaml() + "  node_window_chunk_bytes: 4096\n  node_window_zero_copy_min_bytes: 64\n",
        [](int rank, int nranks) {
          wia_communicator_t comm = join(rank, nranks);
          if (!comm) return kApiError;
          int wrong = check_every_op(
              comm, rank, nranks, {3, 1000, 20011},
              [nranks](std::uint64_t count) {
                return count <= 1000 || nranks == 2 ? "one_shot" : "direct";
              },
              Memory::kDevice);
          if (wrong < 0) return kApiError;
          std::vector<const void*> seen;
          int reused = 0;
          for (std::uint64_t it = 0; it < 40; ++it) {
            // One size, so that the same address comes back, and another
            // now and then: more buffers than export slots over the loop.
            const std::uint64_t count = it % 7 == 6 ? 5000 + it : 3000;
            const int w = fresh_buffers_all_reduce(comm, rank, nranks, count, it, seen, reused);
            if (w < 0) return kApiError;
            wrong += w;
          }
          wia_destroy_communicator(comm);
          if (reused == 0) {
            std::fprintf(stderr, "rank %d: no input address came back: the test tested nothing\n",
                         rank);
            return kWrong;
          }
          if (wrong) std::fprintf(stderr, "rank %d: %d wrong\n", rank, wrong);
          return wrong ? kWrong : kOk;
        },
        {{"TEST_WIA_ID", unique_id_env()}, {"WIA_TRANSPORT", "shm"}});
    check_all(st);
  }
}

// A rank whose input was read in place returns only when every peer
// finished reading it: here each rank overwrites its input, last element
// first, the moment its call returns, and then checks its result. Vectors
// of two default-size chunks: a rank that returned early would overwrite
// the chunk its peer is still reducing. In place, a rank must not write a
// chunk's result before its peers finished reading that chunk (with 3
// ranks the direct schedule reads in-place inputs in place; with 2 the
// one-shot one copies them).
TEST_CASE("an input read in place is the caller's again when the call returns") {
  for (int n : {2, 3}) {
    INFO(n << " processes");
    const auto st = run_ranks(
        n, base_yaml(),
        [](int rank, int nranks) {
          wia_communicator_t comm = join(rank, nranks);
          if (!comm) return kApiError;
          const std::uint64_t count = 1 << 18;  // 1 MiB of floats
          Buffer<float> x(count, Memory::kDevice), y(count, Memory::kDevice);
          if (!x.data() || !y.data()) return kApiError;
          int wrong = 0;
          wia_collective_config_t cfg{};
          cfg.datatype = WIA_FLOAT32;
          for (std::uint64_t it = 0; it < 60; ++it) {
            const bool in_place = it % 2 == 1;
            float* out = in_place ? x.data() : y.data();
            for (std::uint64_t i = 0; i < count; ++i) x[i] = static_cast<float>(input(rank, i + it));
            if (wia_all_reduce(comm, x.data(), out, count, &cfg, nullptr) != WIA_SUCCESS ||
                wia_stream_synchronize(nullptr) != WIA_SUCCESS) {
              std::fprintf(stderr, "rank %d: all_reduce: %s\n", rank, wia_get_last_error());
              return kApiError;
            }
            if (!in_place)
              for (std::uint64_t i = count; i-- > 0;) x[i] = 1e6f;
            for (std::uint64_t i = 0; i < count; i += 7) {
              double ref = 0;
              for (int q = 0; q < nranks; ++q) ref += input(q, i + it);
              wrong += out[i] != static_cast<float>(ref);
            }
          }
          wia_destroy_communicator(comm);
          if (wrong) std::fprintf(stderr, "rank %d: %d wrong\n", rank, wrong);
          return wrong ? kWrong : kOk;
        },
        {{"TEST_WIA_ID", unique_id_env()}, {"WIA_TRANSPORT", "shm"}});
    check_all(st);
  }
}

// A repeated small all-reduce takes the shortest path (the API's memo of
// the thread's last call, try_post_repeat restarting the window of last
// time). Two threads of each rank posting in turn, each with buffers of
// its own: every call restarts a window last run on the other thread's
// buffers, so a restart that kept the old buffers reads and writes the
// wrong ones. With the second thread's vectors larger (chunked through the
// windows), every small call follows a window started for another shape.
TEST_CASE("a repeated small all-reduce posted by two threads in turn uses each thread's buffers") {
  for (const auto& [n, other] : {std::pair{2, 3}, std::pair{3, 3}, std::pair{2, 5000},
                                 std::pair{3, 5000}}) {
    const int other_count = other;
    INFO(n << " processes, the other thread's count " << other_count);
    const auto st = run_ranks(
        n, base_yaml(),
        [other_count](int rank, int nranks) {
          wia_communicator_t comm = join(rank, nranks);
          if (!comm) return kApiError;
          constexpr int kCalls = 200;
          std::mutex mu;
          std::condition_variable cv;
          int turn = 0, wrong = 0;
          bool failed = false;
          auto thread_body = [&](int first) {
            // 3 floats, 12 bytes: they ride in the window's header line.
            const std::uint64_t kCount = first == 0 ? 3 : static_cast<std::uint64_t>(other_count);
            std::vector<float> x(kCount), y(kCount);
            wia_collective_config_t cfg{};
            cfg.datatype = WIA_FLOAT32;
            for (int it = first; it < kCalls; it += 2) {
              {
                // Bounded: a thread stuck in a call (which would be a
                // bug) must not hang the other one forever.
                std::unique_lock<std::mutex> lock(mu);
                if (!cv.wait_for(lock, std::chrono::seconds(60), [&] { return turn == it; })) {
                  std::fprintf(stderr, "rank %d: call %d never got its turn\n", rank, it);
                  failed = true;
                  return;
                }
              }
              for (std::uint64_t i = 0; i < kCount; ++i)
                x[i] = static_cast<float>(input(rank, i + static_cast<std::uint64_t>(it)));
              const bool ok = wia_all_reduce(comm, x.data(), y.data(), kCount, &cfg, nullptr) ==
                                  WIA_SUCCESS &&
                              wia_stream_synchronize(nullptr) == WIA_SUCCESS;
              int bad = 0;
              for (std::uint64_t i = 0; i < kCount; ++i) {
                double ref = 0;
                for (int q = 0; q < nranks; ++q) ref += input(q, i + static_cast<std::uint64_t>(it));
                bad += y[i] != static_cast<float>(ref);
              }
              {
                std::lock_guard<std::mutex> lock(mu);
                if (!ok) {
                  std::fprintf(stderr, "rank %d call %d: %s\n", rank, it, wia_get_last_error());
                  failed = true;
                }
                wrong += bad;
                ++turn;
              }
              cv.notify_all();
            }
          };
          std::thread a(thread_body, 0), b(thread_body, 1);
          a.join();
          b.join();
          wia_destroy_communicator(comm);
          if (wrong) std::fprintf(stderr, "rank %d: %d wrong\n", rank, wrong);
          return failed ? kApiError : wrong ? kWrong : kOk;
        },
        {{"TEST_WIA_ID", unique_id_env()}, {"WIA_TRANSPORT", "shm"}});
    check_all(st);
  }
}

// With more ranks than CPUs to run them, a rank waiting on a late peer's
// window sleeps on a futex, and the peer's publish must wake it: without
// the wake-up every call still finishes, 1 ms late, so the test counts how
// the sleeps ended instead of timing them. Ranks count as more than the
// CPUs either way: more ranks than the machine's cores, or 2 ranks
// confined to one CPU (as in a container's cpuset) on any machine. Rank 1
// calls only once rank 0 has gone to sleep in that call (a thread of rank
// 0 watches its sleep count and tells rank 1 through shared memory): on a
// loaded machine a fixed delay can end before rank 0 is done yielding.
TEST_CASE("a rank asleep on a late peer's window is woken by its publish") {
  struct Shared {
    std::atomic<std::uint64_t> sleeps_before{0};  // rank 0's count as call `call` began
    std::atomic<int> call{-1};                     // rank 0's call in progress
    std::atomic<int> asleep_in{-1};                // the last call rank 0 slept in
  };
  void* mem = mmap(nullptr, sizeof(Shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS,
                   -1, 0);
  REQUIRE(mem != MAP_FAILED);
  Shared* shared = new (mem) Shared;
  constexpr int kCalls = 10;
  const auto late_peer = [shared](int rank, int nranks) {
    wia_communicator_t comm = join(rank, nranks);
    if (!comm) return kApiError;
    std::atomic<bool> done{false};
    std::thread watcher;
    if (rank == 0)
      watcher = std::thread([&] {
        while (!done.load()) {
          const int call = shared->call.load();
          if (call >= 0 &&
              wia::engine::window_sleep_counts().sleeps > shared->sleeps_before.load())
            shared->asleep_in.store(call);
          std::this_thread::sleep_for(std::chrono::microseconds(100));
        }
      });
    int wrong = 0;
    for (int it = 0; it < kCalls; ++it) {
      if (rank == 0) {
        shared->sleeps_before.store(wia::engine::window_sleep_counts().sleeps);
        shared->call.store(it);
      }
      if (rank == 1) {
        // Late: until rank 0 sleeps in this call (at most 3 s).
        const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(3);
        while (shared->asleep_in.load() < it && std::chrono::steady_clock::now() < until)
          std::this_thread::sleep_for(std::chrono::microseconds(200));
      }
      float v = static_cast<float>(rank + it), sum = 0;
      wia_collective_config_t c{};
      c.datatype = WIA_FLOAT32;
      if (wia_all_reduce(comm, &v, &sum, 1, &c, nullptr) != WIA_SUCCESS ||
          wia_stream_synchronize(nullptr) != WIA_SUCCESS) {
        done.store(true);
        if (watcher.joinable()) watcher.join();
        return kApiError;
      }
      wrong += sum != static_cast<float>(nranks * (nranks - 1) / 2 + nranks * it);
    }
    done.store(true);
    if (watcher.joinable()) watcher.join();
    const wia_algorithm_t last = wia_get_selected_algorithm(comm);
    const bool windows = last.name && std::string(last.name) == "one_shot";
    wia_destroy_communicator(comm);
    const wia::engine::WindowSleepCounts slept = wia::engine::window_sleep_counts();
    if (rank == 0 && (!windows || slept.sleeps == 0 || slept.woken == 0)) {
      std::fprintf(stderr,
                   "rank %d: algorithm %s, %llu sleeps on a window, %llu ended by a wake-up\n",
                   rank, last.name ? last.name : "?",
                   static_cast<unsigned long long>(slept.sleeps),
                   static_cast<unsigned long long>(slept.woken));
      ++wrong;
    }
    return wrong ? kWrong : kOk;
  };
  const std::vector<std::pair<std::string, std::string>> env = {
      {"TEST_WIA_ID", unique_id_env()}, {"WIA_TRANSPORT", "shm"}};
  SUBCASE("2 ranks confined to one CPU") {
    cpu_set_t allowed;
    REQUIRE(sched_getaffinity(0, sizeof allowed, &allowed) == 0);
    int first = 0;
    while (!CPU_ISSET(first, &allowed)) ++first;
    check_all(run_ranks(2, base_yaml(), late_peer, env, {}, 120, [first](int) {
      cpu_set_t one;
      CPU_ZERO(&one);
      CPU_SET(first, &one);
      sched_setaffinity(0, sizeof one, &one);
    }));
  }
  SUBCASE("more ranks than the machine's cores") {
    const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    const int n = cores + 1;
    if (n > 32) {
      MESSAGE("skipped: " << n << " processes would be needed to outnumber the cores");
    } else {
      INFO(n << " processes on " << cores << " cores");
      check_all(run_ranks(n, base_yaml(), late_peer, env));
    }
  }
  shared->~Shared();
  munmap(mem, sizeof(Shared));
}

// The window layout is every rank's bank size: ranks configured
// differently must not map each other's windows with their own layout
// (reads past a mapping), nor split between windows and messages (each
// waiting for the other). They all fall back to messages, correctly.
TEST_CASE("ranks with different node-window settings all use messages, with correct results") {
  const auto st = run_ranks(
      3, base_yaml(),
      [](int rank, int nranks) {
        wia_communicator_t comm = join(rank, nranks);
        if (!comm) return kApiError;
        int wrong = 0;
        for (std::size_t n : {std::size_t{2}, std::size_t{70001}}) {
          std::vector<float> x(n), y(n);
          for (std::size_t i = 0; i < n; ++i) x[i] = static_cast<float>(input(rank, i));
          wia_collective_config_t cfg{};
          cfg.datatype = WIA_FLOAT32;
          if (wia_all_reduce(comm, x.data(), y.data(), n, &cfg, nullptr) != WIA_SUCCESS ||
              wia_stream_synchronize(nullptr) != WIA_SUCCESS)
            return kApiError;
          for (std::size_t i = 0; i < n; ++i) {
            double ref = 0;
            for (int q = 0; q < nranks; ++q) ref += input(q, i);
            wrong += y[i] != static_cast<float>(ref);
          }
        }
        wia_destroy_communicator(comm);
        return wrong ? kWrong : kOk;
      },
      {{"TEST_WIA_ID", unique_id_env()}, {"WIA_TRANSPORT", "shm"}}, {}, 120, [](int rank) {
        if (rank == 1) setenv("WIA_COLLECTIVES_NODE_WINDOW_CHUNK_BYTES", "8192", 1);
      });
  check_all(st);
}

TEST_CASE("wia_comm_abort from a watchdog thread: this rank's wait ends ABORTED, the peers fail at once") {
  const auto st = run_ranks(
      3, base_yaml(20000),
      [](int rank, int nranks) {
        wia_communicator_t comm = join(rank, nranks);
        if (!comm) return kApiError;
        std::vector<float> b(1u << 20, 1.0f);
        wia_collective_config_t cfg{};
        cfg.datatype = WIA_FLOAT32;
        if (rank == 2) {
          // Never posts: without the abort the others would wait 20 s.
          std::this_thread::sleep_for(std::chrono::seconds(3));
          wia_destroy_communicator(comm);
          return kSawError;
        }
        const auto start = std::chrono::steady_clock::now();
        std::thread watchdog;
        if (rank == 0)
          watchdog = std::thread([comm] {
            std::this_thread::sleep_for(std::chrono::milliseconds(300));
            if (wia_comm_abort(comm) != WIA_SUCCESS)
              std::fprintf(stderr, "rank 0: abort: %s\n", wia_get_last_error());
          });
        const wia_status_t posted = wia_all_reduce(comm, b.data(), b.data(), b.size(), &cfg, nullptr);
        const wia_status_t s = posted != WIA_SUCCESS ? posted : wia_stream_synchronize(nullptr);
        const std::string msg = wia_get_last_error();
        if (watchdog.joinable()) watchdog.join();
        const double secs =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        if (rank == 1) wia_destroy_communicator(comm);
        std::fprintf(stderr, "rank %d: %.2f s: %s\n", rank, secs, msg.c_str());
        if (secs > 5) return kWrong;  // the abort, not the 20 s timeout, ended it
        if (rank == 0) return s == WIA_ERROR_ABORTED ? kSawError : kWrong;
        return error_naming(rank, s, msg, {"rank 0"});
      },
      {{"TEST_WIA_ID", unique_id_env()}, {"WIA_TRANSPORT", "shm"}});
  check_all(st, kSawError);
}
