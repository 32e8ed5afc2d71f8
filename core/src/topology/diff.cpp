// SPDX-License-Identifier: Apache-2.0
// Declared-versus-detected topology comparison (diff.hpp).
#include "topology/diff.hpp"

#include <fmt/format.h>

#include <cmath>
#include <map>
#include <unordered_map>

namespace wia::topo {

namespace {

std::string figure(double v) { return fmt::format("{:g}", v); }

std::string percent(double declared, double detected) {
  if (declared == 0.0) return "";
  return fmt::format(" ({:+.0f}%)", (detected - declared) / declared * 100.0);
}

}  // namespace

TopologyDiff diff(const Topology& declared, const Topology& detected, double tolerance) {
  TopologyDiff d;
  const auto nd = static_cast<std::size_t>(declared.n);
  const auto nt = static_cast<std::size_t>(detected.n);
  // match[i] = detected index of declared device i, or -1.
  std::vector<int> match(nd, -1);
  std::vector<char> used(nt, 0);
  std::unordered_map<std::string, int> by_name;
  for (std::size_t j = 0; j < nt; ++j)
    by_name.emplace(detected.device_names[j], static_cast<int>(j));
  std::size_t named = 0;
  for (std::size_t i = 0; i < nd; ++i) {
    auto it = by_name.find(declared.device_names[i]);
    if (it != by_name.end()) {
      match[i] = it->second;
      used[static_cast<std::size_t>(it->second)] = 1;
      ++named;
    }
  }
  d.matched_by = "name";
  if (named == 0 && nd == nt && nd > 0) {
    // Typically a file written on another host: same shape, other names.
    for (std::size_t i = 0; i < nd; ++i) {
      match[i] = static_cast<int>(i);
      used[i] = 1;
    }
    d.matched_by = fmt::format("position (no device name matches: declared '{}', detected '{}')",
                               declared.device_names[0], detected.device_names[0]);
  }
  for (std::size_t i = 0; i < nd; ++i)
    if (match[i] < 0) d.missing.push_back(declared.device_names[i]);
  for (std::size_t j = 0; j < nt; ++j)
    if (!used[j]) d.extra.push_back(detected.device_names[j]);

  std::map<std::string, std::size_t> group_of;
  auto note = [&](const std::string& what, int a, int b) {
    auto [it, fresh] = group_of.emplace(what, d.links.size());
    if (fresh)
      d.links.push_back(TopologyDiff::LinkGroup{
          what, 0,
          fmt::format("{} -> {}", declared.device_names[static_cast<std::size_t>(a)],
                      declared.device_names[static_cast<std::size_t>(b)])});
    ++d.links[it->second].links;
  };
  auto beyond = [&](double want, double got) {
    return std::fabs(got - want) > tolerance * std::fabs(want) + 1e-12;
  };
  for (int a = 0; a < declared.n; ++a) {
    const int ta = match[static_cast<std::size_t>(a)];
    if (ta < 0) continue;
    for (int b = 0; b < declared.n; ++b) {
      const int tb = match[static_cast<std::size_t>(b)];
      if (a == b || tb < 0) continue;
      ++d.pairs_compared;
      const auto k = declared.at(a, b);
      const auto kt = detected.at(ta, tb);
      bool differs = false;
      if (declared.type_name(a, b) != detected.type_name(ta, tb)) {
        note(fmt::format("link type {} declared, {} detected", declared.type_name(a, b),
                         detected.type_name(ta, tb)),
             a, b);
        differs = true;
      }
      if (beyond(declared.bandwidth[k], detected.bandwidth[kt])) {
        note(fmt::format("bandwidth_gbps {} declared, {} detected{}", figure(declared.bandwidth[k]),
                         figure(detected.bandwidth[kt]),
                         percent(declared.bandwidth[k], detected.bandwidth[kt])),
             a, b);
        differs = true;
      }
      if (beyond(declared.latency[k], detected.latency[kt])) {
        note(fmt::format("latency_us {} declared, {} detected{}", figure(declared.latency[k]),
                         figure(detected.latency[kt]),
                         percent(declared.latency[k], detected.latency[kt])),
             a, b);
        differs = true;
      }
      if (declared.hops[k] != detected.hops[kt]) {
        note(fmt::format("hops {} declared, {} detected", declared.hops[k], detected.hops[kt]), a,
             b);
        differs = true;
      }
      if (declared.p2p[k] != detected.p2p[kt]) {
        note(fmt::format("p2p {} declared, {} detected", declared.p2p[k] ? "true" : "false",
                         detected.p2p[kt] ? "true" : "false"),
             a, b);
        differs = true;
      }
      if (differs) ++d.pairs_differing;
    }
  }
  return d;
}

}  // namespace wia::topo
