// SPDX-License-Identifier: Apache-2.0
// What this process finds on its machine, as the data layers' values: the
// topology of its runtime's devices (hwloc plus what providers report, with
// tuner.link_file's measured figures laid over) and the peer-copy benchmark
// behind wia_benchmark_bandwidth. The layer that asks the runtime, so that
// topology/ stays data only; transports.hpp does the same for the selector.
#pragma once

#include <wia/topology.h>

#include <cstdint>

#include "topology/topology.hpp"

namespace wia::discovery {

// Discovery from the runtime's devices and hwloc (discover.cpp). When
// config key tuner.link_file names a measured file (wia-bw --output), the
// pairs it covers take its bandwidth and latency (apply_measured_links); a
// file that cannot be read or matches no device is a logged warning, and
// discovery keeps the provider figures.
topo::Topology discover_topology();

// Copies bandwidth and latency from `measured` into every ordered pair of
// t's devices that both appear in it (with a positive bandwidth there);
// other pairs and every other field keep their values. Devices are matched
// by full name ("node/device"); when no full name matches, by device name
// (the part after the last '/') where that name is unique in `measured`, so
// a file measured on another host of the same build still matches. Returns
// the number of ordered pairs updated.
int apply_measured_links(topo::Topology& t, const topo::Topology& measured);

// wia_benchmark_bandwidth's measurement (benchmark.cpp), and the per-message
// latency alpha (us) fitted through its 4 KiB and 1 MiB points, floored at
// 0.01 us: what wia-bw writes as a link's latency_us.
wia_bandwidth_benchmark_t benchmark_bandwidth(std::int32_t dev_a, std::int32_t dev_b);
double alpha_from(const wia_bandwidth_benchmark_t& bench);

}  // namespace wia::discovery
