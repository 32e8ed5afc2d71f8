// SPDX-License-Identifier: Apache-2.0
// wia-info --checkpoints DIR: every checkpoint in a checkpoint directory
// (docs/checkpoints.md), which one `latest` names, and for each committed
// one its ranks, tensors, bytes and metadata, with every shard loaded and
// every checksum verified as a job would; uncommitted ones are listed with
// what they hold (and any rank's .failed message).
#pragma once

#include <string>

namespace wia_info {

// Prints the report; 0 when every committed checkpoint verifies, 1 when one
// is damaged or DIR cannot be read.
int checkpoint_report(const std::string& dir);

}  // namespace wia_info
