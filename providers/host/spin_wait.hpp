// SPDX-License-Identifier: Apache-2.0
// Bounded spin-then-block waiting for the host provider's stream workers
// and synchronize calls.
//
// Why spin at all: waking a thread blocked on a futex costs about 50 us on
// the KVM guests we run on (docs: MACHINE-FACTS.md), which would dominate
// every small operation. Why bounded: spinning on more threads than there
// are CPUs is catastrophic (a spinner steals the core the worker it waits
// for needs). So:
//  - a process-wide counter tracks threads that are running or spinning
//    ("active"); a thread only spins while the counter is <= the CPUs this
//    process may use, and gives up at once when it is not;
//  - a spin lasts at most a few tens of microseconds (about one wake-up's
//    cost: the classic 2-competitive spin-then-block choice);
//  - the spin loop uses the CPU's pause hint, so a hyper-thread sibling
//    keeps its issue slots.
#pragma once

#include <sched.h>
#include <cstdio>

#include <atomic>
#include <chrono>
#include <cstdint>

namespace wia::host {

// How long a stream worker keeps polling its queue after running dry, and
// how long a synchronize call polls before it blocks.
inline constexpr std::int64_t kWorkerSpinNs = 50'000;
inline constexpr std::int64_t kWaitSpinNs = 50'000;
// Pause-spins (tens of ns each) before switching to sched_yield.
inline constexpr std::uint32_t kPauseSpins = 128;

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

// Spins until done() or the budget runs out. `counted`: the caller already
// holds an active slot (a stream worker); otherwise it takes one for the
// spin, and does not spin at all when none is free. Returns done()'s last
// value, so a false return means "go and block".
template <class Done>
bool spin_until(Done&& done, std::int64_t budget_ns, bool counted) noexcept {
  if (done()) return true;
  const int cpus = usable_cpus();
  std::atomic<int>& active = active_threads();
  static std::atomic<long> c_denied{0}, c_over{0}, c_budget{0}, c_ok{0};
  struct P { ~P() { fprintf(stderr, "denied %ld over %ld budget %ld ok %ld\n", c_denied.load(), c_over.load(), c_budget.load(), c_ok.load()); } };
  static P pp;
  if (!counted) {
    int v = active.load(std::memory_order_relaxed);
    do {
      if (v >= cpus) { c_denied++; return false; }  // every CPU is taken: block instead
    } while (!active.compare_exchange_weak(v, v + 1, std::memory_order_relaxed));
  }
  const auto start = std::chrono::steady_clock::now();
  bool ok = false;
  for (std::uint32_t i = 1;; ++i) {
    if (done()) {
      c_ok++;
      ok = true;
      break;
    }
    if (i < kPauseSpins) {
      cpu_relax();
      continue;
    }
    // Past the first microseconds, yield instead of pausing: if the thread
    // we wait for is runnable but queued behind us (other processes keep
    // the CPUs busy, which the counter above cannot see), it runs now
    // instead of after our time slice. With idle CPUs sched_yield returns
    // at once and this is still a spin.
    sched_yield();
    if ((i & 7u) == 0) {
      // Oversubscribed within this process: stop burning a core that
      // somebody's real work needs.
      if (active.load(std::memory_order_relaxed) > cpus) { c_over++; break; }
      const auto spent = std::chrono::steady_clock::now() - start;
      if (std::chrono::duration_cast<std::chrono::nanoseconds>(spent).count() > budget_ns) { c_budget++; break; }
    }
  }
  if (!counted) active.fetch_sub(1, std::memory_order_relaxed);
  return ok;
}

}  // namespace wia::host
