// SPDX-License-Identifier: Apache-2.0
// What the point-to-point tests (p2p_send_test.cpp, p2p_dmabuf_test.cpp)
// share: finding a device by provider, reading a rank's log, finding an
// entry of a profiling report.
#pragma once

#include <wia/wia.h>

#include <fstream>
#include <sstream>
#include <string>

namespace wia::test::p2p {

// The first device of `provider` ("host", "cuda"), or -1.
inline int device_of(const char* provider) {
  int n = 0;
  wia_get_device_count(&n);
  for (int d = 0; d < n; ++d) {
    wia_device_properties_t p;
    if (wia_get_device_properties(d, &p) == WIA_SUCCESS && std::string(p.provider) == provider)
      return d;
  }
  return -1;
}

inline std::string read_file(const std::string& path) {
  std::ifstream f(path);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

// The report's entry named `name` ("send_direct", ...), or nullptr.
inline const wia_collective_profile_t* entry(const wia_comm_profile_report_t* r,
                                             const char* name) {
  for (int i = 0; r && i < r->num_collectives; ++i)
    if (std::string(r->collectives[i].name) == name) return &r->collectives[i];
  return nullptr;
}

}  // namespace wia::test::p2p
