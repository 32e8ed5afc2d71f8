// SPDX-License-Identifier: Apache-2.0
// All-reduce through node-shared windows: when every rank of a process
// communicator is on one node, each rank maps every rank's window (device
// memory exported with the device provider's IPC entries) and the ranks
// exchange data with loads and stores instead of transport messages.
//
// Why: on one node a transport message is a copy into a shared ring and a
// copy out of it, plus a header, a queue and a wake-up per message. The
// ring all-reduce makes 2(p-1) such steps, each a point where a rank waits
// for a peer that, with more ranks than cores, may not be running. Here a
// step is: copy the input into my window, publish a step number, wait for
// everyone's, read what I need straight from their windows. Measured at
// 4 ranks on 2 cores, 1 MiB: about half the bytes moved and 2 waits per
// chunk instead of 6 (docs/processes.md, "Node-shared windows").
//
// The schedules are the usual ones, run through memory rather than messages:
//  - one-shot: per chunk, every rank publishes its vector and reduces all
//    p of them (rank order, so every rank computes the identical result);
//  - direct: per chunk, every rank publishes its input, reduces its 1/p
//    slice from all p inputs (rank order) into its window, publishes that,
//    and copies every rank's reduced slice out.
//
// Reuse without acknowledgements: every window has two banks, used by
// alternate steps. A rank writes bank (t % 2) for step t + 2 only after it
// saw every peer publish step t + 1, which each peer does only after it
// finished reading everything of step t. So a bank is never rewritten
// while anyone still reads it.
//
// Zero copy: a rank whose input lies in memory its device can export (the
// communicator's WindowSources says so: a libwia device allocation)
// publishes where it lies instead of copying it into its window, and the
// peers read it in place, through a mapping they open once per buffer and
// keep. The copy saved is a write of the whole vector per call, and a
// peer reading a buffer its owner did not rewrite since reads it from its
// own cache. The owner's buffer is the caller's again when the call
// returns, so a rank that published its buffer returns only after every
// peer said it finished reading it (the direct schedule's reduced slices
// say so; the one-shot schedule publishes a "done" step). In place, the
// one-shot schedule copies the input: it writes a chunk's result over it
// while peers may still read it (the direct schedule writes a chunk's
// result after every peer published its slice of it).
//
// Every published step carries the collective's descriptor, checked
// against every peer's, so ranks that made different calls get a mismatch
// error; a peer that never publishes becomes a timeout naming it; a peer
// that failed says why on the control channel, polled while waiting.
#pragma once

#include <wia/provider.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "engine/net_exec.hpp"
#include "kernels/cpu_reduce.hpp"

namespace wia::engine {

// Where a rank's input lies when it is not copied into its window: the
// owner's export slot (its window's table of exported buffers, `id`
// naming what the slot held when published) and the byte offset of the
// vector's first element in that buffer.
struct SourceRef {
  std::uint32_t slot = 0;
  std::uint32_t reserved = 0;
  std::uint64_t id = 0;  // 0: not exported (the data is in the window)
  std::uint64_t offset = 0;
};

// A slot of a window's table of exported buffers: written by the window's
// owner before it publishes a step naming it, read by the peers.
struct ExportSlot {
  std::uint64_t id;     // never reused by the owner; 0: empty
  std::uint64_t bytes;  // of the buffer the handle exports
  wia_ipc_handle_t handle;
};

// Exports and maps the buffers read in place (the communicator implements
// it with the device provider's IPC entries; see comm/node_windows).
class WindowSources {
 public:
  // `bytes` at `p` as the peers can map it (this rank's export table slot
  // written first); false when it cannot be exported: then it is copied.
  virtual bool export_buffer(const void* p, std::uint64_t bytes, SourceRef& ref) = 0;
  // Rank q's buffer that `ref` names, `bytes` from `ref.offset` on, as
  // mapped here; throws Error naming q when it cannot be.
  virtual const char* import_buffer(int q, const SourceRef& ref, std::uint64_t bytes) = 0;

 protected:
  ~WindowSources() = default;
};

constexpr int kExportSlots = 16;

// Every rank's window as mapped in this process, and the step counter all
// ranks advance together. Set up by the communicator (comm/node_windows).
struct NodeWindows {
  std::vector<char*> base;        // [rank]: this rank's own window too
  std::uint64_t chunk_bytes = 0;  // data bytes of one bank
  std::uint64_t step = 0;         // steps taken: the same on every rank
  // Inputs of at least `zero_copy_min_bytes` are read in place when
  // `sources` can export them (null: always copied).
  WindowSources* sources = nullptr;
  std::uint64_t zero_copy_min_bytes = 0;

  // Bytes of one window holding banks of `chunk_bytes` of data.
  static std::uint64_t window_bytes(std::uint64_t chunk_bytes);
  // Zeroes the step numbers of a new window (the data needs no zeroing).
  static void clear(char* window, std::uint64_t chunk_bytes);
  // This rank reads no window for steps up to `step` any more (its
  // all-reduce finished or failed): published in its own window.
  void release_reads(int rank, std::uint64_t step);
  // Whether rank q released its reads of every step up to `step`.
  bool released(int q, std::uint64_t step) const;
  // The process that owns rank q's window (set by its owner).
  void set_owner_pid(int rank, int pid);
  int owner_pid(int q) const;
  // Slot i of rank q's table of exported buffers.
  ExportSlot& export_slot(int q, int i) const;
};

struct WindowRegionHeader;  // window_allreduce.cpp

// How this process's waits on peers' windows went to sleep and ended, for
// tests of the wake-up: a sleeper a publishing peer did not wake still
// finishes, 1 ms later, so only these counts show the wake-up missing.
struct WindowSleepCounts {
  std::uint64_t sleeps = 0;  // futex waits entered (oversubscribed ranks only)
  std::uint64_t woken = 0;   // of those, ended by a peer's FUTEX_WAKE
};
WindowSleepCounts window_sleep_counts();

class WindowAllReduce {
 public:
  // Starts the all-reduce `desc` describes: `count` elements of `dtype`
  // from `send` (may equal `recv`: in place). `one_shot` selects the
  // schedule. References must outlive progress().
  void start(int rank, const Descriptor& desc, const void* send, void* recv, wia_reduce_op_t op,
             bool one_shot, NodeWindows& windows, ControlChannel& control,
             const NetExecOptions& options);

  // Whether restart() may run this all-reduce again: its vector rides in
  // the header line (nothing depends on the buffers' addresses).
  bool restartable() const { return in_header_ && one_shot_; }
  // The same all-reduce as the last start() (same shape, windows, control
  // and options objects) from `send` into `recv`, as collective `seq`.
  void restart(std::uint64_t seq, const void* send, void* recv) {
    desc_.seq = seq;
    send_ = static_cast<const char*>(send);
    recv_ = static_cast<char*>(recv);
    phase_ = Phase::kPublishInput;
  }

  // WIA_SUCCESS when the result is in `recv`; WIA_IN_PROGRESS when peers
  // had not published by `give_up_at` (call again); a negative status
  // with `error` naming the rank, the peer and the problem otherwise.
  wia_status_t progress(std::chrono::steady_clock::time_point give_up_at, std::string& error);

 private:
  enum class Phase { kPublishInput, kWaitInputs, kWaitSlices, kWaitReadsDone, kDone };
  bool run(std::chrono::steady_clock::time_point give_up_at);
  bool run_in_header(std::chrono::steady_clock::time_point give_up_at);
  void publish_input();
  // Rank q's input of the chunk in progress (`bytes` of it).
  const char* input_of(int q, std::uint64_t bytes);
  void reduce_inputs();
  void copy_slices_out();
  // Waits until every peer published `step_` in `which` (0 input, 1
  // reduced slice); false at `give_up_at`.
  bool wait_for_peers(int which, std::chrono::steady_clock::time_point give_up_at);
  // Sleeps (futex, at most 1 ms) until rank q publishes this step's region
  // `which`, or returns at once if it already did.
  void sleep_until_published(int q, int which);
  static constexpr std::uint32_t kYieldsBeforeSleeping = 64;
  // Rank q published another call's descriptor: throws MISMATCH naming
  // the difference.
  [[noreturn]] void fail_descriptor(int q) const;
  WindowRegionHeader* header(int q, int kind) const;
  [[noreturn]] void fail_timeout(int which) const;

  int rank_ = 0;
  int nranks_ = 0;
  Descriptor desc_{};
  const char* send_ = nullptr;
  char* recv_ = nullptr;
  wia_reduce_op_t op_{};
  bool one_shot_ = false;
  bool in_header_ = false;    // the whole vector fits in the input header
  // 2 ranks, in the header: the one kernel reduce_in_order would run.
  kernels::PairReduce pair_;
  bool zero_copy_ = false;    // this rank's input is read in place
  SourceRef source_{};        // where, when zero_copy_
  // This chunk read some peer's input in place: the one-shot schedule
  // then says when it is done reading (the peer waits for that).
  bool read_in_place_ = false;
  NodeWindows* windows_ = nullptr;
  ControlChannel* control_ = nullptr;
  const NetExecOptions* options_ = nullptr;
  std::uint64_t elem_size_ = 0, chunk_elems_ = 0, chunks_ = 0, chunk_ = 0;
  std::uint64_t step_ = 0;    // of the chunk in progress
  std::uint64_t stride_ = 0;  // bytes of one region of a window
  Phase phase_ = Phase::kDone;
  int next_peer_ = 0;  // the wait resumes here
  std::vector<const void*> srcs_;
};

}  // namespace wia::engine
