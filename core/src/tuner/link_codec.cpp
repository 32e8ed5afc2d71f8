// SPDX-License-Identifier: Apache-2.0
#include "tuner/link_codec.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "compress/codec.hpp"

namespace wia::tuner {

const char* link_codec_name(LinkCodec c) {
  switch (c) {
    case LinkCodec::kInt8:
      return "int8";
    case LinkCodec::kBf16:
      return "bf16";
    default:
      return "none";
  }
}

namespace {

bool same_host(const LinkModel& m, std::int32_t a, std::int32_t b) {
  return !m.node_of_rank.empty() && m.node_of_rank[a] == m.node_of_rank[b];
}

}  // namespace

// The compressed call (compress_across_hosts.cpp), in alpha-beta terms:
//   inside each host, a dense reduce-scatter and all-gather over its L
//   ranks: 2 (L - 1) alpha_in + 2 (L - 1)/L B / bw_in;
//   between hosts, two phases (all-to-all of quantized shards, all-gather
//   of the reduced ones) of the blocks, the L ranks of a host sharing its
//   link: 2 (H - 1) alpha_out + 2 L (H - 1)/H m / bw_out, m one block's
//   message;
//   the codec: the block encoded and decoded twice (int8: input, then the
//   reduced shard), once (the casts).
// Plain: the tuner's choice among every all-reduce algorithm on the same
// model, as the call would run it.
LinkCodecChoice choose_link_codec(const LinkModel& model, const LinkCodecCall& call) {
  LinkCodecChoice out;
  const std::int32_t p = model.nranks, H = call.hosts, L = call.per_host;
  if (H < 2 || L < 1 || H * L != p || call.count == 0) {
    out.why = "one host: nothing crosses between hosts";
    return out;
  }
  double bw_out = 0, alpha_out = 0, bw_in = 0, alpha_in = 0;
  for (std::int32_t a = 0; a < p; ++a)
    for (std::int32_t b = 0; b < p; ++b) {
      if (a == b) continue;
      if (same_host(model, a, b)) {
        bw_in = bw_in == 0 ? model.bandwidth(a, b) : std::min(bw_in, model.bandwidth(a, b));
        alpha_in = std::max(alpha_in, model.alpha(a, b));
      } else {
        bw_out = bw_out == 0 ? model.bandwidth(a, b) : std::min(bw_out, model.bandwidth(a, b));
        alpha_out = std::max(alpha_out, model.alpha(a, b));
      }
    }
  if (model.port_gbps > 0 && (bw_out == 0 || model.port_gbps < bw_out)) bw_out = model.port_gbps;
  if (bw_in == 0) bw_in = bw_out;  // one rank per host: no dense steps anyway
  out.between_gbps = bw_out;
  out.between_alpha_us = alpha_out;
  const double bytes = static_cast<double>(call.count) * 4.0;
  out.plain_us = select_algorithm(coll::Collective::kAllReduce, call.count, WIA_FLOAT32, p, model)
                     .estimated_ms *
                 1e3;
  const std::uint64_t block = (call.count + L - 1) / static_cast<std::uint64_t>(L);
  const double inside =
      L > 1 ? 2.0 * (L - 1) * alpha_in + 2.0 * (L - 1) / L * bytes / (bw_in * 1e3) : 0.0;
  auto between = [&](double message_bytes) {
    return 2.0 * (H - 1) * alpha_out +
           2.0 * L * (H - 1) / H * message_bytes / (bw_out * 1e3);
  };
  const double int8_msg =
      static_cast<double>(compress::quantize_bytes(block, 8, compress::kChunk));
  out.int8_us = inside + between(int8_msg) +
                2.0 * static_cast<double>(block) * kInt8NsPerEntry / 1e3;
  out.bf16_us = inside + between(static_cast<double>(block) * 2.0) +
                static_cast<double>(block) * kBf16NsPerEntry / 1e3;

  LinkCodec candidate = call.forced;
  if (candidate == LinkCodec::kNone)
    candidate = bw_out < kInt8BelowGbps   ? LinkCodec::kInt8
                : bw_out < kBf16BelowGbps ? LinkCodec::kBf16
                                          : LinkCodec::kNone;
  const double est = candidate == LinkCodec::kInt8   ? out.int8_us
                     : candidate == LinkCodec::kBf16 ? out.bf16_us
                                                     : out.plain_us;
  if (candidate != LinkCodec::kNone && (call.forced != LinkCodec::kNone ||
                                        out.plain_us >= kMinGain * est))
    out.codec = candidate;
  out.why = fmt::format(
      "{:.3g} GB/s between hosts ({}): plain {:.3f} ms, int8 {:.3f} ms, bf16 {:.3f} ms (cost "
      "model, {} hosts x {} ranks, {} float32): {}",
      bw_out,
      call.forced != LinkCodec::kNone ? "policy"
      : bw_out < kInt8BelowGbps       ? "under 10 GB/s: int8 if it pays"
      : bw_out < kBf16BelowGbps       ? "under 50 GB/s: bf16 if it pays"
                                      : "50 GB/s or more: no compression",
      out.plain_us / 1e3, out.int8_us / 1e3, out.bf16_us / 1e3, H, L, call.count,
      out.codec == LinkCodec::kNone
          ? std::string("plain")
          : out.plain_us >= est
              ? fmt::format("{}, estimated {:.1f}x faster", link_codec_name(out.codec),
                            out.plain_us / est)
              : fmt::format("{}, estimated {:.1f}x slower (asked for)",
                            link_codec_name(out.codec), est / out.plain_us));
  return out;
}

}  // namespace wia::tuner
