// SPDX-License-Identifier: Apache-2.0
#include "coll/builder.hpp"

#include <algorithm>
#include <string>

#include "common/error.hpp"

namespace wia::coll {

namespace {
std::uint64_t buffer_key(const Region& r) {
  return (static_cast<std::uint64_t>(r.kind) << 32) | r.shard;
}

[[noreturn]] void builder_bug(std::int32_t rank, const std::string& what) {
  throw Error(WIA_ERROR_INTERNAL,
              "schedule builder bug on rank " + std::to_string(rank) + ": " + what);
}
}  // namespace

HazardTracker::HazardTracker() : shards_(&arena_) {}

HazardTracker::SegmentMap::iterator HazardTracker::Track::locate(std::uint64_t pos) {
  if (finger != map.end()) {
    if (finger->first <= pos) {
      if (finger->second.end > pos) return finger;
      auto next = std::next(finger);
      if (next == map.end() || next->first > pos || next->second.end > pos) return next;
    } else if (finger == map.begin() || std::prev(finger)->second.end <= pos) {
      return finger;
    } else if (std::prev(finger)->first <= pos) {
      return std::prev(finger);
    }
  }
  auto it = map.upper_bound(pos);
  if (it != map.begin() && std::prev(it)->second.end > pos) --it;
  return it;
}

HazardTracker::Track* HazardTracker::find(const Region& r) {
  switch (r.kind) {
    case BufferKind::kUserSend:
      return fixed_[0].get();
    case BufferKind::kUserRecv:
      return fixed_[1].get();
    case BufferKind::kScratch:
      return fixed_[2].get();
    default:
      break;
  }
  auto it = shards_.find(buffer_key(r));
  return it == shards_.end() ? nullptr : it->second.get();
}

HazardTracker::Track& HazardTracker::get(const Region& r) {
  int slot = -1;
  switch (r.kind) {
    case BufferKind::kUserSend:
      slot = 0;
      break;
    case BufferKind::kUserRecv:
      slot = 1;
      break;
    case BufferKind::kScratch:
      slot = 2;
      break;
    default:
      break;
  }
  std::unique_ptr<Track>& t = slot >= 0 ? fixed_[slot] : shards_[buffer_key(r)];
  if (!t) t = std::make_unique<Track>(&arena_);
  return *t;
}

void HazardTracker::collect(const Region& r, std::uint64_t count, bool write,
                            std::vector<std::uint32_t>& deps) {
  Track* t = find(r);
  if (t == nullptr) return;
  const std::uint64_t end = r.offset + count;
  for (auto it = t->locate(r.offset); it != t->map.end() && it->first < end; ++it) {
    const Segment& seg = it->second;
    if (seg.writer != kNoStep) deps.push_back(seg.writer);
    if (write)
      for (std::uint32_t n = seg.readers; n != kNoStep; n = readers_[n].next)
        deps.push_back(readers_[n].step);
  }
}

void HazardTracker::record(const Region& r, std::uint64_t count, bool write, std::uint32_t step) {
  Track& t = get(r);
  SegmentMap& m = t.map;
  const std::uint64_t begin = r.offset;
  const std::uint64_t end = r.offset + count;
  // First segment that ends after `begin`; split it if it starts before.
  auto it = t.locate(begin);
  if (it != m.end() && it->first < begin) {
    const Segment tail = it->second;
    it->second.end = begin;
    it = m.emplace_hint(std::next(it), begin, tail);
  }
  if (write) {
    // The write supersedes every earlier access of the range: one segment.
    // A segment straddling `end` keeps its part beyond it.
    while (it != m.end() && it->first < end) {
      if (it->second.end > end) {
        const Segment tail = it->second;
        it = m.erase(it);
        it = m.emplace_hint(it, end, tail);
        break;
      }
      it = m.erase(it);
    }
    t.finger = m.emplace_hint(it, begin, Segment{end, step, kNoStep});
    return;
  }
  // Read: append the reader to every covered segment, filling holes.
  std::uint64_t pos = begin;
  while (pos < end) {
    if (it == m.end() || it->first > pos) {
      const std::uint64_t hole_end = it == m.end() ? end : std::min(end, it->first);
      it = m.emplace_hint(it, pos, Segment{hole_end, kNoStep, kNoStep});
    } else if (it->second.end > end) {
      const Segment tail = it->second;
      it->second.end = end;
      m.emplace_hint(std::next(it), end, tail);
    }
    readers_.push_back({step, it->second.readers});
    it->second.readers = static_cast<std::uint32_t>(readers_.size() - 1);
    pos = it->second.end;
    t.finger = it;
    ++it;
  }
}

std::uint32_t RankBuilder::emit(Step step, std::span<const std::uint32_t> after) {
  if (step.count == 0) return kNoStep;
  const bool comm = step.kind == StepKind::kSend || step.kind == StepKind::kRecv ||
                    step.kind == StepKind::kRecvReduce;
  if (comm && (step.peer < 0 || step.peer >= nranks_ || step.peer == rank_))
    builder_bug(rank_, std::string(step_kind_name(step.kind)) + " to invalid peer " +
                           std::to_string(step.peer));
  if (!comm) step.peer = -1;

  const std::uint32_t index = static_cast<std::uint32_t>(program_.steps.size());
  dep_scratch_.clear();
  if (step.reads_src()) hazards_.collect(step.src, step.count, false, dep_scratch_);
  if (step.writes_dst()) hazards_.collect(step.dst, step.count, true, dep_scratch_);
  for (std::uint32_t d : after)
    if (d != kNoStep) dep_scratch_.push_back(d);
  std::sort(dep_scratch_.begin(), dep_scratch_.end());
  dep_scratch_.erase(std::unique(dep_scratch_.begin(), dep_scratch_.end()), dep_scratch_.end());

  // Record after collecting, so a step reading and writing one region (an
  // in-place recv_reduce) does not depend on itself.
  if (step.reads_src()) hazards_.record(step.src, step.count, false, index);
  if (step.writes_dst()) hazards_.record(step.dst, step.count, true, index);

  auto track_scratch = [this, &step](const Region& r) {
    if (r.kind == BufferKind::kScratch)
      program_.sizes.scratch = std::max(program_.sizes.scratch, r.offset + step.count);
  };
  if (step.reads_src()) track_scratch(step.src);
  if (step.writes_dst()) track_scratch(step.dst);

  step.dep_begin = static_cast<std::uint32_t>(program_.deps.size());
  step.dep_count = static_cast<std::uint32_t>(dep_scratch_.size());
  program_.deps.insert(program_.deps.end(), dep_scratch_.begin(), dep_scratch_.end());
  program_.steps.push_back(step);
  return index;
}

std::uint32_t RankBuilder::send(std::int32_t peer, std::uint32_t tag, Region src,
                                std::uint64_t count, std::initializer_list<std::uint32_t> after) {
  Step s;
  s.kind = StepKind::kSend;
  s.peer = peer;
  s.tag = tag;
  s.count = count;
  s.src = src;
  return emit(s, after);
}

std::uint32_t RankBuilder::recv(std::int32_t peer, std::uint32_t tag, Region dst,
                                std::uint64_t count, std::initializer_list<std::uint32_t> after) {
  Step s;
  s.kind = StepKind::kRecv;
  s.peer = peer;
  s.tag = tag;
  s.count = count;
  s.dst = dst;
  return emit(s, after);
}

std::uint32_t RankBuilder::recv_reduce(std::int32_t peer, std::uint32_t tag, Region local,
                                       Region dst, std::uint64_t count, std::uint32_t divisor,
                                       std::initializer_list<std::uint32_t> after) {
  Step s;
  s.kind = StepKind::kRecvReduce;
  s.peer = peer;
  s.tag = tag;
  s.count = count;
  s.src = local;
  s.dst = dst;
  s.divisor = divisor;
  return emit(s, after);
}

std::uint32_t RankBuilder::copy(Region src, Region dst, std::uint64_t count,
                                std::initializer_list<std::uint32_t> after) {
  Step s;
  s.kind = StepKind::kCopy;
  s.count = count;
  s.src = src;
  s.dst = dst;
  return emit(s, after);
}

std::uint32_t RankBuilder::reduce(Region src, Region dst, std::uint64_t count,
                                  std::uint32_t divisor,
                                  std::initializer_list<std::uint32_t> after) {
  Step s;
  s.kind = StepKind::kReduce;
  s.count = count;
  s.src = src;
  s.dst = dst;
  s.divisor = divisor;
  return emit(s, after);
}

ScheduleBuilder::ScheduleBuilder(const CollArgs& args, Algorithm algorithm, std::int32_t only_rank)
    : args_(args), only_rank_(only_rank) {
  schedule_.collective = args.collective;
  schedule_.algorithm = algorithm;
  schedule_.op = args.op;
  schedule_.dtype = args.dtype;
  schedule_.count = args.count;
  schedule_.nranks = args.nranks;
  schedule_.root = args.root;
  schedule_.in_place = args.options.in_place;
  schedule_.programs.resize(static_cast<std::size_t>(args.nranks));
  ranks_.resize(static_cast<std::size_t>(args.nranks));
}

RankBuilder& ScheduleBuilder::rank(std::int32_t r) {
  if (!wants(r)) builder_bug(r, "rank was not requested");
  auto& slot = ranks_[static_cast<std::size_t>(r)];
  if (!slot) {
    schedule_.programs[static_cast<std::size_t>(r)].built = true;
    slot = std::make_unique<RankBuilder>(schedule_.programs[static_cast<std::size_t>(r)], r,
                                         args_.nranks);
  }
  return *slot;
}

std::uint32_t ScheduleBuilder::final_divisor() const {
  return args_.op == WIA_REDUCE_AVG ? static_cast<std::uint32_t>(args_.nranks) : 0;
}

Schedule ScheduleBuilder::finish() {
  // Ranks the algorithm never touched still get their declared sizes.
  for (std::int32_t r = 0; r < args_.nranks; ++r) {
    if (!wants(r)) continue;
    BufferSizes& sizes = rank(r).sizes();
    const std::uint64_t scratch = sizes.scratch;
    sizes = user_buffer_sizes(args_, r);
    sizes.scratch = scratch;
  }
  ranks_.clear();
  return std::move(schedule_);
}

}  // namespace wia::coll
