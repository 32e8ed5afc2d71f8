// SPDX-License-Identifier: Apache-2.0
// The objects behind the public handles (streams, events) and the registry
// of allocations that maps any pointer back to its device. Handles are
// validated by registry lookup before they are dereferenced, so a stale or
// foreign handle is an error message, never a crash.
#pragma once

#include <wia/provider.h>
#include <wia/wia.h>

#include "common/hot_tls.hpp"

#include <cstddef>
#include <cstdint>
#include <atomic>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_set>

#include "runtime/runtime.hpp"

namespace wia {
// Streams are numbered in creation order, 1, 2, ... for the whole process:
// the profiler's timeline has one track per stream (docs/profiling.md).
inline std::uint32_t next_stream_ordinal() {
  static std::atomic<std::uint32_t> last{0};
  return last.fetch_add(1, std::memory_order_relaxed) + 1;
}
}  // namespace wia

struct wia_stream_s {
  wia_device_t device = -1;
  wia_provider_stream_t ps = nullptr;
  bool is_default = false;
  const std::uint32_t ordinal = wia::next_stream_ordinal();
  // The timeline's name of this stream (CommProfiler::TraceEvent::stream):
  // its ordinal, with kDefaultStreamBit for a device's default stream.
  static constexpr std::uint32_t kDefaultStreamBit = 1u << 31;
  std::uint32_t track() const { return ordinal | (is_default ? kDefaultStreamBit : 0u); }
  // Pinned bounce buffer for host-staged peer copies on this stream. Safe to
  // reuse across chunks because work on one stream runs in order.
  void* staging = nullptr;
  std::size_t staging_size = 0;

  // First asynchronous error of work that ran on this stream outside the
  // provider (a collective that timed out or mismatched); reported, then
  // cleared, by the next wia_stream_synchronize.
  void set_async_error(wia_status_t status, const std::string& message) {
    std::lock_guard<std::mutex> lock(error_mu);
    if (async_error != WIA_SUCCESS) return;
    async_error = status;
    async_message = message;
  }
  wia_status_t take_async_error(std::string* message) {
    std::lock_guard<std::mutex> lock(error_mu);
    const wia_status_t st = async_error;
    if (message) *message = async_message;
    async_error = WIA_SUCCESS;
    async_message.clear();
    return st;
  }
  // Whether an error is pending, without taking it (a staged receive's
  // copy to the device skips a message that failed).
  bool has_async_error() {
    std::lock_guard<std::mutex> lock(error_mu);
    return async_error != WIA_SUCCESS;
  }

 private:
  std::mutex error_mu;
  wia_status_t async_error = WIA_SUCCESS;
  std::string async_message;
};

struct wia_event_s {
  // The provider event is bound to the device of the stream it was last
  // recorded on, and re-created when recorded on another device.
  wia_device_t device = -1;
  wia_provider_event_t pe = nullptr;
};

namespace wia {

struct Allocation {
  std::uintptr_t base = 0;
  std::size_t size = 0;
  wia_device_t device = -1;
  std::uint32_t kind = WIA_MEM_DEVICE;
};

// Thread-safe map from address ranges to allocations.
class AllocationRegistry {
 public:
  void add(const Allocation& a);
  // Removes the allocation starting exactly at p; nullopt when none.
  std::optional<Allocation> remove(const void* p);
  // The allocation containing p (p == base for size-0 allocations).
  // Every collective call looks up its buffers: the last two found by the
  // calling thread are remembered until the registry next changes, so
  // the common case takes no lock.
  std::optional<Allocation> find(const void* p) const;
  std::vector<Allocation> all() const;
  // Changes whenever an allocation is added or removed.
  std::uint64_t generation() const { return generation_.load(std::memory_order_acquire); }

 private:
  mutable std::mutex mu_;
  std::map<std::uintptr_t, Allocation> by_base_;
  std::atomic<std::uint64_t> generation_{1};  // bumped by add and remove
};

// Bumped with every table generation below (allocations, handle sets, the
// default streams) and by every runtime created or destroyed: one load
// tells a caller that cached a validation (the API's memo of the last
// call) whether anything it read may have changed.
inline std::atomic<std::uint64_t> g_object_epoch{1};
inline void bump_object_epoch() { g_object_epoch.fetch_add(1, std::memory_order_release); }

// Thread-safe set of live handles of one kind.
template <typename T>
class HandleSet {
 public:
  void add(T* h) {
    std::lock_guard<std::mutex> lock(mu_);
    live_.insert(h);
    generation_.fetch_add(1, std::memory_order_release);
    bump_object_epoch();
  }
  bool remove(T* h) {
    std::lock_guard<std::mutex> lock(mu_);
    generation_.fetch_add(1, std::memory_order_release);
    bump_object_epoch();
    return live_.erase(h) == 1;
  }
  // The last handle found live by the calling thread is remembered until
  // the set next changes: every collective call checks its handles.
  bool contains(T* h) const {
    struct Seen {
      const HandleSet* set;
      std::uint64_t generation;
      const T* handle;
    };
    static thread_local Seen seen WIA_HOT_TLS{nullptr, 0, nullptr};
    const std::uint64_t g = generation_.load(std::memory_order_acquire);
    if (seen.set == this && seen.generation == g && seen.handle == h && h != nullptr) return true;
    std::lock_guard<std::mutex> lock(mu_);
    if (live_.count(h) != 1) return false;
    seen = {this, generation_.load(std::memory_order_relaxed), h};
    return true;
  }
  std::vector<T*> all() const {
    std::lock_guard<std::mutex> lock(mu_);
    return {live_.begin(), live_.end()};
  }

 private:
  mutable std::mutex mu_;
  std::unordered_set<T*> live_;
  std::atomic<std::uint64_t> generation_{1};  // bumped by add and remove
};

// Runtime state that the C API manipulates.
struct ObjectTables {
  AllocationRegistry allocations;
  HandleSet<wia_stream_s> streams;
  HandleSet<wia_event_s> events;
  std::mutex default_streams_mu;
  std::map<wia_device_t, wia_stream_s*> default_streams;
  // Bumped when default_streams loses entries (resolve_stream caches).
  std::atomic<std::uint64_t> default_streams_generation{1};
};

ObjectTables& objects();

// Resolve a stream argument: NULL -> current device's default stream.
// Throws INVALID_HANDLE for a destroyed or foreign handle.
wia_stream_s* resolve_stream(wia_stream_t stream);
// The calling thread's current device (validated against the runtime).
wia_device_t current_device();
void set_current_device(wia_device_t device);
// Changes whenever the calling thread's current device does (or the
// runtime it was set in goes away); cheap, unvalidated.
std::uint64_t current_device_stamp() noexcept;

// Release every object (wia_finalize): streams are synchronised first.
void release_all_objects(Runtime& rt) noexcept;

}  // namespace wia
