// SPDX-License-Identifier: Apache-2.0
// How a thread that drives transports waits for a peer (network engine,
// point to point).
//
// A message is usually microseconds away and waking from a sleep costs
// about 50 us on this machine (MACHINE-FACTS), so while the node has a core
// per rank we pause-spin for a little after the last progress, then yield
// (cheap when nothing else is runnable, and it runs the peer when it is
// queued behind us), and only after 2 ms sleep in growing slices. With more
// ranks than cores a spinner holds the core its peer needs, so we yield at
// once. Spinning longer was measured to hurt: two threads of a process
// sharing a core with a spinning peer cost a whole spin per message, and
// two ranks the scheduler put on one CPU for a while (it happens on this
// VM) paid it per call: 2 us instead of 10 made an 8-byte all-reduce
// between two processes pinned to one CPU 15 -> 7 us, and measured the
// same as 10 us (0.34 us) when they run on two.
#pragma once

#include <sched.h>
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdint>

namespace wia::engine {

class Backoff {
 public:
  using Clock = std::chrono::steady_clock;
  explicit Backoff(bool oversubscribed) : oversubscribed_(oversubscribed) {}

  // Something happened: the next wait starts a new idle period.
  void reset() { idle_ = 0; }

  // One round of waiting.
  void wait() {
    ++idle_;
    if (idle_ == 1)
      start_ = now_ = Clock::now();
    else if ((idle_ & 15) == 0)
      now_ = Clock::now();
    const auto idle_for = now_ - start_;
    if (!oversubscribed_ && idle_for < kSpinFor) {
#if defined(__x86_64__) || defined(__i386__)
      __builtin_ia32_pause();
#endif
      return;
    }
    if (idle_for < kYieldUntil) {
      sched_yield();
      return;
    }
    const auto slept =
        std::chrono::duration_cast<std::chrono::microseconds>(idle_for - kYieldUntil).count();
    const long us = std::clamp<long>(slept / 8, 10, 200);
    timespec ts{0, us * 1000};
    nanosleep(&ts, nullptr);
    now_ = Clock::now();
  }

  // True on the rounds that read the clock (every 16th): the time to check
  // deadlines against, without a clock call of the caller's own.
  bool read_clock() const { return (idle_ & 15) == 0 || idle_for_sleeping(); }
  Clock::time_point now() const { return now_; }

 private:
  bool idle_for_sleeping() const { return now_ - start_ >= kYieldUntil; }
  static constexpr std::chrono::microseconds kSpinFor{2};
  static constexpr std::chrono::microseconds kYieldUntil{2000};

  bool oversubscribed_;
  std::uint32_t idle_ = 0;
  Clock::time_point start_{}, now_{};
};

}  // namespace wia::engine
