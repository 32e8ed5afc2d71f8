// SPDX-License-Identifier: Apache-2.0
// One compressed or sparse all-reduce as it moves through the stream: a
// Job (its plan, the library state of its buffer, its workspace) and the
// host tasks that run on it, in this order:
//   encode  widen, add the residual, compress into a message whose size
//           was fixed at post time, update the residual;
//   (exchange: the ordinary collectives, posted by api_compress.cpp)
//   middle  PowerSGD and quantization in shards only: the step between
//           their two collectives;
//   decode  check every rank's header, sum, narrow, write the output.
// The last task frees the Job (decode, or release when posting failed).
#pragma once

#include <wia/wia.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "compress/codec.hpp"
#include "compress/state.hpp"

namespace wia::comm {
class CommunicatorBase;
class ProcessCommunicator;
}  // namespace wia::comm
namespace wia::selector {
struct LinkCompress;
}

namespace wia::api::compressed {

// "WIA_COMPRESS_TOPK", ...
const char* method_name(std::int32_t m);

// How a call is exchanged.
enum class Exchange {
  kGatherBytes,     // all-gather of byte messages with a header (top-k, quantize, 1-bit, sparse)
  kReduceFloat,     // all-reduce of float32 (random-k values, dense top-k)
  kReduceHalf,      // all-reduce of float16 / bfloat16 (the casts)
  kLowrank,         // all-reduce of P, host task, all-reduce of Q (PowerSGD)
  kQuantizeShards,  // all-to-all of quantized shards, host task (sum, re-quantize), all-gather
};

// Every gathered message starts with this (and reduced exchanges gather it
// first), so ranks that disagree on the method or its parameters find out
// instead of decoding each other wrongly.
struct Header {
  std::uint32_t method;
  std::uint32_t fingerprint;
};

struct Job {
  const void* owner = nullptr;  // the communicator handle
  int rank = 0, nranks = 1;
  std::int32_t method = WIA_COMPRESS_NONE;
  Header header{};
  bool sparse_call = false;  // wia_all_reduce_sparse*
  bool sparse_dense_out = false;
  const void* in = nullptr;
  const std::uint32_t* sparse_indices = nullptr;
  void* out = nullptr;
  std::size_t n = 0;  // dense entries
  // A segment of a pipelined call (api_compress.cpp): its first entry in
  // the caller's buffer, and the buffer's entries (the residual's length).
  std::size_t offset = 0, total = 0;
  std::size_t k = 0;  // sparse entries per rank
  wia_datatype_t dtype = WIA_FLOAT32;
  bool avg = false;
  bool ef = false;
  bool scale_randomk = false;
  bool magnitude = true;
  int bits = 8;
  std::size_t chunk = compress::kChunk;
  wia_datatype_t scale_type = WIA_FLOAT32;
  std::uint64_t seed = 0, step = 0;
  Exchange exchange = Exchange::kGatherBytes;
  std::size_t msg_bytes = 0;        // per rank, header included (kGatherBytes)
  std::size_t reduced = 0;          // entries all-reduced (the other exchanges; P for kLowrank)
  std::size_t shard = 0, slot = 0;  // kQuantizeShards: entries per shard, bytes per message
  bool mismatch = false;            // kQuantizeShards: found by the middle step
  compress::LowrankShape shape;     // kLowrank
  std::shared_ptr<compress::BufferState> state;
  // Taken from state at post, given back when the job ends (sparse calls,
  // which have no state, own theirs).
  std::unique_ptr<compress::Workspace> buf = std::make_unique<compress::Workspace>();
  Job() = default;
  Job(const Job&) = delete;
  Job& operator=(const Job&) = delete;
  ~Job() {
    if (state) state->give_back(std::move(buf));
  }
};

// Shard s of a vector of j.n entries (kQuantizeShards): j.shard entries
// from s * j.shard, fewer (or none) at the end.
template <typename T>
std::span<T> shard_of(const Job& j, std::vector<T>& v, int s) {
  const std::size_t begin = std::min(j.n, static_cast<std::size_t>(s) * j.shard);
  return std::span<T>(v).subspan(begin, std::min(j.shard, j.n - begin));
}

// The compressed all-reduce (api_compress.cpp), for the calls that build
// on it: the buffer's compression state (residual, step counter) is keyed
// by state_key when given, else by input.
void post_compressed(wia_communicator_t comm, const void* input, void* output, std::size_t count,
                     wia_datatype_t dtype, wia_reduce_op_t op, const wia_compression_config_t* cfg,
                     wia_stream_t stream, const void* state_key = nullptr);

// Whether p may be read by the CPU codecs: host memory, or an allocation
// of a CPU device.
bool host_accessible(const void* p);

// compress_across_hosts.cpp: posts a float32 call (quantization or a cast,
// without error feedback) as dense inside hosts and compressed between
// them, when the
// communicator spans several hosts of equally many ranks (and
// compression.across_hosts is on); false when it does not qualify.
// The blocks' compression state is keyed by state_key (the caller's input
// when null).
bool post_across_hosts(wia_communicator_t comm, const comm::CommunicatorBase& c,
                       const void* input, void* output, std::size_t count, wia_reduce_op_t op,
                       const wia_compression_config_t& cfg, wia_stream_t stream,
                       const void* state_key = nullptr);
// A plain float32 all-reduce on a communicator of several hosts, run
// compressed between hosts when the policy (compression.link_codec, or
// WIA_NET_COMPRESS_AUTO at creation: link_codec_auto) says so; false when
// it runs plain.
bool all_reduce_with_link_codec(wia_communicator_t comm, const void* send, void* recv,
                                std::size_t count, const wia_collective_config_t& cfg,
                                wia_stream_t stream);
void link_codec_auto(const void* comm);
// Who asks for compression between hosts on comm, first that applies:
// WIA_NET_COMPRESS_AUTO at creation ("auto"), the compress key of the
// selector rule of its links between nodes (`rule` set), the configuration
// (compression.link_codec); "none" when nobody does.
struct LinkCodecPolicy {
  std::string policy = "none";  // "none", "int8", "bf16", "auto"
  bool automatic = false;       // WIA_NET_COMPRESS_AUTO
  const selector::LinkCompress* rule = nullptr;
};
LinkCodecPolicy link_codec_policy(wia_communicator_t comm, const comm::ProcessCommunicator& c);
// The ranks on each host when c spans several hosts with equally many
// (else the blocks would not line up across hosts); 0 otherwise.
int ranks_per_host(const comm::CommunicatorBase& c);
// The communicators it split from comm: destroyed with comm; their
// compression state reset with comm's.
void forget_across_hosts(const void* comm) noexcept;
void reset_across_hosts(const void* comm) noexcept;

// The stream tasks (wia_host_fn_t); the argument is the Job. A task never
// throws into the runtime: an exception becomes the communicator's
// recorded error and NaN output.
void encode_task(void* job);
void lowrank_middle_task(void* job);
void quantize_shards_task(void* job);
void decode_task(void* job);   // frees the job
void release_task(void* job);  // frees the job (posting failed)

}  // namespace wia::api::compressed
