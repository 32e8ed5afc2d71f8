// SPDX-License-Identifier: Apache-2.0
// The registry's loaded and absent providers as the selector's transport
// availability (transports.hpp).
#include "discovery/transports.hpp"

#include <fmt/format.h>

#include <utility>

#include "provider/registry.hpp"

namespace wia::discovery {

selector::TransportAvailability transport_availability(const ProviderRegistry& registry) {
  selector::TransportAvailability a;
  for (const auto& record : registry.records()) {
    if (record.state == ProviderState::loaded) continue;
    if (a.find(record.name) != nullptr) continue;  // first record of a name wins
    selector::TransportState s;
    s.reason = fmt::format("{}: {}", provider_state_name(record.state), record.reason);
    a.set(record.name, std::move(s));
  }
  for (const auto& provider : registry.loaded()) {
    selector::TransportState s;
    const wia_transport_ops_v1_t* ops = provider->transport();
    if (ops == nullptr) {
      s.reason = "loaded, but it has no transport interface";
      a.set(provider->name(), std::move(s));
      continue;
    }
    s.loaded = true;
    std::int32_t count = 0;
    if (ops->endpoint_count != nullptr && ops->endpoint_count(provider->ctx(), &count) == 0) {
      for (std::int32_t e = 0; e < count; ++e) {
        wia_transport_props_v1_t props{};
        props.struct_size = sizeof props;
        if (ops->endpoint_props != nullptr &&
            ops->endpoint_props(provider->ctx(), e, &props) == 0) {
          s.endpoint_flags |= props.flags;
          ++s.endpoints;
        }
      }
    }
    a.set(provider->name(), std::move(s));
  }
  return a;
}

}  // namespace wia::discovery
