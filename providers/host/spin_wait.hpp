// SPDX-License-Identifier: Apache-2.0
// Bounded spin-then-block waiting for the host provider's stream workers
// and synchronize calls.
//
// Why spin at all: waking a thread blocked on a futex costs about 50 us on
// the KVM guests we run on (docs: MACHINE-FACTS.md), which would dominate
// every small operation. Why bounded: spinning on more threads than there
// are CPUs is catastrophic (a spinner steals the core the worker it waits
// for needs). So:
//  - a process-wide counter tracks this provider's threads that are
//    running work or pause-spinning ("active"); pause-spinning needs a
//    free slot (active < CPUs this process may use);
//  - after a few microseconds a waiter only yields (sched_yield), which
//    hands the CPU to whoever is runnable, including the thread it waits
//    for when the machine is busy with other processes;
//  - the whole spin lasts at most a few tens of microseconds (about one
//    wake-up's cost: the classic 2-competitive spin-then-block choice),
//    and ends at once when this process alone oversubscribes the CPUs;
//  - the pause instruction keeps a hyper-thread sibling's issue slots free.
#pragma once

#include <sched.h>

#include <atomic>
#include <chrono>
#include <cstdint>

namespace wia::host {

// How long a stream worker keeps polling its queue after running dry, and
// how long a synchronize call polls before it blocks.
inline constexpr std::int64_t kWorkerSpinNs = 50'000;
inline constexpr std::int64_t kWaitSpinNs = 50'000;
// Pause-spins (tens of ns each, a few microseconds in all) before
// switching to sched_yield.
inline constexpr std::uint32_t kPauseSpins = 256;

inline void cpu_relax() noexcept {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#endif
}

// CPUs this process may run on (affinity mask, so a taskset/cgroup limit
// counts), at least 1. Computed once.
inline int usable_cpus() noexcept {
  static const int n = [] {
    cpu_set_t set;
    CPU_ZERO(&set);
    if (sched_getaffinity(0, sizeof(set), &set) == 0) {
      const int c = CPU_COUNT(&set);
      if (c > 0) return c;
    }
    return 1;
  }();
  return n;
}

// Threads of this provider that are running work or spinning.
inline std::atomic<int>& active_threads() noexcept {
  static std::atomic<int> n{0};
  return n;
}

// Spins until done() or the budget runs out, in two phases:
//  1. a few microseconds of pause-spinning, only while a CPU is free (the
//     active count is below the CPUs): the fast path when the other side
//     is running on another core;
//  2. sched_yield until the budget is spent: if the thread we wait for is
//     runnable but queued behind us (other processes keep the CPUs busy,
//     which the counter cannot see), it runs at once instead of after our
//     time slice; with idle CPUs sched_yield returns immediately and this
//     is still a spin. A yielding thread does not hold an active slot,
//     and it stops early when this process alone has more running threads
//     than CPUs.
// `counted`: the caller (a stream worker) holds an active slot; it is given
// up for phase 2 and taken back before returning. Returns done()'s last
// value: false means "go and block".
template <class Done>
bool spin_until(Done&& done, std::int64_t budget_ns, bool counted) noexcept {
  if (done()) return true;
  const int cpus = usable_cpus();
  std::atomic<int>& active = active_threads();
  bool slot = counted;
  if (!slot) {
    int v = active.load(std::memory_order_relaxed);
    while (v < cpus && !active.compare_exchange_weak(v, v + 1, std::memory_order_relaxed)) {
    }
    slot = v < cpus;
  }
  bool ok = false;
  if (slot) {
    for (std::uint32_t i = 0; i < kPauseSpins; ++i) {
      if (done()) {
        ok = true;
        break;
      }
      cpu_relax();
    }
    active.fetch_sub(1, std::memory_order_relaxed);
  }
  if (!ok) {
    const auto start = std::chrono::steady_clock::now();
    for (std::uint32_t i = 1;; ++i) {
      if (done()) {
        ok = true;
        break;
      }
      sched_yield();
      if ((i & 7u) == 0) {
        if (active.load(std::memory_order_relaxed) > cpus) break;
        const auto spent = std::chrono::steady_clock::now() - start;
        if (std::chrono::duration_cast<std::chrono::nanoseconds>(spent).count() > budget_ns) break;
      }
    }
  }
  if (counted) active.fetch_add(1, std::memory_order_relaxed);
  return ok;
}

}  // namespace wia::host
