// SPDX-License-Identifier: Apache-2.0
// Placement (spec 6.2.1): the search against brute force on small cases,
// and tightly coupled stages kept inside a node on 4node-ib-hdr.
#include "placement/placement.hpp"

#include <doctest/doctest.h>
#include <unistd.h>
#include <wia/topology.h>
#include <wia/wia.h>

#include <cstdio>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "common/error.hpp"
#include "topology/topology.hpp"

using namespace wia;

namespace {

const std::string kTopologies = std::string(WIA_TEST_SOURCE_DIR) + "/config/topologies/";

// Every assignment, capacity respected: the reference optimum.
place::Score brute_force(const place::Problem& p) {
  std::vector<int> a(static_cast<std::size_t>(p.parts), 0);
  place::Score best;
  bool have = false;
  for (;;) {
    if (place::violation(p, a).empty()) {
      const place::Score s = place::evaluate(p, a);
      if (!have || place::better(p, s, best)) {
        best = s;
        have = true;
      }
    }
    std::size_t k = 0;
    while (k < a.size() && ++a[k] == p.devices) a[k++] = 0;
    if (k == a.size()) break;
  }
  REQUIRE(have);
  return best;
}

place::Problem random_problem(std::mt19937& rng, const topo::Topology& t, int parts) {
  place::Problem p = place::Problem::from(t, place::Objective::kBandwidth);
  p.parts = parts;
  p.max_per_device = 1 + static_cast<int>(rng() % 2);
  if (p.max_per_device * p.devices < parts) p.max_per_device = (parts + p.devices - 1) / p.devices;
  p.traffic.assign(static_cast<std::size_t>(parts * parts), 0.0);
  std::uniform_real_distribution<double> bytes(0.0, 1e9);
  for (auto& v : p.traffic) v = rng() % 3 == 0 ? 0.0 : bytes(rng);
  p.memory.assign(static_cast<std::size_t>(parts), 0);
  return p;
}

bool same_score(const place::Problem& p, const place::Score& a, const place::Score& b) {
  return !place::better(p, a, b) && !place::better(p, b, a);
}

}  // namespace

TEST_CASE("placement: exhaustive search equals brute force on small cases") {
  const topo::Topology t = topo::load_yaml(kTopologies + "2socket-pcie.yaml");
  std::mt19937 rng(42);
  for (int trial = 0; trial < 20; ++trial) {
    place::Problem p = random_problem(rng, t, 3 + trial % 4);
    p.cross_node_first = trial % 2 == 0;
    const place::Score reference = brute_force(p);
    const place::Result r = place::solve(p, place::Method::kExhaustive);
    CHECK(r.optimal);
    CHECK(place::violation(p, r.device_of).empty());
    CHECK(same_score(p, r.score, reference));
    const place::Result automatic = place::solve(p);
    CHECK(automatic.optimal);
    CHECK(same_score(p, automatic.score, reference));
  }
}

TEST_CASE("placement: the heuristic alone stays close to brute force") {
  // 2 nodes of 8 over IB (the first 2 nodes of 4node-ib-hdr would need a
  // file; build them from the 4-node file's figures by hand).
  topo::Topology t = topo::load_yaml(kTopologies + "4node-ib-hdr.yaml");
  std::mt19937 rng(7);
  double worst = 1.0;
  int exact = 0;
  const int trials = 12;
  for (int trial = 0; trial < trials; ++trial) {
    // Brute force over 32 devices is too big; use the first 5 devices of
    // two nodes (an induced sub-topology) so 10^6 assignments stay cheap.
    topo::Topology sub;
    std::vector<int> pick = {0, 1, 2, 8, 9};
    sub.resize(static_cast<int>(pick.size()));
    sub.node_names = {"dgx0", "dgx1"};
    for (std::size_t a = 0; a < pick.size(); ++a) {
      sub.device_names.push_back(t.device_names[static_cast<std::size_t>(pick[a])]);
      sub.node_of.push_back(t.node(pick[a]));
      for (std::size_t b = 0; b < pick.size(); ++b) {
        const auto k = sub.at(static_cast<int>(a), static_cast<int>(b));
        const auto kt = t.at(pick[a], pick[b]);
        sub.bandwidth[k] = t.bandwidth[kt];
        sub.latency[k] = t.latency[kt];
      }
    }
    place::Problem p = random_problem(rng, sub, 6 + trial % 3);
    const place::Score reference = brute_force(p);
    const place::Result h = place::solve(p, place::Method::kHeuristic);
    CHECK(place::violation(p, h.device_of).empty());
    CHECK_FALSE(place::better(p, h.score, reference));  // never better than optimal
    if (same_score(p, h.score, reference)) ++exact;
    worst = std::max(worst, h.score.cost / reference.cost);
  }
  MESSAGE("heuristic optimal in " << exact << "/" << trials << ", worst ratio " << worst);
  CHECK(exact >= trials * 3 / 4);
  CHECK(worst < 1.25);
}

TEST_CASE("placement: tightly coupled stages stay inside a node on 4node-ib-hdr") {
  wia_topology_t topology;
  REQUIRE(wia_load_topology_yaml((kTopologies + "4node-ib-hdr.yaml").c_str(), &topology) ==
          WIA_SUCCESS);
  // 4 pipeline stages x 8 tensor-parallel shards = 32 parts, listed
  // interleaved (part p is shard p / 4 of stage p % 4) so that listing
  // order is no hint. Shards of a stage exchange 1 GB each way per step;
  // consecutive stages exchange 16 MB between matching shards.
  const int parts = 32;
  auto stage = [](int p) { return p % 4; };
  auto shard = [](int p) { return p / 4; };
  std::vector<double> traffic(parts * parts, 0.0);
  for (int a = 0; a < parts; ++a)
    for (int b = 0; b < parts; ++b) {
      if (a == b) continue;
      if (stage(a) == stage(b)) traffic[a * parts + b] = 1e9;
      if (stage(b) == stage(a) + 1 && shard(a) == shard(b)) traffic[a * parts + b] = 16e6;
    }
  std::vector<int> device_of(parts, -1);
  wia_model_t model{};
  model.num_parts = parts;
  model.traffic_bytes = traffic.data();
  model.device_of_part = device_of.data();

  wia_placement_config_t placement{};
  placement.strategy = WIA_PLACEMENT_BANDWIDTH_OPTIMAL;
  placement.topology = &topology;
  placement.minimize_cross_node_traffic = true;
  REQUIRE(wia_place_model(&model, &placement) == WIA_SUCCESS);
  MESSAGE("method: " << placement.method << ", cross-node bytes " << placement.cross_node_bytes);

  // Each stage's 8 shards on one node, one shard per GPU.
  std::vector<int> used(32, 0);
  for (int p = 0; p < parts; ++p) {
    REQUIRE(device_of[p] >= 0);
    REQUIRE(device_of[p] < 32);
    CHECK(++used[device_of[p]] == 1);
    CHECK(topology.node_of_device[device_of[p]] ==
          topology.node_of_device[device_of[stage(p)]]);  // same node as shard 0
  }
  // Only the stage-to-stage activations cross nodes: 3 boundaries x 8 shards.
  CHECK(placement.cross_node_bytes == doctest::Approx(3 * 8 * 16e6));

  // The sequential baseline on the same model crosses nodes with the
  // tensor-parallel traffic and costs far more.
  std::vector<int> seq(parts, -1);
  model.device_of_part = seq.data();
  wia_placement_config_t baseline = placement;
  baseline.strategy = WIA_PLACEMENT_SEQUENTIAL;
  REQUIRE(wia_place_model(&model, &baseline) == WIA_SUCCESS);
  CHECK(baseline.cross_node_bytes > 100 * placement.cross_node_bytes);
  CHECK(baseline.cost > 5 * placement.cost);
  wia_free_topology(&topology);
}

TEST_CASE("placement: capacity limits are respected and impossible requests are named") {
  wia_topology_t topology;
  REQUIRE(wia_load_topology_yaml((kTopologies + "2socket-pcie.yaml").c_str(), &topology) ==
          WIA_SUCCESS);
  std::vector<double> traffic(9, 1e6);
  std::vector<int> device_of(3, -1);
  wia_model_part_t parts[3] = {{"a", 3u << 30}, {"b", 3u << 30}, {"c", 1u << 30}};
  wia_model_t model{3, parts, traffic.data(), device_of.data(), nullptr, 0};
  wia_placement_config_t cfg{};
  cfg.topology = &topology;
  cfg.max_parts_per_device = 3;
  cfg.device_memory_bytes = 4ull << 30;
  REQUIRE(wia_place_model(&model, &cfg) == WIA_SUCCESS);
  CHECK(device_of[0] != device_of[1]);  // 6 GiB would not fit one 4 GiB device
  CHECK(cfg.optimal);

  cfg.device_memory_bytes = 2ull << 30;
  CHECK(wia_place_model(&model, &cfg) == WIA_ERROR_INVALID_ARGUMENT);
  CHECK(std::string(wia_get_last_error()).find("part 0 (a) needs 3221225472 bytes") !=
        std::string::npos);
  cfg.device_memory_bytes = 0;
  cfg.max_parts_per_device = 0;
  wia_model_t crowd = model;
  std::vector<double> t25(25 * 25, 0.0);
  std::vector<int> d25(25);
  crowd.num_parts = 25;
  crowd.parts = nullptr;
  crowd.traffic_bytes = t25.data();
  crowd.device_of_part = d25.data();
  cfg.max_parts_per_device = 6;
  CHECK(wia_place_model(&crowd, &cfg) == WIA_ERROR_INVALID_ARGUMENT);
  CHECK(std::string(wia_get_last_error()).find("25 parts do not fit on 4 devices") !=
        std::string::npos);
  CHECK(wia_place_model(nullptr, &cfg) == WIA_ERROR_INVALID_ARGUMENT);
  cfg.topology = nullptr;
  CHECK(wia_place_model(&model, &cfg) == WIA_ERROR_INVALID_ARGUMENT);
  wia_free_topology(&topology);
}

TEST_CASE("placement: model files give parts and traffic, errors name file:line:column") {
  char dir[] = "/tmp/wia_place_XXXXXX";
  REQUIRE(mkdtemp(dir) != nullptr);
  const std::string good = std::string(dir) + "/model.yaml";
  {
    std::ofstream f(good);
    f << "name: pipe\nparts:\n  - {name: embed, memory: 1G}\n  - {name: layer, count: 3}\n"
         "traffic:\n  - {between: [embed, layer0], bytes: 64M}\n"
         "  - {from: \"layer*\", to: embed, bytes: 1K}\n";
  }
  const place::ModelFile m = place::load_model_yaml(good);
  REQUIRE(m.names.size() == 4);
  CHECK(m.names[3] == "layer2");
  CHECK(m.memory[0] == (1ull << 30));
  CHECK(m.traffic[0 * 4 + 1] == 64.0 * 1024 * 1024);
  CHECK(m.traffic[1 * 4 + 0] == 64.0 * 1024 * 1024 + 1024);
  CHECK(m.traffic[3 * 4 + 0] == 1024);
  CHECK(m.traffic[0 * 4 + 3] == 0);

  const std::string bad = std::string(dir) + "/bad.yaml";
  {
    std::ofstream f(bad);
    f << "parts:\n  - {name: a}\ntraffic:\n  - {between: [a, zz], bytes: 1}\n";
  }
  try {
    place::load_model_yaml(bad);
    FAIL("expected an error");
  } catch (const Error& e) {
    CHECK(std::string(e.what()) ==
          bad +
              ":4:19: key 'traffic[0].between[1]': 'zz' names no part (a part name or a glob "
              "like 'layer*')");
  }
  std::remove(good.c_str());
  std::remove(bad.c_str());
  rmdir(dir);
}
