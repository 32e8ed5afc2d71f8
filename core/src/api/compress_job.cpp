// SPDX-License-Identifier: Apache-2.0
// The host tasks of a compressed call (compress_job.hpp says the order).
#include "api/compress_job.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

namespace wia::api::compressed {

const char* method_name(std::int32_t m) {
  switch (m) {
    case WIA_COMPRESS_NONE:
      return "WIA_COMPRESS_NONE";
    case WIA_COMPRESS_TOPK:
      return "WIA_COMPRESS_TOPK";
    case WIA_COMPRESS_RANDOMK:
      return "WIA_COMPRESS_RANDOMK";
    case WIA_COMPRESS_QUANTIZE:
      return "WIA_COMPRESS_QUANTIZE";
    case WIA_COMPRESS_ONEBIT:
      return "WIA_COMPRESS_ONEBIT";
    case WIA_COMPRESS_LOWRANK:
      return "WIA_COMPRESS_LOWRANK";
    case WIA_COMPRESS_FP16:
      return "WIA_COMPRESS_FP16";
    case WIA_COMPRESS_BF16:
      return "WIA_COMPRESS_BF16";
    default:
      return "?";
  }
}

namespace {

std::byte* payload(std::vector<std::byte>& m, std::size_t rank, std::size_t bytes) {
  return m.data() + rank * bytes + sizeof(Header);
}

// --- encode ------------------------------------------------------------------

void encode(Job& j) {
  using namespace compress;
  const std::size_t n = j.n;
  if (j.sparse_call) {
    std::memcpy(j.buf->send.data(), &j.header, sizeof(Header));
    std::vector<Pair> pairs(j.k);
    const auto* v = static_cast<const float*>(j.in);
    std::vector<float> wide;
    if (j.dtype != WIA_FLOAT32) {
      wide.resize(j.k);
      to_float(j.in, j.dtype, wide);
      v = wide.data();
    }
    for (std::size_t i = 0; i < j.k; ++i) pairs[i] = Pair{j.sparse_indices[i], v[i]};
    if (j.k) std::memcpy(payload(j.buf->send, 0, 0), pairs.data(), j.k * sizeof(Pair));
    return;
  }
  // x: the input as fp32 (the caller's buffer itself when it is fp32: the
  // codecs read it once and fuse the residual into the same pass).
  std::span<const float> x;
  if (j.dtype == WIA_FLOAT32) {
    x = std::span<const float>(static_cast<const float*>(j.in), n);
  } else {
    j.buf->work.resize(n);
    to_float(j.in, j.dtype, j.buf->work);
    x = j.buf->work;
  }
  std::unique_lock lock(j.state->mutex, std::defer_lock);
  if (j.ef) {
    lock.lock();
    const std::size_t total = std::max(j.total, n);
    if (j.state->residual.size() != total) j.state->residual.assign(total, 0.0f);
  }
  // With error feedback every codec below encodes x + r and leaves in r
  // what its message does not carry. A segment of a pipelined call has its
  // part of the buffer's one residual.
  std::span<float> r =
      j.ef ? std::span<float>(j.state->residual).subspan(j.offset, n) : std::span<float>();
  // Segments draw other random indices and rounding noise than each other
  // (0 for an unsegmented call: its draws are what they always were).
  const std::uint64_t salt = static_cast<std::uint64_t>(j.offset) << 24;
  switch (j.method) {
    case WIA_COMPRESS_TOPK: {
      std::vector<Pair>& pairs = j.buf->pairs;
      pairs.resize(j.k);
      if (j.ef)
        topk_select_ef(x, r, j.k, j.magnitude, pairs);
      else
        topk_select(x, j.k, j.magnitude, pairs);
      if (j.exchange == Exchange::kReduceFloat) {
        std::fill(j.buf->fsend.begin(), j.buf->fsend.end(), 0.0f);
        scatter_add(pairs, j.buf->fsend);
      } else {
        std::memcpy(j.buf->send.data(), &j.header, sizeof(Header));
        std::memcpy(payload(j.buf->send, 0, 0), pairs.data(), j.k * sizeof(Pair));
      }
      break;
    }
    case WIA_COMPRESS_RANDOMK: {
      j.buf->idx.resize(j.k);
      randomk_indices(n, j.k, derive_seed(j.seed, j.step, 0x524b ^ salt), j.buf->idx);
      randomk_gather(x, r, j.buf->idx, std::span<float>(j.buf->fsend).first(j.k));
      break;
    }
    case WIA_COMPRESS_QUANTIZE:
      if (j.exchange == Exchange::kQuantizeShards) {
        // Shard s of the vector goes to rank s, quantized on its own.
        for (int s = 0; s < j.nranks; ++s) {
          std::byte* m = j.buf->send.data() + static_cast<std::size_t>(s) * j.slot;
          std::memcpy(m, &j.header, sizeof(Header));
          const std::size_t begin = std::min(n, static_cast<std::size_t>(s) * j.shard);
          quantize_encode(x.subspan(begin, std::min(j.shard, n - begin)), j.bits, j.chunk,
                          derive_seed(static_cast<std::uint64_t>(j.rank), j.step,
                                      (0x51550000u + static_cast<std::uint64_t>(s)) ^ salt),
                          std::span<std::byte>(m + sizeof(Header), j.slot - sizeof(Header)));
        }
        break;
      }
      [[fallthrough]];
    case WIA_COMPRESS_ONEBIT: {
      std::memcpy(j.buf->send.data(), &j.header, sizeof(Header));
      const std::span<std::byte> msg(payload(j.buf->send, 0, 0), j.msg_bytes - sizeof(Header));
      if (j.method == WIA_COMPRESS_QUANTIZE)
        quantize_encode(x, j.bits, j.chunk,
                        derive_seed(static_cast<std::uint64_t>(j.rank), j.step, 0x5155 ^ salt), msg,
                        r);
      else
        onebit_encode(x, j.scale_type, msg, r);
      break;
    }
    case WIA_COMPRESS_LOWRANK: {
      if (!lock.owns_lock()) lock.lock();
      // The middle step needs the corrected gradient again: kept in work.
      j.buf->work.resize(n);
      if (j.ef && x.data() != j.buf->work.data())
        add_into(x, r, j.buf->work);  // one pass, not a copy then an add
      else if (j.ef)
        add_residual(j.buf->work, r);
      else if (x.data() != j.buf->work.data())
        std::copy(x.begin(), x.end(), j.buf->work.begin());
      std::vector<float>& q = j.state->lowrank_q;
      if (q.size() != j.shape.cols * j.shape.rank) {
        q.resize(j.shape.cols * j.shape.rank);
        compress::lowrank_init_q(j.shape, derive_seed(j.shape.rows, j.shape.cols, 0x5053), q);
      }
      compress::lowrank_project(j.buf->work, j.shape, q, j.buf->fsend);
      break;
    }
    default: {  // FP16 / BF16
      const wia_datatype_t t = j.method == WIA_COMPRESS_FP16 ? WIA_FLOAT16 : WIA_BFLOAT16;
      cast_encode(x, r, t, j.buf->hsend.data());
    }
  }
}

// PowerSGD's middle step, after P is summed: orthonormalise it (identically
// on every rank) and project this rank's corrected gradient onto it.
void lowrank_middle(Job& j) {
  compress::lowrank_orthonormalise(j.buf->frecv, j.shape);
  compress::lowrank_back_project(j.buf->work, j.shape, j.buf->frecv, j.buf->qsend);
  if (j.ef) {
    std::lock_guard lock(j.state->mutex);
    compress::lowrank_residual(j.buf->frecv, j.buf->qsend, j.shape, j.buf->work, j.state->residual);
  }
}

bool headers_agree(Job& j);

// Two-phase quantization's middle step: this rank's shard, summed from
// every rank's message in fp32, quantized again for the all-gather.
void quantize_shards_middle(Job& j) {
  using namespace compress;
  std::byte* out = j.buf->send2.data();
  std::memcpy(out, &j.header, sizeof(Header));
  if (!headers_agree(j)) {
    j.mismatch = true;
    return;
  }
  std::vector<float>& acc = j.buf->acc;
  const std::span<float> mine = shard_of(j, acc, j.rank);
  std::vector<const std::byte*> msgs(static_cast<std::size_t>(j.nranks));
  for (int r = 0; r < j.nranks; ++r)
    msgs[static_cast<std::size_t>(r)] =
        j.buf->recv.data() + static_cast<std::size_t>(r) * j.slot + sizeof(Header);
  quantize_decode_sum(msgs, j.bits, j.chunk, mine);
  quantize_encode(mine, j.bits, j.chunk,
                  derive_seed(static_cast<std::uint64_t>(j.rank), j.step,
                              0x52510000u ^ (static_cast<std::uint64_t>(j.offset) << 24)),
                  std::span<std::byte>(out + sizeof(Header), j.slot - sizeof(Header)));
}

// --- decode ------------------------------------------------------------------

// False (and the error recorded) when a rank's header disagrees with ours.
bool headers_agree(Job& j) {
  const std::byte* base = j.buf->headers.data();
  std::size_t stride = sizeof(Header);
  if (j.exchange == Exchange::kGatherBytes) base = j.buf->recv.data(), stride = j.msg_bytes;
  if (j.exchange == Exchange::kQuantizeShards) base = j.buf->recv.data(), stride = j.slot;
  for (int r = 0; r < j.nranks; ++r) {
    Header h;
    std::memcpy(&h, base + static_cast<std::size_t>(r) * stride, sizeof h);
    if (h.method != j.header.method || h.fingerprint != j.header.fingerprint) {
      compress::states().record_error(
          j.owner, fmt::format("rank {} compressed with {} (parameters {:#x}) but rank {} with "
                               "{} (parameters {:#x}): every rank must pass the same config",
                               r, method_name(static_cast<std::int32_t>(h.method)), h.fingerprint,
                               j.rank, method_name(j.method), j.header.fingerprint));
      return false;
    }
  }
  return true;
}

void fill_nan(Job& j, std::size_t entries) {
  std::vector<float> nan(entries, std::numeric_limits<float>::quiet_NaN());
  compress::from_float(nan, j.dtype, j.out);
}

void decode(Job& j) {
  using namespace compress;
  const std::size_t n = j.n;
  if (j.exchange == Exchange::kQuantizeShards ? j.mismatch : !headers_agree(j)) {
    fill_nan(j, j.sparse_call && !j.sparse_dense_out ? j.k : n);
    return;
  }
  if (j.sparse_call && !j.sparse_dense_out) {
    // values[i] = the sum of every pair, on any rank, at indices[i].
    std::vector<Pair> all;
    all.reserve(j.k * static_cast<std::size_t>(j.nranks));
    for (int r = 0; r < j.nranks; ++r) {
      const std::byte* p = payload(j.buf->recv, static_cast<std::size_t>(r), j.msg_bytes);
      for (std::size_t i = 0; i < j.k; ++i) {
        Pair q;
        std::memcpy(&q, p + i * sizeof(Pair), sizeof q);
        all.push_back(q);
      }
    }
    std::sort(all.begin(), all.end(),
              [](const Pair& a, const Pair& b) { return a.index < b.index; });
    std::vector<float> sums(j.k);
    for (std::size_t i = 0; i < j.k; ++i) {
      auto lo = std::lower_bound(all.begin(), all.end(), j.sparse_indices[i],
                                 [](const Pair& a, std::uint32_t v) { return a.index < v; });
      double s = 0;
      for (; lo != all.end() && lo->index == j.sparse_indices[i]; ++lo) s += lo->value;
      sums[i] = static_cast<float>(s);
    }
    compress::from_float(sums, j.dtype, j.out);
    return;
  }
  // The sum is formed in the output itself when it is fp32 (each entry
  // written once), else in acc and narrowed at the end.
  std::span<float> acc;
  if (j.dtype == WIA_FLOAT32) {
    acc = std::span<float>(static_cast<float*>(j.out), n);
  } else {
    j.buf->acc.resize(n);
    acc = j.buf->acc;
  }
  switch (j.exchange) {
    case Exchange::kGatherBytes: {
      std::vector<const std::byte*> msgs(static_cast<std::size_t>(j.nranks));
      for (int r = 0; r < j.nranks; ++r)
        msgs[static_cast<std::size_t>(r)] =
            payload(j.buf->recv, static_cast<std::size_t>(r), j.msg_bytes);
      if (j.method == WIA_COMPRESS_QUANTIZE) {
        quantize_decode_sum(msgs, j.bits, j.chunk, acc);
      } else if (j.method == WIA_COMPRESS_ONEBIT) {
        onebit_decode_sum(msgs, j.scale_type, acc);
      } else {
        std::fill(acc.begin(), acc.end(), 0.0f);
        std::vector<Pair>& pairs = j.buf->pairs;
        pairs.resize(j.k);
        for (int r = 0; r < j.nranks; ++r) {
          if (j.k) std::memcpy(pairs.data(), msgs[static_cast<std::size_t>(r)], j.k * sizeof(Pair));
          if (const std::size_t dropped = scatter_add(pairs, acc))
            compress::states().record_error(
                j.owner, fmt::format("rank {} gave {} index(es) >= dense_count {} to "
                                     "wia_all_reduce_sparse_ex; they were dropped",
                                     r, dropped, n));
        }
      }
      break;
    }
    case Exchange::kReduceFloat:
      if (j.method == WIA_COMPRESS_RANDOMK) {
        const float scale =
            j.scale_randomk ? static_cast<float>(static_cast<double>(n) / static_cast<double>(j.k))
                            : 1.0f;
        std::fill(acc.begin(), acc.end(), 0.0f);
        for (std::size_t i = 0; i < j.k; ++i) acc[j.buf->idx[i]] = j.buf->frecv[i] * scale;
      } else {
        std::copy_n(j.buf->frecv.begin(), n, acc.begin());
      }
      break;
    case Exchange::kReduceHalf:
      to_float(j.buf->hrecv.data(), j.method == WIA_COMPRESS_FP16 ? WIA_FLOAT16 : WIA_BFLOAT16,
               acc);
      break;
    case Exchange::kQuantizeShards:
      for (int s = 0; s < j.nranks; ++s) {
        const std::byte* m =
            j.buf->recv2.data() + static_cast<std::size_t>(s) * j.slot + sizeof(Header);
        const std::size_t begin = std::min(n, static_cast<std::size_t>(s) * j.shard);
        quantize_decode_sum(std::span<const std::byte* const>(&m, 1), j.bits, j.chunk,
                            acc.subspan(begin, std::min(j.shard, n - begin)));
      }
      break;
    case Exchange::kLowrank: {
      lowrank_expand(j.buf->frecv, j.buf->qrecv, j.shape, acc);
      std::lock_guard lock(j.state->mutex);
      j.state->lowrank_q = j.buf->qrecv;  // the next call's warm start, equal on every rank
      break;
    }
  }
  if (j.avg)
    for (float& v : acc) v /= static_cast<float>(j.nranks);
  if (j.dtype != WIA_FLOAT32) compress::from_float(acc, j.dtype, j.out);
}

}  // namespace

// Stream tasks: a task never throws into the runtime; an exception
// becomes the communicator's recorded error and NaN output.
void encode_task(void* p) {
  auto* j = static_cast<Job*>(p);
  try {
    encode(*j);
  } catch (const std::exception& e) {
    compress::states().record_error(j->owner, fmt::format("compression failed: {}", e.what()));
  }
}
void decode_task(void* p) {
  std::unique_ptr<Job> j(static_cast<Job*>(p));
  try {
    decode(*j);
  } catch (const std::exception& e) {
    compress::states().record_error(j->owner, fmt::format("decompression failed: {}", e.what()));
  }
}
void lowrank_middle_task(void* p) {
  auto* j = static_cast<Job*>(p);
  try {
    lowrank_middle(*j);
  } catch (const std::exception& e) {
    compress::states().record_error(j->owner, fmt::format("PowerSGD failed: {}", e.what()));
  }
}
void quantize_shards_task(void* p) {
  auto* j = static_cast<Job*>(p);
  try {
    quantize_shards_middle(*j);
  } catch (const std::exception& e) {
    j->mismatch = true;
    compress::states().record_error(j->owner, fmt::format("quantization failed: {}", e.what()));
  }
}
void release_task(void* p) { delete static_cast<Job*>(p); }

}  // namespace wia::api::compressed
