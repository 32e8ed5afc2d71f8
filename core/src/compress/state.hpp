// SPDX-License-Identifier: Apache-2.0
// The library-held state of compressed calls: per (owner, buffer address)
// an error-feedback residual and a step counter (random-k indices and
// rounding noise change every step, identically on every rank), and per
// owner the first error a stream task found. The owner is the
// communicator; this file only sees it as an address.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "compress/codec.hpp"

namespace wia::compress {

// The large vectors of one compressed call. A call's buffers are handed
// back to its BufferState when it ends and taken by the next call on the
// same buffer: a gradient of 64 MiB would otherwise fault in a few hundred
// MiB of fresh pages per call (most of the time a call took, in sys).
struct Workspace {
  std::vector<float> work;                  // the corrected input, fp32
  std::vector<float> acc, sent;             // decoded sum; what this rank's message decodes to
  std::vector<std::byte> send, recv;        // gathered messages
  std::vector<float> fsend, frecv;          // all-reduced fp32 (random-k, dense top-k, P)
  std::vector<float> qsend, qrecv;          // PowerSGD's Q
  std::vector<std::uint16_t> hsend, hrecv;  // all-reduced halves (the casts)
  std::vector<std::uint32_t> idx;           // random-k indices
  std::vector<Pair> pairs;                  // top-k's selection; a rank's pairs when decoding
  std::vector<std::byte> headers;           // every rank's header (reduced exchanges)
  std::vector<std::byte> send2, recv2;      // the second phase of two-phase quantization
};

struct BufferState {
  std::mutex mutex;              // stream tasks vs get/set from the caller
  std::vector<float> residual;   // empty: zero
  std::uint64_t steps = 0;       // calls posted on this buffer
  std::vector<float> lowrank_q;  // PowerSGD's warm start (cols x rank); empty: none yet
  // Buffers of finished calls, at most kSpareWorkspaces (under mutex).
  std::vector<std::unique_ptr<Workspace>> spare;
  // (A pipelined call has a workspace per segment in flight: 8 for 64 MiB
  // at the default segment size.)
  static constexpr std::size_t kSpareWorkspaces = 16;
  // A spare workspace, or a new one.
  std::unique_ptr<Workspace> take_workspace();
  void give_back(std::unique_ptr<Workspace> w) noexcept;
};

class StateStore {
 public:
  // The state of (owner, buffer); created on first use.
  std::shared_ptr<BufferState> get(const void* owner, const void* buffer);
  // nullptr when none exists.
  std::shared_ptr<BufferState> find(const void* owner, const void* buffer) const;
  // Forgets everything of owner (states in flight stay alive until done).
  void forget(const void* owner);
  // Records the first error of owner found while a stream task ran.
  void record_error(const void* owner, std::string message);
  // Takes (returns and clears) it; empty when none.
  std::string take_error(const void* owner);

 private:
  mutable std::mutex mutex_;
  std::map<std::pair<const void*, const void*>, std::shared_ptr<BufferState>> states_;
  std::map<const void*, std::string> errors_;
};

StateStore& states();

}  // namespace wia::compress
