// SPDX-License-Identifier: Apache-2.0
// Transport selection rules over the example topologies: given a topology
// file and a rule file, the transport chosen for each link is asserted,
// with the explanation of what was passed over and why.
#include "selector/selector.hpp"

#include <doctest/doctest.h>
#include <unistd.h>
#include <wia/provider.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <map>
#include <string>

#include "common/error.hpp"
#include "config/config.hpp"
#include "topology/topology.hpp"

using namespace wia;
using selector::LinkClass;

namespace {

const std::string kSource = WIA_TEST_SOURCE_DIR;

std::string topo_path(const char* name) { return kSource + "/config/topologies/" + name; }

// No WIA_TRANSPORT unless a test sets one.
EnvLookup env_with(std::map<std::string, std::string> vars) {
  return [vars = std::move(vars)](const char* name) -> const char* {
    auto it = vars.find(name);
    return it == vars.end() ? nullptr : it->second.c_str();
  };
}
const EnvLookup kNoEnv = env_with({});

Config config_text(const std::string& yaml, const EnvLookup& env = kNoEnv) {
  return Config::parse(yaml, "rules.yaml", env);
}

// What a cluster node has: shm (this node), tcp (both), verbs absent.
// The WIA_ERROR_CONFIG message load_rules gives for a rules text.
std::string error_of(const std::string& yaml) {
  try {
    selector::load_rules(config_text(yaml), nullptr, kNoEnv);
  } catch (const Error& e) {
    CHECK(e.status() == WIA_ERROR_CONFIG);
    return std::string(e.what());
  }
  return std::string("(no error)");
}

selector::TransportAvailability cluster_node() {
  selector::TransportAvailability a;
  a.set("shm", {true, "", WIA_TRANSPORT_FLAG_INTRA_NODE, 1});
  a.set("tcp", {true, "", WIA_TRANSPORT_FLAG_INTRA_NODE | WIA_TRANSPORT_FLAG_INTER_NODE, 2});
  a.set("verbs", {false, "absent: no RDMA device (ibv_get_device_list returned 0)", 0, 0});
  return a;
}

bool mentions(const selector::Choice& c, const std::string& text) {
  for (const auto& line : c.passed_over)
    if (line.find(text) != std::string::npos) return true;
  return false;
}

// Index of a device by its full name.
int dev(const topo::Topology& t, const std::string& name) {
  for (int i = 0; i < t.n; ++i)
    if (t.device_names[static_cast<std::size_t>(i)] == name) return i;
  FAIL("no device " << name);
  return -1;
}

}  // namespace

TEST_CASE("selector: defaults pick p2p in process, shm on a node, and explain the rest") {
  const selector::RuleSet rules = selector::default_rules();
  const auto avail = cluster_node();
  selector::EndpointInfo a{"n0", "n0/gpu0", 100, 0};
  selector::EndpointInfo b{"n0", "n0/gpu1", 100, 0};

  auto c = selector::choose(rules, selector::link_between(a, b, true), avail);
  CHECK(c.transport == "p2p");
  CHECK(c.rule == "default (same_process)");

  c = selector::choose(rules, selector::link_between(a, b, false), avail);
  CHECK(c.transport == "shm");
  CHECK(mentions(c, "p2p: devices cannot access peer"));

  b.process = 101;
  b.numa = 1;
  const auto cross = selector::link_between(a, b, true);
  CHECK(cross.link_class == LinkClass::kCrossNuma);
  c = selector::choose(rules, cross, avail);
  CHECK(c.transport == "shm");

  selector::EndpointInfo remote{"n1", "n1/gpu0", 100, 0};
  c = selector::choose(rules, selector::link_between(a, remote, false), avail);
  CHECK(c.transport == "tcp");
  CHECK(c.rule == "default (different_nodes)");
  REQUIRE(c.passed_over.size() == 2);
  CHECK(c.passed_over[0] ==
        "verbs: provider not loaded: absent: no RDMA device (ibv_get_device_list returned 0)");
  CHECK(c.passed_over[1].rfind("ofi: provider not loaded: no libwia-provider-ofi.so", 0) == 0);
}

TEST_CASE("selector: a transport without an endpoint of the right reach is passed over") {
  selector::TransportAvailability a;
  a.set("tcp", {true, "", WIA_TRANSPORT_FLAG_INTRA_NODE, 1});  // loopback only
  const auto rules = selector::default_rules();
  const auto link = selector::link_between({"n0", "n0/d", 1, 0}, {"n1", "n1/d", 1, 0}, false);
  const auto c = selector::choose(rules, link, a);
  CHECK_FALSE(c.ok());
  CHECK(mentions(c, "tcp: no endpoint reaches peers on other nodes"));
  CHECK(c.describe().find("no usable transport") != std::string::npos);
}

TEST_CASE("selector: the cluster rule file over 4node-ib-hdr chooses per link class") {
  const Config config = Config::load(kSource + "/config/examples/selector-cluster.yaml", kNoEnv);
  const auto avail = cluster_node();
  const selector::RuleSet rules = selector::load_rules(config, &avail, kNoEnv);
  CHECK(rules.user_rules() == 4);
  const topo::Topology t = topo::load_yaml(topo_path("4node-ib-hdr.yaml"));
  selector::TopologyPlan plan(rules, avail, t);

  // One rank per GPU: GPUs of one node are different processes that can peer.
  const auto& intra = plan.at(dev(t, "dgx0/gpu0"), dev(t, "dgx0/gpu1"));
  CHECK(intra.transport == "shm");
  CHECK(intra.options.at("segment_size") == "64M");
  CHECK(intra.rule.find("selector-cluster.yaml:22:7 'gpus that can peer on one node'") !=
        std::string::npos);

  // Inside rack0: verbs is preferred but absent here, ofi was never built.
  const auto& rack = plan.at(dev(t, "dgx0/gpu3"), dev(t, "dgx1/gpu5"));
  CHECK(rack.transport == "tcp");
  CHECK(rack.options.at("streams") == "4");
  CHECK(rack.rule.find("'inside rack0'") != std::string::npos);
  CHECK(mentions(rack, "verbs: provider not loaded: absent: no RDMA device"));
  CHECK(mentions(rack, "ofi: provider not loaded"));

  // Across racks: the catch-all rule.
  const auto& far = plan.at(dev(t, "dgx1/gpu0"), dev(t, "dgx2/gpu0"));
  CHECK(far.transport == "tcp");
  CHECK(far.options.at("streams") == "8");
  CHECK(far.rule.find("'everything else between nodes'") != std::string::npos);

  // With verbs loaded the rack link takes it; the others do not change.
  auto with_verbs = avail;
  with_verbs.set("verbs", {true, "", WIA_TRANSPORT_FLAG_INTER_NODE, 1});
  selector::TopologyPlan plan2(rules, with_verbs, t);
  CHECK(plan2.at(dev(t, "dgx0/gpu3"), dev(t, "dgx1/gpu5")).transport == "verbs");
  CHECK(plan2.at(dev(t, "dgx0/gpu3"), dev(t, "dgx1/gpu5")).options.at("gid_index") == "3");
  CHECK(plan2.at(dev(t, "dgx1/gpu0"), dev(t, "dgx2/gpu0")).transport == "tcp");

  // Every pair agrees with choose() on the same link, both directions.
  for (int i = 0; i < t.n; i += 3)
    for (int j = 0; j < t.n; j += 5) {
      if (i == j) continue;
      const auto direct = selector::choose(rules, selector::link_of(t, i, j), avail);
      CHECK(plan.at(i, j).transport == direct.transport);
      CHECK(plan.at(i, j).rule == direct.rule);
      CHECK(plan.at(j, i).transport == direct.transport);
    }
  CHECK(plan.signatures() <= 8);
}

TEST_CASE("selector: 2socket-pcie has same-NUMA and cross-NUMA links") {
  const topo::Topology t = topo::load_yaml(topo_path("2socket-pcie.yaml"));
  CHECK(selector::link_of(t, 0, 1).link_class == LinkClass::kSameNuma);
  CHECK(selector::link_of(t, 0, 1).peer_access);
  CHECK(selector::link_of(t, 1, 2).link_class == LinkClass::kCrossNuma);
  CHECK_FALSE(selector::link_of(t, 1, 2).peer_access);
  const Config config = config_text(R"(
selector:
  rules:
    - match: cross_numa
      transports: [tcp]
)");
  const auto avail = cluster_node();
  const auto rules = selector::load_rules(config, &avail, kNoEnv);
  selector::TopologyPlan plan(rules, avail, t);
  CHECK(plan.at(0, 1).transport == "shm");  // default same_node rule
  CHECK(plan.at(1, 2).transport == "tcp");  // the file's cross_numa rule
  CHECK(plan.at(1, 2).rule == "rules.yaml:4:7 'rule 1'");
}

TEST_CASE("selector: a discovered topology is one process") {
  topo::Topology t;
  t.resize(2);
  t.node_names = {"host"};
  t.device_names = {"host/host0", "host/host1"};
  t.node_of = {0, 0};
  t.process_of = {0, 0};
  t.p2p = {1, 1, 1, 1};
  const auto rules = selector::default_rules();
  selector::TransportAvailability none;
  selector::TopologyPlan plan(rules, none, t);
  CHECK(plan.at(0, 1).transport == "p2p");
}

TEST_CASE("selector: malformed rules name file:line:column and the key") {
  CHECK(
      error_of(
          "selector:\n  rules:\n    - match: different_nodes\n      transports: [verbs, tpc]\n") ==
      "rules.yaml:4:27: key 'selector.rules[0].transports[1]': unknown transport 'tpc' "
      "(available: p2p, shm, tcp, ofi, verbs); did you mean 'tcp'?");
  CHECK(error_of("selector:\n  rules:\n    - match: same_nod\n      transports: [shm]\n") ==
        "rules.yaml:3:14: key 'selector.rules[0].match': 'same_nod' is not a link class "
        "(same_process, same_numa, cross_numa, same_node, inter_process, different_nodes, any); "
        "did you mean 'same_node'?");
  CHECK(error_of("selector:\n  rules:\n    - match: any\n      transport: [shm]\n") ==
        "rules.yaml:4:7: key 'selector.rules[0].transport': unknown key (expected one of: name, "
        "match, transports, compress); did you mean 'transports'?");
  CHECK(error_of("selector:\n  rules:\n    - match: {within: rack9}\n      transports: [tcp]\n")
            .find("rules.yaml:3:23: key 'selector.rules[0].match.within': no group 'rack9'") == 0);
  CHECK(error_of("selector:\n  rules: {a: 1}\n")
            .find("rules.yaml:2:10: key 'selector.rules': must "
                  "be a list") == 0);
  CHECK(error_of("selector:\n  rules:\n    - match: any\n      transports: []\n")
            .find("key 'selector.rules[0].transports': must be a non-empty list") !=
        std::string::npos);
  // A loaded vendor transport is a valid name once it is available.
  selector::TransportAvailability vendor;
  vendor.set("acme", {true, "", WIA_TRANSPORT_FLAG_INTER_NODE, 1});
  CHECK(selector::load_rules(
            config_text("selector:\n  rules:\n    - {match: any, transports: [acme]}\n"), &vendor,
            kNoEnv)
            .user_rules() == 1);
}

TEST_CASE("selector: a rule's compress key rides on its choices between nodes, or is refused") {
  const std::string head = "selector:\n  rules:\n    - match: different_nodes\n"
                           "      transports: [tcp]\n";
  CHECK(error_of(head + "      compress: {method: in8}\n") ==
        "rules.yaml:5:26: key 'selector.rules[0].compress.method': 'in8' is not int8, bf16 or "
        "auto; did you mean 'int8'?");
  CHECK(error_of(head + "      compress: {method: int8, when: \"bandwidth > 10GB/s\"}\n")
            .find("key 'selector.rules[0].compress.when': 'bandwidth > 10GB/s' is not "
                  "\"bandwidth < N UNIT\"") != std::string::npos);
  CHECK(error_of(head + "      compress: {method: int8, when: \"bandwidth < 10 furlongs\"}\n")
            .find("compress.when': 'bandwidth < 10 furlongs'") != std::string::npos);
  CHECK(error_of(head + "      compress: {when: \"bandwidth < 1GB/s\"}\n")
            .find("key 'selector.rules[0].compress.method': is required") != std::string::npos);
  CHECK(error_of("selector:\n  rules:\n    - match: same_node\n      transports: [shm]\n"
                 "      compress: {method: int8}\n")
            .find("key 'selector.rules[0].compress': applies only to links between nodes") !=
        std::string::npos);

  const selector::RuleSet rules = selector::load_rules(
      config_text(head + "      compress: {method: int8, when: \"bandwidth < 8 Gbit/s\"}\n"),
      nullptr, kNoEnv);
  REQUIRE(rules.rules[0].compress);
  CHECK(rules.rules[0].compress->below_gbps == doctest::Approx(1.0));  // 8 Gbit/s
  CHECK(rules.rules[0].compress->where == "rules.yaml:5:17");
  const topo::Topology t = topo::load_yaml(topo_path("4node-ib-hdr.yaml"));
  const auto avail = cluster_node();
  selector::TopologyPlan plan(rules, avail, t);
  const auto& between = plan.at(dev(t, "dgx0/gpu0"), dev(t, "dgx1/gpu0"));
  CHECK(between.transport == "tcp");
  REQUIRE(between.compress);
  CHECK(between.describe().find("compressed int8 when bandwidth < 1 GB/s") != std::string::npos);
  // Inside a node another rule (the defaults) decides: nothing compressed.
  const auto& inside = plan.at(dev(t, "dgx0/gpu0"), dev(t, "dgx0/gpu1"));
  CHECK_FALSE(inside.compress);
  CHECK(inside.describe().find("compressed") == std::string::npos);
}

TEST_CASE("selector: at run time a bad rule set falls back to the defaults with the reason") {
  const Config config =
      config_text("selector:\n  rules:\n    - match: any\n      transports: [carrier_pigeon]\n");
  const auto rules = selector::load_rules_or_defaults(config, nullptr, kNoEnv);
  CHECK(rules.user_rules() == 0);
  CHECK(rules.fallback_reason.find("rules.yaml:4:20") == 0);
  CHECK(rules.fallback_reason.find("carrier_pigeon") != std::string::npos);
  const auto c = selector::choose(
      rules, selector::link_between({"a", "a/0", 1, 0}, {"b", "b/0", 1, 0}, false), cluster_node());
  CHECK(c.transport == "tcp");
}

TEST_CASE("selector: WIA_TRANSPORT forces a transport for inter-process links, without fallback") {
  const auto avail = cluster_node();
  const auto forced = selector::load_rules(Config(), &avail, env_with({{"WIA_TRANSPORT", "tcp"}}));
  const auto same_node = selector::link_between({"n", "n/0", 1, 0}, {"n", "n/1", 2, 0}, true);
  auto c = selector::choose(forced, same_node, avail);
  CHECK(c.transport == "tcp");
  CHECK(c.rule == "forced inter_process=tcp (env WIA_TRANSPORT)");
  // Same-process links are not inter-process: the defaults still apply.
  CHECK(selector::choose(
            forced, selector::link_between({"n", "n/0", 1, 0}, {"n", "n/1", 1, 0}, true), avail)
            .transport == "p2p");

  // Per class, and an unusable forced transport leaves the link without one.
  const auto per_class = selector::load_rules(
      Config(), &avail, env_with({{"WIA_TRANSPORT", "different_nodes=verbs"}}));
  c = selector::choose(
      per_class, selector::link_between({"a", "a/0", 1, 0}, {"b", "b/0", 1, 0}, false), avail);
  CHECK_FALSE(c.ok());
  CHECK(mentions(c, "verbs: provider not loaded: absent"));
  CHECK(mentions(c, "forced transport unusable"));
  CHECK(selector::choose(per_class, same_node, avail).transport == "shm");

  // The config key does the same; WIA_TRANSPORT wins over it.
  const Config keyed = config_text("selector:\n  transport: [same_node=tcp]\n");
  CHECK(selector::choose(selector::load_rules(keyed, &avail, kNoEnv), same_node, avail).transport ==
        "tcp");
  CHECK(selector::choose(selector::load_rules(keyed, &avail, env_with({{"WIA_TRANSPORT", "shm"}})),
                         same_node, avail)
            .transport == "shm");

  try {
    selector::load_rules(Config(), &avail, env_with({{"WIA_TRANSPORT", "tcpp"}}));
    FAIL("expected an error");
  } catch (const Error& e) {
    CHECK(std::string(e.what()).find("env WIA_TRANSPORT: 'tcpp': unknown transport 'tcpp'") == 0);
  }
}

TEST_CASE("selector: groups match nodes and devices by name or glob") {
  const Config config = config_text(R"(
selector:
  groups:
    left: {nodes: [dgx0, dgx1]}
    right: {nodes: ["dgx[23]"]}
    pair: {devices: [dgx0/gpu0, dgx0/gpu7]}
  rules:
    - match: {within: pair}
      transports: [tcp]
    - match: {between: [right, left]}
      transports: [ofi, tcp]
)");
  auto avail = cluster_node();
  avail.set("ofi", {true, "", WIA_TRANSPORT_FLAG_INTER_NODE, 1});
  const auto rules = selector::load_rules(config, &avail, kNoEnv);
  const topo::Topology t = topo::load_yaml(topo_path("4node-ib-hdr.yaml"));
  selector::TopologyPlan plan(rules, avail, t);
  CHECK(plan.at(dev(t, "dgx0/gpu0"), dev(t, "dgx0/gpu7")).transport == "tcp");
  CHECK(plan.at(dev(t, "dgx0/gpu0"), dev(t, "dgx0/gpu6")).transport == "shm");
  CHECK(plan.at(dev(t, "dgx0/gpu0"), dev(t, "dgx3/gpu6")).rule == "rules.yaml:10:7 'rule 2'");
  CHECK(plan.at(dev(t, "dgx2/gpu0"), dev(t, "dgx1/gpu6")).rule == "rules.yaml:10:7 'rule 2'");
  // Within one side: the defaults (verbs absent, so ofi).
  CHECK(plan.at(dev(t, "dgx0/gpu0"), dev(t, "dgx1/gpu6")).rule == "default (different_nodes)");
  CHECK(plan.at(dev(t, "dgx2/gpu0"), dev(t, "dgx3/gpu6")).rule == "default (different_nodes)");
}

TEST_CASE("selector: lint finds shadowed rules, dead rules and lists with nothing usable") {
  const Config config = config_text(R"(
selector:
  groups:
    ghosts: {nodes: [nowhere*]}
  rules:
    - match: different_nodes
      transports: [tcp]
    - match: {class: different_nodes, peer: false}
      transports: [verbs]
    - match: {within: ghosts}
      transports: [tcp]
    - match: same_node
      transports: [p2p, verbs]
)");
  const auto avail = cluster_node();
  const auto rules = selector::load_rules(config, &avail, kNoEnv);
  const topo::Topology t = topo::load_yaml(topo_path("4node-ib-hdr.yaml"));
  const auto findings = selector::lint(rules, avail, &t);
  auto has = [&](const std::string& where, const std::string& text) {
    for (const auto& f : findings)
      if (f.where == where && f.message.find(text) != std::string::npos) return true;
    return false;
  };
  CHECK(has("rules.yaml:8:7", "shadowed by rule 1 (rules.yaml:6:7)"));
  CHECK(has("rules.yaml:8:7",
            "nothing usable here for different_nodes links (verbs: provider not loaded"));
  CHECK(has("rules.yaml:4:5", "group 'ghosts' contains no node or device of this topology"));
  CHECK(has("rules.yaml:10:7", "matches no link of this topology"));
  CHECK(has("rules.yaml:12:7",
            "p2p is listed for same_numa links, but p2p only serves links inside one process"));
  CHECK(has("rules.yaml:12:7", "nothing usable here for same_numa links"));
  for (const auto& f : findings) CHECK_FALSE(f.error);  // every link still has a transport

  // A link left without a transport is an error.
  const auto forced =
      selector::load_rules(Config(), &avail, env_with({{"WIA_TRANSPORT", "verbs"}}));
  bool error = false;
  for (const auto& f : selector::lint(forced, avail, &t)) error = error || f.error;
  CHECK(error);

  // The defaults over this node's transports: nothing to say.
  CHECK(selector::lint(selector::default_rules(), avail, &t).empty());
}

TEST_CASE("selector: 1024 ranks are chosen per link signature, not per pair") {
  const auto t0 = std::chrono::steady_clock::now();
  const topo::Topology t = topo::load_yaml(topo_path("128node-ib-1024gpu.yaml"));
  REQUIRE(t.n == 1024);
  const auto avail = cluster_node();
  const auto rules = selector::default_rules();
  selector::TopologyPlan plan(rules, avail, t);
  std::map<std::string, std::size_t> per_transport;
  for (int i = 0; i < t.n; ++i)
    for (int j = i + 1; j < t.n; ++j) ++per_transport[plan.at(i, j).transport];
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  MESSAGE("load + select 523776 links: " << seconds << " s");
  CHECK(plan.signatures() == 3);  // same_numa, cross_numa, different_nodes
  CHECK(per_transport["shm"] == 128 * 28);
  CHECK(per_transport["tcp"] == 1024ull * 1023 / 2 - 128 * 28);
}
