// SPDX-License-Identifier: Apache-2.0
// Topology files (schema: docs/topology.md). Loading expands class rules
// (intra_node, inter_node, all) to every pair; export writes every pair
// explicitly, so export -> load gives back an equal topology.
#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <optional>

#include "common/error.hpp"
#include "common/yaml_file.hpp"
#include "topology/topology.hpp"

namespace wia::topo {

namespace {

// More than this many devices would make the n*n matrices unreasonably large.
constexpr int kMaxDevices = 4096;

class Loader : private YamlFile {
 public:
  explicit Loader(std::string file) : YamlFile(std::move(file), "topology file") {}

  Topology load() {
    const YAML::Node root = YamlFile::load();
    if (!root.IsMap())
      throw Error(WIA_ERROR_CONFIG,
                  fmt::format("{}: a topology file is a map with keys name, interconnect, nodes, "
                              "links",
                              where(root.Mark())));
    check_keys(root, "", {"name", "interconnect", "nodes", "links"});
    if (!root["nodes"]) fail(root.Mark(), "nodes", "is required");
    if (!root["links"]) fail(root.Mark(), "links", "is required");
    read_nodes(root["nodes"]);
    t_.resize(static_cast<int>(t_.device_names.size()));
    if (std::any_of(numa_.begin(), numa_.end(), [](int v) { return v >= 0; }))
      t_.numa_of = numa_;
    t_.process_of = process_;
    read_links(root["links"]);
    check_covered(root["links"]);
    if (root["interconnect"]) t_.interconnect = scalar(root["interconnect"], "interconnect");
    return std::move(t_);
  }

 private:
  template <typename T>
  T as(const YAML::Node& n, const std::string& key, const char* expected) const {
    if (!n.IsScalar()) fail(n.Mark(), key, fmt::format("must be {}", expected));
    try {
      return n.as<T>();
    } catch (const YAML::Exception&) {
      fail(n.Mark(), key, fmt::format("must be {}, got '{}'", expected, n.Scalar()));
    }
  }
  double non_negative(const YAML::Node& n, const std::string& key) const {
    const double v = as<double>(n, key, "a number");
    if (!std::isfinite(v) || v < 0.0) fail(n.Mark(), key, fmt::format("must be >= 0, got {}", v));
    return v;
  }

  void read_nodes(const YAML::Node& nodes) {
    if (!nodes.IsSequence() || nodes.size() == 0)
      fail(nodes.Mark(), "nodes", "must be a non-empty list of nodes");
    std::map<std::string, YAML::Mark> node_seen;
    for (std::size_t k = 0; k < nodes.size(); ++k) {
      const YAML::Node nd = nodes[k];
      const std::string path = fmt::format("nodes[{}]", k);
      if (!nd.IsMap()) fail(nd.Mark(), path, "must be a map with name and devices");
      check_keys(nd, path + ".", {"name", "count", "devices", "device_prefix", "numa", "processes"});
      if (!nd["name"]) fail(nd.Mark(), path + ".name", "is required");
      if (!nd["devices"]) fail(nd.Mark(), path + ".devices", "is required");
      const std::string name = scalar(nd["name"], path + ".name");
      int count = 1;
      if (nd["count"]) {
        count = as<int>(nd["count"], path + ".count", "a positive integer");
        if (count < 1 || count > kMaxDevices)
          fail(nd["count"].Mark(), path + ".count", fmt::format("must be in 1..{}", kMaxDevices));
      }
      const std::string prefix =
          nd["device_prefix"] ? scalar(nd["device_prefix"], path + ".device_prefix") : "dev";
      std::vector<std::string> devs;
      const YAML::Node dv = nd["devices"];
      if (dv.IsSequence()) {
        for (std::size_t d = 0; d < dv.size(); ++d)
          devs.push_back(scalar(dv[d], fmt::format("{}.devices[{}]", path, d)));
      } else {
        const int nd_count = as<int>(dv, path + ".devices", "a device count or a list of names");
        if (nd_count < 1 || nd_count > kMaxDevices)
          fail(dv.Mark(), path + ".devices", fmt::format("must be in 1..{}", kMaxDevices));
        for (int d = 0; d < nd_count; ++d) devs.push_back(fmt::format("{}{}", prefix, d));
      }
      const std::vector<int> numa = split(nd["numa"], path + ".numa", devs.size());
      const std::vector<int> procs = split(nd["processes"], path + ".processes", devs.size());
      for (int c = 0; c < count; ++c) {
        const std::string node_name = count > 1 ? fmt::format("{}{}", name, c) : name;
        auto [prev, fresh] = node_seen.emplace(node_name, nd["name"].Mark());
        if (!fresh)
          fail(nd["name"].Mark(), path + ".name",
               fmt::format("node '{}' is already defined at {}", node_name, where(prev->second)));
        const int node = static_cast<int>(t_.node_names.size());
        t_.node_names.push_back(node_name);
        int max_process = -1;
        for (std::size_t d = 0; d < devs.size(); ++d) {
          numa_.push_back(numa.empty() ? -1 : numa[d]);
          const int local = procs.empty() ? static_cast<int>(d) : procs[d];
          process_.push_back(next_process_ + local);
          max_process = std::max(max_process, local);
        }
        next_process_ += max_process + 1;
        for (const auto& d : devs) {
          const std::string full = node_name + "/" + d;
          if (!index_.emplace(full, static_cast<int>(t_.device_names.size())).second)
            fail(dv.Mark(), path + ".devices", fmt::format("device '{}' is listed twice", full));
          t_.device_names.push_back(full);
          t_.node_of.push_back(node);
          if (static_cast<int>(t_.device_names.size()) > kMaxDevices)
            fail(nd.Mark(), path, fmt::format("more than {} devices in all", kMaxDevices));
        }
      }
    }
  }

  // A per-device assignment (NUMA node, process) of a node's `count`
  // devices: absent = empty; a number M = devices split in listing order
  // into M equal runs (device d -> d * M / count); a list = one value per
  // device. Values are >= 0.
  std::vector<int> split(const YAML::Node& n, const std::string& key, std::size_t count) const {
    std::vector<int> out;
    if (!n) return out;
    if (n.IsSequence()) {
      if (n.size() != count)
        fail(n.Mark(), key,
             fmt::format("lists {} values for {} devices (give one per device, or a count)",
                         n.size(), count));
      for (std::size_t d = 0; d < n.size(); ++d) {
        const int v = as<int>(n[d], fmt::format("{}[{}]", key, d), "an integer >= 0");
        if (v < 0) fail(n[d].Mark(), fmt::format("{}[{}]", key, d), "must be >= 0");
        out.push_back(v);
      }
      return out;
    }
    const int m = as<int>(n, key, "a count or a list with one value per device");
    if (m < 1 || static_cast<std::size_t>(m) > count)
      fail(n.Mark(), key, fmt::format("must be in 1..{} (the node's device count)", count));
    for (std::size_t d = 0; d < count; ++d)
      out.push_back(static_cast<int>(d * static_cast<std::size_t>(m) / count));
    return out;
  }

  int device_ref(const YAML::Node& n, const std::string& key) const {
    const std::string s = scalar(n, key);
    auto it = index_.find(s);
    if (it != index_.end()) return it->second;
    try {
      const int i = n.as<int>();
      if (i >= 0 && i < t_.n) return i;
    } catch (const YAML::Exception&) {
    }
    fail(n.Mark(), key,
         fmt::format("'{}' is not a device (a name 'node/device' as listed under nodes, or an "
                     "index 0..{})",
                     s, t_.n - 1));
  }

  void read_links(const YAML::Node& links) {
    if (!links.IsSequence()) fail(links.Mark(), "links", "must be a list of link entries");
    for (std::size_t k = 0; k < links.size(); ++k) {
      const YAML::Node ln = links[k];
      const std::string path = fmt::format("links[{}]", k);
      if (!ln.IsMap()) fail(ln.Mark(), path, "must be a map with between and type");
      check_keys(ln, path + ".",
                 {"between", "type", "bandwidth_gbps", "latency_us", "hops", "p2p", "directed"});
      if (!ln["between"]) fail(ln.Mark(), path + ".between", "is required");
      if (!ln["type"]) fail(ln.Mark(), path + ".type", "is required");
      const std::string type = scalar(ln["type"], path + ".type");
      if (type.empty() || type == kSelfLink)
        fail(ln["type"].Mark(), path + ".type", fmt::format("cannot be '{}'", type));
      const LinkDefaults* def = find_link_defaults(type);
      auto figure = [&](const char* key, double LinkDefaults::*field) {
        if (ln[key]) return non_negative(ln[key], path + "." + key);
        if (def == nullptr)
          fail(ln["type"].Mark(), path + "." + key,
               fmt::format("is required: link type '{}' has no default figures", type));
        return def->*field;
      };
      const double bw = figure("bandwidth_gbps", &LinkDefaults::bandwidth_gbps);
      const double lat = figure("latency_us", &LinkDefaults::latency_us);
      std::optional<int> hops;
      if (ln["hops"]) {
        hops = as<int>(ln["hops"], path + ".hops", "an integer >= 1");
        if (*hops < 1) fail(ln["hops"].Mark(), path + ".hops", "must be >= 1");
      }
      std::optional<bool> p2p;
      if (ln["p2p"]) p2p = as<bool>(ln["p2p"], path + ".p2p", "true or false");
      const bool directed =
          ln["directed"] && as<bool>(ln["directed"], path + ".directed", "true or false");
      const int ti = t_.type_index(type);
      auto set = [&](int i, int j) {
        const auto at = t_.at(i, j);
        const bool same =
            t_.node_of[static_cast<std::size_t>(i)] == t_.node_of[static_cast<std::size_t>(j)];
        t_.type[at] = ti;
        t_.bandwidth[at] = bw;
        t_.latency[at] = lat;
        t_.hops[at] = hops ? *hops : (same ? 1 : 2);
        t_.p2p[at] = (p2p ? *p2p : same) ? 1 : 0;
      };
      const YAML::Node between = ln["between"];
      if (between.IsSequence()) {
        if (between.size() != 2)
          fail(between.Mark(), path + ".between", "must name exactly two devices: [A, B]");
        const int a = device_ref(between[0], path + ".between[0]");
        const int b = device_ref(between[1], path + ".between[1]");
        if (a == b) fail(between.Mark(), path + ".between", "names the same device twice");
        set(a, b);
        if (!directed) set(b, a);
        continue;
      }
      const std::string cls = scalar(between, path + ".between");
      if (ln["directed"])
        fail(ln["directed"].Mark(), path + ".directed", "applies only to a pair [A, B]");
      int want;  // 0 all, 1 intra, 2 inter
      if (cls == "all")
        want = 0;
      else if (cls == "intra_node")
        want = 1;
      else if (cls == "inter_node")
        want = 2;
      else
        fail(between.Mark(), path + ".between",
             fmt::format("'{}' is not a link class (intra_node, inter_node, all) or a pair [A, B]",
                         cls));
      for (int i = 0; i < t_.n; ++i)
        for (int j = 0; j < t_.n; ++j) {
          if (i == j) continue;
          const bool same =
              t_.node_of[static_cast<std::size_t>(i)] == t_.node_of[static_cast<std::size_t>(j)];
          if (want == 0 || (want == 1) == same) set(i, j);
        }
    }
  }

  void check_covered(const YAML::Node& links) const {
    for (int i = 0; i < t_.n; ++i)
      for (int j = 0; j < t_.n; ++j)
        if (i != j && t_.type[t_.at(i, j)] < 0)
          fail(links.Mark(), "links",
               fmt::format("no entry defines the link {} -> {}; add one whose 'between' "
                           "covers it ({})",
                           t_.device_names[static_cast<std::size_t>(i)],
                           t_.device_names[static_cast<std::size_t>(j)],
                           t_.node_of[static_cast<std::size_t>(i)] ==
                                   t_.node_of[static_cast<std::size_t>(j)]
                               ? "intra_node"
                               : "inter_node"));
  }

  Topology t_;
  std::map<std::string, int> index_;
  std::vector<int> numa_, process_;  // per device, in listing order
  int next_process_ = 0;             // first global process id of the next node
};

// A double-quoted YAML scalar. Control characters are escaped (\xNN):
// written raw, a NUL or a line break in a name the loader accepted came
// back as another name (fuzz_topology's round trip).
std::string quoted(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    const auto u = static_cast<unsigned char>(c);
    if (u < 0x20 || u == 0x7f) {
      out += fmt::format("\\x{:02x}", u);
      continue;
    }
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + '"';
}

}  // namespace

Topology load_yaml(const std::string& path) { return Loader(path).load(); }

void export_yaml(const Topology& t, const std::string& path) {
  std::string out;
  out += "# libwia topology (schema: docs/topology.md). Every pair is listed;\n";
  out += "# edit and load with wia_load_topology_yaml or WIA topology tools.\n";
  out += fmt::format("interconnect: {}\n",
                     quoted(t.interconnect.empty() ? t.fastest_link_type() : t.interconnect));
  out += "nodes:\n";
  const std::size_t device_count = static_cast<std::size_t>(t.n);
  for (int node = 0; node < t.num_nodes(); ++node) {
    const std::string& node_name = t.node_names[static_cast<std::size_t>(node)];
    out += fmt::format("  - name: {}\n    devices: [", quoted(node_name));
    bool first = true;
    for (std::size_t i = 0; i < device_count; ++i) {
      if (t.node_of[i] != node) continue;
      // Names are "node/device" in the model; the file lists the device part.
      std::string dev = t.device_names[i];
      if (dev.rfind(node_name + "/", 0) == 0) dev = dev.substr(node_name.size() + 1);
      out += (first ? "" : ", ") + quoted(dev);
      first = false;
    }
    out += "]\n";
    // Placement inside the node, when known: NUMA nodes, and processes
    // numbered from 0 within the node.
    std::string numa, procs;
    int first_process = -1;
    for (std::size_t i = 0; i < device_count; ++i) {
      if (t.node_of[i] != node) continue;
      const int id = static_cast<int>(i);
      if (first_process < 0 || t.process(id) < first_process) first_process = t.process(id);
    }
    for (std::size_t i = 0; i < device_count; ++i) {
      if (t.node_of[i] != node) continue;
      const int id = static_cast<int>(i);
      numa += fmt::format("{}{}", numa.empty() ? "" : ", ", std::max(t.numa(id), 0));
      procs += fmt::format("{}{}", procs.empty() ? "" : ", ", t.process(id) - first_process);
    }
    if (!t.numa_of.empty()) out += fmt::format("    numa: [{}]\n", numa);
    out += fmt::format("    processes: [{}]\n", procs);
  }
  // One device has no pair: an empty list, which load_yaml accepts (a bare
  // "links:" is null, not a list, and the file did not load again).
  out += t.n < 2 ? "links: []\n" : "links:\n";
  auto entry = [&](int i, int j, bool directed) {
    const auto k = t.at(i, j);
    out += fmt::format(
        "  - {{between: [{}, {}], type: {}, bandwidth_gbps: {}, latency_us: {}, hops: {}, p2p: "
        "{}{}}}\n",
        i, j, quoted(t.type_name(i, j)), t.bandwidth[k], t.latency[k], t.hops[k],
        t.p2p[k] != 0 ? "true" : "false", directed ? ", directed: true" : "");
  };
  for (int i = 0; i < t.n; ++i)
    for (int j = i + 1; j < t.n; ++j) {
      const auto a = t.at(i, j), b = t.at(j, i);
      const bool symmetric = t.type[a] == t.type[b] && t.bandwidth[a] == t.bandwidth[b] &&
                             t.latency[a] == t.latency[b] && t.hops[a] == t.hops[b] &&
                             t.p2p[a] == t.p2p[b];
      if (symmetric) {
        entry(i, j, false);
      } else {
        entry(i, j, true);
        entry(j, i, true);
      }
    }
  std::ofstream f(path, std::ios::out | std::ios::trunc);
  if (!f) throw Error(WIA_ERROR_IO, fmt::format("{}: cannot open for writing", path));
  f << out;
  f.close();
  if (!f) throw Error(WIA_ERROR_IO, fmt::format("{}: write failed", path));
}

}  // namespace wia::topo
