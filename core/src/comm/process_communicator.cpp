// SPDX-License-Identifier: Apache-2.0
#include "comm/process_communicator.hpp"

#include <sched.h>
#include <time.h>

#include <algorithm>
#include <bit>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <optional>
#include <thread>
#include <utility>

#include <fmt/format.h>

#include "bootstrap/bootstrap.hpp"
#include "coll/registry.hpp"
#include "comm/algorithm_choice.hpp"
#include "comm/node_windows.hpp"
#include "comm/transport_choice.hpp"
#include "discovery/transports.hpp"
#include "engine/backoff.hpp"
#include "engine/eager_allreduce.hpp"
#include "selector/selector.hpp"
#include "common/error.hpp"
#include "common/log.hpp"
#include "kernels/cpu_reduce.hpp"
#include "provider/registry.hpp"
#include "provider/transport_call.hpp"
#include "runtime/device_call.hpp"
#include "runtime/objects.hpp"
#include "runtime/runtime.hpp"
#include "tuner/link_file.hpp"

namespace wia::comm {

namespace {
// Per-message cost the tuner charges when a node's ranks outnumber its
// cores (see connect_mesh).
constexpr double kOversubscribedMessageOverheadUs = 5.0;
}  // namespace

namespace {

using Clock = std::chrono::steady_clock;

// What each rank publishes at setup: one connection handle per transport
// it listens on. Fixed size, so every rank's blob has the same length.
constexpr std::uint32_t kRecordMagic = 0x57494152;  // "WIAR"
constexpr std::size_t kMaxTransports = 4;
struct HandleSlot {
  char name[16];
  std::uint32_t endpoint_flags;  // WIA_TRANSPORT_FLAG_* of the endpoint listened on
  std::uint8_t handle[WIA_TRANSPORT_HANDLE_SIZE];
};
constexpr int kCpuWords = 16;  // CPUs 0 .. 1023

struct RankRecord {
  std::uint32_t magic;
  std::uint32_t count;
  char host[64];  // node name, for selector groups
  HandleSlot slots[kMaxTransports];
  // The measured link figures this rank read (tuner.link_file), as a
  // digest; 0 = none. Every rank uses them only when all digests agree.
  std::uint64_t link_file_digest;
  // This rank's node-shared window (all ranks on one node), if it has one,
  // and the settings every rank must share to use the windows: the bank
  // size (the layout of every window) and the limits that decide which
  // calls take them.
  std::uint32_t has_window;
  wia_ipc_handle_t window;
  std::uint64_t window_chunk_bytes;
  std::uint64_t window_max_bytes;
  std::uint64_t one_shot_max_bytes;
  // The CPUs this process may run on (sched_getaffinity: taskset, cgroup
  // cpusets, a launcher's binding), bit c = CPU c; all zero if unknown.
  std::uint64_t cpus[kCpuWords];
};

// This rank's node: how many ranks it has, and how many CPUs they may run
// on together (0: unknown).
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

// Measured links for a communicator of `nranks` ranks: the file of config
// key tuner.link_file when it has exactly one device per rank (rank r on
// device r, as wia-bw --procs writes it).
struct MeasuredLinks {
  std::string path;  // "" = key not set
  std::optional<tuner::LinkModel> model;
  std::uint64_t digest = 0;  // of the figures; 0 = no model
  std::string why_not;       // when the key is set but no model
  bool bad_file = false;     // why_not is a read or format error
};

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

void sleep_us(long us) {
  timespec ts{0, us * 1000};
  nanosleep(&ts, nullptr);
}

// Same messages (peer, tag, count, direction, in order) on every rank: a
// rank may then run either schedule while its peers run the other.
bool same_messages(const coll::Schedule& a, const coll::Schedule& b) {
  if (a.nranks != b.nranks) return false;
  for (int r = 0; r < a.nranks; ++r) {
    std::vector<std::tuple<bool, int, std::uint32_t, std::uint64_t>> ma, mb;
    for (const coll::Step& s : a.programs[r].steps)
      if (s.is_send() || s.is_recv()) ma.emplace_back(s.is_send(), s.peer, s.tag, s.count);
    for (const coll::Step& s : b.programs[r].steps)
      if (s.is_send() || s.is_recv()) mb.emplace_back(s.is_send(), s.peer, s.tag, s.count);
    std::sort(ma.begin(), ma.end());
    std::sort(mb.begin(), mb.end());
    if (ma != mb) return false;
  }
  return true;
}

// Waits for a transport request, bounded.
void wait_request(const engine::NetLink& l, wia_request_t r, Clock::time_point deadline,
                  const char* what) {
  for (std::uint32_t spin = 0;; ++spin) {
    std::int32_t done = 0;
    std::uint64_t size = 0;
    transport_call(*l.provider, fmt::format("{} with {}", what, l.peer),
                   [&](const wia_transport_ops_v1_t& t, void* ctx) {
                     return t.test(ctx, r, &done, &size);
                   });
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
  for (int i = 0; i < kMessages; ++i) initiator ? send(big.data(), kBytes) : recv(big.data(), kBytes);
  initiator ? recv(small.data(), 8) : send(small.data(), 8);
  const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  if (!initiator) return {0, 0};
  std::sort(rtt.begin(), rtt.end());
  const double alpha = rtt[rtt.size() / 2] / 2;
  return {alpha, kMessages * double(kBytes) / 1e9 / std::max(1e-9, secs - alpha * 1e-6)};
}

class BootstrapExchange final : public Exchange {
 public:
  explicit BootstrapExchange(bootstrap::Bootstrap& bs) : bs_(bs) {}
  std::vector<std::uint8_t> all_gather(const std::vector<std::uint8_t>& mine) override {
    return bs_.all_gather(std::span<const std::uint8_t>(mine.data(), mine.size()));
  }

 private:
  bootstrap::Bootstrap& bs_;
};

}  // namespace

// The control channel: one receive always posted per peer, for messages
// that are not part of any collective.
//   abort  a peer failed; its reason follows the header
//   query  "where are you?" from a peer whose collective timed out
//   reply  the answer: the collective being run, and how many completed
//   bye    the peer destroyed the communicator after finishing its work:
//          its connection closing next is not a failure
namespace {
constexpr std::uint32_t kControlMagic = 0x57494158;  // "WIAX"
enum ControlType : std::uint32_t { kAbort = 1, kQuery = 2, kReply = 3, kBye = 4 };
}  // namespace

class ProcessCommunicator::Control final : public engine::ControlChannel {
 public:
  explicit Control(ProcessCommunicator& c) : c_(c) {}

  std::string poll() override {
    for (std::size_t q = 0; q < c_.peers_.size(); ++q) {
      Peer& p = c_.peers_[q];
      progress_send(p);
      if (!p.control_req) continue;
      std::int32_t done = 0;
      std::uint64_t size = 0;
      try {
        transport_call(*p.link.provider, "test(control)",
                       [&](const wia_transport_ops_v1_t& t, void* ctx) {
                         return t.test(ctx, p.control_req, &done, &size);
                       });
      } catch (const Error& e) {
        p.control_req = nullptr;
        if (p.said_bye) continue;  // it left cleanly; its data was delivered before
        return fmt::format("lost the connection to rank {} ({}): {}", q, p.transport, e.what());
      }
      if (!done) continue;
      p.control_req = nullptr;
      ControlHeader h;
      if (size < sizeof(h))
        return fmt::format("rank {} sent a truncated control message ({} B)", q, size);
      std::memcpy(&h, p.control_buf.data(), sizeof(h));
      if (h.magic != kControlMagic)
        return fmt::format("rank {} sent a corrupt control message", q);
      if (h.type == kAbort)
        return fmt::format("rank {} aborted the communicator: {}", q,
                           std::string(p.control_buf.data() + sizeof(h), size - sizeof(h)));
      if (h.type == kBye) {
        p.said_bye = true;  // no receive is posted again
        continue;
      }
      if (h.type == kQuery) {
        ControlHeader r;
        r.type = kReply;
        r.seq = h.seq;
        r.completed = c_.collectives_done_.load();
        r.running = c_.running_.load();
        send(p, r);
      } else if (h.type == kReply) {
        p.reply = h;
        p.has_reply = true;
      }
      c_.post_control_recv(p);
    }
    return {};
  }

  // Destroy: tell every peer, then wait (bounded) until each has said
  // goodbye too or is gone, so that no rank closes a connection a peer
  // still reads from (a finalize barrier, as MPI_Finalize has).
  void goodbye(std::chrono::milliseconds bound) {
    ControlHeader h;
    h.type = kBye;
    for (Peer& p : c_.peers_)
      if (p.link.conn) send(p, h);
    const auto until = Clock::now() + bound;
    for (;;) {
      poll();  // failures no longer matter here
      bool all = true;
      for (const Peer& p : c_.peers_)
        all &= !p.link.conn || p.said_bye || !p.control_req;
      for (Peer& p : c_.peers_) progress_send(p);
      bool sent = true;
      for (const Peer& p : c_.peers_) sent &= !p.send_req;
      if ((all && sent) || Clock::now() > until) return;
      sleep_us(200);
    }
  }

  std::string diagnose(std::uint64_t seq) override {
    for (Peer& p : c_.peers_) {
      if (!p.link.conn) continue;
      p.has_reply = false;
      ControlHeader q;
      q.type = kQuery;
      q.seq = seq;
      send(p, q);
    }
    // Peers inside a collective answer within their next poll; the others
    // (stuck elsewhere, or busy before calling) do not answer at all.
    const auto until = Clock::now() + std::chrono::milliseconds(300);
    while (Clock::now() < until) {
      if (!poll().empty()) break;
      bool all = true;
      for (const Peer& p : c_.peers_) all &= !p.link.conn || p.has_reply;
      if (all) break;
      sleep_us(200);
    }
    std::string absent, behind, inside;
    auto add = [](std::string& list, const std::string& item) {
      list += (list.empty() ? "" : ", ") + item;
    };
    for (std::size_t q = 0; q < c_.peers_.size(); ++q) {
      const Peer& p = c_.peers_[q];
      if (!p.link.conn) continue;
      if (!p.has_reply)
        add(absent, std::to_string(q));
      else if (p.reply.running == static_cast<std::int64_t>(seq))
        add(inside, std::to_string(q));
      else if (p.reply.completed <= seq)
        add(behind, fmt::format("{} (completed {} collective(s){})", q, p.reply.completed,
                                p.reply.running >= 0
                                    ? fmt::format(", running #{}", p.reply.running)
                                    : std::string()));
    }
    std::string out;
    if (!absent.empty())
      out += fmt::format("rank(s) {} have not reached collective #{} (no answer: not inside any "
                         "collective of this communicator)",
                         absent, seq);
    if (!behind.empty())
      out += fmt::format("{}rank(s) {} have not reached it", out.empty() ? "" : "; ", behind);
    if (!inside.empty())
      out += fmt::format("{}rank(s) {} are inside it", out.empty() ? "" : "; ", inside);
    return out;
  }

 private:
  // At most one control message in flight per peer; a newer one waits for
  // the previous (they are tiny, so this rarely happens).
  void progress_send(Peer& p) {
    if (!p.send_req || !p.link.conn) return;
    std::int32_t done = 0;
    std::uint64_t size = 0;
    const auto* t = p.link.provider->transport();
    if (t->test(p.link.provider->ctx(), p.send_req, &done, &size) < 0 || done)
      p.send_req = nullptr;
  }

  void send(Peer& p, const ControlHeader& h) {
    progress_send(p);
    if (p.send_req || !p.link.conn) return;
    p.send_buf.assign(reinterpret_cast<const char*>(&h), reinterpret_cast<const char*>(&h) + sizeof(h));
    const auto* t = p.link.provider->transport();
    if (t->isend(p.link.provider->ctx(), p.link.conn, p.send_buf.data(), p.send_buf.size(),
                 engine::kControlTag, nullptr, &p.send_req) != WIA_SUCCESS)
      p.send_req = nullptr;
  }

  ProcessCommunicator& c_;
};

void ProcessCommunicator::post_control_recv(Peer& peer) {
  peer.control_buf.assign(1024, 0);
  transport_call(*peer.link.provider, "irecv(control)",
                 [&](const wia_transport_ops_v1_t& t, void* ctx) {
                   return t.irecv(ctx, peer.link.conn, peer.control_buf.data(),
                                  peer.control_buf.size(), engine::kControlTag, nullptr,
                                  &peer.control_req);
                 });
}

// A collective in progress and everything its NetExecution refers to.
struct ProcessCommunicator::Running {
  explicit Running(ProcessCommunicator& c) : control(c) {}
  std::uint64_t seq = 0;    // among all operations of this rank
  std::uint64_t index = 0;  // among collectives: the same on every rank
  std::shared_ptr<const engine::ExecPlan> plan;
  engine::RankBuffers buffers;
  engine::Descriptor descriptor;
  std::vector<engine::NetLink> links;
  Control control;
  engine::NetExecOptions options;
  std::unique_ptr<engine::NetExecution> execution;
  // A small all-reduce on the fast path instead (execution unused).
  engine::EagerAllReduce eager;
  bool is_eager = false;
  // An all-reduce through the node-shared windows instead.
  engine::WindowAllReduce window;
  bool is_window = false;
  // `window` last ran the current window_repeat_ call and can run it
  // again on new buffers (WindowAllReduce::restart); take_running clears it.
  bool window_restartable = false;
  // Point to point instead (peer >= 0): the one transport request.
  int peer = -1;
  bool is_send = false;
  char* buf = nullptr;
  std::uint64_t bytes = 0;
  wia_request_t request = nullptr;
};

struct ProcessCommunicator::Gate {
  ProcessCommunicator* comm;
  std::uint64_t seq;
  Call call;
  wia_stream_s* stream;
  // Point-to-point instead of a collective: peer >= 0.
  int peer = -1;
  bool is_send = false;
  // A collective the posting thread started and handed over.
  std::unique_ptr<Running> running;
  // Counted in large_in_flight_.
  bool large = false;
};

ProcessCommunicator::ProcessCommunicator(const ProcessLayout& layout, Exchange& exchange,
                                         wia_device_t device,
                                         std::chrono::milliseconds setup_timeout,
                                         const std::string& preferred_inter_node)
    : layout_(layout), device_(device) {
  Runtime& rt = Runtime::get();
  const Device& d = rt.device(device);
  device_ops_ = &ops_of(d);
  device_ctx_ = d.provider->ctx();
  if (!(d.props.flags & WIA_DEVICE_FLAG_HOST_ACCESSIBLE))
    throw Error(WIA_ERROR_NOT_SUPPORTED,
                fmt::format("device {} ({}): process communicators need host-addressable device "
                            "memory in this release",
                            device, d.provider->name()));
  if (!(ops_of(d).caps & WIA_DEVICE_CAP_HOST_FUNC))
    throw Error(WIA_ERROR_NOT_SUPPORTED,
                fmt::format("device {} ({}) cannot run host functions on its streams", device,
                            d.provider->name()));
  default_timeout_ms_ = static_cast<std::uint32_t>(rt.config().get_int("collectives.timeout_ms"));
  post_progress_ =
      std::chrono::microseconds(rt.config().get_int("collectives.post_progress_us"));
  post_progress_max_bytes_ =
      static_cast<std::uint64_t>(rt.config().get_int("collectives.post_progress_max_bytes"));
  one_shot_max_bytes_ =
      static_cast<std::uint64_t>(rt.config().get_int("collectives.one_shot_max_bytes"));
  node_window_max_bytes_ =
      static_cast<std::uint64_t>(rt.config().get_int("collectives.node_window_max_bytes"));
  node_window_zero_copy_min_bytes_ = static_cast<std::uint64_t>(
      rt.config().get_int("collectives.node_window_zero_copy_min_bytes"));
  // Until the ranks' CPUs are known (connect_mesh): the online CPUs.
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  int local_size = 0;
  for (int r = 0; r < layout_.size; ++r)
    local_size += layout_.node_of_rank[r] == layout_.node_of_rank[layout_.rank];
  oversubscribed_ = local_size > cores;
  if (const char* e = std::getenv("WIA_PROBE_LINKS")) probe_inter_node_ = std::string(e) != "0";
  connect_mesh(exchange, setup_timeout, preferred_inter_node);
}

std::unique_ptr<ProcessCommunicator> ProcessCommunicator::create(
    bootstrap::Bootstrap& bs, wia_device_t device, const std::string& preferred_inter_node) {
  ProcessLayout l;
  l.rank = bs.rank();
  l.size = bs.size();
  l.node_of_rank = bs.layout().node_of_rank;
  l.local_rank_of_rank = bs.layout().local_rank_of_rank;
  l.nnodes = bs.nnodes();
  for (int r = 0; r < l.size; ++r) {
    // "<hostname>:<boot_id>": the host name is what selector groups match.
    const std::string& id = bs.host_id(r);
    l.host_of_rank.push_back(id.substr(0, id.find(':')));
  }
  BootstrapExchange ex(bs);
  return std::make_unique<ProcessCommunicator>(l, ex, device, bs.timeout(), preferred_inter_node);
}

ProcessCommunicator::~ProcessCommunicator() {
  if (!broken_.load()) {
    try {
      Control(*this).goodbye(std::chrono::milliseconds(std::min<std::uint32_t>(default_timeout_ms_, 5000)));
    } catch (const std::exception& e) {
      log::debug("comm", "rank {}: goodbye: {}", layout_.rank, e.what());
    }
  }
  close_all();
}

void ProcessCommunicator::connect_mesh(Exchange& exchange, std::chrono::milliseconds timeout,
                                       const std::string& preferred_inter_node) {
  Runtime& rt = Runtime::get();
  const int me = layout_.rank;
  const int p = layout_.size;
  const bool multi_node = layout_.nnodes > 1;
  peers_.resize(p);

  // Listen on every loaded transport.
  struct Listening {
    const Provider* provider;
    std::int32_t endpoint;
    wia_listener_t listener;
  };
  std::vector<Listening> listening;
  RankRecord mine{};
  mine.magic = kRecordMagic;
  if (cpu_set_t set; sched_getaffinity(0, sizeof set, &set) == 0)
    for (int c = 0; c < kCpuWords * 64 && c < CPU_SETSIZE; ++c)
      if (CPU_ISSET(c, &set)) mine.cpus[c / 64] |= 1ull << (c % 64);
  const std::string& host = layout_.host_of_rank.empty() ? std::string() : layout_.host_of_rank[me];
  std::memcpy(mine.host, host.data(), std::min(host.size(), sizeof(mine.host) - 1));
  for (const auto& prov : rt.providers().loaded()) {
    if (!prov->transport() || listening.size() == kMaxTransports) continue;
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
    listening.push_back({prov.get(), ep, listener});
    ++mine.count;
  }
  auto close_listeners = [&]() noexcept {
    for (auto& l : listening) l.provider->transport()->close_listener(l.provider->ctx(), l.listener);
  };

  // Read before the exchange, so that every rank learns whether all of
  // them hold the same measured figures.
  const MeasuredLinks measured = read_measured_links(rt.config(), p);
  mine.link_file_digest = measured.digest;
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
    } else {
      log::info("comm", "rank {}: no node-shared window: {}", me, why);
    }
  }
  std::vector<std::uint8_t> blob(sizeof(RankRecord));
  std::memcpy(blob.data(), &mine, sizeof(mine));
  std::vector<std::uint8_t> all;
  try {
    all = exchange.all_gather(blob);
  } catch (...) {
    close_listeners();
    throw;
  }
  std::vector<RankRecord> records(p);
  for (int r = 0; r < p; ++r) {
    std::memcpy(&records[r], all.data() + r * sizeof(RankRecord), sizeof(RankRecord));
    if (records[r].magic != kRecordMagic) {
      close_listeners();
      throw Error(WIA_ERROR_REMOTE,
                  fmt::format("rank {} sent a malformed connection record", r));
    }
  }

  // Whether the node's ranks outnumber the CPUs they may run on, all of
  // them together: ranks confined to fewer CPUs than there are ranks (a
  // container's cpuset, taskset) are oversubscribed on a machine of many
  // cores, and ranks bound one per core are not.
  if (const auto [local, cpus] = node_ranks_and_cpus(records, layout_); cpus > 0) {
    oversubscribed_ = local > cpus;
    log::info("comm", "rank {}: {} rank(s) on this node may run on {} CPU(s){}", me, local, cpus,
              oversubscribed_ ? ": oversubscribed, waits yield and sleep" : "");
  }  // else unknown: the constructor's count of online CPUs stands

  // Choose each link's transport with the selector's rules (YAML
  // selector.rules, WIA_TRANSPORT, the defaults), from what both ends
  // published, so that every rank computes the same choice for every link.
  auto listening_on = [&](const std::string& name) -> const Listening* {
    for (auto& l : listening)
      if (l.provider->name() == name) return &l;
    return nullptr;
  };
  // Names are checked against what this process loaded, so a vendor's own
  // transport provider can be named in rules and WIA_TRANSPORT.
  const auto loaded_here = discovery::transport_availability(rt.providers());
  selector::RuleSet rules = selector::load_rules_or_defaults(rt.config(), &loaded_here);
  if (!preferred_inter_node.empty()) {
    // The distributed config's backend: first for links between nodes,
    // falling back to the rules after it.
    selector::Rule r;
    r.name = "network_backend";
    r.where = "wia_distributed_config_t.network_backend";
    r.match.classes = selector::class_bit(selector::LinkClass::kDifferentNodes);
    r.transports.push_back({preferred_inter_node, {}});
    rules.rules.insert(rules.rules.begin(), r);
  }
  std::vector<selector::TransportAvailability> avail;
  for (int r = 0; r < p; ++r) avail.push_back(availability_of(records[r]));
  auto choose = [&](int a, int b) {
    const bool same_node = layout_.node_of_rank[a] == layout_.node_of_rank[b];
    return selector::choose(rules, link_info(records[a], a, records[b], b, same_node),
                            selector::TransportAvailability::intersect(avail[a], avail[b]));
  };
  for (int q = 0; q < p; ++q) {
    if (q == me) continue;
    const selector::Choice choice = choose(me, q);
    if (!choice.ok()) {
      std::string local;
      for (const char* t : {"shm", "tcp", "ofi", "verbs"})
        if (!listening_on(t))
          local += fmt::format("; here {}: {}", t, transport_unavailable_reason(t));
      close_listeners();
      throw Error(WIA_ERROR_UNAVAILABLE,
                  fmt::format("rank {} -> rank {}: no usable transport: {}{}", me, q,
                              choice.describe(), local));
    }
    peers_[q].transport = choice.transport;
    peers_[q].link.provider = listening_on(choice.transport)->provider;
    peers_[q].link.peer =
        fmt::format("rank {} (node {}, {})", q, layout_.node_of_rank[q], choice.transport);
    log::debug("comm", "rank {} -> rank {}: {}", me, q, choice.describe());
  }

  // Connect: the lower rank of each pair connects, the higher accepts.
  const auto deadline = Clock::now() + timeout;
  int missing = p - 1;
  std::vector<wia_conn_t> pending(p, nullptr);
  try {
    while (missing > 0) {
      bool progressed = false;
      for (int q = me + 1; q < p; ++q) {
        Peer& peer = peers_[q];
        if (peer.link.conn) continue;
        const Listening* l = listening_on(peer.transport);
        const HandleSlot* slot = find_slot(records[q], peer.transport);
        const wia_status_t st = transport_call(
            *l->provider, fmt::format("connect to rank {}", q),
            [&](const wia_transport_ops_v1_t& t, void* ctx) {
              return t.connect(ctx, l->endpoint, slot->handle, static_cast<std::uint64_t>(me),
                               &pending[q]);
            });
        if (st == WIA_SUCCESS) {
          peer.link.conn = pending[q];
          pending[q] = nullptr;
          --missing;
          progressed = true;
        }
      }
      for (auto& l : listening) {
        std::uint64_t cookie = 0;
        wia_conn_t conn = nullptr;
        const wia_status_t st = transport_call(
            *l.provider, "accept", [&](const wia_transport_ops_v1_t& t, void* ctx) {
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
      if (!progressed) sleep_us(50);
    }
  } catch (...) {
    for (int q = 0; q < p; ++q)
      if (pending[q]) peers_[q].link.provider->transport()->close(peers_[q].link.provider->ctx(),
                                                                  pending[q]);
    close_listeners();
    close_all();
    throw;
  }
  close_listeners();

  // The control channel: one receive always posted per peer.
  for (int q = 0; q < p; ++q)
    if (q != me) post_control_recv(peers_[q]);

  if (layout_.nnodes == 1 && p > 1) {
    std::vector<wia_ipc_handle_t> handles(p);
    bool every_rank_has_one = true;
    int differs = -1;
    for (int r = 0; r < p; ++r) {
      handles[r] = records[r].window;
      every_rank_has_one &= records[r].has_window == 1;
      if (records[r].has_window == 1 && records[0].has_window == 1 && differs < 0 &&
          (records[r].window_chunk_bytes != records[0].window_chunk_bytes ||
           records[r].window_max_bytes != records[0].window_max_bytes ||
           records[r].one_shot_max_bytes != records[0].one_shot_max_bytes))
        differs = r;
    }
    if (differs >= 0) {
      every_rank_has_one = false;
      if (me == 0)
        log::warn("comm",
                  "communicator of {} ranks: node-shared windows not used: rank {} has other "
                  "collectives.node_window_chunk_bytes / node_window_max_bytes / "
                  "one_shot_max_bytes than rank 0 ({} / {} / {} vs {} / {} / {})",
                  p, differs, records[differs].window_chunk_bytes,
                  records[differs].window_max_bytes, records[differs].one_shot_max_bytes,
                  records[0].window_chunk_bytes, records[0].window_max_bytes,
                  records[0].one_shot_max_bytes);
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
      setup_node_windows(exchange, handles, every_rank_has_one);
    } catch (...) {
      close_all();
      throw;
    }
  }

  // Every rank costs schedules with the same model: built from the
  // gathered records, not from local measurements.
  tuner::LinkModel model = tuner::LinkModel::uniform(p, 1.0, 10.0);
  model.alpha_matrix_us.assign(static_cast<std::size_t>(p) * p, 1.0);
  model.gbps_matrix.assign(static_cast<std::size_t>(p) * p, 10.0);
  double overhead = 0, inter_gbps = 0;
  link_transport_.assign(static_cast<std::size_t>(p) * p, std::string());
  for (int a = 0; a < p; ++a)
    for (int b = 0; b < p; ++b) {
      if (a == b) continue;
      const bool same_node = layout_.node_of_rank[a] == layout_.node_of_rank[b];
      const std::string transport = choose(a, b).transport;
      link_transport_[static_cast<std::size_t>(a) * p + b] = transport;
      const TransportFigures f = transport_figures(transport, same_node);
      model.alpha_matrix_us[static_cast<std::size_t>(a) * p + b] = f.alpha_us;
      model.gbps_matrix[static_cast<std::size_t>(a) * p + b] = f.gbps;
      overhead = std::max(overhead, f.message_overhead_us);
      if (!same_node) inter_gbps = f.gbps;
    }
  // Measured links (wia-bw --procs --output, tuner.link_file) replace the
  // transport figures, and the probe below, when every rank read the same
  // figures for exactly this communicator's ranks; otherwise no rank uses
  // them, so that all ranks still cost schedules alike.
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
  if (layout_.nnodes > 1 && probe_inter_node_ && !use_measured) {
    // Figures for links between nodes are measured, not assumed: the first
    // ranks of nodes 0 and 1 time their link and everyone adopts the
    // result, so a slow or shaped network is seen for what it is.
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
        transport_call(*l.provider, "probe result", [&](const wia_transport_ops_v1_t& t,
                                                        void* ctx) {
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
      log::info("comm", "link between nodes measured: {:.1f} us, {:.3f} GB/s", got.first,
                got.second);
    }
  }
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
  selector_ = std::make_unique<tuner::Selector>(std::move(model), groups_);
}

void ProcessCommunicator::close_all() noexcept {
  for (Peer& peer : peers_) {
    if (!peer.link.conn) continue;
    peer.link.provider->transport()->close(peer.link.provider->ctx(), peer.link.conn);
    peer.link.conn = nullptr;
    peer.control_req = nullptr;  // released by close()
    peer.send_req = nullptr;
  }
}

void ProcessCommunicator::break_communicator(wia_status_t status, const std::string& reason) {
  {
    std::lock_guard<std::mutex> lock(err_mu_);
    if (broken_.load()) return;
    error_ = status;
    error_message_ = reason;
    broken_.store(true);
  }
  log::error("comm", "rank {}: {}", layout_.rank, reason);
  // Tell every peer why, briefly: a peer that is gone must not delay us.
  ControlHeader h;
  h.type = kAbort;
  std::string text(reinterpret_cast<const char*>(&h), sizeof(h));
  text += fmt::format("rank {}: {}", layout_.rank, reason).substr(0, 1024 - sizeof(h));
  std::vector<std::pair<Peer*, wia_request_t>> sent;
  for (Peer& peer : peers_) {
    if (!peer.link.conn) continue;
    wia_request_t r = nullptr;
    const auto* t = peer.link.provider->transport();
    if (t->isend(peer.link.provider->ctx(), peer.link.conn, text.data(), text.size(),
                 engine::kControlTag, nullptr, &r) == WIA_SUCCESS &&
        r)
      sent.emplace_back(&peer, r);
  }
  const auto until = Clock::now() + std::chrono::milliseconds(200);
  while (!sent.empty() && Clock::now() < until) {
    for (auto it = sent.begin(); it != sent.end();) {
      std::int32_t done = 0;
      std::uint64_t size = 0;
      const auto* t = it->first->link.provider->transport();
      const wia_status_t st = t->test(it->first->link.provider->ctx(), it->second, &done, &size);
      if (st < 0 || done)
        it = sent.erase(it);
      else
        ++it;
    }
    if (!sent.empty()) sleep_us(100);
  }
  close_all();
}

std::shared_ptr<const engine::ExecPlan> ProcessCommunicator::plan_for(const Call& call,
                                                                      bool in_place,
                                                                      double* estimate,
                                                                      std::string* reason) {
  {
    // No lock: begin(), the only caller, runs one operation at a time
    // (each waits for its turn, see Turn).
    for (const PlanMemo& m : plan_memo_)
      if (m.plan && m.collective == call.collective && m.requested == call.algorithm &&
          m.op == call.op && m.dtype == call.dtype && m.count == call.count &&
          m.root == call.root && m.num_chunks == call.num_chunks && m.in_place == in_place) {
        if (estimate) *estimate = m.estimate;
        if (reason) *reason = m.reason;
        return m.plan;
      }
  }
  coll::CollArgs args;
  args.collective = call.collective;
  args.op = call.op;
  args.dtype = call.dtype;
  args.count = call.count;
  args.nranks = size();
  args.root = call.root;
  args.options.num_chunks = call.num_chunks;
  args.options.in_place = in_place;
  args.options.groups = groups_;
  coll::validate_args(args);
  std::lock_guard<std::mutex> lock(mu_);
  AlgorithmChoice choice = choose_algorithm(args, call.algorithm, *selector_);
  // Paths the cost model, which prices messages, does not see.
  auto take_instead = [&](coll::Algorithm algorithm, const char* reason) {
    args.algorithm = algorithm;
    choice.algorithm = algorithm;
    choice.num_chunks = 0;
    choice.estimated_ms = tuner::estimate(args, selector_->model()).time_us / 1000.0;
    choice.reason = reason;
  };
  const std::uint64_t bytes = call.count * kernels::dtype_size(call.dtype);
  const bool all_reduce_by_model =
      choice.by_cost_model && call.collective == coll::Collective::kAllReduce && size() > 1;
  if (all_reduce_by_model && size() <= coll::kOneShotMaxRanks && bytes <= one_shot_max_bytes_)
    // The descriptor messages and step bookkeeping the one-shot fast path
    // saves dominate here.
    take_instead(coll::Algorithm::kOneShot, "small all-reduce (collectives.one_shot_max_bytes)");
  else if (all_reduce_by_model && windows_ && bytes <= node_window_max_bytes_ && size() == 2)
    // Two ranks read as many of each other's bytes either way (the whole
    // input, or half the input and half the result); one-shot waits once
    // per chunk instead of twice and writes no slices.
    take_instead(coll::Algorithm::kOneShot,
                 "2 ranks on one node (node-shared windows, collectives.node_window_max_bytes)");
  else if (all_reduce_by_model && windows_ && bytes <= node_window_max_bytes_)
    // Through the windows a rank reads every input directly: the direct
    // algorithm moves the fewest bytes and waits twice per chunk.
    take_instead(coll::Algorithm::kDirect,
                 "all ranks on one node (node-shared windows, collectives.node_window_max_bytes)");
  args.algorithm = choice.algorithm;
  if (args.options.num_chunks == 0) args.options.num_chunks = choice.num_chunks;
  std::shared_ptr<const engine::ExecPlan> plan = plans_.find(args, choice.algorithm);
  if (!plan) {
    plan = engine::make_plan(coll::build_schedule(args), choice.estimated_ms);
    plans_.insert(args, choice.algorithm, plan);
  }
  plan_memo_[plan_memo_next_++ % plan_memo_.size()] =
      PlanMemo{call.collective, call.algorithm, call.op, call.dtype, call.count, call.root,
               call.num_chunks, in_place, plan, choice.estimated_ms, choice.reason};
  if (estimate) *estimate = choice.estimated_ms;
  if (reason) *reason = choice.reason;
  return plan;
}

void ProcessCommunicator::setup_node_windows(Exchange& exchange,
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
               layout_.size,
               engine::NodeWindows::window_bytes(windows_->windows().chunk_bytes));
}

bool ProcessCommunicator::through_windows(const Call& call, const engine::ExecPlan& plan) const {
  if (!windows_ || call.collective != coll::Collective::kAllReduce) return false;
  const coll::Algorithm a = plan.schedule.algorithm;
  return a == coll::Algorithm::kOneShot || a == coll::Algorithm::kDirect;
}

bool ProcessCommunicator::eager(const Call& call, const engine::ExecPlan& plan) const {
  return call.collective == coll::Collective::kAllReduce &&
         plan.schedule.algorithm == coll::Algorithm::kOneShot && size() > 1 &&
         call.count * kernels::dtype_size(call.dtype) <= one_shot_max_bytes_;
}

void ProcessCommunicator::fill_links(std::vector<engine::NetLink>& links) const {
  // The peers' names are set once; only connections change (closed).
  if (links.size() != peers_.size()) {
    links.clear();
    for (const Peer& p : peers_) links.push_back(p.link);
    return;
  }
  for (std::size_t q = 0; q < peers_.size(); ++q) {
    links[q].provider = peers_[q].link.provider;
    links[q].conn = peers_[q].link.conn;
  }
}

wia_status_t ProcessCommunicator::post(int rank, Call call, wia_stream_s* stream) {
  if (rank != layout_.rank)
    throw Error(WIA_ERROR_INVALID_ARGUMENT,
                fmt::format("rank {} is not this process's rank {}", rank, layout_.rank));
  if (!try_post_inline(call, stream, -1, false)) post_gate(std::move(call), stream, -1, false);
  return WIA_SUCCESS;
}

bool ProcessCommunicator::try_post_inline(Call& call, wia_stream_s* stream, int peer,
                                          bool is_send) {
  if (post_progress_.count() == 0 || broken_.load() ||
      call.count * kernels::dtype_size(call.dtype) > post_progress_max_bytes_)
    return false;
  // The stream must have nothing before the collective, so that running
  // it now keeps stream order; nothing of this communicator may be
  // pending either (every sequence number handed out has run). The query
  // goes straight to the provider of the communicator's device (the API
  // checked the stream is on it): any answer but "idle" (an error too)
  // sends the call through the stream, which reports errors in full.
  auto idle = [&] {
    return executed_.load(std::memory_order_acquire) == next_seq_ &&
           device_ops_->stream_query(device_ctx_, stream->ps) == WIA_SUCCESS;
  };
  // The clock is read only when something waits: a read costs 31 ns here,
  // a tenth of an 8-byte all-reduce between two processes.
  Clock::time_point now{};
  if (!idle()) {
    now = Clock::now();
    // Only small collectives of ours are ahead (a burst of them, the
    // first handed over because a peer was late): wait a little for them
    // rather than queue this one too, or every later one of the burst
    // would pay a hand-over as well. Bounded, so posting stays quick.
    if (large_in_flight_.load() > 0) return false;
    const auto until = now + post_progress_;
    for (std::uint32_t i = 1;; ++i) {
      if (i & 7) {
#if defined(__x86_64__) || defined(__i386__)
        __builtin_ia32_pause();
#endif
      } else {
        sched_yield();
      }
      if (idle()) break;
      if ((i & 15) == 0 && Clock::now() > until) return false;
    }
    now = Clock::now();
  }
  // Claim the next sequence number only if every earlier one has run.
  std::uint64_t seq = executed_.load(std::memory_order_acquire);
  if (!next_seq_.compare_exchange_strong(seq, seq + 1)) return false;
  const std::uint32_t timeout_ms = call.timeout_ms ? call.timeout_ms : default_timeout_ms_;
  std::string error;
  wia_status_t st = WIA_SUCCESS;
  const auto timeout = std::chrono::milliseconds(timeout_ms);
  const bool clock_unread = now == Clock::time_point{};
  const auto deadline = clock_unread ? Clock::time_point::max() : now + timeout;
  std::unique_ptr<Running> r;
  if (peer >= 0)
    r = begin_p2p(seq, call, peer, is_send, deadline);
  else if (repeats_window_call(call))
    r = begin_window_repeat(seq, call, deadline, st, error);
  else
    r = begin(seq, call, deadline, st, error);
  run_claimed(seq, std::move(r), st, error, stream, peer, is_send, now, timeout);
  return true;
}

bool ProcessCommunicator::try_post_repeat(int rank, const Call& call, wia_stream_s* stream) {
  // try_post_inline for the last small all-reduce through the windows
  // once more, with nothing to look up: the stream (this communicator's
  // device, the API checked) is asked directly, and the Running of last
  // time restarts its window on the new buffers. A third of the
  // instructions of a 2-rank 8-byte all-reduce (callgrind) were the
  // general path's.
  if (rank != layout_.rank || post_progress_.count() == 0 || !repeats_window_call(call) ||
      broken_.load(std::memory_order_relaxed))
    return false;
  std::uint64_t seq = executed_.load(std::memory_order_acquire);
  if (next_seq_.load(std::memory_order_relaxed) != seq ||
      device_ops_->stream_query(device_ctx_, stream->ps) != WIA_SUCCESS ||
      !next_seq_.compare_exchange_strong(seq, seq + 1))
    return false;  // post() waits or queues
  // The turn is ours: no other thread touches the spare Running now.
  const auto timeout =
      std::chrono::milliseconds(call.timeout_ms ? call.timeout_ms : default_timeout_ms_);
  std::string error;
  wia_status_t st = WIA_SUCCESS;
  std::unique_ptr<Running> r = std::move(spare_running_);
  if (r && r->window_restartable) {
    r->seq = seq;
    r->index = collectives_begun_++;
    r->descriptor.seq = r->index;
    r->options.deadline = Clock::time_point::max();
    r->options.timeout_ms = static_cast<std::uint32_t>(timeout.count());
    const engine::RankBuffers& b = call.buffers;
    r->window.restart(r->descriptor.seq, call.in_place ? b.recv : b.send, b.recv);
    running_.store(static_cast<std::int64_t>(r->index), std::memory_order_release);
  } else {
    spare_running_ = std::move(r);
    r = begin_window_repeat(seq, call, Clock::time_point::max(), st, error);
  }
  run_claimed(seq, std::move(r), st, error, stream, -1, false, Clock::time_point{}, timeout);
  return true;
}

void ProcessCommunicator::run_claimed(std::uint64_t seq, std::unique_ptr<Running> r,
                                      wia_status_t st, std::string& error, wia_stream_s* stream,
                                      int peer, bool is_send, Clock::time_point now,
                                      std::chrono::milliseconds timeout) {
  const bool clock_unread = now == Clock::time_point{};
  if (r) {
    // Without the time, a first attempt takes what is ready and gives up
    // at its first look at the clock; the time and the deadlines are known
    // from then on.
    st = proceed(*r, clock_unread ? Clock::time_point::min() : now + post_progress_, error);
    if (st == WIA_IN_PROGRESS && clock_unread) {
      now = Clock::now();
      r->options.deadline = now + timeout;
      st = proceed(*r, now + post_progress_, error);
    }
  }
  if (st == WIA_IN_PROGRESS) {
    // Peers are late: the stream's worker goes on from here.
    // From here it is queued on a stream: counted in in_flight_ (the
    // gate uncounts it), which is what destroy waits for.
    auto* g = new Gate{this, seq, Call{}, stream, peer, is_send, std::move(r), false};
    in_flight_.fetch_add(1);
    try {
      device_call(Runtime::get().device(stream->device), "launch_host_func",
                  [&](const wia_device_ops_v1_t& o, void* ctx) {
                    return o.launch_host_func(ctx, stream->ps, &ProcessCommunicator::gate, g);
                  });
      return;
    } catch (const Error& e) {
      in_flight_.fetch_sub(1);
      delete g;
      st = e.status();
      error = fmt::format("could not hand collective #{} to its stream: {}", seq, e.what());
      break_communicator(st, error);
    }
  }
  // Failures are reported like those of a collective run by the stream.
  if (st != WIA_SUCCESS) stream->set_async_error(st, error);
  recycle(std::move(r));
  release_turn(seq);  // notifies
}

void ProcessCommunicator::post_gate(Call call, wia_stream_s* stream, int peer, bool is_send) {
  if (broken_.load()) {
    std::lock_guard<std::mutex> lock(err_mu_);
    throw Error(error_, fmt::format("the communicator is unusable after an earlier failure: {}",
                                    error_message_));
  }
  std::uint64_t seq;
  {
    std::lock_guard<std::mutex> lock(mu_);
    seq = next_seq_++;
  }
  const bool large = call.count * kernels::dtype_size(call.dtype) > post_progress_max_bytes_;
  auto* g = new Gate{this, seq, std::move(call), stream, peer, is_send, nullptr, large};
  in_flight_.fetch_add(1);
  if (large) large_in_flight_.fetch_add(1);
  const Device& d = Runtime::get().device(stream->device);
  try {
    device_call(d, "launch_host_func", [&](const wia_device_ops_v1_t& o, void* ctx) {
      return o.launch_host_func(ctx, stream->ps, &ProcessCommunicator::gate, g);
    });
  } catch (const Error& e) {
    delete g;
    in_flight_.fetch_sub(1);
    if (large) large_in_flight_.fetch_sub(1);
    // Its sequence number is spent; the ranks can no longer agree.
    break_communicator(e.status(), fmt::format("could not post operation #{}: {}", seq,
                                               e.what()));
    executed_.store(seq + 1);
    order_signal_.notify();
    throw;
  }
}

void ProcessCommunicator::gate(void* arg) {
  std::unique_ptr<Gate> g(static_cast<Gate*>(arg));
  g->comm->run_gate(*g);
}

void ProcessCommunicator::run_gate(Gate& g) {
  std::string error;
  wia_status_t st;
  if (g.running) {
    st = proceed(*g.running, Clock::time_point::max(), error);
    recycle(std::move(g.running));
    release_turn(g.seq);
  } else {
    st = execute(g.seq, g.call, g.peer, g.is_send, error);
  }
  if (st != WIA_SUCCESS) g.stream->set_async_error(st, error);
  if (g.large) large_in_flight_.fetch_sub(1);
  in_flight_.fetch_sub(1);
  order_signal_.notify();
}

// Operations run in posting order, whatever streams they were posted on.
ProcessCommunicator::Turn::Turn(ProcessCommunicator& c, std::uint64_t seq,
                                std::chrono::steady_clock::time_point deadline)
    : c_(c), seq_(seq) {
  reached_ = c.order_signal_.wait_until(
      [&] { return c.executed_.load(std::memory_order_acquire) >= seq; }, deadline, false, true);
}

ProcessCommunicator::Turn::~Turn() { c_.release_turn(seq_); }

void ProcessCommunicator::release_turn(std::uint64_t seq) {
  executed_.store(std::max(executed_.load(), seq + 1), std::memory_order_release);
  order_signal_.notify();
}

wia_status_t ProcessCommunicator::execute(std::uint64_t seq, Call& call, int peer, bool is_send,
                                          std::string& error) {
  const std::uint32_t timeout_ms = call.timeout_ms ? call.timeout_ms : default_timeout_ms_;
  const auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
  const Turn turn(*this, seq, deadline);
  if (!turn.reached()) {
    error = fmt::format("rank {}: {} (operation #{}) timed out after {} ms waiting for this "
                        "rank's earlier operations (posted on other streams) to finish",
                        layout_.rank,
                        peer < 0 ? std::string("a collective")
                                 : fmt::format("a {} with rank {}", is_send ? "send" : "receive",
                                               peer),
                        seq, timeout_ms);
    break_communicator(WIA_ERROR_TIMEOUT, error);
    return WIA_ERROR_TIMEOUT;
  }
  if (broken_.load()) {
    std::lock_guard<std::mutex> lock(err_mu_);
    error = fmt::format("the communicator is unusable after an earlier failure: {}",
                        error_message_);
    return error_;
  }
  wia_status_t st = WIA_SUCCESS;
  std::unique_ptr<Running> r = peer >= 0 ? begin_p2p(seq, call, peer, is_send, deadline)
                                         : begin(seq, call, deadline, st, error);
  if (r) st = proceed(*r, Clock::time_point::max(), error);
  recycle(std::move(r));
  return st;
}

std::unique_ptr<ProcessCommunicator::Running> ProcessCommunicator::begin(
    std::uint64_t seq, Call& call, Clock::time_point deadline, wia_status_t& status,
    std::string& error) {
  const std::uint32_t timeout_ms = call.timeout_ms ? call.timeout_ms : default_timeout_ms_;
  try {
    const int me = layout_.rank;
    double estimate = 0;
    std::string reason;
    const bool debug = log::enabled(log::Level::debug);
    std::shared_ptr<const engine::ExecPlan> plan =
        plan_for(call, false, &estimate, debug ? &reason : nullptr);
    std::unique_ptr<Running> r = take_running();
    r->seq = seq;
    r->is_window = through_windows(call, *plan);
    r->is_eager = !r->is_window && eager(call, *plan);
    engine::RankBuffers& b = r->buffers;
    b = std::move(call.buffers);  // the call is not read again
    if (call.in_place && !r->is_eager && !r->is_window) {
      // An in-place schedule is used when its messages are the same as the
      // out-of-place one's, so peers that made out-of-place calls still
      // match; otherwise the input is snapshotted first.
      std::shared_ptr<const engine::ExecPlan> ip = plan_for(call, true, nullptr, nullptr);
      std::optional<bool> same;
      if (same_messages_memo_.in_place == ip && same_messages_memo_.out_of_place == plan)
        same = same_messages_memo_.same;
      if (!same) {
        // Compares every rank's messages: once per pair of plans, not per call.
        same = same_messages(ip->schedule, plan->schedule);
        same_messages_memo_ = {ip, plan, *same};
      }
      if (*same) {
        plan = ip;
        if (call.collective == coll::Collective::kReduceScatter) b.recv = b.send;
        b.send = nullptr;
      } else {
        const coll::RankProgram& prog = plan->schedule.programs[me];
        const std::size_t es = plan->schedule.elem_size();
        if (b.send && prog.sizes.send) {
          snapshot_.assign(b.send, b.send + prog.sizes.send * es);
          b.send = snapshot_.data();
        }
        if (!b.send_shards.empty() && prog.sizes.send_shard) {
          const std::size_t shard = prog.sizes.send_shard * es;
          snapshot_.resize(shard * b.send_shards.size());
          for (std::size_t j = 0; j < b.send_shards.size(); ++j) {
            std::memcpy(snapshot_.data() + j * shard, b.send_shards[j], shard);
            b.send_shards[j] = snapshot_.data() + j * shard;
          }
        }
      }
    }
    note_selected(plan->schedule.algorithm, call.collective, estimate);
    if (!r->is_eager && !r->is_window) {
      const std::uint64_t scratch = plan->schedule.scratch_bytes(me);
      if (scratch_.size() < scratch) scratch_.resize(scratch);
      b.scratch = scratch_.data();
      const std::uint64_t staging = engine::staging_bytes(*plan, me);
      if (staging_.size() < staging) staging_.resize(staging);
    }

    // Ranks agree on collectives, not on operations: point to point
    // involves some ranks only, so the descriptor counts collectives.
    r->index = collectives_begun_++;
    engine::Descriptor& desc = r->descriptor;
    desc.seq = r->index;
    desc.count = call.count;
    desc.collective = static_cast<std::uint8_t>(call.collective);
    desc.algorithm = static_cast<std::uint8_t>(plan->schedule.algorithm);
    desc.dtype = static_cast<std::uint8_t>(call.dtype);
    desc.op = coll::is_reducing(call.collective) ? static_cast<std::uint8_t>(call.op) : 0;
    desc.root = (call.collective == coll::Collective::kBroadcast ||
                 call.collective == coll::Collective::kReduce)
                    ? call.root
                    : 0;
    desc.num_chunks = plan->schedule.num_chunks;
    if (debug)  // describe() formats: not on every call
      log::debug("coll", "rank {} collective #{}: {} chosen by {} (estimate {:.3f} ms)", me, seq,
                 plan->schedule.describe(), reason, estimate);

    if (!r->is_window) fill_links(r->links);  // the windows need no connections
    const bool one_shot = plan->schedule.algorithm == coll::Algorithm::kOneShot;
    if (r->is_window && one_shot && !debug) {
      window_repeat_.key = call;
      window_repeat_.key.buffers = {};
      window_repeat_.descriptor = desc;
      window_repeat_.estimate = estimate;
      window_repeat_.valid = true;
    }
    r->options.deadline = deadline;
    r->options.timeout_ms = timeout_ms;
    r->options.oversubscribed = oversubscribed_;
    r->plan = std::move(plan);
    if (r->is_window)
      r->window.start(me, desc, call.in_place ? b.recv : b.send, b.recv, call.op, one_shot,
                      windows_->windows(), r->control, r->options);
    else if (r->is_eager)
      r->eager.start(me, desc, call.in_place ? b.recv : b.send, b.recv, call.op,
                     one_shot_max_bytes_, r->links, r->control, r->options);
    else
      r->execution = std::make_unique<engine::NetExecution>(
          *r->plan, me, r->buffers, r->descriptor, r->links, staging_.data(), r->control,
          r->options);
    running_.store(static_cast<std::int64_t>(r->index));
    return r;
  } catch (const Error& e) {
    error = e.what();
    status = e.status();
    break_communicator(status, error);
    return nullptr;
  }
}

// Written only when it changes (this thread is its only writer).
void ProcessCommunicator::note_selected(coll::Algorithm algorithm, coll::Collective collective,
                                        double estimate) {
  const auto algo_id = static_cast<wia_algorithm_id_t>(algorithm);
  const char* coll_name = coll::collective_name(collective);
  if (last_selected_.id == algo_id && last_selected_.collective == coll_name &&
      last_selected_.estimated_time_ms == estimate)
    return;
  std::lock_guard<std::mutex> lock(err_mu_);
  last_selected_.id = algo_id;
  last_selected_.name = coll::algorithm_name(algorithm);
  last_selected_.collective = coll_name;
  last_selected_.estimated_time_ms = estimate;
}

bool ProcessCommunicator::repeats_window_call(const Call& call) const {
  const Call& k = window_repeat_.key;
  return window_repeat_.valid && call.collective == k.collective && call.count == k.count &&
         call.dtype == k.dtype && call.op == k.op && call.algorithm == k.algorithm &&
         call.num_chunks == k.num_chunks && call.in_place == k.in_place &&
         call.root == k.root;
}

std::unique_ptr<ProcessCommunicator::Running> ProcessCommunicator::begin_window_repeat(
    std::uint64_t seq, const Call& call, Clock::time_point deadline, wia_status_t& status,
    std::string& error) try {
  std::unique_ptr<Running> r = take_running();
  r->seq = seq;
  r->is_window = true;
  r->index = collectives_begun_++;
  r->descriptor = window_repeat_.descriptor;
  r->descriptor.seq = r->index;
  note_selected(coll::Algorithm::kOneShot, call.collective, window_repeat_.estimate);
  r->options.deadline = deadline;
  r->options.timeout_ms = call.timeout_ms ? call.timeout_ms : default_timeout_ms_;
  r->options.oversubscribed = oversubscribed_;
  const engine::RankBuffers& b = call.buffers;
  r->window.start(layout_.rank, r->descriptor, call.in_place ? b.recv : b.send, b.recv, call.op,
                  true, windows_->windows(), r->control, r->options);
  r->window_restartable = r->window.restartable();
  running_.store(static_cast<std::int64_t>(r->index));
  return r;
} catch (const std::exception& e) {  // out of memory: as begin() fails
  status = WIA_ERROR_OUT_OF_MEMORY;
  error = fmt::format("rank {}: starting collective #{}: {}", layout_.rank, seq, e.what());
  break_communicator(status, error);
  return nullptr;
}

// One Running is kept for reuse: a collective after another (the common
// case) then allocates nothing here and copies the links' names in place.
std::unique_ptr<ProcessCommunicator::Running> ProcessCommunicator::take_running() {
  // No lock: operations run one at a time (Turn), and each recycles its
  // Running before the next may start.
  std::unique_ptr<Running> r = std::move(spare_running_);
  if (!r) return std::make_unique<Running>(*this);
  r->seq = r->index = 0;
  r->buffers = {};
  r->descriptor = {};
  r->options = {};
  r->is_eager = false;
  r->is_window = false;
  r->window_restartable = false;
  r->peer = -1;
  r->is_send = false;
  r->buf = nullptr;
  r->bytes = 0;
  r->request = nullptr;
  return r;
}

void ProcessCommunicator::recycle(std::unique_ptr<Running> r) {
  if (!r) return;
  r->execution.reset();
  r->plan.reset();
  spare_running_ = std::move(r);
}

wia_status_t ProcessCommunicator::proceed(Running& r, Clock::time_point give_up_at,
                                          std::string& error) {
  if (r.peer >= 0) return proceed_p2p(r, give_up_at, error);
  const wia_status_t st = r.is_window  ? r.window.progress(give_up_at, error)
                         : r.is_eager ? r.eager.progress(give_up_at, error)
                                      : r.execution->progress(give_up_at, error);
  if (st == WIA_IN_PROGRESS) return st;
  // Read by the control thread answering "where are you?": no ordering
  // beyond release needed.
  running_.store(-1, std::memory_order_release);
  collectives_done_.store(r.index + 1, std::memory_order_release);
  if (st != WIA_SUCCESS) break_communicator(st, error);
  return st;
}

void ProcessCommunicator::run_now(Call call) {
  std::uint64_t seq;
  {
    std::lock_guard<std::mutex> lock(mu_);
    seq = next_seq_++;
  }
  std::string error;
  const wia_status_t st = execute(seq, call, -1, false, error);
  if (st != WIA_SUCCESS) throw Error(st, error);
}

// Point to point: the n-th send from a to b meets the n-th receive on b
// from a (one transport tag for all of them, matched in order), run in
// posting order with the rank's collectives.
void ProcessCommunicator::post_p2p(int rank, int peer, bool is_send, void* buf,
                                   std::uint64_t count, wia_datatype_t dtype,
                                   std::uint32_t timeout_ms, wia_stream_s* stream) {
  if (rank != layout_.rank)
    throw Error(WIA_ERROR_INVALID_ARGUMENT,
                fmt::format("rank {} is not this process's rank {}", rank, layout_.rank));
  if (peer < 0 || peer >= size() || peer == rank)
    throw Error(WIA_ERROR_INVALID_ARGUMENT,
                fmt::format("rank {}: peer {} is not another rank of [0, {})", rank, peer, size()));
  if (count > 0 && buf == nullptr)
    throw Error(WIA_ERROR_INVALID_ARGUMENT,
                fmt::format("rank {}: buffer is NULL but count is {}", rank, count));
  Call call;
  call.collective = coll::Collective::kSendRecv;
  call.count = count;
  call.dtype = dtype;
  call.timeout_ms = timeout_ms;
  call.buffers.send = call.buffers.recv = static_cast<char*>(buf);
  if (!try_post_inline(call, stream, peer, is_send))
    post_gate(std::move(call), stream, peer, is_send);
}

void ProcessCommunicator::post_send(int rank, int peer, const void* buf, std::uint64_t count,
                                    wia_datatype_t dtype, std::uint32_t timeout_ms,
                                    wia_stream_s* stream) {
  post_p2p(rank, peer, true, const_cast<void*>(buf), count, dtype, timeout_ms, stream);
}

void ProcessCommunicator::post_recv(int rank, int peer, void* buf, std::uint64_t count,
                                    wia_datatype_t dtype, std::uint32_t timeout_ms,
                                    wia_stream_s* stream) {
  post_p2p(rank, peer, false, buf, count, dtype, timeout_ms, stream);
}

std::unique_ptr<ProcessCommunicator::Running> ProcessCommunicator::begin_p2p(
    std::uint64_t seq, const Call& call, int peer, bool is_send, Clock::time_point deadline) {
  std::unique_ptr<Running> r = take_running();
  r->seq = seq;
  r->peer = peer;
  r->is_send = is_send;
  r->buf = is_send ? call.buffers.send : call.buffers.recv;
  r->bytes = call.count * kernels::dtype_size(call.dtype);
  r->options.deadline = deadline;
  r->options.timeout_ms = call.timeout_ms ? call.timeout_ms : default_timeout_ms_;
  r->options.oversubscribed = oversubscribed_;
  return r;
}

// Point to point: one request on the peer's connection, all of them on one
// tag (matched in posting order).
wia_status_t ProcessCommunicator::proceed_p2p(Running& r, Clock::time_point give_up_at,
                                              std::string& error) {
  constexpr std::uint64_t kP2PTag = 1ull << 36;
  const engine::NetLink& l = peers_[r.peer].link;
  // "rank 0: send of 8 B to rank 1", formatted only for a message.
  auto what = [&] {
    return fmt::format("rank {}: {} of {} B {} rank {}", layout_.rank,
                       r.is_send ? "send" : "receive", r.bytes, r.is_send ? "to" : "from",
                       r.peer);
  };
  try {
    engine::Backoff backoff(r.options.oversubscribed);
    auto clock_checks = [&] {
      if (!backoff.read_clock()) return false;
      if (const std::string reason = r.control.poll(); !reason.empty())
        throw Error(WIA_ERROR_REMOTE, reason);
      if (backoff.now() > r.options.deadline)
        throw Error(WIA_ERROR_TIMEOUT,
                    r.request ? fmt::format("{} timed out after {} ms: rank {} has not posted "
                                            "the matching {}",
                                            what(), r.options.timeout_ms, r.peer,
                                            r.is_send ? "receive" : "send")
                              : fmt::format("{}: the transport had no resources for {} ms",
                                            what(), r.options.timeout_ms));
      return backoff.now() > give_up_at;
    };
    while (!r.request) {
      transport_call_lazy(*l.provider, what, [&](const wia_transport_ops_v1_t& t, void* ctx) {
        return r.is_send ? t.isend(ctx, l.conn, r.buf, r.bytes, kP2PTag, nullptr, &r.request)
                         : t.irecv(ctx, l.conn, r.buf, r.bytes, kP2PTag, nullptr, &r.request);
      });
      if (r.request) break;
      backoff.wait();
      if (clock_checks()) return WIA_IN_PROGRESS;
    }
    backoff.reset();
    std::uint64_t got = 0;
    for (;;) {
      std::int32_t done = 0;
      transport_call_lazy(*l.provider, what, [&](const wia_transport_ops_v1_t& t, void* ctx) {
        return t.test(ctx, r.request, &done, &got);
      });
      if (done) break;
      backoff.wait();
      if (clock_checks()) return WIA_IN_PROGRESS;
    }
    r.request = nullptr;
    if (!r.is_send && got != r.bytes)
      throw Error(WIA_ERROR_MISMATCH,
                  fmt::format("{}: rank {} sent {} B (the two calls differ in count or "
                              "datatype)",
                              what(), r.peer, got));
    return WIA_SUCCESS;
  } catch (const Error& e) {
    r.request = nullptr;  // a failed request is released by the provider
    error = e.what();
    break_communicator(e.status(), error);
    return e.status();
  }
}

bool ProcessCommunicator::drain() {
  const auto deadline =
      Clock::now() + std::chrono::milliseconds(2 * std::uint64_t(default_timeout_ms_) + 1000);
  return order_signal_.wait_until([&] { return in_flight_.load() == 0; }, deadline, false, true);
}

wia_status_t ProcessCommunicator::async_error() const {
  std::lock_guard<std::mutex> lock(err_mu_);
  return error_;
}

wia_algorithm_t ProcessCommunicator::last_selected() const {
  std::lock_guard<std::mutex> lock(err_mu_);
  return last_selected_;
}

namespace {

// A split's setup exchange runs over the parent's links: an all-gather of
// every parent rank's record, of which the new communicator keeps its
// members'.
class ParentExchange final : public Exchange {
 public:
  ParentExchange(ProcessCommunicator& parent, std::vector<int> members)
      : parent_(parent), members_(std::move(members)) {}
  std::vector<std::uint8_t> all_gather(const std::vector<std::uint8_t>& mine) override {
    std::vector<std::uint8_t> all(mine.size() * parent_.size());
    Call c;
    c.collective = coll::Collective::kAllGather;
    c.dtype = WIA_UINT8;
    c.count = mine.size();
    c.buffers.send = const_cast<char*>(reinterpret_cast<const char*>(mine.data()));
    c.buffers.recv = reinterpret_cast<char*>(all.data());
    parent_.run_now(c);
    std::vector<std::uint8_t> kept;
    for (int r : members_)
      kept.insert(kept.end(), all.begin() + r * mine.size(), all.begin() + (r + 1) * mine.size());
    return kept;
  }

 private:
  ProcessCommunicator& parent_;
  std::vector<int> members_;
};

}  // namespace

std::unique_ptr<ProcessCommunicator> ProcessCommunicator::split(int color, int key) {
  const int p = size();
  std::vector<std::int32_t> mine = {color, key};
  std::vector<std::int32_t> all(2 * static_cast<std::size_t>(p));
  Call c;
  c.collective = coll::Collective::kAllGather;
  c.dtype = WIA_INT32;
  c.count = 2;
  c.buffers.send = reinterpret_cast<char*>(mine.data());
  c.buffers.recv = reinterpret_cast<char*>(all.data());
  run_now(c);
  if (color < 0) {
    // Not a member, but the members' setup exchange runs over every rank.
    std::vector<std::uint8_t> zero(sizeof(RankRecord), 0);
    ParentExchange(*this, {}).all_gather(zero);
    return nullptr;
  }
  std::vector<int> members;
  for (int r = 0; r < p; ++r)
    if (all[2 * r] == color) members.push_back(r);
  std::stable_sort(members.begin(), members.end(),
                   [&](int a, int b) { return all[2 * a + 1] < all[2 * b + 1]; });
  ProcessLayout l;
  l.size = static_cast<int>(members.size());
  std::map<int, int> node_index;  // parent node -> new index, by first appearance
  std::map<int, int> next_local;
  for (int i = 0; i < l.size; ++i) {
    const int r = members[i];
    if (r == layout_.rank) l.rank = i;
    const int node = layout_.node_of_rank[r];
    auto [it, inserted] = node_index.emplace(node, static_cast<int>(node_index.size()));
    l.node_of_rank.push_back(it->second);
    l.local_rank_of_rank.push_back(next_local[node]++);
    if (!layout_.host_of_rank.empty()) l.host_of_rank.push_back(layout_.host_of_rank[r]);
  }
  l.nnodes = static_cast<int>(node_index.size());
  ParentExchange ex(*this, members);
  std::string preferred;
  return std::make_unique<ProcessCommunicator>(
      l, ex, device_, std::chrono::milliseconds(default_timeout_ms_), preferred);
}

}  // namespace wia::comm

namespace wia::comm {

topo::Topology ProcessCommunicator::topology() {
  // What only each rank knows: its device and NUMA node.
  struct Record {
    char device[96];
    std::int32_t numa;
    std::int32_t pad;
  };
  Record mine{};
  const Device& d = Runtime::get().device(device_);
  std::snprintf(mine.device, sizeof(mine.device), "%s%d", d.provider->name().c_str(),
                d.local_index);
  mine.numa = d.props.numa_node;
  std::vector<Record> all(static_cast<std::size_t>(size()));
  Call c;
  c.collective = coll::Collective::kAllGather;
  c.dtype = WIA_UINT8;
  c.count = sizeof(Record);
  c.buffers.send = reinterpret_cast<char*>(&mine);
  c.buffers.recv = reinterpret_cast<char*>(all.data());
  run_now(c);

  const int p = size();
  topo::Topology t;
  for (int node = 0; node < layout_.nnodes; ++node) {
    std::string name = fmt::format("node{}", node);
    for (int r = 0; r < p; ++r)
      if (layout_.node_of_rank[r] == node && !layout_.host_of_rank.empty() &&
          !layout_.host_of_rank[r].empty()) {
        name = layout_.host_of_rank[r];
        break;
      }
    // Host names need not be unique (faked hosts, containers): the node
    // index keeps them apart.
    for (const std::string& other : t.node_names)
      if (other == name) name += fmt::format("#{}", node);
    t.node_names.push_back(name);
  }
  t.resize(p);
  const tuner::LinkModel& m = selector_->model();
  for (int r = 0; r < p; ++r) {
    t.node_of.push_back(layout_.node_of_rank[r]);
    t.device_names.push_back(fmt::format("{}/rank{}:{}", t.node_names[layout_.node_of_rank[r]], r,
                                         std::string(all[r].device, strnlen(all[r].device,
                                                                            sizeof(all[r].device)))));
    t.numa_of.push_back(all[r].numa);
    t.process_of.push_back(r);
  }
  // Every rank computed every link's transport alike; this rank knows its
  // own links' names, the model has every pair's figures.
  for (int a = 0; a < p; ++a)
    for (int b = 0; b < p; ++b) {
      if (a == b) continue;
      const bool same_node = layout_.node_of_rank[a] == layout_.node_of_rank[b];
      const std::size_t k = t.at(a, b);
      t.bandwidth[k] = m.bandwidth(a, b);
      t.latency[k] = m.alpha(a, b);
      t.hops[k] = same_node ? 1 : 2;
      const std::string& transport = link_transport_[static_cast<std::size_t>(a) * p + b];
      t.type[k] = t.type_index(transport == "shm" ? "shared_memory" : transport);
      t.p2p[k] = 0;
    }
  return t;
}

}  // namespace wia::comm
