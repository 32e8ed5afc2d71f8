// SPDX-License-Identifier: Apache-2.0
// The process communicator's set-up (connect_mesh): listen on every
// loaded transport, exchange one record per rank, choose each link's
// transport, connect, open the control channel and map the node-shared
// windows; the link model it ends with is in process_links.cpp.
#include <fmt/format.h>
#include <sched.h>

#include <algorithm>
#include <bit>
#include <cstring>
#include <utility>

#include "comm/node_windows.hpp"
#include "comm/process_internal.hpp"
#include "comm/transport_choice.hpp"
#include "discovery/transports.hpp"
#include "common/error.hpp"
#include "common/log.hpp"
#include "provider/registry.hpp"
#include "provider/transport_call.hpp"
#include "runtime/objects.hpp"
#include "runtime/runtime.hpp"

namespace wia::comm {

std::pair<int, int> node_ranks_and_cpus(const std::vector<RankRecord>& records,
                                        const ProcessLayout& layout) {
  std::uint64_t cpus[kCpuWords] = {};
  int local = 0;
  for (int r = 0; r < layout.size; ++r) {
    if (layout.node_of_rank[r] != layout.node_of_rank[layout.rank]) continue;
    ++local;
    for (int w = 0; w < kCpuWords; ++w) cpus[w] |= records[r].cpus[w];
  }
  int count = 0;
  for (const std::uint64_t w : cpus) count += std::popcount(w);
  return {local, count};
}

namespace {

// What a rank can use, from its record (every rank derives the same).
selector::TransportAvailability availability_of(const RankRecord& r) {
  selector::TransportAvailability a;
  for (std::uint32_t i = 0; i < std::min<std::uint32_t>(r.count, kMaxTransports); ++i) {
    selector::TransportState st;
    st.loaded = true;
    st.endpoint_flags = r.slots[i].endpoint_flags;
    st.endpoints = 1;
    a.set(std::string(r.slots[i].name, strnlen(r.slots[i].name, sizeof(r.slots[i].name))), st);
  }
  return a;
}

selector::LinkInfo link_info(const RankRecord& ra, int a, const RankRecord& rb, int b,
                             bool same_node) {
  // Same node is the layout's verdict (host ids); names are for groups.
  selector::EndpointInfo ea{same_node ? "node" : std::string(ra.host), "", a, -1};
  selector::EndpointInfo eb{same_node ? "node" : std::string(rb.host), "", b, -1};
  selector::LinkInfo l = selector::link_between(ea, eb, false);
  l.node_a = ra.host;
  l.node_b = rb.host;
  l.device_a = fmt::format("{}/rank{}", ra.host, a);
  l.device_b = fmt::format("{}/rank{}", rb.host, b);
  return l;
}

const HandleSlot* find_slot(const RankRecord& r, const std::string& name) {
  for (std::uint32_t i = 0; i < std::min<std::uint32_t>(r.count, kMaxTransports); ++i)
    if (name == std::string(r.slots[i].name, strnlen(r.slots[i].name, sizeof(r.slots[i].name))))
      return &r.slots[i];
  return nullptr;
}

}  // namespace

const ProcessCommunicator::MeshSetup::Listening* ProcessCommunicator::MeshSetup::listening_on(
    const std::string& name) const {
  for (auto& l : listening)
    if (l.provider->name() == name) return &l;
  return nullptr;
}

selector::Choice ProcessCommunicator::MeshSetup::choose(const ProcessLayout& layout, int a,
                                                        int b) const {
  const bool same_node = layout.node_of_rank[a] == layout.node_of_rank[b];
  return selector::choose(rules, link_info(records[a], a, records[b], b, same_node),
                          selector::TransportAvailability::intersect(avail[a], avail[b]));
}

selector::Choice ProcessCommunicator::MeshSetup::choose_by_default(const ProcessLayout& layout,
                                                                   int a, int b) const {
  static const selector::RuleSet defaults = selector::default_rules();
  const bool same_node = layout.node_of_rank[a] == layout.node_of_rank[b];
  return selector::choose(defaults, link_info(records[a], a, records[b], b, same_node),
                          selector::TransportAvailability::intersect(avail[a], avail[b]));
}

void ProcessCommunicator::MeshSetup::close_listeners() noexcept {
  for (auto& l : listening) l.provider->transport()->close_listener(l.provider->ctx(), l.listener);
  listening.clear();
}

void ProcessCommunicator::connect_mesh(Exchange& exchange, std::chrono::milliseconds timeout,
                                       const std::string& preferred_inter_node) {
  peers_.resize(layout_.size);
  MeshSetup s;
  try {
    listen_on_transports(s);
    describe_this_rank(s);
    open_recovery_listener(s);
    exchange_records(exchange, s);
    adopt_recovery_addresses(s);
    check_compression_keys(s);
    note_oversubscription(s);
    choose_link_transports(s, preferred_inter_node);
    connect_peers(s, exchange, timeout);
  } catch (...) {
    s.close_listeners();
    throw;
  }
  s.close_listeners();
  open_control_channel();
  if (layout_.nnodes == 1 && layout_.size > 1) share_node_windows(exchange, s);
  build_link_model(s, timeout);
}

void ProcessCommunicator::listen_on_transports(MeshSetup& s) {
  Runtime& rt = Runtime::get();
  const int me = layout_.rank;
  const bool multi_node = layout_.nnodes > 1;
  RankRecord& mine = s.mine;
  mine.magic = kRecordMagic;
  for (const auto& prov : rt.providers().loaded()) {
    if (!prov->transport() || s.listening.size() == kMaxTransports) continue;
    if (prov->name().size() >= sizeof(HandleSlot::name)) continue;
    const std::int32_t ep = choose_endpoint(*prov, multi_node);
    if (ep < 0) continue;
    HandleSlot& slot = mine.slots[mine.count];
    wia_listener_t listener = nullptr;
    try {
      transport_call(*prov, "listen", [&](const wia_transport_ops_v1_t& t, void* ctx) {
        return t.listen(ctx, ep, slot.handle, &listener);
      });
    } catch (const Error& e) {
      log::warn("comm", "rank {}: transport {} cannot listen, not used: {}", me, prov->name(),
                e.what());
      continue;
    }
    std::memcpy(slot.name, prov->name().c_str(), prov->name().size());
    wia_transport_props_v1_t props{};
    props.struct_size = sizeof(props);
    if (prov->transport()->endpoint_props(prov->ctx(), ep, &props) == WIA_SUCCESS)
      slot.endpoint_flags = props.flags;
    s.listening.push_back({prov.get(), ep, listener});
    ++mine.count;
  }
}

void ProcessCommunicator::describe_this_rank(MeshSetup& s) {
  Runtime& rt = Runtime::get();
  const int me = layout_.rank;
  const int p = layout_.size;
  RankRecord& mine = s.mine;
  if (cpu_set_t set; sched_getaffinity(0, sizeof set, &set) == 0)
    for (int c = 0; c < kCpuWords * 64 && c < CPU_SETSIZE; ++c)
      if (CPU_ISSET(c, &set)) mine.cpus[c / 64] |= 1ull << (c % 64);
  const std::string& host = layout_.host_of_rank.empty() ? std::string() : layout_.host_of_rank[me];
  std::memcpy(mine.host, host.data(), std::min(host.size(), sizeof(mine.host) - 1));
  const Config& config = rt.config();
  const std::string keys = fmt::format(
      "pipeline_segment_bytes {}, across_hosts {}, link_codec {}, link_codec_min_bytes {}",
      config.get_int("compression.pipeline_segment_bytes"),
      config.get_bool("compression.across_hosts") ? "true" : "false",
      config.get_string("compression.link_codec"),
      config.get_int("compression.link_codec_min_bytes"));
  std::memcpy(mine.compression_keys, keys.data(),
              std::min(keys.size(), sizeof(mine.compression_keys) - 1));
  // Read before the exchange, so that every rank learns whether all of
  // them hold the same measured figures.
  s.measured = read_measured_links(rt.config(), p);
  mine.link_file_digest = s.measured.digest;
  // Ranks on one node may share windows (engine/window_allreduce.hpp); the
  // handles travel with the records.
  const auto window_chunk =
      static_cast<std::uint64_t>(rt.config().get_int("collectives.node_window_chunk_bytes"));
  if (layout_.nnodes == 1 && p > 1 && window_chunk > 0) {
    std::string why;
    windows_ = NodeWindowSet::create(rt.device(device_), me, p, window_chunk, why);
    if (windows_) {
      mine.has_window = 1;
      mine.window = windows_->handle();
      mine.window_chunk_bytes = window_chunk;
      mine.window_max_bytes = node_window_max_bytes_;
      mine.one_shot_max_bytes = one_shot_max_bytes_;
      mine.window_one_shot_peer_bytes = node_window_one_shot_peer_bytes_;
    } else {
      log::info("comm", "rank {}: no node-shared window: {}", me, why);
    }
  }
}

// Ranks whose compression.* keys differ would post different collectives
// for one compressed call (segments, the split across hosts, a plain
// all-reduce turned compressed) and meet only at the timeout. Every rank
// sees every record, so every rank finds the same difference: compressed
// calls then fail at once on all of them, naming it, and plain all-reduces
// stay plain (api/compress_across_hosts.cpp).
void ProcessCommunicator::check_compression_keys(const MeshSetup& s) {
  compression_keys_differ_.clear();
  const auto text = [](const RankRecord& r) {
    return std::string(r.compression_keys,
                       strnlen(r.compression_keys, sizeof(r.compression_keys)));
  };
  for (int r = 1; r < layout_.size; ++r)
    if (text(s.records[r]) != text(s.records[0])) {
      compression_keys_differ_ = fmt::format(
          "the compression.* keys differ across ranks (rank {}: {}; rank 0: {}): they decide "
          "which collectives a compressed call posts and must be the same on every rank",
          r, text(s.records[r]), text(s.records[0]));
      if (layout_.rank == 0) log::warn("comm", "{}", compression_keys_differ_);
      return;
    }
}

void ProcessCommunicator::exchange_records(Exchange& exchange, MeshSetup& s) {
  const int p = layout_.size;
  std::vector<std::uint8_t> blob(sizeof(RankRecord));
  std::memcpy(blob.data(), &s.mine, sizeof(s.mine));
  const std::vector<std::uint8_t> all = exchange.all_gather(blob);
  s.records.resize(p);
  for (int r = 0; r < p; ++r) {
    std::memcpy(&s.records[r], all.data() + r * sizeof(RankRecord), sizeof(RankRecord));
    if (s.records[r].magic != kRecordMagic)
      throw Error(WIA_ERROR_REMOTE, fmt::format("rank {} sent a malformed connection record", r));
  }
}

void ProcessCommunicator::note_oversubscription(const MeshSetup& s) {
  // Whether the node's ranks outnumber the CPUs they may run on, all of
  // them together: ranks confined to fewer CPUs than there are ranks (a
  // container's cpuset, taskset) are oversubscribed on a machine of many
  // cores, and ranks bound one per core are not.
  if (const auto [local, cpus] = node_ranks_and_cpus(s.records, layout_); cpus > 0) {
    oversubscribed_ = local > cpus;
    log::info("comm", "rank {}: {} rank(s) on this node may run on {} CPU(s){}", layout_.rank,
              local, cpus, oversubscribed_ ? ": oversubscribed, waits yield and sleep" : "");
  }  // else unknown: the constructor's count of online CPUs stands
}

void ProcessCommunicator::choose_link_transports(MeshSetup& s,
                                                 const std::string& preferred_inter_node) {
  // Choose each link's transport with the selector's rules (YAML
  // selector.rules, WIA_TRANSPORT, the defaults), from what both ends
  // published, so that every rank computes the same choice for every link.
  Runtime& rt = Runtime::get();
  const int me = layout_.rank;
  const int p = layout_.size;
  // Names are checked against what this process loaded, so a vendor's own
  // transport provider can be named in rules and WIA_TRANSPORT.
  const auto loaded_here = discovery::transport_availability(rt.providers());
  s.rules = selector::load_rules_or_defaults(rt.config(), &loaded_here);
  if (!preferred_inter_node.empty()) {
    // The distributed config's backend: first for links between nodes,
    // falling back to the rules after it.
    selector::Rule r;
    r.name = "network_backend";
    r.where = "wia_distributed_config_t.network_backend";
    r.match.classes = selector::class_bit(selector::LinkClass::kDifferentNodes);
    r.transports.push_back({preferred_inter_node, {}});
    s.rules.rules.insert(s.rules.rules.begin(), r);
  }
  for (int r = 0; r < p; ++r) s.avail.push_back(availability_of(s.records[r]));
  for (int q = 0; q < p; ++q) {
    if (q == me) continue;
    const selector::Choice choice = s.choose(layout_, me, q);
    if (!choice.ok()) {
      std::string local;
      for (const char* t : {"shm", "tcp", "ofi", "verbs"})
        if (!s.listening_on(t))
          local += fmt::format("; here {}: {}", t, transport_unavailable_reason(t));
      throw Error(WIA_ERROR_UNAVAILABLE,
                  fmt::format("rank {} -> rank {}: no usable transport: {}{}", me, q,
                              choice.describe(), local));
    }
    peers_[q].transport = choice.transport;
    peers_[q].link.provider = s.listening_on(choice.transport)->provider;
    peers_[q].link.peer =
        fmt::format("rank {} (node {}, {})", q, layout_.node_of_rank[q], choice.transport);
    log::debug("comm", "rank {} -> rank {}: {}", me, q, choice.describe());
  }
  // A rule's compress key, for the links between nodes: the same on every
  // rank (the first pair of ranks on two nodes, in rank order, whose rule
  // has one), as every rank must post the same collectives.
  link_compress_.reset();
  for (int a = 0; a < p && !link_compress_; ++a)
    for (int b = a + 1; b < p && !link_compress_; ++b)
      if (layout_.node_of_rank[a] != layout_.node_of_rank[b])
        link_compress_ = s.choose(layout_, a, b).compress;
  if (link_compress_)
    log::info("comm", "rank {}: float32 all-reduces compress between nodes: {} ({})", me,
              link_compress_->describe(), link_compress_->where);
}

void ProcessCommunicator::connect_peers(MeshSetup& s, Exchange& exchange,
                                        std::chrono::milliseconds timeout) {
  const int me = layout_.rank;
  const int p = layout_.size;
  const auto deadline = Clock::now() + timeout;
  auto next_look = Clock::now();
  int missing = p - 1;
  std::vector<wia_conn_t> pending(p, nullptr);
  try {
    while (missing > 0) {
      bool progressed = false;
      for (int q = me + 1; q < p; ++q) {
        Peer& peer = peers_[q];
        if (peer.link.conn) continue;
        const MeshSetup::Listening* l = s.listening_on(peer.transport);
        const HandleSlot* slot = find_slot(s.records[q], peer.transport);
        const wia_status_t st =
            transport_call(*l->provider, fmt::format("connect to rank {}", q),
                           [&](const wia_transport_ops_v1_t& t, void* ctx) {
                             return t.connect(ctx, l->endpoint, slot->handle,
                                              static_cast<std::uint64_t>(me), &pending[q]);
                           });
        if (st == WIA_SUCCESS) {
          peer.link.conn = pending[q];
          peer.link.endpoint = l->endpoint;
          pending[q] = nullptr;
          --missing;
          progressed = true;
        }
      }
      for (auto& l : s.listening) {
        std::uint64_t cookie = 0;
        wia_conn_t conn = nullptr;
        const wia_status_t st =
            transport_call(*l.provider, "accept", [&](const wia_transport_ops_v1_t& t, void* ctx) {
              return t.accept(ctx, l.listener, &cookie, &conn);
            });
        if (st != WIA_SUCCESS || !conn) continue;
        progressed = true;
        const int q = static_cast<int>(cookie);
        if (cookie >= static_cast<std::uint64_t>(me) || peers_[q].link.conn ||
            peers_[q].transport != l.provider->name()) {
          log::warn("comm", "rank {}: unexpected connection on {} (cookie {}), closed", me,
                    l.provider->name(), cookie);
          l.provider->transport()->close(l.provider->ctx(), conn);
          continue;
        }
        peers_[q].link.conn = conn;
        peers_[q].link.endpoint = l.endpoint;
        --missing;
      }
      if (missing == 0) break;
      if (Clock::now() > deadline) {
        std::string who;
        for (int q = 0; q < p; ++q)
          if (q != me && !peers_[q].link.conn)
            who += fmt::format("{}{} ({})", who.empty() ? "" : ", ", q, peers_[q].transport);
        throw Error(WIA_ERROR_TIMEOUT,
                    fmt::format("rank {}: no connection to rank(s) {} within {} ms", me, who,
                                timeout.count()));
      }
      if (!progressed && Clock::now() >= next_look) {
        next_look = Clock::now() + std::chrono::milliseconds(5);
        if (const std::string why = exchange.abandoned(); !why.empty())
          throw Error(WIA_ERROR_REMOTE,
                      fmt::format("rank {}: the set-up was given up while connecting: {}", me, why));
      }
      if (!progressed) sleep_us(50);
    }
  } catch (...) {
    for (int q = 0; q < p; ++q)
      if (pending[q])
        peers_[q].link.provider->transport()->close(peers_[q].link.provider->ctx(), pending[q]);
    s.close_listeners();
    close_all();
    throw;
  }
}

void ProcessCommunicator::open_control_channel() {
  // One receive always posted per peer.
  for (int q = 0; q < layout_.size; ++q)
    if (q != layout_.rank) post_control_recv(peers_[q]);
}

void ProcessCommunicator::share_node_windows(Exchange& exchange, const MeshSetup& s) {
  const int me = layout_.rank;
  const int p = layout_.size;
  const std::vector<RankRecord>& records = s.records;
  std::vector<wia_ipc_handle_t> handles(p);
  bool every_rank_has_one = true;
  int differs = -1;
  for (int r = 0; r < p; ++r) {
    handles[r] = records[r].window;
    every_rank_has_one &= records[r].has_window == 1;
    if (records[r].has_window == 1 && records[0].has_window == 1 && differs < 0 &&
        (records[r].window_chunk_bytes != records[0].window_chunk_bytes ||
         records[r].window_max_bytes != records[0].window_max_bytes ||
         records[r].one_shot_max_bytes != records[0].one_shot_max_bytes ||
         records[r].window_one_shot_peer_bytes != records[0].window_one_shot_peer_bytes))
      differs = r;
  }
  if (differs >= 0) {
    every_rank_has_one = false;
    if (me == 0)
      log::warn("comm",
                "communicator of {} ranks: node-shared windows not used: rank {} has other "
                "collectives.node_window_chunk_bytes / node_window_max_bytes / "
                "one_shot_max_bytes / node_window_one_shot_peer_bytes than rank 0 ({} / {} / {} "
                "/ {} vs {} / {} / {} / {})",
                p, differs, records[differs].window_chunk_bytes, records[differs].window_max_bytes,
                records[differs].one_shot_max_bytes, records[differs].window_one_shot_peer_bytes,
                records[0].window_chunk_bytes, records[0].window_max_bytes,
                records[0].one_shot_max_bytes, records[0].window_one_shot_peer_bytes);
  }
  // Only over links that stay inside the node: a configuration that
  // chose a network transport on one node (tests, operators comparing
  // transports) gets that transport for every collective.
  for (int q = 0; q < p; ++q) {
    if (q == me) continue;
    const HandleSlot* slot = find_slot(records[q], peers_[q].transport);
    const std::uint32_t f = slot ? slot->endpoint_flags : 0;
    if (!(f & WIA_TRANSPORT_FLAG_INTRA_NODE) || (f & WIA_TRANSPORT_FLAG_INTER_NODE))
      every_rank_has_one = false;
  }
  try {
    map_node_windows(exchange, handles, every_rank_has_one);
  } catch (...) {
    close_all();
    throw;
  }
}

void ProcessCommunicator::map_node_windows(Exchange& exchange,
                                           const std::vector<wia_ipc_handle_t>& handles,
                                           bool every_rank_has_one) {
  const int me = layout_.rank;
  std::string why;
  bool ok = windows_ && every_rank_has_one;
  if (ok && !windows_->open_peers(handles, why)) {
    ok = false;
    log::info("comm", "rank {}: node-shared windows not used: {}", me, why);
  }
  // Used only if every rank mapped every window: all ranks must take the
  // same path for every collective.
  const std::vector<std::uint8_t> all = exchange.all_gather({static_cast<std::uint8_t>(ok)});
  for (int r = 0; r < layout_.size; ++r)
    if (all[static_cast<std::size_t>(r)] != 1) ok = false;
  if (!ok) {
    windows_.reset();
    return;
  }
  windows_->windows().sources = windows_.get();
  windows_->windows().zero_copy_min_bytes = node_window_zero_copy_min_bytes_;
  if (me == 0)
    log::debug("comm", "communicator of {} ranks: all-reduces through node-shared windows of {} B",
               layout_.size, engine::NodeWindows::window_bytes(windows_->windows().chunk_bytes));
}

}  // namespace wia::comm
