// SPDX-License-Identifier: Apache-2.0
// Peer-to-peer access and copies (spec 6.3).
#include <wia/wia.h>

#include <fmt/format.h>

#include "api/copy.hpp"
#include "api/guard.hpp"
#include "runtime/device_call.hpp"
#include "runtime/objects.hpp"

using namespace wia;

namespace {

bool can_access(const Device& a, const Device& b) {
  if (a.id == b.id) return true;
  if (a.provider != b.provider) return false;
  int32_t can = 0;
  device_call(a, "can_access_peer", [&](const wia_device_ops_v1_t& o, void* ctx) {
    return o.can_access_peer(ctx, a.local_index, b.local_index, &can);
  });
  return can != 0;
}

}  // namespace

extern "C" {

WIA_API wia_status_t wia_enable_peer_access(wia_device_t device, wia_device_t peer) {
  return api::guard(__func__, [&] {
    Runtime& rt = Runtime::get();
    const Device& a = rt.device(device);
    const Device& b = rt.device(peer);
    if (a.id == b.id) return;
    if (!can_access(a, b) || !(ops_of(a).caps & WIA_DEVICE_CAP_PEER))
      throw Error(WIA_ERROR_NOT_SUPPORTED,
                  fmt::format("device {} ({}) cannot access device {} ({}) directly; copies "
                              "between them are staged through host memory",
                              a.id, a.provider->name(), b.id, b.provider->name()));
    device_call(a, "enable_peer_access", [&](const wia_device_ops_v1_t& o, void* ctx) {
      return o.enable_peer_access(ctx, a.local_index, b.local_index);
    });
  });
}

WIA_API bool wia_can_access_peer(wia_device_t device, wia_device_t peer) {
  bool result = false;
  api::guard(__func__, [&] {
    Runtime& rt = Runtime::get();
    result = can_access(rt.device(device), rt.device(peer));
  });
  return result;
}

WIA_API wia_status_t wia_memcpy_peer(void* dst, const void* src, size_t size, wia_stream_t stream) {
  return api::guard(__func__,
                    [&] { api::peer_copy(dst, src, size, stream, api::CopyMode::sync); });
}

WIA_API wia_status_t wia_memcpy_peer_async(void* dst, const void* src, size_t size,
                                           wia_stream_t stream) {
  return api::guard(__func__, [&] {
    api::ComputeBracket compute(stream, "copy");
    api::peer_copy(dst, src, size, stream, api::CopyMode::async);
    compute.posted();
  });
}

WIA_API wia_status_t wia_memcpy_peer_batched(const wia_memcpy_peer_batched_t* batch, size_t count,
                                             wia_stream_t stream) {
  return api::guard(__func__, [&] {
    if (count == 0) return;
    api::require_non_null(batch, "batch");
    Runtime::get();
    resolve_stream(stream);
    for (size_t i = 0; i < count; ++i) {
      try {
        api::validate_copy(batch[i].dst, batch[i].src, batch[i].size);
      } catch (const Error& e) {
        throw Error(e.status(), fmt::format("entry {}: {}", i, e.what()));
      }
    }
    api::ComputeBracket compute(stream, "copies");
    for (size_t i = 0; i < count; ++i)
      api::peer_copy(batch[i].dst, batch[i].src, batch[i].size, stream, api::CopyMode::async);
    compute.posted();
  });
}

}  // extern "C"
