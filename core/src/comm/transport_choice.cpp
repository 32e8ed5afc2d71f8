// SPDX-License-Identifier: Apache-2.0
#include "comm/transport_choice.hpp"

#include <algorithm>
#include <cstdlib>

#include <fmt/format.h>

#include "provider/registry.hpp"
#include "runtime/runtime.hpp"

namespace wia::comm {

std::string transport_unavailable_reason(const std::string& name) {
  const ProviderRegistry& reg = Runtime::get().providers();
  if (const Provider* p = reg.find(name)) {
    if (!p->transport()) return "the provider has no transport interface";
    return {};
  }
  for (const ProviderRecord& r : reg.records())
    if (r.name == name)
      return fmt::format("provider {}: {}", provider_state_name(r.state), r.reason);
  return "provider not found on the search path";
}

std::int32_t choose_endpoint(const Provider& provider, bool multi_node) {
  const wia_transport_ops_v1_t& t = *provider.transport();
  std::int32_t count = 0;
  if (t.endpoint_count(provider.ctx(), &count) != WIA_SUCCESS || count <= 0) return -1;
  // A job spanning nodes prefers an endpoint that reaches other nodes; a
  // transport that only reaches this node (shm) still serves its links.
  const std::uint32_t prefs[2] = {
      multi_node ? WIA_TRANSPORT_FLAG_INTER_NODE : WIA_TRANSPORT_FLAG_INTRA_NODE,
      WIA_TRANSPORT_FLAG_INTRA_NODE | WIA_TRANSPORT_FLAG_INTER_NODE};
  for (const std::uint32_t want : prefs)
    for (std::int32_t e = 0; e < count; ++e) {
      wia_transport_props_v1_t props{};
      props.struct_size = sizeof(props);
      if (t.endpoint_props(provider.ctx(), e, &props) != WIA_SUCCESS) continue;
      if (props.tag_bits < 34) continue;  // engine/net_exec.hpp: kMinTagBits
      if (props.flags & want) return e;
    }
  return -1;
}

TransportFigures transport_figures(const std::string& transport, bool same_node) {
  // Measured on the reference machine (docs/performance.md); what matters
  // for the choice is their ratio, which all ranks compute alike.
  if (transport == "shm") return {2.0, 6.0, 0.5};
  if (transport == "tcp") return same_node ? TransportFigures{15.0, 2.5, 3.0}
                                           : TransportFigures{30.0, 1.2, 5.0};
  return {5.0, 10.0, 1.0};  // RDMA-class transports
}

}  // namespace wia::comm
