// SPDX-License-Identifier: Apache-2.0
// Compressed and sparse all-reduce (spec 6.8): validation, then three
// steps ordered on the call's stream, for either communicator kind:
//   encode  (a host task on the compression stream): widen, add the
//           residual, compress into a message of a size fixed at post
//           time, update the residual;
//   exchange (the ordinary collectives): all-gather of messages, or an
//           all-reduce where every rank's message has the same layout
//           (then a small all-gather of headers first, so ranks whose
//           configs differ find out); PowerSGD has two all-reduces with a
//           host task between them;
//   decode  (a host task on the compression stream): sum, narrow, write.
// A Job carries one call through them and is freed by the last task.
// The Job and its stream tasks are in compress_job.{hpp,cpp}; this file
// validates, plans the exchange and posts it.
#include <fmt/format.h>
#include <wia/wia.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "api/communicators.hpp"
#include "api/compress_job.hpp"
#include "api/guard.hpp"
#include "comm/process_communicator.hpp"
#include "common/log.hpp"
#include "compress/codec.hpp"
#include "compress/state.hpp"
#include "config/config.hpp"
#include "kernels/cpu_reduce.hpp"
#include "runtime/objects.hpp"
#include "runtime/runtime.hpp"

using namespace wia;

namespace {

using namespace wia::api::compressed;

// --- validation --------------------------------------------------------------

void check_status(wia_status_t st) {
  if (st < 0) throw Error(st, wia_get_last_error());
}

// Input and output must be host-accessible and large enough.
void check_host_buffer(const void* p, std::uint64_t bytes, const char* what) {
  if (bytes == 0) return;
  api::require_non_null(p, what);
  if (auto a = objects().allocations.find(p)) {
    const std::uint64_t off = reinterpret_cast<std::uintptr_t>(p) - a->base;
    if (bytes > a->size - off)
      throw Error(WIA_ERROR_INVALID_ARGUMENT,
                  fmt::format("{} needs {} bytes but only {} remain in its allocation on "
                              "device {}",
                              what, bytes, a->size - off, a->device));
    wia_device_properties_t props{};
    check_status(wia_get_device_properties(a->device, &props));
    if (props.kind != WIA_DEVICE_KIND_CPU)
      throw Error(WIA_ERROR_NOT_SUPPORTED,
                  fmt::format("{} is memory of device {} ({}); compression runs on the CPU and "
                              "needs host-accessible memory",
                              what, a->device, props.name));
  }
}

void check_float_type(wia_datatype_t t, const char* method) {
  if (t != WIA_FLOAT32 && t != WIA_FLOAT16 && t != WIA_BFLOAT16)
    throw Error(WIA_ERROR_INVALID_ARGUMENT,
                fmt::format("datatype {} is not supported by {}: it compresses float32, "
                            "float16 or bfloat16",
                            kernels::dtype_name(t), method));
}

double checked_ratio(double r, const char* field) {
  if (!(r > 0.0 && r <= 1.0))
    throw Error(WIA_ERROR_INVALID_ARGUMENT,
                fmt::format("config->parameters.{}.k_ratio is {} (must be in (0, 1])", field, r));
  return r;
}

struct Streams {
  wia_stream_t call;
  wia_stream_t work;  // where encode and decode run
  bool separate;
};

Streams resolve_streams(const wia_compression_config_t* cfg, wia_stream_t stream) {
  Streams s{stream, stream, false};
  if (cfg && cfg->compression_stream && cfg->compression_stream != stream) {
    wia_stream_s* a = resolve_stream(stream);
    wia_stream_s* b = resolve_stream(cfg->compression_stream);
    if (a != b) {
      if (a->device != b->device)
        throw Error(WIA_ERROR_INVALID_ARGUMENT,
                    fmt::format("config->compression_stream is on device {} but the call's "
                                "stream is on device {}",
                                b->device, a->device));
      s.work = cfg->compression_stream;
      s.separate = true;
    }
  }
  return s;
}

// Takes the error a stream task of this communicator found earlier.
void report_recorded_error(wia_communicator_t comm) {
  const std::string e = compress::states().take_error(comm);
  if (!e.empty())
    throw Error(WIA_ERROR_INVALID_ARGUMENT, fmt::format("an earlier compressed call: {}", e));
}

// Posts the exchange's steps on the streams. From the first post on, a task
// frees the job: decode when everything was posted, else release_task.
// A segment of a pipelined call (`segment`) encodes on the work stream
// without waiting for the call's stream (the caller made the work stream
// wait once, for the input), so it runs while the segments before it are
// exchanged; its other tasks run on the call's stream after its exchange.
void post_job(wia_communicator_t comm, std::unique_ptr<Job> job, const Streams& s,
              bool segment = false) {
  Job* j = job.release();
  wia_status_t st = WIA_SUCCESS;
  bool freed_by_decode = false;
  auto step = [&](auto&& post) {
    if (st == WIA_SUCCESS) st = post();
  };
  auto host = [&](void (*fn)(void*)) {
    const bool on_work = !segment || fn == encode_task;
    if (s.separate && !segment) step([&] { return wia_stream_wait_stream(s.work, s.call); });
    step([&] { return wia_launch_host_func(on_work ? s.work : s.call, fn, j); });
    if (fn == decode_task && st == WIA_SUCCESS) freed_by_decode = true;
    if (s.separate && on_work) step([&] { return wia_stream_wait_stream(s.call, s.work); });
  };
  wia_collective_config_t bytes_config{};
  bytes_config.operation = WIA_COLLECTIVE_ALLTOALL;
  bytes_config.datatype = WIA_UINT8;
  auto reduce = [&](const void* in, void* out, std::size_t n, wia_datatype_t t) {
    step([&] {
      wia_collective_config_t cc{};
      cc.operation = WIA_COLLECTIVE_ALLREDUCE;
      cc.reduction_op = WIA_REDUCE_SUM;
      cc.datatype = t;
      return wia_all_reduce(comm, in, out, n, &cc, s.call);
    });
  };
  if (j->exchange != Exchange::kGatherBytes && j->exchange != Exchange::kQuantizeShards)
    step([&] {
      return wia_all_gather(comm, &j->header, j->buf->headers.data(), sizeof(Header), WIA_UINT8,
                            s.call);
    });
  host(encode_task);
  switch (j->exchange) {
    case Exchange::kGatherBytes:
      step([&] {
        return wia_all_gather(comm, j->buf->send.data(), j->buf->recv.data(), j->msg_bytes,
                              WIA_UINT8, s.call);
      });
      break;
    case Exchange::kReduceFloat:
      reduce(j->buf->fsend.data(), j->buf->frecv.data(), j->reduced, WIA_FLOAT32);
      break;
    case Exchange::kReduceHalf:
      reduce(j->buf->hsend.data(), j->buf->hrecv.data(), j->reduced,
             j->method == WIA_COMPRESS_FP16 ? WIA_FLOAT16 : WIA_BFLOAT16);
      break;
    case Exchange::kQuantizeShards:
      step([&] {
        return wia_all_to_all_contiguous(comm, j->buf->send.data(), j->buf->recv.data(), j->slot,
                                         &bytes_config, s.call);
      });
      host(quantize_shards_task);
      step([&] {
        return wia_all_gather(comm, j->buf->send2.data(), j->buf->recv2.data(), j->slot, WIA_UINT8,
                              s.call);
      });
      break;
    case Exchange::kLowrank:
      reduce(j->buf->fsend.data(), j->buf->frecv.data(), j->reduced, WIA_FLOAT32);
      host(lowrank_middle_task);
      reduce(j->buf->qsend.data(), j->buf->qrecv.data(), j->buf->qsend.size(), WIA_FLOAT32);
      break;
  }
  host(decode_task);
  if (st == WIA_SUCCESS) return;
  const std::string why = wia_get_last_error();
  if (!freed_by_decode) {
    // Whatever was posted may still read the job: free it after all of it.
    if ((s.separate && wia_stream_wait_stream(s.call, s.work) != WIA_SUCCESS) ||
        wia_launch_host_func(s.call, release_task, j) != WIA_SUCCESS)
      log::error("compress", "a compression job is leaked: {}", wia_get_last_error());
  }
  throw Error(st, why);
}

// Validates config for (count, datatype, op) and plans the exchange: the
// method's parameters and every size, nothing allocated yet. method is not
// NONE.
void plan(Job& j, const wia_compression_config_t& cfg, std::int32_t method, std::size_t count,
          wia_datatype_t dtype, wia_reduce_op_t rop, int nranks) {
  check_float_type(dtype, method_name(method));
  if (rop != WIA_REDUCE_SUM && rop != WIA_REDUCE_AVG)
    throw Error(WIA_ERROR_INVALID_ARGUMENT,
                fmt::format("op {} is not supported by {}: only WIA_REDUCE_SUM and "
                            "WIA_REDUCE_AVG",
                            static_cast<int>(rop), method_name(method)));
  j.method = method;
  j.n = count, j.dtype = dtype;
  j.avg = rop == WIA_REDUCE_AVG;
  j.nranks = nranks;
  auto check_32bit = [&](const char* what) {
    if (count > std::numeric_limits<std::uint32_t>::max())
      throw Error(WIA_ERROR_NOT_SUPPORTED,
                  fmt::format("count {} is more than {}'s 32-bit indices address", count, what));
  };
  double ratio = 0;
  switch (method) {
    case WIA_COMPRESS_TOPK:
      ratio = checked_ratio(cfg.parameters.topk.k_ratio, "topk");
      j.magnitude = cfg.parameters.topk.use_magnitude;
      check_32bit("top-k");
      break;
    case WIA_COMPRESS_RANDOMK:
      ratio = checked_ratio(cfg.parameters.randomk.k_ratio, "randomk");
      j.seed = cfg.parameters.randomk.seed;
      check_32bit("random-k");
      break;
    case WIA_COMPRESS_QUANTIZE: {
      const int b = cfg.parameters.quantize.num_bits;
      if (b != 1 && b != 4 && b != 8 && b != 16)
        throw Error(WIA_ERROR_INVALID_ARGUMENT,
                    fmt::format("config->parameters.quantize.num_bits is {} (must be 1, 4, 8 "
                                "or 16)",
                                b));
      j.bits = b;
      j.chunk = cfg.parameters.quantize.use_dynamic_range ? compress::kChunk
                                                          : std::max<std::size_t>(count, 1);
      break;
    }
    case WIA_COMPRESS_ONEBIT: {
      const std::int32_t t = api::raw_enum(cfg.parameters.onebit.scaling_factor_precision);
      if (t != 0 && t != WIA_FLOAT32 && t != WIA_FLOAT16 && t != WIA_BFLOAT16)
        throw Error(WIA_ERROR_INVALID_ARGUMENT,
                    fmt::format("config->parameters.onebit.scaling_factor_precision is {} "
                                "(must be WIA_FLOAT32, WIA_FLOAT16 or WIA_BFLOAT16)",
                                t));
      j.scale_type = t == 0 ? WIA_FLOAT32 : static_cast<wia_datatype_t>(t);
      if (!cfg.error_feedback && !cfg.parameters.onebit.use_error_feedback)
        throw Error(WIA_ERROR_INVALID_ARGUMENT,
                    "WIA_COMPRESS_ONEBIT needs error feedback: set config->error_feedback or "
                    "config->parameters.onebit.use_error_feedback (signs alone are biased and "
                    "do not converge)");
      break;
    }
    case WIA_COMPRESS_LOWRANK: {
      const int r = cfg.parameters.lowrank.rank;
      const std::uint64_t rows = cfg.parameters.lowrank.rows;
      if (r < 1)
        throw Error(WIA_ERROR_INVALID_ARGUMENT,
                    fmt::format("config->parameters.lowrank.rank is {} (must be >= 1)", r));
      if (rows > count && count > 0)
        throw Error(
            WIA_ERROR_INVALID_ARGUMENT,
            fmt::format("config->parameters.lowrank.rows is {} but count is only {}", rows, count));
      j.shape = compress::lowrank_shape(count, static_cast<std::size_t>(rows), r);
      break;
    }
    default:
      break;
  }
  j.ef = cfg.error_feedback ||
         (method == WIA_COMPRESS_ONEBIT && cfg.parameters.onebit.use_error_feedback);
  j.scale_randomk = !j.ef;
  const std::size_t p = static_cast<std::size_t>(nranks);
  switch (method) {
    case WIA_COMPRESS_TOPK:
      j.k = compress::k_of(count, ratio);
      // All-gathered pairs (8 k p bytes in) cost more than a ring all-reduce
      // of the densified vector (about 8 n bytes) once k p > n: the union may
      // then cover every entry anyway.
      if (j.k * p > count) {
        j.exchange = Exchange::kReduceFloat;
        j.reduced = count;
      } else {
        j.msg_bytes = sizeof(Header) + j.k * sizeof(compress::Pair);
      }
      break;
    case WIA_COMPRESS_RANDOMK:
      j.k = compress::k_of(count, ratio);
      j.exchange = Exchange::kReduceFloat;
      j.reduced = j.k;
      break;
    case WIA_COMPRESS_QUANTIZE:
      // Without error feedback, in chunks, on 2 or more ranks: shards
      // reduced where they land and gathered quantized (each rank sends and
      // decodes about 2 n b/8 bytes, not p of them). With error feedback the
      // re-quantization of the sum would be an error no rank's residual
      // holds, so those calls gather whole messages.
      if (!j.ef && j.chunk == compress::kChunk && p > 1 && count >= p * compress::kChunk) {
        j.exchange = Exchange::kQuantizeShards;
        const std::size_t per = (count + p - 1) / p;
        j.shard = (per + compress::kChunk - 1) / compress::kChunk * compress::kChunk;
        j.slot = sizeof(Header) + compress::quantize_bytes(j.shard, j.bits, j.chunk);
        break;
      }
      j.msg_bytes = sizeof(Header) + compress::quantize_bytes(count, j.bits, j.chunk);
      break;
    case WIA_COMPRESS_ONEBIT:
      j.msg_bytes = sizeof(Header) + compress::onebit_bytes(count, j.scale_type);
      break;
    case WIA_COMPRESS_LOWRANK:
      j.exchange = Exchange::kLowrank;
      j.reduced = j.shape.rows * j.shape.rank;
      break;
    default:  // FP16, BF16
      j.exchange = Exchange::kReduceHalf;
      j.reduced = count;
  }
  std::uint64_t f = compress::derive_seed(
      std::bit_cast<std::uint64_t>(ratio), j.seed ^ (j.shape.rows << 20 | j.shape.rank),
      static_cast<std::uint64_t>(j.bits) << 32 | static_cast<std::uint64_t>(j.scale_type) << 8 |
          (j.magnitude ? 1u : 0u) | (j.chunk == compress::kChunk ? 2u : 0u) | (j.ef ? 4u : 0u));
  j.header = Header{static_cast<std::uint32_t>(method), static_cast<std::uint32_t>(f ^ (f >> 32))};
}

// What one rank sends for a planned job, with the bandwidth-optimal
// pattern of each exchange: (p - 1) copies of a gathered message, 2 (p - 1)
// / p of an all-reduced vector (ring), (p - 1) shard messages out and
// (p - 1) copies of its reduced one for the two-phase quantization.
std::size_t wire_bytes(const Job& j) {
  const std::size_t p = static_cast<std::size_t>(j.nranks);
  const std::size_t headers = (p - 1) * sizeof(Header);  // the gathered headers
  auto ring = [&](std::size_t bytes) { return 2 * (p - 1) * bytes / p; };
  switch (j.exchange) {
    case Exchange::kGatherBytes:
      return (p - 1) * j.msg_bytes;
    case Exchange::kReduceFloat:
      return headers + ring(j.reduced * sizeof(float));
    case Exchange::kReduceHalf:
      return headers + ring(j.reduced * sizeof(std::uint16_t));
    case Exchange::kLowrank:
      return headers + ring(j.reduced * sizeof(float)) +
             ring(j.shape.cols * j.shape.rank * sizeof(float));
    case Exchange::kQuantizeShards:
      return 2 * (p - 1) * j.slot;
  }
  return 0;
}

void allocate(Job& j) {
  const std::size_t p = static_cast<std::size_t>(j.nranks);
  switch (j.exchange) {
    case Exchange::kGatherBytes:
      j.buf->send.resize(j.msg_bytes);
      j.buf->recv.resize(j.msg_bytes * p);
      return;
    case Exchange::kReduceFloat:
      j.buf->fsend.resize(j.reduced), j.buf->frecv.resize(j.reduced);
      break;
    case Exchange::kReduceHalf:
      j.buf->hsend.resize(j.reduced), j.buf->hrecv.resize(j.reduced);
      break;
    case Exchange::kLowrank:
      j.buf->fsend.resize(j.reduced), j.buf->frecv.resize(j.reduced);
      j.buf->qsend.resize(j.shape.cols * j.shape.rank),
          j.buf->qrecv.resize(j.shape.cols * j.shape.rank);
      break;
    case Exchange::kQuantizeShards:
      j.buf->send.resize(j.slot * p), j.buf->recv.resize(j.slot * p);
      j.buf->send2.resize(j.slot), j.buf->recv2.resize(j.slot * p);
      j.buf->acc.resize(j.n);
      break;
  }
  j.buf->headers.resize(sizeof(Header) * p);
}

// Pipelining (docs/compression.md, "Pipelining"): a call of more than
// compression.pipeline_segment_bytes of input runs as segments of that
// size, each encoded, exchanged and decoded on its own, so that with a
// compression_stream the encode of a segment overlaps the exchange of the
// ones before it. The split depends on the count, the datatype and the
// configuration only, never on the streams: every rank splits alike.
// Not split: PowerSGD (a matrix), quantization with one range over the
// whole vector (use_dynamic_range false), sparse calls.
std::size_t segment_entries(const Job& whole, std::size_t element_size) {
  if (whole.sparse_call || whole.exchange == Exchange::kLowrank) return 0;
  if (whole.method == WIA_COMPRESS_QUANTIZE && whole.chunk != compress::kChunk) return 0;
  // (wia_compression_wire_bytes may be asked before wia_init: the
  // compiled default then, without starting the library for it.)
  static const std::int64_t compiled = Config().get_int("compression.pipeline_segment_bytes");
  const auto bytes = static_cast<std::size_t>(
      Runtime::initialized()
          ? Runtime::get().config().get_int("compression.pipeline_segment_bytes")
          : compiled);
  if (bytes == 0) return 0;
  // Whole chunks of the codecs (their ranges and scales stay where they
  // would be without segments).
  const std::size_t per =
      std::max<std::size_t>(1, bytes / element_size / compress::kChunk) * compress::kChunk;
  return whole.n > per ? per : 0;
}

// The segments of a call: each a Job planned for its part of the buffers,
// all sharing the buffer's state (one residual, one step).
std::vector<std::unique_ptr<Job>> split(const Job& whole, const wia_compression_config_t& cfg,
                                        wia_reduce_op_t rop, std::size_t per) {
  std::vector<std::unique_ptr<Job>> out;
  const std::size_t es = compress::float_type_size(whole.dtype);
  for (std::size_t off = 0; off < whole.n; off += per) {
    auto sj = std::make_unique<Job>();
    sj->owner = whole.owner;
    sj->in = static_cast<const std::byte*>(whole.in) + off * es;
    sj->out = static_cast<std::byte*>(whole.out) + off * es;
    plan(*sj, cfg, whole.method, std::min(per, whole.n - off), whole.dtype, rop, whole.nranks);
    sj->rank = whole.rank;
    sj->offset = off;
    sj->total = whole.n;
    out.push_back(std::move(sj));
  }
  return out;
}

std::int32_t checked_method(const wia_compression_config_t* cfg) {
  api::require_non_null(cfg, "config");
  const std::int32_t method = api::raw_enum(cfg->method);
  if (method < 0 || method >= WIA_COMPRESS_METHOD_COUNT)
    throw Error(WIA_ERROR_INVALID_ARGUMENT,
                fmt::format("config->method {} is out of range [0, {})", method,
                            static_cast<int>(WIA_COMPRESS_METHOD_COUNT)));
  return method;
}

void all_reduce_compressed(wia_communicator_t comm, const void* input, void* output,
                           std::size_t count, const wia_datatype_t& datatype,
                           const wia_reduce_op_t& op, const wia_compression_config_t* cfg,
                           wia_stream_t stream, const void* state_key = nullptr) {
  comm::CommunicatorBase& c = api::live(comm);
  const std::int32_t method = checked_method(cfg);
  const wia_datatype_t dtype = api::checked_enum(datatype, WIA_DATATYPE_COUNT, "datatype");
  const wia_reduce_op_t rop = api::checked_enum(op, WIA_REDUCE_OP_COUNT, "op");
  report_recorded_error(comm);

  if (method == WIA_COMPRESS_NONE) {
    wia_collective_config_t cc{};
    cc.datatype = dtype;
    cc.reduction_op = rop;
    check_status(wia_all_reduce(comm, input, output, count, &cc, stream));
    return;
  }
  if (const auto* pc = dynamic_cast<const comm::ProcessCommunicator*>(&c);
      pc != nullptr && !pc->compression_keys_differ().empty())
    throw Error(WIA_ERROR_MISMATCH,
                fmt::format("{}: rank {}: {}", method_name(method), wia_comm_rank(comm),
                            pc->compression_keys_differ()));
  auto job = std::make_unique<Job>();
  Job& j = *job;
  j.owner = comm;
  j.in = input, j.out = output;
  plan(j, *cfg, method, count, dtype, rop, c.size());
  const Streams s = resolve_streams(cfg, stream);
  j.rank = c.rank_of_device(resolve_stream(stream)->device);
  if (j.rank < 0)
    throw Error(WIA_ERROR_INVALID_ARGUMENT,
                "the stream's device is not a member of this communicator");
  const std::size_t es = compress::float_type_size(dtype);
  check_host_buffer(input, count * es, "input");
  check_host_buffer(output, count * es, "output");
  if (count == 0) return;
  // Across hosts only for the dense messages (quantization, the casts):
  // top-k's and random-k's are already a small fraction of the vector,
  // which the dense steps inside the hosts would then move whole.
  const bool dense_message = method == WIA_COMPRESS_QUANTIZE || method == WIA_COMPRESS_FP16 ||
                             method == WIA_COMPRESS_BF16;
  if (!j.ef && dense_message && dtype == WIA_FLOAT32 &&
      post_across_hosts(comm, c, input, output, count, rop, *cfg, stream, state_key))
    return;

  j.state = compress::states().get(comm, state_key ? state_key : input);
  {
    std::lock_guard lock(j.state->mutex);
    j.step = j.state->steps++;
  }
  const std::size_t per = segment_entries(j, es);
  if (per == 0) {
    j.buf = j.state->take_workspace();
    allocate(j);
    post_job(comm, std::move(job), s);
    return;
  }
  // The segments hold the state; the whole call's Job only planned them
  // (and gives no empty workspace back to it).
  const auto state = std::move(j.state);
  auto segments = split(j, *cfg, rop, per);
  for (auto& sj : segments) {
    sj->state = state;
    sj->step = j.step;
    sj->buf = state->take_workspace();
    allocate(*sj);
  }
  log::debug("compress", "rank {}: {} of {} entries in {} segments of {}", j.rank,
             method_name(method), count, segments.size(), per);
  // The encodes wait for what the call's stream did before (the input),
  // once; then each segment's encode runs as soon as the one before it.
  if (s.separate) check_status(wia_stream_wait_stream(s.work, s.call));
  for (auto& sj : segments) post_job(comm, std::move(sj), s, true);
}

void all_reduce_sparse(wia_communicator_t comm, const void* values, const std::uint32_t* indices,
                       std::size_t k, void* output, std::size_t dense_count, bool dense_out,
                       const wia_datatype_t& datatype, wia_stream_t stream) {
  comm::CommunicatorBase& c = api::live(comm);
  const wia_datatype_t dtype = api::checked_enum(datatype, WIA_DATATYPE_COUNT, "datatype");
  check_float_type(dtype, dense_out ? "wia_all_reduce_sparse_ex" : "wia_all_reduce_sparse");
  report_recorded_error(comm);
  const std::size_t es = compress::float_type_size(dtype);
  check_host_buffer(values, k * es, "values");
  check_host_buffer(indices, k * sizeof(std::uint32_t), "indices");
  if (dense_out) {
    check_host_buffer(output, dense_count * es, "output");
    if (dense_count > std::numeric_limits<std::uint32_t>::max())
      throw Error(WIA_ERROR_INVALID_ARGUMENT,
                  fmt::format("dense_count {} is more than uint32_t indices address", dense_count));
  }
  auto job = std::make_unique<Job>();
  Job& j = *job;
  j.owner = comm;
  j.method = WIA_COMPRESS_TOPK;  // the same (index, value) messages
  j.sparse_call = true;
  j.sparse_dense_out = dense_out;
  j.in = values, j.sparse_indices = indices, j.k = k;
  j.out = dense_out ? output : const_cast<void*>(values);
  j.n = dense_out ? dense_count : k;
  j.dtype = dtype;
  j.nranks = c.size();
  j.rank = c.rank_of_device(resolve_stream(stream)->device);
  if (j.rank < 0)
    throw Error(WIA_ERROR_INVALID_ARGUMENT,
                "the stream's device is not a member of this communicator");
  j.msg_bytes = sizeof(Header) + k * sizeof(compress::Pair);
  j.buf->send.resize(j.msg_bytes);
  j.buf->recv.resize(j.msg_bytes * static_cast<std::size_t>(j.nranks));
  j.header = Header{0x53500000u | (dense_out ? 1u : 0u),
                    static_cast<std::uint32_t>(dense_out ? dense_count : 0)};
  post_job(comm, std::move(job), Streams{stream, stream, false});
}

}  // namespace

namespace wia::api {
// The compression state of a communicator goes with it (api_coll.cpp).
void forget_compression_state(const void* comm) noexcept {
  compress::states().forget(comm);
  compressed::forget_across_hosts(comm);
}
}  // namespace wia::api

namespace wia::api::compressed {
bool host_accessible(const void* p) {
  const auto a = objects().allocations.find(p);
  if (!a) return true;  // not a libwia allocation: the caller's host memory
  wia_device_properties_t props{};
  return wia_get_device_properties(a->device, &props) == WIA_SUCCESS &&
         props.kind == WIA_DEVICE_KIND_CPU;
}

void post_compressed(wia_communicator_t comm, const void* input, void* output, std::size_t count,
                     wia_datatype_t dtype, wia_reduce_op_t op, const wia_compression_config_t* cfg,
                     wia_stream_t stream, const void* state_key) {
  all_reduce_compressed(comm, input, output, count, dtype, op, cfg, stream, state_key);
}
}  // namespace wia::api::compressed

extern "C" {

WIA_API wia_status_t wia_all_reduce_compressed(wia_communicator_t comm, const void* input,
                                               void* output, size_t count,
                                               const wia_compression_config_t* config,
                                               wia_stream_t stream) {
  return api::guard(__func__, [&] {
    const wia_datatype_t t = WIA_FLOAT32;
    const wia_reduce_op_t op = WIA_REDUCE_SUM;
    all_reduce_compressed(comm, input, output, count, t, op, config, stream);
  });
}

WIA_API wia_status_t wia_all_reduce_compressed_ex(wia_communicator_t comm, const void* input,
                                                  void* output, size_t count,
                                                  wia_datatype_t datatype, wia_reduce_op_t op,
                                                  const wia_compression_config_t* config,
                                                  wia_stream_t stream) {
  return api::guard(__func__, [&] {
    all_reduce_compressed(comm, input, output, count, datatype, op, config, stream);
  });
}

WIA_API wia_status_t wia_all_reduce_sparse(wia_communicator_t comm, float* values,
                                           const uint32_t* indices, size_t k, wia_stream_t stream) {
  return api::guard(__func__, [&] {
    const wia_datatype_t t = WIA_FLOAT32;
    all_reduce_sparse(comm, values, indices, k, nullptr, 0, false, t, stream);
  });
}

WIA_API wia_status_t wia_all_reduce_sparse_ex(wia_communicator_t comm, const void* values,
                                              const uint32_t* indices, size_t k, void* output,
                                              size_t dense_count, wia_datatype_t datatype,
                                              wia_stream_t stream) {
  return api::guard(__func__, [&] {
    all_reduce_sparse(comm, values, indices, k, output, dense_count, true, datatype, stream);
  });
}

WIA_API wia_status_t wia_compression_wire_bytes(size_t count, wia_datatype_t datatype,
                                                const wia_compression_config_t* config, int nranks,
                                                size_t* bytes) {
  return api::guard(__func__, [&] {
    api::require_non_null(bytes, "bytes");
    if (nranks < 1)
      throw Error(WIA_ERROR_INVALID_ARGUMENT, fmt::format("nranks is {} (must be >= 1)", nranks));
    const std::int32_t method = checked_method(config);
    const wia_datatype_t dtype = api::checked_enum(datatype, WIA_DATATYPE_COUNT, "datatype");
    if (method == WIA_COMPRESS_NONE) {  // the plain all-reduce, as a ring
      const std::size_t p = static_cast<std::size_t>(nranks);
      *bytes = 2 * (p - 1) * (count * kernels::dtype_size(dtype)) / p;
      return;
    }
    Job j;
    plan(j, *config, method, count, dtype, WIA_REDUCE_SUM, nranks);
    *bytes = 0;
    if (count == 0) return;
    if (const std::size_t per = segment_entries(j, compress::float_type_size(dtype)); per > 0) {
      for (const auto& sj : split(j, *config, WIA_REDUCE_SUM, per)) *bytes += wire_bytes(*sj);
      return;
    }
    *bytes = wire_bytes(j);
  });
}

WIA_API wia_status_t wia_compression_reset(wia_communicator_t comm) {
  return api::guard(__func__, [&] {
    api::live(comm);
    compress::states().forget(comm);
    reset_across_hosts(comm);
  });
}

WIA_API wia_status_t wia_compression_get_residual(wia_communicator_t comm, const void* buffer,
                                                  float* residual, size_t count) {
  return api::guard(__func__, [&] {
    api::live(comm);
    api::require_non_null(buffer, "buffer");
    if (count) api::require_non_null(residual, "residual");
    auto st = compress::states().find(comm, buffer);
    if (!st) {
      std::fill_n(residual, count, 0.0f);
      return;
    }
    std::lock_guard lock(st->mutex);
    if (st->residual.empty()) {
      std::fill_n(residual, count, 0.0f);
      return;
    }
    if (st->residual.size() != count)
      throw Error(WIA_ERROR_INVALID_ARGUMENT,
                  fmt::format("count is {} but the residual of buffer {} holds {} values", count,
                              buffer, st->residual.size()));
    std::copy(st->residual.begin(), st->residual.end(), residual);
  });
}

WIA_API wia_status_t wia_compression_set_residual(wia_communicator_t comm, const void* buffer,
                                                  const float* residual, size_t count) {
  return api::guard(__func__, [&] {
    api::live(comm);
    api::require_non_null(buffer, "buffer");
    if (count) api::require_non_null(residual, "residual");
    auto st = compress::states().get(comm, buffer);
    std::lock_guard lock(st->mutex);
    st->residual.assign(residual, residual + count);
  });
}

}  // extern "C"
