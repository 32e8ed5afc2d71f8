// SPDX-License-Identifier: Apache-2.0
// The node-shared windows of a process communicator whose ranks all run on
// one node (engine/window_allreduce.hpp uses them): each rank allocates a
// window in its device's memory, exports it with the device provider's IPC
// entries (WIA_DEVICE_CAP_IPC), and maps every peer's from the handles the
// communicator gathered. Nothing here knows a vendor: the host provider
// exports memfd-backed memory, an accelerator provider its own.
#pragma once

#include <wia/provider.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/window_allreduce.hpp"

namespace wia {
struct Device;
}

namespace wia::comm {

class NodeWindowSet {
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

 private:
  NodeWindowSet(const Device& device, int rank) : device_(device), rank_(rank) {}
  void close_peers() noexcept;

  const Device& device_;
  int rank_;
  wia_ipc_handle_t handle_{};
  engine::NodeWindows windows_;
};

}  // namespace wia::comm
