// SPDX-License-Identifier: Apache-2.0
// Topology discovery, files and analysis through the public C API
// (libwia.so and the real host provider).
#include <doctest/doctest.h>
#include <unistd.h>
#include <wia/topology.h>
#include <wia/wia.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>

namespace {

std::string temp_file(const std::string& text, const char* suffix = ".yaml") {
  char path[] = "/tmp/wia-topo-test-XXXXXX.yaml";
  int fd = mkstemps(path, static_cast<int>(std::strlen(suffix)));
  REQUIRE(fd >= 0);
  REQUIRE(write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size()));
  close(fd);
  return path;
}

struct Session {
  explicit Session(const std::string& yaml) : path(temp_file(yaml)) {
    wia_finalize();
    const wia_status_t st = wia_init_with_config(path.c_str());
    INFO(std::string(wia_get_last_error()));
    REQUIRE(st == WIA_SUCCESS);
  }
  ~Session() {
    wia_finalize();
    std::remove(path.c_str());
  }
  std::string path;
};

// Frees the topology at scope exit.
struct Topo {
  wia_topology_t t{};
  ~Topo() { wia_free_topology(&t); }
};

std::string example(const char* name) {
  return std::string(WIA_TEST_SOURCE_DIR) + "/config/topologies/" + name;
}

void check_consistent(const wia_topology_t& t) {
  REQUIRE(t.interconnect_name != nullptr);
  for (int i = 0; i < t.num_devices; ++i) {
    CHECK(t.hop_count[i][i] == 0);
    CHECK(t.latency_us[i][i] == 0.0);
    CHECK(std::string(t.link_type[i][i]) == "self");
    CHECK(t.p2p_capable[i][i]);
    for (int j = 0; j < t.num_devices; ++j) {
      if (i == j) continue;
      INFO("pair " << i << " -> " << j);
      CHECK(t.hop_count[i][j] >= 1);
      CHECK(t.bandwidth_gbps[i][j] > 0.0);
      CHECK(t.latency_us[i][j] > 0.0);
      CHECK(t.bandwidth_gbps[i][j] == t.bandwidth_gbps[j][i]);
      CHECK(t.latency_us[i][j] == t.latency_us[j][i]);
      CHECK(t.hop_count[i][j] == t.hop_count[j][i]);
      CHECK(std::string(t.link_type[i][j]) == t.link_type[j][i]);
      CHECK(t.p2p_capable[i][j] == t.p2p_capable[j][i]);
    }
  }
}

void check_equal(const wia_topology_t& a, const wia_topology_t& b) {
  REQUIRE(a.num_devices == b.num_devices);
  CHECK(std::string(a.interconnect_name) == b.interconnect_name);
  CHECK(a.num_nodes == b.num_nodes);
  for (int i = 0; i < a.num_devices; ++i) {
    CHECK(std::string(a.device_names[i]) == b.device_names[i]);
    CHECK(a.node_of_device[i] == b.node_of_device[i]);
    for (int j = 0; j < a.num_devices; ++j) {
      INFO("pair " << i << " -> " << j);
      CHECK(a.bandwidth_gbps[i][j] == b.bandwidth_gbps[i][j]);
      CHECK(a.latency_us[i][j] == b.latency_us[i][j]);
      CHECK(a.hop_count[i][j] == b.hop_count[i][j]);
      CHECK(std::string(a.link_type[i][j]) == b.link_type[i][j]);
      CHECK(a.p2p_capable[i][j] == b.p2p_capable[i][j]);
    }
  }
}

bool last_error_has(const std::string& needle) {
  return std::string(wia_get_last_error()).find(needle) != std::string::npos;
}

}  // namespace

TEST_CASE("discovery fills every pair of 3 host devices consistently") {
  Session s("host:\n  devices: 3\n");
  Topo topo;
  REQUIRE(wia_discover_topology(&topo.t) == WIA_SUCCESS);
  wia_topology_t& t = topo.t;
  REQUIRE(t.num_devices == 3);
  check_consistent(t);
  CHECK(t.num_nodes == 1);
  for (int i = 0; i < 3; ++i) {
    CHECK(t.node_of_device[i] == 0);
    CHECK(std::string(t.device_names[i]).find("/host") != std::string::npos);
    for (int j = 0; j < 3; ++j) {
      if (i == j) continue;
      const std::string type = t.link_type[i][j];
      CHECK((type == "shared_memory" || type == "cross_numa"));
      CHECK(t.p2p_capable[i][j]);
    }
  }
  const std::string ic = t.interconnect_name;
  CHECK((ic == "shared_memory" || ic == "cross_numa"));

  wia_topology_analysis_t a;
  REQUIRE(wia_analyze_topology(&t, &a) == WIA_SUCCESS);
  CHECK(std::string(a.topology_type) == "single_node");
  CHECK(a.diameter >= 1);
  CHECK(a.bisection_exact);
  if (std::string(t.link_type[0][1]) == t.link_type[0][2] &&
      std::string(t.link_type[0][1]) == t.link_type[1][2]) {
    // Halves of 1 and 2 devices: two links cross.
    CHECK(a.bisection_bandwidth == doctest::Approx(2 * t.bandwidth_gbps[0][1]));
    CHECK(std::string(a.recommended_strategy) == "data_parallel");
  }
  CHECK(std::strlen(a.reason) > 0);

  REQUIRE(wia_free_topology(&t) == WIA_SUCCESS);
  CHECK(t.num_devices == 0);
  CHECK(t.bandwidth_gbps == nullptr);
  CHECK(wia_free_topology(&t) == WIA_SUCCESS);  // twice is harmless
}

TEST_CASE("discovered topology round-trips through export and load") {
  Session s("host:\n  devices: 3\n");
  Topo found, loaded;
  REQUIRE(wia_discover_topology(&found.t) == WIA_SUCCESS);
  const std::string path = temp_file("");
  REQUIRE(wia_export_topology_yaml(&found.t, path.c_str()) == WIA_SUCCESS);
  INFO(std::string(wia_get_last_error()));
  REQUIRE(wia_load_topology_yaml(path.c_str(), &loaded.t) == WIA_SUCCESS);
  check_equal(found.t, loaded.t);
  std::remove(path.c_str());
}

TEST_CASE("example topologies round-trip through export and load") {
  for (const char* name : {"2socket-pcie.yaml", "dgx-8gpu-nvlink.yaml", "4node-ib-hdr.yaml"}) {
    INFO(std::string(name));
    Topo a, b;
    REQUIRE(wia_load_topology_yaml(example(name).c_str(), &a.t) == WIA_SUCCESS);
    const std::string path = temp_file("");
    REQUIRE(wia_export_topology_yaml(&a.t, path.c_str()) == WIA_SUCCESS);
    REQUIRE(wia_load_topology_yaml(path.c_str(), &b.t) == WIA_SUCCESS);
    check_equal(a.t, b.t);
    std::remove(path.c_str());
  }
}

TEST_CASE("asymmetric links round-trip as directed pairs") {
  const std::string src = temp_file(
      "nodes:\n  - {name: n, devices: [a, b, c]}\n"
      "links:\n  - {between: all, type: pcie}\n"
      "  - {between: [n/a, n/b], type: custom, bandwidth_gbps: 7.25, latency_us: 0.1, hops: 4,"
      " directed: true}\n");
  Topo a, b;
  INFO(std::string(wia_get_last_error()));
  REQUIRE(wia_load_topology_yaml(src.c_str(), &a.t) == WIA_SUCCESS);
  CHECK(a.t.bandwidth_gbps[0][1] == 7.25);
  CHECK(a.t.bandwidth_gbps[1][0] == 32.0);  // pcie default
  CHECK(std::string(a.t.link_type[0][1]) == "custom");
  CHECK(std::string(a.t.interconnect_name) == "pcie");
  const std::string out = temp_file("");
  REQUIRE(wia_export_topology_yaml(&a.t, out.c_str()) == WIA_SUCCESS);
  REQUIRE(wia_load_topology_yaml(out.c_str(), &b.t) == WIA_SUCCESS);
  check_equal(a.t, b.t);
  std::remove(src.c_str());
  std::remove(out.c_str());
}

TEST_CASE("analysis of the example topologies matches hand computation") {
  struct Expect {
    const char* file;
    int devices;
    const char* type;
    int diameter;
    double bisection;
    bool exact;
    const char* strategy;
  };
  // dgx: 4 x 4 pairs cross any balanced cut, 300 GB/s each.
  // 4node: two nodes a side, 16 x 16 IB pairs at 25 GB/s.
  // 2socket: split by socket, 2 x 2 cross-socket pairs at 16 GB/s.
  const Expect cases[] = {
      {"dgx-8gpu-nvlink.yaml", 8, "single_node", 1, 16 * 300.0, true, "data_parallel"},
      {"4node-ib-hdr.yaml", 32, "multi_node", 3, 256 * 25.0, false, "hybrid"},
      {"2socket-pcie.yaml", 4, "single_node", 2, 4 * 16.0, true, "data_parallel"},
  };
  for (const Expect& e : cases) {
    INFO(std::string(e.file));
    Topo t;
    REQUIRE(wia_load_topology_yaml(example(e.file).c_str(), &t.t) == WIA_SUCCESS);
    check_consistent(t.t);
    CHECK(t.t.num_devices == e.devices);
    wia_topology_analysis_t a;
    REQUIRE(wia_analyze_topology(&t.t, &a) == WIA_SUCCESS);
    CHECK(std::string(a.topology_type) == e.type);
    CHECK(a.diameter == e.diameter);
    CHECK(a.bisection_bandwidth == doctest::Approx(e.bisection));
    CHECK(a.bisection_exact == e.exact);
    CHECK(std::string(a.recommended_strategy) == e.strategy);
    const std::string summary =
        std::string(e.file) + ": " + a.recommended_strategy + ": " + a.reason;
    MESSAGE(summary);
  }
}

TEST_CASE("64-node Ethernet file expands, loads and analyses quickly") {
  const auto t0 = std::chrono::steady_clock::now();
  Topo t;
  REQUIRE(wia_load_topology_yaml(example("64node-ethernet.yaml").c_str(), &t.t) == WIA_SUCCESS);
  const auto t1 = std::chrono::steady_clock::now();
  wia_topology_analysis_t a;
  REQUIRE(wia_analyze_topology(&t.t, &a) == WIA_SUCCESS);
  const auto t2 = std::chrono::steady_clock::now();
  using ms = std::chrono::duration<double, std::milli>;
  MESSAGE("64node-ethernet: load " << ms(t1 - t0).count() << " ms, analyse " << ms(t2 - t1).count()
                                   << " ms");
  CHECK(t.t.num_devices == 512);
  CHECK(t.t.num_nodes == 64);
  CHECK(std::string(t.t.interconnect_name) == "nvlink");
  CHECK(std::string(t.t.device_names[511]) == "node63/gpu7");
  CHECK(std::string(t.t.link_type[0][7]) == "nvlink");
  CHECK(std::string(t.t.link_type[0][8]) == "ethernet_100g");
  CHECK(std::string(a.topology_type) == "multi_node");
  CHECK(a.diameter == 3);
  CHECK(!a.bisection_exact);
  CHECK(a.bisection_bandwidth == doctest::Approx(256.0 * 256.0 * 12.5));  // 32 nodes a side
  CHECK(std::string(a.recommended_strategy) == "pipeline_parallel");
}

TEST_CASE("malformed topology files are rejected with file:line:column and the key") {
  struct Bad {
    const char* text;
    const char* where;  // ":line:column"
    const char* key;
  };
  const Bad cases[] = {
      {"nodes:\n  - name: n\n    devices: 2\n    colour: red\nlinks: []\n", ":4:5",
       "nodes[0].colour"},
      {"nodes:\n  - name: n\n    devices: two\nlinks: []\n", ":3:14", "nodes[0].devices"},
      {"nodes:\n  - {name: n, devices: 2}\nlinks:\n  - {between: all, type: pcie, "
       "bandwidth_gbps: fast}\n",
       ":4:48", "links[0].bandwidth_gbps"},
      {"nodes:\n  - {name: n, devices: 2}\nlinks:\n  - {between: nearby, type: pcie}\n", ":4:15",
       "links[0].between"},
      {"nodes:\n  - {name: n, devices: 2}\nlinks:\n  - {between: [n/dev0, n/dev9], type: pcie}\n",
       ":4:24", "links[0].between[1]"},
      {"nodes:\n  - {name: n, count: 2, devices: 2}\nlinks:\n  - {between: intra_node, type: "
       "pcie}\n",
       ":4:3", "links"},
      {"nodes:\n  - {name: n, devices: 2}\nlinks:\n  - {between: all, type: warp_drive}\n", ":4:26",
       "links[0].bandwidth_gbps"},
      {"nodes:\n  - {name: n, devices: 2\nlinks: []\n", ":", "YAML syntax error"},
  };
  for (const Bad& b : cases) {
    const std::string path = temp_file(b.text);
    INFO(std::string(b.text));
    Topo t;
    CHECK(wia_load_topology_yaml(path.c_str(), &t.t) == WIA_ERROR_CONFIG);
    INFO(std::string(wia_get_last_error()));
    CHECK(last_error_has(path + b.where));
    CHECK(last_error_has(b.key));
    CHECK(t.t.num_devices == 0);
    std::remove(path.c_str());
  }
  Topo t;
  CHECK(wia_load_topology_yaml("/nonexistent/topo.yaml", &t.t) == WIA_ERROR_CONFIG);
  CHECK(last_error_has("/nonexistent/topo.yaml"));
}

TEST_CASE("topology calls validate their arguments") {
  wia_topology_analysis_t a;
  Topo t;
  CHECK(wia_discover_topology(nullptr) == WIA_ERROR_INVALID_ARGUMENT);
  CHECK(wia_free_topology(nullptr) == WIA_ERROR_INVALID_ARGUMENT);
  CHECK(wia_analyze_topology(nullptr, &a) == WIA_ERROR_INVALID_ARGUMENT);
  CHECK(wia_analyze_topology(&t.t, nullptr) == WIA_ERROR_INVALID_ARGUMENT);
  CHECK(wia_load_topology_yaml(nullptr, &t.t) == WIA_ERROR_INVALID_ARGUMENT);
  CHECK(wia_export_topology_yaml(&t.t, nullptr) == WIA_ERROR_INVALID_ARGUMENT);
  // A caller-built topology with a NULL matrix is refused, not dereferenced.
  wia_topology_t bad{};
  bad.num_devices = 2;
  CHECK(wia_analyze_topology(&bad, &a) == WIA_ERROR_INVALID_ARGUMENT);
  CHECK(last_error_has("NULL matrix"));
}
