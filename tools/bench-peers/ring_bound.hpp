// SPDX-License-Identifier: Apache-2.0
// What tcp_ring_bound.cpp and shm_ring_bound.cpp share: their command line
// (NP BYTES...), forking one process per rank and collecting their exit
// statuses, and the row each prints per size ("<bytes> <time_us> <busbw
// GB/s> 0", like the other bench-peers programs: the median of three
// repetitions, nccl-tests' bus factor 2(NP-1)/NP).
#pragma once

#include <sys/prctl.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace ring_bound {

struct Args {
  int np = 0;
  std::vector<std::size_t> sizes;
};

// NP BYTES...; exits 2 with the usage line naming `program` otherwise.
inline Args parse(const char* program, int argc, char** argv) {
  Args a;
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s NP BYTES...\n", program);
    std::exit(2);
  }
  a.np = std::atoi(argv[1]);
  if (a.np < 2) {
    std::fprintf(stderr, "%s: NP must be at least 2\n", program);
    std::exit(2);
  }
  for (int i = 2; i < argc; ++i) a.sizes.push_back(std::strtoull(argv[i], nullptr, 10));
  return a;
}

[[noreturn]] inline void die(const char* program, const char* what) {
  std::fprintf(stderr, "%s: %s: %s\n", program, what, std::strerror(errno));
  std::_Exit(1);
}

// Runs rank(r) in NP forked processes; 0 when every one exited 0. The
// first that fails (or a fork that does) ends the others: they would wait
// for it forever.
template <typename Rank>
int fork_ranks(const char* program, int np, Rank rank) {
  std::vector<pid_t> pids;
  auto kill_all = [&] {
    for (const pid_t pid : pids) kill(pid, SIGKILL);
  };
  for (int r = 0; r < np; ++r) {
    const pid_t pid = fork();
    if (pid < 0) {
      kill_all();
      die(program, "fork");
    }
    if (pid == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);  // and a parent that dies ends them too
      rank(r);
      std::_Exit(0);
    }
    pids.push_back(pid);
  }
  int failed = 0;
  for (int left = np; left > 0; --left) {
    int status = 0;
    if (waitpid(-1, &status, 0) < 0) break;
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      if (failed++ == 0) kill_all();
    }
  }
  if (failed) std::fprintf(stderr, "%s: %d of %d processes failed\n", program, failed, np);
  return failed ? 1 : 0;
}

// Rank 0's row for one size from its three repetitions' times (us).
inline void print_row(int rank, int np, std::size_t bytes, std::vector<double> samples) {
  if (rank != 0) return;
  std::sort(samples.begin(), samples.end());
  const double t = samples[samples.size() / 2];
  std::printf("%zu %.2f %.3f 0\n", bytes, t,
              static_cast<double>(bytes) / t / 1e3 * 2.0 * (np - 1) / np);
  std::fflush(stdout);
}

}  // namespace ring_bound
