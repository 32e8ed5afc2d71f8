// SPDX-License-Identifier: Apache-2.0
// The all-reduce paths of process communicators with real processes: the
// one-shot fast path, the node-shared windows (chunks, every op, in place,
// device memory, two posting threads, sleeping ranks woken by a publish)
// and their fallbacks to messages. Each rank checks every result
// against a reference it computes itself from the inputs every rank derives
// from (rank, index), with integer-valued inputs so that float sums are
// exact, and exits with a status the parent asserts.
#include <dirent.h>
#include <doctest/doctest.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>
#include <wia/wia.h>

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
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "engine/window_allreduce.hpp"
#include "process_harness.hpp"

namespace {
using namespace wia::test::processes;
}  // namespace

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
    } else if (wia_malloc(reinterpret_cast<void**>(&p_),
                          std::max<std::uint64_t>(n, 1) * sizeof(T)) != WIA_SUCCESS) {
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
  for (std::uint64_t i = 0; i < n; ++i)
    in[i] = static_cast<T>(small_input(rank, i)), out[i] = T(-9);
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
    double ref = op == WIA_REDUCE_PROD  ? 1
                 : op == WIA_REDUCE_MIN ? 1e300
                 : op == WIA_REDUCE_MAX ? -1e300
                                        : 0;
    for (int q = 0; q < nranks; ++q) {
      const double v = small_input(q, i);
      if (op == WIA_REDUCE_PROD)
        ref *= v;
      else if (op == WIA_REDUCE_MIN)
        ref = std::min(ref, v);
      else if (op == WIA_REDUCE_MAX)
        ref = std::max(ref, v);
      else
        ref += v;
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
  const auto st =
      run_ranks(3, base_yaml() + "  node_window_chunk_bytes: 0\nshm:\n  eager_size: 1024\n",
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
      const auto st = run_ranks(n, base_yaml(5000) + windows,
                                [](int rank, int nranks) {
                                  wia_communicator_t comm = join(rank, nranks);
                                  if (!comm) return kApiError;
                                  std::vector<float> b(100000, 1.0f);
                                  wia_collective_config_t cfg{};
                                  cfg.datatype = WIA_FLOAT32;
                                  const auto [s, msg] = all_reduce_in_place(
                                      comm, b.data(), rank == 1 ? 2 : 100000, cfg);
                                  wia_destroy_communicator(comm);
                                  return error_naming(rank, s, msg, {""});  // any error will do
                                },
                                {{"TEST_WIA_ID", unique_id_env()}, {"WIA_TRANSPORT", "shm"}});
      check_all(st, kSawError);
      CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(20));
    }
}

TEST_CASE("one-shot ranks that disagree on the op fail on every rank, naming it") {
  const auto st = run_ranks(3, base_yaml(),
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
        n,
        base_yaml() +
            "  node_window_chunk_bytes: 4096\n  node_window_one_shot_peer_bytes: 150000\n",
        [](int rank, int nranks) {
          wia_communicator_t comm = join(rank, nranks);
          if (!comm) return kApiError;
          // 3 and 4 ranks: one-shot while (ranks - 1) x bytes <= 150000,
          // so 5000 elements (20 or 40 KB, 5 or 10 chunks) run one-shot and
          // 20011 (80 or 160 KB) direct, both dtypes.
          int wrong = check_every_op(comm, rank, nranks, {3, 1000, 5000, 20011},
                                     [nranks](std::uint64_t count) {
                                       return count <= 5000 || nranks == 2 ? "one_shot" : "direct";
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
        {{"TEST_WIA_ID", unique_id_env()},
         {"WIA_TRANSPORT", "shm"},
         {"WIA_HOST_IPC_OPEN", ipc_open}});
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
        base_yaml() +
            "  node_window_chunk_bytes: 4096\n  node_window_zero_copy_min_bytes: 64\n"
            "  node_window_one_shot_peer_bytes: 0\n",  // direct from 8 KiB, as it reads in place
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

// The estimate wia_get_selected_algorithm reports for the windows' path
// prices the passes each rank makes (tuner/window_cost.hpp): an input in
// libwia device memory is read in place, one from the heap is first copied
// into the window, so with 2 ranks out of place the heap call costs a
// copy and a fold (1 + 2 copies' worth, kFusedPass) where the device call
// costs the fold alone, the waits aside. Alternating the two on one
// communicator also checks that neither call's estimate is served from the
// other's memo (the plan memo and the repeat of the last window call).
TEST_CASE("the windows' estimate prices a heap input's copy into the window") {
  const auto st = run_ranks(
      2, base_yaml(),
      [](int rank, int nranks) {
        wia_communicator_t comm = join(rank, nranks);
        if (!comm) return kApiError;
        constexpr std::uint64_t kCount = 1 << 20;  // 4 MiB of float32: 8 window banks
        double estimate[2][2] = {};                // [round][memory]
        int wrong = 0;
        for (int round = 0; round < 2; ++round)
          for (Memory memory : {Memory::kHeap, Memory::kDevice}) {
            const int w = check_all_reduce<float>(comm, rank, nranks, WIA_FLOAT32, WIA_REDUCE_SUM,
                                                  kCount, false, "one_shot", memory);
            if (w < 0) return kApiError;
            wrong += w;
            estimate[round][memory == Memory::kDevice] =
                wia_get_selected_algorithm(comm).estimated_time_ms;
          }
        wia_destroy_communicator(comm);
        for (int round = 0; round < 2; ++round) {
          const double heap = estimate[round][0], device = estimate[round][1];
          const double ratio = device > 0 ? heap / device : 0;
          if (!(ratio > 1.4 && ratio < 1.5001)) {
            std::fprintf(stderr, "rank %d round %d: estimate %.4f ms from the heap, %.4f ms in "
                         "place (ratio %.3f, expected about 1.5)\n",
                         rank, round, heap, device, ratio);
            ++wrong;
          }
        }
        return wrong ? kWrong : kOk;
      },
      {{"TEST_WIA_ID", unique_id_env()}, {"WIA_TRANSPORT", "shm"}});
  check_all(st);
}

// A rank whose input was read in place returns only when every peer
// finished reading it: here each rank overwrites its input, last element
// first, the moment its call returns, and then checks its result. Vectors
// of two default-size chunks: a rank that returned early would overwrite
// the chunk its peer is still reducing. In place, a rank must not write a
// chunk's result before its peers finished reading that chunk (the direct
// schedule reads in-place inputs in place; one-shot copies them). With 3
// ranks 1 MiB runs one-shot by default (2 MiB from the peers) and direct
// with node_window_one_shot_peer_bytes 0.
TEST_CASE("an input read in place is the caller's again when the call returns") {
  for (const auto& [n, extra] : {std::pair<int, const char*>{2, ""}, {3, ""},
                                 {3, "  node_window_one_shot_peer_bytes: 0\n"}}) {
    INFO(n << " processes " << extra);
    const auto st = run_ranks(
        n, base_yaml() + extra,
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
            for (std::uint64_t i = 0; i < count; ++i)
              x[i] = static_cast<float>(input(rank, i + it));
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
  for (const auto& [n, other] :
       {std::pair{2, 3}, std::pair{3, 3}, std::pair{2, 5000}, std::pair{3, 5000}}) {
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
              const bool ok =
                  wia_all_reduce(comm, x.data(), y.data(), kCount, &cfg, nullptr) == WIA_SUCCESS &&
                  wia_stream_synchronize(nullptr) == WIA_SUCCESS;
              int bad = 0;
              for (std::uint64_t i = 0; i < kCount; ++i) {
                double ref = 0;
                for (int q = 0; q < nranks; ++q)
                  ref += input(q, i + static_cast<std::uint64_t>(it));
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
    std::atomic<int> call{-1};                    // rank 0's call in progress
    std::atomic<int> asleep_in{-1};               // the last call rank 0 slept in
  };
  void* mem =
      mmap(nullptr, sizeof(Shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
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
          if (call >= 0 && wia::engine::window_sleep_counts().sleeps > shared->sleeps_before.load())
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
                   rank, last.name ? last.name : "?", static_cast<unsigned long long>(slept.sleeps),
                   static_cast<unsigned long long>(slept.woken));
      ++wrong;
    }
    return wrong ? kWrong : kOk;
  };
  const std::vector<std::pair<std::string, std::string>> env = {{"TEST_WIA_ID", unique_id_env()},
                                                                {"WIA_TRANSPORT", "shm"}};
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
      {{"TEST_WIA_ID", unique_id_env()}, {"WIA_TRANSPORT", "shm"}}, {}, 120,
      [](int rank) {
        if (rank == 1) setenv("WIA_COLLECTIVES_NODE_WINDOW_CHUNK_BYTES", "8192", 1);
      });
  check_all(st);
}
