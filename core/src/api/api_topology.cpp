// SPDX-License-Identifier: Apache-2.0
// Topology discovery, files and analysis (spec 6.2, 6.2.1).
#include <wia/topology.h>

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <cstring>

#include "api/guard.hpp"
#include "discovery/discovery.hpp"
#include "placement/placement.hpp"
#include "runtime/runtime.hpp"
#include "topology/analysis.hpp"
#include "topology/topology.hpp"

using namespace wia;

extern "C" {

WIA_API wia_status_t wia_discover_topology(wia_topology_t* topology) {
  return api::guard(__func__, [&] {
    api::require_non_null(topology, "topology");
    *topology = wia_topology_t{};
    topo::to_c(discovery::discover_topology(), topology);
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

WIA_API wia_status_t wia_place_model(wia_model_t* model, wia_placement_config_t* placement) {
  return api::guard(__func__, [&] {
    api::require_non_null(model, "model");
    api::require_non_null(placement, "placement");
    api::require_non_null(placement->topology, "placement->topology");
    if (model->num_parts < 0)
      throw Error(WIA_ERROR_INVALID_ARGUMENT,
                  fmt::format("model->num_parts is {}", model->num_parts));
    if (model->num_parts > 0) {
      api::require_non_null(model->traffic_bytes, "model->traffic_bytes");
      api::require_non_null(model->device_of_part, "model->device_of_part");
    }
    const auto strategy = static_cast<int>(placement->strategy);
    if (strategy < WIA_PLACEMENT_BANDWIDTH_OPTIMAL || strategy > WIA_PLACEMENT_SEQUENTIAL)
      throw Error(WIA_ERROR_INVALID_ARGUMENT,
                  fmt::format("placement->strategy {} is not a wia_placement_strategy_t", strategy));
    const topo::Topology t = topo::from_c(*placement->topology);
    if (t.n < 1) throw Error(WIA_ERROR_INVALID_ARGUMENT, "placement->topology has no devices");
    place::Problem p = place::Problem::from(
        t, strategy == WIA_PLACEMENT_LATENCY_OPTIMAL ? place::Objective::kLatency
                                                     : place::Objective::kBandwidth);
    const int parts = model->num_parts;
    p.parts = parts;
    p.cross_node_first = placement->minimize_cross_node_traffic;
    if (placement->max_parts_per_device < 0)
      throw Error(WIA_ERROR_INVALID_ARGUMENT,
                  fmt::format("placement->max_parts_per_device is {}", placement->max_parts_per_device));
    p.max_per_device = placement->max_parts_per_device > 0 ? placement->max_parts_per_device
                                                            : (parts + t.n - 1) / t.n;
    p.max_per_device = std::max(p.max_per_device, 1);
    p.device_memory = placement->device_memory_bytes;
    const auto uparts = static_cast<std::size_t>(parts);
    p.traffic.assign(model->traffic_bytes, model->traffic_bytes + uparts * uparts);
    for (std::size_t k = 0; k < p.traffic.size(); ++k)
      if (!(p.traffic[k] >= 0.0))
        throw Error(WIA_ERROR_INVALID_ARGUMENT,
                    fmt::format("model->traffic_bytes[{}][{}] is {} (must be >= 0)", k / uparts,
                                k % uparts, p.traffic[k]));
    for (int a = 0; a < parts; ++a) {
      const wia_model_part_t* part = model->parts ? &model->parts[a] : nullptr;
      p.memory.push_back(part ? part->memory_bytes : 0);
      p.names.push_back(part && part->name ? part->name : fmt::format("part{}", a));
    }
    const place::Result r =
        place::solve(p, strategy == WIA_PLACEMENT_SEQUENTIAL ? place::Method::kSequential
                                                             : place::Method::kAuto);
    for (int a = 0; a < parts; ++a)
      model->device_of_part[a] = r.device_of[static_cast<std::size_t>(a)];
    placement->cost = r.score.cost;
    placement->cross_node_bytes = r.score.cross_node_bytes;
    placement->optimal = r.optimal;
    std::snprintf(placement->method, sizeof placement->method, "%s", r.method.c_str());
  });
}

WIA_API wia_status_t wia_benchmark_bandwidth(int32_t dev_a, int32_t dev_b,
                                             wia_bandwidth_benchmark_t* bench) {
  return api::guard(__func__, [&] {
    api::require_non_null(bench, "bench");
    Runtime& rt = Runtime::get();
    rt.device(dev_a);  // validates, naming the valid range
    rt.device(dev_b);
    *bench = discovery::benchmark_bandwidth(dev_a, dev_b);
  });
}

}  // extern "C"
