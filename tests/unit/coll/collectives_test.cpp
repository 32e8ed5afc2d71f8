// SPDX-License-Identifier: Apache-2.0
// Collectives end to end: the public API, the communicator, the engine and
// the host provider's streams, checked against a reference computed here
// independently (long double for floats, exact wrap-around for integers),
// with output buffers poisoned before every run.
#include <doctest/doctest.h>
#include <wia/wia.h>

#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <algorithm>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "kernels/cpu_reduce.hpp"
#include "kernels/element_access.hpp"

namespace {

constexpr int kMaxRanks = 8;
constexpr unsigned char kPoison = 0xCD;

std::string write_config(const std::string& text) {
  char path[] = "/tmp/wia-coll-test-XXXXXX.yaml";
  int fd = mkstemps(path, 5);
  REQUIRE(fd >= 0);
  REQUIRE(write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size()));
  close(fd);
  return path;
}

struct Library {
  explicit Library(const std::string& yaml = "host:\n  devices: 8\n") {
    path = write_config(yaml);
    wia_finalize();
    REQUIRE(wia_init_with_config(path.c_str()) == WIA_SUCCESS);
  }
  ~Library() {
    wia_finalize();
    std::remove(path.c_str());
  }
  std::string path;
};

bool full_matrix() {
  const char* e = std::getenv("WIA_FULL_MATRIX");
  return e && *e == '1';
}

// --- values -----------------------------------------------------------------

bool is_float(wia_datatype_t t) {
  return t == WIA_FLOAT16 || t == WIA_BFLOAT16 || t == WIA_FLOAT32 || t == WIA_FLOAT64;
}

// Input element i of rank r: small integers, so float sums are exact and
// products stay finite; products use {1, 2, -1} only.
long double input_value(int rank, std::uint64_t i, wia_reduce_op_t op, wia_datatype_t t) {
  const std::uint64_t h = (i * 2654435761u + static_cast<std::uint64_t>(rank) * 40503u) >> 4;
  if (op == WIA_REDUCE_PROD) {
    static const int kVals[] = {1, 2, -1, 1};
    if (t == WIA_UINT8 || t == WIA_UINT32 || t == WIA_UINT64)
      return static_cast<long double>(1 + (h % 2));
    return static_cast<long double>(kVals[h % 4]);
  }
  const long long v = static_cast<long long>(h % 17) - 8;
  if (t == WIA_UINT8 || t == WIA_UINT32 || t == WIA_UINT64) return static_cast<long double>(h % 31);
  return v;
}

void store(void* base, std::uint64_t i, wia_datatype_t t, long double v) {
  wia::kernels::store_element(base, i, t, static_cast<double>(v));
}

long double load(const void* base, std::uint64_t i, wia_datatype_t t) {
  return wia::kernels::load_element(base, i, t);
}

// Wraps an exact integer result into the type's range, as the hardware does.
long double wrap(long double v, wia_datatype_t t) {
  const long long x = static_cast<long long>(v);
  switch (t) {
    case WIA_INT8: return static_cast<std::int8_t>(x);
    case WIA_UINT8: return static_cast<std::uint8_t>(x);
    case WIA_INT32: return static_cast<std::int32_t>(x);
    case WIA_UINT32: return static_cast<std::uint32_t>(x);
    default: return v;
  }
}

long double reduce_ref(wia_reduce_op_t op, wia_datatype_t t, int nranks, std::uint64_t i,
                       const std::vector<int>& ranks) {
  long double acc = 0;
  bool first = true;
  for (int r : ranks) {
    const long double v = input_value(r, i, op, t);
    if (first) {
      acc = v;
      first = false;
      continue;
    }
    switch (op) {
      case WIA_REDUCE_SUM:
      case WIA_REDUCE_AVG: acc += v; break;
      case WIA_REDUCE_PROD: acc *= v; break;
      case WIA_REDUCE_MIN: acc = std::min(acc, v); break;
      case WIA_REDUCE_MAX: acc = std::max(acc, v); break;
      default: break;
    }
  }
  if (op == WIA_REDUCE_AVG) {
    if (is_float(t)) return acc / nranks;
    return static_cast<long double>(static_cast<long long>(wrap(acc, t)) / nranks);
  }
  return wrap(acc, t);
}

bool close_enough(long double got, long double want, wia_datatype_t t) {
  if (!is_float(t)) return got == want;
  const long double tol = t == WIA_BFLOAT16 ? 1e-2L : t == WIA_FLOAT16 ? 2e-3L : 1e-6L;
  return std::fabs(got - want) <= tol * std::max<long double>(1, std::fabs(want));
}

// --- one run ------------------------------------------------------------------

struct Case {
  wia_collective_op_t coll;
  wia_algorithm_id_t algo;
  int nranks;
  std::uint64_t count;
  wia_datatype_t dtype;
  wia_reduce_op_t op;
  bool in_place;
  int root;
};

std::string describe(const Case& c) {
  return "coll=" + std::to_string(c.coll) + " algo=" + std::to_string(c.algo) +
         " ranks=" + std::to_string(c.nranks) + " count=" + std::to_string(c.count) +
         " dtype=" + wia::kernels::dtype_name(c.dtype) + " op=" +
         wia::kernels::reduce_op_name(c.op) + (c.in_place ? " in-place" : " out-of-place") +
         " root=" + std::to_string(c.root);
}

struct Ranks {
  wia_communicator_t comm = nullptr;
  std::vector<wia_stream_t> streams;
  explicit Ranks(int n) {
    std::vector<wia_device_t> devs(n);
    for (int i = 0; i < n; ++i) devs[i] = i;
    REQUIRE(wia_create_communicator(devs.data(), n, &comm) == WIA_SUCCESS);
    streams.resize(n);
    for (int i = 0; i < n; ++i) REQUIRE(wia_create_stream_on(i, &streams[i]) == WIA_SUCCESS);
  }
  ~Ranks() {
    for (auto s : streams) wia_destroy_stream(s);
    wia_destroy_communicator(comm);
  }
};

// Runs one case; returns the number of wrong elements (and reports the first).
std::uint64_t run_case(Ranks& R, const Case& c) {
  const int p = c.nranks;
  const std::size_t es = wia::kernels::dtype_size(c.dtype);
  const std::uint64_t n = c.count;
  const std::uint64_t all = n * p;
  std::uint64_t in_elems = n, out_elems = n;
  switch (c.coll) {
    case WIA_COLLECTIVE_ALLGATHER: in_elems = n; out_elems = all; break;
    case WIA_COLLECTIVE_REDUCE_SCATTER: in_elems = all; out_elems = n; break;
    case WIA_COLLECTIVE_ALLTOALL: in_elems = all; out_elems = all; break;
    default: break;
  }
  // One allocation per rank large enough for both layouts (+1 element so a
  // zero count still has a valid pointer).
  const std::uint64_t cap = (in_elems + out_elems + 1) * es;
  std::vector<char*> buf(p), send(p), recv(p);
  for (int r = 0; r < p; ++r) {
    REQUIRE(wia_malloc_on(r, reinterpret_cast<void**>(&buf[r]), cap) == WIA_SUCCESS);
    std::memset(buf[r], kPoison, cap);
    // Inputs: element i of rank r; all-to-all shard j element i = input index j*n+i.
    char* input;
    if (!c.in_place) {
      send[r] = buf[r];
      recv[r] = buf[r] + in_elems * es;
      input = send[r];
    } else {
      recv[r] = buf[r];
      switch (c.coll) {
        case WIA_COLLECTIVE_ALLGATHER: send[r] = recv[r] + r * n * es; break;
        case WIA_COLLECTIVE_REDUCE_SCATTER: send[r] = recv[r]; recv[r] = send[r] + r * n * es; break;
        default: send[r] = recv[r]; break;
      }
      input = send[r];
    }
    for (std::uint64_t i = 0; i < in_elems; ++i)
      store(input, i, c.dtype, input_value(r, i, c.op, c.dtype));
  }

  wia_collective_config_t cfg{};
  cfg.operation = c.coll;
  cfg.reduction_op = c.op;
  cfg.datatype = c.dtype;
  cfg.algorithm = c.algo;
  cfg.timeout_ms = 20000;
  std::vector<std::vector<void*>> sshards(p, std::vector<void*>(p)), rshards(p, std::vector<void*>(p));
  REQUIRE(wia_group_start() == WIA_SUCCESS);
  for (int r = 0; r < p; ++r) {
    wia_status_t st = WIA_SUCCESS;
    switch (c.coll) {
      case WIA_COLLECTIVE_ALLREDUCE: st = wia_all_reduce(R.comm, send[r], recv[r], n, &cfg, R.streams[r]); break;
      case WIA_COLLECTIVE_BROADCAST: st = wia_broadcast_ex(R.comm, send[r], recv[r], n, c.root, &cfg, R.streams[r]); break;
      case WIA_COLLECTIVE_REDUCE: st = wia_reduce(R.comm, send[r], recv[r], n, c.root, &cfg, R.streams[r]); break;
      case WIA_COLLECTIVE_ALLGATHER: st = wia_all_gather_ex(R.comm, send[r], recv[r], n, &cfg, R.streams[r]); break;
      case WIA_COLLECTIVE_REDUCE_SCATTER: st = wia_reduce_scatter(R.comm, send[r], recv[r], n, &cfg, R.streams[r]); break;
      case WIA_COLLECTIVE_ALLTOALL:
        for (int j = 0; j < p; ++j) {
          sshards[r][j] = send[r] + j * n * es;
          rshards[r][j] = recv[r] + j * n * es;
        }
        st = wia_all_to_all(R.comm, sshards[r].data(), rshards[r].data(), n, &cfg, R.streams[r]);
        break;
      default: break;
    }
    INFO(describe(c), " rank ", r, ": ", std::string(wia_get_last_error()));
    REQUIRE(st == WIA_SUCCESS);
  }
  REQUIRE(wia_group_end() == WIA_SUCCESS);
  for (int r = 0; r < p; ++r) {
    const wia_status_t st = wia_stream_synchronize(R.streams[r]);
    INFO(describe(c), " rank ", r, ": ", std::string(wia_get_last_error()));
    REQUIRE(st == WIA_SUCCESS);
  }

  std::vector<int> everyone(p);
  for (int r = 0; r < p; ++r) everyone[r] = r;
  std::uint64_t wrong = 0;
  auto expect = [&](int r, const void* out, std::uint64_t i, long double want) {
    const long double got = load(out, i, c.dtype);
    if (!close_enough(got, want, c.dtype)) {
      if (wrong == 0)
        FAIL_CHECK(describe(c), ": rank ", r, " element ", i, " is ", static_cast<double>(got),
                   ", expected ", static_cast<double>(want));
      ++wrong;
    }
  };
  for (int r = 0; r < p; ++r) {
    switch (c.coll) {
      case WIA_COLLECTIVE_ALLREDUCE:
        for (std::uint64_t i = 0; i < n; ++i) expect(r, recv[r], i, reduce_ref(c.op, c.dtype, p, i, everyone));
        break;
      case WIA_COLLECTIVE_REDUCE:
        if (r == c.root)
          for (std::uint64_t i = 0; i < n; ++i) expect(r, recv[r], i, reduce_ref(c.op, c.dtype, p, i, everyone));
        break;
      case WIA_COLLECTIVE_BROADCAST:
        for (std::uint64_t i = 0; i < n; ++i) expect(r, recv[r], i, input_value(c.root, i, c.op, c.dtype));
        break;
      case WIA_COLLECTIVE_ALLGATHER:
        for (int q = 0; q < p; ++q)
          for (std::uint64_t i = 0; i < n; ++i)
            expect(r, recv[r], q * n + i, input_value(q, i, c.op, c.dtype));
        break;
      case WIA_COLLECTIVE_REDUCE_SCATTER:
        for (std::uint64_t i = 0; i < n; ++i)
          expect(r, recv[r], i, reduce_ref(c.op, c.dtype, p, r * n + i, everyone));
        break;
      case WIA_COLLECTIVE_ALLTOALL:
        // Shard q received by r is shard r of q's input.
        for (int q = 0; q < p; ++q)
          for (std::uint64_t i = 0; i < n; ++i)
            expect(r, recv[r], q * n + i, input_value(q, r * n + i, c.op, c.dtype));
        break;
      default: break;
    }
  }
  for (int r = 0; r < p; ++r) REQUIRE(wia_free(buf[r]) == WIA_SUCCESS);
  return wrong;
}

struct CollAlgos {
  wia_collective_op_t coll;
  std::vector<wia_algorithm_id_t> algos;
};

const std::vector<CollAlgos>& all_algorithms() {
  static const std::vector<CollAlgos> k = {
      {WIA_COLLECTIVE_ALLREDUCE, {WIA_ALGORITHM_RING, WIA_ALGORITHM_TREE, WIA_ALGORITHM_BINOMIAL,
                                  WIA_ALGORITHM_RABENSEIFNER, WIA_ALGORITHM_RECURSIVE_DOUBLING,
                                  WIA_ALGORITHM_DIRECT}},
      {WIA_COLLECTIVE_BROADCAST, {WIA_ALGORITHM_BINOMIAL, WIA_ALGORITHM_CHAIN, WIA_ALGORITHM_SCATTER_ALLGATHER}},
      {WIA_COLLECTIVE_REDUCE, {WIA_ALGORITHM_BINOMIAL, WIA_ALGORITHM_CHAIN}},
      {WIA_COLLECTIVE_ALLGATHER, {WIA_ALGORITHM_RING, WIA_ALGORITHM_RECURSIVE_DOUBLING, WIA_ALGORITHM_BRUCK}},
      {WIA_COLLECTIVE_REDUCE_SCATTER, {WIA_ALGORITHM_RING, WIA_ALGORITHM_RECURSIVE_HALVING}},
      {WIA_COLLECTIVE_ALLTOALL, {WIA_ALGORITHM_DIRECT, WIA_ALGORITHM_PAIRWISE}},
  };
  return k;
}

}  // namespace

TEST_CASE("every collective x algorithm x rank count matches the reference") {
  Library lib;
  const std::vector<int> rank_counts = {1, 2, 3, 4, 5, 7, 8};
  const std::vector<std::uint64_t> counts =
      full_matrix() ? std::vector<std::uint64_t>{0, 1, 7, 4099, (1u << 20) / 4 + 3}
                    : std::vector<std::uint64_t>{0, 1, 7, 4099};
  const std::vector<wia_datatype_t> dtypes =
      full_matrix() ? std::vector<wia_datatype_t>{WIA_INT8, WIA_UINT8, WIA_INT32, WIA_UINT32, WIA_INT64,
                                                  WIA_UINT64, WIA_FLOAT16, WIA_BFLOAT16, WIA_FLOAT32, WIA_FLOAT64}
                    : std::vector<wia_datatype_t>{WIA_INT32, WIA_FLOAT32, WIA_BFLOAT16};
  std::uint64_t wrong = 0, runs = 0;
  for (int p : rank_counts) {
    Ranks R(p);
    for (const auto& ca : all_algorithms())
      for (auto algo : ca.algos)
        for (std::uint64_t n : counts)
          for (auto t : dtypes)
            for (bool in_place : {false, true}) {
              const int root = p > 1 ? (static_cast<int>(n) + 1) % p : 0;
              Case c{ca.coll, algo, p, n, t, WIA_REDUCE_SUM, in_place, root};
              wrong += run_case(R, c);
              ++runs;
            }
  }
  MESSAGE(runs, " runs");
  CHECK(wrong == 0);
}

TEST_CASE("every reduce op and dtype through all-reduce, reduce-scatter and reduce") {
  Library lib;
  std::uint64_t wrong = 0;
  for (int p : {3, 4}) {
    Ranks R(p);
    for (int t = 0; t < WIA_DATATYPE_COUNT; ++t)
      for (int op = 0; op < WIA_REDUCE_OP_COUNT; ++op)
        for (auto coll : {WIA_COLLECTIVE_ALLREDUCE, WIA_COLLECTIVE_REDUCE_SCATTER, WIA_COLLECTIVE_REDUCE}) {
          const wia_algorithm_id_t algo = coll == WIA_COLLECTIVE_REDUCE ? WIA_ALGORITHM_BINOMIAL : WIA_ALGORITHM_RING;
          for (std::uint64_t n : {std::uint64_t(1), std::uint64_t(13), std::uint64_t(1031)}) {
            Case c{coll, algo, p, n, static_cast<wia_datatype_t>(t), static_cast<wia_reduce_op_t>(op), false, 1};
            wrong += run_case(R, c);
          }
        }
  }
  CHECK(wrong == 0);
}

// The in-process engine writes a reduction's result straight into the
// peers' receives, 16 KiB slice by slice (exec_plan.cpp, reduce_and_push);
// in place, a peer's receive is the very input the reduction reads. Chunks
// of several slices with a ragged tail, every all-reduce algorithm of the
// matrix above, both layouts, a dividing op.
// The ctest collectives_fused_push runs it with WIA_TEST_FUSE_MIN_BYTES=0,
// so the fused path is taken at this size (by default only above half an L2).
TEST_CASE("all-reduce blocks of many slices: fused reduce-and-push in and out of place") {
  Library lib;
  std::uint64_t wrong = 0;
  for (int p : {2, 3, 4}) {
    Ranks R(p);
    for (auto algo : all_algorithms()[0].algos)
      for (auto op : {WIA_REDUCE_SUM, WIA_REDUCE_AVG})
        for (bool in_place : {false, true}) {
          // 1 MiB and a ragged tail: at 4 ranks a block's chunk spans several slices.
          Case c{WIA_COLLECTIVE_ALLREDUCE, algo, p, (1u << 18) + 4093, WIA_FLOAT32, op,
                 in_place, 0};
          wrong += run_case(R, c);
        }
  }
  CHECK(wrong == 0);
}

TEST_CASE("AUTO picks an algorithm and reports it with an estimate") {
  Library lib;
  Ranks R(4);
  for (std::uint64_t n : {std::uint64_t(2), std::uint64_t(1) << 20}) {
    Case c{WIA_COLLECTIVE_ALLREDUCE, WIA_ALGORITHM_AUTO, 4, n, WIA_FLOAT32, WIA_REDUCE_SUM, false, 0};
    CHECK(run_case(R, c) == 0);
    const wia_algorithm_t a = wia_get_selected_algorithm(R.comm);
    CHECK(a.id != WIA_ALGORITHM_AUTO);
    CHECK(std::string(a.collective) == "allreduce");
    CHECK(a.estimated_time_ms > 0);
  }
}

TEST_CASE("an algorithm the call forces is run at the chunk count AUTO would give it") {
  // Costed alike, so the two reports agree; with the builder's fixed
  // default instead, a forced pipelined algorithm ran (and was costed)
  // at another chunk count.
  Library lib;
  Ranks R(4);
  for (std::uint64_t n : {std::uint64_t(1) << 16, std::uint64_t(1) << 18, std::uint64_t(1) << 20}) {
    Case c{
        WIA_COLLECTIVE_ALLREDUCE, WIA_ALGORITHM_AUTO, 4, n, WIA_FLOAT32, WIA_REDUCE_SUM, false, 0};
    REQUIRE(run_case(R, c) == 0);
    const wia_algorithm_t chosen = wia_get_selected_algorithm(R.comm);
    c.algo = chosen.id;
    REQUIRE(run_case(R, c) == 0);
    const wia_algorithm_t forced = wia_get_selected_algorithm(R.comm);
    CAPTURE(n);
    const std::string name = chosen.name;
    CAPTURE(name);
    CHECK(forced.id == chosen.id);
    CHECK(forced.estimated_time_ms == doctest::Approx(chosen.estimated_time_ms));
  }
}

TEST_CASE("mismatched calls fail on every rank instead of hanging") {
  Library lib;
  Ranks R(3);
  std::vector<float*> b(3);
  for (int r = 0; r < 3; ++r) REQUIRE(wia_malloc_on(r, reinterpret_cast<void**>(&b[r]), 4096) == WIA_SUCCESS);
  wia_collective_config_t cfg{};
  cfg.reduction_op = WIA_REDUCE_SUM;
  cfg.datatype = WIA_FLOAT32;
  CHECK(wia_all_reduce(R.comm, b[0], b[0], 100, &cfg, R.streams[0]) == WIA_SUCCESS);
  CHECK(wia_all_reduce(R.comm, b[1], b[1], 100, &cfg, R.streams[1]) == WIA_SUCCESS);
  // Rank 2 disagrees on the count: the call that completes the set fails...
  CHECK(wia_all_reduce(R.comm, b[2], b[2], 99, &cfg, R.streams[2]) == WIA_ERROR_MISMATCH);
  CHECK(std::string(wia_get_last_error()).find("count 100 vs 99") != std::string::npos);
  // ...and every other rank sees it on its stream.
  for (int r = 0; r < 2; ++r) {
    CHECK(wia_stream_synchronize(R.streams[r]) == WIA_ERROR_MISMATCH);
    CHECK(std::string(wia_get_last_error()).find("rank 0 and rank 2") != std::string::npos);
  }
  CHECK(wia_stream_synchronize(R.streams[2]) == WIA_ERROR_MISMATCH);
  CHECK(wia_comm_get_async_error(R.comm) == WIA_ERROR_MISMATCH);
  // Broadcast root mismatch, then a good collective still works afterwards.
  CHECK(wia_broadcast(R.comm, b[0], 10, 0, WIA_FLOAT32, R.streams[0]) == WIA_SUCCESS);
  CHECK(wia_broadcast(R.comm, b[1], 10, 1, WIA_FLOAT32, R.streams[1]) == WIA_SUCCESS);
  CHECK(wia_broadcast(R.comm, b[2], 10, 0, WIA_FLOAT32, R.streams[2]) == WIA_ERROR_MISMATCH);
  for (int r = 0; r < 3; ++r) wia_stream_synchronize(R.streams[r]);
  for (int r = 0; r < 3; ++r) b[r][0] = static_cast<float>(r + 1);
  for (int r = 0; r < 3; ++r) CHECK(wia_all_reduce(R.comm, b[r], b[r], 1, &cfg, R.streams[r]) == WIA_SUCCESS);
  for (int r = 0; r < 3; ++r) CHECK(wia_stream_synchronize(R.streams[r]) == WIA_SUCCESS);
  for (int r = 0; r < 3; ++r) CHECK(b[r][0] == 6.0f);
  for (int r = 0; r < 3; ++r) wia_free(b[r]);
}

TEST_CASE("a rank that never posts becomes a timeout naming it, not a hang") {
  Library lib;
  Ranks R(3);
  std::vector<float*> b(3);
  for (int r = 0; r < 3; ++r) REQUIRE(wia_malloc_on(r, reinterpret_cast<void**>(&b[r]), 4096) == WIA_SUCCESS);
  wia_collective_config_t cfg{};
  cfg.datatype = WIA_FLOAT32;
  cfg.timeout_ms = 300;
  CHECK(wia_all_reduce(R.comm, b[0], b[0], 100, &cfg, R.streams[0]) == WIA_SUCCESS);
  CHECK(wia_all_reduce(R.comm, b[1], b[1], 100, &cfg, R.streams[1]) == WIA_SUCCESS);
  CHECK(wia_stream_synchronize(R.streams[0]) == WIA_ERROR_TIMEOUT);
  const std::string msg = wia_get_last_error();
  CHECK(msg.find("rank(s) 2") != std::string::npos);
  CHECK(wia_stream_synchronize(R.streams[1]) == WIA_ERROR_TIMEOUT);
  for (int r = 0; r < 3; ++r) wia_free(b[r]);
}

TEST_CASE("bad arguments return clear errors and post nothing") {
  Library lib;
  Ranks R(2);
  float* b = nullptr;
  REQUIRE(wia_malloc_on(0, reinterpret_cast<void**>(&b), 4096) == WIA_SUCCESS);
  wia_collective_config_t cfg{};
  cfg.datatype = WIA_FLOAT32;
  CHECK(wia_all_reduce(nullptr, b, b, 1, &cfg, R.streams[0]) == WIA_ERROR_INVALID_ARGUMENT);
  CHECK(wia_all_reduce(R.comm, b, b, 1, nullptr, R.streams[0]) == WIA_ERROR_INVALID_ARGUMENT);
  CHECK(wia_all_reduce(R.comm, nullptr, b, 1, &cfg, R.streams[0]) == WIA_ERROR_INVALID_ARGUMENT);
  CHECK(std::string(wia_get_last_error()).find("sendbuf is NULL") != std::string::npos);
  CHECK(wia_all_reduce(R.comm, b, b, 2000, &cfg, R.streams[0]) == WIA_ERROR_INVALID_ARGUMENT);
  CHECK(std::string(wia_get_last_error()).find("remain in its allocation") != std::string::npos);
  CHECK(wia_all_reduce(R.comm, b, b + 1, 100, &cfg, R.streams[0]) == WIA_ERROR_INVALID_ARGUMENT);
  CHECK(std::string(wia_get_last_error()).find("overlap") != std::string::npos);
  CHECK(wia_broadcast(R.comm, b, 1, 5, WIA_FLOAT32, R.streams[0]) == WIA_ERROR_INVALID_ARGUMENT);
  CHECK(std::string(wia_get_last_error()).find("root 5") != std::string::npos);
  cfg.datatype = static_cast<wia_datatype_t>(42);
  CHECK(wia_all_reduce(R.comm, b, b, 1, &cfg, R.streams[0]) == WIA_ERROR_INVALID_ARGUMENT);
  cfg.datatype = WIA_FLOAT32;
  cfg.reduction_op = static_cast<wia_reduce_op_t>(9);
  CHECK(wia_all_reduce(R.comm, b, b, 1, &cfg, R.streams[0]) == WIA_ERROR_INVALID_ARGUMENT);
  cfg.reduction_op = WIA_REDUCE_SUM;
  // A stream whose device is not in the communicator has no rank.
  wia_stream_t other = nullptr;
  REQUIRE(wia_create_stream_on(2, &other) == WIA_SUCCESS);
  CHECK(wia_all_reduce(R.comm, b, b, 1, &cfg, other) == WIA_ERROR_INVALID_ARGUMENT);
  CHECK(std::string(wia_get_last_error()).find("not a member") != std::string::npos);
  wia_destroy_stream(other);
  // Duplicate devices are refused.
  wia_device_t dup[2] = {1, 1};
  wia_communicator_t c2 = nullptr;
  CHECK(wia_create_communicator(dup, 2, &c2) == WIA_ERROR_INVALID_ARGUMENT);
  CHECK(wia_group_end() == WIA_ERROR_INVALID_ARGUMENT);
  wia_free(b);
}

namespace {
void slow_producer(void* p) {
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  auto* v = static_cast<float*>(p);
  for (int i = 0; i < 1024; ++i) v[i] = 1.0f;
}
}  // namespace

TEST_CASE("collectives are ordered after earlier stream work and before later work") {
  Library lib;
  Ranks R(2);
  std::vector<float*> b(2), after(2);
  for (int r = 0; r < 2; ++r) {
    REQUIRE(wia_malloc_on(r, reinterpret_cast<void**>(&b[r]), 1024 * 4) == WIA_SUCCESS);
    REQUIRE(wia_malloc_on(r, reinterpret_cast<void**>(&after[r]), 1024 * 4) == WIA_SUCCESS);
    std::fill(b[r], b[r] + 1024, -100.0f);
  }
  wia_collective_config_t cfg{};
  cfg.datatype = WIA_FLOAT32;
  for (int r = 0; r < 2; ++r) {
    // The input is produced on the stream after the call would have started.
    REQUIRE(wia_launch_host_func(R.streams[r], slow_producer, b[r]) == WIA_SUCCESS);
    REQUIRE(wia_all_reduce(R.comm, b[r], b[r], 1024, &cfg, R.streams[r]) == WIA_SUCCESS);
    REQUIRE(wia_memcpy_async(after[r], b[r], 1024 * 4, R.streams[r]) == WIA_SUCCESS);
  }
  for (int r = 0; r < 2; ++r) REQUIRE(wia_stream_synchronize(R.streams[r]) == WIA_SUCCESS);
  for (int r = 0; r < 2; ++r) {
    CHECK(b[r][0] == 2.0f);
    CHECK(b[r][1023] == 2.0f);
    CHECK(after[r][512] == 2.0f);
  }
  for (int r = 0; r < 2; ++r) wia_free(b[r]), wia_free(after[r]);
}

TEST_CASE("point-to-point: ordered matching, mismatches and timeouts name both ranks") {
  Library lib;
  Ranks R(3);
  std::vector<std::int32_t*> b(3);
  for (int r = 0; r < 3; ++r) REQUIRE(wia_malloc_on(r, reinterpret_cast<void**>(&b[r]), 4096) == WIA_SUCCESS);
  for (int i = 0; i < 100; ++i) b[0][i] = i, b[2][i] = 1000 + i;
  // Two messages 0 -> 1 and one 2 -> 1, received in posting order per pair.
  REQUIRE(wia_comm_recv(R.comm, b[1] + 200, 10, WIA_INT32, 2, R.streams[1]) == WIA_SUCCESS);
  REQUIRE(wia_comm_recv(R.comm, b[1], 50, WIA_INT32, 0, R.streams[1]) == WIA_SUCCESS);
  REQUIRE(wia_comm_recv(R.comm, b[1] + 100, 50, WIA_INT32, 0, R.streams[1]) == WIA_SUCCESS);
  REQUIRE(wia_comm_send(R.comm, b[0], 50, WIA_INT32, 1, R.streams[0]) == WIA_SUCCESS);
  REQUIRE(wia_comm_send(R.comm, b[0] + 50, 50, WIA_INT32, 1, R.streams[0]) == WIA_SUCCESS);
  REQUIRE(wia_comm_send(R.comm, b[2], 10, WIA_INT32, 1, R.streams[2]) == WIA_SUCCESS);
  for (int r = 0; r < 3; ++r) REQUIRE(wia_stream_synchronize(R.streams[r]) == WIA_SUCCESS);
  for (int i = 0; i < 50; ++i) {
    CHECK(b[1][i] == i);
    CHECK(b[1][100 + i] == 50 + i);
  }
  for (int i = 0; i < 10; ++i) CHECK(b[1][200 + i] == 1000 + i);

  // A count disagreement fails both sides.
  REQUIRE(wia_comm_send(R.comm, b[0], 5, WIA_INT32, 2, R.streams[0]) == WIA_SUCCESS);
  REQUIRE(wia_comm_recv(R.comm, b[2], 6, WIA_INT32, 0, R.streams[2]) == WIA_SUCCESS);
  CHECK(wia_stream_synchronize(R.streams[2]) == WIA_ERROR_MISMATCH);
  CHECK(std::string(wia_get_last_error()).find("sent 5 x int32, receive posted for 6") !=
        std::string::npos);
  CHECK(wia_stream_synchronize(R.streams[0]) == WIA_ERROR_MISMATCH);

  CHECK(wia_comm_send(R.comm, b[0], 1, WIA_INT32, 0, R.streams[0]) == WIA_ERROR_INVALID_ARGUMENT);
  CHECK(wia_comm_send(R.comm, b[0], 1, WIA_INT32, 7, R.streams[0]) == WIA_ERROR_INVALID_ARGUMENT);
  for (int r = 0; r < 3; ++r) wia_free(b[r]);
}

TEST_CASE("point-to-point: a receive with no sender times out naming the sender") {
  Library lib("host:\n  devices: 2\ncollectives:\n  timeout_ms: 200\n");
  Ranks R(2);
  int* b = nullptr;
  REQUIRE(wia_malloc_on(1, reinterpret_cast<void**>(&b), 64) == WIA_SUCCESS);
  REQUIRE(wia_comm_recv(R.comm, b, 4, WIA_INT32, 0, R.streams[1]) == WIA_SUCCESS);
  CHECK(wia_stream_synchronize(R.streams[1]) == WIA_ERROR_TIMEOUT);
  CHECK(std::string(wia_get_last_error()).find("rank 0 posted 0 send(s) to rank 1") !=
        std::string::npos);
  wia_free(b);
}

TEST_CASE("wia_finalize releases live communicators; their handles are invalid afterwards") {
  Library lib("host:\n  devices: 2\n");
  wia_device_t devs[2] = {0, 1};
  wia_communicator_t comm = nullptr;
  REQUIRE(wia_create_communicator(devs, 2, &comm) == WIA_SUCCESS);
  float* b[2];
  wia_collective_config_t cfg{};
  cfg.datatype = WIA_FLOAT32;
  for (int r = 0; r < 2; ++r) {
    REQUIRE(wia_malloc_on(r, reinterpret_cast<void**>(&b[r]), 64) == WIA_SUCCESS);
    b[r][0] = 1.0f;
    REQUIRE(wia_set_device(r) == WIA_SUCCESS);
    REQUIRE(wia_all_reduce(comm, b[r], b[r], 1, &cfg, nullptr) == WIA_SUCCESS);
  }
  CHECK(wia_finalize() == WIA_SUCCESS);  // drains the posted all-reduce first
  REQUIRE(wia_init_with_config(lib.path.c_str()) == WIA_SUCCESS);
  CHECK(wia_comm_size(comm) == -1);
  CHECK(std::string(wia_get_last_error()).find("not live") != std::string::npos);
  CHECK(wia_destroy_communicator(comm) == WIA_ERROR_INVALID_HANDLE);
}

TEST_CASE("ranks may mix in-place and out-of-place calls in one collective") {
  Library lib;
  Ranks R(3);
  const std::uint64_t n = 1031;
  wia_collective_config_t cfg{};
  cfg.datatype = WIA_FLOAT32;
  cfg.reduction_op = WIA_REDUCE_SUM;
  for (auto coll : {WIA_COLLECTIVE_ALLREDUCE, WIA_COLLECTIVE_ALLGATHER,
                    WIA_COLLECTIVE_REDUCE_SCATTER}) {
    std::vector<float*> in(3), out(3);
    for (int r = 0; r < 3; ++r) {
      REQUIRE(wia_malloc_on(r, reinterpret_cast<void**>(&in[r]), 3 * n * 4) == WIA_SUCCESS);
      REQUIRE(wia_malloc_on(r, reinterpret_cast<void**>(&out[r]), 3 * n * 4) == WIA_SUCCESS);
    }
    // Rank 0 in place (input laid out inside its output as NCCL defines),
    // ranks 1 and 2 out of place. Element i of rank r's input: r + i % 5.
    for (int r = 0; r < 3; ++r) {
      const std::uint64_t elems = coll == WIA_COLLECTIVE_REDUCE_SCATTER ? 3 * n : n;
      // All-gather in place: rank 0's input is its output block 0.
      float* input = r == 0 ? out[0] : in[r];
      for (std::uint64_t i = 0; i < elems; ++i) input[i] = static_cast<float>(r + i % 5);
    }
    for (int r = 0; r < 3; ++r) {
      const bool ip = r == 0;
      wia_status_t st = WIA_SUCCESS;
      cfg.operation = coll;
      if (coll == WIA_COLLECTIVE_ALLREDUCE)
        st = wia_all_reduce(R.comm, ip ? out[0] : in[r], out[r], n, &cfg, R.streams[r]);
      else if (coll == WIA_COLLECTIVE_ALLGATHER)
        st = wia_all_gather_ex(R.comm, ip ? out[0] : in[r], out[r], n, &cfg, R.streams[r]);
      else
        st = wia_reduce_scatter(R.comm, ip ? out[0] : in[r], ip ? out[0] : out[r], n, &cfg,
                                R.streams[r]);
      INFO(std::string(wia_get_last_error()));
      REQUIRE(st == WIA_SUCCESS);
    }
    for (int r = 0; r < 3; ++r) REQUIRE(wia_stream_synchronize(R.streams[r]) == WIA_SUCCESS);
    std::uint64_t wrong = 0;
    for (int r = 0; r < 3; ++r)
      for (std::uint64_t i = 0; i < n; ++i) {
        if (coll == WIA_COLLECTIVE_ALLREDUCE) {
          wrong += out[r][i] != static_cast<float>(3 + 3 * (i % 5));
        } else if (coll == WIA_COLLECTIVE_ALLGATHER) {
          for (int q = 0; q < 3; ++q) wrong += out[r][q * n + i] != static_cast<float>(q + i % 5);
        } else {
          const std::uint64_t g = r * n + i;  // reduced element of the full vector
          const float got = r == 0 ? out[0][g] : out[r][i];
          wrong += got != static_cast<float>(3 + 3 * (g % 5));
        }
      }
    CHECK_MESSAGE(wrong == 0, "collective ", coll);
    for (int r = 0; r < 3; ++r) wia_free(in[r]), wia_free(out[r]);
  }
}

// Device memory the core must not touch (host.host_accessible: false makes
// the host provider announce its memory like a GPU's): the inline engine
// refuses, and auto runs collectives through the provider's own copies and
// reductions on device streams, directly between peers or staged through
// host memory when peer access is off.
TEST_CASE("device engine: memory the core cannot address") {
  SUBCASE("inline is refused with a message naming the key") {
    Library lib("host:\n  devices: 2\n  host_accessible: false\ncollectives:\n  engine: inline\n");
    wia_device_t devs[2] = {0, 1};
    wia_communicator_t comm = nullptr;
    CHECK(wia_create_communicator(devs, 2, &comm) == WIA_ERROR_NOT_SUPPORTED);
    CHECK(std::string(wia_get_last_error()).find("collectives.engine is 'inline'") !=
          std::string::npos);
  }
  for (const char* peer : {"true", "false"}) {
    SUBCASE((std::string("auto picks the device engine, peer_access=") + peer).c_str()) {
      Library lib(std::string("host:\n  devices: 5\n  host_accessible: false\n  peer_access: ") +
                  peer + "\n");
      std::uint64_t wrong = 0;
      for (int p : {2, 5}) {
        Ranks R(p);
        for (const auto& ca : all_algorithms())
          for (auto algo : ca.algos)
            for (std::uint64_t n : {std::uint64_t(1), std::uint64_t(4099)})
              for (bool in_place : {false, true}) {
                Case c{ca.coll, algo, p, n, WIA_FLOAT32, WIA_REDUCE_AVG, in_place, p - 1};
                wrong += run_case(R, c);
              }
        // Point-to-point copies in the core, so it says it cannot.
        float* b = nullptr;
        REQUIRE(wia_malloc_on(0, reinterpret_cast<void**>(&b), 64) == WIA_SUCCESS);
        CHECK(wia_comm_send(R.comm, b, 4, WIA_FLOAT32, 1, R.streams[0]) == WIA_ERROR_NOT_SUPPORTED);
        wia_free(b);
      }
      CHECK(wrong == 0);
    }
  }
}

TEST_CASE("wia_comm_discover_topology of a device communicator: its devices in rank order") {
  Library lib("host:\n  devices: 3\n");
  wia_device_t devs[2] = {2, 0};
  wia_communicator_t comm = nullptr;
  REQUIRE(wia_create_communicator(devs, 2, &comm) == WIA_SUCCESS);
  wia_topology_t all, mine;
  REQUIRE(wia_discover_topology(&all) == WIA_SUCCESS);
  REQUIRE(wia_comm_discover_topology(comm, &mine) == WIA_SUCCESS);
  CHECK(mine.num_devices == 2);
  CHECK(std::string(mine.link_type[0][1]) == all.link_type[2][0]);
  CHECK(mine.bandwidth_gbps[0][1] == all.bandwidth_gbps[2][0]);
  CHECK(std::string(mine.link_type[0][0]) == "self");
  wia_free_topology(&all);
  wia_free_topology(&mine);
  wia_destroy_communicator(comm);
}

// wia-bw writes measured links to a topology file; tuner.link_file makes a
// communicator's cost model use them: the same all-reduce is estimated
// slower over links measured 1000x slower.
TEST_CASE("tuner.link_file: measured links replace the default figures") {
  double fast_ms = 0, slow_ms = 0;
  char path[] = "/tmp/wia-links-XXXXXX.yaml";
  {
    Library lib("host:\n  devices: 2\n");
    const int fd = mkstemps(path, 5);
    REQUIRE(fd >= 0);
    close(fd);
    wia_topology_t t;
    REQUIRE(wia_discover_topology(&t) == WIA_SUCCESS);
    REQUIRE(t.num_devices == 2);
    t.bandwidth_gbps[0][1] = t.bandwidth_gbps[1][0] = 0.01;  // 10 MB/s
    t.latency_us[0][1] = t.latency_us[1][0] = 500;
    REQUIRE(wia_export_topology_yaml(&t, path) == WIA_SUCCESS);
    wia_free_topology(&t);
    Ranks R(2);
    Case c{WIA_COLLECTIVE_ALLREDUCE, WIA_ALGORITHM_AUTO, 2, 1 << 16, WIA_FLOAT32, WIA_REDUCE_SUM,
           false, 0};
    CHECK(run_case(R, c) == 0);
    fast_ms = wia_get_selected_algorithm(R.comm).estimated_time_ms;
  }
  {
    Library lib(std::string("host:\n  devices: 2\ntuner:\n  link_file: ") + path + "\n");
    Ranks R(2);
    Case c{WIA_COLLECTIVE_ALLREDUCE, WIA_ALGORITHM_AUTO, 2, 1 << 16, WIA_FLOAT32, WIA_REDUCE_SUM,
           false, 0};
    CHECK(run_case(R, c) == 0);
    slow_ms = wia_get_selected_algorithm(R.comm).estimated_time_ms;
  }
  std::remove(path);
  INFO("default " << fast_ms << " ms, measured " << slow_ms << " ms");
  CHECK(slow_ms > 100 * fast_ms);
}
