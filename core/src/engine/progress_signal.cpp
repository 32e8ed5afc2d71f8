// SPDX-License-Identifier: Apache-2.0
#include "engine/progress_signal.hpp"

#include <linux/futex.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <climits>
#include <ctime>

namespace wia::engine {

namespace {
static_assert(sizeof(std::atomic<std::uint32_t>) == sizeof(std::uint32_t),
              "futex needs a plain 32-bit word");
std::uint32_t* word(std::atomic<std::uint32_t>& a) { return reinterpret_cast<std::uint32_t*>(&a); }
}  // namespace

void ProgressSignal::notify() noexcept {
  epoch_.fetch_add(1, std::memory_order_seq_cst);
  if (sleepers_.load(std::memory_order_seq_cst) > 0)
    syscall(SYS_futex, word(epoch_), FUTEX_WAKE_PRIVATE, INT_MAX, nullptr, nullptr, 0);
}

void ProgressSignal::yield() noexcept { sched_yield(); }

void ProgressSignal::sleep(std::uint32_t seen, std::chrono::steady_clock::duration d) noexcept {
  const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(d).count();
  timespec ts{static_cast<time_t>(ns / 1000000000), static_cast<long>(ns % 1000000000)};
  syscall(SYS_futex, word(epoch_), FUTEX_WAIT_PRIVATE, seen, &ts, nullptr, 0);
}

}  // namespace wia::engine
