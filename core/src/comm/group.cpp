// SPDX-License-Identifier: Apache-2.0
// The calling thread's group depth and deferred work (group.hpp).
#include "comm/group.hpp"

#include <utility>
#include <vector>

namespace wia::comm {
namespace {

thread_local int t_depth = 0;
thread_local std::vector<std::function<GroupResult()>> t_deferred;

}  // namespace

int group_enter() { return ++t_depth; }

int group_leave(GroupResult* first_failure) {
  if (t_depth > 0 && --t_depth == 0) {
    // Actions may post (a fallback stream task), never enter a group.
    std::vector<std::function<GroupResult()>> actions = std::move(t_deferred);
    t_deferred.clear();
    for (auto& action : actions) {
      GroupResult r = action();
      if (r.status < 0 && first_failure != nullptr && first_failure->status >= 0)
        *first_failure = std::move(r);
    }
  }
  return t_depth;
}

int group_depth() { return t_depth; }

void defer_to_group_end(std::function<GroupResult()> action) {
  t_deferred.push_back(std::move(action));
}

}  // namespace wia::comm
