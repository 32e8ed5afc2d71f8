// SPDX-License-Identifier: Apache-2.0
// The node-shared windows of a process communicator whose ranks all run on
// one node (engine/window_allreduce.hpp uses them): each rank allocates a
// window in its device's memory, exports it with the device provider's IPC
// entries (WIA_DEVICE_CAP_IPC), and maps every peer's from the handles the
// communicator gathered. Nothing here knows a vendor: the host provider
// exports memfd-backed memory, an accelerator provider its own.
//
// It also exports the callers' buffers that the all-reduce reads in place
// (engine::WindowSources): a libwia allocation on the communicator's
// device is exported once, in a slot of this rank's export table, and
// each peer maps it the first time a call names it and keeps the mapping
// while the slot holds it. A buffer freed and allocated again may come
// back at the same address but other memory: whenever the allocation
// registry changed, every export is checked against the provider's
// handle for its address before it is named again.
#pragma once

#include <wia/provider.h>

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/window_allreduce.hpp"

namespace wia {
struct Device;
}

namespace wia::comm {

class NodeWindowSet final : public engine::WindowSources {
 public:
  // Allocates and exports this rank's window on `device` (banks of
  // `chunk_bytes`); nullptr with `why` set when the device cannot share
  // memory between processes.
  static std::unique_ptr<NodeWindowSet> create(const Device& device, int rank, int nranks,
                                               std::uint64_t chunk_bytes, std::string& why);
  // Frees this rank's window once every peer released its reads of it
  // (bounded: a peer that died or hangs never does, and then the window
  // is left to the end of the process, because a peer still copying out
  // of freed memory would read zeros as data).
  ~NodeWindowSet();
  NodeWindowSet(const NodeWindowSet&) = delete;
  NodeWindowSet& operator=(const NodeWindowSet&) = delete;

  const wia_ipc_handle_t& handle() const { return handle_; }
  // Maps every peer's window (handles[rank] is ignored). False with `why`
  // naming the peer when one cannot be mapped; nothing stays mapped then.
  bool open_peers(const std::vector<wia_ipc_handle_t>& handles, std::string& why);
  engine::NodeWindows& windows() { return windows_; }

  bool export_buffer(const void* p, std::uint64_t bytes, engine::SourceRef& ref) override;
  // Whether export_buffer would export `bytes` at `p` (a libwia device
  // allocation of this rank's device holding them), without exporting it:
  // what the tuner prices a call's window path by.
  bool can_export(const void* p, std::uint64_t bytes) const;
  const char* import_buffer(int q, const engine::SourceRef& ref, std::uint64_t bytes) override;

 private:
  NodeWindowSet(const Device& device, int rank) : device_(device), rank_(rank) {}
  void close_peers() noexcept;
  // Drops the exports whose address no longer holds the memory exported.
  void forget_stale_exports();

  // A buffer this rank exported; exports_[i] is slot i of its table.
  struct Export {
    std::uintptr_t base = 0;
    std::uint64_t bytes = 0;
    std::uint64_t id = 0;  // 0: slot unused
    std::uint64_t last_used = 0;
    wia_ipc_handle_t handle{};
  };
  std::array<Export, engine::kExportSlots> exports_{};
  std::uint64_t next_export_id_ = 1;
  std::uint64_t export_calls_ = 0;
  std::uint64_t registry_generation_ = 0;  // when the exports were last checked
  std::uintptr_t not_exportable_ = 0;      // the last address found not exportable
  // A peer's exported buffer as mapped here, per peer and slot.
  struct Import {
    std::uint64_t id = 0;
    std::uint64_t bytes = 0;
    char* base = nullptr;
  };
  std::vector<std::array<Import, engine::kExportSlots>> imports_;

  const Device& device_;
  int rank_;
  wia_ipc_handle_t handle_{};
  engine::NodeWindows windows_;
};

}  // namespace wia::comm
