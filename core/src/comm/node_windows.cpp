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
#include "runtime/objects.hpp"

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
  imports_.resize(handles.size());
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
  for (auto& peer : imports_)
    for (Import& im : peer)
      if (im.base) ops.ipc_close_handle(device_.provider->ctx(), device_.local_index, im.base);
  imports_.clear();
  for (std::size_t q = 0; q < windows_.base.size(); ++q) {
    if (static_cast<int>(q) == rank_ || !windows_.base[q]) continue;
    ops.ipc_close_handle(device_.provider->ctx(), device_.local_index, windows_.base[q]);
    windows_.base[q] = nullptr;
  }
}

void NodeWindowSet::forget_stale_exports() {
  const wia_device_ops_v1_t& ops = ops_of(device_);
  for (int i = 0; i < engine::kExportSlots; ++i) {
    Export& e = exports_[i];
    if (e.id == 0) continue;
    const auto a = objects().allocations.find(reinterpret_cast<void*>(e.base));
    wia_ipc_handle_t now{};
    const bool same = a && a->base == e.base && a->size == e.bytes &&
                      ops.ipc_get_handle(device_.provider->ctx(), device_.local_index,
                                         reinterpret_cast<void*>(e.base), &now) == WIA_SUCCESS &&
                      std::memcmp(&now, &e.handle, sizeof(now)) == 0;
    if (!same) {
      // No peer reads it now (every call that named it finished on every
      // rank); peers drop their mapping when the slot's id changes.
      std::atomic_ref<std::uint64_t>(windows_.export_slot(rank_, i).id)
          .store(0, std::memory_order_release);
      e = Export{};
    }
  }
  clear_provider_error();
}

bool NodeWindowSet::can_export(const void* p, std::uint64_t bytes) const {
  const auto addr = reinterpret_cast<std::uintptr_t>(p);
  const auto a = objects().allocations.find(p);
  return a && a->device == device_.id && a->kind == WIA_MEM_DEVICE &&
         bytes <= a->size - (addr - a->base);
}

bool NodeWindowSet::export_buffer(const void* p, std::uint64_t bytes, engine::SourceRef& ref) {
  const auto addr = reinterpret_cast<std::uintptr_t>(p);
  const std::uint64_t generation = objects().allocations.generation();
  if (generation != registry_generation_) {
    forget_stale_exports();
    registry_generation_ = generation;
    not_exportable_ = 0;
  }
  ++export_calls_;
  for (int i = 0; i < engine::kExportSlots; ++i) {
    Export& e = exports_[i];
    if (e.id != 0 && addr >= e.base && addr - e.base <= e.bytes && bytes <= e.bytes - (addr - e.base)) {
      e.last_used = export_calls_;
      ref = {static_cast<std::uint32_t>(i), 0, e.id, addr - e.base};
      return true;
    }
  }
  if (addr == not_exportable_) return false;
  // Only this device's own allocations: other memory (malloc'd, pinned
  // host, another device's) is copied.
  const auto a = objects().allocations.find(p);
  wia_ipc_handle_t handle{};
  if (!a || a->device != device_.id || a->kind != WIA_MEM_DEVICE ||
      bytes > a->size - (addr - a->base) ||
      ops_of(device_).ipc_get_handle(device_.provider->ctx(), device_.local_index,
                                     reinterpret_cast<void*>(a->base), &handle) != WIA_SUCCESS) {
    clear_provider_error();
    not_exportable_ = addr;
    return false;
  }
  // A free slot, else the least recently used one: its peers' mappings go
  // when they see the slot's new id.
  int slot = 0;
  for (int i = 1; i < engine::kExportSlots; ++i)
    if (exports_[i].last_used < exports_[slot].last_used) slot = i;
  Export& e = exports_[slot];
  e = Export{a->base, a->size, next_export_id_++, export_calls_, handle};
  engine::ExportSlot& shared = windows_.export_slot(rank_, slot);
  std::atomic_ref<std::uint64_t>(shared.id).store(0, std::memory_order_relaxed);
  shared.bytes = e.bytes;
  shared.handle = handle;
  // Published before the step that names it (release there too).
  std::atomic_ref<std::uint64_t>(shared.id).store(e.id, std::memory_order_release);
  ref = {static_cast<std::uint32_t>(slot), 0, e.id, addr - e.base};
  return true;
}

const char* NodeWindowSet::import_buffer(int q, const engine::SourceRef& ref, std::uint64_t bytes) {
  if (q < 0 || static_cast<std::size_t>(q) >= imports_.size() || q == rank_ ||
      ref.slot >= static_cast<std::uint32_t>(engine::kExportSlots))
    throw Error(WIA_ERROR_INTERNAL,
                fmt::format("rank {}: rank {} named export slot {} (of {}) for its input", rank_,
                            q, ref.slot, engine::kExportSlots));
  Import& im = imports_[q][ref.slot];
  if (im.id != ref.id) {
    const engine::ExportSlot& shared = windows_.export_slot(q, static_cast<int>(ref.slot));
    const std::uint64_t id =
        std::atomic_ref<const std::uint64_t>(shared.id).load(std::memory_order_acquire);
    if (id != ref.id)
      throw Error(WIA_ERROR_INTERNAL,
                  fmt::format("rank {}: rank {} named buffer {} in its export slot {}, which "
                              "holds {}",
                              rank_, q, ref.id, ref.slot, id));
    const wia_ipc_handle_t handle = shared.handle;
    const std::uint64_t slot_bytes = shared.bytes;
    const wia_device_ops_v1_t& ops = ops_of(device_);
    if (im.base) ops.ipc_close_handle(device_.provider->ctx(), device_.local_index, im.base);
    im = Import{};
    void* base = nullptr;
    try {
      device_call(device_, "ipc_open_handle", [&](const wia_device_ops_v1_t& o, void* ctx) {
        return o.ipc_open_handle(ctx, device_.local_index, &handle, &base);
      });
    } catch (const Error& e) {
      throw Error(e.status(), fmt::format("rank {}: mapping the buffer rank {} exported for this "
                                          "all-reduce: {}",
                                          rank_, q, e.what()));
    }
    im = Import{ref.id, slot_bytes, static_cast<char*>(base)};
  }
  if (ref.offset > im.bytes || bytes > im.bytes - ref.offset)
    throw Error(WIA_ERROR_INTERNAL,
                fmt::format("rank {}: rank {}'s input of {} B at offset {} lies outside the {} B "
                            "buffer it exported",
                            rank_, q, bytes, ref.offset, im.bytes));
  return im.base + ref.offset;
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
