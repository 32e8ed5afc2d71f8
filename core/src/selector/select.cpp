// SPDX-License-Identifier: Apache-2.0
// Choosing a transport per link, over one link or a whole topology, and
// checking a rule set (wia-info --explain, --lint).
#include <fmt/format.h>
#include <fnmatch.h>
#include <wia/provider.h>

#include <algorithm>
#include <set>

#include "common/error.hpp"
#include "selector/selector.hpp"

namespace wia::selector {

const char* link_class_name(LinkClass c) {
  switch (c) {
    case LinkClass::kSameProcess:
      return "same_process";
    case LinkClass::kSameNuma:
      return "same_numa";
    case LinkClass::kCrossNuma:
      return "cross_numa";
    case LinkClass::kDifferentNodes:
      return "different_nodes";
  }
  return "?";
}

LinkInfo link_between(const EndpointInfo& a, const EndpointInfo& b, bool peer_access) {
  LinkInfo l;
  if (a.node != b.node)
    l.link_class = LinkClass::kDifferentNodes;
  else if (a.process == b.process)
    l.link_class = LinkClass::kSameProcess;
  else
    l.link_class = a.numa == b.numa ? LinkClass::kSameNuma : LinkClass::kCrossNuma;
  l.peer_access = peer_access;
  l.node_a = a.node;
  l.node_b = b.node;
  l.device_a = a.device;
  l.device_b = b.device;
  return l;
}

namespace {

LinkClass class_in(const topo::Topology& t, int i, int j) {
  if (t.node(i) != t.node(j)) return LinkClass::kDifferentNodes;
  if (t.process(i) == t.process(j)) return LinkClass::kSameProcess;
  return t.numa(i) == t.numa(j) ? LinkClass::kSameNuma : LinkClass::kCrossNuma;
}

bool peer_in(const topo::Topology& t, int i, int j) {
  return t.p2p[t.at(i, j)] != 0 && t.p2p[t.at(j, i)] != 0;
}

}  // namespace

LinkInfo link_of(const topo::Topology& t, int i, int j) {
  LinkInfo l;
  l.link_class = class_in(t, i, j);
  l.peer_access = peer_in(t, i, j);
  l.node_a = t.node_names[static_cast<std::size_t>(t.node(i))];
  l.node_b = t.node_names[static_cast<std::size_t>(t.node(j))];
  l.device_a = t.device_names[static_cast<std::size_t>(i)];
  l.device_b = t.device_names[static_cast<std::size_t>(j)];
  return l;
}

// --- availability -----------------------------------------------------------

TransportAvailability TransportAvailability::assume_all() {
  TransportAvailability a;
  for (const char* name : kBuiltinTransports) {
    if (std::string_view(name) == "p2p") continue;
    TransportState s;
    s.loaded = true;
    s.endpoints = 1;
    s.endpoint_flags = WIA_TRANSPORT_FLAG_INTER_NODE | WIA_TRANSPORT_FLAG_INTRA_NODE;
    if (std::string_view(name) == "shm") s.endpoint_flags = WIA_TRANSPORT_FLAG_INTRA_NODE;
    a.states_[name] = s;
  }
  return a;
}

TransportAvailability TransportAvailability::intersect(const TransportAvailability& a,
                                                       const TransportAvailability& b) {
  TransportAvailability out;
  std::set<std::string> names;
  for (const auto& [n, s] : a.states_) names.insert(n);
  for (const auto& [n, s] : b.states_) names.insert(n);
  for (const auto& name : names) {
    const TransportState* sa = a.find(name);
    const TransportState* sb = b.find(name);
    TransportState s;
    if (sa != nullptr && sb != nullptr && sa->loaded && sb->loaded) {
      s.loaded = true;
      s.endpoint_flags = sa->endpoint_flags & sb->endpoint_flags;
      s.endpoints = std::min(sa->endpoints, sb->endpoints);
    } else {
      const TransportState* missing = (sa == nullptr || !sa->loaded) ? sa : sb;
      const char* side = (sa == nullptr || !sa->loaded) ? "this end" : "the peer";
      s.reason = fmt::format("{}: {}", side,
                             missing != nullptr && !missing->reason.empty()
                                 ? missing->reason
                                 : std::string("no provider of that name was found"));
    }
    out.states_[name] = std::move(s);
  }
  return out;
}

const TransportState* TransportAvailability::find(std::string_view name) const {
  auto it = states_.find(name);
  return it == states_.end() ? nullptr : &it->second;
}

// --- matching and choosing ------------------------------------------------------

bool Group::contains(std::string_view node, std::string_view device) const {
  const std::string n(node), d(device);
  for (const auto& p : node_patterns)
    if (fnmatch(p.c_str(), n.c_str(), 0) == 0) return true;
  for (const auto& p : device_patterns)
    if (fnmatch(p.c_str(), d.c_str(), 0) == 0) return true;
  return false;
}

std::string why_unusable(const std::string& transport, const LinkInfo& link,
                         const TransportAvailability& available) {
  if (transport == "p2p") {
    if (link.link_class != LinkClass::kSameProcess)
      return link.link_class == LinkClass::kDifferentNodes ? "peers are on different nodes"
                                                           : "peers are in different processes";
    if (!link.peer_access) return "devices cannot access peer";
    return {};
  }
  const TransportState* s = available.find(transport);
  if (s == nullptr)
    return fmt::format("provider not loaded: no libwia-provider-{}.so in the provider search path",
                       transport);
  if (!s->loaded) return fmt::format("provider not loaded: {}", s->reason);
  const bool remote = link.link_class == LinkClass::kDifferentNodes;
  if (transport == "shm" && remote) return "peers are on different nodes";
  const std::uint32_t need = remote ? WIA_TRANSPORT_FLAG_INTER_NODE : WIA_TRANSPORT_FLAG_INTRA_NODE;
  if (s->endpoints == 0) return "provider loaded, but it has no endpoint";
  if ((s->endpoint_flags & need) == 0)
    return remote ? "no endpoint reaches peers on other nodes"
                  : "no endpoint reaches peers on this node";
  return {};
}

namespace {

bool in_group(const RuleSet& rs, int g, const LinkInfo& l, bool end_a) {
  const Group& group = rs.groups[static_cast<std::size_t>(g)];
  return end_a ? group.contains(l.node_a, l.device_a) : group.contains(l.node_b, l.device_b);
}

// The match test, with group membership given by a predicate so the
// topology plan can use precomputed masks.
template <typename InGroup>
bool matches(const Match& m, LinkClass c, bool peer, InGroup&& in) {
  if ((m.classes & class_bit(c)) == 0) return false;
  if (m.peer && *m.peer != peer) return false;
  if (m.within >= 0 && !(in(m.within, true) && in(m.within, false))) return false;
  if (m.between_a >= 0) {
    const bool ab = in(m.between_a, true) && in(m.between_b, false);
    const bool ba = in(m.between_b, true) && in(m.between_a, false);
    if (!ab && !ba) return false;
  }
  return true;
}

std::string rule_label(const Rule& r) {
  if (r.is_default) return r.name;
  if (!r.passes_on) return fmt::format("{} ({})", r.name, r.where);
  return fmt::format("{} '{}'", r.where, r.name);
}

template <typename InGroup>
Choice choose_with(const RuleSet& rs, const LinkInfo& link, const TransportAvailability& avail,
                   InGroup&& in, int* decided) {
  Choice c;
  *decided = -1;
  for (std::size_t k = 0; k < rs.rules.size(); ++k) {
    const Rule& r = rs.rules[k];
    if (!matches(r.match, link.link_class, link.peer_access, in)) continue;
    for (const auto& pref : r.transports) {
      const std::string why = why_unusable(pref.name, link, avail);
      if (why.empty()) {
        c.transport = pref.name;
        c.options = pref.options;
        c.rule = rule_label(r);
        c.compress = r.compress;
        *decided = static_cast<int>(k);
        return c;
      }
      // A transport a later rule lists again fails for the same reason:
      // say it once.
      std::string line = fmt::format("{}: {}", pref.name, why);
      if (std::find(c.passed_over.begin(), c.passed_over.end(), line) == c.passed_over.end())
        c.passed_over.push_back(std::move(line));
    }
    if (!r.passes_on) {
      c.rule = rule_label(r);
      c.passed_over.push_back("forced transport unusable; no other transport is tried");
      return c;
    }
  }
  c.rule = "no rule had a usable transport";
  return c;
}

}  // namespace

bool rule_matches(const RuleSet& rules, const Rule& rule, const LinkInfo& link) {
  return matches(rule.match, link.link_class, link.peer_access,
                 [&](int g, bool a) { return in_group(rules, g, link, a); });
}

Choice choose(const RuleSet& rules, const LinkInfo& link, const TransportAvailability& available) {
  int decided = -1;
  return choose_with(
      rules, link, available, [&](int g, bool a) { return in_group(rules, g, link, a); }, &decided);
}

std::string LinkCompress::describe() const {
  return below_gbps > 0 ? fmt::format("{} when bandwidth < {:g} GB/s", method, below_gbps)
                        : method;
}

std::string Choice::describe() const {
  std::string s = ok() ? fmt::format("{} by {}", transport, rule)
                       : fmt::format("no usable transport ({})", rule);
  if (ok() && compress) s += fmt::format(", compressed {}", compress->describe());
  if (!passed_over.empty()) {
    s += "; passed over: ";
    for (std::size_t i = 0; i < passed_over.size(); ++i) s += (i ? "; " : "") + passed_over[i];
  }
  return s;
}

// --- whole topologies ------------------------------------------------------------

TopologyPlan::TopologyPlan(const RuleSet& rules, const TransportAvailability& available,
                           const topo::Topology& topology)
    : rules_(rules), available_(available), t_(topology) {
  // Group membership per device as a bit mask, and the distinct masks
  // numbered, so a link's signature is an exact small integer.
  std::unordered_map<std::uint64_t, std::uint32_t> ids;
  mask_id_.assign(static_cast<std::size_t>(t_.n), 0);
  for (int i = 0; i < t_.n; ++i) {
    const std::string& node = t_.node_names[static_cast<std::size_t>(t_.node(i))];
    const std::string& dev = t_.device_names[static_cast<std::size_t>(i)];
    std::uint64_t mask = 0;
    for (std::size_t g = 0; g < rules_.groups.size(); ++g)
      if (rules_.groups[g].contains(node, dev)) mask |= 1ull << g;
    auto [it, fresh] = ids.emplace(mask, static_cast<std::uint32_t>(masks_.size()));
    if (fresh) masks_.push_back(mask);
    mask_id_[static_cast<std::size_t>(i)] = it->second;
  }
}

LinkClass TopologyPlan::class_of(int i, int j) const { return class_in(t_, i, j); }

const Choice& TopologyPlan::at(int i, int j) {
  const std::uint64_t ia = mask_id_[static_cast<std::size_t>(i)];
  const std::uint64_t ib = mask_id_[static_cast<std::size_t>(j)];
  const LinkClass c = class_in(t_, i, j);
  const bool peer = peer_in(t_, i, j);
  // Matching is symmetric in the two ends, so order them.
  const std::uint64_t lo = std::min(ia, ib), hi = std::max(ia, ib);
  const std::uint64_t key =
      (lo * masks_.size() + hi) * 8 + static_cast<std::uint64_t>(c) * 2 + (peer ? 1 : 0);
  auto it = index_.find(key);
  if (it != index_.end()) return *choices_[it->second];
  const LinkInfo link = link_of(t_, i, j);
  const std::uint64_t ma = masks_[ia], mb = masks_[ib];
  auto in = [&](int g, bool end_a) { return (((end_a ? ma : mb) >> g) & 1u) != 0; };
  int decided = -1;
  choices_.push_back(std::make_unique<Choice>(choose_with(rules_, link, available_, in, &decided)));
  decided_by_.push_back(decided);
  index_.emplace(key, choices_.size() - 1);
  return *choices_.back();
}

// --- lint -----------------------------------------------------------------------

namespace {

bool covers(const Match& e, const Match& r) {
  if ((r.classes & ~e.classes) != 0) return false;
  if (e.peer && (!r.peer || *r.peer != *e.peer)) return false;
  if (e.within >= 0 && e.within != r.within) return false;
  if (e.between_a >= 0 && !((e.between_a == r.between_a && e.between_b == r.between_b) ||
                            (e.between_a == r.between_b && e.between_b == r.between_a)))
    return false;
  return true;
}

// A transport that can never serve a class, whatever is loaded.
const char* never_serves(const std::string& transport, LinkClass c) {
  if (transport == "p2p" && c != LinkClass::kSameProcess)
    return "p2p only serves links inside one process";
  if (transport == "shm" && c == LinkClass::kDifferentNodes)
    return "shm only serves links inside one node";
  return nullptr;
}

}  // namespace

std::vector<Finding> lint(const RuleSet& rs, const TransportAvailability& avail,
                          const topo::Topology* topology) {
  std::vector<Finding> out;
  std::vector<char> nothing_usable(rs.rules.size(), 0);
  auto warn = [&](const Rule& r, std::string msg) {
    out.push_back(Finding{false, r.where, fmt::format("{}: {}", r.name, msg)});
  };
  for (std::size_t k = 0; k < rs.rules.size(); ++k) {
    const Rule& r = rs.rules[k];
    if (r.is_default) continue;
    // Shadowed: an earlier rule matches every link this one matches.
    for (std::size_t e = 0; e < k; ++e) {
      const Rule& earlier = rs.rules[e];
      if (!covers(earlier.match, r.match)) continue;
      warn(r, earlier.passes_on
                  ? fmt::format("shadowed by {} ({}): it matches every link this rule matches, "
                                "so this rule is reached only when none of its transports is "
                                "usable",
                                earlier.name, earlier.where)
                  : fmt::format("shadowed by {} ({}): never reached while that transport is "
                                "forced",
                                earlier.name, earlier.where));
      break;
    }
    // Transports that can never serve the rule's classes, and classes for
    // which nothing listed is usable here.
    for (int ci = 0; ci < kNumClasses; ++ci) {
      const auto c = static_cast<LinkClass>(ci);
      if ((r.match.classes & class_bit(c)) == 0) continue;
      bool any_usable = false;
      std::vector<std::string> why;
      for (const auto& pref : r.transports) {
        if (const char* never = never_serves(pref.name, c)) {
          if (r.match.classes != kAllClasses || r.transports.size() == 1)
            warn(r, fmt::format("{} is listed for {} links, but {}", pref.name, link_class_name(c),
                                never));
          why.push_back(fmt::format("{}: {}", pref.name, never));
          continue;
        }
        LinkInfo probe;
        probe.link_class = c;
        probe.peer_access = !r.match.peer || *r.match.peer;
        const std::string w = why_unusable(pref.name, probe, avail);
        if (w.empty())
          any_usable = true;
        else
          why.push_back(fmt::format("{}: {}", pref.name, w));
      }
      if (!any_usable) {
        std::string list;
        for (const auto& w : why) list += (list.empty() ? "" : "; ") + w;
        warn(r, fmt::format("nothing usable here for {} links ({})", link_class_name(c), list));
        nothing_usable[k] = 1;
      }
    }
  }
  if (topology == nullptr) return out;

  // Over the topology: groups and rules that match nothing, rules that
  // never decide, links left without a transport.
  const topo::Topology& t = *topology;
  for (const auto& g : rs.groups) {
    bool any = false;
    for (int i = 0; i < t.n && !any; ++i)
      any = g.contains(t.node_names[static_cast<std::size_t>(t.node(i))],
                       t.device_names[static_cast<std::size_t>(i)]);
    if (!any)
      out.push_back(
          Finding{false, g.where,
                  fmt::format("group '{}' contains no node or device of this topology", g.name)});
  }
  TopologyPlan plan(rs, avail, t);
  std::vector<char> matched(rs.rules.size(), 0);
  std::size_t unserved = 0;
  std::string first_unserved;
  // Rule matching is checked on the first pair of each signature.
  for (int i = 0; i < t.n; ++i)
    for (int j = i + 1; j < t.n; ++j) {
      const std::size_t before = plan.signatures();
      const Choice& c = plan.at(i, j);
      if (plan.signatures() == before) {
        if (!c.ok()) ++unserved;
        continue;
      }
      const LinkInfo link = link_of(t, i, j);
      for (std::size_t k = 0; k < rs.rules.size(); ++k)
        if (rule_matches(rs, rs.rules[k], link)) matched[k] = 1;
      if (!c.ok()) {
        ++unserved;
        if (first_unserved.empty())
          first_unserved = fmt::format("{} <-> {} ({}): {}", link.device_a, link.device_b,
                                       link_class_name(link.link_class), c.describe());
      }
    }
  std::vector<char> decided(rs.rules.size(), 0);
  for (int d : plan.deciding_rule())
    if (d >= 0) decided[static_cast<std::size_t>(d)] = 1;
  for (std::size_t k = 0; k < rs.rules.size(); ++k) {
    const Rule& r = rs.rules[k];
    if (r.is_default) continue;
    if (!matched[k])
      warn(r, "matches no link of this topology");
    else if (!decided[k] && !nothing_usable[k])
      warn(r, "matches links of this topology but decides none: earlier rules take them all");
  }
  if (unserved > 0)
    out.push_back(Finding{
        true, "topology",
        fmt::format("{} link(s) have no usable transport; first: {}", unserved, first_unserved)});
  return out;
}

}  // namespace wia::selector
