// SPDX-License-Identifier: Apache-2.0
// Transport selection: YAML rules -> the transport for each link between
// two ranks (docs/selector.md).
//
// A link has one class (same_process, same_numa, cross_numa,
// different_nodes), a peer flag (the two devices can address each other's
// memory) and the names of its two nodes and devices (for named groups).
// Rules are tried in order; the first rule that matches the link and has a
// usable transport decides, its first usable transport wins. A matching
// rule with nothing usable passes the link on to the next matching rule,
// and the built-in defaults come last:
//   same_process                -> p2p, shm, tcp
//   same_numa, cross_numa       -> shm, tcp
//   different_nodes             -> verbs, ofi, tcp
// A forced transport (selector.transport / WIA_SELECTOR_TRANSPORT /
// WIA_TRANSPORT) is a rule in front of all others that does not pass on:
// when the forced transport is unusable the link has none, and the
// explanation says why.
//
// Usage (the communicator, once per peer link):
//   const selector::RuleSet rules = selector::load_rules_or_defaults(rt.config());
//   const auto avail = discovery::transport_availability(rt.providers());
//   selector::Choice c = selector::choose(rules, selector::link_between(me, peer, peer_ok), avail);
//   if (!c.ok()) throw Error(WIA_ERROR_UNAVAILABLE, c.describe());
//   ... open c.transport with c.options ...
//
// Cost: choose() is O(rules x transports) string work per link. For whole
// topologies TopologyPlan memoises by link signature (class, peer, group
// membership of both ends), so 1024 ranks (523,776 links) cost a few dozen
// rule evaluations plus one hash lookup per pair.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "config/config.hpp"
#include "topology/topology.hpp"

namespace wia::selector {

enum class LinkClass : std::uint8_t {
  kSameProcess = 0,     // both ranks in one process (devices of one runtime)
  kSameNuma = 1,        // two processes, one node, same NUMA node (or both unknown)
  kCrossNuma = 2,       // two processes, one node, different NUMA nodes
  kDifferentNodes = 3,  // two nodes (hosts)
};
inline constexpr int kNumClasses = 4;
// "same_process", "same_numa", "cross_numa", "different_nodes".
const char* link_class_name(LinkClass c);

// One end of a link, as the communicator knows it.
struct EndpointInfo {
  std::string node;          // host name
  std::string device;        // "node/device" name (wia-info's), for device groups
  std::int64_t process = 0;  // any id distinct per process on a node (pid, rank)
  int numa = -1;             // NUMA node of the rank's device or CPU; -1 unknown
};

// What the selector looks at.
struct LinkInfo {
  LinkClass link_class = LinkClass::kDifferentNodes;
  bool peer_access = false;  // the devices can address each other's memory
  std::string node_a, node_b;
  std::string device_a, device_b;
};

// The class of a link between two endpoints (process compared only on the
// same node; NUMA -1 on both ends counts as the same NUMA node).
LinkInfo link_between(const EndpointInfo& a, const EndpointInfo& b, bool peer_access);
// The link between devices i and j of a topology (peer = p2p both ways).
LinkInfo link_of(const topo::Topology& t, int i, int j);

// What this process (or both ends: intersect()) can use.
struct TransportState {
  bool loaded = false;
  std::string reason;                // why not loaded (the loader's record)
  std::uint32_t endpoint_flags = 0;  // WIA_TRANSPORT_FLAG_*, union over endpoints
  int endpoints = 0;
};

// A plain value: the caller fills it (discovery::transport_availability
// from this process's provider registry, the peers' published records, a
// test's fake), so the selector never asks a provider itself.
class TransportAvailability {
 public:
  // As if every known transport were loaded with intra- and inter-node
  // endpoints: for planning a machine that is not this one.
  static TransportAvailability assume_all();
  // Loaded on both ends, endpoint flags intersected.
  static TransportAvailability intersect(const TransportAvailability& a,
                                         const TransportAvailability& b);

  void set(const std::string& name, TransportState state) { states_[name] = std::move(state); }
  const TransportState* find(std::string_view name) const;
  const std::map<std::string, TransportState, std::less<>>& states() const { return states_; }

 private:
  std::map<std::string, TransportState, std::less<>> states_;
};

// The transports rules may name: the built-in ones plus loaded providers.
inline constexpr const char* kBuiltinTransports[] = {"p2p", "shm", "tcp", "ofi", "verbs"};

struct TransportPref {
  std::string name;
  std::map<std::string, std::string> options;  // per-transport options, as written
};

// Bit per LinkClass.
using ClassMask = std::uint8_t;
inline constexpr ClassMask kAllClasses = 0x0f;
constexpr ClassMask class_bit(LinkClass c) {
  return static_cast<ClassMask>(1u << static_cast<int>(c));
}

struct Match {
  ClassMask classes = kAllClasses;
  std::optional<bool> peer;
  int within = -1;                     // group index: both ends in it
  int between_a = -1, between_b = -1;  // one end in each (either way round)
};

// A rule's `compress: {method: int8, when: "bandwidth < 10GB/s"}`:
// float32 all-reduces compress what crosses the links the rule decides
// (links between nodes only; docs/compression.md, "Compression between
// hosts").
struct LinkCompress {
  std::string method;      // "int8", "bf16" or "auto"
  double below_gbps = 0;   // `when: "bandwidth < X"`, GB/s; 0 = always
  std::string where;       // "file:line:col" of the rule's compress key
  // "int8 when bandwidth < 10 GB/s".
  std::string describe() const;
};

struct Rule {
  std::string name;   // `name:` or "rule N"
  std::string where;  // "file:line:col", "default", "env WIA_TRANSPORT", ...
  Match match;
  std::vector<TransportPref> transports;
  std::optional<LinkCompress> compress;
  bool passes_on = true;  // false: a forced rule; nothing usable = no transport
  bool is_default = false;
};

struct Group {
  std::string name;
  std::string where;
  std::vector<std::string> node_patterns;    // glob (fnmatch) on node names
  std::vector<std::string> device_patterns;  // glob on "node/device" names
  bool contains(std::string_view node, std::string_view device) const;
};

struct RuleSet {
  std::vector<Group> groups;    // at most 64
  std::vector<Rule> rules;      // forced, then the user's, then the defaults
  std::string source;           // file the user's rules came from, "" = none
  std::string fallback_reason;  // set by load_rules_or_defaults when it fell back
  std::size_t user_rules() const;
};

// The built-in defaults alone.
RuleSet default_rules();

// The selector section of `config` (selector.rules, selector.groups,
// selector.transport) plus WIA_TRANSPORT read through `env`, which
// overrides selector.transport. Transport names must be built-in or in
// `available` (when given). Throws wia::Error(WIA_ERROR_CONFIG)
// "file:line:col: key 'selector.rules[2].transports[0]': unknown transport
// 'tpc' (available: p2p, shm, tcp, ofi, verbs); did you mean 'tcp'?".
RuleSet load_rules(const Config& config, const TransportAvailability* available = nullptr,
                   const EnvLookup& env = process_env());
// For the runtime: load_rules, or on a bad rule set the defaults, with the
// reason logged (warn) and kept in fallback_reason. Never throws for bad rules.
RuleSet load_rules_or_defaults(const Config& config,
                               const TransportAvailability* available = nullptr,
                               const EnvLookup& env = process_env());

struct Choice {
  std::string transport;  // "" = nothing usable
  std::map<std::string, std::string> options;
  std::string rule;  // "selector.yaml:12:7 (rule 2 'fast')", "default (different_nodes)"
  std::optional<LinkCompress> compress;  // the deciding rule's
  // Each preference passed over, in order: "verbs: provider not loaded: ...",
  // "shm: peers are on different nodes", "p2p: devices cannot access peer".
  std::vector<std::string> passed_over;
  bool ok() const { return !transport.empty(); }
  // One line: "tcp by default (different_nodes); passed over: verbs: ...".
  std::string describe() const;
};

// Why `pref` cannot serve `link` here; empty when it can.
std::string why_unusable(const std::string& transport, const LinkInfo& link,
                         const TransportAvailability& available);
bool rule_matches(const RuleSet& rules, const Rule& rule, const LinkInfo& link);
Choice choose(const RuleSet& rules, const LinkInfo& link, const TransportAvailability& available);

// Every link of a topology, chosen once per link signature.
class TopologyPlan {
 public:
  TopologyPlan(const RuleSet& rules, const TransportAvailability& available,
               const topo::Topology& topology);
  // The choice for the link i -> j (i != j); the same object for every
  // link of one signature. Links are symmetric: (i, j) and (j, i) agree.
  const Choice& at(int i, int j);
  // Number of distinct signatures met so far.
  std::size_t signatures() const { return choices_.size(); }
  // Index of the rule that decided each signature (-1 = none), for lint.
  const std::vector<int>& deciding_rule() const { return decided_by_; }
  LinkClass class_of(int i, int j) const;

 private:
  const RuleSet& rules_;
  const TransportAvailability& available_;
  const topo::Topology& t_;
  std::vector<std::uint32_t> mask_id_;  // [n] index into masks_
  std::vector<std::uint64_t> masks_;    // distinct group masks (bit per group)
  std::unordered_map<std::uint64_t, std::size_t> index_;
  std::vector<std::unique_ptr<Choice>> choices_;
  std::vector<int> decided_by_;
};

// --lint.
struct Finding {
  bool error = false;  // error: a link of the topology has no usable transport
  std::string where;   // rule location
  std::string message;
};
// Rules shadowed by earlier ones, rules and groups that match nothing in
// `topology` (when given), transports that can never serve a rule's link
// classes, rules with nothing usable here, and links with no transport.
std::vector<Finding> lint(const RuleSet& rules, const TransportAvailability& available,
                          const topo::Topology* topology);

}  // namespace wia::selector
