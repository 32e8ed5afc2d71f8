// SPDX-License-Identifier: Apache-2.0
// wia-info --explain / --lint / --topology-diff.
#include "selection.hpp"

#include <fmt/core.h>

#include <cstdio>
#include <map>
#include <optional>
#include <tuple>
#include <unordered_map>

#include "common/error.hpp"
#include "config/config.hpp"
#include "discovery/discovery.hpp"
#include "discovery/transports.hpp"
#include "placement/placement.hpp"
#include "runtime/runtime.hpp"
#include "selector/selector.hpp"
#include "topology/diff.hpp"
#include "topology/topology.hpp"
#include "tuner/link_codec.hpp"
#include "tuner/link_file.hpp"

namespace wia_info {

namespace {

using namespace wia;

struct Setup {
  topo::Topology topology;
  selector::TransportAvailability available;
  selector::RuleSet rules;
  std::string rules_error;  // rules rejected: why (the defaults are used)
  std::string rules_origin;
};

// The topology, what transports are usable here, and the rule set, loaded
// as the runtime would (a rejected rule set falls back to the defaults).
Setup set_up(const SelectionOptions& o) {
  Setup s;
  s.topology = o.topology_file ? topo::load_yaml(o.topology_file) : discovery::discover_topology();
  const Runtime& rt = Runtime::get();
  s.available = o.assume_all ? selector::TransportAvailability::assume_all()
                             : discovery::transport_availability(rt.providers());
  std::optional<Config> own;
  if (o.rules_file) own = Config::load(o.rules_file);
  const Config& config = own ? *own : rt.config();
  try {
    s.rules = selector::load_rules(config, &s.available);
  } catch (const Error& e) {
    s.rules_error = e.what();
    s.rules = selector::default_rules();
  }
  const std::size_t user = s.rules.user_rules();
  if (!s.rules_error.empty())
    s.rules_origin = "the defaults (the rules were rejected, see above)";
  else if (user == 0)
    s.rules_origin = "the defaults (no selector rules configured)";
  else
    s.rules_origin =
        fmt::format("{} rule(s) from {}, then the defaults", user,
                    s.rules.source.empty() ? std::string("the environment") : s.rules.source);
  return s;
}

// What a rule's compress key gains, by the estimate a communicator of one
// rank per device of the topology would make (tuner::choose_link_codec)
// for a 64 MiB float32 all-reduce; nullopt when it cannot be made (nodes
// of unequal size, more devices than the cost model simulates in full).
std::optional<tuner::LinkCodecChoice> compress_estimate(const topo::Topology& t,
                                                       const std::string& path) {
  const int hosts = t.num_nodes();
  if (hosts < 2 || t.n > tuner::kFullSimulationMaxRanks) return std::nullopt;
  std::vector<int> per_node(static_cast<std::size_t>(hosts), 0), device_of_rank;
  for (int i = 0; i < t.n; ++i) {
    ++per_node[static_cast<std::size_t>(t.node(i))];
    device_of_rank.push_back(i);
  }
  for (const int n : per_node)
    if (n != per_node[0]) return std::nullopt;
  tuner::LinkModel m = tuner::link_model_from_topology(t, device_of_rank, path);
  // As a process communicator models several nodes: the ranks of a node
  // share its NIC, whose bandwidth is that of the links between nodes.
  for (int i = 0; i < t.n; ++i) m.node_of_rank.push_back(t.node(i));
  m.nic_of_rank = m.node_of_rank;
  for (int i = 0; i < t.n; ++i)
    for (int j = 0; j < t.n; ++j)
      if (t.node(i) != t.node(j) && (m.port_gbps == 0 || m.bandwidth(i, j) < m.port_gbps))
        m.port_gbps = m.bandwidth(i, j);
  tuner::LinkCodecCall call;
  call.hosts = hosts;
  call.per_host = per_node[0];
  call.count = 16u << 20;  // 64 MiB of float32
  return tuner::choose_link_codec(m, call);
}

// "compressed int8 when bandwidth < 10 GB/s: this link 0.125 GB/s, so it
// applies; estimated 2.6x on a 64 MiB float32 all-reduce (...)".
std::string compress_note(const selector::LinkCompress& c, double link_gbps,
                          const std::optional<tuner::LinkCodecChoice>& est) {
  const bool applies = c.below_gbps <= 0 || link_gbps < c.below_gbps;
  std::string s = fmt::format("compressed {}: this link {:g} GB/s, {}", c.describe(), link_gbps,
                              applies ? "so it applies" : "so it does not apply");
  if (!applies) return s;
  if (!est) return s + "; no estimate (nodes of unequal size, or too many devices)";
  const double codec_us = c.method == "bf16" ? est->bf16_us
                          : c.method == "int8" ? est->int8_us
                          : est->codec == tuner::LinkCodec::kInt8 ? est->int8_us
                          : est->codec == tuner::LinkCodec::kBf16 ? est->bf16_us
                                                                  : est->plain_us;
  return s + fmt::format("; estimated {:.2f}x on a 64 MiB float32 all-reduce over these "
                         "nodes (plain {:.3f} ms{})",
                         est->plain_us / codec_us, est->plain_us / 1e3,
                         c.method == "auto" ? fmt::format(", auto: {}", est->why)
                                            : fmt::format(", {} {:.3f} ms", c.method,
                                                          codec_us / 1e3));
}

void print_rules_error(const Setup& s) {
  if (!s.rules_error.empty())
    std::fprintf(stderr, "wia-info: selector rules rejected, the runtime uses the defaults: %s\n",
                 s.rules_error.c_str());
}

std::string transports_line(const selector::TransportAvailability& a) {
  std::string s;
  for (const char* name : selector::kBuiltinTransports) {
    if (std::string_view(name) == "p2p") {
      s += "p2p (built in)";
      continue;
    }
    const selector::TransportState* st = a.find(name);
    s += fmt::format(", {} ({})", name,
                     st == nullptr ? "not found"
                     : st->loaded  ? "loaded"
                                   : "not loaded");
  }
  return s;
}

}  // namespace

int explain(const SelectionOptions& o) {
  try {
    Setup s = set_up(o);
    print_rules_error(s);
    const topo::Topology& t = s.topology;
    const std::size_t links = static_cast<std::size_t>(t.n) * (t.n > 0 ? t.n - 1 : 0) / 2;
    fmt::print("Transport selection: {} device(s) on {} node(s), {} link(s)\n", t.n, t.num_nodes(),
               links);
    fmt::print("Rules: {}\n", s.rules_origin);
    fmt::print("Transports{}: {}\n\n", o.assume_all ? " (assumed)" : " here",
               transports_line(s.available));
    selector::TopologyPlan plan(s.rules, s.available, t);
    bool unserved = false;
    bool any_compress = false;
    for (const auto& r : s.rules.rules) any_compress = any_compress || r.compress.has_value();
    const std::optional<tuner::LinkCodecChoice> estimate =
        any_compress ? compress_estimate(t, o.topology_file ? o.topology_file : "the topology")
                     : std::nullopt;
    if (!o.summary) {
      for (int i = 0; i < t.n; ++i)
        for (int j = i + 1; j < t.n; ++j) {
          const selector::Choice& c = plan.at(i, j);
          unserved = unserved || !c.ok();
          fmt::print("{} <-> {}  {}{}  -> {}  [{}]\n", t.device_names[static_cast<std::size_t>(i)],
                     t.device_names[static_cast<std::size_t>(j)],
                     selector::link_class_name(plan.class_of(i, j)),
                     t.p2p[t.at(i, j)] && t.p2p[t.at(j, i)] ? ", peer" : "",
                     c.ok() ? c.transport : std::string("NONE"), c.rule);
          for (const auto& why : c.passed_over) fmt::print("    passed over {}\n", why);
          if (c.ok() && c.compress)
            fmt::print("    {}\n", compress_note(*c.compress, t.bandwidth[t.at(i, j)], estimate));
        }
      return !s.rules_error.empty() || unserved ? 2 : 0;
    }
    // Summary: links per (class, choice). Selection is per signature, so
    // this costs one hash lookup per pair.
    // Rows by (class, what was chosen and why); signatures that differ only
    // in group membership but chose alike share a row.
    std::map<std::tuple<int, std::string>, std::size_t> count;
    std::map<std::tuple<int, std::string>, const selector::Choice*> example;
    std::unordered_map<const selector::Choice*, std::string> description;
    for (int i = 0; i < t.n; ++i)
      for (int j = i + 1; j < t.n; ++j) {
        const selector::Choice& c = plan.at(i, j);
        auto described = description.find(&c);
        if (described == description.end()) described = description.emplace(&c, c.describe()).first;
        const std::tuple<int, std::string> key{static_cast<int>(plan.class_of(i, j)),
                                               described->second};
        ++count[key];
        example.emplace(key, &c);
      }
    fmt::print("{:<16} {:>10}  {:<10} {}\n", "class", "links", "transport", "rule");
    for (const auto& [key, n] : count) {
      const selector::Choice* c = example.at(key);
      unserved = unserved || !c->ok();
      fmt::print("{:<16} {:>10}  {:<10} {}\n",
                 selector::link_class_name(static_cast<selector::LinkClass>(std::get<0>(key))), n,
                 c->ok() ? c->transport : std::string("NONE"), c->rule);
      for (const auto& why : c->passed_over) fmt::print("{:<40}passed over {}\n", "", why);
      if (c->ok() && c->compress) fmt::print("{:<40}compressed {}\n", "", c->compress->describe());
    }
    if (estimate)
      fmt::print("\nCompression between nodes, 64 MiB float32 all-reduce: {}\n", estimate->why);
    fmt::print("\n{} distinct link signature(s) evaluated for {} link(s)\n", plan.signatures(),
               links);
    return !s.rules_error.empty() || unserved ? 2 : 0;
  } catch (const Error& e) {
    std::fprintf(stderr, "wia-info: %s: %s\n", status_name(e.status()), e.what());
    return 2;
  }
}

int lint(const SelectionOptions& o) {
  try {
    Setup s = set_up(o);
    if (!s.rules_error.empty()) {
      fmt::print("error: {}\n", s.rules_error);
      fmt::print("(at run time these rules are rejected and the defaults are used)\n");
      return 2;
    }
    fmt::print("Rules: {}\n", s.rules_origin);
    const auto findings = selector::lint(s.rules, s.available, &s.topology);
    int status = 0;
    for (const auto& f : findings) {
      fmt::print("{}: {}: {}\n", f.error ? "error" : "warning", f.where, f.message);
      status = std::max(status, f.error ? 2 : 1);
    }
    if (findings.empty()) fmt::print("no findings\n");
    return status;
  } catch (const Error& e) {
    std::fprintf(stderr, "wia-info: %s: %s\n", status_name(e.status()), e.what());
    return 2;
  }
}

int topology_diff(const char* declared_file, const char* detected_file, double tolerance) {
  try {
    const topo::Topology declared = topo::load_yaml(declared_file);
    const topo::Topology detected =
        detected_file ? topo::load_yaml(detected_file) : discovery::discover_topology();
    const topo::TopologyDiff d = topo::diff(declared, detected, tolerance);
    fmt::print(
        "Declared {} ({} devices) against {} ({} devices); devices matched by {}; "
        "tolerance {:.0f}%\n",
        declared_file, declared.n, detected_file ? detected_file : "the detected topology",
        detected.n, d.matched_by, tolerance * 100.0);
    constexpr std::size_t kShown = 16;
    auto names = [&](const char* title, const std::vector<std::string>& v) {
      if (v.empty()) return;
      fmt::print("{} ({}):", title, v.size());
      for (std::size_t i = 0; i < v.size() && i < kShown; ++i) fmt::print(" {}", v[i]);
      fmt::print("{}\n", v.size() > kShown ? " ..." : "");
    };
    names("Missing: declared, not detected", d.missing);
    names("Extra: detected, not declared", d.extra);
    for (const auto& g : d.links)
      fmt::print("Links differ: {}: {} link(s), e.g. {}\n", g.what, g.links, g.example);
    fmt::print("{} of {} compared link(s) differ\n", d.pairs_differing, d.pairs_compared);
    if (d.same()) fmt::print("same within tolerance\n");
    return d.same() ? 0 : 1;
  } catch (const Error& e) {
    std::fprintf(stderr, "wia-info: %s: %s\n", status_name(e.status()), e.what());
    return 2;
  }
}

int place(const char* model_file, const char* topology_file, const char* strategy,
          bool cross_node_first) {
  try {
    const place::ModelFile m = place::load_model_yaml(model_file);
    const topo::Topology t =
        topology_file ? topo::load_yaml(topology_file) : discovery::discover_topology();
    const std::string how = strategy ? strategy : "bandwidth";
    if (how != "bandwidth" && how != "latency" && how != "sequential")
      throw Error(WIA_ERROR_INVALID_ARGUMENT,
                  fmt::format("--strategy '{}': expected bandwidth, latency or sequential", how));
    place::Problem p = place::Problem::from(
        t, how == "latency" ? place::Objective::kLatency : place::Objective::kBandwidth);
    p.parts = static_cast<int>(m.names.size());
    p.traffic = m.traffic;
    p.memory = m.memory;
    p.names = m.names;
    p.cross_node_first = cross_node_first;
    p.max_per_device = std::max(1, (p.parts + t.n - 1) / std::max(t.n, 1));
    const place::Result r =
        place::solve(p, how == "sequential" ? place::Method::kSequential : place::Method::kAuto);
    fmt::print("Placement of {} part(s) on {} device(s), {} objective{}: {}\n", p.parts, t.n, how,
               cross_node_first ? " after cross-node bytes" : "", r.method);
    for (int a = 0; a < p.parts; ++a) {
      const int d = r.device_of[static_cast<std::size_t>(a)];
      fmt::print("  {:<20} -> {}\n", m.names[static_cast<std::size_t>(a)],
                 t.device_names[static_cast<std::size_t>(d)]);
    }
    fmt::print("cost {:.6g} ({}), cross-node bytes {:.6g}{}\n", r.score.cost,
               how == "latency" ? "us of link latency summed over communicating pairs"
                                : "seconds per step on links",
               r.score.cross_node_bytes, r.optimal ? ", optimal" : "");
    return 0;
  } catch (const Error& e) {
    std::fprintf(stderr, "wia-info: %s: %s\n", status_name(e.status()), e.what());
    return 2;
  }
}

}  // namespace wia_info
