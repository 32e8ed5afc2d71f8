// SPDX-License-Identifier: Apache-2.0
// How a declared topology (a file an operator wrote) differs from the one
// detected (discovered, or measured by wia-bw): devices missing or extra,
// and link properties that differ beyond a tolerance. wia-info
// --topology-diff prints it.
#pragma once

#include <string>
#include <vector>

#include "topology/topology.hpp"

namespace wia::topo {

struct TopologyDiff {
  std::string matched_by;            // "name", or "position (...why...)"
  std::vector<std::string> missing;  // declared, not detected
  std::vector<std::string> extra;    // detected, not declared
  // Link differences, grouped: identical descriptions are one entry.
  struct LinkGroup {
    std::string what;  // "bandwidth_gbps 300 declared, 20 detected (-93%)"
    std::size_t links = 0;
    std::string example;  // "a -> b"
  };
  std::vector<LinkGroup> links;
  std::size_t pairs_compared = 0;
  std::size_t pairs_differing = 0;
  bool same() const { return missing.empty() && extra.empty() && links.empty(); }
};

// Devices are matched by full name ("node/device"); when no name matches
// and both have the same number of devices, by position. Bandwidth and
// latency differ when |detected - declared| > tolerance x declared
// (tolerance 0.1 = 10%); link type, hops and p2p must be equal.
TopologyDiff diff(const Topology& declared, const Topology& detected, double tolerance);

}  // namespace wia::topo
