// SPDX-License-Identifier: Apache-2.0
// Alpha-beta cost model over collective schedules, and algorithm selection.
//
// The model costs the very schedules the engine executes (core/coll), by a
// discrete-event simulation of their steps:
//   - a message from a to b of B bytes starts when its send's dependencies
//     are done and the link (a, b) is free (and a's send port, when the
//     model has one NIC per rank), after the optional per-message
//     overhead; it occupies them for B / bandwidth and arrives alpha later
//     than that: t_arrive = t_start + alpha + B / bw. With ports, b's
//     receive port also drains its incoming messages one after the other
//     (incast), so the data is in only once that port has spent
//     B / port bandwidth on it. Send sides serve messages in the order they
//     become ready, receive ports in the order they start. Links are full
//     duplex; alpha is latency, so messages queued on one link overlap
//     their latencies (as pipelining does on real networks);
//   - a send completes (its buffer is reusable) when its bytes have left:
//     transports are modelled as eager, the usual case below the
//     rendezvous threshold and an optimistic bound above it;
//   - a receive completes when its message has arrived and its
//     dependencies are done; a receive-reduce, copy or reduce then also
//     occupies its rank's compute for B / reduce (copy) bandwidth, one
//     local operation at a time per rank;
//   - processes on one node whose CPUs copy (Copier::kBothEnds) occupy
//     their CPUs for the copies instead, and over kernel sockets each
//     rank's socket path as well, beside its thread
//     (LinkModel::socket_share), so chunks overlap reductions with it;
//   - the estimate is the time the last step completes.
// With one chunk, uniform links and free reductions this reproduces the
// textbook costs exactly (ring all-reduce 2(p-1) alpha + 2(p-1)/p n beta,
// Rabenseifner 2 log2(p) alpha + 2(p-1)/p n beta, binomial 2 log2(p)
// (alpha + n beta)), and it also sees what the closed forms miss:
// pipelining, the non-power-of-two fold, contention for a link or a NIC,
// incast, slow links, local reduction cost.
//
// Scale: a schedule declared rotation- or XOR-symmetric (core/coll
// Symmetry) is costed from rank 0's program alone: under uniform links
// every rank follows the same timeline, so a receive from q arrives when
// rank 0's mirror-image send does. That makes ring and all-to-all costing
// O(p) instead of O(p^2) (tested equal to the full simulation). Non-uniform
// links use the full simulation up to kFullSimulationMaxRanks ranks and
// beyond it the symmetric shortcut with, for each peer offset, the worst
// link of that offset (a conservative bulk-synchronous bound, except that
// it charges every message its rank's own port: NICs shared by the ranks
// of a node, and node-local messages skipping them, LinkModel::nic_of_rank
// and node_of_rank, are seen by the full simulation only). For
// p > 64, a ring-like schedule whose count leaves some chunks empty (and
// so breaks its symmetry) is costed at one element per chunk: same rounds,
// bytes rounded up. Selection tries pipelined algorithms at chunk counts
// 1, 4, 16, 64 (while chunks stay >= 16 KiB, p * chunks <= 4096, and the
// cost keeps falling); a ring is only chunked when local work costs time.
#pragma once

#include <wia/status.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <unordered_map>
#include <vector>

#include "coll/schedule.hpp"

namespace wia::tuner {

inline constexpr std::int32_t kFullSimulationMaxRanks = 256;

// One core's rates over host memory (GB/s of output), for the models of
// ranks whose CPUs move the data (LinkModel::host_threads, processes on
// one node): a memcpy, and a fused two-input reduction pass; and how much
// faster copies run on data the caches hold (LinkModel::cache_time_factor).
inline constexpr double kHostCopyGbps = 12.0;  // MACHINE-FACTS: 13.7 at 16 MiB, 11.2 at 256
inline constexpr double kHostReduceGbps = 6.0;
// Copies whose working set the last-level cache holds, and the cores'
// own L2s, run this many times faster than over memory (wia-bench
// --predict on the EPYC host of MACHINE-FACTS, 2026-12-06: 2-process
// window all-reduce at 4 MiB (L3) 3.7x, 64 - 256 KiB (L2) 5.7 - 7.7x
// the rate of 64 MiB; a 1 MiB memcpy in wia-bw 5x one of 32 MiB).
inline constexpr double kHostCacheSpeedup = 4.0;
inline constexpr double kHostL2Speedup = 6.0;

// A pass that reduces two streams into a third (Copier::kReceiver's
// receive-reduce, a window all-reduce's fold), in copies of the same
// bytes: two streams read and one written against a copy's one and one,
// plus the arithmetic (c = a + b took 1.5 - 2.5x a memcpy's time per byte
// on the reference VM, MACHINE-FACTS); each further input of a fused
// chain adds one read.
inline constexpr double kFusedPass = 2.0;
inline constexpr double kChainedInput = 0.5;

// Who moves a message's bytes, when CPUs do (LinkModel::copies).
enum class Copier : std::uint8_t {
  // Links move them (a NIC, a DMA engine, NVLink): a message occupies its
  // link (and ports) for bytes / bandwidth, the ranks' CPUs stay free. The
  // textbook model, and the default.
  kLink,
  // The receiving rank's thread copies straight from the sender's memory
  // (the inline engine in one process; node-shared windows): a receive
  // occupies the receiver's CPU for bytes / link bandwidth, one local
  // operation at a time with its copies and reductions; a receive-reduce
  // costs the link's copy time times kFusedPass (cost_model.cpp), or
  // kChainedInput when it extends a fused chain (its operand's read
  // only). Senders only publish.
  kReceiver,
  // Both ends' CPUs copy (shm rings, loopback TCP: into the channel and out
  // of it): a message occupies the sender's CPU and then the receiver's
  // for bytes / link bandwidth each, so a rank that sends and receives at
  // once gets half its link each way; a receive-reduce adds the reduction.
  // Over kernel sockets (LinkModel::socket_share > 0) the kernel's socket
  // path of each end carries the message beside the threads instead, and
  // each thread only copies its share in or out.
  kBothEnds,
};

// Loopback TCP as Copier::kBothEnds (LinkModel::socket_share and
// thread_share; docs/collectives.md, "How the model is calibrated"),
// measured on the reference VM on 2026-12-05. A rank's socket path serves
// its sends and receives one after the other: with a message each way at
// once, 1.9 - 2.0 GB/s moved each way where one direction alone moved 3.0
// (wia-bw --procs 2), so a message takes 0.77 of its one-way time there.
// A process sending and receiving 32 MiB messages over blocking sockets
// spent 0.43 - 0.46 CPU-seconds per GB each way (getrusage, two threads;
// one way alone 0.26 - 0.29 per GB at each end): 0.65 of a message's
// one-way time per message is the thread's (its copy in or out, and the
// kernel's work charged to it); the rest it can spend reducing, when each
// rank has a core (on_one_node: with more ranks than cores another rank
// runs in that time, and the thread's share is the socket path's).
inline constexpr double kLoopbackTcpSocketShare = 0.77;
inline constexpr double kLoopbackTcpThreadShare = 0.65;

// What carries the messages of processes on one node (on_one_node).
enum class NodeChannel : std::uint8_t {
  kSharedMemory,   // shm rings: each end's thread copies, nothing else moves the bytes
  kKernelSockets,  // loopback TCP: the kernel's socket paths, beside the threads
};

// Who owns a NIC in LinkModel::two_level.
enum class NicSharing : std::uint8_t {
  kPerNode,  // one NIC per node: every rank of the node shares it (typical CPU cluster)
  kPerRank,  // one NIC per rank (rail-optimised GPU nodes)
};

// Alpha-beta parameters of a communicator. GB/s are 1e9 bytes per second.
struct LinkModel {
  std::int32_t nranks = 1;
  // Used for every link when the matrices are empty.
  double alpha_us = 5.0;
  double gbps = 10.0;
  // Optional per-link values, row-major [src * nranks + dst]; diagonal unused.
  std::vector<double> alpha_matrix_us;
  std::vector<double> gbps_matrix;
  // Port bandwidth of each rank (its NIC into a non-blocking switch): all
  // its outgoing messages share the send side, all its incoming ones the
  // receive side (incast). 0 = unlimited (a full mesh of dedicated links,
  // e.g. NVLink/xGMI all-to-all).
  double port_gbps = 0.0;
  // Optional NIC sharing and node locality, nranks entries each (labels are
  // arbitrary non-negative ints). node_of_rank: messages between two ranks
  // of one node travel over the node's own fabric (the link matrices) and
  // skip the ports. nic_of_rank: ranks with the same label share one port
  // (its send side and its receive side). Empty = every rank on a node of
  // its own with a port of its own (every message uses ports).
  std::vector<std::int32_t> node_of_rank;
  std::vector<std::int32_t> nic_of_rank;
  // Per-message cost on the sending rank (LogGP's o/g: software, doorbell,
  // NIC message rate): each send keeps its rank busy this long before its
  // bytes go. 0 by default so the textbook formulas hold; a few tenths of
  // a microsecond (RDMA) to a few microseconds (TCP) make algorithms that
  // send O(p) messages per rank pay for them at scale.
  double message_overhead_us = 0.0;
  // Per call, whatever the schedule: what starting a collective costs
  // before any step runs (in one process: the ranks' stream tasks reaching
  // the engine and its barrier). 0 by default; it moves every estimate
  // alike, so it sizes predictions and changes no choice.
  double call_overhead_us = 0.0;
  // Local data movement: bytes of output per second. 0 = free.
  double reduce_gbps = 0.0;
  double copy_gbps = 0.0;
  // Who moves message bytes (Copier): links by default.
  Copier copies = Copier::kLink;
  // The share of a core each rank's CPU work gets, (0, 1]: cores / ranks
  // when more ranks than cores run (every CPU-side cost, copies with
  // Copier::kReceiver / kBothEnds and local reductions, is divided by it).
  double cpu_share = 1.0;
  // CPU copies and reductions by loads and stores (Copier::kReceiver, and
  // kBothEnds without socket paths: shm rings) of a working set (every
  // rank's buffers of the collective together) held by cache_bytes run
  // cache_speedup times faster than the links' figures, which wia-bw
  // measures on 32 MiB (cache_time_factor). 0 = no cache model.
  double cache_bytes = 0;
  double cache_speedup = 1.0;
  // The same for the L2s of the cores the ranks run on, together (0 = no
  // L2 model): the share of a working set they hold runs l2_speedup times
  // faster than the links' figures.
  double l2_bytes = 0;
  double l2_speedup = 1.0;
  // The time CPU copies of a working set of `footprint` bytes take, as a
  // share of the links' figures: 1 without a cache model; else each level
  // serves the share of the set half its size holds (the engine streams
  // outputs past half the last level, exec_plan.cpp; the other half holds
  // what else runs), the L2s first, at its speed-up, and memory the rest
  // (a call reads each buffer once, so what stayed in cache from the last
  // call is hit and the rest missed). So 1 / l2_speedup when the L2s hold
  // it all, 1 / cache_speedup when the last level does, and a smooth
  // slope past it instead of a cliff.
  double cache_time_factor(double footprint) const;
  // Copier::kBothEnds over kernel sockets: 0 = none, the ranks' threads
  // are the channel (shm rings). Above 0, each rank's socket path spends
  // socket_share x bytes / link bandwidth on every message the rank sends
  // or receives, one after the other in the order they reach it, beside
  // the rank's thread, which spends thread_share x bytes / link bandwidth
  // copying a message in (when it is free: the kernel's buffers take it)
  // or out (at the end of the socket path's turn, no sooner than the last
  // byte is in after bytes / link bandwidth on the link). The thread's
  // reductions overlap the socket paths' time, which chunks exploit.
  double socket_share = 0.0;
  double thread_share = 1.0;

  // Every link alpha_us / gbps, and one injection port of gbps per rank.
  static LinkModel uniform(std::int32_t nranks, double alpha_us, double gbps);
  // Ranks that are threads of one process over host memory (the inline
  // engine, docs/collectives.md): the receiver copies (Copier::kReceiver)
  // at a memcpy's rate, receive-reduces are fused passes, and `cores`
  // cores run all ranks' work (cpu_share = cores / nranks when fewer).
  // Calibrated with wia-bench --predict (docs/collectives.md, "How the
  // model is calibrated").
  // llc_bytes: the last-level cache, l2_bytes one core's L2 (0: this
  // machine's, from sysfs).
  static LinkModel host_threads(std::int32_t nranks, int cores, double llc_bytes = 0,
                                double l2_bytes = 0);
  // Processes of one node reading each other's node-shared windows
  // (engine/window_allreduce.hpp): host_threads' copies, and a step's
  // hand-off of a few cache-line transfers (docs/performance.md, "The VM's
  // two modes") instead of a thread wake-up: 0.25 us alpha and overhead,
  // 5 us when ranks outnumber cores (waiters yield, then sleep).
  static LinkModel node_windows(std::int32_t nranks, int cores);
  // Two-level cluster: ranks with the same group_of_rank label are on one
  // node, linked by intra_alpha_us / intra_gbps; ranks of different nodes
  // by inter_alpha_us / inter_gbps, through NICs of nic_gbps each (0 = no
  // NIC limit), one per node or one per rank. group_of_rank has nranks
  // entries (the labels of coll::RankGroups::group_of_rank()).
  static LinkModel two_level(std::int32_t nranks, std::span<const std::int32_t> group_of_rank,
                             double intra_alpha_us, double intra_gbps, double inter_alpha_us,
                             double inter_gbps, double nic_gbps,
                             NicSharing sharing = NicSharing::kPerNode);

  double alpha(std::int32_t src, std::int32_t dst) const {
    return alpha_matrix_us.empty() ? alpha_us : alpha_matrix_us[idx(src, dst)];
  }
  double bandwidth(std::int32_t src, std::int32_t dst) const {
    return gbps_matrix.empty() ? gbps : gbps_matrix[idx(src, dst)];
  }
  // Uniform links and no NIC sharing or node locality (node_of_rank /
  // nic_of_rank empty): every rank sees the same network.
  bool is_uniform() const;
  // Copies made by CPUs (Copier::kReceiver or kBothEnds).
  bool cpu_copies() const { return copies != Copier::kLink; }
  // The lowest bandwidth of any link between two ranks (gbps when the
  // matrices are empty); what bandwidth utilization is measured against.
  double slowest_gbps() const;
  // Throws wia::Error(INVALID_ARGUMENT) on bad sizes or non-positive values.
  void validate() const;

 private:
  std::size_t idx(std::int32_t s, std::int32_t d) const {
    return static_cast<std::size_t>(s) * static_cast<std::size_t>(nranks) +
           static_cast<std::size_t>(d);
  }
};

struct CostEstimate {
  double time_us = 0.0;
  bool symmetric = false;  // costed from rank 0 only
  std::size_t steps = 0;   // steps simulated
};

// Costs a schedule: the full simulation when every rank is built, the
// symmetric one when only rank 0 is built and the schedule is symmetric.
// Throws wia::Error(INVALID_ARGUMENT) for a model of another size and
// wia::Error(INTERNAL) for a schedule that cannot complete.
CostEstimate estimate(const coll::Schedule& schedule, const LinkModel& model);

// Builds what is needed (rank 0 only when the shortcut applies) and costs it.
CostEstimate estimate(const coll::CollArgs& args, const LinkModel& model);

struct Candidate {
  coll::Algorithm algorithm = coll::Algorithm::kAuto;
  const char* name = "";
  std::uint32_t num_chunks = 1;
  double time_us = 0.0;
};

struct Selection {
  coll::Algorithm algorithm = coll::Algorithm::kAuto;
  const char* name = "";
  std::uint32_t num_chunks = 1;
  double estimated_ms = 0.0;
};

// Builds every algorithm the registry has for `collective` (pipelined ones
// at a few chunk counts) for `count` elements of `dtype` over model.nranks
// ranks (root 0, out of place), costs each, and returns the cheapest (ties
// go to the registry's order). `considered`, when given, receives every
// candidate's cost.
Selection select_algorithm(coll::Collective collective, std::uint64_t count, wia_datatype_t dtype,
                           std::int32_t nranks, const LinkModel& model,
                           std::vector<Candidate>* considered = nullptr);
// The same for args.collective, args.count, args.dtype and args.nranks,
// with args.options.groups: a grouping makes hierarchical algorithms
// candidates (coll::tuner_candidate) and is passed to every candidate.
// The other fields of args are ignored as above (SUM, root 0, out of place,
// chunk counts tried by the selection).
Selection select_algorithm(const coll::CollArgs& args, const LinkModel& model,
                           std::vector<Candidate>* considered = nullptr);
// The chunk count for one algorithm the caller chose (a call's config, a
// WIA_ALGO or YAML rule): that algorithm alone, costed as above at the
// chunk counts the selection tries, the cheapest returned. A forced
// algorithm otherwise ran at its builder's fixed default, which over tcp
// split a 16 MiB direct all-reduce into 64 KiB messages and ran it 2.2x
// slower than the 4 chunks the selection gives it. Throws if the
// collective has no such algorithm.
Selection select_chunks(const coll::CollArgs& args, coll::Algorithm algorithm,
                        const LinkModel& model);

// select_algorithm with a cache per (collective, element size, size
// bucket): counts below 64 are their own bucket (partitions differ), above
// that buckets are quarter octaves (sizes within 19% of each other). The
// first count seen in a bucket is costed and decides for the bucket, and
// its estimate is returned for the bucket: the steady state of a training
// or serving loop costs a hash lookup, and the number of cold decisions
// is bounded (~4 per octave) whatever sizes arrive. Not thread-safe; one
// per communicator.
class Selector {
 public:
  // `groups`: the communicator's rank grouping (nullptr = none), given to
  // every selection made through the three-argument select().
  explicit Selector(LinkModel model, std::shared_ptr<const coll::RankGroups> groups = nullptr);
  const Selection& select(coll::Collective collective, std::uint64_t count, wia_datatype_t dtype);
  // With the grouping of args.options.groups instead of the selector's
  // (part of the cache key, by fingerprint).
  const Selection& select(const coll::CollArgs& args);
  // select_chunks, cached like select(), with the grouping of
  // args.options.groups or else the selector's.
  const Selection& select_chunks(const coll::CollArgs& args, coll::Algorithm algorithm);
  const LinkModel& model() const { return model_; }
  const std::shared_ptr<const coll::RankGroups>& groups() const { return groups_; }
  std::size_t cached() const { return cache_.size(); }

  static std::uint32_t size_bucket(std::uint64_t count);

 private:
  struct Key {
    std::uint64_t shape;        // algorithm (kAuto: all), size bucket, collective, element size
    std::uint64_t fingerprint;  // of the grouping
    bool operator==(const Key&) const = default;
  };
  // The selection of every algorithm (kAuto) or the chunks of one.
  const Selection& lookup(const coll::CollArgs& args, coll::Algorithm algorithm);
  struct KeyHash {
    std::size_t operator()(const Key& k) const noexcept {
      return static_cast<std::size_t>(k.shape * 0x9e3779b97f4a7c15ull ^ k.fingerprint);
    }
  };
  LinkModel model_;
  std::shared_ptr<const coll::RankGroups> groups_;
  std::unordered_map<Key, Selection, KeyHash> cache_;
};

// Ranks that are processes of one node over CPU-driven transports (shm
// rings, loopback tcp): both ends copy (Copier::kBothEnds), at the links'
// figures (measured ones from tuner.link_file), the node's `cores` cores
// shared by model.nranks ranks, local work at a core's rates; over
// kKernelSockets the socket and thread shares of loopback TCP, over shm
// this machine's caches (LinkModel::cache_time_factor).
void on_one_node(LinkModel& model, int cores, NodeChannel channel = NodeChannel::kSharedMemory);

// The spec's closed forms (6.5.1-6.5.3), beta = 1 / bandwidth, n in bytes.
double ring_allreduce_us(std::int32_t p, double bytes, double alpha_us, double gbps);
double tree_allreduce_us(std::int32_t p, double bytes, double alpha_us, double gbps);
double rabenseifner_allreduce_us(std::int32_t p, double bytes, double alpha_us, double gbps);

}  // namespace wia::tuner
