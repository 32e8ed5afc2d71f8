// SPDX-License-Identifier: Apache-2.0
// Waiting for a condition that other threads make true, bounded by a
// deadline. Tuned for this class of machine (docs/performance.md): waking a
// sleeping thread on another vCPU costs ~50 us, so a waiter first spins
// (briefly, with a pause instruction) while there are no more busy threads
// than cores, then yields, then sleeps on a futex; oversubscribed waiters
// skip the long spin, because spinning against the thread they wait for
// is catastrophic there.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>

namespace wia::engine {

class ProgressSignal {
 public:
  // Wake every sleeping waiter. Cheap when nobody sleeps.
  void notify() noexcept;
  // Changes on every notify(): "has anything happened since I looked?"
  std::uint32_t epoch() const noexcept { return epoch_.load(std::memory_order_acquire); }

  // Waits until ready() returns true (returns true) or the deadline passes
  // (returns false). `oversubscribed` shortens the spin phase.
  // `patient`: the waiter expects a long wait and nothing depends on its
  // reaction time (an idle stream task waiting for others to finish its rank):
  // it skips most of the spinning and leaves the cores to those who work.
  template <typename Ready>
  bool wait_until(Ready&& ready, std::chrono::steady_clock::time_point deadline,
                  bool oversubscribed, bool patient = false) {
    if (ready()) return true;
    // Phase 1: pause-spin about one wake-up's cost (the classic
    // 2-competitive spin-then-block), much less when oversubscribed.
    // Phase 2: yield, which runs the thread we wait for if it is queued
    // behind us. Phase 3: sleep on the futex.
    using Clock = std::chrono::steady_clock;
    const auto start = Clock::now();
    const auto spin_for = std::chrono::microseconds(patient ? 1 : oversubscribed ? 2 : 30);
    const auto yield_for =
        std::chrono::microseconds(patient ? (oversubscribed ? 0 : 20) : oversubscribed ? 200 : 100);
    for (std::uint32_t i = 1;; ++i) {
      cpu_relax();
      if (ready()) return true;
      if ((i & 63) == 0 && Clock::now() - start > spin_for) break;
    }
    while (Clock::now() - start < spin_for + yield_for) {
      yield();
      if (ready()) return true;
    }
    for (;;) {
      const std::uint32_t seen = epoch_.load(std::memory_order_acquire);
      sleepers_.fetch_add(1, std::memory_order_seq_cst);
      if (ready()) {
        sleepers_.fetch_sub(1, std::memory_order_relaxed);
        return true;
      }
      const auto now = std::chrono::steady_clock::now();
      if (now >= deadline) {
        sleepers_.fetch_sub(1, std::memory_order_relaxed);
        return ready();
      }
      // Sleep in slices so a missed wake-up costs at most one slice.
      const auto slice = std::min<std::chrono::steady_clock::duration>(
          deadline - now, std::chrono::milliseconds(20));
      sleep(seen, slice);
      sleepers_.fetch_sub(1, std::memory_order_relaxed);
      if (ready()) return true;
    }
  }

 private:
  static void cpu_relax() noexcept {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    asm volatile("yield");
#endif
  }
  static void yield() noexcept;
  void sleep(std::uint32_t seen, std::chrono::steady_clock::duration d) noexcept;

  std::atomic<std::uint32_t> epoch_{0};
  std::atomic<std::int32_t> sleepers_{0};
};

}  // namespace wia::engine
