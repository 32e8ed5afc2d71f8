// SPDX-License-Identifier: Apache-2.0
// Structural properties of the schedules, independent of data: argument
// validation, single-rank builds, tag uniqueness, declared symmetry,
// degenerate sizes, compactness.
#include <doctest/doctest.h>

#include <cstring>
#include <map>
#include <set>
#include <string>
#include <tuple>

#include "coll/registry.hpp"
#include "common/error.hpp"
#include "support/sim_executor.hpp"

namespace wia::coll {
namespace {

static_assert(sizeof(Step) == 64, "keep steps compact: schedules are O(messages)");

CollArgs args_for(const AlgorithmInfo& info, std::int32_t p, std::uint64_t count,
                  std::uint32_t chunks = 0, bool in_place = false) {
  CollArgs a;
  a.collective = info.collective;
  a.algorithm = info.algorithm;
  a.op = WIA_REDUCE_AVG;
  a.dtype = WIA_FLOAT32;
  a.count = count;
  a.nranks = p;
  a.root = p > 2 ? 2 : 0;
  a.options.num_chunks = chunks;
  a.options.in_place = in_place;
  return a;
}

std::string expect_invalid(const CollArgs& a, std::int32_t only_rank = kAllRanks) {
  try {
    build_schedule(a, only_rank);
  } catch (const Error& e) {
    CHECK(e.status() == WIA_ERROR_INVALID_ARGUMENT);
    return e.what();
  }
  FAIL("no exception");
  return {};
}

// What a C caller can pass: a value outside the enum's range (casting it in
// C++ would be undefined, so write the representation).
template <typename E>
void set_raw(E& e, int value) {
  static_assert(sizeof(E) == sizeof(int));
  std::memcpy(&e, &value, sizeof(int));
}

bool same_step(const Step& a, const Step& b) {
  auto reg = [](const Region& r) { return std::tie(r.kind, r.shard, r.offset); };
  return a.kind == b.kind && a.peer == b.peer && a.tag == b.tag && a.divisor == b.divisor &&
         a.count == b.count && reg(a.src) == reg(b.src) && reg(a.dst) == reg(b.dst) &&
         a.dep_count == b.dep_count;
}

}  // namespace

TEST_CASE("schedule: invalid arguments are rejected with the bad value named") {
  const AlgorithmInfo& ring = *find_algorithm(Collective::kAllReduce, Algorithm::kRing);
  CollArgs a = args_for(ring, 4, 100);
  a.nranks = 0;
  CHECK(expect_invalid(a).find("nranks 0") != std::string::npos);
  a.nranks = -3;
  CHECK(expect_invalid(a).find("nranks -3") != std::string::npos);

  a = args_for(*find_algorithm(Collective::kBroadcast, Algorithm::kChain), 4, 100);
  a.root = 4;
  CHECK(expect_invalid(a).find("root 4") != std::string::npos);
  a.root = -1;
  CHECK(expect_invalid(a).find("root -1") != std::string::npos);

  a = args_for(ring, 4, 100);
  set_raw(a.dtype, 42);
  CHECK(expect_invalid(a).find("datatype 42") != std::string::npos);
  a = args_for(ring, 4, 100);
  set_raw(a.op, 77);
  CHECK(expect_invalid(a).find("reduce op 77") != std::string::npos);
  // The op of a non-reducing collective is irrelevant.
  a = args_for(*find_algorithm(Collective::kAllGather, Algorithm::kRing), 4, 100);
  set_raw(a.op, 77);
  CHECK_NOTHROW(build_schedule(a));

  a = args_for(ring, 4, 100);
  a.collective = Collective::kAllToAll;  // has no ring
  CHECK(expect_invalid(a).find("algorithm") != std::string::npos);
  a = args_for(ring, 4, 100);
  CHECK(expect_invalid(a, 4).find("rank 4") != std::string::npos);
  a.count = ~std::uint64_t{0} / 2;
  CHECK(expect_invalid(a).find("overflows") != std::string::npos);
}

TEST_CASE("schedule: auto resolves through the size heuristic") {
  CollArgs a;
  a.collective = Collective::kAllReduce;
  a.algorithm = Algorithm::kAuto;
  a.nranks = 8;
  a.count = 2;
  CHECK(build_schedule(a).algorithm == Algorithm::kRecursiveDoubling);
  a.count = 1 << 24;
  CHECK(build_schedule(a).algorithm == Algorithm::kRing);
}

TEST_CASE("schedule: every algorithm has a unique name per collective") {
  std::set<std::pair<int, std::string>> seen;
  for (const AlgorithmInfo& info : algorithms()) {
    CHECK(seen.insert({static_cast<int>(info.collective), info.name}).second);
    CHECK(std::string(info.name) == algorithm_name(info.algorithm));
    CHECK(find_algorithm(info.collective, std::string_view(info.name)) == &info);
  }
  CHECK(find_algorithm(Collective::kAllReduce, std::string_view("nope")) == nullptr);
}

TEST_CASE("schedule: a single-rank build equals that rank of the full build") {
  for (const AlgorithmInfo& info : algorithms()) {
    for (std::int32_t p : {1, 2, 3, 5, 8, 9}) {
      for (bool ip : {false, true}) {
        const CollArgs a = args_for(info, p, 1001, 3, ip);
        const Schedule full = build_schedule(a);
        for (std::int32_t r = 0; r < p; ++r) {
          const Schedule one = build_schedule(a, r);
          INFO(full.describe() << " rank " << r);
          for (std::int32_t q = 0; q < p; ++q) CHECK(one.programs[q].built == (q == r));
          const RankProgram& x = full.programs[r];
          const RankProgram& y = one.programs[r];
          REQUIRE(x.steps.size() == y.steps.size());
          for (std::size_t i = 0; i < x.steps.size(); ++i) CHECK(same_step(x.steps[i], y.steps[i]));
          CHECK(x.deps == y.deps);
          CHECK(x.sizes.scratch == y.sizes.scratch);
          CHECK(x.sizes.send == y.sizes.send);
          CHECK(x.sizes.recv == y.sizes.recv);
        }
      }
    }
  }
}

TEST_CASE("schedule: (src, dst, tag) identifies one message") {
  for (const AlgorithmInfo& info : algorithms()) {
    for (std::int32_t p : {2, 3, 4, 6, 7, 8, 13, 16}) {
      for (std::uint32_t chunks : {1u, 4u}) {
        const Schedule s = build_schedule(args_for(info, p, 997, chunks));
        std::set<std::tuple<int, int, std::uint32_t>> sends;
        for (std::int32_t r = 0; r < p; ++r)
          for (const Step& st : s.programs[r].steps)
            if (st.is_send())
              CHECK_MESSAGE(sends.insert({r, st.peer, st.tag}).second, s.describe());
        CHECK(validate_schedule(s).ok());
      }
    }
  }
}

TEST_CASE("schedule: declared symmetry holds") {
  // Rank r's program is rank 0's with peers rotated (or XORed) by r. When
  // every partition divides evenly, even the counts agree; otherwise they
  // may differ by the uneven-partition element.
  for (const AlgorithmInfo& info : algorithms()) {
    for (std::int32_t p : {2, 3, 4, 5, 8, 16}) {
      for (std::uint64_t count : {std::uint64_t{16 * 9 * 5 * 7}, std::uint64_t{1001},
                                  std::uint64_t{7}, std::uint64_t{2}}) {
        const Schedule s = build_schedule(args_for(info, p, count, 2));
        if (s.symmetry == Symmetry::kNone) continue;
        INFO(s.describe());
        const bool even = count == 16 * 9 * 5 * 7;
        const RankProgram& base = s.programs[0];
        for (std::int32_t r = 1; r < p; ++r) {
          const RankProgram& prog = s.programs[r];
          REQUIRE(prog.steps.size() == base.steps.size());
          for (std::size_t i = 0; i < prog.steps.size(); ++i) {
            const Step& a = base.steps[i];
            const Step& b = prog.steps[i];
            CHECK(a.kind == b.kind);
            CHECK(a.tag == b.tag);
            if (even) CHECK(a.count == b.count);
            if (a.peer >= 0) {
              const std::int32_t mapped =
                  s.symmetry == Symmetry::kXor ? (a.peer ^ r) : (a.peer + r) % p;
              CHECK(b.peer == mapped);
            }
          }
          CHECK(prog.deps == base.deps);
        }
      }
    }
  }
}

TEST_CASE("schedule: count 0 has no steps and nranks 1 is a copy or nothing") {
  for (const AlgorithmInfo& info : algorithms()) {
    for (std::int32_t p : {1, 2, 7}) {
      const Schedule s = build_schedule(args_for(info, p, 0));
      CHECK_MESSAGE(s.total_steps() == 0, s.describe());
    }
    for (bool ip : {false, true}) {
      const Schedule s = build_schedule(args_for(info, 1, 1234, 0, ip));
      INFO(s.describe());
      if (ip) {
        CHECK(s.total_steps() == 0);
      } else {
        REQUIRE(s.total_steps() == 1);
        CHECK(s.programs[0].steps[0].kind == StepKind::kCopy);
        CHECK(s.programs[0].steps[0].count == 1234);
      }
    }
  }
}

TEST_CASE("schedule: size is independent of the payload") {
  for (const AlgorithmInfo& info : algorithms()) {
    const Schedule small = build_schedule(args_for(info, 8, 1 << 12, 4));
    const Schedule huge = build_schedule(args_for(info, 8, std::uint64_t{1} << 34, 4));
    CHECK_MESSAGE(small.total_steps() == huge.total_steps(), huge.describe());
  }
}

TEST_CASE("schedule: chunks are capped by the elements available") {
  const AlgorithmInfo& ring = *find_algorithm(Collective::kAllReduce, Algorithm::kRing);
  CHECK(build_schedule(args_for(ring, 4, 1000, 8)).num_chunks == 8);
  CHECK(build_schedule(args_for(ring, 4, 10, 8)).num_chunks == 3);  // blocks of 3, 3, 2, 2
  const AlgorithmInfo& chain = *find_algorithm(Collective::kBroadcast, Algorithm::kChain);
  CHECK(build_schedule(args_for(chain, 4, 5, 64)).num_chunks == 5);
  // Default: about 128 KiB per chunk for the tree/chain family.
  CHECK(build_schedule(args_for(chain, 4, (1 << 20) / 4)).num_chunks == 8);
}

TEST_CASE("schedule: scratch stays within each algorithm's documented bound") {
  const std::uint64_t c = 1000;
  for (const AlgorithmInfo& info : algorithms()) {
    for (std::int32_t p : {2, 3, 4, 7, 8}) {
      for (bool ip : {false, true}) {
        const Schedule s = build_schedule(args_for(info, p, c, 2, ip));
        std::uint64_t most = 0;
        for (const auto& prog : s.programs) most = std::max(most, prog.sizes.scratch);
        const auto pc = c * static_cast<std::uint64_t>(p);
        std::uint64_t bound = 0;
        switch (info.collective) {
          case Collective::kAllReduce:
            // Hierarchical: non-leaders accumulate its phase-1 reduce
            // (and its leader phase may be recursive doubling).
            // One-shot in place: the input moved aside.
            bound = info.algorithm == Algorithm::kRecursiveDoubling ||
                            info.algorithm == Algorithm::kHierarchical ||
                            info.algorithm == Algorithm::kOneShot
                        ? c
                        : 0;
            break;
          case Collective::kReduce:
            bound = c;
            break;
          case Collective::kReduceScatter:
            bound = info.algorithm == Algorithm::kRing ? 2 * c : pc;
            break;
          case Collective::kAllToAll:
            bound = ip ? pc - c : 0;
            break;
          case Collective::kSendRecv:
            bound = ip ? c : 0;
            break;
          default:
            bound = 0;
            break;
        }
        CHECK_MESSAGE(most <= bound, s.describe() << " uses " << most << " scratch elements");
      }
    }
  }
}

}  // namespace wia::coll
