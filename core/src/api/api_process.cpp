// SPDX-License-Identifier: Apache-2.0
// Process-based communicators (spec 6.6, 6.6.1, 6.10): rendezvous through
// the bootstrap, then comm/process_communicator.
#include <wia/wia.h>

#include <cstring>

#include <fmt/format.h>

#include "api/communicators.hpp"
#include "api/compress_job.hpp"
#include "api/guard.hpp"
#include "api/p2p.hpp"
#include "bootstrap/bootstrap.hpp"
#include "comm/process_communicator.hpp"
#include "common/log.hpp"
#include "discovery/discovery.hpp"
#include "runtime/objects.hpp"
#include "runtime/runtime.hpp"
#include "topology/topology.hpp"

using namespace wia;

namespace {

bootstrap::Options bootstrap_options() {
  return bootstrap::Options::from_config(Runtime::get().config());
}

comm::ProcessCommunicator& process_comm(wia_communicator_t c, const char* what) {
  auto* p = dynamic_cast<comm::ProcessCommunicator*>(&api::live(c));
  if (!p)
    throw Error(WIA_ERROR_NOT_SUPPORTED,
                fmt::format("{} needs a process-based communicator; for device-based ones, create "
                            "sub-communicators with wia_create_communicator over a subset of "
                            "the devices (spec 6.6)",
                            what));
  return *p;
}

int calling_rank(comm::CommunicatorBase& c) {
  const int rank = c.rank_of_device(current_device());
  if (rank < 0)
    throw Error(WIA_ERROR_INVALID_ARGUMENT,
                fmt::format("the current device {} is not a member of this communicator",
                            current_device()));
  return rank;
}

}  // namespace

extern "C" {

WIA_API wia_status_t wia_get_unique_id(wia_unique_id_t* id) {
  return api::guard(__func__, [&] {
    api::require_non_null(id, "id");
    static_assert(sizeof(id->internal) == bootstrap::kUniqueIdBytes);
    const bootstrap::UniqueId u = bootstrap::create_unique_id(bootstrap_options());
    std::memcpy(id->internal, u.bytes.data(), u.bytes.size());
  });
}

WIA_API wia_status_t wia_create_communicator_from_id(const wia_unique_id_t* id, int nranks,
                                                     int rank, wia_communicator_t* comm) {
  return api::guard(__func__, [&] {
    api::require_non_null(id, "id");
    api::require_non_null(comm, "comm");
    if (nranks < 1 || rank < 0 || rank >= nranks)
      throw Error(WIA_ERROR_INVALID_ARGUMENT,
                  fmt::format("rank {} of {} ranks: need 0 <= rank < nranks", rank, nranks));
    bootstrap::UniqueId u;
    std::memcpy(u.bytes.data(), id->internal, u.bytes.size());
    const wia_device_t device = current_device();
    auto bs = bootstrap::Bootstrap::from_unique_id(u, rank, nranks, bootstrap_options());
    *comm = api::publish(comm::ProcessCommunicator::create(*bs, device));
    api::note_distributed_communicator(*comm);
  });
}

WIA_API wia_status_t wia_create_distributed_communicator(const wia_distributed_config_t* config,
                                                         wia_communicator_t* comm) {
  return api::guard(__func__, [&] {
    api::require_non_null(comm, "comm");
    wia_distributed_config_t cfg{};
    if (config) cfg = *config;
    const int backend = static_cast<int>(cfg.network_backend);
    if (backend < WIA_NET_AUTO || backend > WIA_NET_SHM)
      throw Error(WIA_ERROR_INVALID_ARGUMENT,
                  fmt::format("config->network_backend is {}: expected WIA_NET_AUTO, _TCP, "
                              "_RDMA or _SHM",
                              backend));
    if (cfg.compression != WIA_NET_COMPRESS_NONE && cfg.compression != WIA_NET_COMPRESS_AUTO)
      throw Error(WIA_ERROR_INVALID_ARGUMENT,
                  fmt::format("config->compression is {}: expected WIA_NET_COMPRESS_NONE or "
                              "_AUTO",
                              static_cast<int>(cfg.compression)));
    const wia_device_t device = current_device();
    auto bs = bootstrap::Bootstrap::from_environment(bootstrap_options());
    if (cfg.num_nodes > 0 && cfg.num_nodes != bs->nnodes())
      throw Error(WIA_ERROR_INVALID_ARGUMENT,
                  fmt::format("config->num_nodes is {} but the launch spans {} node(s)",
                              cfg.num_nodes, bs->nnodes()));
    if (cfg.devices_per_node > 0 && cfg.devices_per_node != bs->local_size())
      throw Error(WIA_ERROR_INVALID_ARGUMENT,
                  fmt::format("config->devices_per_node is {} but node {} has {} rank(s)",
                              cfg.devices_per_node, bs->node(), bs->local_size()));
    if (backend == WIA_NET_SHM && bs->nnodes() > 1)
      throw Error(WIA_ERROR_INVALID_ARGUMENT,
                  fmt::format("config->network_backend is WIA_NET_SHM but the launch spans {} "
                              "nodes",
                              bs->nnodes()));
    std::string preferred;
    if (backend == WIA_NET_TCP) preferred = "tcp";
    if (backend == WIA_NET_RDMA) preferred = "verbs";
    *comm = api::publish(comm::ProcessCommunicator::create(*bs, device, preferred));
    api::note_distributed_communicator(*comm);
    if (cfg.compression == WIA_NET_COMPRESS_AUTO) api::compressed::link_codec_auto(*comm);
  });
}

WIA_API int wia_comm_node_rank(wia_communicator_t comm) {
  int r = -1;
  api::guard(__func__, [&] {
    auto& c = api::live(comm);
    r = c.node_rank(calling_rank(c));
  });
  return r;
}

WIA_API int wia_comm_local_rank(wia_communicator_t comm) {
  int r = -1;
  api::guard(__func__, [&] {
    auto& c = api::live(comm);
    r = c.local_rank(calling_rank(c));
  });
  return r;
}

WIA_API int wia_comm_node_count(wia_communicator_t comm) {
  int r = -1;
  api::guard(__func__, [&] { r = api::live(comm).node_count(); });
  return r;
}

WIA_API wia_status_t wia_comm_discover_topology(wia_communicator_t comm,
                                                wia_topology_t* topology) {
  return api::guard(__func__, [&] {
    api::require_non_null(topology, "topology");
    comm::CommunicatorBase& c = api::live(comm);
    if (auto* p = dynamic_cast<comm::ProcessCommunicator*>(&c)) {
      topo::to_c(p->topology(), topology);
      return;
    }
    // A device communicator: the discovered topology, its devices in rank
    // order.
    const topo::Topology all = discovery::discover_topology();
    std::vector<int> pick;
    for (int r = 0; r < c.size(); ++r) {
      for (wia_device_t d = 0; d < all.n; ++d)
        if (c.rank_of_device(d) == r) pick.push_back(d);
    }
    if (static_cast<int>(pick.size()) != c.size())
      throw Error(WIA_ERROR_INTERNAL, "the communicator's devices are not all in the topology");
    topo::Topology t;
    t.node_names = all.node_names;
    t.interconnect = all.interconnect;
    t.resize(c.size());
    for (int i = 0; i < c.size(); ++i) {
      t.device_names.push_back(all.device_names[pick[i]]);
      t.node_of.push_back(all.node_of[pick[i]]);
      t.numa_of.push_back(all.numa(pick[i]));
      t.process_of.push_back(all.process(pick[i]));
      for (int j = 0; j < c.size(); ++j) {
        if (i == j) continue;
        const std::size_t from = all.at(pick[i], pick[j]), to = t.at(i, j);
        t.bandwidth[to] = all.bandwidth[from];
        t.latency[to] = all.latency[from];
        t.hops[to] = all.hops[from];
        t.type[to] = t.type_index(all.type_name(pick[i], pick[j]));
        t.p2p[to] = all.p2p[from];
      }
    }
    topo::to_c(std::move(t), topology);
  });
}

WIA_API wia_status_t wia_comm_split(wia_communicator_t comm, int color, int key,
                                    wia_communicator_t* newcomm) {
  return api::guard(__func__, [&] {
    api::require_non_null(newcomm, "newcomm");
    *newcomm = nullptr;
    auto child = process_comm(comm, "wia_comm_split").split(color, key);
    if (child) *newcomm = api::publish(std::move(child));
  });
}

WIA_API wia_status_t wia_comm_create_hierarchy(wia_communicator_t comm,
                                               wia_comm_hierarchy_t* hierarchy) {
  return api::guard(__func__, [&] {
    api::require_non_null(hierarchy, "hierarchy");
    comm::ProcessCommunicator& c = process_comm(comm, "wia_comm_create_hierarchy");
    const int rank = c.rank();
    const int node = c.node_rank(rank);
    if (c.node_count() > WIA_MAX_HIERARCHY_NODES)
      throw Error(WIA_ERROR_NOT_SUPPORTED,
                  fmt::format("the communicator spans {} nodes; wia_comm_hierarchy_t holds at "
                              "most {}",
                              c.node_count(), WIA_MAX_HIERARCHY_NODES));
    wia_comm_hierarchy_t h{};
    h.num_nodes = c.node_count();
    h.my_node = node;
    h.is_node_representative = c.local_rank(rank) == 0;
    h.node_representative_rank = 0;
    auto node_comm = c.split(node, rank);
    auto inter = c.split(h.is_node_representative ? 0 : WIA_COMM_SPLIT_NOCOLOR, rank);
    h.node_comms[node] = api::publish(std::move(node_comm));
    if (inter) h.inter_node_comm = api::publish(std::move(inter));
    *hierarchy = h;
  });
}

WIA_API wia_status_t wia_comm_destroy_hierarchy(wia_comm_hierarchy_t* hierarchy) {
  return api::guard(__func__, [&] {
    api::require_non_null(hierarchy, "hierarchy");
    for (auto& c : hierarchy->node_comms)
      if (c) api::destroy_communicator(c), c = nullptr;
    if (hierarchy->inter_node_comm) {
      api::destroy_communicator(hierarchy->inter_node_comm);
      hierarchy->inter_node_comm = nullptr;
    }
  });
}

}  // extern "C"
