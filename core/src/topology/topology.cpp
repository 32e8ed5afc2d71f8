// SPDX-License-Identifier: Apache-2.0
// The topology model, the default figures per link type, and the C view.
#include "topology/topology.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <memory>

#include "common/error.hpp"

namespace wia::topo {

namespace {

// Default link figures where nothing was measured (wia-bw's file will
// replace them). Bandwidth is one direction, in GB/s; latency is one-way for
// a small message. Interconnect figures are the spec's table (6.2.2);
// memory-path figures are conservative single-stream memcpy rates.
constexpr LinkDefaults kDefaults[] = {
    // NVLink 3.0 between GPUs of one node: ~300 GB/s, ~1-2 us.
    {"nvlink", 300.0, 1.5},
    // Host devices on the same NUMA node: one memcpy within local DRAM.
    {"shared_memory", 20.0, 0.5},
    // Devices of one provider that can address each other (PCIe 4.0 x16
    // peer-to-peer unless the provider says better): ~32 GB/s, ~5-10 us.
    {"peer", 32.0, 5.0},
    {"pcie", 32.0, 7.5},
    // Host devices on different NUMA nodes: across the socket interconnect.
    {"cross_numa", 12.0, 1.0},
    // Across sockets over PCIe (through the CPUs' interconnect).
    {"pcie_cross_socket", 16.0, 10.0},
    // InfiniBand HDR between nodes: 200 Gb/s = 25 GB/s, ~1-2 us.
    {"infiniband_hdr", 25.0, 1.5},
    // 100 Gb Ethernet between nodes: 12.5 GB/s, ~10-50 us.
    {"ethernet_100g", 12.5, 20.0},
    // No direct path: copied through host memory by the runtime (two PCIe
    // legs and a synchronisation).
    {"host_staged", 12.0, 15.0},
};

}  // namespace

std::span<const LinkDefaults> link_defaults() { return kDefaults; }

const LinkDefaults* find_link_defaults(std::string_view type) {
  for (const auto& d : kDefaults)
    if (type == d.type) return &d;
  return nullptr;
}

void Topology::resize(int devices) {
  n = devices;
  const auto nn = static_cast<std::size_t>(n) * n;
  bandwidth.assign(nn, 0.0);
  latency.assign(nn, 0.0);
  hops.assign(nn, 0);
  type.assign(nn, -1);
  p2p.assign(nn, 0);
  const int self = type_index(kSelfLink);
  for (int i = 0; i < n; ++i) {
    type[at(i, i)] = self;
    p2p[at(i, i)] = 1;
  }
}

int Topology::type_index(std::string_view name) {
  for (std::size_t k = 0; k < types.size(); ++k)
    if (types[k] == name) return static_cast<int>(k);
  types.emplace_back(name);
  return static_cast<int>(types.size() - 1);
}

const std::string& Topology::type_name(int i, int j) const {
  static const std::string kUnset;
  const int k = type[at(i, j)];
  return k < 0 ? kUnset : types[static_cast<std::size_t>(k)];
}

std::string Topology::fastest_link_type() const {
  if (n < 2) return "none";
  int best = -1;
  double best_bw = -1.0, best_lat = 0.0;
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < n; ++j) {
      if (i == j) continue;
      const auto k = at(i, j);
      if (bandwidth[k] > best_bw || (bandwidth[k] == best_bw && latency[k] < best_lat)) {
        best = type[k];
        best_bw = bandwidth[k];
        best_lat = latency[k];
      }
    }
  return best < 0 ? std::string("none") : types[static_cast<std::size_t>(best)];
}

}  // namespace wia::topo

// Owns the model and the row tables the C struct points into.
struct wia_topology_store_s {
  wia::topo::Topology t;
  std::string interconnect;
  std::vector<double*> bw_rows, lat_rows;
  std::vector<int*> hop_rows;
  std::vector<const char*> type_cells;
  std::vector<const char**> type_rows;
  std::unique_ptr<bool[]> p2p_cells;
  std::vector<bool*> p2p_rows;
  std::vector<const char*> device_names, node_names;
};

namespace wia::topo {

void to_c(Topology t, wia_topology_t* out) {
  auto s = std::make_unique<wia_topology_store_s>();
  s->t = std::move(t);
  Topology& m = s->t;
  const int n = m.n;
  const auto nn = static_cast<std::size_t>(n) * n;
  s->interconnect = m.interconnect.empty() ? m.fastest_link_type() : m.interconnect;
  s->type_cells.resize(nn);
  s->p2p_cells = std::make_unique<bool[]>(nn == 0 ? 1 : nn);
  for (std::size_t k = 0; k < nn; ++k) {
    s->type_cells[k] = m.type[k] < 0 ? "" : m.types[static_cast<std::size_t>(m.type[k])].c_str();
    s->p2p_cells[k] = m.p2p[k] != 0;
  }
  for (int i = 0; i < n; ++i) {
    const auto row = static_cast<std::size_t>(i) * n;
    s->bw_rows.push_back(m.bandwidth.data() + row);
    s->lat_rows.push_back(m.latency.data() + row);
    s->hop_rows.push_back(m.hops.data() + row);
    s->type_rows.push_back(s->type_cells.data() + row);
    s->p2p_rows.push_back(s->p2p_cells.get() + row);
    s->device_names.push_back(m.device_names[static_cast<std::size_t>(i)].c_str());
  }
  for (const auto& name : m.node_names) s->node_names.push_back(name.c_str());

  wia_topology_t c{};
  c.num_devices = n;
  c.interconnect_name = s->interconnect.c_str();
  c.bandwidth_gbps = s->bw_rows.data();
  c.latency_us = s->lat_rows.data();
  c.hop_count = s->hop_rows.data();
  c.link_type = s->type_rows.data();
  c.p2p_capable = s->p2p_rows.data();
  c.num_nodes = m.num_nodes();
  c.node_of_device = m.node_of.data();
  c.device_names = s->device_names.data();
  c.node_names = s->node_names.data();
  c.store = s.release();
  *out = c;
}

void free_c(wia_topology_t* t) noexcept {
  delete t->store;
  *t = wia_topology_t{};
}

Topology from_c(const wia_topology_t& c) {
  auto bad = [](const std::string& what) { throw Error(WIA_ERROR_INVALID_ARGUMENT, what); };
  if (c.num_devices < 0) bad(fmt::format("topology->num_devices is {}", c.num_devices));
  const int n = c.num_devices;
  if (n > 0 && (c.bandwidth_gbps == nullptr || c.latency_us == nullptr || c.hop_count == nullptr ||
                c.link_type == nullptr || c.p2p_capable == nullptr))
    bad("topology has a NULL matrix (bandwidth_gbps, latency_us, hop_count, link_type or "
        "p2p_capable)");
  const int nodes = c.node_of_device == nullptr ? 1 : std::max(c.num_nodes, 1);
  Topology t;
  t.resize(n);
  t.node_names.resize(static_cast<std::size_t>(nodes));
  for (int k = 0; k < nodes; ++k)
    t.node_names[static_cast<std::size_t>(k)] =
        c.node_names != nullptr && c.node_names[k] != nullptr ? std::string(c.node_names[k])
                                                              : fmt::format("node{}", k);
  for (int i = 0; i < n; ++i) {
    const int node = c.node_of_device == nullptr ? 0 : c.node_of_device[i];
    if (node < 0 || node >= nodes)
      bad(fmt::format("topology->node_of_device[{}] is {} (num_nodes {})", i, node, nodes));
    t.node_of.push_back(node);
    t.device_names.push_back(c.device_names != nullptr && c.device_names[i] != nullptr
                                 ? std::string(c.device_names[i])
                                 : fmt::format("dev{}", i));
    if (c.bandwidth_gbps[i] == nullptr || c.latency_us[i] == nullptr || c.hop_count[i] == nullptr ||
        c.link_type[i] == nullptr || c.p2p_capable[i] == nullptr)
      bad(fmt::format("topology row {} is NULL", i));
    for (int j = 0; j < n; ++j) {
      const auto k = t.at(i, j);
      t.bandwidth[k] = c.bandwidth_gbps[i][j];
      t.latency[k] = c.latency_us[i][j];
      t.hops[k] = c.hop_count[i][j];
      t.type[k] = t.type_index(c.link_type[i][j] != nullptr ? c.link_type[i][j] : "");
      t.p2p[k] = c.p2p_capable[i][j] ? 1 : 0;
    }
  }
  if (c.interconnect_name != nullptr) t.interconnect = c.interconnect_name;
  // Not in the C view: where devices sit inside a node (library-built only).
  if (c.store != nullptr && c.store->t.n == n) {
    t.numa_of = c.store->t.numa_of;
    t.process_of = c.store->t.process_of;
  }
  return t;
}

}  // namespace wia::topo
