// SPDX-License-Identifier: Apache-2.0
// Topology discovery, files and analysis (spec 6.2, 6.2.1).
#include <wia/topology.h>

#include <cstdio>
#include <cstring>

#include "api/guard.hpp"
#include "topology/analysis.hpp"
#include "topology/topology.hpp"

using namespace wia;

extern "C" {

WIA_API wia_status_t wia_discover_topology(wia_topology_t* topology) {
  return api::guard(__func__, [&] {
    api::require_non_null(topology, "topology");
    *topology = wia_topology_t{};
    topo::to_c(topo::discover(), topology);
  });
}

WIA_API wia_status_t wia_free_topology(wia_topology_t* topology) {
  return api::guard(__func__, [&] {
    api::require_non_null(topology, "topology");
    topo::free_c(topology);
  });
}

WIA_API wia_status_t wia_export_topology_yaml(const wia_topology_t* topology, const char* path) {
  return api::guard(__func__, [&] {
    api::require_non_null(topology, "topology");
    api::require_non_null(path, "path");
    topo::export_yaml(topo::from_c(*topology), path);
  });
}

WIA_API wia_status_t wia_load_topology_yaml(const char* path, wia_topology_t* topology) {
  return api::guard(__func__, [&] {
    api::require_non_null(topology, "topology");
    *topology = wia_topology_t{};
    api::require_non_null(path, "path");
    topo::to_c(topo::load_yaml(path), topology);
  });
}

WIA_API wia_status_t wia_analyze_topology(const wia_topology_t* topology,
                                          wia_topology_analysis_t* analysis) {
  return api::guard(__func__, [&] {
    api::require_non_null(topology, "topology");
    api::require_non_null(analysis, "analysis");
    const topo::Analysis a = topo::analyze(topo::from_c(*topology));
    wia_topology_analysis_t out{};
    out.topology_type = a.multi_node ? "multi_node" : "single_node";
    out.diameter = a.diameter;
    out.bisection_bandwidth = a.bisection_gbps;
    out.recommended_strategy = a.strategy;
    std::snprintf(out.reason, sizeof out.reason, "%s", a.reason.c_str());
    out.bisection_exact = a.bisection_exact;
    out.min_bandwidth_gbps = a.min_bw;
    out.max_bandwidth_gbps = a.max_bw;
    *analysis = out;
  });
}

}  // extern "C"
