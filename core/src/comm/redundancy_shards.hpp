// SPDX-License-Identifier: Apache-2.0
// Which data shard each rank computes under redundant gradient computation
// (spec 6.9.1, wia/redundancy.h), and what a failure leaves of each: pure
// arithmetic on the members' origin ranks, so every survivor reaches the
// same answer without talking.
#pragma once

#include <wia/wia.h>

#include <string>
#include <vector>

namespace wia::comm {

struct RedundancyView {
  int shard = 0;
  int num_shards = 0;
  int live_replicas = 0;
  int partner = -1;  // a rank of the communicator, -1 if none
  double gradient_scale = 1.0;
};

// `origins[r]` is member r's rank in the origin communicator of
// `origin_size` ranks (ascending, as shrinks keep them); `me` is a member.
// Origin rank o computes shard o % S, S = origin_size / factor, so with a
// factor of 2 the spec's partner (rank + size / 2) % size shares it.
// Throws wia::Error: a bad config (INVALID_ARGUMENT), a shard without a
// live replica under WIA_RECOVERY_INSTANT, or any lost rank under
// WIA_RECOVERY_CHECKPOINT (REMOTE, naming the shards and ranks).
RedundancyView redundancy_view(const wia_redundancy_config_t& config, int origin_size,
                               const std::vector<int>& origins, int me);

}  // namespace wia::comm
