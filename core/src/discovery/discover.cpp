// SPDX-License-Identifier: Apache-2.0
// Topology discovery: the runtime's devices placed in the machine that hwloc
// sees (packages, NUMA nodes, PCI devices), one link record per pair, and
// the measured figures of tuner.link_file laid over them.
#include <fmt/format.h>
#include <hwloc.h>
#include <unistd.h>

#include <climits>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/error.hpp"
#include "common/log.hpp"
#include "discovery/discovery.hpp"
#include "runtime/device_call.hpp"
#include "runtime/runtime.hpp"
#include "topology/topology.hpp"

namespace wia::discovery {

using topo::find_link_defaults;
using topo::LinkDefaults;
using topo::load_yaml;
using topo::Topology;

namespace {

class Hwloc {
 public:
  explicit Hwloc(bool with_pci) {
    if (hwloc_topology_init(&topo_) != 0)
      throw Error(WIA_ERROR_INTERNAL, "hwloc_topology_init failed");
    // PCI devices are needed to place devices that have a bus id (bridges
    // are not). Without such devices the PCI scan is skipped: it costs
    // time, and its backend (libpciaccess) leaks at exit.
    hwloc_topology_set_io_types_filter(
        topo_, with_pci ? HWLOC_TYPE_FILTER_KEEP_IMPORTANT : HWLOC_TYPE_FILTER_KEEP_NONE);
    if (hwloc_topology_load(topo_) != 0) {
      hwloc_topology_destroy(topo_);
      throw Error(WIA_ERROR_INTERNAL, "hwloc_topology_load failed");
    }
  }
  ~Hwloc() { hwloc_topology_destroy(topo_); }
  Hwloc(const Hwloc&) = delete;
  Hwloc& operator=(const Hwloc&) = delete;
  hwloc_topology_t get() const { return topo_; }

 private:
  hwloc_topology_t topo_ = nullptr;
};

// The NUMA node object a device sits at: its PCI device's locality when
// hwloc knows the bus id and that locality is one NUMA node, else the NUMA
// node the provider reported; nullptr when neither is known.
hwloc_obj_t locate(hwloc_topology_t topo, const Device& d) {
  if (d.props.pci_bus_id[0] != '\0') {
    hwloc_obj_t pci = hwloc_get_pcidev_by_busidstring(topo, d.props.pci_bus_id);
    if (pci != nullptr) {
      hwloc_obj_t cpu_side = hwloc_get_non_io_ancestor_obj(topo, pci);
      if (cpu_side != nullptr && cpu_side->nodeset != nullptr &&
          hwloc_bitmap_weight(cpu_side->nodeset) == 1) {
        hwloc_obj_t numa = hwloc_get_numanode_obj_by_os_index(
            topo, static_cast<unsigned>(hwloc_bitmap_first(cpu_side->nodeset)));
        if (numa != nullptr) return numa;
      }
    }
  }
  if (d.props.numa_node >= 0)
    return hwloc_get_numanode_obj_by_os_index(topo, static_cast<unsigned>(d.props.numa_node));
  return nullptr;
}

// The CPU-side container of a NUMA node: its package, or its parent when
// the node hangs above packages.
hwloc_obj_t container(hwloc_topology_t topo, hwloc_obj_t numa) {
  hwloc_obj_t pkg = hwloc_get_ancestor_obj_by_type(topo, HWLOC_OBJ_PACKAGE, numa);
  return pkg != nullptr ? pkg : numa->parent;
}

// Hops between two device locations (docs/topology.md): 1 on the same NUMA
// node (or when neither location is known), 2 across NUMA nodes of one
// package or across directly linked packages, plus one per grouping level
// (hwloc Group objects) between the packages and their common ancestor.
int hops_between(hwloc_topology_t topo, hwloc_obj_t a, hwloc_obj_t b) {
  if (a == b) return 1;
  if (a == nullptr || b == nullptr) return 2;
  hwloc_obj_t pa = container(topo, a);
  hwloc_obj_t pb = container(topo, b);
  if (pa == nullptr || pb == nullptr || pa == pb) return 2;
  hwloc_obj_t lca = hwloc_get_common_ancestor_obj(topo, pa, pb);
  const int extra =
      lca == nullptr ? 0 : static_cast<int>(pa->depth) - static_cast<int>(lca->depth) - 1;
  return 2 + (extra > 0 ? extra : 0);
}

bool is_host_device(const Device& d) {
  return d.props.type == WIA_DEVICE_CPU || (d.props.flags & WIA_DEVICE_FLAG_HOST_ACCESSIBLE) != 0;
}

bool can_access(const Device& a, const Device& b) {
  if (a.provider != b.provider) return false;
  std::int32_t can = 0;
  device_call(a, "can_access_peer", [&](const wia_device_ops_v1_t& o, void* ctx) {
    return o.can_access_peer(ctx, a.local_index, b.local_index, &can);
  });
  return can != 0;
}

std::string host_name() {
  char buf[HOST_NAME_MAX + 1] = {};
  if (gethostname(buf, sizeof buf - 1) != 0 || buf[0] == '\0') return "node0";
  return buf;
}

std::string local_name(const std::string& full) {
  const auto slash = full.rfind('/');
  return slash == std::string::npos ? full : full.substr(slash + 1);
}

// Which device of `measured` each of t's devices is (-1: none), by full
// name, else (when no full name matches) by unique device name.
std::vector<int> match_devices(const Topology& t, const Topology& measured, bool* by_full_name) {
  std::map<std::string, int> full, local;
  std::map<std::string, int> local_count;
  for (int i = 0; i < measured.n; ++i) {
    const std::string& name = measured.device_names[static_cast<std::size_t>(i)];
    full.emplace(name, i);
    local.emplace(local_name(name), i);
    ++local_count[local_name(name)];
  }
  std::vector<int> of(static_cast<std::size_t>(t.n), -1);
  bool any = false;
  for (int i = 0; i < t.n; ++i) {
    const auto it = full.find(t.device_names[static_cast<std::size_t>(i)]);
    if (it != full.end()) of[static_cast<std::size_t>(i)] = it->second, any = true;
  }
  *by_full_name = any;
  if (any) return of;
  for (int i = 0; i < t.n; ++i) {
    const std::string name = local_name(t.device_names[static_cast<std::size_t>(i)]);
    const auto it = local.find(name);
    if (it != local.end() && local_count[name] == 1) of[static_cast<std::size_t>(i)] = it->second;
  }
  return of;
}

// tuner.link_file: the measured figures where they match, a warning naming
// the file where they cannot be used.
void use_link_file(Topology& t, const std::string& path) {
  if (t.n < 2) return;  // no link to measure
  Topology measured;
  try {
    measured = load_yaml(path);
  } catch (const Error& e) {
    log::warn("topology",
              "measured links not used (tuner.link_file): {}; discovery keeps the provider "
              "figures",
              e.what());
    return;
  }
  const int updated = apply_measured_links(t, measured);
  if (updated == 0) {
    log::warn("topology",
              "measured links not used (tuner.link_file): {}: none of its {} device(s) ({}{}) "
              "pairs with this process's devices ({}{}); discovery keeps the provider figures",
              path, measured.n, measured.n > 0 ? measured.device_names[0] : "",
              measured.n > 1 ? ", ..." : "", t.device_names[0], t.n > 1 ? ", ..." : "");
    return;
  }
  log::info("topology",
            "bandwidth and latency of {} of {} link(s) measured, from {} (tuner.link_file); the "
            "others keep the provider figures",
            updated, t.n * (t.n - 1), path);
}

}  // namespace

int apply_measured_links(Topology& t, const Topology& measured) {
  bool by_full_name = false;
  const std::vector<int> of = match_devices(t, measured, &by_full_name);
  int updated = 0;
  for (int i = 0; i < t.n; ++i)
    for (int j = 0; j < t.n; ++j) {
      const int mi = of[static_cast<std::size_t>(i)], mj = of[static_cast<std::size_t>(j)];
      if (i == j || mi < 0 || mj < 0 || mi == mj) continue;
      const std::size_t m = measured.at(mi, mj);
      if (!(measured.bandwidth[m] > 0.0)) continue;
      t.bandwidth[t.at(i, j)] = measured.bandwidth[m];
      t.latency[t.at(i, j)] = measured.latency[m];
      ++updated;
    }
  if (updated > 0 && !by_full_name)
    log::debug("topology",
               "measured links matched by device name (no full node/device name matched)");
  return updated;
}

Topology discover_topology() {
  const auto& devices = Runtime::get().devices();
  bool any_pci = false;
  for (const Device& d : devices) any_pci = any_pci || d.props.pci_bus_id[0] != '\0';
  Hwloc hw(any_pci);
  hwloc_topology_t topo = hw.get();
  log::debug("topology", "hwloc: {} packages, {} NUMA nodes, {} PCI devices",
             hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_PACKAGE),
             hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_NUMANODE),
             hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_PCI_DEVICE));

  Topology t;
  const int n = static_cast<int>(devices.size());
  t.resize(n);
  t.node_names.push_back(host_name());
  std::vector<hwloc_obj_t> where;
  for (const Device& d : devices) {
    where.push_back(locate(topo, d));
    t.device_names.push_back(
        fmt::format("{}/{}{}", t.node_names[0], d.provider->name(), d.local_index));
    t.node_of.push_back(0);
    // One process drives every discovered device; NUMA by hwloc's index.
    t.process_of.push_back(0);
    t.numa_of.push_back(where.back() != nullptr ? static_cast<int>(where.back()->logical_index)
                                                : -1);
  }

  for (int i = 0; i < n; ++i) {
    for (int j = 0; j < n; ++j) {
      if (i == j) continue;
      const Device& a = devices[static_cast<std::size_t>(i)];
      const Device& b = devices[static_cast<std::size_t>(j)];
      const auto ui = static_cast<std::size_t>(i), uj = static_cast<std::size_t>(j);
      const char* type;
      bool p2p;
      if (a.provider == b.provider && is_host_device(a) && is_host_device(b)) {
        // One address space: a copy is a memcpy, local or across sockets.
        type = where[ui] == where[uj] ? "shared_memory" : "cross_numa";
        p2p = true;
      } else if (can_access(a, b)) {
        type = "peer";
        p2p = true;
      } else {
        type = "host_staged";
        p2p = false;
      }
      const LinkDefaults* def = find_link_defaults(type);
      const auto k = t.at(i, j);
      t.type[k] = t.type_index(type);
      t.p2p[k] = p2p ? 1 : 0;
      t.bandwidth[k] = def->bandwidth_gbps;
      t.latency[k] = def->latency_us;
      t.hops[k] = hops_between(topo, where[ui], where[uj]);
    }
  }
  const std::string link_file = Runtime::get().config().get_string("tuner.link_file");
  if (!link_file.empty()) use_link_file(t, link_file);
  return t;
}

}  // namespace wia::discovery
