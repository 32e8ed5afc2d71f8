// SPDX-License-Identifier: Apache-2.0
#include "comm/node_windows.hpp"

#include <fmt/format.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>

#include "common/error.hpp"
#include "common/log.hpp"
#include "runtime/device_call.hpp"

namespace wia::comm {

std::unique_ptr<NodeWindowSet> NodeWindowSet::create(const Device& device, int rank, int nranks,
                                                     std::uint64_t chunk_bytes, std::string& why) {
  const wia_device_ops_v1_t& ops = ops_of(device);
  if (!(ops.caps & WIA_DEVICE_CAP_IPC)) {
    why = fmt::format(
        "device {} ({}) cannot share memory between processes (no "
        "WIA_DEVICE_CAP_IPC)",
        device.id, device.provider->name());
    return nullptr;
  }
  std::unique_ptr<NodeWindowSet> set(new NodeWindowSet(device, rank));
  engine::NodeWindows& w = set->windows_;
  w.chunk_bytes = chunk_bytes;
  w.base.assign(static_cast<std::size_t>(nranks), nullptr);
  const std::uint64_t bytes = engine::NodeWindows::window_bytes(chunk_bytes);
  try {
    void* mine = nullptr;
    device_call(device, "mem_alloc(node-shared window)",
                [&](const wia_device_ops_v1_t& o, void* ctx) {
                  return o.mem_alloc(ctx, device.local_index, bytes, WIA_MEM_DEVICE, &mine);
                });
    w.base[rank] = static_cast<char*>(mine);
    engine::NodeWindows::clear(w.base[rank], chunk_bytes);
    w.set_owner_pid(rank, static_cast<int>(getpid()));
    device_call(device, "ipc_get_handle(node-shared window)",
                [&](const wia_device_ops_v1_t& o, void* ctx) {
                  return o.ipc_get_handle(ctx, device.local_index, mine, &set->handle_);
                });
  } catch (const Error& e) {
    why = e.what();
    return nullptr;  // the destructor frees what was allocated
  }
  return set;
}

bool NodeWindowSet::open_peers(const std::vector<wia_ipc_handle_t>& handles, std::string& why) {
  for (std::size_t q = 0; q < handles.size(); ++q) {
    if (static_cast<int>(q) == rank_) continue;
    try {
      void* base = nullptr;
      device_call(device_, "ipc_open_handle(node-shared window)",
                  [&](const wia_device_ops_v1_t& o, void* ctx) {
                    return o.ipc_open_handle(ctx, device_.local_index, &handles[q], &base);
                  });
      windows_.base[q] = static_cast<char*>(base);
    } catch (const Error& e) {
      why = fmt::format("rank {}'s window: {}", q, e.what());
      close_peers();
      return false;
    }
  }
  return true;
}

void NodeWindowSet::close_peers() noexcept {
  const wia_device_ops_v1_t& ops = ops_of(device_);
  for (std::size_t q = 0; q < windows_.base.size(); ++q) {
    if (static_cast<int>(q) == rank_ || !windows_.base[q]) continue;
    ops.ipc_close_handle(device_.provider->ctx(), device_.local_index, windows_.base[q]);
    windows_.base[q] = nullptr;
  }
}

NodeWindowSet::~NodeWindowSet() {
  char* mine = windows_.base.empty() ? nullptr : windows_.base[rank_];
  // Before the first step no peer read anything (and some may be unmapped).
  bool keep = false;
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(1);
  for (std::size_t q = 0; mine && windows_.step > 0 && q < windows_.base.size() && !keep; ++q) {
    const int peer = static_cast<int>(q);
    while (peer != rank_ && !windows_.released(peer, windows_.step)) {
      // A process that is gone reads nothing. (Were its pid reused, the
      // new process would look alive: we would only wait and keep.)
      if (kill(windows_.owner_pid(peer), 0) != 0 && errno == ESRCH) break;
      if (std::chrono::steady_clock::now() > until) {
        log::info("comm",
                  "rank {}: node-shared window kept until the process exits: rank {} has not "
                  "finished reading it (it died or is stuck)",
                  rank_, q);
        keep = true;
        break;
      }
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
  }
  close_peers();
  if (!mine) return;
  // Done with every window: a peer waiting to free its own must not wait
  // for us (whatever freed memory reads as).
  windows_.release_reads(rank_, ~std::uint64_t{0});
  if (!keep) ops_of(device_).mem_free(device_.provider->ctx(), device_.local_index, mine);
}

}  // namespace wia::comm
