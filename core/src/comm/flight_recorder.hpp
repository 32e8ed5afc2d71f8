// SPDX-License-Identifier: Apache-2.0
// The flight recorder of a process communicator (as PyTorch's for NCCL):
// the last N operations this rank posted (sequence number, collective,
// count, datatype, root or peer, state, times) in a ring, written to
// flight_recorder.dir as YAML when the communicator fails (a timeout, a
// dead peer, a mismatch, an abort). `wia-info --analyse DIR` reads every
// rank's dump and names the ranks that never joined the operation where
// the job stopped (docs/flight-recorder.md).
//
// Cost on the hot path: two stores of a few words and a coarse clock read
// per operation; no lock (each slot is written by the thread that owns its
// operation, and a dump reads slots seqlock-style).
#pragma once

#include <wia/wia.h>

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

namespace wia::comm {

class FlightRecorder {
 public:
  // entries 0 = off.
  explicit FlightRecorder(std::size_t entries);

  bool on() const { return !slots_.empty(); }
  // Operation `seq` was posted: collective number `coll` of the
  // communicator (the same on every rank), or a send/receive (coll -1)
  // with `peer`. Sequence numbers count both, so they differ between ranks
  // once some ranks exchanged point to point; collective numbers do not.
  void posted(std::uint64_t seq, std::int64_t coll, const char* op, std::uint64_t count,
              wia_datatype_t dtype, int root, int peer) noexcept;
  // Operation `seq` is over (its turn released), whatever its outcome.
  void finished(std::uint64_t seq) noexcept;

  struct Context {
    int comm_index = 0;  // the n-th process communicator of this process
    int rank = 0;
    int nranks = 1;
    std::string host;
    wia_status_t status = WIA_SUCCESS;
    std::string reason;
    std::uint64_t posted = 0;     // operations posted (the next sequence number)
    std::uint64_t completed = 0;  // operations over, in order
    std::uint64_t collectives_posted = 0;
  };
  // Writes <dir>/wia-flight-comm<k>-rank<r>.yaml (temporary name, then
  // rename); returns its path, "" on failure (logged: a dump never adds an
  // error of its own).
  std::string dump(const std::string& dir, const Context& ctx) const noexcept;

 private:
  struct Slot {
    std::atomic<std::uint64_t> seq_plus_one{0};  // 0: empty or being written
    std::int64_t coll = -1;
    const char* op = "";
    std::uint64_t count = 0;
    wia_datatype_t dtype = WIA_FLOAT32;
    int root = -1;
    int peer = -1;
    std::int64_t posted_ns = 0;
    std::atomic<std::int64_t> done_ns{0};
  };
  std::vector<Slot> slots_;
};

// A coarse monotonic clock in ns (a few ns to read; ~4 ms resolution).
std::int64_t coarse_now_ns() noexcept;

}  // namespace wia::comm
