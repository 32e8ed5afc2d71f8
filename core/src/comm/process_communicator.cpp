// SPDX-License-Identifier: Apache-2.0
// The process communicator's lifetime: construction (settings, then the
// mesh set-up of process_mesh.cpp), creation from a bootstrap, and
// destruction (goodbye to the peers, connections closed). The other
// process_*.cpp files are listed in process_communicator.hpp.
#include "comm/process_communicator.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <optional>

#include "bootstrap/bootstrap.hpp"
#include "comm/node_windows.hpp"
#include "comm/process_internal.hpp"
#include "common/cpus.hpp"
#include "common/error.hpp"
#include "common/log.hpp"
#include "runtime/device_call.hpp"
#include "runtime/objects.hpp"
#include "runtime/runtime.hpp"

namespace wia::comm {

namespace {

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

ProcessCommunicator::ProcessCommunicator(const ProcessLayout& layout, Exchange& exchange,
                                         wia_device_t device,
                                         std::chrono::milliseconds setup_timeout,
                                         const std::string& preferred_inter_node)
    : layout_(layout),
      device_(device),
      flight_(static_cast<std::size_t>(Runtime::get().config().get_int("flight_recorder.entries"))),
      flight_dir_(Runtime::get().config().get_string("flight_recorder.dir")) {
  static std::atomic<int> created{0};
  comm_index_ = ++created;
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
  post_progress_ = std::chrono::microseconds(rt.config().get_int("collectives.post_progress_us"));
  post_progress_max_bytes_ =
      static_cast<std::uint64_t>(rt.config().get_int("collectives.post_progress_max_bytes"));
  one_shot_max_bytes_ =
      static_cast<std::uint64_t>(rt.config().get_int("collectives.one_shot_max_bytes"));
  node_window_max_bytes_ =
      static_cast<std::uint64_t>(rt.config().get_int("collectives.node_window_max_bytes"));
  node_window_one_shot_peer_bytes_ = static_cast<std::uint64_t>(
      rt.config().get_int("collectives.node_window_one_shot_peer_bytes"));
  node_window_zero_copy_min_bytes_ = static_cast<std::uint64_t>(
      rt.config().get_int("collectives.node_window_zero_copy_min_bytes"));
  // Until the ranks' CPUs are known (connect_mesh): the CPUs this process may run on.
  const int cores = usable_cpu_count();
  int local_size = 0;
  for (int r = 0; r < layout_.size; ++r)
    local_size += layout_.node_of_rank[r] == layout_.node_of_rank[layout_.rank];
  oversubscribed_ = local_size > cores;
  if (const char* e = std::getenv("WIA_PROBE_LINKS")) probe_inter_node_ = std::string(e) != "0";
  connect_mesh(exchange, setup_timeout, preferred_inter_node);
  if (layout_.size > 1) {
    heartbeat_ms_ = static_cast<std::uint32_t>(rt.config().get_int("collectives.heartbeat_ms"));
    heartbeat_timeout_ms_ =
        static_cast<std::uint32_t>(rt.config().get_int("collectives.heartbeat_timeout_ms"));
    // Fewer than two periods would declare a peer dead for one late tick.
    heartbeat_timeout_ms_ = std::max(heartbeat_timeout_ms_, 2 * heartbeat_ms_);
  }
  start_heartbeat();
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
  stop_heartbeat();  // from here on this thread alone uses the connections
  // Aborted while idle: tell the peers (every operation has drained, so
  // this thread may use the connections) rather than say goodbye.
  if (abort_requested_.load() && !broken_.load())
    break_communicator(WIA_ERROR_ABORTED,
                       fmt::format("wia_comm_abort was called on rank {}", layout_.rank));
  if (!broken_.load()) {
    try {
      Control(*this).goodbye(
          std::chrono::milliseconds(std::min<std::uint32_t>(default_timeout_ms_, 5000)));
    } catch (const std::exception& e) {
      log::debug("comm", "rank {}: goodbye: {}", layout_.rank, e.what());
    }
  }
  close_all();
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

void ProcessCommunicator::request_abort() {
  abort_requested_.store(true);
  order_signal_.notify();
}

std::vector<int> ProcessCommunicator::failed_ranks() const {
  std::lock_guard<std::mutex> lock(err_mu_);
  return failed_ranks_;
}

void ProcessCommunicator::note_failed(int rank) {
  if (rank < 0 || rank >= layout_.size || rank == layout_.rank) return;
  std::lock_guard<std::mutex> lock(err_mu_);
  const auto it = std::lower_bound(failed_ranks_.begin(), failed_ranks_.end(), rank);
  if (it == failed_ranks_.end() || *it != rank) failed_ranks_.insert(it, rank);
}

wia_status_t ProcessCommunicator::async_error() const {
  std::lock_guard<std::mutex> lock(err_mu_);
  return error_;
}

double ProcessCommunicator::slowest_link_gbps() {
  std::lock_guard<std::mutex> lock(mu_);
  if (!selector_) return 0.0;
  return selector_->model().slowest_gbps();
}

std::optional<tuner::LinkModel> ProcessCommunicator::cost_model() {
  std::lock_guard<std::mutex> lock(mu_);
  if (!selector_) return std::nullopt;
  return selector_->model();
}

wia_algorithm_t ProcessCommunicator::last_selected() const {
  std::lock_guard<std::mutex> lock(err_mu_);
  return last_selected_;
}

}  // namespace wia::comm
