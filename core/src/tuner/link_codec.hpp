// SPDX-License-Identifier: Apache-2.0
// Compression as a property of the link between hosts (docs/compression.md,
// "Compression between hosts"): whether a plain float32 all-reduce on a
// communicator of several hosts runs faster as a lossy one, dense inside
// each host and quantized (int8) or cast (bfloat16) between hosts, and by
// how much, from the communicator's cost model. Pure: no network, no
// clock, the same answer on every rank (which all must make the same
// choice).
#pragma once

#include <cstdint>
#include <string>

#include "tuner/cost_model.hpp"

namespace wia::tuner {

enum class LinkCodec : std::uint8_t { kNone, kInt8, kBf16 };
const char* link_codec_name(LinkCodec c);  // "none", "int8", "bf16"

// What the choice is made from: the communicator's hosts (equally many
// ranks each, rank r on host node_of_rank[r] of the model) and the call.
struct LinkCodecCall {
  std::int32_t hosts = 1, per_host = 1;
  std::uint64_t count = 0;  // float32 entries
  // Already chosen by the caller (policy "int8" or "bf16"): only costed.
  LinkCodec forced = LinkCodec::kNone;
};

struct LinkCodecChoice {
  LinkCodec codec = LinkCodec::kNone;
  double plain_us = 0;      // the tuner's best plain all-reduce
  double int8_us = 0, bf16_us = 0;
  double between_gbps = 0;  // the slowest link between hosts
  double between_alpha_us = 0;
  std::string why;          // one sentence: the figures and the rule
};

// Codec CPU cost per float32 entry, one rank (encode + decode): fixed
// figures, not timings, so that every rank computes the same choice
// (docs/compression.md, "Codec throughput": int8 about 2 GB/s per core
// each way, the casts about 8).
inline constexpr double kInt8NsPerEntry = 4.0;
inline constexpr double kBf16NsPerEntry = 1.0;
// The spec's bandwidth classes (6.8): below 10 GB/s compress hard, below
// 50 moderately. Here: int8 below 10, bfloat16 below 50, each only when
// the estimate says it is at least kMinGain faster than plain.
inline constexpr double kInt8BelowGbps = 10.0;
inline constexpr double kBf16BelowGbps = 50.0;
inline constexpr double kMinGain = 1.2;

LinkCodecChoice choose_link_codec(const LinkModel& model, const LinkCodecCall& call);

}  // namespace wia::tuner
