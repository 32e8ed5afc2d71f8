// SPDX-License-Identifier: Apache-2.0
// Every collective x every algorithm, executed on the simulated network and
// checked element by element against an independent reference
// (reference.hpp documents values, tolerances and poisoning).
//
// CI runs a sampled matrix: all algorithms x nranks 1..8 x counts
// {0, 1, 7, 840, 2519, 4099} x in/out of place, with (dtype, op) rotating
// over int32/float32/bfloat16 x all ops, plus every one of the 10 dtypes
// with every op on a few rank counts. WIA_FULL_MATRIX=1 runs the full
// product (int32/float32/bfloat16 x all 5 ops for every point, chunk counts
// 1 and 3 for pipelined algorithms, all 10 dtypes on nranks 3, 5, 8):
//   WIA_FULL_MATRIX=1 build/h3/bin/test_coll -tc='*matrix*'
// Each case runs with a random ready-step order, alternating eager and
// rendezvous sends, and with the intra-rank race check.
#include <doctest/doctest.h>

#include <cstdlib>
#include <vector>

#include "coll/registry.hpp"
#include "reference.hpp"

namespace wia::coll::test {
namespace {

bool full_matrix() {
  const char* e = std::getenv("WIA_FULL_MATRIX");
  return e != nullptr && e[0] != '\0' && e[0] != '0';
}

constexpr wia_reduce_op_t kOps[] = {WIA_REDUCE_SUM, WIA_REDUCE_PROD, WIA_REDUCE_MIN, WIA_REDUCE_MAX,
                                    WIA_REDUCE_AVG};
constexpr wia_datatype_t kSweepTypes[] = {WIA_INT32, WIA_FLOAT32, WIA_BFLOAT16};

struct Tally {
  int cases = 0;
  int failures = 0;
};

void check(const Case& c, Tally& tally) {
  ++tally.cases;
  const std::string err = run_case(c);
  if (err.empty()) return;
  ++tally.failures;
  // Report a bounded number of failures with their full description.
  if (tally.failures <= 20) FAIL_CHECK(c.describe() << "\n" << err);
}

Case make(const AlgorithmInfo& info, std::int32_t p, std::uint64_t count, wia_datatype_t t,
          wia_reduce_op_t op, bool in_place, std::uint32_t chunks, std::uint64_t salt) {
  Case c;
  c.collective = info.collective;
  c.algorithm = info.algorithm;
  c.nranks = p;
  c.count = count;
  c.dtype = t;
  c.op = op;
  c.in_place = in_place;
  c.num_chunks = chunks;
  // Vary the root and the send-recv shift with the point.
  c.root = static_cast<std::int32_t>((count + salt) % static_cast<std::uint64_t>(p));
  c.peer_offset = 1 + static_cast<std::int32_t>(salt % 3);
  c.sim.seed = salt * 0x9e3779b97f4a7c15ull + 1;
  c.sim.rendezvous = (salt % 2) == 1;
  c.sim.check_races = true;
  return c;
}

}  // namespace

TEST_CASE("matrix: every algorithm matches the reference on the simulated network") {
  const bool full = full_matrix();
  const std::vector<std::uint64_t> counts = {0, 1, 7, 840, 2519, 4099};
  Tally tally;
  std::uint64_t salt = 0;
  for (const AlgorithmInfo& info : algorithms()) {
    const bool reducing = is_reducing(info.collective);
    std::vector<std::uint32_t> chunk_opts{0};
    if (info.pipelined)
      chunk_opts = full ? std::vector<std::uint32_t>{1, 3} : std::vector<std::uint32_t>{0, 3};
    for (std::int32_t p = 1; p <= 8; ++p) {
      for (std::size_t ci = 0; ci < counts.size(); ++ci) {
        for (bool ip : {false, true}) {
          for (std::uint32_t chunks : chunk_opts) {
            if (full) {
              for (wia_datatype_t t : kSweepTypes)
                for (wia_reduce_op_t op : kOps) {
                  if (!reducing && op != WIA_REDUCE_SUM) continue;
                  check(make(info, p, counts[ci], t, op, ip, chunks, ++salt), tally);
                }
            } else {
              // One (dtype, op) per point, rotating through all 15 pairs.
              ++salt;
              const wia_datatype_t t = kSweepTypes[salt % 3];
              const wia_reduce_op_t op = kOps[(salt / 3) % 5];
              check(make(info, p, counts[ci], t, op, ip, chunks, salt), tally);
            }
          }
        }
      }
    }
  }
  MESSAGE(tally.cases << " cases, " << tally.failures << " failures"
                      << std::string(full ? " (full matrix)"
                                          : " (CI sample; WIA_FULL_MATRIX=1 for all)"));
  CHECK(tally.failures == 0);
}

TEST_CASE("matrix: all 10 datatypes with every op") {
  const bool full = full_matrix();
  const std::vector<std::int32_t> ranks =
      full ? std::vector<std::int32_t>{3, 5, 8} : std::vector<std::int32_t>{3, 8};
  const std::vector<std::uint64_t> counts =
      full ? std::vector<std::uint64_t>{1, 7, 2519} : std::vector<std::uint64_t>{7, 515};
  Tally tally;
  std::uint64_t salt = 1000;
  for (const AlgorithmInfo& info : algorithms()) {
    const bool reducing = is_reducing(info.collective);
    for (std::int32_t p : ranks)
      for (std::uint64_t count : counts)
        for (int t = 0; t < WIA_DATATYPE_COUNT; ++t)
          for (wia_reduce_op_t op : kOps) {
            if (!reducing && op != WIA_REDUCE_SUM) continue;
            ++salt;
            check(make(info, p, count, static_cast<wia_datatype_t>(t), op, salt % 3 == 0,
                       info.pipelined ? 2 : 0, salt),
                  tally);
          }
  }
  MESSAGE(tally.cases << " cases, " << tally.failures << " failures");
  CHECK(tally.failures == 0);
}

}  // namespace wia::coll::test
