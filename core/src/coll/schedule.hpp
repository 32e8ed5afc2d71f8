// SPDX-License-Identifier: Apache-2.0
// Collective schedules: the data an algorithm produces and that the engine,
// the simulated-network executor and the cost model all consume.
//
// ## Model
//
// An algorithm is a pure function (collective, op, count, dtype, nranks,
// root, options) -> Schedule. A Schedule holds, for every rank, a
// RankProgram: an ordered list of Steps plus explicit intra-rank
// dependencies. Nothing in a schedule is per element: a step names
// (buffer, element offset) regions and one element count, so a schedule is
// O(messages), independent of the payload size.
//
// ## Buffers
//
// Steps address symbolic buffers of one rank (Region = kind, shard, offset):
//   kUserSend    the caller's input ("sendbuff").
//   kUserRecv    the caller's output ("recvbuff").
//   kScratch     engine-allocated temporary memory of
//                RankProgram::sizes.scratch elements (scratch_bytes()).
//   kSendShard   all-to-all only: input shard `shard` (the spec passes an
//                array of per-peer pointers; a contiguous NCCL-style buffer
//                maps shard j to base + j * count * elem_size).
//   kRecvShard   all-to-all only: output shard `shard`.
// Offsets and counts are in elements of the schedule's dtype. Every buffer
// has a declared per-rank size (RankProgram::sizes); a step that addresses
// outside it is a schedule bug that the simulator reports.
//
// ## In place
//
// In-place means the input and the output share one user allocation. An
// in-place schedule never names kUserSend (or kSendShard): it addresses only
// kUserRecv (kRecvShard), laid out as below, and only writes the output
// part of it. Layouts follow NCCL:
//   all-reduce      input and output are recv[0, count).
//   broadcast       the root's data is in recv[0, count) (send == recv).
//   reduce          every rank's input is recv[0, count); only the root's
//                   recv is overwritten (non-roots' buffers stay intact).
//   all-gather      recv has nranks*count; rank r's input is already at
//                   recv[r*count, count) (NCCL: sendbuff == recvbuff +
//                   rank*count).
//   reduce-scatter  kUserRecv names the whole nranks*count input buffer
//                   (NCCL's sendbuff; its recvbuff == sendbuff +
//                   rank*count); rank r's result is written to
//                   recv[r*count, count), the rest is left unchanged.
//   all-to-all      the recv shards hold the input and receive the output.
//   send-recv       recv[0, count) is sent and then overwritten.
//
// ## Steps
//
//   kSend        send `count` elements at src to `peer` with `tag`.
//   kRecv        receive `count` elements from (`peer`, `tag`) into dst.
//   kRecvReduce  receive from (`peer`, `tag`) and write dst = src op msg
//                (NCCL's recvReduceCopy: the local operand `src` and the
//                output `dst` are either the same region, or disjoint, so an
//                engine can reduce straight out of its receive staging in
//                one pass, never landing the message in user memory first).
//   kCopy        local copy src -> dst (disjoint regions).
//   kReduce      local dst = dst op src (disjoint regions).
// Reducing steps combine with the schedule's op, except that AVG is SUM at
// every step and the step whose `divisor` is > 1 divides its result by the
// divisor afterwards. Builders set divisor = nranks on exactly one step per
// output element (the one that produces the final sum), so AVG divides once
// and integer AVG truncates once. kernel_op() gives the (op, divisor) pair
// to hand to wia_reduce_args_v1_t.
//
// The "fused" primitives NCCL has beyond these (recvReduceSend,
// recvCopySend, ...) are patterns, not step kinds: a kRecvReduce into a
// scratch region whose only reader is the following kSend is
// recvReduceSend; an engine may fuse such pairs. Keeping the vocabulary to
// five kinds keeps the simulator, the cost model and the engine simple.
//
// ## Dependencies and execution
//
// Each step lists earlier steps of the same rank it depends on (deps point
// backwards, so list order is always a valid topological order). A step may
// start once all its dependencies have completed and, for a receive, the
// matching message is available. A send "completes" when its source region
// may be overwritten. Builders derive dependencies from the regions each
// step reads and writes (read-after-write, write-after-write and
// write-after-read on overlapping elements), so executing the steps of a
// rank in any order that respects the dependencies is equivalent to
// executing them in list order. A few algorithms add ordering-only
// dependencies (pairwise all-to-all serialises its rounds on purpose).
//
// Schedules never need a send to be buffered by the transport to make
// progress: they are deadlock-free when every send completes only once the
// receiver takes the data (rendezvous), which the simulator checks.
//
// ## Message matching
//
// The n-th send (in list order) from rank a to rank b with tag t matches the
// n-th receive (in list order) on b from a with tag t. Builders make every
// (src, dst, tag) unique within a schedule, so an engine can map the tag
// straight onto a transport tag and post in any dependency-respecting order.
//
// ## Partitions
//
// When an algorithm splits `count` elements into `parts` blocks, the first
// count % parts blocks get one more element (block_offset/block_size), so
// counts that nranks does not divide, primes, 0 and 1 all work; steps whose
// count would be zero are simply not emitted (by both ends).
#pragma once

#include <wia/status.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace wia::coll {

enum class Collective : std::uint8_t {
  kAllReduce = 0,
  kBroadcast,
  kReduce,
  kAllGather,
  kReduceScatter,
  kAllToAll,
  kSendRecv,
};
inline constexpr int kCollectiveCount = 7;

// Algorithm identifiers. One enum for every collective: an id means the same
// idea wherever it applies ("ring" all-gather is the second half of "ring"
// all-reduce). The registry says which (collective, algorithm) pairs exist.
enum class Algorithm : std::uint8_t {
  kAuto = 0,           // let the tuner choose
  kRing,               // all-reduce, all-gather, reduce-scatter
  kTree,               // all-reduce: pipelined binary tree
  kBinomial,           // all-reduce, broadcast, reduce: binomial tree
  kRabenseifner,       // all-reduce: recursive halving + doubling
  kRecursiveDoubling,  // all-reduce, all-gather
  kRecursiveHalving,   // reduce-scatter
  kBruck,              // all-gather, any nranks
  kChain,              // broadcast, reduce: pipelined chain
  kScatterAllGather,   // broadcast: binomial scatter + ring all-gather
  kDirect,             // all-reduce, all-to-all, send-recv: all peers at once
  kPairwise,           // all-to-all: one exchange per round
  kHierarchical,       // all-reduce: reduce in each group, leaders all-reduce, broadcast
  kOneShot,            // all-reduce: every rank sends its vector to all, one round
};
inline constexpr int kAlgorithmCount = 14;

const char* collective_name(Collective c) noexcept;  // "allreduce", ...
const char* algorithm_name(Algorithm a) noexcept;    // "ring", ...
// Whether the collective combines values with a reduce op.
bool is_reducing(Collective c) noexcept;

enum class BufferKind : std::uint8_t {
  kNone = 0,
  kUserSend,
  kUserRecv,
  kScratch,
  kSendShard,
  kRecvShard,
};
const char* buffer_kind_name(BufferKind k) noexcept;

struct Region {
  BufferKind kind = BufferKind::kNone;
  std::uint32_t shard = 0;   // peer index for k*Shard, 0 otherwise
  std::uint64_t offset = 0;  // elements
};

inline Region send_buf(std::uint64_t offset) { return {BufferKind::kUserSend, 0, offset}; }
inline Region recv_buf(std::uint64_t offset) { return {BufferKind::kUserRecv, 0, offset}; }
inline Region scratch_buf(std::uint64_t offset) { return {BufferKind::kScratch, 0, offset}; }
inline Region send_shard(std::uint32_t shard, std::uint64_t offset) {
  return {BufferKind::kSendShard, shard, offset};
}
inline Region recv_shard(std::uint32_t shard, std::uint64_t offset) {
  return {BufferKind::kRecvShard, shard, offset};
}
inline Region offset_by(Region r, std::uint64_t delta) {
  r.offset += delta;
  return r;
}

enum class StepKind : std::uint8_t { kSend = 0, kRecv, kRecvReduce, kCopy, kReduce };
const char* step_kind_name(StepKind k) noexcept;

// 64 bytes. `src`/`dst` use is described per kind in the file comment.
struct Step {
  StepKind kind = StepKind::kSend;
  std::int32_t peer = -1;       // kSend/kRecv/kRecvReduce, else -1
  std::uint32_t tag = 0;        // kSend/kRecv/kRecvReduce
  std::uint32_t divisor = 0;    // kRecvReduce/kReduce: > 1 divides the result
  std::uint64_t count = 0;      // elements, > 0
  Region src;                   // read
  Region dst;                   // written (kReduce: read and written)
  std::uint32_t dep_begin = 0;  // into RankProgram::deps
  std::uint32_t dep_count = 0;

  bool is_send() const { return kind == StepKind::kSend; }
  bool is_recv() const { return kind == StepKind::kRecv || kind == StepKind::kRecvReduce; }
  bool reads_src() const { return kind != StepKind::kRecv; }
  bool writes_dst() const { return kind != StepKind::kSend; }
};

inline bool same_region(const Region& a, const Region& b) {
  return a.kind == b.kind && a.shard == b.shard && a.offset == b.offset;
}

// Whether step `next` may join a chain of receive-reduces that began at
// `first` and so far ends at `last`: another receive-reduce of the same
// count into the same region, reading that region as its local operand,
// after a step that does not divide (only a chain's last step may). The
// engines fuse such a chain, once all its messages are there, into one
// n-ary reduction, and the tuner costs it as one pass: one rule for both.
inline bool extends_chain(const Step& first, const Step& last, const Step& next) {
  return first.kind == StepKind::kRecvReduce && last.kind == StepKind::kRecvReduce &&
         next.kind == StepKind::kRecvReduce && next.count == first.count &&
         same_region(next.dst, first.dst) && same_region(next.src, next.dst) &&
         last.divisor <= 1;
}

// Declared buffer sizes of one rank, in elements. A size of 0 means the
// buffer is not used (and may be NULL in the engine).
struct BufferSizes {
  std::uint64_t send = 0;
  std::uint64_t recv = 0;
  std::uint64_t scratch = 0;
  std::uint64_t send_shard = 0;  // each of nranks shards
  std::uint64_t recv_shard = 0;

  std::uint64_t of(BufferKind k) const;
};

struct RankProgram {
  bool built = false;  // false for ranks a single-rank build skipped
  BufferSizes sizes;
  std::vector<Step> steps;
  std::vector<std::uint32_t> deps;  // Step::dep_begin/dep_count index here

  const std::uint32_t* deps_of(const Step& s) const { return deps.data() + s.dep_begin; }
};

// How rank r's program relates to rank 0's, when the builder guarantees it
// (used by the cost model to simulate one rank instead of all of them):
//   kRotation  rank r = rank 0 with every peer q replaced by (q + r) % p.
//   kXor       rank r = rank 0 with every peer q replaced by q ^ r.
// Offsets may differ; element counts agree up to the uneven-partition +1.
enum class Symmetry : std::uint8_t { kNone = 0, kRotation, kXor };

// Which ranks share a locality domain, typically a node: ranks of one group
// reach each other over the node's own fabric and other groups through the
// node's NICs. Hierarchical algorithms (kHierarchical) work group by group;
// the others ignore the grouping. Labels are arbitrary non-negative ints (a
// node index, a host-name hash): only the partition they induce matters, so
// {7, 7, 3} and {0, 0, 1} are the same grouping with the same fingerprint.
// Groups may be uneven (3 ranks on one node, 1 on another) and their ranks
// need not be contiguous. Immutable once built; share it by shared_ptr.
class RankGroups {
 public:
  // group_of_rank[r] = label of rank r's group. Throws
  // wia::Error(WIA_ERROR_INVALID_ARGUMENT) for an empty list or a negative
  // label, naming the rank.
  explicit RankGroups(std::vector<std::int32_t> group_of_rank);

  std::int32_t nranks() const { return static_cast<std::int32_t>(group_of_rank_.size()); }
  // The labels as given.
  std::span<const std::int32_t> group_of_rank() const { return group_of_rank_; }
  // Groups are numbered 0..ngroups-1 in the order of their lowest rank, so
  // leaders ascend with the group index.
  std::int32_t ngroups() const { return static_cast<std::int32_t>(member_begin_.size()) - 1; }
  std::int32_t group(std::int32_t rank) const {
    return index_of_rank_[static_cast<std::size_t>(rank)];
  }
  // Members of group g, ascending; members(g)[0] is the group's leader.
  std::span<const std::int32_t> members(std::int32_t g) const;
  std::int32_t leader(std::int32_t g) const { return members(g)[0]; }
  // Position of `rank` inside its group (0 for the leader).
  std::int32_t local_rank(std::int32_t rank) const {
    return local_of_rank_[static_cast<std::size_t>(rank)];
  }
  std::int32_t largest_group_size() const { return largest_; }
  // Stable across processes and runs (a function of the partition only),
  // never 0 (0 stands for "no grouping").
  std::uint64_t fingerprint() const { return fingerprint_; }

 private:
  std::vector<std::int32_t> group_of_rank_;
  std::vector<std::int32_t> index_of_rank_;
  std::vector<std::int32_t> local_of_rank_;
  std::vector<std::int32_t> member_begin_;  // ngroups + 1 offsets into members_
  std::vector<std::int32_t> members_;
  std::int32_t largest_ = 0;
  std::uint64_t fingerprint_ = 0;
};

// 0 for nullptr (no grouping), else groups->fingerprint().
std::uint64_t rank_groups_fingerprint(const std::shared_ptr<const RankGroups>& groups) noexcept;

// Whether a grouping gives a hierarchical algorithm anything to exploit:
// at least two groups and at least one group of two or more ranks.
bool is_hierarchical(const RankGroups* groups) noexcept;

struct Options {
  // Pipeline depth. What is split is algorithm-specific: ring algorithms
  // split each of the nranks blocks; tree, chain and binomial algorithms
  // split the whole vector. 0 lets the registry pick from the size
  // (default_chunks). Algorithms without pipelining ignore it. The
  // effective value never exceeds the elements available to split.
  std::uint32_t num_chunks = 0;
  bool in_place = false;
  // send-recv: every rank r sends to (r + peer_offset) mod nranks and
  // receives from (r - peer_offset) mod nranks.
  std::int32_t peer_offset = 1;
  // Rank -> group (node) map of the communicator; nullptr = no grouping
  // known, which hierarchical algorithms treat as every rank in a group of
  // its own. When set it must cover exactly nranks ranks (validate_args).
  std::shared_ptr<const RankGroups> groups;
};

// Arguments of a collective, as an application gives them.
//   count: all-reduce/broadcast/reduce/send-recv: elements of the vector;
//          all-gather: elements each rank contributes (recv has
//          nranks*count); reduce-scatter: elements each rank gets (send
//          has nranks*count); all-to-all: elements per shard.
// build_schedule copies these field by field (see there): add new fields
// there too.
struct CollArgs {
  Collective collective = Collective::kAllReduce;
  Algorithm algorithm = Algorithm::kAuto;
  wia_reduce_op_t op = WIA_REDUCE_SUM;  // reducing collectives only
  wia_datatype_t dtype = WIA_FLOAT32;
  std::uint64_t count = 0;
  std::int32_t nranks = 1;
  std::int32_t root = 0;  // broadcast, reduce
  Options options;
};

struct Schedule {
  Collective collective = Collective::kAllReduce;
  Algorithm algorithm = Algorithm::kAuto;
  wia_reduce_op_t op = WIA_REDUCE_SUM;
  wia_datatype_t dtype = WIA_FLOAT32;
  std::uint64_t count = 0;
  std::int32_t nranks = 1;
  std::int32_t root = 0;
  bool in_place = false;
  std::uint32_t num_chunks = 1;  // effective pipeline depth
  Symmetry symmetry = Symmetry::kNone;
  std::vector<RankProgram> programs;  // nranks entries

  std::size_t elem_size() const;
  std::uint64_t scratch_bytes(int rank) const { return programs[rank].sizes.scratch * elem_size(); }
  std::size_t total_steps() const;
  // "allreduce/ring p=8 count=4099 float32 sum chunks=2 in-place"
  std::string describe() const;
};

// (op, divisor) to pass to wia::kernels::reduce for a reducing step of a
// schedule with reduce op `op` (AVG -> SUM except on the dividing step).
struct KernelOp {
  wia_reduce_op_t op;
  std::uint64_t divisor;
};
KernelOp kernel_op(wia_reduce_op_t op, const Step& step);

// Uneven partition of `count` into `parts` blocks: the first count % parts
// blocks hold one element more.
inline std::uint64_t block_size(std::uint64_t count, std::uint64_t parts, std::uint64_t i) {
  return count / parts + (i < count % parts ? 1 : 0);
}
inline std::uint64_t block_offset(std::uint64_t count, std::uint64_t parts, std::uint64_t i) {
  const std::uint64_t rem = count % parts;
  return i * (count / parts) + (i < rem ? i : rem);
}

// Sizes of the user buffers of `rank` for a collective (scratch = 0), per
// the count convention of CollArgs and the in-place layouts above.
BufferSizes user_buffer_sizes(const CollArgs& args, std::int32_t rank);

// Throws wia::Error(WIA_ERROR_INVALID_ARGUMENT) naming the bad value:
// nranks < 1, root out of range, dtype/op invalid, element counts whose byte
// size overflows 64 bits, a peer_offset that is meaningless.
void validate_args(const CollArgs& args);

}  // namespace wia::coll
