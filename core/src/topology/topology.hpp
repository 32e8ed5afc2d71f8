// SPDX-License-Identifier: Apache-2.0
// The topology model behind wia_topology_t: n devices grouped in nodes and
// one link record per ordered pair, stored as flat n*n arrays. YAML files,
// analysis and diff work on this, and discovery (core/src/discovery/) fills
// it; the C struct is a view of it. A data layer: nothing here asks the
// runtime or a provider.
#pragma once

#include <wia/topology.h>

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace wia::topo {

// Default figures of one link type, used where nothing was measured.
struct LinkDefaults {
  const char* type;
  double bandwidth_gbps;
  double latency_us;
};
// The built-in table (topology.cpp), fastest first.
std::span<const LinkDefaults> link_defaults();
// The entry for `type`, nullptr when the type is not in the table.
const LinkDefaults* find_link_defaults(std::string_view type);

inline constexpr const char* kSelfLink = "self";

struct Topology {
  int n = 0;
  std::vector<std::string> device_names;  // [n], unique
  std::vector<int> node_of;               // [n]
  std::vector<std::string> node_names;    // [num nodes], unique
  std::string interconnect;               // "" = derive (fastest link present)
  // Where each device sits inside its node, for the selector's link
  // classes. Empty vectors mean the defaults: NUMA unknown (-1) and one
  // process per device (each rank drives one device). Process ids are
  // global (distinct across nodes); NUMA ids are local to a node.
  std::vector<int> numa_of;     // [n] or empty
  std::vector<int> process_of;  // [n] or empty

  std::vector<double> bandwidth;   // [n*n] GB/s
  std::vector<double> latency;     // [n*n] us
  std::vector<int> hops;           // [n*n]
  std::vector<int> type;           // [n*n] index into types
  std::vector<std::uint8_t> p2p;   // [n*n]
  std::vector<std::string> types;  // distinct link type names

  // Sizes every matrix for n devices, diagonal set to the "self" link,
  // other pairs to type "" (unset: -1 in `type`).
  void resize(int devices);
  std::size_t at(int i, int j) const { return static_cast<std::size_t>(i) * n + j; }
  int type_index(std::string_view name);
  const std::string& type_name(int i, int j) const;
  // The fastest link type among distinct pairs (bandwidth, then latency);
  // "none" when n < 2.
  std::string fastest_link_type() const;
  int num_nodes() const { return static_cast<int>(node_names.size()); }
  int numa(int i) const { return numa_of.empty() ? -1 : numa_of[static_cast<std::size_t>(i)]; }
  int process(int i) const {
    return process_of.empty() ? i : process_of[static_cast<std::size_t>(i)];
  }
  int node(int i) const { return node_of[static_cast<std::size_t>(i)]; }
};

// Fills a C view owning a copy of `t` (previous contents of *out ignored).
void to_c(Topology t, wia_topology_t* out);
// Reads any C topology (library- or caller-built) back into the model;
// throws INVALID_ARGUMENT naming the first inconsistent field.
Topology from_c(const wia_topology_t& c);
// Releases what to_c allocated and zeroes *t.
void free_c(wia_topology_t* t) noexcept;

// YAML files (yaml_io.cpp). Load throws wia::Error(WIA_ERROR_CONFIG) with
// "file:line:column" and the key; export throws WIA_ERROR_IO.
Topology load_yaml(const std::string& path);
void export_yaml(const Topology& t, const std::string& path);

}  // namespace wia::topo
