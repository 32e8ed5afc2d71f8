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
#include "common/thread_sanitizer.hpp"
#include "engine/backoff.hpp"
#include "kernels/cpu_reduce.hpp"


namespace wia::engine {

// A window is a page whose first line holds the step up to which its owner
// has finished reading every window (NodeWindows::release_reads) and the
// owner's pid, a page holding the table of buffers it exported
// (kExportSlots ExportSlot, 256 bytes apart), then four regions, [bank 0
// input][bank 0 slices][bank 1 input][bank 1 slices], each a 64-byte
// header line then the data, padded to a page. The header line starts
// with the step its data belongs to; an input header also carries the
// descriptor and, for vectors of up to 24 bytes, the data itself, so a
// small all-reduce reads one cache line per peer; for larger ones those
// 24 bytes say where the data is (SourceRef: id 0, after the header).
// The one-shot schedule's slice regions hold only a step: the "done
// reading this step's inputs" mark that a rank whose input was read in
// place waits for.
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
static_assert(sizeof(SourceRef) == kInlineBytes, "a SourceRef fills the inline bytes");
constexpr std::uint64_t kExportSlotBytes = 256;
static_assert(sizeof(ExportSlot) <= kExportSlotBytes && kExportSlots * kExportSlotBytes <= kPage,
              "the export table fills one page");
constexpr std::uint64_t kRegionsAt = 2 * kPage;  // after the first page and the export table
constexpr int kInput = 0, kSlices = 1;

std::uint64_t region_bytes(std::uint64_t chunk_bytes) {
  return (kLine + chunk_bytes + kPage - 1) / kPage * kPage;
}

// Region `kind` of the bank that `step` uses, in a window whose regions
// are `stride` bytes (region_bytes).
WindowRegionHeader* region(char* base, std::uint64_t stride, std::uint64_t step, int kind) {
  const std::uint64_t index = 2 * (step & 1) + static_cast<std::uint64_t>(kind);
  return reinterpret_cast<WindowRegionHeader*>(base + kRegionsAt + index * stride);
}

// Where a chunk's data is in its input region: inline in the header only
// when the whole vector fits there (a chunked vector's header holds a
// SourceRef instead).
bool inline_chunk(bool single_chunk, std::uint64_t bytes) {
  return single_chunk && bytes <= kInlineBytes;
}
char* data_of(WindowRegionHeader* h, bool in_header) {
  return in_header ? h->inline_data : reinterpret_cast<char*>(h) + kLine;
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
// peers asleep on it: they sleep only when ranks outnumber cores, which
// every rank of a node knows alike (`may_sleep`).
void publish(char* window, WindowRegionHeader* h, std::uint64_t step, bool may_sleep) {
  std::atomic_ref<std::uint64_t>(h->step).store(step, std::memory_order_release);
  // Otherwise no fence: it would wait for the peers' copies of the line
  // to be invalidated, a transfer between cores on the critical path.
  if (!may_sleep) return;
  // Pairs with the sleeper's count-then-check (sleep_until_published):
  // either it sees the new step, or this sees it counted.
#if WIA_THREAD_SANITIZER
  // ThreadSanitizer does not model fences (GCC refuses one under
  // -fsanitize=thread). A seq_cst read-modify-write of the count gives the
  // same guarantee: it reads the sleeper's increment or is read by it
  // (synchronising with it, so the sleeper then sees the step). Release
  // builds keep the fence: the RMW would take the count's line from the
  // peers on every publish.
  const std::uint32_t sleepers = sleepers_of(window).fetch_add(0, std::memory_order_seq_cst);
#else
  std::atomic_thread_fence(std::memory_order_seq_cst);
  const std::uint32_t sleepers = sleepers_of(window).load(std::memory_order_relaxed);
#endif
  if (sleepers != 0) ::syscall(SYS_futex, futex_word(h), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
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
constexpr SourceRef kNotExported{};

const char* kind_name(int kind, bool one_shot) {
  return kind == kInput ? "input" : one_shot ? "done-reading mark" : "reduced slice";
}

}  // namespace

std::uint64_t NodeWindows::window_bytes(std::uint64_t chunk_bytes) {
  return kRegionsAt + 4 * region_bytes(chunk_bytes);
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
  std::memset(window + kPage, 0, kPage);                      // no buffer exported
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

ExportSlot& NodeWindows::export_slot(int q, int i) const {
  return *reinterpret_cast<ExportSlot*>(base[q] + kPage + static_cast<std::uint64_t>(i) * kExportSlotBytes);
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
  const std::uint64_t bytes = desc.count * elem_size_;
  if (bytes <= windows.chunk_bytes) {  // no divisions: this is the 8-byte path
    chunk_elems_ = desc.count;
    chunks_ = 1;
  } else {
    chunk_elems_ = std::max<std::uint64_t>(windows.chunk_bytes / elem_size_, 1);
    chunks_ = (desc.count + chunk_elems_ - 1) / chunk_elems_;
  }
  // In place, the one-shot schedule writes a chunk's result over the
  // input while peers may still read it: copied. The direct schedule
  // writes a chunk's result only after every peer published its slice of
  // that chunk, that is, finished reading it.
  const bool in_place = send_ == recv_;
  zero_copy_ = windows.sources && bytes >= windows.zero_copy_min_bytes &&
               !inline_chunk(chunks_ == 1, bytes) && !(in_place && one_shot) &&
               (in_place || send_ + bytes <= recv_ || recv_ + bytes <= send_) &&
               windows.sources->export_buffer(send, bytes, source_);
  in_header_ = inline_chunk(chunks_ == 1, bytes);
  pair_ = in_header_ && nranks_ == 2
              ? kernels::pair_reduce(static_cast<wia_datatype_t>(desc.dtype), op)
              : kernels::PairReduce{};
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
  read_in_place_ = false;
  const bool in_header = inline_chunk(chunks_ == 1, bytes);
  if (!in_header) {
    // Where the data is; id 0: after the header.
    static_assert(offsetof(SourceRef, id) == 8, "the id is the inline bytes' second word");
    std::memcpy(h->inline_data, zero_copy_ ? &source_ : &kNotExported, sizeof(SourceRef));
  }
  // Unless read in place, copied: the peers read it after this rank's
  // call may have returned and the caller reused its buffer. (No copy for
  // an empty vector, whose buffers may be null.)
  if (!zero_copy_ && bytes > 0)
    std::memcpy(data_of(h, in_header), send_ + first * elem_size_, bytes);
  publish(windows_->base[rank_], h, step_, options_->oversubscribed);
  next_peer_ = 0;
}

bool WindowAllReduce::wait_for_peers(int which, std::chrono::steady_clock::time_point give_up_at) {
  Backoff backoff(options_->oversubscribed);
  ControlPace pace;
  std::uint32_t yields = 0;
  while (next_peer_ < nranks_) {
    if (next_peer_ == rank_ || load_step(header(next_peer_, which)) == step_) {
      // The descriptor shares the step's cache line: checked while hot.
      if (which == kInput && next_peer_ != rank_ &&
          !same_bytes(header(next_peer_, kInput)->desc, desc_))
        fail_descriptor(next_peer_);
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
    const IdleRound waited = idle_round(backoff, pace, *control_, *options_, give_up_at);
    if (waited == IdleRound::kGiveUp) return false;
    if (waited == IdleRound::kTimedOut) fail_timeout(which);
  }
  next_peer_ = 0;
  return true;
}

namespace {
// window_sleep_counts(): touched only on the sleeping path.
std::atomic<std::uint64_t> g_sleeps{0}, g_sleeps_woken{0};
}  // namespace

WindowSleepCounts window_sleep_counts() {
  return {g_sleeps.load(std::memory_order_relaxed), g_sleeps_woken.load(std::memory_order_relaxed)};
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
    g_sleeps.fetch_add(1, std::memory_order_relaxed);
    // 0: woken (FUTEX_WAKE); -1 with ETIMEDOUT or EAGAIN (published first).
    if (::syscall(SYS_futex, futex_word(h), FUTEX_WAIT, static_cast<std::uint32_t>(seen), &ms,
                  nullptr, 0) == 0)
      g_sleeps_woken.fetch_add(1, std::memory_order_relaxed);
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
                          std::min(chunk_ + 1, chunks_), chunks_, options_->timeout_ms, rank_,
                          kind_name(which, one_shot_),
                          ranks.empty() ? "none (they arrived at the deadline)" : ranks,
                          where.empty() ? "" : "; " + where));
}

void WindowAllReduce::fail_descriptor(int q) const {
  const Descriptor copy = header(q, kInput)->desc;
  std::string diff = describe_difference(desc_, copy);
  if (diff.empty()) diff = "descriptor bytes";
  throw Error(WIA_ERROR_MISMATCH,
              fmt::format("collective #{} does not match across ranks: rank {} and rank {} "
                          "differ in {}",
                          desc_.seq, rank_, q, diff));
}

const char* WindowAllReduce::input_of(int q, std::uint64_t bytes) {
  const std::uint64_t first_byte = chunk_ * chunk_elems_ * elem_size_;
  if (q == rank_ && zero_copy_) return send_ + first_byte;
  WindowRegionHeader* h = header(q, kInput);
  if (inline_chunk(chunks_ == 1, bytes)) return h->inline_data;
  SourceRef ref;
  std::memcpy(&ref, h->inline_data, sizeof(ref));
  if (ref.id == 0) return data_of(h, false);
  if (!windows_->sources)
    throw Error(WIA_ERROR_INTERNAL,
                fmt::format("collective #{}: rank {} published its input in place (export slot "
                            "{}) but rank {} cannot map exported buffers",
                            desc_.seq, q, ref.slot, rank_));
  read_in_place_ = true;
  return windows_->sources->import_buffer(q, ref, desc_.count * elem_size_) + first_byte;
}

void WindowAllReduce::reduce_inputs() {
  const std::uint64_t first = chunk_ * chunk_elems_;
  const std::uint64_t n = std::min(chunk_elems_, desc_.count - first);
  if (one_shot_) {
    // Every rank reduces the whole chunk, in rank order: bit-identical.
    for (int q = 0; q < nranks_; ++q) srcs_[q] = input_of(q, n * elem_size_);
    reduce_in_order(desc_, op_, recv_ + first * elem_size_, srcs_, n, rank_, kWhat);
    // Ranks whose inputs were read in place wait for this before their
    // buffers are the caller's again.
    if (read_in_place_)
      publish(windows_->base[rank_], header(rank_, kSlices), step_, options_->oversubscribed);
    return;
  }
  // This rank's slice of the chunk, from every rank's input, into its
  // window for the others to copy.
  const std::uint64_t lo = n * static_cast<std::uint64_t>(rank_) / nranks_;
  const std::uint64_t hi = n * static_cast<std::uint64_t>(rank_ + 1) / nranks_;
  for (int q = 0; q < nranks_; ++q) srcs_[q] = input_of(q, n * elem_size_) + lo * elem_size_;
  WindowRegionHeader* mine = header(rank_, kSlices);
  reduce_in_order(desc_, op_, data_of(mine, false) + lo * elem_size_, srcs_, hi - lo, rank_,
                  kWhat);
  publish(windows_->base[rank_], mine, step_, options_->oversubscribed);
}

void WindowAllReduce::copy_slices_out() {
  const std::uint64_t first = chunk_ * chunk_elems_;
  const std::uint64_t n = std::min(chunk_elems_, desc_.count - first);
  char* out = recv_ + first * elem_size_;
  for (int q = 0; q < nranks_; ++q) {
    const std::uint64_t lo = n * static_cast<std::uint64_t>(q) / nranks_;
    const std::uint64_t hi = n * static_cast<std::uint64_t>(q + 1) / nranks_;
    const char* slices = data_of(header(q, kSlices), false);
    if (hi > lo)
      std::memcpy(out + lo * elem_size_, slices + lo * elem_size_, (hi - lo) * elem_size_);
  }
}

// The whole vector rides in the input header's line (24 bytes or fewer,
// one-shot: a training loop's small all-reduce): one publish, one wait,
// one reduction, without run()'s chunk loop; 2 ranks reduce with the
// kernel resolved at start().
bool WindowAllReduce::run_in_header(std::chrono::steady_clock::time_point give_up_at) {
  if (phase_ == Phase::kDone) return true;
  if (phase_ == Phase::kPublishInput) {
    publish_input();
    phase_ = Phase::kWaitInputs;
  }
  if (!wait_for_peers(kInput, give_up_at)) return false;
  if (pair_)
    pair_(recv_, header(0, kInput)->inline_data, header(1, kInput)->inline_data, desc_.count);
  else
    reduce_inputs();
  phase_ = Phase::kDone;
  return true;
}

bool WindowAllReduce::run(std::chrono::steady_clock::time_point give_up_at) {
  if (in_header_ && one_shot_) return run_in_header(give_up_at);
  for (;;) {
    switch (phase_) {
      case Phase::kPublishInput:
        publish_input();
        phase_ = Phase::kWaitInputs;
        break;
      case Phase::kWaitInputs:
        if (!wait_for_peers(kInput, give_up_at)) return false;
        reduce_inputs();
        if (!one_shot_)
          phase_ = Phase::kWaitSlices;
        else if (++chunk_ < chunks_)
          phase_ = Phase::kPublishInput;
        else
          // Every peer read the chunks in order: its mark for the last
          // says it is done with this rank's buffer.
          phase_ = zero_copy_ ? Phase::kWaitReadsDone : Phase::kDone;
        break;
      case Phase::kWaitSlices:
        // (Also: every peer finished reading this chunk of our input.)
        if (!wait_for_peers(kSlices, give_up_at)) return false;
        copy_slices_out();
        phase_ = ++chunk_ < chunks_ ? Phase::kPublishInput : Phase::kDone;
        break;
      case Phase::kWaitReadsDone:
        if (!wait_for_peers(kSlices, give_up_at)) return false;
        phase_ = Phase::kDone;
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
