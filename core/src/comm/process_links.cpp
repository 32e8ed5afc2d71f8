// SPDX-License-Identifier: Apache-2.0
// The link model the process communicator's tuner costs schedules with,
// built alike on every rank at the end of set-up: the transports' figures,
// replaced by measured ones (tuner.link_file) when every rank read the
// same, or by a probe of the link between nodes; then the NIC sharing and
// the per-message overheads.
#include <fmt/format.h>

#include <algorithm>
#include <utility>

#include "comm/process_internal.hpp"
#include "comm/transport_choice.hpp"
#include "common/cpus.hpp"
#include "common/error.hpp"
#include "common/log.hpp"
#include "provider/registry.hpp"
#include "provider/transport_call.hpp"
#include "tuner/link_file.hpp"

namespace wia::comm {

namespace {

// Per-message cost the tuner charges when a node's ranks outnumber its
// cores (see build_link_model).
constexpr double kOversubscribedMessageOverheadUs = 5.0;

// Waits for a transport request, bounded.
void wait_request(const engine::NetLink& l, wia_request_t r, Clock::time_point deadline,
                  const char* what) {
  for (std::uint32_t spin = 0;; ++spin) {
    std::int32_t done = 0;
    std::uint64_t size = 0;
    transport_call(
        *l.provider, fmt::format("{} with {}", what, l.peer),
        [&](const wia_transport_ops_v1_t& t, void* ctx) { return t.test(ctx, r, &done, &size); });
    if (done) return;
    if (Clock::now() > deadline)
      throw Error(WIA_ERROR_TIMEOUT, fmt::format("{} with {} timed out", what, l.peer));
    if (spin > 256) sleep_us(20);
  }
}

// Measures one link: latency from 8-byte round trips, bandwidth from 1 MiB
// messages. Both ends call it; `initiator` times. Returns {alpha_us, GB/s}
// on the initiator, {0, 0} on the other end.
std::pair<double, double> probe_link(const engine::NetLink& l, bool initiator,
                                     Clock::time_point deadline) {
  constexpr std::uint64_t kTag = 1ull << 35;
  constexpr int kPings = 20, kMessages = 8;
  constexpr std::size_t kBytes = 1 << 20;
  std::vector<char> small(8), big(kBytes);
  auto send = [&](const void* buf, std::size_t n) {
    wia_request_t r = nullptr;
    while (!r)
      transport_call(*l.provider, "isend(probe)", [&](const wia_transport_ops_v1_t& t, void* ctx) {
        return t.isend(ctx, l.conn, buf, n, kTag, nullptr, &r);
      });
    wait_request(l, r, deadline, "probe");
  };
  auto recv = [&](void* buf, std::size_t n) {
    wia_request_t r = nullptr;
    while (!r)
      transport_call(*l.provider, "irecv(probe)", [&](const wia_transport_ops_v1_t& t, void* ctx) {
        return t.irecv(ctx, l.conn, buf, n, kTag, nullptr, &r);
      });
    wait_request(l, r, deadline, "probe");
  };
  std::vector<double> rtt;
  for (int i = 0; i < kPings; ++i) {
    const auto t0 = Clock::now();
    if (initiator) {
      send(small.data(), 8);
      recv(small.data(), 8);
    } else {
      recv(small.data(), 8);
      send(small.data(), 8);
    }
    rtt.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
  }
  const auto t0 = Clock::now();
  for (int i = 0; i < kMessages; ++i)
    initiator ? send(big.data(), kBytes) : recv(big.data(), kBytes);
  initiator ? recv(small.data(), 8) : send(small.data(), 8);
  const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  if (!initiator) return {0, 0};
  std::sort(rtt.begin(), rtt.end());
  const double alpha = rtt[rtt.size() / 2] / 2;
  return {alpha, kMessages * double(kBytes) / 1e9 / std::max(1e-9, secs - alpha * 1e-6)};
}

}  // namespace

MeasuredLinks read_measured_links(const Config& config, int nranks) {
  MeasuredLinks m;
  m.path = config.get_string("tuner.link_file");
  if (m.path.empty() || nranks < 2) return m;
  try {
    const topo::Topology t = topo::load_yaml(m.path);
    if (t.n != nranks) {
      m.why_not =
          fmt::format("{} has {} device(s), this communicator has {} ranks", m.path, t.n, nranks);
      return m;
    }
    std::vector<int> device_of_rank(static_cast<std::size_t>(nranks));
    for (int r = 0; r < nranks; ++r) device_of_rank[static_cast<std::size_t>(r)] = r;
    m.model = tuner::link_model_from_topology(t, device_of_rank, m.path);
  } catch (const Error& e) {
    m.why_not = e.what();
    m.bad_file = true;
    return m;
  }
  // FNV-1a over the figures every rank will cost schedules with.
  std::uint64_t h = 1469598103934665603ull;
  auto mix = [&](const std::vector<double>& v) {
    const auto* b = reinterpret_cast<const unsigned char*>(v.data());
    for (std::size_t i = 0; i < v.size() * sizeof(double); ++i) h = (h ^ b[i]) * 1099511628211ull;
  };
  mix(m.model->alpha_matrix_us);
  mix(m.model->gbps_matrix);
  m.digest = h == 0 ? 1 : h;
  return m;
}

void ProcessCommunicator::build_link_model(const MeshSetup& s, std::chrono::milliseconds timeout) {
  // Every rank costs schedules with the same model: built from the
  // gathered records, not from local measurements.
  double overhead = 0, inter_gbps = 0;
  tuner::LinkModel model = model_from_transports(s, overhead, inter_gbps);
  const bool use_measured = adopt_measured_links(s, model, inter_gbps);
  if (layout_.nnodes > 1 && probe_inter_node_ && !use_measured)
    probe_inter_node_link(model, inter_gbps, timeout);
  if (layout_.nnodes > 1) {
    // Ranks of a node share its NIC, as on CPU clusters: the tuner then
    // sees why a hierarchical all-reduce wins over a slow network.
    model.node_of_rank = layout_.node_of_rank;
    model.nic_of_rank = layout_.node_of_rank;
    model.port_gbps = inter_gbps;
    groups_ = std::make_shared<const coll::RankGroups>(layout_.node_of_rank);
  } else {
    model.port_gbps = 0;
  }
  // With more ranks on the node than cores, every message is a hand-off
  // to a process that may not be running: a yield and a context switch.
  // Charging it keeps the tuner from splitting vectors into many small
  // messages: with 4 processes on 2 cores, 1 MiB all-reduces ran 10-25%
  // faster with 5 us charged (20 us over-corrected: 64 KiB got slower).
  if (oversubscribed_) overhead = std::max(overhead, kOversubscribedMessageOverheadUs);
  model.message_overhead_us = overhead;
  model.reduce_gbps = 8.0;
  model.copy_gbps = 10.0;
  window_model_.reset();
  if (layout_.nnodes == 1) {
    // On one node the ranks' CPUs move every byte (shm rings, loopback
    // tcp), and all-reduces through node-shared windows are loads and
    // stores like threads' (tuner::on_one_node, LinkModel::host_threads).
    const auto [local, cpus] = node_ranks_and_cpus(s.records, layout_);
    const int cores = cpus > 0 ? cpus : usable_cpu_count();
    // Over loopback tcp the kernel's socket paths carry the bytes beside
    // the ranks' threads (tuner::NodeChannel): pipelining then overlaps
    // the transfers with the reductions.
    bool sockets = layout_.size > 1;
    for (int a = 0; a < layout_.size; ++a)
      for (int b = 0; b < layout_.size; ++b)
        if (a != b && link_transport_[static_cast<std::size_t>(a) * layout_.size + b] != "tcp")
          sockets = false;
    tuner::on_one_node(
        model, cores,
        sockets ? tuner::NodeChannel::kKernelSockets : tuner::NodeChannel::kSharedMemory);
    // A window read is a memcpy's, not a shm message's (wia-bw measures
    // those: a ring's two copies and protocol), so the link file does not
    // scale it.
    if (windows_) window_model_ = tuner::LinkModel::node_windows(layout_.size, cores);
  }
  selector_ = std::make_unique<tuner::Selector>(std::move(model), groups_);
}

tuner::LinkModel ProcessCommunicator::model_from_transports(const MeshSetup& s,
                                                            double& message_overhead_us,
                                                            double& inter_gbps) {
  const int p = layout_.size;
  tuner::LinkModel model = tuner::LinkModel::uniform(p, 1.0, 10.0);
  model.alpha_matrix_us.assign(static_cast<std::size_t>(p) * p, 1.0);
  model.gbps_matrix.assign(static_cast<std::size_t>(p) * p, 10.0);
  link_transport_.assign(static_cast<std::size_t>(p) * p, std::string());
  forced_transports_.clear();
  // Only a forced transport or a user's rule can differ from the defaults.
  const bool configured = s.rules.user_rules() > 0;
  for (int a = 0; a < p; ++a)
    for (int b = 0; b < p; ++b) {
      if (a == b) continue;
      const bool same_node = layout_.node_of_rank[a] == layout_.node_of_rank[b];
      const selector::Choice choice = s.choose(layout_, a, b);
      const std::string& transport = choice.transport;
      link_transport_[static_cast<std::size_t>(a) * p + b] = transport;
      if (configured) {
        const selector::Choice by_default = s.choose_by_default(layout_, a, b);
        if (by_default.ok() && by_default.transport != transport)
          forced_transports_.push_back(
              {a, b, transport, by_default.transport, choice.rule, same_node});
      }
      const TransportFigures f = transport_figures(transport, same_node);
      model.alpha_matrix_us[static_cast<std::size_t>(a) * p + b] = f.alpha_us;
      model.gbps_matrix[static_cast<std::size_t>(a) * p + b] = f.gbps;
      message_overhead_us = std::max(message_overhead_us, f.message_overhead_us);
      if (!same_node) inter_gbps = f.gbps;
    }
  return model;
}

bool ProcessCommunicator::adopt_measured_links(const MeshSetup& s, tuner::LinkModel& model,
                                               double& inter_gbps) {
  // Measured links (wia-bw --procs --output, tuner.link_file) replace the
  // transport figures, and the probe, when every rank read the same
  // figures for exactly this communicator's ranks; otherwise no rank uses
  // them, so that all ranks still cost schedules alike.
  const int me = layout_.rank;
  const int p = layout_.size;
  const std::vector<RankRecord>& records = s.records;
  const MeasuredLinks& measured = s.measured;
  int differs = -1;
  for (int r = 1; r < p && differs < 0; ++r)
    if (records[r].link_file_digest != records[0].link_file_digest) differs = r;
  const bool use_measured = measured.model.has_value() && differs < 0;
  if (use_measured) {
    model.alpha_matrix_us = measured.model->alpha_matrix_us;
    model.gbps_matrix = measured.model->gbps_matrix;
    // A NIC carries at least what one link was measured to carry alone.
    inter_gbps = 0;
    double gbps_lo = 0, gbps_hi = 0, us_lo = 0, us_hi = 0;
    for (int a = 0; a < p; ++a)
      for (int b = 0; b < p; ++b) {
        if (a == b) continue;
        const double g = model.bandwidth(a, b), us = model.alpha(a, b);
        const bool first = gbps_hi == 0;
        gbps_lo = first ? g : std::min(gbps_lo, g), gbps_hi = std::max(gbps_hi, g);
        us_lo = first ? us : std::min(us_lo, us), us_hi = std::max(us_hi, us);
        if (layout_.node_of_rank[a] != layout_.node_of_rank[b])
          inter_gbps = std::max(inter_gbps, g);
      }
    if (me == 0)
      log::info("comm",
                "communicator of {} ranks: link figures from {} (tuner.link_file, "
                "measured): {:.4g}..{:.4g} GB/s, {:.4g}..{:.4g} us",
                p, measured.path, gbps_lo, gbps_hi, us_lo, us_hi);
  } else if ((differs >= 0 || !measured.path.empty()) && p > 1 && me == 0) {
    const std::string defaults =
        layout_.nnodes > 1 && probe_inter_node_
            ? "the transports' default figures (links between nodes probed)"
            : "the transports' default figures";
    if (differs >= 0)
      log::warn("comm",
                "communicator of {} ranks: {}, not measured links (tuner.link_file): "
                "rank {} read other figures than rank 0 ('{}'), or none",
                p, defaults, differs, measured.path);
    else if (measured.bad_file)
      log::warn("comm", "communicator of {} ranks: {}: tuner.link_file not used: {}", p, defaults,
                measured.why_not);
    else
      log::info("comm", "communicator of {} ranks: {}: tuner.link_file not used: {}", p, defaults,
                measured.why_not);
  }
  return use_measured;
}

void ProcessCommunicator::probe_inter_node_link(tuner::LinkModel& model, double& inter_gbps,
                                                std::chrono::milliseconds timeout) {
  // Figures for links between nodes are measured, not assumed: the first
  // ranks of nodes 0 and 1 time their link and everyone adopts the
  // result, so a slow or shaped network is seen for what it is.
  const int me = layout_.rank;
  const int p = layout_.size;
  int a = -1, b = -1;
  for (int r = 0; r < p; ++r) {
    if (a < 0 && layout_.node_of_rank[r] == 0) a = r;
    if (b < 0 && layout_.node_of_rank[r] == 1) b = r;
  }
  std::pair<double, double> measured{0, 0};
  const auto probe_deadline = Clock::now() + timeout;
  if (me == a) measured = probe_link(peers_[b].link, true, probe_deadline);
  if (me == b) probe_link(peers_[a].link, false, probe_deadline);
  // Rank a tells every other rank what it measured (16 bytes each), over
  // the links just made: only this communicator's ranks take part.
  double got_m[2] = {measured.first, measured.second};
  constexpr std::uint64_t kProbeResultTag = (1ull << 35) | 1;
  for (int q = 0; q < p; ++q) {
    if (q == me || (me != a && q != a)) continue;
    const engine::NetLink& l = peers_[q].link;
    wia_request_t r = nullptr;
    while (!r)
      transport_call(*l.provider, "probe result", [&](const wia_transport_ops_v1_t& t, void* ctx) {
        return me == a ? t.isend(ctx, l.conn, got_m, sizeof(got_m), kProbeResultTag, nullptr, &r)
                       : t.irecv(ctx, l.conn, got_m, sizeof(got_m), kProbeResultTag, nullptr, &r);
      });
    wait_request(l, r, probe_deadline, "probe result");
  }
  const std::pair<double, double> got{got_m[0], got_m[1]};
  if (got.second > 0) {
    for (int x = 0; x < p; ++x)
      for (int y = 0; y < p; ++y)
        if (x != y && layout_.node_of_rank[x] != layout_.node_of_rank[y]) {
          model.alpha_matrix_us[static_cast<std::size_t>(x) * p + y] = got.first;
          model.gbps_matrix[static_cast<std::size_t>(x) * p + y] = got.second;
        }
    inter_gbps = got.second;
    log::info("comm", "link between nodes measured: {:.1f} us, {:.3f} GB/s", got.first, got.second);
  }
}

}  // namespace wia::comm
