// SPDX-License-Identifier: Apache-2.0
// tuner::choose_link_codec: compression between hosts where the cost model
// says it pays, on two-level models of 2 hosts x 2 ranks (and one host).
// The estimates are checked against the closed forms written out here
// from the model's figures (docs/compression.md, "Compression between
// hosts"), the choices against the seed's bandwidth classes.
#include <doctest/doctest.h>

#include <vector>

#include "compress/codec.hpp"
#include "tuner/link_codec.hpp"

using namespace wia::tuner;

namespace {

LinkModel hosts_of_two(double inside_gbps, double between_gbps) {
  const std::vector<std::int32_t> host = {0, 0, 1, 1};
  return LinkModel::two_level(4, host, 1.0, inside_gbps, 50.0, between_gbps, between_gbps);
}

LinkCodecCall call_of(std::uint64_t count, LinkCodec forced = LinkCodec::kNone) {
  LinkCodecCall c;
  c.hosts = 2;
  c.per_host = 2;
  c.count = count;
  c.forced = forced;
  return c;
}

}  // namespace

TEST_CASE("link codec: int8 over a 1 Gbit/s link between hosts, at 64 MiB") {
  const std::uint64_t n = 16u << 20;  // 64 MiB of float32
  const LinkCodecChoice c = choose_link_codec(hosts_of_two(20.0, 0.125), call_of(n));
  CHECK(c.codec == LinkCodec::kInt8);
  CHECK(c.between_gbps == doctest::Approx(0.125));
  // int8: inside 2 (L-1) alpha + 2 (L-1)/L B / bw; between 2 (H-1) alpha +
  // 2 L (H-1)/H m / bw with m the block's message; codec 2 x block x 4 ns.
  const double bytes = n * 4.0, block = n / 2.0;
  const double m = static_cast<double>(wia::compress::quantize_bytes(n / 2, 8, 256));
  const double want = 2 * 1.0 + bytes / 20e3 + 2 * 50.0 + 2.0 * m / 0.125e3 + 2 * block * 4.0 / 1e3;
  CHECK(c.int8_us == doctest::Approx(want).epsilon(1e-9));
  // Plain (the tuner's best: hierarchical) moves the host's float32 sum
  // over the slow link, int8 a quarter of it: 2.6x here.
  CHECK(c.plain_us > 2.0 * c.int8_us);
  CHECK(c.why.find("int8, estimated") != std::string::npos);
}

TEST_CASE("link codec: bf16 is the candidate from 10 to 50 GB/s, kept only where it pays") {
  const std::uint64_t n = 16u << 20;
  // At 12.5 GB/s the cast saves 32 MiB on the link (2.7 ms) but costs 8 ms
  // of CPU on each rank's half: plain stays (5.9 ms against 11.8).
  const LinkCodecChoice mid = choose_link_codec(hosts_of_two(100.0, 12.5), call_of(n));
  CHECK(mid.between_gbps == doctest::Approx(12.5));
  CHECK(mid.codec == LinkCodec::kNone);
  CHECK(mid.bf16_us > mid.plain_us);
  CHECK(mid.why.find("under 50 GB/s: bf16 if it pays") != std::string::npos);
  const LinkCodecChoice fast = choose_link_codec(hosts_of_two(100.0, 60.0), call_of(n));
  CHECK(fast.codec == LinkCodec::kNone);
  CHECK(fast.why.find("50 GB/s or more") != std::string::npos);
}

TEST_CASE("link codec: not where latency dominates, nor on one host; a policy is only costed") {
  // 4 KiB over the slow link: the extra rounds cost more than the bytes saved.
  const LinkCodecChoice small = choose_link_codec(hosts_of_two(20.0, 0.125), call_of(1024));
  CHECK(small.codec == LinkCodec::kNone);
  CHECK(small.int8_us > small.plain_us / kMinGain);
  // One host: nothing crosses.
  LinkCodecCall one = call_of(16u << 20);
  one.hosts = 1;
  one.per_host = 4;
  CHECK(choose_link_codec(hosts_of_two(20.0, 0.125), one).codec == LinkCodec::kNone);
  // Forced by policy: applied even where it does not pay.
  const LinkCodecChoice forced =
      choose_link_codec(hosts_of_two(100.0, 60.0), call_of(1024, LinkCodec::kBf16));
  CHECK(forced.codec == LinkCodec::kBf16);
  CHECK(forced.why.find("policy") != std::string::npos);
}
