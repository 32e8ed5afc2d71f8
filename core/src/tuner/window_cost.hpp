// SPDX-License-Identifier: Apache-2.0
// The cost of an all-reduce through node-shared windows
// (engine/window_allreduce.hpp): loads and stores, not messages, so it is
// priced by the passes over memory each rank makes and the waits between
// them, not by simulating the schedule's messages (whose receive, then
// reduce, steps the window path runs as one fold over every input read in
// place: costed as messages, 2-process one-shot was predicted at 1.7 -
// 4.7x its measured time).
#pragma once

#include <cstdint>

#include "tuner/cost_model.hpp"

namespace wia::tuner {

struct WindowAllReduce {
  std::int32_t nranks = 2;
  std::uint64_t bytes = 0;        // of the vector
  std::uint64_t chunk_bytes = 0;  // a window bank (collectives.node_window_chunk_bytes)
  bool one_shot = true;           // else the direct schedule
  bool in_place = false;
  // The inputs are read from the callers' buffers in place (libwia
  // allocations, collectives.node_window_zero_copy_min_bytes); else each
  // rank first copies its input into its window.
  bool inputs_read_in_place = false;
};

// The peers' inputs read in place are taken as unchanged since the last
// call (a benchmark's loop; each rank's cache may still hold them): a
// training loop that rewrites its gradients before each call pays for
// reading them from the writer's cache, as the direct schedule's slices
// are priced here.
// Microseconds for one call, every rank alike, on `model`
// (LinkModel::node_windows: its copy rate, CPU share, cache, and a wait's
// alpha and overhead). Throws wia::Error(INVALID_ARGUMENT) for fewer than
// 2 ranks or a chunk of 0 bytes.
double window_allreduce_us(const WindowAllReduce& call, const LinkModel& model);

}  // namespace wia::tuner
