// SPDX-License-Identifier: Apache-2.0
// wia_discover_topology with measured links (tuner.link_file): the pairs
// the file names take its figures, the others keep the provider figures
// (taken from a discovery without the file), and a file that cannot be used
// is a warning naming it, not an error. Public API, libwia.so and the real
// host provider.
#include <doctest/doctest.h>
#include <unistd.h>
#include <wia/topology.h>
#include <wia/wia.h>

#include <climits>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <initializer_list>
#include <string>
#include <vector>

#include "../temp_dir.hpp"

using wia::test::TempDir;

namespace {


std::string read(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::string host_name() {
  char buf[HOST_NAME_MAX + 1] = {};
  REQUIRE(gethostname(buf, sizeof buf - 1) == 0);
  return buf;
}

// Bandwidth, latency and link type of every pair.
struct Figures {
  int n = 0;
  std::vector<double> gbps, us;
  std::vector<std::string> type;
  double bw(int i, int j) const { return gbps[static_cast<std::size_t>(i * n + j)]; }
  double lat(int i, int j) const { return us[static_cast<std::size_t>(i * n + j)]; }
  const std::string& link(int i, int j) const { return type[static_cast<std::size_t>(i * n + j)]; }
};

// Discovers 3 host devices with `extra` configuration (YAML), logging at
// warn to `log`; returns the figures.
Figures discover(TempDir& dir, const std::string& extra, const std::string& log) {
  const std::string config = dir.write(
      "config.yaml", "host:\n  devices: 3\nlog:\n  level: info\n  file: " + log + "\n" + extra);
  setenv("WIA_LOG_LEVEL", "info", 1);  // ctest sets warn; the variable beats the file
  wia_finalize();
  {
    const wia_status_t st = wia_init_with_config(config.c_str());
    INFO(std::string(wia_get_last_error()));
    REQUIRE(st == WIA_SUCCESS);
  }
  wia_topology_t t{};
  {
    const wia_status_t st = wia_discover_topology(&t);
    INFO(std::string(wia_get_last_error()));
    REQUIRE(st == WIA_SUCCESS);
  }
  Figures f;
  f.n = t.num_devices;
  for (int i = 0; i < t.num_devices; ++i)
    for (int j = 0; j < t.num_devices; ++j) {
      f.gbps.push_back(t.bandwidth_gbps[i][j]);
      f.us.push_back(t.latency_us[i][j]);
      f.type.push_back(t.link_type[i][j]);
    }
  wia_free_topology(&t);
  wia_finalize();
  return f;
}

// host0 -> host1 and back with distinctive figures, on node `node`; the
// type (pcie) differs from what discovery finds, and must not be taken.
std::string measured_file(const std::string& node) {
  return "nodes:\n"
         "  - {name: \"" +
         node +
         "\", devices: [host0, host1]}\n"
         "links:\n"
         "  - {between: all, type: pcie, bandwidth_gbps: 1, latency_us: 1}\n"
         "  - {between: [0, 1], type: pcie, bandwidth_gbps: 123.5, latency_us: 0.77, directed: "
         "true}\n"
         "  - {between: [1, 0], type: pcie, bandwidth_gbps: 45.25, latency_us: 3.5, directed: "
         "true}\n";
}

void check_measured_pair_only(const Figures& got, const Figures& provider) {
  REQUIRE(got.n == 3);
  REQUIRE(provider.n == 3);
  CHECK(got.bw(0, 1) == 123.5);
  CHECK(got.lat(0, 1) == 0.77);
  CHECK(got.bw(1, 0) == 45.25);
  CHECK(got.lat(1, 0) == 3.5);
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 3; ++j) {
      INFO("pair " << i << " -> " << j);
      CHECK(got.link(i, j) == provider.link(i, j));  // only figures are measured
      if ((i == 0 && j == 1) || (i == 1 && j == 0)) continue;
      CHECK(got.bw(i, j) == provider.bw(i, j));
      CHECK(got.lat(i, j) == provider.lat(i, j));
    }
}

}  // namespace

TEST_CASE(
    "discovery takes measured figures for the pair the link file names, provider figures "
    "for the others") {
  TempDir dir("wia_discover_links");
  const Figures provider = discover(dir, "", dir.file("provider.log"));
  REQUIRE(provider.n == 3);
  REQUIRE(provider.bw(0, 1) != 123.5);

  // Measured on this host: matched by full name ("<host>/host0").
  const std::string file = dir.write("measured.yaml", measured_file(host_name()));
  const std::string log = dir.file("measured.log");
  check_measured_pair_only(discover(dir, "tuner:\n  link_file: " + file + "\n", log), provider);
  const std::string text = read(log);
  INFO(text);
  CHECK(text.find("bandwidth and latency of 2 of 6 link(s) measured, from " + file) !=
        std::string::npos);
  CHECK(text.find("[warn]") == std::string::npos);

  // WIA_TUNER_LINK_FILE sets the same key.
  setenv("WIA_TUNER_LINK_FILE", file.c_str(), 1);
  check_measured_pair_only(discover(dir, "", dir.file("env.log")), provider);
  unsetenv("WIA_TUNER_LINK_FILE");
}

TEST_CASE("a link file measured on another host of the same build matches by device name") {
  TempDir dir("wia_discover_links");
  const Figures provider = discover(dir, "", dir.file("provider.log"));
  const std::string file = dir.write("other-host.yaml", measured_file("not-" + host_name()));
  check_measured_pair_only(
      discover(dir, "tuner:\n  link_file: " + file + "\n", dir.file("other.log")), provider);
}

namespace {

// Discovery with tuner.link_file = `file` must keep the provider's figures
// and log every one of `needles`.
void expect_provider_figures(TempDir& dir, const std::string& file, const std::string& log_name,
                             const Figures& provider,
                             std::initializer_list<std::string> needles) {
  const std::string log = dir.file(log_name);
  const Figures got = discover(dir, "tuner:\n  link_file: " + file + "\n", log);
  CHECK(got.gbps == provider.gbps);
  CHECK(got.us == provider.us);
  const std::string text = read(log);
  INFO(text);
  for (const std::string& n : needles) CHECK(text.find(n) != std::string::npos);
}

}  // namespace

TEST_CASE(
    "a link file that matches no device is a warning naming it; discovery keeps the "
    "provider figures") {
  TempDir dir("wia_discover_links");
  const Figures provider = discover(dir, "", dir.file("provider.log"));
  // One device per rank, as wia-bw --procs writes: no device of this process.
  const std::string file =
      dir.write("ranks.yaml",
                "nodes:\n"
                "  - {name: box, devices: [\"rank0:host0\", \"rank1:host0\"]}\n"
                "links:\n"
                "  - {between: all, type: tcp, bandwidth_gbps: 123.5, "
                "latency_us: 0.77}\n");
  expect_provider_figures(dir, file, "nomatch.log", provider,
                          {"[warn] [topology] measured links not used (tuner.link_file): " + file +
                           ": none of its 2 device(s) (box/rank0:host0, ...) pairs with this "
                           "process's devices"});
}

TEST_CASE(
    "a malformed or missing link file is a warning with file:line:column; discovery keeps "
    "the provider figures") {
  TempDir dir("wia_discover_links");
  const Figures provider = discover(dir, "", dir.file("provider.log"));
  const std::string bad = dir.write("bad.yaml",
                                    "nodes:\n"
                                    "  - {name: n, devices: 2}\n"
                                    "links:\n"
                                    "  - {between: nearby, type: pcie}\n");
  expect_provider_figures(dir, bad, "bad.log", provider,
                          {"[warn] [topology] measured links not used (tuner.link_file): " + bad +
                               ":4:15: key 'links[0].between': 'nearby' is not a link class",
                           "discovery keeps the provider figures"});
  const std::string missing = dir.path + "/no-such-file.yaml";
  expect_provider_figures(dir, missing, "missing.log", provider,
                          {missing + ": cannot open topology file"});
}
