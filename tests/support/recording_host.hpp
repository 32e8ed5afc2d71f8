// SPDX-License-Identifier: Apache-2.0
// The host services a test hands a provider it loads through the ABI alone
// (dlopen + wia_provider_v1, no core): log lines and set_error text are
// recorded, parameters come from a map, the clock is the steady clock.
// The table's host_ctx points back at the object, so it must not move.
#pragma once

#include <wia/provider.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace wia::test {

struct RecordingHost {
  std::map<std::string, std::string> params;
  std::vector<std::string> logs;
  std::string error;  // the last set_error text
  wia_host_services_v1_t table{};

  RecordingHost() {
    table.struct_size = sizeof(table);
    table.abi_version = WIA_HOST_SERVICES_VERSION;
    table.host_ctx = this;
    table.log = [](void* h, wia_log_level_t, const char* m) {
      static_cast<RecordingHost*>(h)->logs.emplace_back(m);
    };
    table.set_error = [](void* h, const char* m) { static_cast<RecordingHost*>(h)->error = m; };
    table.get_param = [](void* h, const char* key) -> const char* {
      const auto& p = static_cast<RecordingHost*>(h)->params;
      auto it = p.find(key);
      return it == p.end() ? nullptr : it->second.c_str();
    };
    table.clock_ns = [](void*) -> std::uint64_t {
      return static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                            std::chrono::steady_clock::now().time_since_epoch())
                                            .count());
    };
    // log_enabled stays NULL: every level is formatted and recorded.
  }
  RecordingHost(const RecordingHost&) = delete;
  RecordingHost& operator=(const RecordingHost&) = delete;
};

}  // namespace wia::test
