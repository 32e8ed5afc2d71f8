// SPDX-License-Identifier: Apache-2.0
// wia-info: what libwia found on this machine and why.
//   wia-info            providers (loaded, absent, disabled, refused with the
//                       reason), devices, peer-access matrix
//   wia-info --config   effective configuration with the source of each value
//   wia-info --topology / --explain / --lint / --topology-diff: see usage()
#include <wia/wia.h>

#include <cstdio>
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <fmt/core.h>

#include "common/error.hpp"
#include "config/config.hpp"
#include "provider/registry.hpp"
#include "runtime/runtime.hpp"
#include "checkpoint_report.hpp"
#include "flight_analysis.hpp"
#include "selection.hpp"

namespace {

std::string caps_text(std::uint64_t caps) {
  std::string s;
  if (caps & WIA_PROVIDER_CAP_DEVICE) s += "device";
  if (caps & WIA_PROVIDER_CAP_TRANSPORT) s += s.empty() ? "transport" : ",transport";
  return s.empty() ? "-" : s;
}

std::string device_caps_text(std::uint64_t caps) {
  static const std::pair<std::uint64_t, const char*> names[] = {
      {WIA_DEVICE_CAP_HOST_FUNC, "host_func"}, {WIA_DEVICE_CAP_EVENT_TIMING, "event_timing"},
      {WIA_DEVICE_CAP_PEER, "peer"},           {WIA_DEVICE_CAP_IPC, "ipc"},
      {WIA_DEVICE_CAP_REDUCE, "reduce"},       {WIA_DEVICE_CAP_PINNED_HOST, "pinned_host"},
      {WIA_DEVICE_CAP_SCALE, "scale"},         {WIA_DEVICE_CAP_KERNEL, "kernel"},
      {WIA_DEVICE_CAP_DMABUF, "dmabuf"}};
  std::string s;
  for (const auto& [bit, name] : names)
    if (caps & bit) s += (s.empty() ? "" : ",") + std::string(name);
  return s.empty() ? "-" : s;
}

std::string bytes_text(std::uint64_t b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(b);
  int u = 0;
  while (v >= 1024 && u < 4) v /= 1024, ++u;
  return fmt::format("{:.1f} {}", v, units[u]);
}

const char* kind_text(wia_device_type_t t) {
  switch (t) {
    case WIA_DEVICE_CPU: return "cpu";
    case WIA_DEVICE_GPU: return "gpu";
    case WIA_DEVICE_ACCELERATOR: return "accelerator";
  }
  return "?";
}

int print_config(const wia::Runtime& rt) {
  fmt::print("Effective configuration (lowest to highest precedence: default, file, env):\n");
  std::size_t w = 0;
  const auto entries = rt.config().entries();
  for (const auto& [key, v] : entries) w = std::max(w, key.size());
  for (const auto& [key, v] : entries)
    fmt::print("  {:<{}}  = {:<16}  [{}]  {}\n", key, w, v.text.empty() ? "\"\"" : v.text,
               v.source, v.description);
  for (const auto& [section, source] : rt.config().undeclared_sections())
    fmt::print("  {}: section not used: no loaded provider of that name ({})\n", section, source);
  return 0;
}

int print_overview(const wia::Runtime& rt) {
  fmt::print("libwia {}.{}.{}  provider ABI v{}  host services v{}\n\n", WIA_VERSION_MAJOR,
             WIA_VERSION_MINOR, WIA_VERSION_PATCH,
             WIA_PROVIDER_ABI_VERSION, WIA_HOST_SERVICES_VERSION);
  fmt::print("Provider search path (in order):\n");
  for (const auto& dir : rt.providers().search_path()) fmt::print("  {}\n", dir);

  fmt::print("\nProviders:\n");
  for (const auto& r : rt.providers().records()) {
    if (r.state == wia::ProviderState::loaded)
      fmt::print("  {:<16} loaded    v{:<10} ABI v{}  caps {}  ({})\n", r.name, r.version,
                 r.abi_version, caps_text(r.caps), r.path);
  }
  for (const auto& r : rt.providers().records()) {
    if (r.state == wia::ProviderState::loaded) continue;
    fmt::print("  {:<16} {:<9} {}\n                   reason: {}\n", r.name,
               wia::provider_state_name(r.state), r.path.empty() ? "(no file)" : r.path, r.reason);
  }

  const auto& devs = rt.devices();
  fmt::print("\nDevices: {}\n", devs.size());
  for (const auto& d : devs) {
    fmt::print("  [{}] {:<24} {:<4} provider {} #{}  memory {}  NUMA {}{}{}  caps {}\n", d.id,
               d.props.name, kind_text(d.props.type), d.provider->name(), d.local_index,
               bytes_text(d.props.total_memory), d.props.numa_node,
               d.props.pci_bus_id[0] ? "  PCI " : "", d.props.pci_bus_id,
               device_caps_text(d.provider->device()->caps));
  }
  if (!devs.empty()) {
    fmt::print("\nPeer access (row device can access column device directly):\n     ");
    for (const auto& d : devs) fmt::print("{:>4}", d.id);
    fmt::print("\n");
    for (const auto& a : devs) {
      fmt::print("  {:>2} ", a.id);
      for (const auto& b : devs)
        fmt::print("{:>4}", a.id == b.id ? "-" : (wia_can_access_peer(a.id, b.id) ? "Y" : "N"));
      fmt::print("\n");
    }
  }
  return 0;
}

// Like `nvidia-smi topo -m`: link type per pair, then hop count and
// bandwidth, for the discovered topology or one loaded from a file.
int print_topology(const char* file, bool dot) {
  wia_topology_t t;
  const wia_status_t st = file ? wia_load_topology_yaml(file, &t) : wia_discover_topology(&t);
  if (st != WIA_SUCCESS) {
    std::fprintf(stderr, "wia-info: %s: %s\n", wia_status_string(st), wia_get_last_error());
    return 1;
  }
  const int n = t.num_devices;
  auto name = [&](int i) {
    return t.device_names && t.device_names[i] ? std::string(t.device_names[i])
                                               : fmt::format("dev{}", i);
  };
  if (dot) {
    // Graphviz: one node per device, clustered by machine, one edge per pair.
    fmt::print("graph wia_topology {{\n  node [shape=box];\n");
    for (int node = 0; node < std::max(1, t.num_nodes); ++node) {
      fmt::print("  subgraph cluster_{} {{\n    label=\"{}\";\n", node,
                 t.node_names && t.node_names[node] ? t.node_names[node] : "node");
      for (int i = 0; i < n; ++i)
        if ((t.node_of_device ? t.node_of_device[i] : 0) == node)
          fmt::print("    d{} [label=\"{}\"];\n", i, name(i));
      fmt::print("  }}\n");
    }
    for (int i = 0; i < n; ++i)
      for (int j = i + 1; j < n; ++j)
        fmt::print("  d{} -- d{} [label=\"{} {:.0f} GB/s\"];\n", i, j, t.link_type[i][j],
                   t.bandwidth_gbps[i][j]);
    fmt::print("}}\n");
    wia_free_topology(&t);
    return 0;
  }
  fmt::print("Topology: {} device(s), {} node(s), interconnect {}\n\n", n,
             std::max(1, t.num_nodes), t.interconnect_name ? t.interconnect_name : "none");
  std::size_t w = 6;
  for (int i = 0; i < n; ++i) w = std::max(w, name(i).size() + 1);
  std::size_t cw = 4;
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < n; ++j) cw = std::max(cw, std::strlen(t.link_type[i][j]) + 1);
  auto matrix = [&](const char* title, auto cell) {
    fmt::print("{}\n{:<{}}", title, "", w);
    for (int j = 0; j < n; ++j) fmt::print("{:>{}}", fmt::format("d{}", j), cw + 1);
    fmt::print("\n");
    for (int i = 0; i < n; ++i) {
      fmt::print("{:<{}}", name(i), w);
      for (int j = 0; j < n; ++j) fmt::print("{:>{}}", cell(i, j), cw + 1);
      fmt::print("\n");
    }
    fmt::print("\n");
  };
  matrix("Link type:", [&](int i, int j) { return std::string(t.link_type[i][j]); });
  matrix("Hops:", [&](int i, int j) { return std::to_string(t.hop_count[i][j]); });
  matrix("Bandwidth (GB/s):",
         [&](int i, int j) { return fmt::format("{:.1f}", t.bandwidth_gbps[i][j]); });
  matrix("Latency (us):", [&](int i, int j) { return fmt::format("{:.2f}", t.latency_us[i][j]); });
  wia_topology_analysis_t a;
  if (wia_analyze_topology(&t, &a) == WIA_SUCCESS)
    fmt::print("Analysis: {}, diameter {}, bisection {:.1f} GB/s, strategy {} ({})\n",
               a.topology_type, a.diameter, a.bisection_bandwidth, a.recommended_strategy,
               a.reason);
  wia_free_topology(&t);
  return 0;
}

void usage(FILE* out) {
  std::fputs(
      "usage: wia-info [--config | --topology | --dot | --explain [--summary] | --lint |\n"
      "                 --topology-diff FILE [--tolerance X] | --place MODEL.yaml]\n"
      "                [--topology-file F]\n"
      "                [--rules CONFIG.yaml] [--assume-all-transports] [--help]\n"
      "  (no option)  providers, their state and reasons, devices, peer-access matrix\n"
      "  --config     effective configuration with the source of every value\n"
      "  --topology   link type, hops, bandwidth and latency between every pair of\n"
      "               devices, and the analysis (discovered, or --topology-file F)\n"
      "  --dot        the topology as a Graphviz graph (render: dot -Tpng)\n"
      "  --explain    for every link: the transport chosen, the rule, and why each\n"
      "               earlier preference was passed over; --summary: counts per link\n"
      "               class and transport instead (large topologies)\n"
      "  --lint       shadowed rules, rules that match nothing, transport lists with\n"
      "               nothing usable; exit 0 clean, 1 warnings, 2 errors\n"
      "  --topology-diff FILE  how the declared topology FILE differs from the detected\n"
      "               one (or from --topology-file); --tolerance 0.1 = 10% (default)\n"
      "  --place MODEL.yaml  place a model's parts on the devices (docs/placement.md);\n"
      "               --strategy bandwidth|latency|sequential, --allow-cross-node to not\n"
      "               minimise cross-node bytes first\n"
      "  --checkpoints DIR  every checkpoint in DIR, latest, and each committed one verified\n"
      "               (every shard loaded, every checksum checked); exit 1 if one is damaged\n"
      "  --analyse DIR  read every rank's flight recorder dump in DIR (flight_recorder.dir)\n"
      "               and name the ranks that never joined the collective where the job stopped\n"
      "  --rules F    take selector rules from config file F instead of WIA_CONFIG\n"
      "  --assume-all-transports  plan as if shm, tcp, ofi and verbs were all loaded\n"
      "Environment: WIA_CONFIG=<file.yaml>, WIA_PROVIDER_PATH, WIA_LOG_LEVEL, WIA_TRANSPORT,\n"
      "             WIA_* overrides\n",
      out);
}

}  // namespace

int main(int argc, char** argv) {
  bool config = false;
  bool topology = false;
  bool dot = false;
  bool explain = false;
  bool lint = false;
  const char* diff_file = nullptr;
  const char* place_file = nullptr;
  const char* strategy = nullptr;
  bool cross_node_first = true;
  double tolerance = 0.1;
  wia_info::SelectionOptions sel;
  const char* topology_file = nullptr;
  const char* analyse_dir = nullptr;
  const char* checkpoints_dir = nullptr;
  for (int i = 1; i < argc; ++i) {
    const bool has_value = i + 1 < argc;
    if (!std::strcmp(argv[i], "--config")) {
      config = true;
    } else if (!std::strcmp(argv[i], "--topology")) {
      topology = true;
    } else if (!std::strcmp(argv[i], "--dot")) {
      dot = true;
    } else if (!std::strcmp(argv[i], "--topology-file") && has_value) {
      topology_file = argv[++i];
      topology = true;
    } else if (!std::strcmp(argv[i], "--explain")) {
      explain = true;
    } else if (!std::strcmp(argv[i], "--summary")) {
      sel.summary = true;
    } else if (!std::strcmp(argv[i], "--lint")) {
      lint = true;
    } else if (!std::strcmp(argv[i], "--rules") && has_value) {
      sel.rules_file = argv[++i];
    } else if (!std::strcmp(argv[i], "--assume-all-transports")) {
      sel.assume_all = true;
    } else if (!std::strcmp(argv[i], "--place") && has_value) {
      place_file = argv[++i];
    } else if (!std::strcmp(argv[i], "--strategy") && has_value) {
      strategy = argv[++i];
    } else if (!std::strcmp(argv[i], "--allow-cross-node")) {
      cross_node_first = false;
    } else if (!std::strcmp(argv[i], "--topology-diff") && has_value) {
      diff_file = argv[++i];
    } else if (!std::strcmp(argv[i], "--tolerance") && has_value) {
      char* end = nullptr;
      tolerance = std::strtod(argv[++i], &end);
      if (end == argv[i] || *end != '\0' || !(tolerance >= 0.0)) {
        std::fprintf(stderr, "wia-info: --tolerance wants a number >= 0, got '%s'\n", argv[i]);
        return 2;
      }
    } else if (!std::strcmp(argv[i], "--checkpoints") && has_value) {
      checkpoints_dir = argv[++i];
    } else if (!std::strcmp(argv[i], "--analyse") && has_value) {
      analyse_dir = argv[++i];
    } else if (!std::strcmp(argv[i], "--help") || !std::strcmp(argv[i], "-h")) {
      usage(stdout);
      return 0;
    } else {
      std::fprintf(stderr, "wia-info: unknown option '%s'\n", argv[i]);
      usage(stderr);
      return 2;
    }
  }
  if (analyse_dir) return wia_info::analyse_flight(analyse_dir);
  if (checkpoints_dir) return wia_info::checkpoint_report(checkpoints_dir);
  sel.topology_file = topology_file;
  if (place_file)
    return wia_info::place(place_file, topology_file, strategy, cross_node_first);
  if (diff_file) return wia_info::topology_diff(diff_file, topology_file, tolerance);
  if (lint) return wia_info::lint(sel);
  if (explain) return wia_info::explain(sel);
  if (sel.summary) {
    std::fprintf(stderr, "wia-info: --summary goes with --explain\n");
    return 2;
  }
  if (topology || dot) return print_topology(topology_file, dot);
  try {
    const wia::Runtime& rt = wia::Runtime::get();
    return config ? print_config(rt) : print_overview(rt);
  } catch (const wia::Error& e) {
    std::fprintf(stderr, "wia-info: %s: %s\n", wia::status_name(e.status()), e.what());
    return 1;
  }
}
