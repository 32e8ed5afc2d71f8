// SPDX-License-Identifier: Apache-2.0
#include "api/copy.hpp"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>

#include <fmt/format.h>

#include "api/guard.hpp"
#include "runtime/device_call.hpp"
#include "runtime/objects.hpp"

namespace wia::api {

namespace {

// Bounce buffers are this big: large enough to amortise per-chunk calls,
// small enough to stay in the last-level cache of a host CPU.
constexpr std::size_t kStagingBytes = 4u << 20;

struct Side {
  std::optional<Allocation> alloc;  // nullopt: memory libwia did not allocate
  const Device* device = nullptr;
};

Side resolve(const void* p, std::size_t size, const char* role) {
  Side s;
  s.alloc = objects().allocations.find(p);
  if (!s.alloc) return s;
  s.device = &Runtime::get().device(s.alloc->device);
  const std::size_t offset = reinterpret_cast<std::uintptr_t>(p) - s.alloc->base;
  if (size > s.alloc->size - offset)
    throw Error(WIA_ERROR_INVALID_ARGUMENT,
                fmt::format("{} range of {} bytes at offset {} overruns its {}-byte allocation on "
                            "device {}",
                            role, size, offset, s.alloc->size, s.alloc->device));
  return s;
}

const Device& stream_device(const wia_stream_s* s) { return Runtime::get().device(s->device); }

void synchronize(wia_stream_s* s) {
  const Device& d = stream_device(s);
  device_call(d, "stream_synchronize",
              [&](const wia_device_ops_v1_t& o, void* ctx) { return o.stream_synchronize(ctx, s->ps); });
}

// The stream must belong to the provider that executes the work.
void require_same_provider(const wia_stream_s* s, const Device& d) {
  const Device& sd = stream_device(s);
  if (sd.provider != d.provider)
    throw Error(WIA_ERROR_INVALID_ARGUMENT,
                fmt::format("stream of device {} ({}) cannot order work on device {} ({})", sd.id,
                            sd.provider->name(), d.id, d.provider->name()));
}

void* stream_staging(wia_stream_s* s) {
  if (s->staging) return s->staging;
  const Device& d = stream_device(s);
  const std::uint32_t kind =
      (ops_of(d).caps & WIA_DEVICE_CAP_PINNED_HOST) ? WIA_MEM_HOST_PINNED : WIA_MEM_DEVICE;
  if (kind != WIA_MEM_HOST_PINNED && !(d.props.flags & WIA_DEVICE_FLAG_HOST_ACCESSIBLE))
    throw Error(WIA_ERROR_NOT_SUPPORTED,
                fmt::format("device {} ({}) offers no pinned host memory to stage a copy through",
                            d.id, d.provider->name()));
  device_call(d, "mem_alloc(staging)", [&](const wia_device_ops_v1_t& o, void* ctx) {
    return o.mem_alloc(ctx, d.local_index, kStagingBytes, kind, &s->staging);
  });
  s->staging_size = kStagingBytes;
  return s->staging;
}

bool devices_can_peer(const Device& a, const Device& b) {
  if (a.provider != b.provider) return false;
  if (!(ops_of(a).caps & WIA_DEVICE_CAP_PEER)) return false;
  int32_t ab = 0, ba = 0;
  device_call(a, "can_access_peer", [&](const wia_device_ops_v1_t& o, void* ctx) {
    return o.can_access_peer(ctx, a.local_index, b.local_index, &ab);
  });
  device_call(b, "can_access_peer", [&](const wia_device_ops_v1_t& o, void* ctx) {
    return o.can_access_peer(ctx, b.local_index, a.local_index, &ba);
  });
  return ab && ba;
}

// Device that executes a copy touching `a` and/or `b` (either may be
// host memory): the libwia device involved, else the stream's or current.
const Device& executor(const Side& a, const Side& b, wia_stream_t stream) {
  if (a.device) return *a.device;
  if (b.device) return *b.device;
  if (stream) return stream_device(resolve_stream(stream));
  return Runtime::get().device(current_device());
}

void direct_copy(const Device& d, void* dst, const void* src, std::size_t size,
                 wia_stream_t stream, CopyMode mode) {
  if (mode == CopyMode::sync) {
    if (stream) synchronize(resolve_stream(stream));  // spec 6.3: sync copy after prior work
    device_call(d, "memcpy", [&](const wia_device_ops_v1_t& o, void* ctx) {
      return o.memcpy(ctx, d.local_index, dst, src, size);
    });
    return;
  }
  wia_stream_s* s = resolve_stream(stream);
  require_same_provider(s, d);
  device_call(d, "memcpy_async", [&](const wia_device_ops_v1_t& o, void* ctx) {
    return o.memcpy_async(ctx, s->ps, dst, src, size);
  });
}

// Host-staged copy between devices that cannot access each other.
void staged_copy(const Device& sd, const Device& dd, void* dst, const void* src, std::size_t size,
                 wia_stream_t stream, CopyMode mode) {
  wia_stream_s* s = resolve_stream(stream);
  const Device& exec = stream_device(s);
  if (sd.provider == dd.provider && exec.provider == sd.provider) {
    // One provider: both legs ordered on the stream, through its bounce
    // buffer. Reuse across chunks is safe because the stream runs in order.
    char* bounce = static_cast<char*>(stream_staging(s));
    for (std::size_t off = 0; off < size; off += s->staging_size) {
      const std::size_t n = std::min(s->staging_size, size - off);
      device_call(exec, "memcpy_async(stage in)", [&](const wia_device_ops_v1_t& o, void* ctx) {
        return o.memcpy_async(ctx, s->ps, bounce, static_cast<const char*>(src) + off, n);
      });
      device_call(exec, "memcpy_async(stage out)", [&](const wia_device_ops_v1_t& o, void* ctx) {
        return o.memcpy_async(ctx, s->ps, static_cast<char*>(dst) + off, bounce, n);
      });
    }
    if (mode == CopyMode::sync) synchronize(s);
    return;
  }
  // Two providers cannot share a stream: order after the stream's work,
  // then copy synchronously through a host buffer.
  synchronize(s);
  std::unique_ptr<char[]> bounce(new char[std::min(size, kStagingBytes)]);
  for (std::size_t off = 0; off < size; off += kStagingBytes) {
    const std::size_t n = std::min(kStagingBytes, size - off);
    device_call(sd, "memcpy(stage in)", [&](const wia_device_ops_v1_t& o, void* ctx) {
      return o.memcpy(ctx, sd.local_index, bounce.get(), static_cast<const char*>(src) + off, n);
    });
    device_call(dd, "memcpy(stage out)", [&](const wia_device_ops_v1_t& o, void* ctx) {
      return o.memcpy(ctx, dd.local_index, static_cast<char*>(dst) + off, bounce.get(), n);
    });
  }
}

}  // namespace

void validate_copy(void* dst, const void* src, std::size_t size) {
  require_non_null(dst, "dst");
  require_non_null(src, "src");
  resolve(src, size, "source");
  resolve(dst, size, "destination");
}

void copy(void* dst, const void* src, std::size_t size, wia_stream_t stream, CopyMode mode) {
  require_non_null(dst, "dst");
  require_non_null(src, "src");
  Runtime::get();
  const Side s = resolve(src, size, "source");
  const Side d = resolve(dst, size, "destination");
  if (s.device && d.device && s.device != d.device) {
    peer_copy(dst, src, size, stream, mode);
    return;
  }
  if (size == 0) return;
  direct_copy(executor(d, s, stream), dst, src, size, stream, mode);
}

void set(void* ptr, int value, std::size_t size, wia_stream_t stream, CopyMode mode) {
  require_non_null(ptr, "ptr");
  Runtime::get();
  const Side p = resolve(ptr, size, "destination");
  const Device& d = executor(p, Side{}, stream);
  if (mode == CopyMode::sync) {
    if (stream) synchronize(resolve_stream(stream));
    if (size == 0) return;
    device_call(d, "memset", [&](const wia_device_ops_v1_t& o, void* ctx) {
      return o.memset(ctx, d.local_index, ptr, value, size);
    });
    return;
  }
  wia_stream_s* s = resolve_stream(stream);
  require_same_provider(s, d);
  if (size == 0) return;
  device_call(d, "memset_async", [&](const wia_device_ops_v1_t& o, void* ctx) {
    return o.memset_async(ctx, s->ps, ptr, value, size);
  });
}

void peer_copy(void* dst, const void* src, std::size_t size, wia_stream_t stream, CopyMode mode) {
  require_non_null(dst, "dst");
  require_non_null(src, "src");
  Runtime::get();
  const Side s = resolve(src, size, "source");
  const Side d = resolve(dst, size, "destination");
  if (!s.device || !d.device || s.device == d.device) {
    // Host memory or a single device: an ordinary copy.
    if (size == 0) return;
    direct_copy(executor(d, s, stream), dst, src, size, stream, mode);
    return;
  }
  if (size == 0) return;
  const Device& sd = *s.device;
  const Device& dd = *d.device;
  if (devices_can_peer(sd, dd)) {
    wia_stream_s* st = resolve_stream(stream);
    require_same_provider(st, sd);
    device_call(sd, "memcpy_peer_async", [&](const wia_device_ops_v1_t& o, void* ctx) {
      return o.memcpy_peer_async(ctx, st->ps, dst, dd.local_index, src, sd.local_index, size);
    });
    if (mode == CopyMode::sync) synchronize(st);
    return;
  }
  staged_copy(sd, dd, dst, src, size, stream, mode);
}

}  // namespace wia::api
