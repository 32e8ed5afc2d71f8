// SPDX-License-Identifier: Apache-2.0
// The roots this process hosts. A root outlives the call that started it
// (create_unique_id returns at once), so this process-wide table owns it:
// starting one registers it, a rank of this process that joins by unique id
// finds it again by its secret (so its Bootstrap can keep it alive), and at
// exit every root still running is stopped. A forked child inherits the
// table but not the threads: it neither uses nor joins them.
#pragma once

#include <cstdint>
#include <memory>

#include "bootstrap/bootstrap.hpp"
#include "bootstrap/root.hpp"

namespace wia::bootstrap {

// Starts a root on `listener` with the timeouts of `options` and registers
// it. expected_size 0 = learned from the first hello (unique-id mode).
std::shared_ptr<RootServer> start_hosted_root(Fd listener, const Secret& secret,
                                              const Options& options, std::uint32_t expected_size);

// The running root of this process with `secret`; nullptr when there is none
// (the root runs in another process, or has finished).
std::shared_ptr<RootServer> find_hosted_root(const Secret& secret);

// Stops every root this process hosts and joins the threads no one else
// holds, so that a fork that follows copies no running root thread (a
// child of a multi-threaded parent can inherit a lock held mid-call, in
// the allocator or the logger, and hang on it). Tests that fork ranks call
// it first; a root still referenced by a live Bootstrap is stopped, and
// joined when that lets go.
void stop_hosted_roots();

// Joins the threads of the roots that have finished (every rank said
// goodbye, or the job failed) and forgets them; running roots stay.
// wia_finalize calls it, so that a process ending right after (even by
// _exit) leaves no finished, never-joined root thread behind.
void reap_finished_hosted_roots();

}  // namespace wia::bootstrap
