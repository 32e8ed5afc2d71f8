// SPDX-License-Identifier: Apache-2.0
// Hierarchical all-reduce (spec 6.6.1) and what it is built from: the rank
// grouping (RankGroups), the sub-schedule embedding helper, the registry's
// candidate rule, and the two-level link model under which the tuner
// prefers it. Schedules are executed on the simulated network against the
// independent reference (reference.hpp) for many groupings.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "coll/embed.hpp"
#include "coll/registry.hpp"
#include "common/error.hpp"
#include "reference.hpp"
#include "support/sim_executor.hpp"
#include "tuner/cost_model.hpp"

namespace wia::coll {
namespace {

std::shared_ptr<const RankGroups> groups_of(std::vector<std::int32_t> labels) {
  return std::make_shared<const RankGroups>(std::move(labels));
}

// Groupings of p ranks worth testing, each with a name for messages.
std::vector<std::pair<std::string, std::shared_ptr<const RankGroups>>> groupings(
    std::int32_t p, std::mt19937& rng) {
  std::vector<std::pair<std::string, std::shared_ptr<const RankGroups>>> out;
  out.emplace_back("none", nullptr);
  std::vector<std::int32_t> v(static_cast<std::size_t>(p));
  std::iota(v.begin(), v.end(), 0);
  out.emplace_back("alone", groups_of(v));
  out.emplace_back("one group", groups_of(std::vector<std::int32_t>(v.size(), 42)));
  if (p >= 2) {
    // Two nodes, contiguous, as even as possible.
    for (std::int32_t r = 0; r < p; ++r) v[static_cast<std::size_t>(r)] = r < (p + 1) / 2 ? 0 : 1;
    out.emplace_back("2 contiguous", groups_of(v));
    // Uneven: all but the last rank on node A.
    for (std::int32_t r = 0; r < p; ++r) v[static_cast<std::size_t>(r)] = r + 1 < p ? 7 : 3;
    out.emplace_back("p-1 + 1", groups_of(v));
    // Uneven the other way: rank 0 alone (a singleton leader group first).
    for (std::int32_t r = 0; r < p; ++r) v[static_cast<std::size_t>(r)] = r == 0 ? 5 : 9;
    out.emplace_back("1 + p-1", groups_of(v));
  }
  if (p >= 3) {
    // Round-robin over 3 nodes: non-contiguous members.
    for (std::int32_t r = 0; r < p; ++r) v[static_cast<std::size_t>(r)] = r % 3;
    out.emplace_back("round robin 3", groups_of(v));
    // Random labels over random node counts: shuffled, uneven.
    for (int i = 0; i < 2; ++i) {
      const int nodes = 2 + static_cast<int>(rng() % static_cast<unsigned>(p - 1));
      for (auto& x : v) x = static_cast<std::int32_t>(rng() % static_cast<unsigned>(nodes)) * 11;
      out.emplace_back("random", groups_of(v));
    }
  }
  return out;
}

CollArgs hier_args(std::int32_t p, std::uint64_t count, std::shared_ptr<const RankGroups> g,
                   bool in_place = false, std::uint32_t chunks = 0) {
  CollArgs a;
  a.collective = Collective::kAllReduce;
  a.algorithm = Algorithm::kHierarchical;
  a.op = WIA_REDUCE_AVG;
  a.dtype = WIA_FLOAT32;
  a.count = count;
  a.nranks = p;
  a.options.in_place = in_place;
  a.options.num_chunks = chunks;
  a.options.groups = std::move(g);
  return a;
}

}  // namespace

TEST_CASE("groups: canonical numbering, leaders, members and a partition-only fingerprint") {
  const RankGroups g({4, 9, 4, 9, 1});
  CHECK(g.nranks() == 5);
  CHECK(g.ngroups() == 3);
  // Groups are numbered by their lowest rank: {0,2}, {1,3}, {4}.
  CHECK(g.group(0) == 0);
  CHECK(g.group(1) == 1);
  CHECK(g.group(2) == 0);
  CHECK(g.group(4) == 2);
  CHECK(std::vector<std::int32_t>(g.members(1).begin(), g.members(1).end()) ==
        std::vector<std::int32_t>{1, 3});
  CHECK(g.leader(0) == 0);
  CHECK(g.leader(1) == 1);
  CHECK(g.leader(2) == 4);
  CHECK(g.local_rank(3) == 1);
  CHECK(g.local_rank(4) == 0);
  CHECK(g.largest_group_size() == 2);
  CHECK(g.group_of_rank()[1] == 9);  // labels kept as given

  // Same partition, other labels: same fingerprint; other partitions differ.
  CHECK(RankGroups({0, 1, 0, 1, 2}).fingerprint() == g.fingerprint());
  CHECK(RankGroups({0, 1, 0, 1, 1}).fingerprint() != g.fingerprint());
  CHECK(RankGroups({0, 0, 1, 1, 2}).fingerprint() != g.fingerprint());
  CHECK(RankGroups({0, 1, 0, 1}).fingerprint() != RankGroups({0, 1, 0, 1, 2}).fingerprint());
  CHECK(g.fingerprint() != 0);
  CHECK(rank_groups_fingerprint(nullptr) == 0);
  // Stable across runs and processes: a fixed value for a fixed partition.
  CHECK(RankGroups({0, 0, 1, 1}).fingerprint() == RankGroups({3, 3, 8, 8}).fingerprint());

  CHECK_THROWS_AS(RankGroups({}), Error);
  try {
    RankGroups({0, 0, -1});
    FAIL("negative label accepted");
  } catch (const Error& e) {
    CHECK(e.status() == WIA_ERROR_INVALID_ARGUMENT);
    CHECK(std::string(e.what()).find("rank 2") != std::string::npos);
  }

  CHECK_FALSE(is_hierarchical(nullptr));
  CHECK_FALSE(is_hierarchical(groups_of({0, 1, 2, 3}).get()));  // every rank alone
  CHECK_FALSE(is_hierarchical(groups_of({0, 0, 0}).get()));     // one group
  CHECK(is_hierarchical(groups_of({0, 0, 1}).get()));
}

TEST_CASE("groups: a grouping of the wrong size is rejected naming both sizes") {
  CollArgs a = hier_args(4, 100, groups_of({0, 0, 1}));
  try {
    build_schedule(a);
    FAIL("no exception");
  } catch (const Error& e) {
    CHECK(e.status() == WIA_ERROR_INVALID_ARGUMENT);
    const std::string what = e.what();
    CHECK(what.find("3 ranks") != std::string::npos);
    CHECK(what.find("has 4") != std::string::npos);
  }
}

TEST_CASE("embed: a sub-schedule runs on mapped ranks with shifted tags and placed buffers") {
  // A 3-rank ring all-reduce played by ranks {5, 1, 3} of 6, in place, with
  // tags from 100, its AVG divisor replaced by 7, and rank 5's first steps
  // ordered after a local copy the enclosing schedule does first.
  CollArgs sub_args = hier_args(3, 10, nullptr, /*in_place=*/true);
  sub_args.algorithm = Algorithm::kRing;
  sub_args.dtype = WIA_INT32;
  sub_args.op = WIA_REDUCE_SUM;
  const Schedule sub = build_schedule(sub_args);

  CollArgs big_args = sub_args;
  big_args.nranks = 6;
  ScheduleBuilder sb(big_args, Algorithm::kRing, kAllRanks);
  const std::int32_t map[] = {5, 1, 3};
  const std::uint32_t first = sb.rank(5).copy(recv_buf(0), scratch_buf(0), 10);
  const std::uint32_t after[] = {first};
  for (std::int32_t s = 0; s < 3; ++s) {
    SubEmbedding e;
    e.rank_map = map;
    e.tag_offset = 100;
    e.tag_span = tag_extent(sub);
    if (s == 0) e.after = after;
    const auto placed = embed_program(sb.rank(map[s]), sub, s, e);
    CHECK(placed.size() == sub.programs[static_cast<std::size_t>(s)].steps.size());
  }
  for (std::int32_t r : {0, 2, 4}) (void)sb.rank(r);  // built, with no steps
  Schedule big = sb.finish();
  for (std::int32_t r = 0; r < 6; ++r) {
    const RankProgram& prog = big.programs[static_cast<std::size_t>(r)];
    const bool member = r == 5 || r == 1 || r == 3;
    CHECK(prog.steps.empty() == !member);
    for (const Step& st : prog.steps) {
      if (!st.is_send() && !st.is_recv()) continue;
      CHECK((st.peer == 5 || st.peer == 1 || st.peer == 3));
      CHECK(st.tag >= 100);
    }
  }
  // Rank 5 = sub-rank 0: its first embedded step waits for the copy.
  const RankProgram& r5 = big.programs[5];
  REQUIRE(r5.steps.size() >= 2);
  const std::uint32_t* d = r5.deps_of(r5.steps[1]);
  CHECK(std::find(d, d + r5.steps[1].dep_count, first) != d + r5.steps[1].dep_count);

  SimMemory mem(big);
  for (std::int32_t r = 0; r < 6; ++r) {
    auto recv = mem.buffer(r, BufferKind::kUserRecv);
    for (std::int32_t i = 0; i < 10; ++i) {
      const std::int32_t v = 1000 * r + i;
      std::memcpy(recv.data() + 4 * i, &v, 4);
    }
  }
  SimOptions opt;
  opt.rendezvous = true;
  opt.seed = 7;
  opt.check_races = true;
  const SimResult res = simulate(big, mem, opt);
  REQUIRE_MESSAGE(res.ok(), res.message);
  for (std::int32_t r = 0; r < 6; ++r) {
    const bool member = r == 5 || r == 1 || r == 3;
    auto recv = mem.buffer(r, BufferKind::kUserRecv);
    for (std::int32_t i = 0; i < 10; ++i) {
      std::int32_t got = 0;
      std::memcpy(&got, recv.data() + 4 * i, 4);
      CHECK(got == (member ? 9000 + 3 * i : 1000 * r + i));
    }
  }

  // Misuse is an internal error naming what is wrong.
  ScheduleBuilder other(big_args, Algorithm::kRing, kAllRanks);
  SubEmbedding bad;
  bad.rank_map = map;
  CHECK_THROWS_AS(embed_program(other.rank(0), sub, 0, bad), Error);  // rank 0 is not map[0]
  bad.tag_span = 1;
  CHECK_THROWS_AS(embed_program(other.rank(5), sub, 0, bad), Error);  // tags beyond the span
  const std::int32_t short_map[] = {5, 1};
  SubEmbedding wrong_size;
  wrong_size.rank_map = short_map;
  CHECK_THROWS_AS(embed_program(other.rank(5), sub, 0, wrong_size), Error);
}

TEST_CASE("embed: replace_divisor makes a sub all-reduce divide by the enclosing rank count") {
  CollArgs sub_args = hier_args(4, 33, nullptr, true);
  sub_args.algorithm = Algorithm::kRabenseifner;
  const Schedule sub = build_schedule(sub_args);
  std::uint64_t dividing = 0;
  ScheduleBuilder sb(hier_args(8, 33, nullptr, true), Algorithm::kRing, kAllRanks);
  const std::int32_t map[] = {0, 2, 4, 6};
  for (std::int32_t s = 0; s < 4; ++s) {
    SubEmbedding e;
    e.rank_map = map;
    e.replace_divisor = true;
    e.divisor = 8;
    embed_program(sb.rank(map[s]), sub, s, e);
  }
  const Schedule big = sb.finish();
  for (const RankProgram& prog : big.programs)
    for (const Step& st : prog.steps) {
      CHECK((st.divisor == 0 || st.divisor == 8));
      if (st.divisor == 8) dividing += st.count;
    }
  // Every element of every member is divided exactly once (AVG over 8).
  CHECK(dividing == 33);  // the reduce-scatter owners: each element once
}

TEST_CASE("hierarchical: matches the reference for many groupings, sizes, dtypes and ops") {
  std::mt19937 rng(20240611);
  constexpr wia_reduce_op_t kOps[] = {WIA_REDUCE_SUM, WIA_REDUCE_PROD, WIA_REDUCE_MIN,
                                      WIA_REDUCE_MAX, WIA_REDUCE_AVG};
  constexpr wia_datatype_t kTypes[] = {WIA_INT32, WIA_FLOAT32, WIA_BFLOAT16, WIA_FLOAT64,
                                       WIA_INT8,  WIA_UINT64,  WIA_FLOAT16};
  // 0/1/prime/not divisible, above 16 KiB (ring/Rabenseifner among leaders)
  // and above 64 KiB for 4-byte types (chain instead of binomial in nodes).
  const std::uint64_t kCounts[] = {0, 1, 2, 7, 13, 1000, 5003, 20011};
  int cases = 0, failures = 0;
  std::uint64_t salt = 0;
  for (std::int32_t p = 1; p <= 9; ++p) {
    for (const auto& [name, groups] : groupings(p, rng)) {
      for (std::uint64_t count : kCounts) {
        for (bool ip : {false, true}) {
          ++salt;
          test::Case c;
          c.collective = Collective::kAllReduce;
          c.algorithm = Algorithm::kHierarchical;
          c.nranks = p;
          c.count = count;
          c.dtype = kTypes[salt % std::size(kTypes)];
          c.op = kOps[(salt / 3) % std::size(kOps)];
          c.in_place = ip;
          c.num_chunks = static_cast<std::uint32_t>(salt % 3 == 0 ? 0 : salt % 3 == 1 ? 1 : 3);
          c.groups = groups;
          c.sim.seed = salt * 0x9e3779b97f4a7c15ull + 1;
          c.sim.rendezvous = salt % 2 == 1;
          c.sim.check_races = count <= 1000;
          ++cases;
          const std::string err = test::run_case(c);
          if (!err.empty() && ++failures <= 20)
            FAIL_CHECK(name << ": " << c.describe() << "\n" << err);
        }
      }
    }
  }
  MESSAGE(cases << " hierarchical cases, " << failures << " failures");
  CHECK(failures == 0);
}

TEST_CASE("hierarchical: only leaders talk across groups, and only as much as the leader phase") {
  std::mt19937 rng(7);
  for (std::int32_t p : {4, 6, 8, 9}) {
    for (const auto& [name, groups] : groupings(p, rng)) {
      if (!groups) continue;
      for (std::uint64_t count : {std::uint64_t{100}, std::uint64_t{30011}}) {
        const Schedule s = build_schedule(hier_args(p, count, groups));
        INFO(name << ": " << s.describe());
        std::uint64_t crossing = 0;
        for (std::int32_t r = 0; r < p; ++r)
          for (const Step& st : s.programs[static_cast<std::size_t>(r)].steps) {
            if (!st.is_send()) continue;
            if (groups->group(r) == groups->group(st.peer)) continue;
            CHECK(groups->local_rank(r) == 0);
            CHECK(groups->local_rank(st.peer) == 0);
            crossing += st.count;
          }
        // The crossing traffic is exactly the leader all-reduce's.
        const std::int32_t leaders = groups->ngroups();
        if (leaders > 1) {
          CollArgs la = hier_args(leaders, count, nullptr, true);
          la.algorithm = count * 4 < 16 * 1024 || !is_pow2(leaders) ? Algorithm::kRing
                                                                    : Algorithm::kRabenseifner;
          if (count * 4 < 16 * 1024) la.algorithm = Algorithm::kRecursiveDoubling;
          const Schedule ls = build_schedule(la);
          std::uint64_t expected = 0;
          for (const auto& prog : ls.programs)
            for (const Step& st : prog.steps)
              if (st.is_send()) expected += st.count;
          CHECK(crossing == expected);
        } else {
          CHECK(crossing == 0);
        }
      }
    }
  }
}

TEST_CASE("hierarchical: unique (src, dst, tag), single-rank builds equal the full build") {
  std::mt19937 rng(99);
  for (std::int32_t p : {2, 3, 5, 8, 9}) {
    for (const auto& [name, groups] : groupings(p, rng)) {
      for (std::uint64_t count : {std::uint64_t{997}, std::uint64_t{40009}}) {
        for (bool ip : {false, true}) {
          const CollArgs a = hier_args(p, count, groups, ip, 4);
          const Schedule full = build_schedule(a);
          INFO(name << ": " << full.describe());
          CHECK(validate_schedule(full).ok());
          std::set<std::tuple<int, int, std::uint32_t>> sends;
          for (std::int32_t r = 0; r < p; ++r)
            for (const Step& st : full.programs[static_cast<std::size_t>(r)].steps)
              if (st.is_send()) CHECK(sends.insert({r, st.peer, st.tag}).second);
          for (std::int32_t r = 0; r < p; ++r) {
            const Schedule one = build_schedule(a, r);
            for (std::int32_t q = 0; q < p; ++q)
              CHECK(one.programs[static_cast<std::size_t>(q)].built == (q == r));
            const RankProgram& x = full.programs[static_cast<std::size_t>(r)];
            const RankProgram& y = one.programs[static_cast<std::size_t>(r)];
            REQUIRE(x.steps.size() == y.steps.size());
            for (std::size_t i = 0; i < x.steps.size(); ++i) {
              CHECK(x.steps[i].peer == y.steps[i].peer);
              CHECK(x.steps[i].tag == y.steps[i].tag);
              CHECK(x.steps[i].count == y.steps[i].count);
              CHECK(x.steps[i].divisor == y.steps[i].divisor);
            }
            CHECK(x.deps == y.deps);
            CHECK(x.sizes.scratch == y.sizes.scratch);
          }
        }
      }
    }
  }
}

TEST_CASE("hierarchical: a tuner candidate only with a grouping worth exploiting") {
  const AlgorithmInfo* info = find_algorithm(Collective::kAllReduce, Algorithm::kHierarchical);
  REQUIRE(info != nullptr);
  CHECK(std::string(info->name) == "hierarchical");
  CHECK(std::string(algorithm_name(Algorithm::kHierarchical)) == "hierarchical");
  CHECK(find_algorithm(Collective::kAllReduce, "hierarchical") == info);
  CHECK(find_algorithm(Collective::kBroadcast, Algorithm::kHierarchical) == nullptr);
  CHECK(static_cast<int>(Algorithm::kHierarchical) == kAlgorithmCount - 2);
  CollArgs a = hier_args(4, 100, nullptr);
  CHECK_FALSE(tuner_candidate(*info, a));
  a.options.groups = groups_of({0, 1, 2, 3});
  CHECK_FALSE(tuner_candidate(*info, a));
  a.options.groups = groups_of({0, 0, 0, 0});
  CHECK_FALSE(tuner_candidate(*info, a));
  a.options.groups = groups_of({0, 0, 1, 1});
  CHECK(tuner_candidate(*info, a));
  // Others are always candidates.
  CHECK(tuner_candidate(*find_algorithm(Collective::kAllReduce, Algorithm::kRing), a));
}

}  // namespace wia::coll

namespace wia::tuner {
namespace {

// 2 nodes x 4 ranks, ranks numbered node by node (as launchers do).
const std::vector<std::int32_t> kTwoNodes = {0, 0, 0, 0, 1, 1, 1, 1};
// The same nodes with shuffled membership.
const std::vector<std::int32_t> kShuffled = {0, 1, 1, 0, 1, 0, 0, 1};
// Interleaved: rank r on node r % 2.
const std::vector<std::int32_t> kInterleaved = {0, 1, 0, 1, 0, 1, 0, 1};

Selection pick(const LinkModel& m, std::shared_ptr<const coll::RankGroups> groups,
               std::uint64_t count, std::vector<Candidate>* seen = nullptr) {
  coll::CollArgs args;
  args.collective = coll::Collective::kAllReduce;
  args.dtype = WIA_FLOAT32;
  args.count = count;
  args.nranks = m.nranks;
  args.options.groups = std::move(groups);
  return select_algorithm(args, m, seen);
}

double cost_of(const std::vector<Candidate>& seen, const char* name) {
  double best = -1;
  for (const Candidate& c : seen)
    if (std::string(c.name) == name && (best < 0 || c.time_us < best)) best = c.time_us;
  return best;
}

}  // namespace

TEST_CASE("two-level link model: links by node, NICs per node or per rank") {
  const LinkModel m =
      LinkModel::two_level(8, kInterleaved, 1.0, 10.0, 50.0, 0.1, 0.1, NicSharing::kPerNode);
  CHECK(m.alpha(0, 2) == 1.0);
  CHECK(m.bandwidth(0, 2) == 10.0);
  CHECK(m.alpha(0, 1) == 50.0);
  CHECK(m.bandwidth(1, 6) == 0.1);
  CHECK(m.port_gbps == 0.1);
  CHECK(m.nic_of_rank == kInterleaved);
  CHECK(m.node_of_rank == kInterleaved);
  CHECK_FALSE(m.is_uniform());
  const LinkModel per_rank =
      LinkModel::two_level(8, kInterleaved, 1.0, 10.0, 50.0, 0.1, 0.1, NicSharing::kPerRank);
  CHECK(per_rank.nic_of_rank == std::vector<std::int32_t>{0, 1, 2, 3, 4, 5, 6, 7});
  CHECK_THROWS_AS(LinkModel::two_level(4, kInterleaved, 1, 10, 50, 0.1, 0.1), Error);
  LinkModel broken = m;
  broken.nic_of_rank.pop_back();
  CHECK_THROWS_AS(broken.validate(), Error);
  broken = m;
  broken.node_of_rank[3] = -2;
  CHECK_THROWS_AS(broken.validate(), Error);

  // A node's ranks sharing its NIC: four ranks sending across at once take
  // four times as long as one; with a NIC each they overlap.
  coll::CollArgs a2a;
  a2a.collective = coll::Collective::kSendRecv;
  a2a.algorithm = coll::Algorithm::kDirect;
  a2a.dtype = WIA_FLOAT32;
  a2a.count = 1 << 20;
  a2a.nranks = 8;
  a2a.options.peer_offset = 1;  // r -> r+1: always the other node here
  const double shared = estimate(a2a, m).time_us;
  const double own = estimate(a2a, per_rank).time_us;
  const double one_msg = 4.0 * (1 << 20) / (0.1 * 1e3) + 50.0;
  CHECK(own == doctest::Approx(one_msg).epsilon(1e-9));
  CHECK(shared == doctest::Approx(4 * one_msg - 3 * 50.0).epsilon(1e-9));
  // Same-node messages do not touch the NIC.
  a2a.options.peer_offset = 2;  // r -> r+2: same node
  CHECK(estimate(a2a, m).time_us == doctest::Approx(4.0 * (1 << 20) / 1e4 + 1.0).epsilon(1e-9));
}

TEST_CASE("tuner: hierarchical wins large all-reduce when each node shares one slow NIC") {
  const std::uint64_t large = (16u << 20) / 4;  // 16 MiB of float32
  for (const auto* layout : {&kTwoNodes, &kShuffled}) {
    auto groups = std::make_shared<const coll::RankGroups>(*layout);
    const LinkModel cluster =
        LinkModel::two_level(8, *layout, 1.0, 10.0, 50.0, 0.1, 0.1, NicSharing::kPerNode);
    std::vector<Candidate> seen;
    const Selection sel = pick(cluster, groups, large, &seen);
    const double hier = cost_of(seen, "hierarchical");
    const double ring = cost_of(seen, "ring");
    const double rab = cost_of(seen, "rabenseifner");
    MESSAGE("2x4 " << std::string(layout == &kTwoNodes ? "node by node" : "shuffled")
                   << ", NIC per node, 16 MiB: picked " << std::string(sel.name)
                   << "; hierarchical " << hier / 1e3 << " ms, ring " << ring / 1e3
                   << " ms, rabenseifner " << rab / 1e3 << " ms");
    CHECK(sel.algorithm == coll::Algorithm::kHierarchical);
    // Leaders move n through a NIC (2 (L-1)/L n, L = 2); a flat ring at
    // least 2 (p-1)/p n, Rabenseifner up to 4 n when its first exchanges
    // cross: at least 1.5x apart.
    CHECK(hier * 1.5 < ring);
    CHECK(hier * 1.5 < rab);

    // Without a grouping it is not a candidate at all.
    seen.clear();
    CHECK(pick(cluster, nullptr, large, &seen).algorithm != coll::Algorithm::kHierarchical);
    CHECK(cost_of(seen, "hierarchical") < 0);

    // Uniform links: the grouping is offered, costed, and loses.
    seen.clear();
    const Selection flat = pick(LinkModel::uniform(8, 1.0, 10.0), groups, large, &seen);
    CHECK(flat.algorithm != coll::Algorithm::kHierarchical);
    CHECK(cost_of(seen, "hierarchical") > 0);
    // Small vectors: latency decides, the two extra node phases cost more
    // than they save.
    CHECK(pick(LinkModel::uniform(8, 1.0, 10.0), groups, 16).algorithm !=
          coll::Algorithm::kHierarchical);
  }

  // What the layout and NIC sharing do to the flat algorithms (printed for
  // the record): rank r on node r % 2 keeps Rabenseifner's big exchanges
  // inside the nodes, and one NIC per rank lets every rank cross at once.
  for (const auto* layout : {&kTwoNodes, &kInterleaved})
    for (NicSharing sharing : {NicSharing::kPerNode, NicSharing::kPerRank}) {
      std::vector<Candidate> seen;
      const Selection sel =
          pick(LinkModel::two_level(8, *layout, 1.0, 10.0, 50.0, 0.1, 0.1, sharing),
               std::make_shared<const coll::RankGroups>(*layout), large, &seen);
      MESSAGE(std::string(layout == &kTwoNodes ? "node by node" : "interleaved")
              << ", NIC per " << std::string(sharing == NicSharing::kPerNode ? "node" : "rank")
              << ": picked " << std::string(sel.name) << "; hierarchical "
              << cost_of(seen, "hierarchical") / 1e3 << " ms, ring " << cost_of(seen, "ring") / 1e3
              << " ms, rabenseifner " << cost_of(seen, "rabenseifner") / 1e3 << " ms");
    }
}

TEST_CASE("tuner: the selector passes its grouping and caches per grouping") {
  auto groups = std::make_shared<const coll::RankGroups>(kTwoNodes);
  const LinkModel cluster =
      LinkModel::two_level(8, kTwoNodes, 1.0, 10.0, 50.0, 0.1, 0.1, NicSharing::kPerNode);
  Selector with(cluster, groups);
  const std::uint64_t large = (16u << 20) / 4;
  CHECK(with.select(coll::Collective::kAllReduce, large, WIA_FLOAT32).algorithm ==
        coll::Algorithm::kHierarchical);
  CHECK(with.cached() == 1);
  coll::CollArgs args;
  args.collective = coll::Collective::kAllReduce;
  args.dtype = WIA_FLOAT32;
  args.count = large;
  args.nranks = 8;
  CHECK(with.select(args).algorithm != coll::Algorithm::kHierarchical);  // no grouping here
  CHECK(with.cached() == 2);
  args.options.groups = std::make_shared<const coll::RankGroups>(std::vector<std::int32_t>{
      5, 5, 5, 5, 6, 6, 6, 6});  // same partition, other labels: same entry
  CHECK(with.select(args).algorithm == coll::Algorithm::kHierarchical);
  CHECK(with.cached() == 2);
  CHECK_THROWS_AS(
      Selector(cluster, std::make_shared<const coll::RankGroups>(std::vector<std::int32_t>{0, 1})),
      Error);
}

}  // namespace wia::tuner
