// SPDX-License-Identifier: Apache-2.0
// wia_get_redundancy_view's arithmetic: shards, partners and the scale a
// survivor gives its gradient, checked against a brute-force count of each
// shard's replicas, and every way it must refuse.
#include <doctest/doctest.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "comm/redundancy_shards.hpp"
#include "common/error.hpp"

using wia::comm::redundancy_view;

namespace {

wia_redundancy_config_t instant(int k) { return {k, WIA_RECOVERY_INSTANT}; }

std::string refusal(const wia_redundancy_config_t& c, int n, const std::vector<int>& origins) {
  try {
    redundancy_view(c, n, origins, 0);
  } catch (const wia::Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("redundancy: with no failure the partner is the spec's (rank + size / 2) % size") {
  for (int n : {2, 4, 8, 16}) {
    std::vector<int> all;
    for (int r = 0; r < n; ++r) all.push_back(r);
    for (int r = 0; r < n; ++r) {
      const auto v = redundancy_view(instant(2), n, all, r);
      CHECK(v.partner == (r + n / 2) % n);
      CHECK(v.shard == r % (n / 2));
      CHECK(v.num_shards == n / 2);
      CHECK(v.live_replicas == 2);
      CHECK(v.gradient_scale == 1.0);
    }
  }
}

TEST_CASE("redundancy: scaled survivors sum to the whole job's sum of every shard") {
  // 12 ranks, factor 3 (4 shards); lose ranks one at a time, never the
  // last replica of a shard; after each loss, sum scale * shard value over
  // the survivors and compare with 3 * the sum over shards, counted here
  // from the definition (shard s = ranks s, s + 4, s + 8).
  const int n = 12, k = 3, shards = n / k;
  std::vector<int> members;
  for (int r = 0; r < n; ++r) members.push_back(r);
  for (int lost : {5, 0, 11, 6, 8, 3}) {
    std::erase(members, lost);
    double sum = 0;
    for (std::size_t me = 0; me < members.size(); ++me) {
      const auto v = redundancy_view(instant(k), n, members, static_cast<int>(me));
      int replicas = 0;
      for (int o : members) replicas += o % shards == members[me] % shards;
      CHECK(v.live_replicas == replicas);
      CHECK(v.shard == members[me] % shards);
      if (replicas > 1) {
        REQUIRE(v.partner >= 0);
        CHECK(v.partner != static_cast<int>(me));
        CHECK(members[static_cast<std::size_t>(v.partner)] % shards == v.shard);
      } else {
        CHECK(v.partner == -1);
      }
      sum += v.gradient_scale * (v.shard + 1.0);
    }
    CHECK(sum == doctest::Approx(k * (1.0 + 2.0 + 3.0 + 4.0)));
  }
}

TEST_CASE("redundancy: refusals name what is wrong") {
  CHECK(refusal(instant(3), 4, {0, 1, 2, 3}).find("redundancy_factor 3") != std::string::npos);
  CHECK(refusal(instant(0), 4, {0, 1, 2, 3}).find("redundancy_factor 0") != std::string::npos);
  wia_redundancy_config_t bad_mode = instant(2);
  const std::int32_t seven = 7;  // what a C caller may store; C++ may not write it as the enum
  std::memcpy(&bad_mode.failure_recovery, &seven, sizeof seven);
  CHECK(refusal(bad_mode, 4, {0, 1, 2, 3}).find("failure_recovery 7") != std::string::npos);
  // Both replicas of shard 1 (ranks 1 and 3) gone.
  const std::string both = refusal(instant(2), 4, {0, 2});
  CHECK(both.find("shard 1 (ranks 1, 3)") != std::string::npos);
  CHECK(both.find("shard 0") == std::string::npos);
  // Checkpoint mode: any loss means a restore.
  const std::string ckpt = refusal({2, WIA_RECOVERY_CHECKPOINT}, 4, {0, 1, 2});
  CHECK(ckpt.find("rank(s) 3") != std::string::npos);
  CHECK(ckpt.find("wia_load_latest_checkpoint") != std::string::npos);
  CHECK(refusal({2, WIA_RECOVERY_CHECKPOINT}, 4, {0, 1, 2, 3}).empty());
  // A factor of 1: no redundancy, every loss is a lost shard.
  CHECK(refusal(instant(1), 3, {0, 2}).find("shard 1 (ranks 1)") != std::string::npos);
}
