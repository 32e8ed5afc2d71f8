// SPDX-License-Identifier: Apache-2.0
#include "runtime/objects.hpp"

#include <fmt/format.h>

#include "common/error.hpp"
#include "common/hot_tls.hpp"
#include "common/log.hpp"
#include "runtime/device_registrations.hpp"

namespace wia {

void AllocationRegistry::add(const Allocation& a) {
  std::lock_guard<std::mutex> lock(mu_);
  by_base_[a.base] = a;
  generation_.fetch_add(1, std::memory_order_release);
  bump_object_epoch();
}

std::optional<Allocation> AllocationRegistry::remove(const void* p) {
  std::lock_guard<std::mutex> lock(mu_);
  generation_.fetch_add(1, std::memory_order_release);
  bump_object_epoch();
  auto it = by_base_.find(reinterpret_cast<std::uintptr_t>(p));
  if (it == by_base_.end()) return std::nullopt;
  Allocation a = it->second;
  by_base_.erase(it);
  return a;
}

std::optional<Allocation> AllocationRegistry::find(const void* p) const {
  struct Found {
    const AllocationRegistry* registry;
    std::uint64_t generation;
    Allocation allocation;
  };
  static thread_local Found found[2] WIA_HOT_TLS = {{nullptr, 0, {}}, {nullptr, 0, {}}};
  static thread_local unsigned next WIA_HOT_TLS = 0;
  const auto addr = reinterpret_cast<std::uintptr_t>(p);
  auto inside = [addr](const Allocation& a) { return addr == a.base || addr - a.base < a.size; };
  const std::uint64_t g = generation_.load(std::memory_order_acquire);
  for (const Found& f : found)
    if (f.registry == this && f.generation == g && inside(f.allocation)) return f.allocation;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = by_base_.upper_bound(addr);
  if (it == by_base_.begin()) return std::nullopt;
  --it;
  const Allocation& a = it->second;
  if (!inside(a)) return std::nullopt;
  found[next++ & 1] = {this, generation_.load(std::memory_order_relaxed), a};
  return a;
}

std::vector<Allocation> AllocationRegistry::all() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<Allocation> out;
  out.reserve(by_base_.size());
  for (const auto& [base, a] : by_base_) out.push_back(a);
  return out;
}

ObjectTables& objects() {
  static ObjectTables* tables = new ObjectTables();  // never destroyed: outlives static dtors
  return *tables;
}

namespace {
// The current device belongs to one runtime instance: after wia_finalize()
// and a new initialisation every thread starts again at device 0.
struct CurrentDevice {
  std::uint64_t generation = 0;
  wia_device_t device = 0;
};
thread_local CurrentDevice t_current WIA_HOT_TLS;

}  // namespace

std::uint64_t current_device_stamp() noexcept {
  return (t_current.generation << 16) ^ static_cast<std::uint64_t>(t_current.device);
}

namespace {
}  // namespace

wia_device_t current_device() {
  Runtime& rt = Runtime::get();
  if (t_current.generation != rt.generation()) t_current = {rt.generation(), 0};
  rt.device(t_current.device);  // validates, with a message naming the range
  return t_current.device;
}

void set_current_device(wia_device_t device) {
  Runtime& rt = Runtime::get();
  rt.device(device);
  t_current = {rt.generation(), device};
}

wia_stream_s* resolve_stream(wia_stream_t stream) {
  ObjectTables& t = objects();
  if (stream != nullptr) {
    if (!t.streams.contains(stream))
      throw Error(WIA_ERROR_INVALID_HANDLE,
                  fmt::format("stream {} is not a live libwia stream (destroyed, or never created)",
                              static_cast<const void*>(stream)));
    return stream;
  }
  const wia_device_t dev = current_device();
  // Default streams live until wia_finalize: remember this thread's.
  struct Last {
    std::uint64_t generation;
    wia_device_t device;
    wia_stream_s* stream;
  };
  static thread_local Last last WIA_HOT_TLS{0, -1, nullptr};
  const std::uint64_t g = t.default_streams_generation.load(std::memory_order_acquire);
  if (last.generation == g && last.device == dev && last.stream) return last.stream;
  std::lock_guard<std::mutex> lock(t.default_streams_mu);
  if (auto it = t.default_streams.find(dev); it != t.default_streams.end()) {
    last = {g, dev, it->second};
    return it->second;
  }
  const Device& d = Runtime::get().device(dev);
  auto s = std::make_unique<wia_stream_s>();
  s->device = dev;
  s->is_default = true;
  clear_provider_error();
  check_provider(*d.provider, d.provider->device()->stream_create(d.provider->ctx(), d.local_index, &s->ps),
                 "stream_create");
  wia_stream_s* raw = s.release();
  t.default_streams[dev] = raw;
  return raw;
}

void release_all_objects(Runtime& rt) noexcept {
  ObjectTables& t = objects();
  auto destroy_stream = [&](wia_stream_s* s) {
    try {
      const Device& d = rt.device(s->device);
      const wia_device_ops_v1_t* ops = d.provider->device();
      ops->stream_synchronize(d.provider->ctx(), s->ps);
      if (s->staging) ops->mem_free(d.provider->ctx(), d.local_index, s->staging);
      ops->stream_destroy(d.provider->ctx(), s->ps);
    } catch (...) {
    }
    delete s;
  };
  for (wia_stream_s* s : t.streams.all()) {
    t.streams.remove(s);
    destroy_stream(s);
  }
  {
    std::lock_guard<std::mutex> lock(t.default_streams_mu);
    for (auto& [dev, s] : t.default_streams) destroy_stream(s);
    t.default_streams.clear();
    t.default_streams_generation.fetch_add(1, std::memory_order_release);
    bump_object_epoch();
  }
  for (wia_event_s* e : t.events.all()) {
    t.events.remove(e);
    try {
      if (e->pe) {
        const Device& d = rt.device(e->device);
        d.provider->device()->event_destroy(d.provider->ctx(), e->pe);
      }
    } catch (...) {
    }
    delete e;
  }
  device_registrations().release_all();  // before the memory they register
  for (const Allocation& a : t.allocations.all()) {
    t.allocations.remove(reinterpret_cast<void*>(a.base));
    try {
      const Device& d = rt.device(a.device);
      d.provider->device()->mem_free(d.provider->ctx(), d.local_index, reinterpret_cast<void*>(a.base));
    } catch (...) {
    }
  }
}

}  // namespace wia
