// SPDX-License-Identifier: Apache-2.0
// fuzz_topology: a topology file (docs/topology.md) through topo::load_yaml,
// the loader of wia-info --topology-file, placement and the selector's lint.
//
// Invariants beyond "no crash":
//  - a rejected file is a wia::Error(WIA_ERROR_CONFIG) with a message;
//  - an accepted topology is consistent (every matrix n x n, node indices
//    in range, unique names) and survives export_yaml -> load_yaml
//    unchanged: what wia-info --export writes, wia reads back as the same
//    machine.
#include <yaml-cpp/yaml.h>

#include <cmath>

#include "fuzz_common.hpp"
#include "topology/topology.hpp"

namespace {

using wia::fuzz::check;
using wia::topo::Topology;

// Above this many devices a run spends its time in n^2 loops, not in the
// parser; the round trip is checked on smaller machines only. (At 256, a
// 120-device input's export and reload of 7,140 link entries took 10-13 s
// under ASan on the loaded 2-core machine: a smoke run failed on the
// per-input timeout, by load, not by a defect. 64 devices: 2,016 entries.)
constexpr int kRoundTripMaxDevices = 64;

void check_consistent(const Topology& t) {
  const auto n = static_cast<std::size_t>(t.n);
  check(t.device_names.size() == n && t.node_of.size() == n, "per-device vectors not of size n");
  for (const auto* m : {&t.bandwidth, &t.latency}) check(m->size() == n * n, "matrix not n x n");
  check(t.hops.size() == n * n && t.type.size() == n * n && t.p2p.size() == n * n,
        "matrix not n x n");
  for (int node : t.node_of) check(node >= 0 && node < t.num_nodes(), "node index out of range");
  for (int ty : t.type) check(ty >= -1 && ty < static_cast<int>(t.types.size()), "type index");
  check(t.numa_of.empty() || t.numa_of.size() == n, "numa_of size");
  check(t.process_of.empty() || t.process_of.size() == n, "process_of size");
}

bool same_number(double a, double b) { return a == b || (std::isnan(a) && std::isnan(b)); }

void check_same(const Topology& a, const Topology& b) {
  check(a.n == b.n, "device count changed on the round trip");
  check(a.device_names == b.device_names, "device names changed on the round trip");
  check(a.node_names == b.node_names, "node names changed on the round trip");
  check(a.node_of == b.node_of, "device -> node changed on the round trip");
  check(a.numa(0) == b.numa(0) || a.n == 0, "numa changed on the round trip");
  for (int i = 0; i < a.n; ++i) {
    check(a.numa(i) == b.numa(i), "numa of device " + std::to_string(i) + " changed");
    check(a.process(i) == b.process(i), "process of device " + std::to_string(i) + " changed");
    for (int j = 0; j < a.n; ++j) {
      const auto k = a.at(i, j);
      const std::string pair = a.device_names[i] + " -> " + a.device_names[j];
      check(same_number(a.bandwidth[k], b.bandwidth[k]),
            pair + ": bandwidth " + std::to_string(a.bandwidth[k]) + " read back as " +
                std::to_string(b.bandwidth[k]));
      check(same_number(a.latency[k], b.latency[k]),
            pair + ": latency " + std::to_string(a.latency[k]) + " read back as " +
                std::to_string(b.latency[k]));
      check(a.hops[k] == b.hops[k], pair + ": hops changed");
      check(a.p2p[k] == b.p2p[k], pair + ": p2p changed");
      check(a.type_name(i, j) == b.type_name(i, j), pair + ": type changed");
    }
  }
}

// Devices the file asks for (nodes x devices), read with yaml-cpp alone.
// The loader accepts up to 4096 devices, whose n^2 link matrices take
// seconds to fill under ASan (70 s on the loaded CI machine): such an input
// would read as a timeout, not a defect, and starve the fuzzer. Files of
// more than kMaxDevices devices are skipped; 0 when the text is not YAML
// of that shape (the loader then says why).
constexpr long kMaxDevices = 512;
long devices_asked(std::string_view text) {
  try {
    const YAML::Node root = YAML::Load(std::string(text));
    if (!root.IsMap() || !root["nodes"].IsSequence()) return 0;
    long total = 0;
    for (const auto& nd : root["nodes"]) {
      if (!nd.IsMap()) continue;
      long count = 1, devices = 1;
      if (nd["count"].IsScalar()) count = std::strtol(nd["count"].Scalar().c_str(), nullptr, 10);
      const YAML::Node dv = nd["devices"];
      if (dv.IsScalar()) devices = std::strtol(dv.Scalar().c_str(), nullptr, 10);
      if (dv.IsSequence()) devices = static_cast<long>(dv.size());
      if (count > 0 && devices > 0)
        total += std::min(count, 1L << 20) * std::min(devices, 1L << 20);
    }
    return total;
  } catch (const YAML::Exception&) {
    return 0;
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  wia::fuzz::quiet_logs();
  static wia::fuzz::MemFile in("topology.yaml");
  static wia::fuzz::MemFile out("exported.yaml");
  const std::string_view text = wia::fuzz::as_text({data, size});
  if (devices_asked(text) > kMaxDevices) return 0;
  Topology t;
  try {
    t = wia::topo::load_yaml(in.write(text));
  } catch (const wia::Error& e) {
    wia::fuzz::check_rejection(e, WIA_ERROR_CONFIG, "topo::load_yaml");
    return 0;
  }
  check_consistent(t);
  if (t.n > kRoundTripMaxDevices) return 0;
  try {
    wia::topo::export_yaml(t, out.path());
  } catch (const wia::Error& e) {
    wia::fuzz::broken(std::string("export_yaml of an accepted topology failed: ") + e.what());
  }
  Topology again;
  try {
    again = wia::topo::load_yaml(out.path());
  } catch (const wia::Error& e) {
    wia::fuzz::broken(std::string("an exported topology is rejected: ") + e.what());
  }
  check_same(t, again);
  return 0;
}
