// SPDX-License-Identifier: Apache-2.0
// The compressed all-reduce across hosts (docs/compression.md, "Across
// hosts"). On a process communicator of H > 1 hosts with L > 1 ranks each,
// a quantized or cast call without error feedback compresses only what
// crosses between hosts:
//   1. a dense reduce-scatter over the host's L ranks (shared memory):
//      local rank l holds block l of its host's sum;
//   2. the compressed all-reduce of block l among the H ranks that are
//      local rank l of their host: only these bytes cross the slow links,
//      each host's sum once instead of each rank's vector;
//   3. a dense all-gather of the blocks over the host's ranks.
// Flat, every rank's quantized shards cross between hosts: L times the
// bytes on the slowest link. With error feedback the flat call runs: its
// residual is this rank's input's, which a host's sum has no place for.
// Top-k and random-k run flat too: their messages are a small part of the
// vector, which the dense steps would move whole (random-k 1 %, 64 MiB,
// 2 hosts of 2 ranks at 1 Gbit/s: 0.11 s flat, 0.27 s across hosts).
//
// The two communicators of steps 1-3 are split from the call's once (a
// collective over it, at the first call that qualifies, which is the same
// call on every rank) and destroyed with it.
#include <fmt/format.h>
#include <wia/wia.h>

#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "api/communicators.hpp"
#include "api/compress_job.hpp"
#include "api/guard.hpp"
#include "comm/communicator_base.hpp"
#include "common/error.hpp"
#include "common/log.hpp"
#include "common/page_aligned.hpp"
#include "compress/state.hpp"
#include "comm/process_communicator.hpp"
#include "runtime/runtime.hpp"
#include "tuner/link_codec.hpp"

namespace wia::api::compressed {
namespace {

struct Split {
  wia_communicator_t host = nullptr;    // this rank's host's ranks, by local rank
  wia_communicator_t across = nullptr;  // local rank l of every host, by host
};

std::mutex g_mu;
std::mutex g_split_mu;  // one split at a time (a collective, which blocks)
std::map<const void*, Split> g_splits;  // by the call's communicator
// Communicators made with WIA_NET_COMPRESS_AUTO (the others follow
// compression.link_codec), and each one's choices by size bucket.
std::map<const void*, tuner::LinkCodec> g_auto;
std::map<std::pair<const void*, std::uint32_t>, tuner::LinkCodec> g_chosen;

// Per call: the blocks and, when count is not a multiple of L, the padded
// input and output (freed by the last task on the stream).
struct Scratch {
  std::vector<float, PageAligned<float>> padded_in, gathered, block_in, block_out;
  const float* in = nullptr;
  float* out = nullptr;
  std::size_t count = 0;
  float scale = 1.0f;  // 1/p for an average
};

void check(wia_status_t st) {
  if (st != WIA_SUCCESS) throw Error(st, wia_get_last_error());
}

}  // namespace

int ranks_per_host(const comm::CommunicatorBase& c) {
  const int hosts = c.node_count();
  if (hosts < 2) return 0;
  std::vector<int> per_host(static_cast<std::size_t>(hosts), 0);
  for (int r = 0; r < c.size(); ++r) ++per_host[static_cast<std::size_t>(c.node_rank(r))];
  for (const int n : per_host)
    if (n != per_host[0]) return 0;
  return per_host[0];
}

namespace {

Split split_of(wia_communicator_t comm, const comm::CommunicatorBase& c) {
  // Held across the split: two threads posting on one communicator must
  // not both split it.
  std::lock_guard<std::mutex> once(g_split_mu);
  {
    std::lock_guard<std::mutex> lock(g_mu);
    if (const auto it = g_splits.find(comm); it != g_splits.end()) return it->second;
  }
  const int me = wia_comm_rank(comm);
  const int host = c.node_rank(me), local = c.local_rank(me);
  Split s;
  check(wia_comm_split(comm, host, local, &s.host));
  if (const wia_status_t st = wia_comm_split(comm, local, host, &s.across); st != WIA_SUCCESS) {
    const std::string why = wia_get_last_error();
    wia_destroy_communicator(s.host);
    throw Error(st, why);
  }
  log::info("compress", "rank {}: compressed all-reduces cross hosts from local rank {} of host "
            "{} only (a communicator of {} ranks inside the host, one of {} across)",
            me, local, host, wia_comm_size(s.host), wia_comm_size(s.across));
  std::lock_guard<std::mutex> lock(g_mu);
  g_splits[comm] = s;
  return s;
}

}  // namespace

bool post_across_hosts(wia_communicator_t comm, const comm::CommunicatorBase& c,
                       const void* input, void* output, std::size_t count, wia_reduce_op_t op,
                       const wia_compression_config_t& cfg, wia_stream_t stream,
                       const void* state_key) {
  if (count == 0 || !Runtime::get().config().get_bool("compression.across_hosts")) return false;
  const int L = ranks_per_host(c);
  if (L < 2) return false;

  const Split s = split_of(comm, c);
  auto scratch = std::make_unique<Scratch>();
  Scratch& x = *scratch;
  const std::size_t block = (count + L - 1) / static_cast<std::size_t>(L);
  const bool padded = block * static_cast<std::size_t>(L) != count;
  x.in = static_cast<const float*>(input);
  x.out = static_cast<float*>(output);
  x.count = count;
  x.scale = op == WIA_REDUCE_AVG ? 1.0f / static_cast<float>(c.size()) : 1.0f;
  x.block_in.resize(block);
  x.block_out.resize(block);
  if (padded) {
    x.padded_in.resize(block * static_cast<std::size_t>(L));
    x.gathered.resize(block * static_cast<std::size_t>(L));
  }
  Scratch* raw = scratch.release();
  // From here the last task frees the scratch, whatever was posted.
  wia_status_t st = WIA_SUCCESS;
  std::string why;
  auto step = [&](auto&& post) {
    if (st != WIA_SUCCESS) return;
    st = post();
    if (st != WIA_SUCCESS) why = wia_get_last_error();
  };
  auto host = [&](void (*fn)(void*)) {
    step([&] { return wia_launch_host_func(stream, fn, raw); });
  };
  if (padded)
    host([](void* a) {
      auto* x = static_cast<Scratch*>(a);
      std::memcpy(x->padded_in.data(), x->in, x->count * sizeof(float));
      std::fill(x->padded_in.begin() + static_cast<std::ptrdiff_t>(x->count), x->padded_in.end(),
                0.0f);
    });
  wia_collective_config_t sum{};
  sum.operation = WIA_COLLECTIVE_REDUCE_SCATTER;
  sum.reduction_op = WIA_REDUCE_SUM;
  sum.datatype = WIA_FLOAT32;
  step([&] {
    return wia_reduce_scatter(s.host, padded ? raw->padded_in.data() : raw->in,
                              raw->block_in.data(), block, &sum, stream);
  });
  // The blocks' compression state (its step counter: random-k's indices
  // and the rounding noise change every call) is keyed by the caller's
  // buffer, stable across calls, not by this call's scratch.
  step([&] {
    return guard("wia_all_reduce_compressed", [&] {
      post_compressed(s.across, raw->block_in.data(), raw->block_out.data(), block,
                      WIA_FLOAT32, WIA_REDUCE_SUM, &cfg, stream, state_key ? state_key : input);
    });
  });
  if (x.scale != 1.0f)
    host([](void* a) {
      auto* x = static_cast<Scratch*>(a);
      for (float& v : x->block_out) v *= x->scale;
    });
  step([&] {
    return wia_all_gather(s.host, raw->block_out.data(),
                          padded ? raw->gathered.data() : raw->out, block, WIA_FLOAT32, stream);
  });
  if (padded)
    host([](void* a) {
      auto* x = static_cast<Scratch*>(a);
      std::memcpy(x->out, x->gathered.data(), x->count * sizeof(float));
    });
  if (wia_launch_host_func(stream, [](void* a) { delete static_cast<Scratch*>(a); }, raw) !=
      WIA_SUCCESS)
    log::error("compress", "a compressed call's scratch is leaked: {}", wia_get_last_error());
  if (st != WIA_SUCCESS) throw Error(st, why);
  return true;
}

void link_codec_auto(const void* comm) {
  std::lock_guard<std::mutex> lock(g_mu);
  g_auto[comm] = tuner::LinkCodec::kNone;
}

LinkCodecPolicy link_codec_policy(wia_communicator_t comm, const comm::ProcessCommunicator& c) {
  LinkCodecPolicy p;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    p.automatic = g_auto.count(comm) > 0;
  }
  if (c.link_compress()) p.rule = &*c.link_compress();
  p.policy = p.automatic ? "auto"
             : p.rule    ? p.rule->method
                         : Runtime::get().config().get_string("compression.link_codec");
  return p;
}

// Compression as a property of the links between hosts
// (docs/compression.md, "Compression between hosts"): policy "int8" or
// "bf16" always, "auto" where tuner::choose_link_codec estimates it pays.
bool all_reduce_with_link_codec(wia_communicator_t comm, const void* send, void* recv,
                                std::size_t count, const wia_collective_config_t& cfg,
                                wia_stream_t stream) {
  auto* pc = dynamic_cast<comm::ProcessCommunicator*>(&api::live(comm));
  // Ranks whose compression keys differ all know it: all run plain.
  if (pc == nullptr || !pc->compression_keys_differ().empty()) return false;
  const LinkCodecPolicy asked = link_codec_policy(comm, *pc);
  const std::string& policy = asked.policy;
  const bool automatic = asked.automatic;
  const selector::LinkCompress* rule = asked.rule;
  if (policy == "none") return false;
  const auto min_bytes = static_cast<std::uint64_t>(
      Runtime::get().config().get_int("compression.link_codec_min_bytes"));
  if (api::raw_enum(cfg.datatype) != WIA_FLOAT32 ||
      (api::raw_enum(cfg.reduction_op) != WIA_REDUCE_SUM &&
       api::raw_enum(cfg.reduction_op) != WIA_REDUCE_AVG) ||
      api::raw_enum(cfg.algorithm) != 0 || count * 4 < min_bytes)
    return false;
  const comm::CommunicatorBase& c = *pc;
  const int per_host = ranks_per_host(c);
  if (per_host < 1) return false;
  const std::uint32_t bucket = tuner::Selector::size_bucket(count);
  tuner::LinkCodec codec = tuner::LinkCodec::kNone;
  bool known = false;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    if (const auto it = g_chosen.find({comm, bucket}); it != g_chosen.end())
      codec = it->second, known = true;
  }
  if (!known) {
    const auto model = pc->cost_model();
    if (!model) return false;
    tuner::LinkCodecCall call;
    call.hosts = c.node_count();
    call.per_host = per_host;
    call.count = count;
    call.forced = policy == "int8"   ? tuner::LinkCodec::kInt8
                  : policy == "bf16" ? tuner::LinkCodec::kBf16
                                     : tuner::LinkCodec::kNone;
    const tuner::LinkCodecChoice choice = tuner::choose_link_codec(*model, call);
    codec = choice.codec;
    // The rule's `when`: only over links slower than it says.
    const bool too_fast = !automatic && rule && rule->below_gbps > 0 &&
                          choice.between_gbps >= rule->below_gbps;
    if (too_fast) codec = tuner::LinkCodec::kNone;
    log::info("compress", "rank {}: float32 all-reduces of about {} entries (compression "
              "{}): {}{}",
              wia_comm_rank(comm), count,
              automatic ? "WIA_NET_COMPRESS_AUTO"
              : rule    ? fmt::format("rule {} at {}", rule->describe(), rule->where)
                        : "compression.link_codec " + policy,
              choice.why,
              too_fast ? fmt::format("; not compressed: {:g} GB/s between hosts is not under "
                                     "the rule's {:g}",
                                     choice.between_gbps, rule->below_gbps)
                       : "");
    std::lock_guard<std::mutex> lock(g_mu);
    g_chosen[{comm, bucket}] = codec;
  }
  if (codec == tuner::LinkCodec::kNone) return false;
  // The codecs run on the CPU: device memory runs plain.
  if (!host_accessible(send) || !host_accessible(recv)) return false;
  wia_compression_config_t cc{};
  if (codec == tuner::LinkCodec::kInt8) {
    cc.method = WIA_COMPRESS_QUANTIZE;
    cc.parameters.quantize.num_bits = 8;
    cc.parameters.quantize.use_dynamic_range = true;
  } else {
    cc.method = WIA_COMPRESS_BF16;
  }
  // No error feedback here, so the state holds only the step counter (the
  // rounding noise's) and spare workspaces: one per size bucket, not one
  // per buffer address, which a caching allocator would grow without end.
  static const char bucket_keys[64] = {};
  post_compressed(comm, send, recv, count, WIA_FLOAT32,
                  static_cast<wia_reduce_op_t>(api::raw_enum(cfg.reduction_op)), &cc, stream,
                  &bucket_keys[std::min<std::uint32_t>(bucket, 63)]);
  return true;
}

void forget_across_hosts(const void* comm) noexcept {
  {
    std::lock_guard<std::mutex> lock(g_mu);
    g_auto.erase(comm);
    for (auto it = g_chosen.begin(); it != g_chosen.end();)
      it = it->first.first == comm ? g_chosen.erase(it) : std::next(it);
  }
  Split s;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    const auto it = g_splits.find(comm);
    if (it == g_splits.end()) return;
    s = it->second;
    g_splits.erase(it);
  }
  for (wia_communicator_t part : {s.across, s.host})
    if (wia_destroy_communicator(part) != WIA_SUCCESS)
      log::warn("compress", "destroying a communicator of compressed calls across hosts: {}",
                wia_get_last_error());
}

void reset_across_hosts(const void* comm) noexcept {
  std::lock_guard<std::mutex> lock(g_mu);
  if (const auto it = g_splits.find(comm); it != g_splits.end())
    compress::states().forget(it->second.across);
}

}  // namespace wia::api::compressed
