// SPDX-License-Identifier: Apache-2.0
// The library-held state of compressed calls: per (owner, buffer address)
// an error-feedback residual and a step counter (random-k indices and
// rounding noise change every step, identically on every rank), and per
// owner the first error a stream task found. The owner is the
// communicator; this file only sees it as an address.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace wia::compress {

struct BufferState {
  std::mutex mutex;              // stream tasks vs get/set from the caller
  std::vector<float> residual;   // empty: zero
  std::uint64_t steps = 0;       // calls posted on this buffer
  std::vector<float> lowrank_q;  // PowerSGD's warm start (cols x rank); empty: none yet
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
