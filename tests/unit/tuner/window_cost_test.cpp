// SPDX-License-Identifier: Apache-2.0
// The cost of an all-reduce through node-shared windows (tuner/window_cost):
// its passes over memory and its waits, checked against costs worked out
// by hand here, and the cache factor it and the receiver-copy model share.
#include "tuner/window_cost.hpp"

#include <doctest/doctest.h>

#include "common/error.hpp"

namespace wia::tuner {
namespace {

// 10 GB/s copies (10e3 bytes a microsecond), a core per rank, a wait of
// 0.5 us, no cache: every term below is bytes / 10e3 or a count of waits.
LinkModel plain_model(std::int32_t p) {
  LinkModel m = LinkModel::uniform(p, 0.25, 10.0);
  m.copies = Copier::kReceiver;
  m.copy_gbps = 10.0;
  m.message_overhead_us = 0.25;
  return m;
}

WindowAllReduce call(std::int32_t p, std::uint64_t bytes, bool one_shot, bool read_in_place) {
  WindowAllReduce w;
  w.nranks = p;
  w.bytes = bytes;
  w.chunk_bytes = 512 << 10;
  w.one_shot = one_shot;
  w.inputs_read_in_place = read_in_place;
  return w;
}

constexpr double kMiB = 1 << 20;

}  // namespace

TEST_CASE("window cost: the passes and waits of each schedule, by hand") {
  const double n = 64 * kMiB;  // 128 chunks of 512 KiB
  SUBCASE("2 ranks, one-shot, inputs read in place: one fold, 128 + 1 waits") {
    // Each rank folds both inputs into its output (2 copies' worth of the
    // output's bytes), waits for every chunk's inputs and at the end for
    // the peers' reads.
    const double expected = 2 * n / 10e3 + (128 + 1) * 0.5;
    CHECK(window_allreduce_us(call(2, 64 << 20, true, true), plain_model(2)) ==
          doctest::Approx(expected));
  }
  SUBCASE("2 ranks, one-shot, inputs copied into the windows: one copy more, no last wait") {
    const double expected = (1 + 2) * n / 10e3 + 128 * 0.5;
    CHECK(window_allreduce_us(call(2, 64 << 20, true, false), plain_model(2)) ==
          doctest::Approx(expected));
  }
  SUBCASE("in place, one-shot copies its input whatever it is") {
    WindowAllReduce w = call(2, 64 << 20, true, true);
    w.in_place = true;
    CHECK(window_allreduce_us(w, plain_model(2)) ==
          doctest::Approx((1 + 2) * n / 10e3 + 128 * 0.5));
  }
  SUBCASE("4 ranks, direct: a quarter folded from 4 inputs, every slice copied out, 2 waits") {
    // A fold of 4 inputs: 2 copies' worth for the first two, half a copy
    // for each further input's read; its own slice copied out, the peers'
    // three read from the cores that wrote them (2 copies' worth a byte).
    const double fold = 2 + 2 * 0.5;
    const double expected = (n / 4 * fold + n / 4 + 3 * n / 4 * 2) / 10e3 + 2 * 128 * 0.5;
    CHECK(window_allreduce_us(call(4, 64 << 20, false, true), plain_model(4)) ==
          doctest::Approx(expected));
  }
  SUBCASE("a vector within one bank is one chunk") {
    CHECK(window_allreduce_us(call(2, 4096, true, false), plain_model(2)) ==
          doctest::Approx(3 * 4096 / 10e3 + 0.5));
  }
  SUBCASE("ranks sharing cores: the passes take 1 / share longer, the waits do not") {
    LinkModel m = plain_model(4);
    m.cpu_share = 0.5;
    const double expected = 2 * (n / 4 * 3 + n / 4 + 3 * n / 4 * 2) / 10e3 + 2 * 128 * 0.5;
    CHECK(window_allreduce_us(call(4, 64 << 20, false, true), m) == doctest::Approx(expected));
  }
}

TEST_CASE("window cost: bad shapes are refused, naming them") {
  WindowAllReduce one = call(1, 1024, true, false);
  CHECK_THROWS_WITH_AS(window_allreduce_us(one, plain_model(1)), doctest::Contains("1 rank(s)"),
                       Error);
  WindowAllReduce no_bank = call(2, 1024, true, false);
  no_bank.chunk_bytes = 0;
  CHECK_THROWS_WITH_AS(window_allreduce_us(no_bank, plain_model(2)),
                       doctest::Contains("chunks of 0 bytes"), Error);
}

TEST_CASE("cache factor: each level serves what half its size holds") {
  LinkModel m = plain_model(2);
  CHECK(m.cache_time_factor(64 * kMiB) == 1.0);  // no cache model
  m.cache_bytes = 32 * kMiB;
  m.cache_speedup = 4.0;
  m.l2_bytes = 2 * kMiB;
  m.l2_speedup = 6.0;
  // Within half the L2s: all at L2 speed.
  CHECK(m.cache_time_factor(1 * kMiB) == doctest::Approx(1.0 / 6));
  // 4 MiB: a quarter in the L2s, the rest in the last level.
  CHECK(m.cache_time_factor(4 * kMiB) == doctest::Approx(0.25 / 6 + 0.75 / 4));
  // 64 MiB: 1/64 in the L2s, 16/64 within the last level's half, the rest memory.
  CHECK(m.cache_time_factor(64 * kMiB) ==
        doctest::Approx(1.0 / 64 / 6 + 15.0 / 64 / 4 + 48.0 / 64));
  // Larger sets never copy faster.
  double previous = 0;
  for (double mib = 0.25; mib <= 1024; mib *= 2) {
    const double f = m.cache_time_factor(mib * kMiB);
    CHECK(f >= previous);
    CHECK(f <= 1.0);
    previous = f;
  }
}

}  // namespace wia::tuner
