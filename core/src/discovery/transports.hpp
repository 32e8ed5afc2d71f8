// SPDX-License-Identifier: Apache-2.0
// The transports this process can use, read from its provider registry into
// the selector's TransportAvailability value, so that the selector never
// sees the registry and its tests build availability by hand.
#pragma once

#include "selector/selector.hpp"

namespace wia {
class ProviderRegistry;
}

namespace wia::discovery {

// Every provider the registry recorded: transport providers with their
// endpoints' flags, the others with the loader's reason (absent, disabled,
// refused, "has no transport interface"). p2p needs no entry: the selector
// knows it is built in.
selector::TransportAvailability transport_availability(const ProviderRegistry& registry);

}  // namespace wia::discovery
