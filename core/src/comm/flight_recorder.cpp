// SPDX-License-Identifier: Apache-2.0
#include "comm/flight_recorder.hpp"

#include <fmt/format.h>
#include <time.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>

#include "common/error.hpp"
#include "common/log.hpp"
#include "kernels/cpu_reduce.hpp"

namespace wia::comm {

std::int64_t coarse_now_ns() noexcept {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
  return static_cast<std::int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

FlightRecorder::FlightRecorder(std::size_t entries) : slots_(entries) {}

void FlightRecorder::posted(std::uint64_t seq, std::int64_t coll, const char* op,
                            std::uint64_t count, wia_datatype_t dtype, int root,
                            int peer) noexcept {
  if (slots_.empty()) return;
  Slot& s = slots_[seq % slots_.size()];
  s.seq_plus_one.store(0, std::memory_order_relaxed);
  std::atomic_signal_fence(std::memory_order_seq_cst);
  s.coll = coll;
  s.op = op;
  s.count = count;
  s.dtype = dtype;
  s.root = root;
  s.peer = peer;
  s.posted_ns = coarse_now_ns();
  s.done_ns.store(0, std::memory_order_relaxed);
  s.seq_plus_one.store(seq + 1, std::memory_order_release);
}

void FlightRecorder::finished(std::uint64_t seq) noexcept {
  if (slots_.empty()) return;
  Slot& s = slots_[seq % slots_.size()];
  if (s.seq_plus_one.load(std::memory_order_acquire) == seq + 1)
    s.done_ns.store(coarse_now_ns(), std::memory_order_relaxed);
}

std::string FlightRecorder::dump(const std::string& dir, const Context& c) const noexcept {
  try {
    const std::int64_t now = coarse_now_ns();
    std::string text = fmt::format(
        "# libwia flight recorder: the last operations of one rank of a process communicator\n"
        "format: 1\ncomm: {}\nrank: {}\nnranks: {}\nhost: \"{}\"\npid: {}\nstatus: {}\n"
        "reason: \"{}\"\nposted: {}\ncompleted: {}\ncollectives_posted: {}\nentries:\n",
        c.comm_index, c.rank, c.nranks, c.host, ::getpid(), status_name(c.status),
        [&] {
          std::string r;
          for (char ch : c.reason.substr(0, 2000)) {
            if (ch == '"' || ch == '\\') r += '\\';
            r += ch == '\n' ? ' ' : ch;
          }
          return r;
        }(),
        c.posted, c.completed, c.collectives_posted);
    // Oldest first: the slots of the last slots_.size() sequence numbers.
    const std::uint64_t first = c.posted > slots_.size() ? c.posted - slots_.size() : 0;
    for (std::uint64_t seq = first; seq < c.posted; ++seq) {
      const Slot& s = slots_[seq % slots_.size()];
      if (s.seq_plus_one.load(std::memory_order_acquire) != seq + 1) continue;
      const std::int64_t coll = s.coll;
      const char* op = s.op;
      const std::uint64_t count = s.count;
      const wia_datatype_t dtype = s.dtype;
      const int root = s.root, peer = s.peer;
      const std::int64_t posted_ns = s.posted_ns;
      const std::int64_t done_ns = s.done_ns.load(std::memory_order_relaxed);
      if (s.seq_plus_one.load(std::memory_order_acquire) != seq + 1)
        continue;  // rewritten meanwhile
      const char* state = done_ns != 0 ? "done" : seq < c.completed ? "done" : "pending";
      text += fmt::format(
          "  - {{seq: {}, coll: {}, op: {}, count: {}, dtype: {}, root: {}, peer: {}, state: {}, "
          "posted_ms_ago: {}, took_ms: {}}}\n",
          seq, coll, op, count, kernels::dtype_name(dtype), root, peer, state,
          (now - posted_ns) / 1000000, done_ns != 0 ? (done_ns - posted_ns) / 1000000 : -1);
    }
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    const std::string path =
        fmt::format("{}/wia-flight-comm{}-rank{}.yaml", dir, c.comm_index, c.rank);
    const std::string tmp = path + ".tmp";
    FILE* f = std::fopen(tmp.c_str(), "w");
    if (f == nullptr) throw Error(WIA_ERROR_IO, "cannot create " + tmp);
    const bool ok = std::fwrite(text.data(), 1, text.size(), f) == text.size();
    if (std::fclose(f) != 0 || !ok || std::rename(tmp.c_str(), path.c_str()) != 0)
      throw Error(WIA_ERROR_IO, "cannot write " + path);
    return path;
  } catch (const std::exception& e) {
    log::warn("comm", "rank {}: flight recorder dump to {} failed: {}", c.rank, dir, e.what());
    return {};
  }
}

}  // namespace wia::comm
