// SPDX-License-Identifier: Apache-2.0
// How long a cache line takes to move between CPU 0 and CPU 1: two threads
// pinned to them bounce one line (each waits for the other's store, then
// stores), and the time per one-way hand-over is printed in ns. On the
// 2-vCPU VM this project measures on it is about 45 ns or about 200 ns,
// changing between runs (where the host places the vCPUs), and every
// small all-reduce between two processes pays it: tools/bench-peers.sh
// prints it before each round, so a reader can tell which mode a round
// ran in (docs/performance.md, "The VM's two modes").
//
//   line_pingpong            prints "<ns>"; nothing (exit 0) on one CPU
#include <pthread.h>
#include <sched.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <thread>

namespace {

alignas(64) std::atomic<long> line{0};

bool pin(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  return pthread_setaffinity_np(pthread_self(), sizeof(set), &set) == 0;
}

}  // namespace

int main() {
  if (std::thread::hardware_concurrency() < 2) return 0;
  constexpr long kRounds = 200000;
  bool pinned = true;
  std::thread other([&] {
    pinned &= pin(1);
    for (long i = 1; i <= kRounds; ++i) {
      while (line.load(std::memory_order_acquire) != 2 * i - 1) {
      }
      line.store(2 * i, std::memory_order_release);
    }
  });
  pinned &= pin(0);
  const auto t0 = std::chrono::steady_clock::now();
  for (long i = 1; i <= kRounds; ++i) {
    line.store(2 * i - 1, std::memory_order_release);
    while (line.load(std::memory_order_acquire) != 2 * i) {
    }
  }
  const auto t1 = std::chrono::steady_clock::now();
  other.join();
  if (!pinned) return 0;  // not allowed on CPUs 0 and 1: nothing meaningful
  std::printf("%.0f\n", std::chrono::duration<double, std::nano>(t1 - t0).count() / (2.0 * kRounds));
  return 0;
}
