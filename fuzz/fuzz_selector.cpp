// SPDX-License-Identifier: Apache-2.0
// fuzz_selector: selector rules and groups (docs/selector.md) as a
// configuration file carries them, through selector::load_rules and then
// what a communicator and wia-info --lint do with the rule set: a plan over
// every link of a real topology (config/topologies/4node-ib-hdr.yaml) and
// the lint.
//
// Invariants beyond "no crash":
//  - bad rules are a wia::Error(WIA_ERROR_CONFIG) with a message, and
//    load_rules_or_defaults (what the runtime calls) then falls back to the
//    defaults with that reason instead of throwing;
//  - links are symmetric: the plan's choice for (i, j) is the one for (j, i);
//  - a chosen transport is one the deciding rule names, and choose() on a
//    link agrees with the memoised plan.
#include <algorithm>

#include "fuzz_common.hpp"
#include "selector/selector.hpp"

namespace {

using wia::fuzz::check;
namespace sel = wia::selector;

const wia::topo::Topology& machine() {
  static const wia::topo::Topology t =
      wia::topo::load_yaml(WIA_FUZZ_SOURCE_DIR "/config/topologies/4node-ib-hdr.yaml");
  return t;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  wia::fuzz::quiet_logs();
  wia::Config config;
  try {
    config =
        wia::Config::parse(wia::fuzz::as_text({data, size}), "selector.yaml", wia::fuzz::no_env());
  } catch (const wia::Error& e) {
    wia::fuzz::check_rejection(e, WIA_ERROR_CONFIG, "Config::parse");
    return 0;
  }
  const sel::TransportAvailability all = sel::TransportAvailability::assume_all();
  sel::RuleSet rules;
  try {
    rules = sel::load_rules(config, &all, wia::fuzz::no_env());
  } catch (const wia::Error& e) {
    wia::fuzz::check_rejection(e, WIA_ERROR_CONFIG, "selector::load_rules");
    const sel::RuleSet fallback = sel::load_rules_or_defaults(config, &all, wia::fuzz::no_env());
    check(fallback.fallback_reason == e.what(), "load_rules_or_defaults: wrong fallback reason");
    return 0;
  }
  check(rules.groups.size() <= 64, "more than 64 groups accepted");

  const auto& t = machine();
  sel::TopologyPlan plan(rules, all, t);
  // Every pair of devices 0..7 (two nodes) and a sample of the rest.
  const int n = std::min(t.n, 12);
  for (int i = 0; i < n; ++i) {
    for (int j = 0; j < n; ++j) {
      if (i == j) continue;
      const sel::Choice& c = plan.at(i, j);
      const sel::Choice& back = plan.at(j, i);
      check(c.transport == back.transport, "asymmetric link " + std::to_string(i) + " <-> " +
                                               std::to_string(j) + ": " + c.describe() + " vs " +
                                               back.describe());
      const sel::Choice direct = sel::choose(rules, sel::link_of(t, i, j), all);
      check(direct.transport == c.transport, "choose() and the plan disagree");
      if (!c.ok()) continue;
      const auto it = std::find_if(rules.rules.begin(), rules.rules.end(), [&](const sel::Rule& r) {
        return sel::rule_matches(rules, r, sel::link_of(t, i, j)) &&
               std::any_of(r.transports.begin(), r.transports.end(),
                           [&](const sel::TransportPref& p) { return p.name == c.transport; });
      });
      check(it != rules.rules.end(), "transport '" + c.transport + "' named by no matching rule");
    }
  }
  (void)sel::lint(rules, all, &t);
  return 0;
}
