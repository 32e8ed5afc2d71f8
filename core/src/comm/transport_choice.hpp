// SPDX-License-Identifier: Apache-2.0
// What a process communicator needs to know about transports beyond the
// selector's choice (selector/selector.hpp): which endpoint to use, why a
// transport is missing here, and the figures the tuner assumes for it.
#pragma once

#include <cstdint>
#include <string>

namespace wia {
class Provider;
}

namespace wia::comm {

// Why a transport provider is not usable in this process ("" if loaded).
std::string transport_unavailable_reason(const std::string& name);

// The endpoint to listen and connect on: for a job spanning nodes one that
// reaches other nodes, else the first that reaches this node. -1: none.
std::int32_t choose_endpoint(const Provider& provider, bool multi_node);

// Alpha-beta figures the tuner uses for a transport (docs/processes.md).
struct TransportFigures {
  double alpha_us;
  double gbps;
  double message_overhead_us;
};
TransportFigures transport_figures(const std::string& transport, bool same_node);

}  // namespace wia::comm
