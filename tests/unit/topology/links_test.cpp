// SPDX-License-Identifier: Apache-2.0
// Placement inside nodes (NUMA, processes) in topology files, declared
// versus detected topologies, and measured links for the tuner.
#include <doctest/doctest.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <string>

#include "../temp_dir.hpp"
#include "common/error.hpp"
#include "config/config.hpp"
#include "topology/diff.hpp"
#include "topology/topology.hpp"
#include "tuner/link_file.hpp"

using namespace wia;

using wia::test::TempDir;

namespace {

const std::string kTopologies = std::string(WIA_TEST_SOURCE_DIR) + "/config/topologies/";


const char* kTwoBoxes = R"(nodes:
  - name: box
    count: 2
    devices: 4
    numa: [0, 0, 1, 1]
    processes: 2
links:
  - between: intra_node
    type: pcie
  - between: inter_node
    type: ethernet_100g
)";

}  // namespace

TEST_CASE("topology files place devices on NUMA nodes and in processes") {
  TempDir dir("wia_links");
  const topo::Topology t = topo::load_yaml(dir.write("two.yaml", kTwoBoxes));
  REQUIRE(t.n == 8);
  CHECK(t.numa(0) == 0);
  CHECK(t.numa(3) == 1);
  CHECK(t.numa(6) == 1);
  // processes: 2 -> devices 0,1 in one process, 2,3 in another; global ids.
  CHECK(t.process(0) == t.process(1));
  CHECK(t.process(1) != t.process(2));
  CHECK(t.process(4) != t.process(0));
  CHECK(t.process(4) == t.process(5));

  // Export keeps them.
  const std::string out = dir.path + "/out.yaml";
  dir.files.push_back(out);
  topo::export_yaml(t, out);
  const topo::Topology back = topo::load_yaml(out);
  CHECK(back.numa_of == t.numa_of);
  CHECK(back.process_of == t.process_of);

  // Without them: NUMA unknown, one process per device.
  const topo::Topology plain = topo::load_yaml(kTopologies + "4node-ib-hdr.yaml");
  CHECK(plain.numa(5) == -1);
  CHECK(plain.process(5) == 5);

  try {
    topo::load_yaml(dir.write("bad.yaml",
                              "nodes:\n  - {name: a, devices: 2, numa: [0]}\n"
                              "links:\n  - {between: all, type: pcie}\n"));
    FAIL("expected an error");
  } catch (const Error& e) {
    CHECK(std::string(e.what()).find("bad.yaml:2:33: key 'nodes[0].numa': lists 1 values for 2 "
                                     "devices") != std::string::npos);
  }
}

TEST_CASE("topology diff reports missing and extra devices and links beyond tolerance") {
  TempDir dir("wia_links");
  const topo::Topology declared = topo::load_yaml(kTopologies + "4node-ib-hdr.yaml");
  // Same machine, one node short, and IB measured at 20 instead of 25 GB/s.
  const topo::Topology detected = topo::load_yaml(dir.write("seen.yaml", R"(nodes:
  - {name: dgx, count: 3, devices: 8, device_prefix: gpu}
links:
  - {between: intra_node, type: nvlink, bandwidth_gbps: 290, latency_us: 1.5, hops: 1, p2p: true}
  - {between: inter_node, type: infiniband_hdr, bandwidth_gbps: 20, latency_us: 1.5, hops: 3, p2p: false}
)"));
  const topo::TopologyDiff d = topo::diff(declared, detected, 0.1);
  CHECK(d.matched_by == "name");
  CHECK(d.missing.size() == 8);
  CHECK(d.missing[0] == "dgx3/gpu0");
  CHECK(d.extra.empty());
  REQUIRE(d.links.size() == 1);  // 290 vs 300 is within 10%
  CHECK(d.links[0].what == "bandwidth_gbps 25 declared, 20 detected (-20%)");
  CHECK(d.links[0].links == 24 * 16);  // 3 nodes: 24 x 16 ordered cross-node pairs
  CHECK_FALSE(d.same());
  CHECK(topo::diff(declared, declared, 0.0).same());
  // Within 25% the bandwidth counts as the same.
  CHECK(topo::diff(declared, detected, 0.25).links.empty());
}

TEST_CASE("tuner: measured links become per-link alpha and bandwidth") {
  TempDir dir("wia_links");
  const std::string file = dir.write("measured.yaml", R"(nodes:
  - {name: h, devices: 3}
links:
  - {between: all, type: shared_memory, bandwidth_gbps: 10, latency_us: 2}
  - {between: [h/dev0, h/dev2], type: shared_memory, bandwidth_gbps: 4, latency_us: 7, directed: true}
)");
  const tuner::LinkModel m = tuner::link_model_from_file(file, 3);
  CHECK(m.nranks == 3);
  CHECK(m.bandwidth(0, 1) == 10);
  CHECK(m.alpha(0, 1) == 2);
  CHECK(m.bandwidth(0, 2) == 4);
  CHECK(m.alpha(0, 2) == 7);
  CHECK(m.bandwidth(2, 0) == 10);
  CHECK(m.gbps == 4);  // the scalar is the slowest link
  CHECK_FALSE(m.is_uniform());

  // Two ranks on one device use the device's copy figure.
  const int on_device[] = {1, 1};
  const tuner::LinkModel shared = tuner::link_model_from_file(file, on_device);
  CHECK(shared.bandwidth(0, 1) == topo::find_link_defaults("shared_memory")->bandwidth_gbps);

  const int beyond[] = {0, 5};
  CHECK_THROWS_WITH_AS(tuner::link_model_from_file(file, beyond),
                       doctest::Contains("rank 1 runs on device 5, but the file has 3 device(s)"),
                       Error);

  // From the configuration key (WIA_TUNER_LINK_FILE), or nothing.
  auto env = [&](const char* name) -> const char* {
    return std::string(name) == "WIA_TUNER_LINK_FILE" ? file.c_str() : nullptr;
  };
  const Config config = Config::load("", env);
  INFO("tuner.link_file = " << config.get_string("tuner.link_file"));
  const auto from_config = tuner::link_model_from_config(config, 2);
  REQUIRE(from_config.has_value());
  CHECK(from_config->bandwidth(0, 1) == 10);
  CHECK_FALSE(tuner::link_model_from_config(Config(), 2).has_value());
}
