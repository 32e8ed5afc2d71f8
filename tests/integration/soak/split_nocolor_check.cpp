// SPDX-License-Identifier: Apache-2.0
// Regression check (found by wia-soak, seed 2): splits of a process
// communicator in which some ranks get no color or are alone in theirs,
// while the others form a group of several ranks. Such ranks ran fewer
// set-up exchanges over the parent than the group's members, so the
// members waited until the collective timed out. Each split here is
// followed by an all-reduce on every new communicator, checked, and by a
// free; run as the ranks of a job (--procs 4).
#include <wia/wia.h>

#include <cstdio>
#include <cstdlib>
#include <string_view>
#include <vector>

#include "tool_ranks.hpp"

namespace {

int check(wia_status_t st, const char* what) {
  if (st != WIA_SUCCESS) {
    std::fprintf(stderr, "split_nocolor_check: %s: %s\n  %s\n", what, wia_status_string(st),
                 wia_get_last_error());
    return 1;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  int procs = 0;
  for (int i = 1; i + 1 < argc; ++i)
    if (std::string_view(argv[i]) == "--procs") procs = std::atoi(argv[i + 1]);
  if (procs > 0) return wia::tools::spawn_local_ranks("split_nocolor_check", procs, argc, argv);
  wia::tools::default_one_device_per_process();
  wia_communicator_t world = nullptr;
  if (check(wia::tools::join_job("split_nocolor_check", &world), "joining")) return 1;
  const int rank = wia_comm_rank(world), size = wia_comm_size(world);
  // Colors by rank: one rank without a color; one alone; the rest together.
  const std::vector<std::vector<int>> patterns = {
      {WIA_COMM_SPLIT_NOCOLOR, 0, 0, 0},
      {1, 0, 0, WIA_COMM_SPLIT_NOCOLOR},
      {0, 1, 1, 2},
      {0, 0, 1, 1},
  };
  int failed = 0;
  for (std::size_t k = 0; k < patterns.size(); ++k) {
    const int color = patterns[k][static_cast<std::size_t>(rank % 4)];
    int members = 0;  // of my color
    for (int r = 0; r < size; ++r) members += patterns[k][static_cast<std::size_t>(r % 4)] == color;
    wia_communicator_t sub = nullptr;
    if (check(wia_comm_split(world, color, rank, &sub), "wia_comm_split")) return 1;
    if (color < 0) {
      failed |= sub != nullptr;
      continue;
    }
    if (!sub || wia_comm_size(sub) != members) {
      std::fprintf(stderr, "split_nocolor_check: pattern %zu: rank %d: size %d, want %d\n", k, rank,
                   sub ? wia_comm_size(sub) : -1, members);
      return 1;
    }
    std::vector<std::int32_t> v(1000, rank + 1);
    wia_collective_config_t cfg{};
    cfg.datatype = WIA_INT32;
    cfg.reduction_op = WIA_REDUCE_SUM;
    if (check(wia_all_reduce(sub, v.data(), v.data(), v.size(), &cfg, nullptr), "wia_all_reduce") ||
        check(wia_stream_synchronize(nullptr), "wia_stream_synchronize"))
      return 1;
    std::int32_t want = 0;
    for (int r = 0; r < size; ++r)
      if (patterns[k][static_cast<std::size_t>(r % 4)] == color) want += r + 1;
    for (std::int32_t x : v) failed |= x != want;
    if (check(wia_destroy_communicator(sub), "wia_destroy_communicator")) return 1;
  }
  wia_destroy_communicator(world);
  wia_finalize();
  if (failed) std::fprintf(stderr, "split_nocolor_check: rank %d: wrong results\n", rank);
  return failed;
}
