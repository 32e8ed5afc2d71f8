// SPDX-License-Identifier: Apache-2.0
#include "engine/window_allreduce.hpp"

#include <fmt/format.h>
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <climits>
#include <cstring>
#include <ctime>

#include "common/error.hpp"
#include "engine/backoff.hpp"
#include "kernels/cpu_reduce.hpp"

namespace wia::engine {

// A window is a page whose first line holds the step up to which its owner
// has finished reading every window (NodeWindows::release_reads) and the
// owner's pid, then four regions, [bank 0 input][bank 0 slices][bank 1
// input][bank 1 slices], each a 64-byte header line then the data, padded
// to a page. The header line starts with the step its data belongs to; an
// input header also carries the descriptor and, for vectors of up to 24
// bytes, the data itself, so a small all-reduce reads one cache line per
// peer.
struct WindowRegionHeader {
  std::uint64_t step;
  Descriptor desc;
  char inline_data[24];
};

namespace {

constexpr std::uint64_t kLine = 64;
constexpr std::uint64_t kPage = 4096;

static_assert(sizeof(WindowRegionHeader) == kLine, "one cache line");
constexpr std::uint64_t kInlineBytes = sizeof(WindowRegionHeader::inline_data);
constexpr int kInput = 0, kSlices = 1;

std::uint64_t region_bytes(std::uint64_t chunk_bytes) {
  return (kLine + chunk_bytes + kPage - 1) / kPage * kPage;
}

// Region `kind` of the bank that `step` uses, in a window whose regions
// are `stride` bytes (region_bytes).
WindowRegionHeader* region(char* base, std::uint64_t stride, std::uint64_t step, int kind) {
  const std::uint64_t index = 2 * (step & 1) + static_cast<std::uint64_t>(kind);
  return reinterpret_cast<WindowRegionHeader*>(base + kPage + index * stride);
}

char* data_of(WindowRegionHeader* h, std::uint64_t bytes) {
  return bytes <= kInlineBytes ? h->inline_data : reinterpret_cast<char*>(h) + kLine;
}

std::uint64_t load_step(const WindowRegionHeader* h) {
  return std::atomic_ref<const std::uint64_t>(h->step).load(std::memory_order_acquire);
}

// Peers asleep on one of a window's step words (futex, below) count
// themselves in this word of the window's first page, on a line of its own.
std::atomic_ref<std::uint32_t> sleepers_of(char* window) {
  return std::atomic_ref<std::uint32_t>(*reinterpret_cast<std::uint32_t*>(window + kLine));
}

// The futex word of a step is its low half (little-endian x86 and arm64):
// consecutive steps differ in it. The windows are shared mappings, so the
// futex is the shared (not process-private) kind.
static_assert(std::endian::native == std::endian::little, "the futex word is the step's low half");
std::uint32_t* futex_word(WindowRegionHeader* h) { return reinterpret_cast<std::uint32_t*>(&h->step); }

// Publishes `step` in this rank's own region `h` of `window`, waking the
// peers asleep on it.
void publish(char* window, WindowRegionHeader* h, std::uint64_t step) {
  std::atomic_ref<std::uint64_t>(h->step).store(step, std::memory_order_release);
  // Pairs with the sleeper's count-then-check (sleep_until_published):
  // either it sees the new step, or this sees it counted.
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (sleepers_of(window).load(std::memory_order_relaxed) != 0)
    ::syscall(SYS_futex, futex_word(h), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

// Four 8-byte compares, inline: memcmp is a call for a 32-byte block.
bool same_bytes(const Descriptor& a, const Descriptor& b) {
  std::uint64_t x[4], y[4];
  std::memcpy(x, &a, sizeof(x));
  std::memcpy(y, &b, sizeof(y));
  return ((x[0] ^ y[0]) | (x[1] ^ y[1]) | (x[2] ^ y[2]) | (x[3] ^ y[3])) == 0;
}
static_assert(sizeof(Descriptor) == 32, "same_bytes compares 32 bytes");

constexpr const char* kWhat = "all-reduce through node-shared windows";

const char* kind_name(int kind) { return kind == kInput ? "input" : "reduced slice"; }

}  // namespace

std::uint64_t NodeWindows::window_bytes(std::uint64_t chunk_bytes) {
  return kPage + 4 * region_bytes(chunk_bytes);
}

namespace {
// Marks a published "released up to" word, so that 0 can only mean a
// window its owner freed (the host provider zeroes freed memory), never
// one whose owner is still inside its first collective.
constexpr std::uint64_t kReleasedMark = 1ull << 63;
}  // namespace

void NodeWindows::clear(char* window, std::uint64_t chunk_bytes) {
  std::memset(window, 0, 2 * kLine);  // released-reads word and pid; sleepers
  *reinterpret_cast<std::uint64_t*>(window) = kReleasedMark;  // released up to step 0
  for (std::uint64_t step = 0; step < 2; ++step)
    for (int kind : {kInput, kSlices})
      *region(window, region_bytes(chunk_bytes), step, kind) = WindowRegionHeader{};
}

void NodeWindows::release_reads(int rank, std::uint64_t up_to) {
  std::atomic_ref<std::uint64_t>(*reinterpret_cast<std::uint64_t*>(base[rank]))
      .store(up_to | kReleasedMark, std::memory_order_release);
}

void NodeWindows::set_owner_pid(int rank, int pid) {
  reinterpret_cast<std::int64_t*>(base[rank])[1] = pid;
}

int NodeWindows::owner_pid(int q) const {
  return static_cast<int>(reinterpret_cast<const std::int64_t*>(base[q])[1]);
}

bool NodeWindows::released(int q, std::uint64_t up_to) const {
  const std::uint64_t v =
      std::atomic_ref<const std::uint64_t>(*reinterpret_cast<const std::uint64_t*>(base[q]))
          .load(std::memory_order_acquire);
  // 0: q freed its window, which it does only when done with ours.
  return v == 0 || (v & ~kReleasedMark) >= up_to;
}

// This step's region `kind` of rank q's window.
WindowRegionHeader* WindowAllReduce::header(int q, int kind) const {
  return region(windows_->base[q], stride_, step_, kind);
}

void WindowAllReduce::start(int rank, const Descriptor& desc, const void* send, void* recv,
                            wia_reduce_op_t op, bool one_shot, NodeWindows& windows,
                            ControlChannel& control, const NetExecOptions& options) {
  rank_ = rank;
  nranks_ = static_cast<int>(windows.base.size());
  desc_ = desc;
  send_ = static_cast<const char*>(send);
  recv_ = static_cast<char*>(recv);
  op_ = op;
  one_shot_ = one_shot;
  windows_ = &windows;
  control_ = &control;
  options_ = &options;
  elem_size_ = kernels::dtype_size(static_cast<wia_datatype_t>(desc.dtype));
  if (one_shot) {  // no divisions: this is the 8-byte path
    chunk_elems_ = desc.count;
    chunks_ = 1;
  } else {
    chunk_elems_ = std::max<std::uint64_t>(windows.chunk_bytes / elem_size_, 1);
    chunks_ = std::max<std::uint64_t>((desc.count + chunk_elems_ - 1) / chunk_elems_, 1);
  }
  chunk_ = 0;
  stride_ = region_bytes(windows.chunk_bytes);
  srcs_.resize(static_cast<std::size_t>(nranks_));
  phase_ = Phase::kPublishInput;
}

void WindowAllReduce::publish_input() {
  step_ = ++windows_->step;
  const std::uint64_t first = chunk_ * chunk_elems_;
  const std::uint64_t bytes = std::min(chunk_elems_, desc_.count - first) * elem_size_;
  WindowRegionHeader* h = header(rank_, kInput);
  h->desc = desc_;
  // Copied, not referenced: the peers read it after this rank's call may
  // have returned and the caller reused its buffer. (No copy for an empty
  // vector, whose buffers may be null.)
  if (bytes > 0)
    std::memcpy(data_of(h, one_shot_ ? bytes : kLine), send_ + first * elem_size_, bytes);
  publish(windows_->base[rank_], h, step_);
  next_peer_ = 0;
}

bool WindowAllReduce::wait_for_peers(int which, std::chrono::steady_clock::time_point give_up_at) {
  Backoff backoff(options_->oversubscribed);
  std::uint32_t idle_rounds = 0, yields = 0;
  while (next_peer_ < nranks_) {
    if (next_peer_ == rank_ || load_step(header(next_peer_, which)) == step_) {
      // The descriptor shares the step's cache line: checked while hot.
      if (which == kInput && next_peer_ != rank_) check_descriptor(next_peer_);
      ++next_peer_;
      backoff.reset();
      yields = 0;
      continue;
    }
    // With more ranks than cores, a waiter that yields stays runnable and
    // the scheduler keeps picking it over the peer it waits for: after
    // some yields, sleep until that peer publishes. 4 processes on 2
    // cores, 6 alternating pairs against never sleeping: 1 MiB +36-60%,
    // 16 and 64 MiB +12-16%; sleeping after 4 yields instead of 64 made
    // 8 bytes 6.4 -> 10.8 us (the wake-up), after 64 it measured the same.
    if (options_->oversubscribed && ++yields > kYieldsBeforeSleeping)
      sleep_until_published(next_peer_, which);
    // Peers that failed tell us on the control channel (and a peer that
    // died is noticed by its transport there); peers asking where we are
    // get their answer.
    const IdleRound waited = idle_round(backoff, idle_rounds, *control_, *options_, give_up_at);
    if (waited == IdleRound::kGiveUp) return false;
    if (waited == IdleRound::kTimedOut) fail_timeout(which);
  }
  next_peer_ = 0;
  return true;
}

void WindowAllReduce::sleep_until_published(int q, int which) {
  WindowRegionHeader* h = header(q, which);
  auto sleepers = sleepers_of(windows_->base[q]);
  sleepers.fetch_add(1, std::memory_order_seq_cst);
  const std::uint64_t seen =
      std::atomic_ref<const std::uint64_t>(h->step).load(std::memory_order_seq_cst);
  // At most 1 ms: the caller polls the control channel and its deadline
  // between sleeps, and a peer that died never publishes.
  if (seen != step_) {
    const timespec ms{0, 1000000};
    ::syscall(SYS_futex, futex_word(h), FUTEX_WAIT, static_cast<std::uint32_t>(seen), &ms,
              nullptr, 0);
  }
  sleepers.fetch_sub(1, std::memory_order_relaxed);
}

void WindowAllReduce::fail_timeout(int which) const {
  std::string ranks;
  for (int q = 0; q < nranks_; ++q)
    if (q != rank_ && load_step(header(q, which)) != step_)
      ranks += fmt::format("{}{}", ranks.empty() ? "" : ", ", q);
  const std::string where = control_->diagnose(desc_.seq);
  throw Error(WIA_ERROR_TIMEOUT,
              fmt::format("collective #{} ({} all-reduce of {} B through node-shared windows, "
                          "chunk {} of {}) timed out after {} ms on rank {}: waiting for the {} "
                          "of rank(s) {}{}",
                          desc_.seq, one_shot_ ? "one-shot" : "direct", desc_.count * elem_size_,
                          chunk_ + 1, chunks_, options_->timeout_ms, rank_, kind_name(which),
                          ranks.empty() ? "none (they arrived at the deadline)" : ranks,
                          where.empty() ? "" : "; " + where));
}

void WindowAllReduce::check_descriptor(int q) const {
  const Descriptor& theirs = header(q, kInput)->desc;
  if (same_bytes(theirs, desc_)) return;
  const Descriptor copy = theirs;
  std::string diff = describe_difference(desc_, copy);
  if (diff.empty()) diff = "descriptor bytes";
  throw Error(WIA_ERROR_MISMATCH,
              fmt::format("collective #{} does not match across ranks: rank {} and rank {} "
                          "differ in {}",
                          desc_.seq, rank_, q, diff));
}

void WindowAllReduce::reduce_inputs() {
  const std::uint64_t first = chunk_ * chunk_elems_;
  const std::uint64_t n = std::min(chunk_elems_, desc_.count - first);
  if (one_shot_) {
    // Every rank reduces the whole vector, in rank order: bit-identical.
    for (int q = 0; q < nranks_; ++q) srcs_[q] = data_of(header(q, kInput), n * elem_size_);
    reduce_in_order(desc_, op_, recv_ + first * elem_size_, srcs_, n, rank_, kWhat);
    return;
  }
  // This rank's slice of the chunk, from every rank's input, into its
  // window for the others to copy.
  const std::uint64_t lo = n * static_cast<std::uint64_t>(rank_) / nranks_;
  const std::uint64_t hi = n * static_cast<std::uint64_t>(rank_ + 1) / nranks_;
  for (int q = 0; q < nranks_; ++q) srcs_[q] = data_of(header(q, kInput), kLine) + lo * elem_size_;
  WindowRegionHeader* mine = header(rank_, kSlices);
  reduce_in_order(desc_, op_, data_of(mine, kLine) + lo * elem_size_, srcs_, hi - lo, rank_, kWhat);
  publish(windows_->base[rank_], mine, step_);
}

void WindowAllReduce::copy_slices_out() {
  const std::uint64_t first = chunk_ * chunk_elems_;
  const std::uint64_t n = std::min(chunk_elems_, desc_.count - first);
  char* out = recv_ + first * elem_size_;
  for (int q = 0; q < nranks_; ++q) {
    const std::uint64_t lo = n * static_cast<std::uint64_t>(q) / nranks_;
    const std::uint64_t hi = n * static_cast<std::uint64_t>(q + 1) / nranks_;
    const char* slices = data_of(header(q, kSlices), kLine);
    if (hi > lo)
      std::memcpy(out + lo * elem_size_, slices + lo * elem_size_, (hi - lo) * elem_size_);
  }
}

bool WindowAllReduce::run(std::chrono::steady_clock::time_point give_up_at) {
  for (;;) {
    switch (phase_) {
      case Phase::kPublishInput:
        publish_input();
        phase_ = Phase::kWaitInputs;
        break;
      case Phase::kWaitInputs:
        if (!wait_for_peers(kInput, give_up_at)) return false;
        reduce_inputs();
        phase_ = one_shot_ ? Phase::kDone : Phase::kWaitSlices;
        break;
      case Phase::kWaitSlices:
        if (!wait_for_peers(kSlices, give_up_at)) return false;
        copy_slices_out();
        phase_ = ++chunk_ < chunks_ ? Phase::kPublishInput : Phase::kDone;
        break;
      case Phase::kDone:
        return true;
    }
  }
}

wia_status_t WindowAllReduce::progress(std::chrono::steady_clock::time_point give_up_at,
                                       std::string& error) {
  wia_status_t st;
  try {
    if (!run(give_up_at)) return WIA_IN_PROGRESS;
    st = WIA_SUCCESS;
  } catch (const Error& e) {
    error = e.what();
    st = e.status();
  } catch (const std::exception& e) {
    error = fmt::format("rank {}: {}", rank_, e.what());
    st = WIA_ERROR_INTERNAL;
  }
  // Done with the peers' windows, whatever happened: they may free them.
  windows_->release_reads(rank_, windows_->step);
  return st;
}

}  // namespace wia::engine
