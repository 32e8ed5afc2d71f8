// SPDX-License-Identifier: Apache-2.0
// The host-services table the core hands each provider at init: logging
// under the provider's name, per-thread error text, declared parameters,
// and the core's clock.
#pragma once

#include <wia/provider.h>

#include <string>

namespace wia {

class Config;

namespace provider_host {

// What host_ctx points at: one per provider, alive from before init() until
// after fini() returns (it lives in the provider's record object).
struct HostContext {
  std::string name;  // log tag and parameter section
  const Config* config = nullptr;
};

// A v1 table whose callbacks reach `context`. The table itself must stay at
// a stable address for as long as the provider may use it.
wia_host_services_v1_t make_host_services(HostContext* context);

// Takes (and clears) the text this thread's last set_error() left; empty
// when none was set since the last clear.
std::string take_error();

}  // namespace provider_host
}  // namespace wia
