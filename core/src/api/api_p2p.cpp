// SPDX-License-Identifier: Apache-2.0
// Spec 6.10.1: wia_send / wia_recv between processes, addressed by (node,
// device), and the GPUDirect settings that decide how a device buffer
// travels: to the NIC directly when the link's transport takes that
// device memory, staged through pinned host memory otherwise
// (docs/point-to-point.md). The transfer itself is the process
// communicator's point to point (comm/process_p2p.cpp) with a tag; the
// staging copies are host functions on the same stream, so the stream
// orders them with the transfer.
#include <fmt/format.h>
#include <wia/wia.h>

#include <algorithm>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "api/communicators.hpp"
#include "api/guard.hpp"
#include "api/p2p.hpp"
#include "comm/process_communicator.hpp"
#include "common/log.hpp"
#include "provider/registry.hpp"
#include "runtime/device_call.hpp"
#include "runtime/objects.hpp"
#include "runtime/runtime.hpp"

namespace wia::api {
namespace {

struct P2pState {
  std::mutex mu;
  wia_communicator_t last = nullptr;  // the process communicator created last
  bool last_destroyed = false;        // and it was destroyed since
  wia_gpudirect_config_t gpudirect{true, true, 0, false};
  // (communicator, peer, direction, path) already logged at info.
  std::set<std::tuple<const void*, int, bool, int>> logged;
};

P2pState& state() {
  static auto* s = new P2pState();
  return *s;
}

wia_gpudirect_config_t gpudirect_settings() {
  std::lock_guard<std::mutex> lock(state().mu);
  return state().gpudirect;
}

comm::ProcessCommunicator& process_comm(wia_communicator_t c, const char* fn) {
  auto* p = dynamic_cast<comm::ProcessCommunicator*>(&live(c));
  if (!p)
    throw Error(WIA_ERROR_NOT_SUPPORTED,
                fmt::format("{} moves data between processes and needs a process communicator; "
                            "between the devices of one process use wia_comm_send/wia_comm_recv",
                            fn));
  return *p;
}

wia_communicator_t default_comm(const char* fn) {
  std::lock_guard<std::mutex> lock(state().mu);
  const wia_communicator_t c = state().last;
  if (c == nullptr && state().last_destroyed)
    throw Error(WIA_ERROR_INVALID_ARGUMENT,
                fmt::format("{}: the distributed communicator this process created last was "
                            "destroyed; create another, or name one with {}_ex",
                            fn, fn));
  if (c == nullptr)
    throw Error(WIA_ERROR_INVALID_ARGUMENT,
                fmt::format("{}: this process has no distributed communicator: create one with "
                            "wia_create_distributed_communicator (or name one with {}_ex)",
                            fn, fn));
  return c;
}

// "2 node(s): node 0 has devices 0..1, node 1 has devices 0..2".
std::string shape(const comm::ProcessCommunicator& c) {
  std::vector<int> per_node(static_cast<std::size_t>(c.node_count()), 0);
  for (int r = 0; r < c.size(); ++r) ++per_node[static_cast<std::size_t>(c.node_rank(r))];
  std::string s = fmt::format("{} rank(s) on {} node(s): ", c.size(), c.node_count());
  for (std::size_t n = 0; n < per_node.size(); ++n)
    s += fmt::format("{}node {} has devices 0..{}", n ? ", " : "", n, per_node[n] - 1);
  return s;
}

int rank_at(const comm::ProcessCommunicator& c, int node, int device, const char* fn,
            const char* node_arg, const char* device_arg) {
  for (int r = 0; r < c.size(); ++r)
    if (c.node_rank(r) == node && c.local_rank(r) == device) {
      if (r == c.rank())
        throw Error(WIA_ERROR_INVALID_ARGUMENT,
                    fmt::format("{}: ({} {}, {} {}) is the calling rank {} itself", fn, node_arg,
                                node, device_arg, device, r));
      return r;
    }
  throw Error(WIA_ERROR_INVALID_ARGUMENT,
              fmt::format("{}: ({} {}, {} {}) names no rank of the communicator, which has {}", fn,
                          node_arg, node, device_arg, device, shape(c)));
}

enum class Path : int { kHost, kStaged, kDirect };

const char* path_name(Path p, bool is_send) {
  switch (p) {
    case Path::kStaged:
      return is_send ? "send_staged" : "recv_staged";
    case Path::kDirect:
      return is_send ? "send_direct" : "recv_direct";
    case Path::kHost:
      break;
  }
  return is_send ? "send" : "recv";
}

// The profile's `algorithm` of a point-to-point operation.
const char* path_label(Path p) {
  return p == Path::kStaged ? "staged" : p == Path::kDirect ? "direct" : "host";
}

struct Route {
  Path path = Path::kHost;
  const Device* device = nullptr;  // the buffer's, when not host-addressable
  wia_mr_t mr = nullptr;           // kDirect through a dma-buf registration
  std::string why;
};

// How `bytes` at `buf` travel on the link to `peer`.
Route route(const comm::ProcessCommunicator& c, int peer, const void* buf, std::uint64_t bytes,
            const char* fn, const wia_gpudirect_config_t& g) {
  Route r;
  r.why = "host memory";
  if (buf == nullptr) return r;
  const std::optional<Allocation> a = objects().allocations.find(buf);
  if (!a) return r;
  const std::uint64_t off = reinterpret_cast<std::uintptr_t>(buf) - a->base;
  if (bytes > a->size - off)
    throw Error(WIA_ERROR_INVALID_ARGUMENT,
                fmt::format("{}: the buffer needs {} bytes but only {} remain in its allocation "
                            "on device {}",
                            fn, bytes, a->size - off, a->device));
  const Device& d = Runtime::get().device(a->device);
  if (a->kind != WIA_MEM_DEVICE || (d.props.flags & WIA_DEVICE_FLAG_HOST_ACCESSIBLE)) return r;
  r.device = &d;
  // The provider says which interface its memory registers as
  // (wia_device_props_v1_t.mem_iface): the core names no vendor.
  const std::uint32_t iface = d.props.mem_iface;
  if (!g.enable_rdma) {
    r.path = Path::kStaged;
    r.why = "wia_gpudirect_config_t.enable_rdma is false";
  } else if (iface == WIA_MEM_IFACE_HOST) {
    r.path = Path::kStaged;
    r.why = fmt::format("provider {} names no memory interface a transport could register "
                        "(its devices' mem_iface is 0)",
                        d.provider->name());
  } else {
    using DevicePath = comm::ProcessCommunicator::DeviceMemoryPath;
    const bool exports = (ops_of(d).caps & WIA_DEVICE_CAP_DMABUF) != 0;
    switch (const DevicePath path = c.device_memory_path(peer, iface, exports, &r.why)) {
      case DevicePath::kByAddress:
      case DevicePath::kDmabuf:
        // A device that cannot export this memory after all (the driver
        // or the kernel says no), or a transport that refuses it, is
        // staged with its reason; any other failure is the caller's error.
        try {
          r.mr = c.register_device_memory(peer, *a, iface, path);
          r.path = Path::kDirect;
          r.why = path == DevicePath::kDmabuf
                      ? "registered with the link's transport through a dma-buf of its allocation"
                      : "registered with the link's transport, which reaches this device's "
                        "memory itself";
        } catch (const Error& e) {
          if (e.status() != WIA_ERROR_NOT_SUPPORTED) throw;
          r.path = Path::kStaged;
          r.why = e.what();
        }
        break;
      case DevicePath::kStaged:
        r.path = Path::kStaged;
        break;
    }
  }
  return r;
}

// Pinned host memory a staged transfer passes through; shared by the host
// functions of the stream that use it, freed by the last one.
struct Staging {
  const Device* device = nullptr;
  void* host = nullptr;
  bool pinned = false;
  std::vector<char> plain;
  void* user = nullptr;  // the device buffer
  std::uint64_t bytes = 0;
  // Alive while copy_in runs: its send, queued after it, holds off the
  // communicator's destruction (copy_out may run after it: it uses `rank`).
  comm::ProcessCommunicator* comm = nullptr;
  int rank = -1;
  wia_stream_s* stream = nullptr;
  int peer = -1;

  Staging() = default;
  Staging(const Staging&) = delete;
  Staging& operator=(const Staging&) = delete;
  ~Staging() {
    if (pinned) ops_of(*device).mem_free(device->provider->ctx(), device->local_index, host);
  }
};
using StagingRef = std::shared_ptr<Staging>;

StagingRef make_staging(const Device& d, std::uint64_t bytes) {
  auto s = std::make_shared<Staging>();
  s->device = &d;
  s->bytes = bytes;
  if (ops_of(d).caps & WIA_DEVICE_CAP_PINNED_HOST) {
    device_call(d, "mem_alloc(pinned host staging)", [&](const wia_device_ops_v1_t& o, void* ctx) {
      return o.mem_alloc(ctx, d.local_index, std::max<std::uint64_t>(bytes, 1), WIA_MEM_HOST_PINNED,
                         &s->host);
    });
    s->pinned = s->host != nullptr;
  }
  if (!s->host) {
    s->plain.resize(std::max<std::uint64_t>(bytes, 1));
    s->host = s->plain.data();
  }
  return s;
}

// A device copy from a host function: the message, or "" when it worked.
std::string device_copy(const Staging& s, void* dst, const void* src) {
  if (s.bytes == 0) return {};
  try {
    device_call(*s.device, "memcpy(staging)", [&](const wia_device_ops_v1_t& o, void* ctx) {
      return o.memcpy(ctx, s.device->local_index, dst, src, s.bytes);
    });
    return {};
  } catch (const std::exception& e) {
    return e.what();
  }
}

// Host functions; each owns one reference.
void copy_in(void* arg) {
  std::unique_ptr<StagingRef> ref(static_cast<StagingRef*>(arg));
  Staging& s = **ref;
  const std::string err = device_copy(s, s.host, s.user);
  if (err.empty()) return;
  const std::string why = fmt::format(
      "rank {}: wia_send to rank {}: staging the device buffer through host memory failed: {}",
      s.rank, s.peer, err);
  log::error("p2p", "{}", why);
  s.stream->set_async_error(WIA_ERROR_INTERNAL, why);
  // The send after it is posted already: abort, so that it and the peer's
  // receive fail instead of delivering the staging buffer.
  s.comm->request_abort();
}

void copy_out(void* arg) {
  std::unique_ptr<StagingRef> ref(static_cast<StagingRef*>(arg));
  Staging& s = **ref;
  if (s.stream->has_async_error()) return;  // the receive failed: leave the buffer alone
  const std::string err = device_copy(s, s.user, s.host);
  if (err.empty()) return;
  s.stream->set_async_error(
      WIA_ERROR_INTERNAL,
      fmt::format("rank {}: wia_recv from rank {}: copying the staged message to the device "
                  "buffer failed: {}",
                  s.rank, s.peer, err));
}

void release(void* arg) { delete static_cast<StagingRef*>(arg); }

void launch(wia_stream_s* stream, wia_host_fn_t fn, const StagingRef& s) {
  auto* ref = new StagingRef(s);
  try {
    device_call(Runtime::get().device(stream->device), "launch_host_func",
                [&](const wia_device_ops_v1_t& o, void* ctx) {
                  return o.launch_host_func(ctx, stream->ps, fn, ref);
                });
  } catch (...) {
    delete ref;
    throw;
  }
}

void note_path(const comm::ProcessCommunicator& c, int peer, bool is_send, const Route& r,
               std::uint64_t bytes, std::uint32_t tag) {
  bool first;
  {
    std::lock_guard<std::mutex> lock(state().mu);
    first = state()
                .logged
                .emplace(static_cast<const comm::CommunicatorBase*>(&c), peer, is_send,
                         static_cast<int>(r.path))
                .second;
  }
  const char* how = r.path == Path::kDirect   ? "device memory straight to the transport"
                    : r.path == Path::kStaged ? "device memory staged through pinned host memory"
                                              : "host memory";
  if (first)
    log::info("p2p",
              "rank {}: {} rank {}: {} ({}; over {}; profiled as \"{}\"; later calls on this "
              "path log at debug)",
              c.rank(), is_send ? "wia_send to" : "wia_recv from", peer, how, r.why,
              c.transport_to(peer), path_name(r.path, is_send));
  else
    log::debug("p2p", "rank {}: {} rank {}: {} B tag {} via {}", c.rank(),
               is_send ? "wia_send to" : "wia_recv from", peer, bytes, tag,
               path_name(r.path, is_send));
}

void transfer(const char* fn, wia_communicator_t comm, bool is_send, int node, int device,
              void* buf, std::size_t size, int tag, wia_stream_t stream) {
  comm::ProcessCommunicator& c = process_comm(comm, fn);
  if (tag < 0)
    throw Error(WIA_ERROR_INVALID_ARGUMENT,
                fmt::format("{}: tag {} is negative (tags are 0 .. 2^31-1)", fn, tag));
  const int peer = is_send ? rank_at(c, node, device, fn, "dst_node", "dst_device")
                           : rank_at(c, node, device, fn, "src_node", "src_device");
  if (size > 0 && buf == nullptr)
    throw Error(WIA_ERROR_INVALID_ARGUMENT,
                fmt::format("{}: buffer is NULL but size is {}", fn, size));
  wia_stream_s* s = resolve_stream(stream);
  if (c.rank_of_device(s->device) < 0)
    throw Error(WIA_ERROR_INVALID_ARGUMENT,
                fmt::format("{}: the stream's device {} is not the communicator's device (rank "
                            "{} of the communicator runs on its own device's streams)",
                            fn, s->device, c.rank()));
  const Route r = route(c, peer, buf, size, fn, gpudirect_settings());
  note_path(c, peer, is_send, r, size, static_cast<std::uint32_t>(tag));
  const char* name = path_name(r.path, is_send);
  const auto utag = static_cast<std::uint32_t>(tag);
  if (r.path != Path::kStaged) {
    c.post_tagged(peer, is_send, buf, size, utag, name, path_label(r.path), s, r.mr);
    return;
  }
  StagingRef st = make_staging(*r.device, size);
  st->user = buf;
  st->comm = &c;
  st->rank = c.rank();
  st->stream = s;
  st->peer = peer;
  if (is_send) {
    launch(s, &copy_in, st);
    // Should this throw, copy_in still holds its reference and drops it.
    c.post_tagged(peer, true, st->host, size, utag, name, path_label(r.path), s);
    try {
      launch(s, &release, st);
    } catch (const Error& e) {
      // The send may still read the buffer: keep it (a bounded leak).
      new StagingRef(st);
      throw Error(e.status(), fmt::format("{}: the send is posted, but its staging buffer's "
                                          "release could not be: {}",
                                          fn, e.what()));
    }
  } else {
    c.post_tagged(peer, false, st->host, size, utag, name, path_label(r.path), s);
    try {
      launch(s, &copy_out, st);
    } catch (const Error& e) {
      new StagingRef(st);  // the receive may still write it
      throw Error(e.status(),
                  fmt::format("{}: the receive is posted, but the copy of the staged message to "
                              "the device buffer could not be: {}",
                              fn, e.what()));
    }
  }
}

}  // namespace

void note_distributed_communicator(wia_communicator_t comm) {
  std::lock_guard<std::mutex> lock(state().mu);
  state().last = comm;
  state().last_destroyed = false;
}

void forget_distributed_communicator(wia_communicator_t comm) noexcept {
  std::lock_guard<std::mutex> lock(state().mu);
  if (state().last == comm) {
    state().last = nullptr;
    state().last_destroyed = true;
  }
  const void* impl = static_cast<const comm::CommunicatorBase*>(comm->impl.get());
  std::erase_if(state().logged, [&](const auto& k) { return std::get<0>(k) == impl; });
}

}  // namespace wia::api

using namespace wia;

extern "C" {

WIA_API wia_status_t wia_enable_gpudirect_rdma(wia_distributed_config_t* config,
                                               const wia_gpudirect_config_t* gpudirect) {
  return api::guard(__func__, [&] {
    api::require_non_null(config, "config");
    api::require_non_null(gpudirect, "gpudirect");
    {
      std::lock_guard<std::mutex> lock(api::state().mu);
      api::state().gpudirect = *gpudirect;
    }
    config->use_gpu_direct_rdma = gpudirect->enable_rdma;
    log::info("p2p",
              "GPUDirect settings: enable_rdma={} (device buffers {}), enable_async_copy={} (no "
              "effect yet: staging copies are synchronous), max_inline_size={} and "
              "use_write_semantics={} (hints no transport takes yet)",
              gpudirect->enable_rdma,
              gpudirect->enable_rdma ? "go to the NIC where the transport registers them, else "
                                       "staged"
                                     : "are always staged through pinned host memory",
              gpudirect->enable_async_copy, gpudirect->max_inline_size,
              gpudirect->use_write_semantics);
  });
}

WIA_API wia_status_t wia_send(int dst_node, int dst_device, const void* buffer, size_t size,
                              wia_stream_t stream) {
  return api::guard(__func__, [&] {
    api::transfer("wia_send", api::default_comm("wia_send"), true, dst_node, dst_device,
                  const_cast<void*>(buffer), size, 0, stream);
  });
}

WIA_API wia_status_t wia_recv(int src_node, int src_device, void* buffer, size_t size,
                              wia_stream_t stream) {
  return api::guard(__func__, [&] {
    api::transfer("wia_recv", api::default_comm("wia_recv"), false, src_node, src_device, buffer,
                  size, 0, stream);
  });
}

WIA_API wia_status_t wia_send_ex(wia_communicator_t comm, int dst_node, int dst_device,
                                 const void* buffer, size_t size, int tag, wia_stream_t stream) {
  return api::guard(__func__, [&] {
    api::transfer("wia_send_ex", comm, true, dst_node, dst_device, const_cast<void*>(buffer), size,
                  tag, stream);
  });
}

WIA_API wia_status_t wia_recv_ex(wia_communicator_t comm, int src_node, int src_device,
                                 void* buffer, size_t size, int tag, wia_stream_t stream) {
  return api::guard(__func__, [&] {
    api::transfer("wia_recv_ex", comm, false, src_node, src_device, buffer, size, tag, stream);
  });
}

}  // extern "C"
