// SPDX-License-Identifier: Apache-2.0
// The calling thread's group depth and deferred work (group.hpp).
#include "comm/group.hpp"

#include <utility>
#include <vector>

namespace wia::comm {
namespace {

thread_local int t_depth = 0;
thread_local std::vector<std::function<void()>> t_deferred;

}  // namespace

int group_enter() { return ++t_depth; }

int group_leave() {
  if (t_depth > 0 && --t_depth == 0) {
    // Actions may post (a fallback stream task), never enter a group.
    std::vector<std::function<void()>> actions = std::move(t_deferred);
    t_deferred.clear();
    for (auto& action : actions) action();
  }
  return t_depth;
}

int group_depth() { return t_depth; }

void defer_to_group_end(std::function<void()> action) { t_deferred.push_back(std::move(action)); }

}  // namespace wia::comm
