// SPDX-License-Identifier: Apache-2.0
#include "coll/schedule.hpp"

#include <algorithm>
#include <cstring>
#include <limits>
#include <sstream>
#include <type_traits>
#include <unordered_map>

#include "common/error.hpp"
#include "kernels/cpu_reduce.hpp"

namespace wia::coll {

const char* collective_name(Collective c) noexcept {
  switch (c) {
    case Collective::kAllReduce:
      return "allreduce";
    case Collective::kBroadcast:
      return "broadcast";
    case Collective::kReduce:
      return "reduce";
    case Collective::kAllGather:
      return "allgather";
    case Collective::kReduceScatter:
      return "reduce_scatter";
    case Collective::kAllToAll:
      return "alltoall";
    case Collective::kSendRecv:
      return "sendrecv";
  }
  return "invalid";
}

const char* algorithm_name(Algorithm a) noexcept {
  switch (a) {
    case Algorithm::kAuto:
      return "auto";
    case Algorithm::kRing:
      return "ring";
    case Algorithm::kTree:
      return "tree";
    case Algorithm::kBinomial:
      return "binomial";
    case Algorithm::kRabenseifner:
      return "rabenseifner";
    case Algorithm::kRecursiveDoubling:
      return "recursive_doubling";
    case Algorithm::kRecursiveHalving:
      return "recursive_halving";
    case Algorithm::kBruck:
      return "bruck";
    case Algorithm::kChain:
      return "chain";
    case Algorithm::kScatterAllGather:
      return "scatter_allgather";
    case Algorithm::kDirect:
      return "direct";
    case Algorithm::kPairwise:
      return "pairwise";
    case Algorithm::kHierarchical:
      return "hierarchical";
    case Algorithm::kOneShot:
      return "one_shot";
  }
  return "invalid";
}

bool is_reducing(Collective c) noexcept {
  return c == Collective::kAllReduce || c == Collective::kReduce || c == Collective::kReduceScatter;
}

const char* buffer_kind_name(BufferKind k) noexcept {
  switch (k) {
    case BufferKind::kNone:
      return "none";
    case BufferKind::kUserSend:
      return "send";
    case BufferKind::kUserRecv:
      return "recv";
    case BufferKind::kScratch:
      return "scratch";
    case BufferKind::kSendShard:
      return "send_shard";
    case BufferKind::kRecvShard:
      return "recv_shard";
  }
  return "invalid";
}

const char* step_kind_name(StepKind k) noexcept {
  switch (k) {
    case StepKind::kSend:
      return "send";
    case StepKind::kRecv:
      return "recv";
    case StepKind::kRecvReduce:
      return "recv_reduce";
    case StepKind::kCopy:
      return "copy";
    case StepKind::kReduce:
      return "reduce";
  }
  return "invalid";
}

std::uint64_t BufferSizes::of(BufferKind k) const {
  switch (k) {
    case BufferKind::kUserSend:
      return send;
    case BufferKind::kUserRecv:
      return recv;
    case BufferKind::kScratch:
      return scratch;
    case BufferKind::kSendShard:
      return send_shard;
    case BufferKind::kRecvShard:
      return recv_shard;
    case BufferKind::kNone:
      break;
  }
  return 0;
}

std::size_t Schedule::elem_size() const { return kernels::dtype_size(dtype); }

std::size_t Schedule::total_steps() const {
  std::size_t n = 0;
  for (const auto& p : programs) n += p.steps.size();
  return n;
}

std::string Schedule::describe() const {
  std::ostringstream os;
  os << collective_name(collective) << '/' << algorithm_name(algorithm) << " p=" << nranks
     << " count=" << count << ' ' << kernels::dtype_name(dtype);
  if (is_reducing(collective)) os << ' ' << kernels::reduce_op_name(op);
  if (collective == Collective::kBroadcast || collective == Collective::kReduce)
    os << " root=" << root;
  os << " chunks=" << num_chunks << (in_place ? " in-place" : " out-of-place");
  return os.str();
}

KernelOp kernel_op(wia_reduce_op_t op, const Step& step) {
  if (op == WIA_REDUCE_AVG) {
    // The kernel treats AVG with divisor 0 as "divide by nsrcs", which is
    // wrong for a partial sum: intermediate AVG steps are plain SUMs.
    if (step.divisor > 1) return {WIA_REDUCE_AVG, step.divisor};
    return {WIA_REDUCE_SUM, 0};
  }
  return {op, step.divisor > 1 ? step.divisor : 0};
}

RankGroups::RankGroups(std::vector<std::int32_t> group_of_rank)
    : group_of_rank_(std::move(group_of_rank)) {
  const std::size_t p = group_of_rank_.size();
  if (p == 0) throw Error(WIA_ERROR_INVALID_ARGUMENT, "rank grouping: no ranks given");
  if (p > (std::size_t{1} << 24))
    throw Error(WIA_ERROR_INVALID_ARGUMENT,
                "rank grouping: " + std::to_string(p) + " ranks is more than 16777216");
  // Canonical group index = order of the group's lowest rank (first
  // appearance), which makes everything below a function of the partition.
  std::unordered_map<std::int32_t, std::int32_t> index_of_label;
  std::vector<std::int32_t> sizes;
  index_of_rank_.resize(p);
  local_of_rank_.resize(p);
  for (std::size_t r = 0; r < p; ++r) {
    const std::int32_t label = group_of_rank_[r];
    if (label < 0)
      throw Error(WIA_ERROR_INVALID_ARGUMENT, "rank grouping: rank " + std::to_string(r) +
                                                  " has negative group " + std::to_string(label));
    auto [it, fresh] = index_of_label.try_emplace(label, static_cast<std::int32_t>(sizes.size()));
    if (fresh) sizes.push_back(0);
    index_of_rank_[r] = it->second;
    local_of_rank_[r] = sizes[static_cast<std::size_t>(it->second)]++;
  }
  member_begin_.assign(sizes.size() + 1, 0);
  for (std::size_t g = 0; g < sizes.size(); ++g) {
    member_begin_[g + 1] = member_begin_[g] + sizes[g];
    largest_ = std::max(largest_, sizes[g]);
  }
  members_.resize(p);
  for (std::size_t r = 0; r < p; ++r)
    members_[static_cast<std::size_t>(member_begin_[static_cast<std::size_t>(index_of_rank_[r])] +
                                      local_of_rank_[r])] = static_cast<std::int32_t>(r);
  // splitmix64 finaliser over (nranks, canonical index of every rank).
  auto mix = [](std::uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
  };
  std::uint64_t h = mix(p);
  for (std::int32_t g : index_of_rank_) h = mix(h ^ static_cast<std::uint64_t>(g));
  fingerprint_ = h == 0 ? 1 : h;
}

std::span<const std::int32_t> RankGroups::members(std::int32_t g) const {
  const auto b = static_cast<std::size_t>(member_begin_[static_cast<std::size_t>(g)]);
  const auto e = static_cast<std::size_t>(member_begin_[static_cast<std::size_t>(g) + 1]);
  return std::span<const std::int32_t>(members_).subspan(b, e - b);
}

std::uint64_t rank_groups_fingerprint(const std::shared_ptr<const RankGroups>& groups) noexcept {
  return groups ? groups->fingerprint() : 0;
}

bool is_hierarchical(const RankGroups* groups) noexcept {
  return groups != nullptr && groups->ngroups() >= 2 && groups->largest_group_size() >= 2;
}

BufferSizes user_buffer_sizes(const CollArgs& a, std::int32_t rank) {
  BufferSizes s;
  const std::uint64_t n = a.count;
  const std::uint64_t all = n * static_cast<std::uint64_t>(a.nranks);
  const bool ip = a.options.in_place;
  const bool is_root = rank == a.root;
  switch (a.collective) {
    case Collective::kAllReduce:
    case Collective::kSendRecv:
      s.send = ip ? 0 : n;
      s.recv = n;
      break;
    case Collective::kBroadcast:
      s.send = (!ip && is_root) ? n : 0;
      s.recv = n;
      break;
    case Collective::kReduce:
      s.send = ip ? 0 : n;
      s.recv = (ip || is_root) ? n : 0;
      break;
    case Collective::kAllGather:
      s.send = ip ? 0 : n;
      s.recv = all;
      break;
    case Collective::kReduceScatter:
      s.send = ip ? 0 : all;
      s.recv = ip ? all : n;
      break;
    case Collective::kAllToAll:
      s.send_shard = ip ? 0 : n;
      s.recv_shard = n;
      break;
  }
  return s;
}

namespace {
[[noreturn]] void invalid(const std::string& what) {
  throw Error(WIA_ERROR_INVALID_ARGUMENT, what);
}

// The C enums have no fixed underlying type, so a value outside their range
// (which a C caller can pass) must not be loaded as the enum type: read its
// representation instead.
template <typename E>
std::int64_t raw_value(const E& e) {
  std::underlying_type_t<E> v;
  static_assert(sizeof(v) == sizeof(E));
  std::memcpy(&v, &e, sizeof(v));
  return static_cast<std::int64_t>(v);
}
}  // namespace

void validate_args(const CollArgs& a) {
  const char* coll = collective_name(a.collective);
  if (std::string_view(coll) == "invalid")
    invalid("collective: invalid value " + std::to_string(static_cast<int>(a.collective)));
  // Rank counts beyond 2^24 are not a realistic communicator and would
  // overflow the tag space some builders use.
  if (a.nranks < 1 || a.nranks > (1 << 24))
    invalid(std::string(coll) + ": nranks " + std::to_string(a.nranks) +
            " is out of range [1, 16777216]");
  if ((a.collective == Collective::kBroadcast || a.collective == Collective::kReduce) &&
      (a.root < 0 || a.root >= a.nranks))
    invalid(std::string(coll) + ": root " + std::to_string(a.root) + " is out of range [0, " +
            std::to_string(a.nranks) + ")");
  const std::int64_t dtype = raw_value(a.dtype);
  if (dtype < 0 || dtype >= WIA_DATATYPE_COUNT)
    invalid(std::string(coll) + ": datatype " + std::to_string(dtype) +
            " is not a valid wia_datatype_t");
  const std::size_t es = kernels::dtype_size(a.dtype);
  const std::int64_t op = raw_value(a.op);
  if (is_reducing(a.collective) && (op < 0 || op >= WIA_REDUCE_OP_COUNT))
    invalid(std::string(coll) + ": reduce op " + std::to_string(op) +
            " is not a valid wia_reduce_op_t");
  // Buffers of nranks * count elements must be addressable in bytes.
  const std::uint64_t max_elems =
      std::numeric_limits<std::uint64_t>::max() / es / static_cast<std::uint64_t>(a.nranks);
  if (a.count > max_elems)
    invalid(std::string(coll) + ": count " + std::to_string(a.count) +
            " overflows the byte size of an nranks * count buffer");
  if (a.options.groups && a.options.groups->nranks() != a.nranks)
    invalid(std::string(coll) + ": the rank grouping covers " +
            std::to_string(a.options.groups->nranks()) + " ranks, the communicator has " +
            std::to_string(a.nranks));
  if (a.collective == Collective::kSendRecv && a.options.peer_offset < 0)
    invalid("sendrecv: peer_offset " + std::to_string(a.options.peer_offset) + " must be >= 0");
}

}  // namespace wia::coll
