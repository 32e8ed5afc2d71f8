// SPDX-License-Identifier: Apache-2.0
// The alpha-beta cost model: textbook costs, the symmetric shortcut,
// algorithm selection and its speed.
#include "tuner/cost_model.hpp"

#include <doctest/doctest.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "coll/registry.hpp"
#include "common/error.hpp"

namespace wia::tuner {
namespace {

using coll::Algorithm;
using coll::Collective;

constexpr double kAlpha = 5.0;  // us
constexpr double kGbps = 10.0;

coll::CollArgs allreduce(Algorithm a, std::int32_t p, std::uint64_t count,
                         std::uint32_t chunks = 1) {
  coll::CollArgs args;
  args.collective = Collective::kAllReduce;
  args.algorithm = a;
  args.dtype = WIA_FLOAT32;
  args.count = count;
  args.nranks = p;
  args.options.num_chunks = chunks;
  return args;
}

double full_cost(const coll::CollArgs& args, const LinkModel& m) {
  return estimate(coll::build_schedule(args), m).time_us;
}

}  // namespace

TEST_CASE("cost: ring and Rabenseifner reproduce the textbook costs") {
  for (std::int32_t p : {2, 4, 8, 16}) {
    const LinkModel m = LinkModel::uniform(p, kAlpha, kGbps);
    // Counts divisible by p so the blocks are exactly n/p.
    for (std::uint64_t count :
         {std::uint64_t(16), std::uint64_t(4096), std::uint64_t(1) << 20, std::uint64_t(3) << 22}) {
      const double bytes = static_cast<double>(count * 4);
      const double ring = full_cost(allreduce(Algorithm::kRing, p, count), m);
      const double rab = full_cost(allreduce(Algorithm::kRabenseifner, p, count), m);
      INFO("p=" << p << " count=" << count);
      CHECK(ring == doctest::Approx(ring_allreduce_us(p, bytes, kAlpha, kGbps)).epsilon(1e-12));
      CHECK(rab ==
            doctest::Approx(rabenseifner_allreduce_us(p, bytes, kAlpha, kGbps)).epsilon(1e-12));
    }
  }
}

TEST_CASE("cost: binary tree matches the textbook latency term, and its bandwidth regime") {
  for (std::int32_t p : {2, 4, 8, 16}) {
    const LinkModel m = LinkModel::uniform(p, kAlpha, kGbps);
    // One element: the latency term 2 log2(p) alpha dominates; the two
    // differ only in the (tiny) bandwidth term.
    const double tree = full_cost(allreduce(Algorithm::kTree, p, 1), m);
    CHECK(tree == doctest::Approx(tree_allreduce_us(p, 4, kAlpha, kGbps)).epsilon(1e-3));
    // Large vector, many chunks, alpha -> 0: the pipelined tree streams the
    // vector up and down. With p = 2 the two directions use the two halves
    // of one full-duplex link: n beta. Beyond, with one NIC per rank, an
    // inner rank sends n up and 2n down and receives as much: the textbook
    // 2 n beta is a lower bound, 3 n beta the fluid limit.
    LinkModel bw = m;
    bw.alpha_us = 0;
    const std::uint64_t count = 1 << 22;
    const double n_beta = count * 4 / (kGbps * 1e3);
    const double t = full_cost(allreduce(Algorithm::kTree, p, count, 256), bw);
    INFO("p=" << p << " tree/(n beta)=" << t / n_beta);
    if (p == 2) {
      CHECK(t == doctest::Approx(n_beta).epsilon(0.01));
    } else {
      // The fluid bound is 3 n beta (an inner rank's ports each carry 3n);
      // first-come-first-served ports lose a little pipelining to it.
      CHECK(t >= 2 * n_beta * 0.99);
      CHECK(t <= 4 * n_beta);
    }
    MESSAGE("tree p=" << p << ": " << t / n_beta << " n beta");
  }
}

TEST_CASE("cost: binomial all-reduce is 2 log2(p) (alpha + n beta) without pipelining") {
  for (std::int32_t p : {2, 4, 8, 16}) {
    const LinkModel m = LinkModel::uniform(p, kAlpha, kGbps);
    const std::uint64_t count = 1 << 16;
    const double n_beta = count * 4 / (kGbps * 1e3);
    const double t = full_cost(allreduce(Algorithm::kBinomial, p, count), m);
    CHECK(t == doctest::Approx(2 * std::log2(p) * (kAlpha + n_beta)).epsilon(1e-12));
  }
}

TEST_CASE("cost: the symmetric shortcut equals the full simulation on uniform links") {
  for (const coll::AlgorithmInfo& info : coll::algorithms()) {
    for (std::int32_t p : {2, 3, 4, 5, 8, 12, 16}) {
      for (std::uint32_t chunks : {1u, 3u}) {
        coll::CollArgs a;
        a.collective = info.collective;
        a.algorithm = info.algorithm;
        a.count = 5040 * 16;
        a.nranks = p;
        a.options.num_chunks = chunks;
        LinkModel m = LinkModel::uniform(p, kAlpha, kGbps);
        m.reduce_gbps = 20;
        m.copy_gbps = 50;
        const coll::Schedule one = coll::build_schedule(a, 0);
        if (one.symmetry == coll::Symmetry::kNone) continue;
        const CostEstimate sym = estimate(one, m);
        const CostEstimate full = estimate(coll::build_schedule(a), m);
        CHECK(sym.symmetric);
        CHECK_FALSE(full.symmetric);
        CHECK_MESSAGE(sym.time_us == doctest::Approx(full.time_us).epsilon(1e-9), one.describe());
      }
    }
  }
}

TEST_CASE("cost: pipelining, slow links and local costs move the estimate as they should") {
  const std::int32_t p = 8;
  const LinkModel m = LinkModel::uniform(p, kAlpha, kGbps);
  coll::CollArgs chain;
  chain.collective = Collective::kBroadcast;
  chain.algorithm = Algorithm::kChain;
  chain.count = 1 << 22;
  chain.nranks = p;
  chain.options.num_chunks = 1;
  const double one = full_cost(chain, m);
  chain.options.num_chunks = 32;
  const double many = full_cost(chain, m);
  CHECK(many < one / 3);  // ~ (p-1) n beta vs (p-2+k)/k n beta

  // One slow link on the ring slows the ring down: the full simulation
  // sees it (p <= kFullSimulationMaxRanks).
  LinkModel slow = m;
  slow.gbps_matrix.assign(static_cast<std::size_t>(p * p), kGbps);
  slow.gbps_matrix[3 * p + 4] = kGbps / 10;
  const auto ring = allreduce(Algorithm::kRing, p, 1 << 20);
  CHECK(estimate(ring, slow).time_us > 3 * estimate(ring, m).time_us);

  LinkModel reduce_cost = m;
  reduce_cost.reduce_gbps = 5;
  CHECK(estimate(ring, reduce_cost).time_us > estimate(ring, m).time_us);

  // Direct all-to-all beats pairwise on latency; with the injection port
  // they move the same bytes.
  coll::CollArgs a2a;
  a2a.collective = Collective::kAllToAll;
  a2a.count = 1 << 16;
  a2a.nranks = p;
  a2a.algorithm = Algorithm::kDirect;
  const double direct = estimate(a2a, m).time_us;
  a2a.algorithm = Algorithm::kPairwise;
  const double pairwise = estimate(a2a, m).time_us;
  CHECK(direct < pairwise);
}

TEST_CASE("cost: invalid link models are rejected") {
  LinkModel m = LinkModel::uniform(4, kAlpha, kGbps);
  m.gbps_matrix.assign(3, 1.0);
  CHECK_THROWS_AS(m.validate(), Error);
  m = LinkModel::uniform(4, kAlpha, 0);
  CHECK_THROWS_AS(m.validate(), Error);
  m = LinkModel::uniform(4, kAlpha, kGbps);
  CHECK_THROWS_AS(estimate(allreduce(Algorithm::kRing, 8, 100), m), Error);
  CHECK_THROWS_AS(select_algorithm(Collective::kAllReduce, 100, WIA_FLOAT32, 8, m), Error);
  m = LinkModel::uniform(4, kAlpha, kGbps);
  m.call_overhead_us = -1;
  CHECK_THROWS_WITH_AS(m.validate(), doctest::Contains("call overhead"), Error);
}

TEST_CASE("cost: a call's overhead adds to every estimate alike and changes no choice") {
  const LinkModel plain = LinkModel::uniform(4, kAlpha, kGbps);
  LinkModel charged = plain;
  charged.call_overhead_us = 16.0;
  for (Algorithm a : {Algorithm::kRing, Algorithm::kRecursiveDoubling, Algorithm::kDirect})
    for (std::uint64_t count : {std::uint64_t{2}, std::uint64_t{1} << 20}) {
      const coll::CollArgs args = allreduce(a, 4, count);
      // The symmetric shortcut and the full simulation alike.
      CHECK(estimate(args, charged).time_us ==
            doctest::Approx(estimate(args, plain).time_us + 16.0));
      CHECK(full_cost(args, charged) == doctest::Approx(full_cost(args, plain) + 16.0));
    }
  for (std::uint64_t count : {std::uint64_t{2}, std::uint64_t{1} << 20}) {
    const Selection a = select_algorithm(Collective::kAllReduce, count, WIA_FLOAT32, 4, plain);
    const Selection b = select_algorithm(Collective::kAllReduce, count, WIA_FLOAT32, 4, charged);
    CHECK(std::string(a.name) == std::string(b.name));
    CHECK(a.num_chunks == b.num_chunks);
    CHECK(b.estimated_ms == doctest::Approx(a.estimated_ms + 0.016));
  }
}

TEST_CASE("cost: select_algorithm picks latency algorithms for 8 B, bandwidth ones for 64 MiB") {
  for (std::int32_t p : {4, 8, 16, 64}) {
    const LinkModel m = LinkModel::uniform(p, kAlpha, kGbps);
    std::vector<Candidate> seen;
    const Selection small = select_algorithm(Collective::kAllReduce, 2, WIA_FLOAT32, p, m, &seen);
    const std::string s = small.name;
    INFO("p=" << p << " 8 B -> " << s);
    // Direct all-reduce (2 alpha, p-1 concurrent peers) is the extreme of
    // the latency-bound family when messages cost nothing to issue.
    CHECK((s == "tree" || s == "binomial" || s == "recursive_doubling" || s == "direct" ||
           (s == "one_shot" && p <= coll::kOneShotMaxRanks)));
    CHECK(small.estimated_ms > 0);
    CHECK(seen.size() >= 5);
    const Selection big =
        select_algorithm(Collective::kAllReduce, (64u << 20) / 4, WIA_FLOAT32, p, m);
    const std::string b = big.name;
    INFO("p=" << p << " 64 MiB -> " << b);
    // Direct moves the same bytes per port as the ring with 2 latency
    // terms: bandwidth-optimal too behind a non-blocking switch.
    CHECK((b == "ring" || b == "rabenseifner" || b == "direct"));
    // With a per-message cost of 1 us, direct's 2(p-1) messages per rank
    // lose to ring/Rabenseifner from a few dozen ranks on.
    if (p >= 64) {
      LinkModel costly = m;
      costly.message_overhead_us = 1.0;
      const std::string c =
          select_algorithm(Collective::kAllReduce, (64u << 20) / 4, WIA_FLOAT32, p, costly).name;
      INFO("with 1 us per message -> " << c);
      CHECK((c == "ring" || c == "rabenseifner"));
    }
    // The estimate is close to the bandwidth-optimal bound.
    const double bound_ms = 2.0 * (p - 1) / p * (64 << 20) / (kGbps * 1e9) * 1e3;
    CHECK(big.estimated_ms >= bound_ms * 0.999);
    CHECK(big.estimated_ms <= bound_ms * 1.1);
  }
  // Other collectives pick something sensible too.
  const LinkModel m8 = LinkModel::uniform(8, kAlpha, kGbps);
  CHECK(std::string(select_algorithm(Collective::kBroadcast, 1 << 24, WIA_FLOAT32, 8, m8).name) !=
        "binomial");
  CHECK(std::string(select_algorithm(Collective::kAllGather, 1, WIA_FLOAT32, 8, m8).name) !=
        "ring");
}

TEST_CASE("cost: every collective can be selected for, at any size and rank count") {
  for (std::int32_t p : {1, 2, 3, 7, 64, 300}) {
    const LinkModel m = LinkModel::uniform(p, kAlpha, kGbps);
    for (int c = 0; c < coll::kCollectiveCount; ++c) {
      for (std::uint64_t count :
           {std::uint64_t{0}, std::uint64_t{1}, std::uint64_t{1000}, std::uint64_t{1} << 20}) {
        const auto coll_id = static_cast<Collective>(c);
        const Selection sel = select_algorithm(coll_id, count, WIA_BFLOAT16, p, m);
        INFO(coll::collective_name(coll_id) << " p=" << p << " count=" << count);
        CHECK(coll::find_algorithm(coll_id, sel.algorithm) != nullptr);
        CHECK(sel.estimated_ms >= 0);
        if (count == 0 || p == 1) CHECK(sel.estimated_ms < 1e-3);
      }
    }
  }
}

TEST_CASE("cost: non-uniform links beyond the full-simulation size use the worst link") {
  const std::int32_t p = kFullSimulationMaxRanks + 44;
  const LinkModel uni = LinkModel::uniform(p, kAlpha, kGbps);
  LinkModel slow = uni;
  slow.gbps_matrix.assign(static_cast<std::size_t>(p) * p, kGbps);
  slow.gbps_matrix[5 * p + 6] = kGbps / 4;  // one slow link on the ring
  const auto ring = allreduce(Algorithm::kRing, p, std::uint64_t(1) << 22);
  const CostEstimate fast = estimate(ring, uni);
  const CostEstimate bound = estimate(ring, slow);
  CHECK(fast.symmetric);
  CHECK(bound.symmetric);
  // Every ring step is charged at the slow link's speed: a bound.
  CHECK(bound.time_us ==
        doctest::Approx(2 * (p - 1) * kAlpha + 4 * (fast.time_us - 2 * (p - 1) * kAlpha))
            .epsilon(1e-9));
}

TEST_CASE("cost: the selector caches per quarter-octave size bucket") {
  CHECK(Selector::size_bucket(0) == 0);
  CHECK(Selector::size_bucket(63) == 63);
  CHECK(Selector::size_bucket(64) != Selector::size_bucket(63));
  CHECK(Selector::size_bucket(1000) == Selector::size_bucket(1001));
  CHECK(Selector::size_bucket(1 << 20) != Selector::size_bucket((1 << 20) + (1 << 18)));
  CHECK(Selector::size_bucket(1 << 20) == Selector::size_bucket((1 << 20) + (1 << 18) - 1));
  Selector sel(LinkModel::uniform(16, kAlpha, kGbps));
  const Selection& a = sel.select(Collective::kAllReduce, 1 << 20, WIA_FLOAT32);
  const Selection& b = sel.select(Collective::kAllReduce, (1 << 20) + 5, WIA_FLOAT32);
  CHECK(&a == &b);
  CHECK(sel.cached() == 1);
  sel.select(Collective::kAllReduce, 1 << 20, WIA_FLOAT16);  // other element size
  sel.select(Collective::kAllGather, 1 << 20, WIA_FLOAT32);  // other collective
  CHECK(sel.cached() == 3);
  const Selection direct =
      select_algorithm(Collective::kAllReduce, 1 << 20, WIA_FLOAT32, 16, sel.model());
  CHECK(std::string(direct.name) == a.name);
  CHECK(direct.estimated_ms == doctest::Approx(a.estimated_ms));
}

TEST_CASE(
    "cost: an algorithm a caller forces runs at the chunk count the model finds best for it") {
  // The figures a process communicator over loopback tcp uses.
  LinkModel m = LinkModel::uniform(4, 1.0, 10.0);
  m.port_gbps = 0;
  m.message_overhead_us = 5.0;
  m.reduce_gbps = 8.0;
  m.copy_gbps = 10.0;
  const std::uint64_t count = (16u << 20) / 4;
  const Selection forced =
      select_chunks(allreduce(Algorithm::kAuto, 4, count), Algorithm::kDirect, m);
  CHECK(forced.algorithm == Algorithm::kDirect);
  // Its estimate is the full cost of the schedule at its chunk count ...
  CHECK(forced.estimated_ms * 1000 ==
        doctest::Approx(full_cost(allreduce(Algorithm::kDirect, 4, count, forced.num_chunks), m)));
  // ... no dearer than the builder's fixed default (64 chunks, 64 KiB
  // messages here), which it used to run at ...
  const std::uint32_t fixed =
      coll::default_chunks(Collective::kAllReduce, Algorithm::kDirect, count * 4, 4);
  CHECK(fixed == 64);
  CHECK(forced.num_chunks != fixed);
  CHECK(forced.estimated_ms * 1000 < full_cost(allreduce(Algorithm::kDirect, 4, count, fixed), m));
  // ... and the cheapest of that algorithm's candidates in the full selection.
  std::vector<Candidate> seen;
  select_algorithm(Collective::kAllReduce, count, WIA_FLOAT32, 4, m, &seen);
  double cheapest = -1;
  for (const Candidate& c : seen)
    if (c.algorithm == Algorithm::kDirect && (cheapest < 0 || c.time_us < cheapest))
      cheapest = c.time_us;
  CHECK(forced.estimated_ms * 1000 == doctest::Approx(cheapest));

  Selector sel(m);
  const Selection& a = sel.select_chunks(allreduce(Algorithm::kAuto, 4, count), Algorithm::kDirect);
  const Selection& b =
      sel.select_chunks(allreduce(Algorithm::kAuto, 4, count + 5), Algorithm::kDirect);
  CHECK(&a == &b);
  CHECK(a.num_chunks == forced.num_chunks);
  sel.select_chunks(allreduce(Algorithm::kAuto, 4, count), Algorithm::kRing);  // its own entry
  sel.select(Collective::kAllReduce, count, WIA_FLOAT32);  // and the selection's
  CHECK(sel.cached() == 3);
  CHECK_THROWS_AS(sel.select_chunks(allreduce(Algorithm::kAuto, 4, count), Algorithm::kBruck),
                  Error);
}

TEST_CASE("cost: selection speed (printed)") {
  using Clock = std::chrono::steady_clock;
  auto time_us = [](auto&& fn, int reps) {
    const auto t0 = Clock::now();
    for (int i = 0; i < reps; ++i) fn(i);
    return std::chrono::duration<double, std::micro>(Clock::now() - t0).count() / reps;
  };
  for (std::int32_t p : {8, 64, 1024}) {
    const LinkModel m = LinkModel::uniform(p, kAlpha, kGbps);
#if defined(__SANITIZE_ADDRESS__)
    const int reps = 1;  // numbers are meaningless under the sanitizers
#else
    const int reps = p >= 1024 ? 2 : 20;
#endif
    const double cold_small = time_us(
        [&](int i) { select_algorithm(Collective::kAllReduce, 256 + i, WIA_FLOAT32, p, m); }, reps);
    const double cold_large = time_us(
        [&](int i) {
          select_algorithm(Collective::kAllReduce, (16u << 20) + i, WIA_FLOAT32, p, m);
        },
        reps);
    Selector sel(m);
    sel.select(Collective::kAllReduce, 256, WIA_FLOAT32);
    const double cached =
        time_us([&](int) { sel.select(Collective::kAllReduce, 256, WIA_FLOAT32); }, 10000);
    std::printf(
        "select_algorithm(allreduce) p=%-5d cold 1 KiB: %9.1f us  cold 64 MiB: %9.1f us  "
        "cached: %.3f us\n",
        p, cold_small, cold_large, cached);
    CHECK(cached < 1000.0);
  }
}

}  // namespace wia::tuner
