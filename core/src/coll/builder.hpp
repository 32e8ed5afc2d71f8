// SPDX-License-Identifier: Apache-2.0
// Internal helpers the algorithm files use to emit schedules.
//
// RankBuilder appends steps to one rank's program and derives their
// dependencies from the regions each step reads and writes, so an algorithm
// is written as the obvious sequential program and still gets the maximal
// concurrency that program allows:
//   - a read depends on the last earlier write of any overlapping element;
//   - a write depends on the last earlier write and on every earlier read
//     of an overlapping element since that write (buffer reuse).
// Steps with a zero count are not emitted; the functions then return
// kNoStep, which may be passed as an extra dependency and is ignored.
// Scratch usage is tracked and becomes the declared scratch size.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <map>
#include <memory>
#include <memory_resource>
#include <span>
#include <unordered_map>
#include <vector>

#include "coll/schedule.hpp"

namespace wia::coll {

inline constexpr std::uint32_t kNoStep = 0xffffffffu;
inline constexpr std::int32_t kAllRanks = -1;

// Tracks, for each element range of one buffer, the last writer and the
// readers since. Ranges are split lazily; writes coalesce them again, so the
// map stays proportional to the number of distinct live regions. All nodes
// live in an arena freed with the tracker: building a schedule is mostly
// this bookkeeping, and it must stay cheap for the tuner at p = 1024.
class HazardTracker {
 public:
  HazardTracker();
  // Adds to `deps` the steps an access must wait for.
  void collect(const Region& r, std::uint64_t count, bool write, std::vector<std::uint32_t>& deps);
  // Records the access by `step` (call after collect for every region).
  void record(const Region& r, std::uint64_t count, bool write, std::uint32_t step);

 private:
  // Readers form persistent singly-linked lists in `readers_` (prepend
  // only), so the two halves of a split segment can share their history.
  struct Segment {
    std::uint64_t end;
    std::uint32_t writer;
    std::uint32_t readers;  // head index into readers_, kNoStep = none
  };
  struct ReaderNode {
    std::uint32_t step;
    std::uint32_t next;
  };
  using SegmentMap = std::pmr::map<std::uint64_t, Segment>;
  // A map plus a finger: the segment last recorded. Algorithms walk their
  // blocks in order, so the next access is usually at or next to it, which
  // saves the O(log n) descent.
  struct Track {
    explicit Track(std::pmr::memory_resource* mr) : map(mr) {}
    SegmentMap map;
    SegmentMap::iterator finger = map.end();
    // First segment whose end is > pos.
    SegmentMap::iterator locate(std::uint64_t pos);
  };
  Track* find(const Region& r);
  Track& get(const Region& r);

  std::pmr::monotonic_buffer_resource arena_;
  // User send/recv and scratch, then one track per shard.
  std::unique_ptr<Track> fixed_[3];
  std::pmr::unordered_map<std::uint64_t, std::unique_ptr<Track>> shards_;
  std::vector<ReaderNode> readers_;
};

class RankBuilder {
 public:
  RankBuilder(RankProgram& program, int32_t rank, int32_t nranks)
      : program_(program), rank_(rank), nranks_(nranks) {}

  std::int32_t rank() const { return rank_; }

  std::uint32_t send(std::int32_t peer, std::uint32_t tag, Region src, std::uint64_t count,
                     std::initializer_list<std::uint32_t> after = {});
  std::uint32_t recv(std::int32_t peer, std::uint32_t tag, Region dst, std::uint64_t count,
                     std::initializer_list<std::uint32_t> after = {});
  // dst = local op message; local and dst must be the same region or disjoint.
  std::uint32_t recv_reduce(std::int32_t peer, std::uint32_t tag, Region local, Region dst,
                            std::uint64_t count, std::uint32_t divisor,
                            std::initializer_list<std::uint32_t> after = {});
  std::uint32_t copy(Region src, Region dst, std::uint64_t count,
                     std::initializer_list<std::uint32_t> after = {});
  // dst = dst op src.
  std::uint32_t reduce(Region src, Region dst, std::uint64_t count, std::uint32_t divisor,
                       std::initializer_list<std::uint32_t> after = {});

  std::uint32_t step_count() const { return static_cast<std::uint32_t>(program_.steps.size()); }

  BufferSizes& sizes() { return program_.sizes; }

  // Like the functions above, with an explicit dependency list.
  std::uint32_t emit(Step step, std::span<const std::uint32_t> after);

 private:
  RankProgram& program_;
  std::int32_t rank_;
  std::int32_t nranks_;
  HazardTracker hazards_;
  std::vector<std::uint32_t> dep_scratch_;  // reused per emit
};

// Owns the Schedule under construction and one RankBuilder per wanted rank.
class ScheduleBuilder {
 public:
  // Fills the schedule header from args. `only_rank` = kAllRanks builds
  // every rank, otherwise only that rank's program.
  ScheduleBuilder(const CollArgs& args, Algorithm algorithm, std::int32_t only_rank);

  bool wants(std::int32_t rank) const { return only_rank_ < 0 || only_rank_ == rank; }
  // The builder for `rank` (wants(rank) must be true).
  RankBuilder& rank(std::int32_t rank);

  const CollArgs& args() const { return args_; }
  std::int32_t nranks() const { return args_.nranks; }
  std::uint64_t count() const { return args_.count; }
  bool in_place() const { return args_.options.in_place; }
  // divisor for the step that completes an element: nranks for AVG.
  std::uint32_t final_divisor() const;

  void set_num_chunks(std::uint32_t chunks) { schedule_.num_chunks = chunks; }
  void set_symmetry(Symmetry s) { schedule_.symmetry = s; }

  Schedule finish();

 private:
  CollArgs args_;
  std::int32_t only_rank_;
  Schedule schedule_;
  std::vector<std::unique_ptr<RankBuilder>> ranks_;
};

// Chunk c of block b when `count` elements are split into `parts` blocks
// and every block into `chunks` chunks: sets *offset, returns the length.
inline std::uint64_t block_chunk(std::uint64_t count, std::uint64_t parts, std::uint64_t b,
                                 std::uint64_t chunks, std::uint64_t c, std::uint64_t* offset) {
  const std::uint64_t bs = block_size(count, parts, b);
  *offset = block_offset(count, parts, b) + block_offset(bs, chunks, c);
  return block_size(bs, chunks, c);
}

// Effective number of pipeline chunks for splitting `elems` elements:
// `requested` (>= 1) capped at elems (but at least 1).
inline std::uint32_t effective_chunks(std::uint32_t requested, std::uint64_t elems) {
  if (requested < 1) requested = 1;
  if (elems < requested) return elems == 0 ? 1 : static_cast<std::uint32_t>(elems);
  return requested;
}

inline std::int32_t mod(std::int64_t a, std::int32_t p) {
  const std::int64_t m = a % p;
  return static_cast<std::int32_t>(m < 0 ? m + p : m);
}

// Largest power of two <= p (p >= 1) and its log2.
inline std::int32_t pow2_floor(std::int32_t p) {
  std::int32_t q = 1;
  while (q * 2 <= p) q *= 2;
  return q;
}
inline int log2_exact(std::int32_t q) {
  int l = 0;
  while ((1 << l) < q) ++l;
  return l;
}
inline bool is_pow2(std::int32_t p) { return p > 0 && (p & (p - 1)) == 0; }

}  // namespace wia::coll
