// SPDX-License-Identifier: Apache-2.0
// wia_group_start / wia_group_end of the calling thread, as the
// communicators see them: the nesting depth, and work a communicator
// defers until the outermost wia_group_end returns.
//
// Why deferral: a rank of an in-process communicator that posts before its
// peers cannot make its stream wait for the collective yet (the event to
// wait for is recorded only once the last rank posts, and a wait on an
// event never recorded is a no-op). Outside a group the core holds the
// stream with a waiting host function; inside one, every rank posts before
// the group ends, so the stream waits for the collective's event at the
// end instead and no host function ever blocks. That matters on drivers
// that run all host functions of a process on one thread and synchronise
// implicitly in calls such as cuMemAlloc (CUDA): a blocked host function
// there stalls the very posts it waits for. NCCL requires groups for one
// thread driving several devices for the same reason.
#pragma once

#include <wia/status.h>

#include <functional>
#include <string>

namespace wia::comm {

// What a deferred action reports: WIA_SUCCESS or an error with its text.
struct GroupResult {
  wia_status_t status = WIA_SUCCESS;
  std::string message;
};

// Enters a group; returns the depth after entering (1 = outermost).
int group_enter();
// Leaves a group; at the outermost end runs every deferred action in
// posting order and puts the first failure in *first_failure. Returns the
// depth left.
int group_leave(GroupResult* first_failure);
int group_depth();
// Runs `action` when the calling thread's outermost group ends. It must
// not throw; it reports failure through its result.
void defer_to_group_end(std::function<GroupResult()> action);

}  // namespace wia::comm
