// SPDX-License-Identifier: Apache-2.0
// WIA_RECOVERY_INSTANT with 4 real processes (docs/fault-tolerance.md,
// "Instant recovery"): pairs (0, 2) and (1, 3) compute shards 0 and 1 of
// each step's gradient. Rank 3 is SIGKILLed inside the training loop; the
// survivors shrink, rank 1 scales its gradient by 2 in place of its dead
// partner, and training goes on without a checkpoint. The final parameters
// equal, bit for bit, a reference computed here in double from the shards
// (small integers and a power-of-two learning rate keep both exact). When
// both replicas of a shard die, every survivor is told which shard is lost.
#include <doctest/doctest.h>
#include <signal.h>
#include <wia/wia.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "process_harness.hpp"

namespace {
using namespace wia::test::processes;

constexpr std::size_t kCount = 20000;
constexpr int kSteps = 8;
constexpr double kRate = 0.25;
constexpr wia_redundancy_config_t kInstant = {.redundancy_factor = 2,
                                              .failure_recovery = WIA_RECOVERY_INSTANT};

float shard_gradient(int shard, std::size_t i, int step) {
  return static_cast<float>(static_cast<int>((i * 7 + shard * 13 + step * 5) % 23) - 11);
}

// The parameters after kSteps, from the shards alone (no communicator):
// each step moves them by the rate times the mean of the shards' gradients.
std::vector<double> reference(int num_shards) {
  std::vector<double> p(kCount, 1.0);
  for (int t = 0; t < kSteps; ++t)
    for (std::size_t i = 0; i < kCount; ++i) {
      double mean = 0;
      for (int s = 0; s < num_shards; ++s) mean += shard_gradient(s, i, t);
      p[i] -= kRate * mean / num_shards;
    }
  return p;
}

bool synced(wia_status_t st) {
  return st == WIA_SUCCESS && wia_stream_synchronize(nullptr) == WIA_SUCCESS;
}

// Trains with the ranks in `victims` SIGKILLing themselves at the start of
// step `kill_step`. kOk when the parameters match the reference and the
// views are as expected; kSawError when the view refused with a message
// naming `lost_shard` (both its replicas dead).
int train(int rank, int nranks, const std::vector<int>& victims, int kill_step,
          int lost_shard) {
  wia_communicator_t comm = join(rank, nranks);
  if (!comm) return kApiError;
  wia_redundancy_view_t v;
  if (wia_get_redundancy_view(comm, &kInstant, wia_comm_rank(comm), &v) != WIA_SUCCESS)
    return kApiError;
  const int total_ranks = nranks;
  // before: the parameters at the start of this step; before_last: at the
  // start of the previous one (what a rank that finished that step while a
  // survivor failed it must go back to).
  std::vector<float> params(kCount, 1.0f), before(kCount), before_last(kCount, 1.0f),
      grad(kCount), sum(kCount), partner_grad(kCount);
  wia_collective_config_t cfg{};
  cfg.datatype = WIA_FLOAT32;
  cfg.reduction_op = WIA_REDUCE_SUM;
  int recoveries = 0;
  for (int step = 0; step < kSteps;) {
    if (step == kill_step && std::find(victims.begin(), victims.end(), rank) != victims.end())
      raise(SIGKILL);
    before = params;
    for (std::size_t i = 0; i < kCount; ++i)
      grad[i] = static_cast<float>(v.gradient_scale) * shard_gradient(v.shard, i, step);
    bool ok = true;
    if (v.partner >= 0) {  // the cross-check of 6.9.1, on whoever the partner is now
      ok = synced(wia_send_receive_gradients_ex(comm, v.partner, grad.data(), partner_grad.data(),
                                                kCount, WIA_FLOAT32, nullptr));
      if (ok && !wia_gradients_match(grad.data(), partner_grad.data(), kCount, WIA_FLOAT32, 0.0)) {
        std::fprintf(stderr, "rank %d: step %d: partner %d disagrees\n", rank, step, v.partner);
        return kWrong;
      }
    }
    ok = ok && synced(wia_all_reduce(comm, grad.data(), sum.data(), kCount, &cfg, nullptr));
    if (ok) {
      for (std::size_t i = 0; i < kCount; ++i)
        params[i] -= static_cast<float>(kRate) * sum[i] / static_cast<float>(total_ranks);
      before_last = before;
      ++step;
      continue;
    }
    // A rank died: agree on who is left, shrink, and redo from the step
    // every survivor still has (one that finished this step before the
    // death was noticed elsewhere steps back).
    std::fprintf(stderr, "rank %d: step %d failed: %s\n", rank, step, wia_get_last_error());
    // What the stream still holds of the broken communicator's operations
    // is reported (and cleared) here, not by the new communicator's first.
    wia_stream_synchronize(nullptr);
    if (++recoveries > 2) return kApiError;
    wia_comm_revoke(comm);
    wia_communicator_t next = nullptr;
    if (wia_create_communicator_fault_tolerant(&next, comm) != WIA_SUCCESS) {
      std::fprintf(stderr, "rank %d: shrink: %s\n", rank, wia_get_last_error());
      return kApiError;
    }
    wia_destroy_communicator(comm);
    comm = next;
    const wia_status_t vs = wia_get_redundancy_view(comm, &kInstant, wia_comm_rank(comm), &v);
    if (vs != WIA_SUCCESS) {
      const std::string why = wia_get_last_error();
      std::fprintf(stderr, "rank %d: view: %s\n", rank, why.c_str());
      const std::string want = "shard " + std::to_string(lost_shard) + " (ranks";
      return vs == WIA_ERROR_REMOTE && lost_shard >= 0 && why.find(want) != std::string::npos
                 ? kSawError
                 : kApiError;
    }
    int first = step;
    wia_collective_config_t min_cfg{};
    min_cfg.datatype = WIA_INT32;
    min_cfg.reduction_op = WIA_REDUCE_MIN;
    if (!synced(wia_all_reduce(comm, &step, &first, 1, &min_cfg, nullptr))) {
      std::fprintf(stderr, "rank %d: the step to redo: %s\n", rank, wia_get_last_error());
      return kApiError;
    }
    if (first < step - 1) return kWrong;  // deaths are noticed within a step
    // This step failed before its update, so params are still `before`;
    // one step back, the finished step's update is undone too.
    if (first == step - 1) params = before_last;
    step = first;
  }
  const int origin_rank_in = wia_comm_rank(comm);
  int origin = -1, origin_size = -1;
  if (wia_comm_origin_rank(comm, origin_rank_in, &origin, &origin_size) != WIA_SUCCESS ||
      origin != rank || origin_size != total_ranks)
    return kWrong;
  wia_destroy_communicator(comm);
  const std::vector<double> want = reference(total_ranks / 2);
  for (std::size_t i = 0; i < kCount; ++i)
    if (static_cast<double>(params[i]) != want[i]) {
      std::fprintf(stderr, "rank %d: parameter %zu is %.9g, the reference %.9g\n", rank, i,
                   params[i], want[i]);
      return kWrong;
    }
  // Who stood in: the dead rank's partner only.
  const bool alone = v.partner < 0;
  const bool want_alone = recoveries > 0 && rank == 1;
  std::fprintf(stderr, "rank %d: done, %d recoveries, scale %g, partner %d\n", rank, recoveries,
               v.gradient_scale, v.partner);
  return alone == want_alone && v.gradient_scale == (want_alone ? 2.0 : 1.0) ? kOk : kWrong;
}

}  // namespace

TEST_CASE("redundancy: with WIA_RECOVERY_INSTANT training goes on past a SIGKILLed rank") {
  for (const char* transport : {"shm", "tcp"}) {
    INFO(transport);
    const auto st = run_ranks(
        4, base_yaml(),
        [](int rank, int nranks) { return train(rank, nranks, {3}, 3, -1); },
        {{"TEST_WIA_ID", unique_id_env()}, {"WIA_TRANSPORT", transport}});
    REQUIRE(st.size() == 4);
    CHECK(st[0] == kOk);
    CHECK(st[1] == kOk);
    CHECK(st[2] == kOk);
    CHECK(st[3] == -SIGKILL);
  }
}

TEST_CASE("redundancy: with no failure the view keeps the spec's pairs and the result is exact") {
  const auto st = run_ranks(
      4, base_yaml(), [](int rank, int nranks) { return train(rank, nranks, {}, -1, -1); },
      {{"TEST_WIA_ID", unique_id_env()}});
  check_all(st);
}

TEST_CASE("redundancy: both replicas of a shard dead is named on every survivor") {
  const auto st = run_ranks(
      4, base_yaml(), [](int rank, int nranks) { return train(rank, nranks, {1, 3}, 2, 1); },
      {{"TEST_WIA_ID", unique_id_env()}});
  REQUIRE(st.size() == 4);
  CHECK(st[0] == kSawError);
  CHECK(st[2] == kSawError);
  CHECK(st[1] == -SIGKILL);
  CHECK(st[3] == -SIGKILL);
}
