// SPDX-License-Identifier: Apache-2.0
#include "support/sim_executor.hpp"

#include <algorithm>
#include <cstring>
#include <deque>
#include <map>
#include <random>
#include <sstream>
#include <tuple>

#include "kernels/cpu_reduce.hpp"

namespace wia::coll {

const char* sim_error_name(SimError e) noexcept {
  switch (e) {
    case SimError::kNone:
      return "none";
    case SimError::kInvalidSchedule:
      return "invalid schedule";
    case SimError::kOutOfBounds:
      return "buffer overrun";
    case SimError::kUnmatched:
      return "unmatched message";
    case SimError::kRace:
      return "race";
    case SimError::kDeadlock:
      return "deadlock";
    case SimError::kReduceFailed:
      return "reduce failed";
  }
  return "invalid";
}

SimMemory::SimMemory(const Schedule& s) : elem_size_(s.elem_size()) {
  ranks_.resize(static_cast<std::size_t>(s.nranks));
  for (std::int32_t r = 0; r < s.nranks; ++r) {
    const BufferSizes& z = s.programs[static_cast<std::size_t>(r)].sizes;
    RankMemory& m = ranks_[static_cast<std::size_t>(r)];
    m.send.resize(z.send * elem_size_);
    m.recv.resize(z.recv * elem_size_);
    m.scratch.resize(z.scratch * elem_size_);
    m.send_shards.resize(z.send_shard ? static_cast<std::size_t>(s.nranks) : 0);
    for (auto& v : m.send_shards) v.resize(z.send_shard * elem_size_);
    m.recv_shards.resize(z.recv_shard ? static_cast<std::size_t>(s.nranks) : 0);
    for (auto& v : m.recv_shards) v.resize(z.recv_shard * elem_size_);
  }
}

std::span<std::byte> SimMemory::buffer(std::int32_t rank, BufferKind kind, std::uint32_t shard) {
  RankMemory& m = ranks_.at(static_cast<std::size_t>(rank));
  switch (kind) {
    case BufferKind::kUserSend:
      return m.send;
    case BufferKind::kUserRecv:
      return m.recv;
    case BufferKind::kScratch:
      return m.scratch;
    case BufferKind::kSendShard:
      if (shard < m.send_shards.size()) return m.send_shards[shard];
      break;
    case BufferKind::kRecvShard:
      if (shard < m.recv_shards.size()) return m.recv_shards[shard];
      break;
    case BufferKind::kNone:
      break;
  }
  return {};
}

namespace {

std::string region_text(const Region& r) {
  std::string s = buffer_kind_name(r.kind);
  if (r.kind == BufferKind::kSendShard || r.kind == BufferKind::kRecvShard)
    s += "[" + std::to_string(r.shard) + "]";
  return s + "+" + std::to_string(r.offset);
}

bool comm_kind(StepKind k) {
  return k == StepKind::kSend || k == StepKind::kRecv || k == StepKind::kRecvReduce;
}

bool same_buffer(const Region& a, const Region& b) {
  return a.kind == b.kind && a.shard == b.shard;
}

bool overlap(const Region& a, const Region& b, std::uint64_t count) {
  return same_buffer(a, b) && a.offset < b.offset + count && b.offset < a.offset + count;
}

SimResult fail(SimError e, std::string message) {
  SimResult r;
  r.status = WIA_ERROR_INTERNAL;
  r.error = e;
  r.message = std::string(sim_error_name(e)) + ": " + std::move(message);
  return r;
}

struct Access {
  std::uint64_t key;
  std::uint64_t begin, end;
  std::uint32_t step;
  bool write;
};

// Intra-rank race check: every pair of conflicting accesses must be
// ordered by a dependency path.
SimResult check_rank_races(const Schedule& s, std::int32_t rank) {
  const RankProgram& prog = s.programs[static_cast<std::size_t>(rank)];
  const std::size_t n = prog.steps.size();
  const std::size_t words = (n + 63) / 64;
  std::vector<std::uint64_t> anc(n * words, 0);
  for (std::size_t i = 0; i < n; ++i) {
    const Step& st = prog.steps[i];
    std::uint64_t* mine = &anc[i * words];
    for (std::uint32_t d = 0; d < st.dep_count; ++d) {
      const std::uint32_t dep = prog.deps_of(st)[d];
      const std::uint64_t* theirs = &anc[dep * words];
      for (std::size_t w = 0; w < words; ++w) mine[w] |= theirs[w];
      mine[dep / 64] |= std::uint64_t{1} << (dep % 64);
    }
  }
  std::vector<Access> acc;
  for (std::uint32_t i = 0; i < n; ++i) {
    const Step& st = prog.steps[i];
    auto key = [](const Region& r) { return (static_cast<std::uint64_t>(r.kind) << 32) | r.shard; };
    if (st.reads_src())
      acc.push_back({key(st.src), st.src.offset, st.src.offset + st.count, i, false});
    if (st.writes_dst())
      acc.push_back({key(st.dst), st.dst.offset, st.dst.offset + st.count, i, true});
  }
  std::sort(acc.begin(), acc.end(), [](const Access& a, const Access& b) {
    return std::tie(a.key, a.begin) < std::tie(b.key, b.begin);
  });
  for (std::size_t a = 0; a < acc.size(); ++a) {
    for (std::size_t b = a + 1;
         b < acc.size() && acc[b].key == acc[a].key && acc[b].begin < acc[a].end; ++b) {
      if (!acc[a].write && !acc[b].write) continue;
      std::uint32_t i = acc[a].step, j = acc[b].step;
      if (i == j) continue;
      if (i > j) std::swap(i, j);
      if (anc[j * words + i / 64] & (std::uint64_t{1} << (i % 64))) continue;
      return fail(SimError::kRace, describe_step(s, rank, i) + " and " + describe_step(s, rank, j) +
                                       " touch overlapping elements without a dependency");
    }
  }
  return {};
}

// Static matching: for every (src, dst, tag), the sends of src and the
// receives of dst, each in list order.
struct MatchKey {
  std::int32_t src, dst;
  std::uint32_t tag;
  bool operator<(const MatchKey& o) const {
    return std::tie(src, dst, tag) < std::tie(o.src, o.dst, o.tag);
  }
};

}  // namespace

std::string describe_step(const Schedule& s, std::int32_t rank, std::uint32_t index) {
  const Step& st = s.programs[static_cast<std::size_t>(rank)].steps[index];
  std::ostringstream os;
  os << "rank " << rank << " step " << index << ' ' << step_kind_name(st.kind);
  if (comm_kind(st.kind)) os << " peer=" << st.peer << " tag=" << st.tag;
  os << " count=" << st.count;
  if (st.reads_src()) os << " src=" << region_text(st.src);
  if (st.writes_dst()) os << " dst=" << region_text(st.dst);
  if (st.divisor > 1) os << " divisor=" << st.divisor;
  return os.str();
}

SimResult validate_schedule(const Schedule& s, bool check_races) {
  if (s.nranks < 1 || s.programs.size() != static_cast<std::size_t>(s.nranks))
    return fail(SimError::kInvalidSchedule, "schedule has " + std::to_string(s.programs.size()) +
                                                " programs for nranks " + std::to_string(s.nranks));
  if (s.elem_size() == 0)
    return fail(SimError::kInvalidSchedule, "invalid datatype " + std::to_string(s.dtype));
  std::map<MatchKey, std::pair<std::vector<std::uint32_t>, std::vector<std::uint32_t>>> matches;
  for (std::int32_t r = 0; r < s.nranks; ++r) {
    const RankProgram& prog = s.programs[static_cast<std::size_t>(r)];
    if (!prog.built)
      return fail(SimError::kInvalidSchedule,
                  "rank " + std::to_string(r) + " was not built (single-rank schedule)");
    for (std::uint32_t i = 0; i < prog.steps.size(); ++i) {
      const Step& st = prog.steps[i];
      auto bad = [&](SimError e, const std::string& why) {
        return fail(e, describe_step(s, r, i) + ": " + why);
      };
      if (st.kind > StepKind::kReduce) return bad(SimError::kInvalidSchedule, "unknown step kind");
      if (st.count == 0) return bad(SimError::kInvalidSchedule, "zero count");
      if (comm_kind(st.kind) && (st.peer < 0 || st.peer >= s.nranks || st.peer == r))
        return bad(SimError::kInvalidSchedule, "peer out of range or self");
      if (static_cast<std::uint64_t>(st.dep_begin) + st.dep_count > prog.deps.size())
        return bad(SimError::kInvalidSchedule, "dependency list out of range");
      for (std::uint32_t d = 0; d < st.dep_count; ++d)
        if (prog.deps_of(st)[d] >= i)
          return bad(
              SimError::kInvalidSchedule,
              "depends on step " + std::to_string(prog.deps_of(st)[d]) + " which is not earlier");
      auto in_bounds = [&](const Region& reg) -> std::string {
        if (reg.kind == BufferKind::kNone || reg.kind > BufferKind::kRecvShard)
          return "region " + region_text(reg) + " names no buffer";
        if ((reg.kind == BufferKind::kSendShard || reg.kind == BufferKind::kRecvShard) &&
            reg.shard >= static_cast<std::uint32_t>(s.nranks))
          return "shard " + std::to_string(reg.shard) + " out of range";
        const std::uint64_t size = prog.sizes.of(reg.kind);
        if (reg.offset > size || st.count > size - reg.offset)
          return "region " + region_text(reg) + " + " + std::to_string(st.count) +
                 " elements overruns " + buffer_kind_name(reg.kind) + " of " +
                 std::to_string(size) + " elements";
        return {};
      };
      if (st.reads_src()) {
        std::string why = in_bounds(st.src);
        if (!why.empty()) return bad(SimError::kOutOfBounds, why);
      }
      if (st.writes_dst()) {
        std::string why = in_bounds(st.dst);
        if (!why.empty()) return bad(SimError::kOutOfBounds, why);
      }
      if (st.kind == StepKind::kRecvReduce && overlap(st.src, st.dst, st.count) &&
          st.src.offset != st.dst.offset)
        return bad(SimError::kInvalidSchedule, "local operand partially overlaps the output");
      if ((st.kind == StepKind::kCopy || st.kind == StepKind::kReduce) &&
          overlap(st.src, st.dst, st.count))
        return bad(SimError::kInvalidSchedule, "source overlaps destination");
      if (st.is_send()) matches[{r, st.peer, st.tag}].first.push_back(i);
      if (st.is_recv()) matches[{st.peer, r, st.tag}].second.push_back(i);
    }
  }
  for (const auto& [key, lists] : matches) {
    const auto& [sends, recvs] = lists;
    const std::size_t common = std::min(sends.size(), recvs.size());
    for (std::size_t n = 0; n < common; ++n) {
      const Step& a = s.programs[static_cast<std::size_t>(key.src)].steps[sends[n]];
      const Step& b = s.programs[static_cast<std::size_t>(key.dst)].steps[recvs[n]];
      if (a.count != b.count)
        return fail(SimError::kUnmatched, describe_step(s, key.src, sends[n]) + " sends " +
                                              std::to_string(a.count) + " elements but " +
                                              describe_step(s, key.dst, recvs[n]) + " expects " +
                                              std::to_string(b.count));
    }
    if (sends.size() > common)
      return fail(SimError::kUnmatched, describe_step(s, key.src, sends[common]) +
                                            " has no matching receive on rank " +
                                            std::to_string(key.dst));
    if (recvs.size() > common)
      return fail(SimError::kUnmatched, describe_step(s, key.dst, recvs[common]) +
                                            " has no matching send on rank " +
                                            std::to_string(key.src));
  }
  if (check_races) {
    for (std::int32_t r = 0; r < s.nranks; ++r) {
      SimResult res = check_rank_races(s, r);
      if (!res.ok()) return res;
    }
  }
  return {};
}

namespace {

class Simulator {
 public:
  Simulator(const Schedule& s, SimMemory& mem, const SimOptions& opt)
      : s_(s), mem_(mem), opt_(opt), rng_(opt.seed) {}

  SimResult run();

 private:
  struct Ref {
    std::int32_t rank;
    std::uint32_t index;
  };
  std::size_t gid(std::int32_t r, std::uint32_t i) const {
    return base_[static_cast<std::size_t>(r)] + i;
  }
  const Step& step(std::size_t g) const { return s_.programs[ref_[g].rank].steps[ref_[g].index]; }
  std::byte* ptr(std::int32_t rank, const Region& reg) {
    return mem_.buffer(rank, reg.kind, reg.shard).data() + reg.offset * mem_.elem_size();
  }
  void make_ready(std::size_t g) { ready_.push_back(g); }
  void complete(std::size_t g);
  void deps_done(std::size_t g);
  SimResult execute(std::size_t g);
  SimResult deadlock_report();

  const Schedule& s_;
  SimMemory& mem_;
  SimOptions opt_;
  std::mt19937_64 rng_;
  std::vector<std::size_t> base_;
  std::vector<Ref> ref_;
  std::vector<std::uint32_t> pending_deps_;
  std::vector<std::vector<std::size_t>> dependents_;
  std::vector<std::size_t> partner_;  // send <-> recv global ids
  std::vector<std::uint8_t> deps_satisfied_;
  std::vector<std::uint8_t> posted_;   // rendezvous: send waiting for its recv
  std::vector<std::uint8_t> arrived_;  // eager: message for this recv buffered
  std::vector<std::uint8_t> done_;
  std::vector<std::vector<std::byte>> payload_;  // eager messages by recv id
  std::deque<std::size_t> ready_;
  SimResult result_;
};

void Simulator::complete(std::size_t g) {
  done_[g] = 1;
  ++result_.steps_executed;
  for (std::size_t d : dependents_[g])
    if (--pending_deps_[d] == 0) deps_done(d);
}

void Simulator::deps_done(std::size_t g) {
  deps_satisfied_[g] = 1;
  const Step& st = step(g);
  if (st.is_recv()) {
    // Eager: runnable once the message is buffered. Rendezvous: once the
    // matching send is posted.
    if ((opt_.rendezvous && posted_[partner_[g]]) || (!opt_.rendezvous && arrived_[g]))
      make_ready(g);
  } else if (st.is_send() && opt_.rendezvous) {
    posted_[g] = 1;
    const std::size_t rv = partner_[g];
    if (deps_satisfied_[rv]) make_ready(rv);
  } else {
    make_ready(g);
  }
}

SimResult Simulator::execute(std::size_t g) {
  const Step& st = step(g);
  const std::int32_t rank = ref_[g].rank;
  const std::size_t bytes = st.count * mem_.elem_size();
  switch (st.kind) {
    case StepKind::kSend: {
      // Only eager sends get here: snapshot the data now.
      const std::size_t rv = partner_[g];
      payload_[rv].assign(ptr(rank, st.src), ptr(rank, st.src) + bytes);
      arrived_[rv] = 1;
      complete(g);
      if (deps_satisfied_[rv]) make_ready(rv);
      return {};
    }
    case StepKind::kCopy:
      std::memcpy(ptr(rank, st.dst), ptr(rank, st.src), bytes);
      complete(g);
      return {};
    default:
      break;
  }
  // Reductions and receives.
  const std::byte* incoming = nullptr;
  std::size_t send_gid = 0;
  if (st.is_recv()) {
    send_gid = partner_[g];
    if (opt_.rendezvous) {
      incoming = ptr(ref_[send_gid].rank, step(send_gid).src);
    } else {
      incoming = payload_[g].data();
    }
    ++result_.messages;
    result_.bytes_moved += bytes;
  } else {  // kReduce: dst = dst op src
    incoming = ptr(rank, st.src);
  }
  if (st.kind == StepKind::kRecv) {
    std::memcpy(ptr(rank, st.dst), incoming, bytes);
  } else {
    const KernelOp kop = kernel_op(s_.op, st);
    const void* srcs[2] = {st.kind == StepKind::kReduce ? ptr(rank, st.dst) : ptr(rank, st.src),
                           incoming};
    wia_reduce_args_v1_t args{};
    args.struct_size = sizeof(args);
    args.dtype = s_.dtype;
    args.op = kop.op;
    args.nsrcs = 2;
    args.count = st.count;
    args.divisor = kop.divisor;
    args.dst = ptr(rank, st.dst);
    args.srcs = srcs;
    const wia_status_t rc = kernels::reduce(args);
    if (rc != WIA_SUCCESS)
      return fail(SimError::kReduceFailed, describe_step(s_, rank, ref_[g].index) +
                                               ": kernel returned " + std::to_string(rc));
  }
  if (st.is_recv()) {
    if (!opt_.rendezvous) {
      payload_[g].clear();
      payload_[g].shrink_to_fit();
    }
  }
  complete(g);
  if (st.is_recv() && opt_.rendezvous) complete(send_gid);
  return {};
}

SimResult Simulator::deadlock_report() {
  std::ostringstream os;
  std::size_t remaining = 0;
  for (std::size_t g = 0; g < done_.size(); ++g) remaining += done_[g] ? 0 : 1;
  os << remaining << " steps can never run; first blocked steps:";
  int shown = 0;
  for (std::size_t g = 0; g < done_.size() && shown < 8; ++g) {
    if (done_[g]) continue;
    const Step& st = step(g);
    std::string why;
    if (!deps_satisfied_[g]) {
      why = "waits for dependencies";
    } else if (st.is_recv()) {
      why = "waits for the message from rank " + std::to_string(st.peer);
    } else if (st.is_send()) {
      why = "waits for rank " + std::to_string(st.peer) + " to receive";
    } else {
      continue;
    }
    os << "\n  " << describe_step(s_, ref_[g].rank, ref_[g].index) << ": " << why;
    ++shown;
  }
  return fail(SimError::kDeadlock, os.str());
}

SimResult Simulator::run() {
  const std::size_t p = static_cast<std::size_t>(s_.nranks);
  base_.resize(p + 1, 0);
  for (std::size_t r = 0; r < p; ++r) base_[r + 1] = base_[r] + s_.programs[r].steps.size();
  const std::size_t total = base_[p];
  ref_.resize(total);
  pending_deps_.assign(total, 0);
  dependents_.assign(total, {});
  partner_.assign(total, 0);
  deps_satisfied_.assign(total, 0);
  posted_.assign(total, 0);
  arrived_.assign(total, 0);
  done_.assign(total, 0);
  payload_.assign(total, {});

  std::map<MatchKey, std::pair<std::vector<std::size_t>, std::vector<std::size_t>>> matches;
  for (std::int32_t r = 0; r < s_.nranks; ++r) {
    const RankProgram& prog = s_.programs[static_cast<std::size_t>(r)];
    for (std::uint32_t i = 0; i < prog.steps.size(); ++i) {
      const std::size_t g = gid(r, i);
      ref_[g] = {r, i};
      const Step& st = prog.steps[i];
      pending_deps_[g] = st.dep_count;
      for (std::uint32_t d = 0; d < st.dep_count; ++d)
        dependents_[gid(r, prog.deps_of(st)[d])].push_back(g);
      if (st.is_send()) matches[{r, st.peer, st.tag}].first.push_back(g);
      if (st.is_recv()) matches[{st.peer, r, st.tag}].second.push_back(g);
    }
  }
  for (const auto& [key, lists] : matches) {
    for (std::size_t n = 0; n < lists.first.size(); ++n) {
      partner_[lists.first[n]] = lists.second[n];
      partner_[lists.second[n]] = lists.first[n];
    }
  }
  for (std::size_t g = 0; g < total; ++g)
    if (pending_deps_[g] == 0) deps_done(g);

  while (!ready_.empty()) {
    std::size_t g;
    if (opt_.seed == 0) {
      g = ready_.front();
      ready_.pop_front();
    } else {
      const std::size_t pick =
          std::uniform_int_distribution<std::size_t>(0, ready_.size() - 1)(rng_);
      g = ready_[pick];
      ready_[pick] = ready_.back();
      ready_.pop_back();
    }
    SimResult r = execute(g);
    if (!r.ok()) return r;
  }
  if (result_.steps_executed != total) return deadlock_report();
  return result_;
}

}  // namespace

SimResult simulate(const Schedule& s, SimMemory& memory, const SimOptions& options) {
  SimResult v = validate_schedule(s, options.check_races);
  if (!v.ok()) return v;
  if (memory.nranks() != s.nranks || memory.elem_size() != s.elem_size())
    return fail(SimError::kInvalidSchedule, "memory was allocated for another schedule");
  Simulator sim(s, memory, options);
  return sim.run();
}

}  // namespace wia::coll
