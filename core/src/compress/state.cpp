// SPDX-License-Identifier: Apache-2.0
#include "compress/state.hpp"

namespace wia::compress {

std::shared_ptr<BufferState> StateStore::get(const void* owner, const void* buffer) {
  std::lock_guard lock(mutex_);
  auto& s = states_[{owner, buffer}];
  if (!s) s = std::make_shared<BufferState>();
  return s;
}

std::shared_ptr<BufferState> StateStore::find(const void* owner, const void* buffer) const {
  std::lock_guard lock(mutex_);
  auto it = states_.find({owner, buffer});
  return it == states_.end() ? nullptr : it->second;
}

void StateStore::forget(const void* owner) {
  std::lock_guard lock(mutex_);
  auto lo = states_.lower_bound({owner, nullptr});
  auto hi = lo;
  while (hi != states_.end() && hi->first.first == owner) ++hi;
  states_.erase(lo, hi);
  errors_.erase(owner);
}

void StateStore::record_error(const void* owner, std::string message) {
  std::lock_guard lock(mutex_);
  errors_.try_emplace(owner, std::move(message));
}

std::string StateStore::take_error(const void* owner) {
  std::lock_guard lock(mutex_);
  auto it = errors_.find(owner);
  if (it == errors_.end()) return {};
  std::string m = std::move(it->second);
  errors_.erase(it);
  return m;
}

std::unique_ptr<Workspace> BufferState::take_workspace() {
  std::lock_guard lock(mutex);
  if (spare.empty()) return std::make_unique<Workspace>();
  std::unique_ptr<Workspace> w = std::move(spare.back());
  spare.pop_back();
  return w;
}

void BufferState::give_back(std::unique_ptr<Workspace> w) noexcept {
  if (!w) return;
  std::lock_guard lock(mutex);
  if (spare.size() < kSpareWorkspaces) spare.push_back(std::move(w));
}

StateStore& states() {
  static auto* s = new StateStore();
  return *s;
}

}  // namespace wia::compress
