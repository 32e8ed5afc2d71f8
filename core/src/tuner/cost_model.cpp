// SPDX-License-Identifier: Apache-2.0
#include "tuner/cost_model.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <queue>
#include <string>
#include <tuple>

#include "coll/registry.hpp"
#include "common/cpus.hpp"
#include "common/error.hpp"
#include "kernels/cpu_reduce.hpp"

namespace wia::tuner {

using coll::Algorithm;
using coll::Schedule;
using coll::Step;
using coll::StepKind;
using coll::Symmetry;

LinkModel LinkModel::uniform(std::int32_t nranks, double alpha_us, double gbps) {
  LinkModel m;
  m.nranks = nranks;
  m.alpha_us = alpha_us;
  m.gbps = gbps;
  m.port_gbps = gbps;
  return m;
}

LinkModel LinkModel::host_threads(std::int32_t nranks, int cores, double llc_bytes,
                                  double l2_bytes) {
  LinkModel m = uniform(nranks, /*alpha_us=*/1.0, /*gbps=*/kHostCopyGbps);
  m.port_gbps = 0;  // every pair copies independently
  m.copies = Copier::kReceiver;
  m.copy_gbps = kHostCopyGbps;
  m.reduce_gbps = kHostReduceGbps;
  // A call starts with the ranks' stream tasks reaching the engine and
  // its barrier, then every message is a cross-thread hand-off (publish,
  // notice, consume). 4 ranks on 2 cores (2026-12-06, wia-bench --predict):
  // at 8 B every algorithm took 19 - 27 us whatever its messages (ring's
  // 6 steps 19, recursive doubling's 2 rounds 21), at 64 KiB 27 - 34 us:
  // 16 us a call and 2 a message. (16 us a message, which kept chunk
  // counts down before kThreadsChunkGain did, predicted 64 KiB at 3 -
  // 4x.) With a core per rank a call is a few us (2 ranks, 8 B: 3.0 - 3.9).
  cores = std::max(cores, 1);
  m.call_overhead_us = nranks > cores ? 16.0 : 1.0;
  m.message_overhead_us = nranks > cores ? 2.0 : 1.0;
  m.cpu_share = nranks > cores ? static_cast<double>(cores) / nranks : 1.0;
  if (llc_bytes <= 0) llc_bytes = static_cast<double>(last_level_cache_bytes());
  m.cache_bytes = llc_bytes;
  m.cache_speedup = kHostCacheSpeedup;
  if (l2_bytes <= 0) l2_bytes = static_cast<double>(cpu_cache_bytes(2));
  m.l2_bytes = l2_bytes * std::min(nranks, cores);
  m.l2_speedup = kHostL2Speedup;
  return m;
}

LinkModel LinkModel::node_windows(std::int32_t nranks, int cores) {
  LinkModel m = host_threads(nranks, cores);
  m.call_overhead_us = 0;  // a call is a publish (0.3 us at 8 B, docs/processes.md)
  m.alpha_us = 0.25;
  m.message_overhead_us = nranks > std::max(cores, 1) ? 5.0 : 0.25;
  return m;
}

LinkModel LinkModel::two_level(std::int32_t nranks, std::span<const std::int32_t> group_of_rank,
                               double intra_alpha_us, double intra_gbps, double inter_alpha_us,
                               double inter_gbps, double nic_gbps, NicSharing sharing) {
  if (nranks < 1 || group_of_rank.size() != static_cast<std::size_t>(nranks))
    throw Error(WIA_ERROR_INVALID_ARGUMENT,
                "two-level link model: " + std::to_string(group_of_rank.size()) +
                    " group labels for " + std::to_string(nranks) + " ranks");
  LinkModel m;
  m.nranks = nranks;
  m.alpha_us = inter_alpha_us;
  m.gbps = inter_gbps;
  const std::size_t p = static_cast<std::size_t>(nranks);
  m.alpha_matrix_us.assign(p * p, inter_alpha_us);
  m.gbps_matrix.assign(p * p, inter_gbps);
  for (std::size_t s = 0; s < p; ++s)
    for (std::size_t d = 0; d < p; ++d)
      if (group_of_rank[s] == group_of_rank[d]) {
        m.alpha_matrix_us[s * p + d] = intra_alpha_us;
        m.gbps_matrix[s * p + d] = intra_gbps;
      }
  m.port_gbps = nic_gbps;
  m.node_of_rank.assign(group_of_rank.begin(), group_of_rank.end());
  if (sharing == NicSharing::kPerNode) {
    m.nic_of_rank = m.node_of_rank;
  } else {
    m.nic_of_rank.resize(p);
    for (std::size_t r = 0; r < p; ++r) m.nic_of_rank[r] = static_cast<std::int32_t>(r);
  }
  m.validate();
  return m;
}

double LinkModel::slowest_gbps() const {
  if (gbps_matrix.empty()) return gbps;
  double slowest = 0.0;
  for (std::int32_t a = 0; a < nranks; ++a)
    for (std::int32_t b = 0; b < nranks; ++b) {
      const double g = gbps_matrix[idx(a, b)];
      if (a != b && g > 0 && (slowest == 0.0 || g < slowest)) slowest = g;
    }
  return slowest;
}

double LinkModel::cache_time_factor(double footprint) const {
  if (!(footprint > 0)) return 1.0;
  auto held = [&](double bytes) { return bytes > 0 ? std::min(1.0, bytes / 2 / footprint) : 0.0; };
  const double in_l2 = held(l2_bytes);
  const double in_llc = std::max(held(cache_bytes) - in_l2, 0.0);
  return (1.0 - in_l2 - in_llc) + in_l2 / l2_speedup + in_llc / cache_speedup;
}

bool LinkModel::is_uniform() const {
  if (!node_of_rank.empty() || !nic_of_rank.empty()) return false;
  auto all_equal = [this](const std::vector<double>& v) {
    for (std::int32_t s = 0; s < nranks; ++s)
      for (std::int32_t d = 0; d < nranks; ++d)
        if (s != d && v[idx(s, d)] != v[idx(0, nranks > 1 ? 1 : 0)]) return false;
    return true;
  };
  return (alpha_matrix_us.empty() || all_equal(alpha_matrix_us)) &&
         (gbps_matrix.empty() || all_equal(gbps_matrix));
}

void LinkModel::validate() const {
  auto bad = [](const std::string& what) { throw Error(WIA_ERROR_INVALID_ARGUMENT, what); };
  if (nranks < 1) bad("link model: nranks " + std::to_string(nranks) + " must be >= 1");
  const std::size_t cells = static_cast<std::size_t>(nranks) * static_cast<std::size_t>(nranks);
  if (!alpha_matrix_us.empty() && alpha_matrix_us.size() != cells)
    bad("link model: alpha matrix has " + std::to_string(alpha_matrix_us.size()) +
        " entries, expected " + std::to_string(cells));
  if (!gbps_matrix.empty() && gbps_matrix.size() != cells)
    bad("link model: bandwidth matrix has " + std::to_string(gbps_matrix.size()) +
        " entries, expected " + std::to_string(cells));
  if (!(alpha_us >= 0)) bad("link model: alpha " + std::to_string(alpha_us) + " us is negative");
  if (!(gbps > 0)) bad("link model: bandwidth " + std::to_string(gbps) + " GB/s must be > 0");
  for (std::size_t i = 0; i < alpha_matrix_us.size(); ++i)
    if (!(alpha_matrix_us[i] >= 0))
      bad("link model: alpha of link " + std::to_string(i / nranks) + "->" +
          std::to_string(i % nranks) + " is negative");
  for (std::size_t i = 0; i < gbps_matrix.size(); ++i)
    if (i % (static_cast<std::size_t>(nranks) + 1) != 0 && !(gbps_matrix[i] > 0))
      bad("link model: bandwidth of link " + std::to_string(i / nranks) + "->" +
          std::to_string(i % nranks) + " must be > 0");
  auto check_labels = [&](const std::vector<std::int32_t>& v, const char* what) {
    if (v.empty()) return;
    if (v.size() != static_cast<std::size_t>(nranks))
      bad(std::string("link model: ") + what + " has " + std::to_string(v.size()) +
          " entries, expected " + std::to_string(nranks));
    for (std::size_t r = 0; r < v.size(); ++r)
      if (v[r] < 0)
        bad(std::string("link model: ") + what + " of rank " + std::to_string(r) +
            " is negative (" + std::to_string(v[r]) + ")");
  };
  check_labels(node_of_rank, "node_of_rank");
  check_labels(nic_of_rank, "nic_of_rank");
  if (!(cache_bytes >= 0) || !(cache_speedup >= 1) || !(l2_bytes >= 0) || !(l2_speedup >= 1))
    bad("link model: cache_bytes and l2_bytes must be >= 0, cache_speedup and l2_speedup >= 1");
  if (!(cpu_share > 0 && cpu_share <= 1))
    bad("link model: cpu_share " + std::to_string(cpu_share) + " must be in (0, 1]");
  if (!(socket_share >= 0) || !(thread_share > 0 && thread_share <= 1))
    bad("link model: socket_share " + std::to_string(socket_share) + " must be >= 0 and " +
        "thread_share " + std::to_string(thread_share) + " in (0, 1]");
  if (port_gbps < 0 || reduce_gbps < 0 || copy_gbps < 0)
    bad("link model: port/reduce/copy bandwidths must be >= 0 (0 = unlimited)");
  if (!(message_overhead_us >= 0))
    bad("link model: message overhead " + std::to_string(message_overhead_us) + " us is negative");
  if (!(call_overhead_us >= 0))
    bad("link model: call overhead " + std::to_string(call_overhead_us) + " us is negative");
}

namespace {

// Microseconds per byte of a bandwidth in GB/s (1 GB/s = 1e3 bytes/us);
// 0 (unlimited) costs nothing.
double us_per_byte(double gbps) { return gbps > 0 ? 1.0 / (gbps * 1e3) : 0.0; }

constexpr std::uint32_t kNoPort = 0xffffffffu;
// Heap items with this bit set are "bytes start flowing" events of a send.
constexpr std::uint32_t kEjectEvent = 0x80000000u;

// The discrete-event simulation over a flattened set of steps, shared by
// the full and the symmetric modes; they differ only in how the arrays
// below are filled.
struct Sim {
  struct Item {
    double time;
    std::uint32_t id;
    bool operator>(const Item& o) const { return std::tie(time, id) > std::tie(o.time, o.id); }
  };
  // Per step.
  std::vector<const Step*> steps;
  std::vector<std::uint32_t> rank;       // index into port_free / compute_free
  std::vector<std::uint32_t> pending;    // unfinished dependencies
  std::vector<double> ready;             // max finish of finished dependencies
  std::vector<std::uint32_t> dep_begin;  // CSR of dependents
  std::vector<std::uint32_t> dependents;
  std::vector<std::uint32_t> match;  // send -> recv and recv -> send
  std::vector<double> arrival;       // recv: arrival time, < 0 while unknown
  std::vector<std::uint8_t> deps_ok;
  // Receive-reduces that extend a chain the engines fuse into one n-ary
  // pass (coll::extends_chain): they only add their operand's read to it.
  std::vector<std::uint8_t> chained;
  // Per send.
  std::vector<std::uint32_t> link;
  std::vector<std::uint32_t> inject;  // sending rank's port, kNoPort for none
  std::vector<std::uint32_t> eject;   // receiving rank's port, kNoPort for none
  std::vector<double> alpha, link_us_per_byte;
  // Resources.
  std::vector<double> link_free, port_free, eject_free, compute_free;
  std::vector<double> overhead_free;  // per rank: its per-message overhead is serial
  // Per rank, kBothEnds over kernel sockets (LinkModel::socket_share): its
  // socket path; and per receive, when its last byte is in.
  std::vector<double> socket_free;
  std::vector<double> arrival_full;
  double port_us_per_byte = 0, reduce_us_per_byte = 0, copy_us_per_byte = 0;
  double overhead_us = 0;
  Copier copies = Copier::kLink;
  double cpu_factor = 1;                      // 1 / cpu_share
  double socket_share = 0, thread_share = 1;  // LinkModel's, kBothEnds
  std::size_t elem_size = 1;

  std::priority_queue<Item, std::vector<Item>, std::greater<Item>> heap;
  std::vector<Item> immediate;
  double makespan = 0;
  std::size_t finished = 0;

  // Sends contend for links and ports, and reductions/copies with a finite
  // rate for the rank's compute: those are processed in time order through
  // the heap (first come, first served). Every other step's finish time is
  // max(ready, arrival) whatever the processing order, so it is finished
  // as soon as it is released, without a heap round trip.
  bool contends(const Step& st) const {
    if (st.is_send()) return true;
    if (st.is_recv() && copies != Copier::kLink) return true;  // the receiver copies
    if (st.kind == StepKind::kRecvReduce || st.kind == StepKind::kReduce)
      return reduce_us_per_byte > 0;
    if (st.kind == StepKind::kCopy) return copy_us_per_byte > 0;
    return false;
  }

  void release(std::uint32_t id) {
    deps_ok[id] = 1;
    const Step& st = *steps[id];
    double t = ready[id];
    if (st.is_recv()) {
      if (arrival[id] < 0) return;  // the send will release it
      t = std::max(t, arrival[id]);
    }
    if (contends(st)) {
      heap.push({t, id});
    } else {
      immediate.push_back({t, id});
    }
  }

  void finish(std::uint32_t id, double t) {
    ++finished;
    makespan = std::max(makespan, t);
    for (std::uint32_t k = dep_begin[id]; k < dep_begin[id + 1]; ++k) {
      const std::uint32_t d = dependents[k];
      ready[d] = std::max(ready[d], t);
      if (--pending[d] == 0) release(d);
    }
  }

  // A send's bytes start to flow at `tx`: with ports, the receiving rank's
  // port drains its incoming messages one after the other (incast), a
  // first-come-first-served stage of its own (coupling it to the send side
  // would leave both idle in turns). Then the receive can complete.
  void deliver(std::uint32_t id, double tx) {
    // With CPU copies the receive step itself occupies the receiver's CPU
    // (run()): the message is there to be copied once it is published.
    const double bytes =
        copies == Copier::kLink ? static_cast<double>(steps[id]->count * elem_size) : 0.0;
    const double port_rate = inject[id] != kNoPort ? port_us_per_byte : 0.0;
    double received = tx + bytes * std::max(link_us_per_byte[id], port_rate);
    const std::uint32_t e = eject[id];
    if (port_us_per_byte > 0 && e != kNoPort) {
      eject_free[e] = std::max(tx, eject_free[e]) + bytes * port_us_per_byte;
      received = std::max(received, eject_free[e]);
    }
    const std::uint32_t rv = match[id];
    arrival[rv] = received + alpha[id];
    if (socket_share > 0)
      arrival_full[rv] =
          tx + static_cast<double>(steps[id]->count * elem_size) * link_us_per_byte[id] + alpha[id];
    if (deps_ok[rv]) {
      deps_ok[rv] = 0;  // release() sets it again
      release(rv);
    }
  }

  void drain_immediate() {
    while (!immediate.empty()) {
      const Item it = immediate.back();
      immediate.pop_back();
      finish(it.id, it.time);
    }
  }

  // kBothEnds over kernel sockets (LinkModel::socket_share). A send: the
  // thread, when free, spends the per-message overhead and its share
  // copying the message into the socket; the sender's socket path then
  // spends its share on it in the order messages reach it, and the link
  // carries the bytes in that order too, the three streaming the message
  // together (its bytes are published when the link starts them, as
  // deliver() sees). Returns when the bytes enter the socket.
  double send_through_socket(std::uint32_t id, double t, double bytes) {
    const std::uint32_t r = rank[id];
    const double c = bytes * link_us_per_byte[id] * cpu_factor;
    const double in = std::max(t, compute_free[r]) + overhead_us;
    compute_free[r] = in + c * thread_share;
    overhead_free[r] = compute_free[r];
    socket_free[r] = std::max(in, socket_free[r]) + c * socket_share;
    return in;
  }
  // A receive (-reduce): the receiver's socket path takes the message in
  // its turn, and the thread copies its share out at the end of that, no
  // sooner than the last byte is in,
  // then (a receive-reduce) reduces in cache at `reduce`, a chained input
  // at its read's cost. Meanwhile the thread is free for other work: what
  // pipelining buys over sockets.
  double receive_through_socket(std::uint32_t id, double t, double bytes, double copy,
                                double reduce) {
    const std::uint32_t r = rank[id];
    const double c = bytes * copy * cpu_factor;
    const double in = std::max(t, socket_free[r]) + c * socket_share;
    socket_free[r] = in;
    const double own = std::max(in - c * thread_share, compute_free[r]);
    const double copied = std::max({own + c * thread_share, in, arrival_full[id]});
    compute_free[r] = copied;
    if (steps[id]->kind == StepKind::kRecv) return copied;
    const double rate = chained[id] ? kChainedInput * copy_us_per_byte : reduce;
    compute_free[r] += bytes * rate * cpu_factor;
    return compute_free[r];
  }

  double run() {
    if (steps.size() >= kEjectEvent)
      throw Error(WIA_ERROR_INVALID_ARGUMENT, "cost model: schedule too large to simulate");
    for (std::uint32_t id = 0; id < steps.size(); ++id)
      if (pending[id] == 0) release(id);
    drain_immediate();
    while (!heap.empty()) {
      const Item it = heap.top();
      heap.pop();
      if (it.id & kEjectEvent) {
        deliver(it.id & ~kEjectEvent, it.time);
        drain_immediate();
        continue;
      }
      const Step& st = *steps[it.id];
      const double bytes = static_cast<double>(st.count * elem_size);
      const std::uint32_t r = rank[it.id];
      if (st.is_send()) {
        // The send side is claimed in the order sends become ready.
        // Messages inside a node skip the ports (kNoPort); the per-message
        // overhead is the sending rank's, whatever the path.
        const std::uint32_t l = link[it.id];
        const std::uint32_t port = inject[it.id];
        const double port_rate = port != kNoPort ? port_us_per_byte : 0.0;
        const bool socket = copies == Copier::kBothEnds && socket_share > 0;
        // Into a socket the thread copies whenever it is free: the
        // kernel's buffers queue what the link has not carried yet.
        const double start =
            socket ? std::max(it.time, overhead_free[r])
                   : std::max({it.time, link_free[l], port != kNoPort ? port_free[port] : 0.0,
                               overhead_free[r]});
        double tx = start + overhead_us;
        overhead_free[r] = tx;
        if (socket) {
          tx = std::max({send_through_socket(it.id, start, bytes), link_free[l],
                         port != kNoPort ? port_free[port] : 0.0});
        } else if (copies == Copier::kBothEnds) {
          // The sender's CPU copies into the channel, in turn with its
          // receives and reductions.
          tx = std::max(tx, compute_free[r]);
          compute_free[r] = tx + bytes * link_us_per_byte[it.id] * cpu_factor;
          overhead_free[r] = std::max(overhead_free[r], compute_free[r]);
        }
        const double occupy = copies == Copier::kReceiver
                                  ? 0.0
                                  : bytes * std::max(link_us_per_byte[it.id], port_rate);
        link_free[l] = tx + occupy;
        if (port != kNoPort) port_free[port] = tx + (port_rate > 0 ? occupy : 0.0);
        // The receive side is claimed when the bytes start to flow, so that
        // it serves messages in the order they actually start.
        heap.push({tx, it.id | kEjectEvent});
        finish(it.id, tx + occupy);
      } else {
        double rate = st.kind == StepKind::kCopy ? copy_us_per_byte : reduce_us_per_byte;
        if (st.is_recv() && copies != Copier::kLink) {
          // The receiver copies the message out of the sender's memory or
          // the channel at the link's rate (a copy: one stream read, one
          // written). kReceiver fuses the reduction into that pass: a
          // chain's first receive-reduce reads two streams and writes one
          // (kFusedPass copies' worth), each later input of the chain adds
          // one read (kChainedInput). kBothEnds copies the message out of
          // the channel, then reduces it in cache at the reduce rate (a
          // chained input: its read, at the copy rate).
          const double copy = link_us_per_byte[match[it.id]];
          if (copies == Copier::kBothEnds && socket_share > 0) {
            finish(it.id, receive_through_socket(it.id, it.time, bytes, copy, rate));
            drain_immediate();
            continue;
          }
          if (st.kind == StepKind::kRecv)
            rate = copy;
          else if (copies == Copier::kReceiver)
            rate = copy * (chained[it.id] ? kChainedInput : kFusedPass);
          else
            rate = copy + (chained[it.id] ? kChainedInput * copy_us_per_byte : rate);
        }
        rate *= cpu_factor;
        const double start = std::max(it.time, compute_free[r]);
        compute_free[r] = start + bytes * rate;
        finish(it.id, compute_free[r]);
      }
      drain_immediate();
    }
    if (finished != steps.size())
      throw Error(WIA_ERROR_INTERNAL, "cost model: schedule cannot complete (" +
                                          std::to_string(steps.size() - finished) +
                                          " steps blocked)");
    return makespan;
  }
};

struct MsgKey {
  std::int64_t a, b, c;  // (src, dst, tag) or its symmetric image
  std::uint32_t id;
  bool operator<(const MsgKey& o) const {
    return std::tie(a, b, c, id) < std::tie(o.a, o.b, o.c, o.id);
  }
};

// Bytes of every rank's buffers of `s` together (rank 0's stand for all).
double footprint_of(const Schedule& s) {
  const coll::BufferSizes& z = s.programs[0].sizes;
  const double per_rank =
      static_cast<double>(z.send + z.recv + z.scratch + (z.send_shard + z.recv_shard) * s.nranks);
  return per_rank * static_cast<double>(s.elem_size()) * s.nranks;
}

void init_common(Sim& sim, const LinkModel& m, std::size_t elem_size, std::size_t nresources,
                 std::size_t nports, double footprint) {
  sim.port_us_per_byte = us_per_byte(m.port_gbps);
  sim.overhead_us = m.message_overhead_us;
  sim.reduce_us_per_byte = us_per_byte(m.reduce_gbps);
  sim.copy_us_per_byte = us_per_byte(m.copy_gbps);
  sim.copies = m.copies;
  sim.cpu_factor = 1.0 / m.cpu_share;
  if (m.copies == Copier::kBothEnds) {
    sim.socket_share = m.socket_share;
    sim.thread_share = m.thread_share;
  }
  // Copies of a working set cache holds (see LinkModel::cache_bytes).
  if (m.copies == Copier::kReceiver || (m.copies == Copier::kBothEnds && m.socket_share == 0))
    sim.cpu_factor *= m.cache_time_factor(footprint);
  sim.elem_size = elem_size;
  sim.port_free.assign(nports, 0.0);
  sim.eject_free.assign(nports, 0.0);
  sim.compute_free.assign(nresources, 0.0);
  sim.overhead_free.assign(nresources, 0.0);
  sim.socket_free.assign(nresources, 0.0);
}

// Adds program `prog` as simulation rank `r` (dependency CSR built later).
void add_program(Sim& sim, const coll::RankProgram& prog, std::uint32_t r,
                 std::vector<std::pair<std::uint32_t, std::uint32_t>>& edges) {
  const auto base = static_cast<std::uint32_t>(sim.steps.size());
  std::size_t chain_first = 0;
  for (std::size_t i = 0; i < prog.steps.size(); ++i) {
    const Step& st = prog.steps[i];
    const bool chained =
        i > 0 && coll::extends_chain(prog.steps[chain_first], prog.steps[i - 1], st);
    if (!chained) chain_first = i;
    sim.chained.push_back(chained ? 1 : 0);
    const auto id = static_cast<std::uint32_t>(sim.steps.size());
    sim.steps.push_back(&st);
    sim.rank.push_back(r);
    sim.pending.push_back(st.dep_count);
    for (std::uint32_t d = 0; d < st.dep_count; ++d)
      edges.push_back({base + prog.deps_of(st)[d], id});
  }
}

void finish_graph(Sim& sim, std::vector<std::pair<std::uint32_t, std::uint32_t>>& edges) {
  const std::size_t n = sim.steps.size();
  sim.ready.assign(n, 0.0);
  sim.arrival.assign(n, -1.0);
  sim.arrival_full.assign(n, 0.0);
  sim.deps_ok.assign(n, 0);
  sim.match.assign(n, 0);
  sim.link.assign(n, 0);
  sim.inject.assign(n, kNoPort);
  sim.eject.assign(n, kNoPort);
  sim.alpha.assign(n, 0.0);
  sim.link_us_per_byte.assign(n, 0.0);
  sim.dep_begin.assign(n + 1, 0);
  for (const auto& e : edges) ++sim.dep_begin[e.first + 1];
  for (std::size_t i = 0; i < n; ++i) sim.dep_begin[i + 1] += sim.dep_begin[i];
  sim.dependents.resize(edges.size());
  std::vector<std::uint32_t> fill(sim.dep_begin.begin(), sim.dep_begin.end() - 1);
  for (const auto& e : edges) sim.dependents[fill[e.first]++] = e.second;
}

// Pairs the sorted send and receive keys; assigns link ids by (a, b).
void pair_messages(Sim& sim, std::vector<MsgKey>& sends, std::vector<MsgKey>& recvs) {
  std::sort(sends.begin(), sends.end());
  std::sort(recvs.begin(), recvs.end());
  if (sends.size() != recvs.size())
    throw Error(WIA_ERROR_INTERNAL, "cost model: " + std::to_string(sends.size()) + " sends vs " +
                                        std::to_string(recvs.size()) + " receives");
  std::uint32_t links = 0;
  for (std::size_t i = 0; i < sends.size(); ++i) {
    const MsgKey& s = sends[i];
    const MsgKey& r = recvs[i];
    if (s.a != r.a || s.b != r.b || s.c != r.c)
      throw Error(WIA_ERROR_INTERNAL, "cost model: unmatched message (" + std::to_string(s.a) +
                                          "->" + std::to_string(s.b) + " tag " +
                                          std::to_string(s.c) + ")");
    if (i > 0 && (s.a != sends[i - 1].a || s.b != sends[i - 1].b)) ++links;
    sim.match[s.id] = r.id;
    sim.match[r.id] = s.id;
    sim.link[s.id] = links;
  }
  sim.link_free.assign(sends.empty() ? 0 : links + 1, 0.0);
}

CostEstimate estimate_full(const Schedule& s, const LinkModel& m) {
  // Port of each rank: dense indices of the NIC labels (one per rank
  // without labels).
  std::vector<std::uint32_t> port_of(static_cast<std::size_t>(s.nranks));
  std::size_t nports = port_of.size();
  if (!m.nic_of_rank.empty()) {
    std::unordered_map<std::int32_t, std::uint32_t> dense;
    for (std::size_t r = 0; r < port_of.size(); ++r)
      port_of[r] = dense.try_emplace(m.nic_of_rank[r], static_cast<std::uint32_t>(dense.size()))
                       .first->second;
    nports = dense.size();
  } else {
    for (std::size_t r = 0; r < port_of.size(); ++r) port_of[r] = static_cast<std::uint32_t>(r);
  }
  auto same_node = [&](std::int32_t a, std::int32_t b) {
    return !m.node_of_rank.empty() && m.node_of_rank[static_cast<std::size_t>(a)] ==
                                          m.node_of_rank[static_cast<std::size_t>(b)];
  };
  Sim sim;
  init_common(sim, m, s.elem_size(), static_cast<std::size_t>(s.nranks), nports, footprint_of(s));
  std::vector<std::pair<std::uint32_t, std::uint32_t>> edges;
  for (std::int32_t r = 0; r < s.nranks; ++r)
    add_program(sim, s.programs[static_cast<std::size_t>(r)], static_cast<std::uint32_t>(r), edges);
  finish_graph(sim, edges);
  std::vector<MsgKey> sends, recvs;
  for (std::uint32_t id = 0; id < sim.steps.size(); ++id) {
    const Step& st = *sim.steps[id];
    const std::int64_t r = sim.rank[id];
    if (st.is_send()) {
      sends.push_back({r, st.peer, st.tag, id});
      if (!same_node(static_cast<std::int32_t>(r), st.peer)) {
        sim.inject[id] = port_of[static_cast<std::size_t>(r)];
        sim.eject[id] = port_of[static_cast<std::size_t>(st.peer)];
      }
      sim.alpha[id] = m.alpha(static_cast<std::int32_t>(r), st.peer);
      sim.link_us_per_byte[id] = us_per_byte(m.bandwidth(static_cast<std::int32_t>(r), st.peer));
    } else if (st.is_recv()) {
      recvs.push_back({st.peer, r, st.tag, id});
    }
  }
  pair_messages(sim, sends, recvs);
  CostEstimate e;
  e.time_us = sim.run();
  e.steps = sim.steps.size();
  return e;
}

// Rank 0's program stands for all ranks (see the header). For a receive
// from q the matching send is rank 0's send to mirror(q): rank q's send to
// 0 is rank 0's send to the image of 0 under q's relabelling. By the same
// symmetry the messages a rank receives occupy its receive port exactly
// when its own sends occupy its send port, so ejection needs no separate
// account here.
CostEstimate estimate_symmetric(const Schedule& s, const LinkModel& m, bool uniform) {
  const std::int32_t p = s.nranks;
  auto mirror = [&](std::int32_t q) { return s.symmetry == Symmetry::kXor ? q : (p - q) % p; };
  // Worst link of each peer offset, for non-uniform models.
  std::unordered_map<std::int32_t, std::pair<double, double>> worst;
  auto offset_link = [&](std::int32_t d) -> std::pair<double, double> {
    if (uniform) return {m.alpha(0, d), m.bandwidth(0, d)};
    auto it = worst.find(d);
    if (it != worst.end()) return it->second;
    double a = 0, bw = 0;
    for (std::int32_t r = 0; r < p; ++r) {
      const std::int32_t t = s.symmetry == Symmetry::kXor ? (r ^ d) : (r + d) % p;
      a = std::max(a, m.alpha(r, t));
      bw = r == 0 ? m.bandwidth(r, t) : std::min(bw, m.bandwidth(r, t));
    }
    return worst[d] = {a, bw};
  };
  Sim sim;
  init_common(sim, m, s.elem_size(), 1, 1, footprint_of(s));
  std::vector<std::pair<std::uint32_t, std::uint32_t>> edges;
  add_program(sim, s.programs[0], 0, edges);
  finish_graph(sim, edges);
  std::vector<MsgKey> sends, recvs;
  for (std::uint32_t id = 0; id < sim.steps.size(); ++id) {
    const Step& st = *sim.steps[id];
    if (st.is_send()) {
      sends.push_back({0, st.peer, st.tag, id});
      sim.inject[id] = 0;
      const auto [a, bw] = offset_link(st.peer);
      sim.alpha[id] = a;
      sim.link_us_per_byte[id] = us_per_byte(bw);
    } else if (st.is_recv()) {
      recvs.push_back({0, mirror(st.peer), st.tag, id});
    }
  }
  pair_messages(sim, sends, recvs);
  CostEstimate e;
  e.time_us = sim.run();
  e.steps = sim.steps.size();
  e.symmetric = true;
  return e;
}

}  // namespace

namespace {

void check_model(const Schedule& s, const LinkModel& m) {
  m.validate();
  if (m.nranks != s.nranks)
    throw Error(WIA_ERROR_INVALID_ARGUMENT, "cost model: link model has " +
                                                std::to_string(m.nranks) + " ranks, schedule " +
                                                std::to_string(s.nranks));
}

// `uniform` is m.is_uniform(), O(p^2) for matrices: computed once per call.
CostEstimate estimate_checked(const Schedule& s, const LinkModel& m, bool uniform) {
  bool all_built = true;
  for (const auto& prog : s.programs) all_built = all_built && prog.built;
  CostEstimate e;
  if (all_built) {
    e = estimate_full(s, m);
  } else if (s.symmetry != Symmetry::kNone && !s.programs.empty() && s.programs[0].built) {
    e = estimate_symmetric(s, m, uniform);
  } else {
    throw Error(WIA_ERROR_INVALID_ARGUMENT,
                "cost model: " + s.describe() +
                    " is neither fully built nor a symmetric schedule with rank 0 built");
  }
  e.time_us += m.call_overhead_us;
  return e;
}

}  // namespace

CostEstimate estimate(const Schedule& s, const LinkModel& m) {
  check_model(s, m);
  return estimate_checked(s, m, m.is_uniform());
}

CostEstimate estimate(const coll::CollArgs& args, const LinkModel& m) {
  // Rank 0 alone is cheap to build; it says whether the schedule is
  // symmetric. If it is not (or the links need the full picture), build all.
  Schedule first = coll::build_schedule(args, 0);
  check_model(first, m);
  const bool uniform = m.is_uniform();
  auto shortcut_ok = [&](const Schedule& s) {
    return s.symmetry != Symmetry::kNone && (args.nranks > kFullSimulationMaxRanks || uniform);
  };
  if (shortcut_ok(first) || args.nranks == 1) return estimate_checked(first, m, uniform);
  // Ring-like schedules lose their symmetry when some chunks are empty
  // (count < nranks * chunks) and then have O(p * count) steps on the
  // critical path anyway. For large p, cost them at one element per chunk
  // instead: the same rounds, the same latency terms, bytes rounded up.
  if (args.nranks > 64) {
    const std::uint64_t grown =
        static_cast<std::uint64_t>(args.nranks) * std::max<std::uint32_t>(first.num_chunks, 1);
    if (args.count < grown) {
      coll::CollArgs bigger = args;
      bigger.count = grown;
      Schedule approx = coll::build_schedule(bigger, 0);
      if (shortcut_ok(approx)) return estimate_checked(approx, m, uniform);
    }
  }
  return estimate_checked(coll::build_schedule(args), m, uniform);
}

namespace {
// Chunk counts to try for a pipelined algorithm: a few powers of four,
// bounded so chunks stay >= 16 KiB and the schedule small.
std::vector<std::uint32_t> chunk_candidates(std::uint64_t count, std::size_t elem_size,
                                            std::int32_t nranks) {
  const std::uint64_t bytes = count * elem_size;
  const std::uint64_t by_size = std::max<std::uint64_t>(1, bytes / (16 * 1024));
  // A pipelined tree/chain schedule has a few steps per rank and chunk:
  // keep the candidates around 16k steps.
  const std::uint64_t by_steps =
      std::max<std::uint64_t>(1, 4096 / static_cast<std::uint64_t>(nranks));
  const std::uint64_t cap = std::min({by_size, by_steps, std::max<std::uint64_t>(count, 1)});
  std::vector<std::uint32_t> out{1};
  for (std::uint64_t k = 4; k <= 64 && k <= cap; k *= 4)
    out.push_back(static_cast<std::uint32_t>(k));
  return out;
}
}  // namespace

Selection select_algorithm(coll::Collective collective, std::uint64_t count, wia_datatype_t dtype,
                           std::int32_t nranks, const LinkModel& model,
                           std::vector<Candidate>* considered) {
  coll::CollArgs args;
  args.collective = collective;
  args.dtype = dtype;
  args.count = count;
  args.nranks = nranks;
  return select_algorithm(args, model, considered);
}

namespace {

// The arguments a selection costs: the shape of `given`, SUM, root 0, out
// of place.
coll::CollArgs costed_args(const coll::CollArgs& given, const LinkModel& model,
                           const char* caller) {
  if (model.nranks != given.nranks)
    throw Error(WIA_ERROR_INVALID_ARGUMENT,
                std::string(caller) + ": link model has " + std::to_string(model.nranks) +
                    " ranks, communicator " + std::to_string(given.nranks));
  coll::CollArgs args;
  args.collective = given.collective;
  args.dtype = given.dtype;
  args.count = given.count;
  args.nranks = given.nranks;
  args.op = WIA_REDUCE_SUM;
  args.options.groups = given.options.groups;
  coll::validate_args(args);
  return args;
}

// Threads copying through one memory (Copier::kReceiver) take more chunks
// of one algorithm only when they are this much cheaper than fewer: there
// the chunks' overlap is between ranks that share the memory and the
// cores, and their hand-offs cost cache and kernel effects the model does
// not price (4 ranks in one process on 2 cores, 4 MiB: 16 chunks measured
// 1.5 - 2x the time of 1 or 4, which the model had within 0.5 %). Over
// sockets the overlap is with the kernel's socket paths, a resource of its
// own, and small gains were measured (loopback tcp, 2 processes: ring/16
// 0.90 of ring/1's time, the model 0.975).
constexpr double kThreadsChunkGain = 0.03;

// Costs `info` at the chunk counts worth trying and keeps the cheapest in
// `best` (ties keep what `best` already holds).
void cost_algorithm(const coll::AlgorithmInfo& info, coll::CollArgs args, const LinkModel& model,
                    std::vector<Candidate>* considered, Selection& best, double& best_us) {
  // Splitting a ring's blocks only overlaps transfers with local work; with
  // free local work it only adds latency terms, so it is not worth costing.
  const bool local_work_costs = model.reduce_gbps > 0 || model.copy_gbps > 0;
  std::vector<std::uint32_t> chunks{1};
  if (info.pipelined && (info.algorithm != Algorithm::kRing || local_work_costs))
    chunks = chunk_candidates(args.count, kernels::dtype_size(args.dtype), args.nranks);
  const double gain = model.copies == Copier::kReceiver ? kThreadsChunkGain : 0.0;
  double previous = -1, mine_us = 0;
  std::uint32_t mine_chunks = 0;  // this algorithm's best chunk count so far
  for (std::uint32_t k : chunks) {
    args.algorithm = info.algorithm;
    args.options.num_chunks = k;
    const CostEstimate e = estimate(args, model);
    if (considered) considered->push_back({info.algorithm, info.name, k, e.time_us});
    if (mine_chunks == 0 || e.time_us < mine_us * (1.0 - gain)) {
      mine_us = e.time_us;
      mine_chunks = k;
    }
    // Time is (about) unimodal in the chunk count: stop once it rises.
    if (previous >= 0 && e.time_us >= previous) break;
    previous = e.time_us;
  }
  if (best.name[0] == '\0' || mine_us < best_us) {
    best_us = mine_us;
    best.algorithm = info.algorithm;
    best.name = info.name;
    best.num_chunks = mine_chunks;
  }
}

}  // namespace

Selection select_algorithm(const coll::CollArgs& given, const LinkModel& model,
                           std::vector<Candidate>* considered) {
  const coll::CollArgs args = costed_args(given, model, "select_algorithm");
  Selection best;
  double best_us = 0;
  for (const coll::AlgorithmInfo* info : coll::algorithms_for(args.collective))
    if (coll::tuner_candidate(*info, args))
      cost_algorithm(*info, args, model, considered, best, best_us);
  best.estimated_ms = best_us / 1000.0;
  return best;
}

Selection select_chunks(const coll::CollArgs& given, coll::Algorithm algorithm,
                        const LinkModel& model) {
  const coll::CollArgs args = costed_args(given, model, "select_chunks");
  const coll::AlgorithmInfo* info = coll::find_algorithm(args.collective, algorithm);
  if (info == nullptr)
    throw Error(WIA_ERROR_INVALID_ARGUMENT,
                std::string("select_chunks: ") + coll::collective_name(args.collective) +
                    " has no algorithm '" + coll::algorithm_name(algorithm) + "'");
  Selection best;
  double best_us = 0;
  cost_algorithm(*info, args, model, nullptr, best, best_us);
  best.estimated_ms = best_us / 1000.0;
  return best;
}

Selector::Selector(LinkModel model, std::shared_ptr<const coll::RankGroups> groups)
    : model_(std::move(model)), groups_(std::move(groups)) {
  model_.validate();
  if (groups_ && groups_->nranks() != model_.nranks)
    throw Error(WIA_ERROR_INVALID_ARGUMENT,
                "selector: the rank grouping covers " + std::to_string(groups_->nranks()) +
                    " ranks, the link model " + std::to_string(model_.nranks));
}

std::uint32_t Selector::size_bucket(std::uint64_t count) {
  if (count < 64) return static_cast<std::uint32_t>(count);
  const int msb = std::bit_width(count) - 1;
  const auto quarter = static_cast<std::uint32_t>((count >> (msb - 2)) & 3);
  return 64 + 4 * static_cast<std::uint32_t>(msb) + quarter;
}

const Selection& Selector::select(coll::Collective collective, std::uint64_t count,
                                  wia_datatype_t dtype) {
  coll::CollArgs args;
  args.collective = collective;
  args.count = count;
  args.dtype = dtype;
  args.nranks = model_.nranks;
  args.options.groups = groups_;
  return select(args);
}

const Selection& Selector::select(const coll::CollArgs& args) {
  return lookup(args, Algorithm::kAuto);
}

const Selection& Selector::select_chunks(const coll::CollArgs& given, coll::Algorithm algorithm) {
  coll::CollArgs args = given;
  if (!args.options.groups) args.options.groups = groups_;
  return lookup(args, algorithm);
}

const Selection& Selector::lookup(const coll::CollArgs& args, coll::Algorithm algorithm) {
  const Key key{(static_cast<std::uint64_t>(algorithm) << 32) |
                    (static_cast<std::uint64_t>(size_bucket(args.count)) << 16) |
                    (static_cast<std::uint64_t>(args.collective) << 8) |
                    kernels::dtype_size(args.dtype),
                coll::rank_groups_fingerprint(args.options.groups)};
  auto it = cache_.find(key);
  if (it != cache_.end()) return it->second;
  return cache_[key] = algorithm == Algorithm::kAuto
                           ? select_algorithm(args, model_)
                           : tuner::select_chunks(args, algorithm, model_);
}

void on_one_node(LinkModel& m, int cores, NodeChannel channel) {
  cores = std::max(cores, 1);
  m.copies = Copier::kBothEnds;
  // The thread's idle share of a socket path's time is only idle CPU when
  // each rank has a core: with more ranks than cores another rank runs
  // in it, and chunks overlap nothing (4 processes on 2 cores, 64 MiB:
  // direct at 1 - 16 chunks 0.71 - 0.79 GB/s, 64 KiB messages 0.31 - 0.35).
  const bool sockets = channel == NodeChannel::kKernelSockets;
  m.socket_share = sockets ? kLoopbackTcpSocketShare : 0.0;
  m.thread_share = !sockets           ? 1.0
                   : m.nranks > cores ? kLoopbackTcpSocketShare
                                      : kLoopbackTcpThreadShare;
  m.cpu_share = m.nranks > cores ? static_cast<double>(cores) / m.nranks : 1.0;
  m.reduce_gbps = kHostReduceGbps;
  m.copy_gbps = kHostCopyGbps;
  if (!sockets) {
    // Through shm rings the threads' copies are loads and stores, as
    // threads' are: cached when the buffers are (the kernel's socket
    // paths run at their measured rate whatever the size).
    m.cache_bytes = static_cast<double>(last_level_cache_bytes());
    m.cache_speedup = kHostCacheSpeedup;
    m.l2_bytes = static_cast<double>(cpu_cache_bytes(2)) * std::min(m.nranks, cores);
    m.l2_speedup = kHostL2Speedup;
  }
}

double ring_allreduce_us(std::int32_t p, double bytes, double alpha_us, double gbps) {
  const double beta = us_per_byte(gbps);
  return 2.0 * (p - 1) * alpha_us + 2.0 * (p - 1) / p * bytes * beta;
}

double tree_allreduce_us(std::int32_t p, double bytes, double alpha_us, double gbps) {
  return 2.0 * std::log2(static_cast<double>(p)) * alpha_us + 2.0 * bytes * us_per_byte(gbps);
}

double rabenseifner_allreduce_us(std::int32_t p, double bytes, double alpha_us, double gbps) {
  const double beta = us_per_byte(gbps);
  return 2.0 * std::log2(static_cast<double>(p)) * alpha_us + 2.0 * (p - 1) / p * bytes * beta;
}

}  // namespace wia::tuner
