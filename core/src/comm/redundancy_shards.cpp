// SPDX-License-Identifier: Apache-2.0
#include "comm/redundancy_shards.hpp"

#include <fmt/format.h>

#include <cstdint>
#include <cstring>

#include "common/error.hpp"

namespace wia::comm {
namespace {

std::string join(const std::vector<int>& v) {
  std::string s;
  for (int x : v) s += (s.empty() ? "" : ", ") + std::to_string(x);
  return s;
}

}  // namespace

RedundancyView redundancy_view(const wia_redundancy_config_t& config, int origin_size,
                               const std::vector<int>& origins, int me) {
  const int k = config.redundancy_factor;
  // Copied out as an int: a C caller may store any value in the enum,
  // which C++ may not read as the enum.
  std::int32_t mode;
  static_assert(sizeof mode == sizeof config.failure_recovery);
  std::memcpy(&mode, &config.failure_recovery, sizeof mode);
  if (mode != WIA_RECOVERY_INSTANT && mode != WIA_RECOVERY_CHECKPOINT)
    throw Error(WIA_ERROR_INVALID_ARGUMENT,
                fmt::format("failure_recovery {} is neither WIA_RECOVERY_INSTANT nor "
                            "WIA_RECOVERY_CHECKPOINT",
                            mode));
  if (k < 1 || k > origin_size || origin_size % k != 0)
    throw Error(WIA_ERROR_INVALID_ARGUMENT,
                fmt::format("redundancy_factor {} does not divide the communicator's {} ranks "
                            "(its size before any shrink) into equal replica groups",
                            k, origin_size));
  const int shards = origin_size / k;
  std::vector<std::vector<int>> live(static_cast<std::size_t>(shards));
  for (int o : origins) live[static_cast<std::size_t>(o % shards)].push_back(o);

  std::vector<int> lost_ranks, lost_shards;
  for (int o = 0, m = 0; o < origin_size; ++o) {
    if (m < static_cast<int>(origins.size()) && origins[static_cast<std::size_t>(m)] == o)
      ++m;
    else
      lost_ranks.push_back(o);
  }
  for (int s = 0; s < shards; ++s)
    if (live[static_cast<std::size_t>(s)].empty()) lost_shards.push_back(s);

  if (mode == WIA_RECOVERY_CHECKPOINT && !lost_ranks.empty())
    throw Error(WIA_ERROR_REMOTE,
                fmt::format("rank(s) {} of the original {} failed and failure_recovery is "
                            "WIA_RECOVERY_CHECKPOINT: restore the latest checkpoint "
                            "(wia_load_latest_checkpoint) on the shrunk communicator",
                            join(lost_ranks), origin_size));
  if (!lost_shards.empty()) {
    std::string which;
    for (int s : lost_shards) {
      std::vector<int> replicas;
      for (int o = s; o < origin_size; o += shards) replicas.push_back(o);
      which += fmt::format("{}shard {} (ranks {})", which.empty() ? "" : "; ", s, join(replicas));
    }
    throw Error(WIA_ERROR_REMOTE,
                fmt::format("every replica of {} failed: no partner's copy can stand in "
                            "(WIA_RECOVERY_INSTANT); restore the latest checkpoint",
                            which));
  }

  RedundancyView v;
  const int mine = origins.at(static_cast<std::size_t>(me));
  v.shard = mine % shards;
  v.num_shards = shards;
  const std::vector<int>& group = live[static_cast<std::size_t>(v.shard)];
  v.live_replicas = static_cast<int>(group.size());
  // The next live replica after this one, cyclically in origin order: with
  // no failure and a factor of 2, the spec's (rank + size / 2) % size.
  if (group.size() > 1) {
    std::size_t at = 0;
    while (group[at] != mine) ++at;
    const int next = group[(at + 1) % group.size()];
    for (std::size_t r = 0; r < origins.size(); ++r)
      if (origins[r] == next) v.partner = static_cast<int>(r);
  }
  v.gradient_scale = static_cast<double>(k) / v.live_replicas;
  return v;
}

}  // namespace wia::comm
