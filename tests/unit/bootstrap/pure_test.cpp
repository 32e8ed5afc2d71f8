// SPDX-License-Identifier: Apache-2.0
// The bootstrap's pure parts: SipHash, the wire format, address parsing,
// interface choice, node layout, launcher detection, options.
#include <arpa/inet.h>
#include <doctest/doctest.h>
#include <netinet/in.h>

#include <cstring>

#include "bootstrap/bootstrap.hpp"
#include "bootstrap/launcher.hpp"
#include "bootstrap/siphash.hpp"
#include "bootstrap/socket.hpp"
#include "bootstrap/wire.hpp"
#include "common/error.hpp"
#include "config/config.hpp"
#include "ranks.hpp"

namespace wb = wia::bootstrap;
using wia::bootstrap::test::contains;

namespace {

wb::Secret paper_key() {
  wb::Secret key;
  for (int i = 0; i < 16; ++i)
    key.bytes[static_cast<std::size_t>(i)] = static_cast<std::uint8_t>(i);
  return key;
}

std::vector<std::uint8_t> counting(std::size_t n) {
  std::vector<std::uint8_t> m(n);
  for (std::size_t i = 0; i < n; ++i) m[i] = static_cast<std::uint8_t>(i);
  return m;
}

// Expects detect_launcher to throw WIA_ERROR_CONFIG mentioning `part`.
void expect_config_error(const wb::EnvMap& env, std::string_view part) {
  try {
    wb::detect_launcher(env, 0, 1000);
    FAIL("expected a configuration error mentioning " << part);
  } catch (const wia::Error& e) {
    CHECK(e.status() == WIA_ERROR_CONFIG);
    CHECK_MESSAGE(contains(e.what(), part), e.what());
  }
}

}  // namespace

TEST_CASE("bootstrap: SipHash-2-4 matches the paper's test vectors") {
  // Appendix A of Aumasson & Bernstein: key 00..0f, message 00..0e.
  CHECK(wb::siphash24(paper_key(), counting(15)) == 0xa129ca6149be45e5ULL);
  // The reference implementation's vectors.h: empty message, and 8 bytes.
  CHECK(wb::siphash24(paper_key(), counting(0)) == 0x726fdb47dd0e0e31ULL);
  CHECK(wb::siphash24(paper_key(), counting(8)) == 0x93f5f5799a932462ULL);
  // Any change of key or message changes the MAC.
  wb::Secret other = paper_key();
  other.bytes[15] ^= 1;
  CHECK(wb::siphash24(other, counting(15)) != 0xa129ca6149be45e5ULL);
}

TEST_CASE("bootstrap: secrets from text, hex and constant-time compare") {
  CHECK(wb::secret_from_text("abc") == wb::secret_from_text("abc"));
  CHECK_FALSE(wb::secret_from_text("abc") == wb::secret_from_text("abd"));
  const wb::Secret s = wb::random_secret();
  wb::Secret back;
  CHECK(wb::from_hex(wb::to_hex(s.bytes), back.bytes));
  CHECK(back == s);
  CHECK_FALSE(wb::from_hex("zz", std::span<std::uint8_t>(back.bytes.data(), 1)));
  CHECK_FALSE(wb::from_hex("abc", back.bytes));
  const std::uint8_t a[] = {1, 2, 3}, b[] = {1, 2, 4};
  CHECK(wb::constant_time_equal(a, a));
  CHECK_FALSE(wb::constant_time_equal(a, b));
}

TEST_CASE("bootstrap: wire headers are validated") {
  using namespace wb::wire;
  std::uint8_t h[kHeaderBytes];
  encode_header(FrameType::kHello, 77, h);
  const Header ok = decode_header(h);
  CHECK(ok.type == FrameType::kHello);
  CHECK(ok.length == 77);
  auto rejects = [&](std::uint8_t* bytes, std::string_view part) {
    try {
      decode_header(bytes);
      FAIL("accepted a bad header");
    } catch (const ProtocolError& e) {
      CHECK_MESSAGE(contains(e.what(), part), e.what());
    }
  };
  std::uint8_t bad[kHeaderBytes];
  std::memcpy(bad, "GET / HTTP/1.1\r\n", kHeaderBytes);
  rejects(bad, "bad magic");
  std::memcpy(bad, h, kHeaderBytes);
  bad[4] = 9;
  rejects(bad, "version 9");
  std::memcpy(bad, h, kHeaderBytes);
  bad[6] = 200;
  rejects(bad, "unknown frame type");
  std::memcpy(bad, h, kHeaderBytes);
  bad[13] = 1;
  rejects(bad, "reserved");

  auto frame = Writer(FrameType::kPut).text("key").u32(7).finish();
  Reader r(std::span<const std::uint8_t>(frame).subspan(kHeaderBytes));
  CHECK(r.text(16) == "key");
  CHECK(r.u32() == 7);
  r.expect_end();
  Reader short_read(std::span<const std::uint8_t>(frame).subspan(kHeaderBytes, 5));
  CHECK_THROWS_AS(short_read.text(16), ProtocolError);
  Reader bounded(std::span<const std::uint8_t>(frame).subspan(kHeaderBytes));
  CHECK_THROWS_AS(bounded.text(2), ProtocolError);  // "key" exceeds a bound of 2
}

TEST_CASE("bootstrap: host:port parsing, IPv4, IPv6 and names") {
  std::string why;
  auto hp = wb::parse_host_port("10.1.2.3:29500", &why);
  REQUIRE(hp);
  CHECK(hp->host == "10.1.2.3");
  CHECK(hp->port == 29500);
  hp = wb::parse_host_port("[::1]:80", &why);
  REQUIRE(hp);
  CHECK(hp->host == "::1");
  CHECK(hp->port == 80);
  hp = wb::parse_host_port("node-7.cluster:1", &why);
  REQUIRE(hp);
  CHECK(hp->host == "node-7.cluster");
  CHECK_FALSE(wb::parse_host_port("host", &why));
  CHECK(contains(why, "missing ':port'"));
  CHECK_FALSE(wb::parse_host_port("::1:80", &why));
  CHECK(contains(why, "brackets"));
  CHECK_FALSE(wb::parse_host_port("host:70000", &why));
  CHECK(contains(why, "1..65535"));
  CHECK_FALSE(wb::parse_host_port("host:0", &why));
  CHECK_FALSE(wb::parse_host_port("host:12a", &why));
  CHECK_FALSE(wb::parse_host_port("[::1]80", &why));
  CHECK_FALSE(wb::parse_host_port(":80", &why));
}

TEST_CASE("bootstrap: interface names follow NCCL_SOCKET_IFNAME semantics") {
  CHECK(wb::ifname_matches("", "eth0"));
  CHECK(wb::ifname_matches("eth", "eth0"));
  CHECK(wb::ifname_matches("ib,eth", "eth1"));
  CHECK_FALSE(wb::ifname_matches("ib", "eth0"));
  CHECK_FALSE(wb::ifname_matches("^eth", "eth0"));
  CHECK(wb::ifname_matches("^docker,lo", "eth0"));
  CHECK_FALSE(wb::ifname_matches("^docker,lo", "lo"));
  CHECK(wb::ifname_matches("=eth0", "eth0"));
  CHECK_FALSE(wb::ifname_matches("=eth0", "eth01"));
  CHECK(wb::ifname_matches("^=eth0", "eth01"));
  CHECK_FALSE(wb::ifname_matches("^=eth0", "eth0"));
}

namespace {

wb::InterfaceAddress iface(const char* name, const char* address) {
  wb::InterfaceAddress out;
  out.ifname = name;
  wb::SocketAddress& a = out.address;
  if (std::strchr(address, ':') != nullptr) {
    auto& sin6 = reinterpret_cast<sockaddr_in6&>(a.storage);
    sin6.sin6_family = AF_INET6;
    inet_pton(AF_INET6, address, &sin6.sin6_addr);
    a.length = sizeof sin6;
  } else {
    auto& sin = reinterpret_cast<sockaddr_in&>(a.storage);
    sin.sin_family = AF_INET;
    inet_pton(AF_INET, address, &sin.sin_addr);
    a.length = sizeof sin;
  }
  out.loopback = a.is_loopback();
  return out;
}

}  // namespace

TEST_CASE("bootstrap: the advertised interface") {
  const std::vector<wb::InterfaceAddress> table = {
      iface("lo", "127.0.0.1"),    iface("lo", "::1"),           iface("docker0", "172.17.0.1"),
      iface("eth0", "fe80::1"),    iface("eth0", "2001:db8::5"), iface("eth0", "10.0.0.5"),
      iface("ib0", "192.168.7.5"),
  };
  auto pick = [&](std::string_view spec, int family) {
    auto chosen = wb::choose_interface(table, spec, family);
    return chosen ? chosen->ifname + " " + chosen->address.host_string() : std::string("none");
  };
  // Default: a real interface, IPv4 first; never link-local.
  CHECK(pick("", AF_UNSPEC) == "eth0 10.0.0.5");
  CHECK(pick("", AF_INET6) == "eth0 2001:db8::5");
  CHECK(pick("ib", AF_UNSPEC) == "ib0 192.168.7.5");
  CHECK(pick("^eth", AF_UNSPEC) == "lo 127.0.0.1");  // first match in table order
  CHECK(pick("=lo", AF_INET6) == "lo ::1");
  CHECK(pick("docker", AF_UNSPEC) == "docker0 172.17.0.1");
  CHECK(pick("mlx", AF_UNSPEC) == "none");
  // Only loopback and a bridge: the bridge before loopback.
  const std::vector<wb::InterfaceAddress> small = {iface("lo", "127.0.0.1"),
                                                   iface("docker0", "172.17.0.1")};
  CHECK(wb::choose_interface(small, "", AF_UNSPEC)->ifname == "docker0");
  const std::vector<wb::InterfaceAddress> only_lo = {iface("lo", "127.0.0.1")};
  CHECK(wb::choose_interface(only_lo, "", AF_UNSPEC)->ifname == "lo");
}

TEST_CASE("bootstrap: node layout from host ids") {
  const std::vector<std::string> ids = {"a", "b", "a", "c", "b"};
  const auto layout = wb::compute_node_layout(ids);
  CHECK(layout.nnodes == 3);
  CHECK(layout.node_of_rank == std::vector<int>{0, 1, 0, 2, 1});
  CHECK(layout.local_rank_of_rank == std::vector<int>{0, 0, 1, 0, 1});
  CHECK(layout.ranks_of_node[1] == std::vector<int>{1, 4});
}

TEST_CASE("bootstrap: launcher detection, one launcher at a time") {
  SUBCASE("nothing") {
    CHECK(wb::detect_launcher({{"HOME", "/root"}}, 0, 1000).launcher == wb::Launcher::kNone);
  }
  SUBCASE("libwia variables") {
    const auto info = wb::detect_launcher({{"WIA_RANK", "2"},
                                           {"WIA_WORLD_SIZE", "4"},
                                           {"WIA_LOCAL_RANK", "0"},
                                           {"WIA_ROOT_ADDR", "10.0.0.1:4000"}},
                                          0, 1000);
    CHECK(info.launcher == wb::Launcher::kWia);
    CHECK(info.rank == 2);
    CHECK(info.size == 4);
    CHECK(info.local_rank == 0);
    CHECK(info.root_address == "10.0.0.1:4000");
    CHECK(info.secret_derived);
    expect_config_error({{"WIA_RANK", "1"}}, "WIA_WORLD_SIZE is not");
    expect_config_error({{"WIA_RANK", "1"}, {"WIA_WORLD_SIZE", "2"}}, "WIA_ROOT_ADDR is not");
    expect_config_error({{"WIA_RANK", "x"}, {"WIA_WORLD_SIZE", "2"}, {"WIA_ROOT_ADDR", "h:1"}},
                        "WIA_RANK='x' is not an integer");
    expect_config_error({{"WIA_RANK", "2"}, {"WIA_WORLD_SIZE", "2"}, {"WIA_ROOT_ADDR", "h:1"}},
                        "not below WIA_WORLD_SIZE=2");
    expect_config_error({{"WIA_RANK", "0"}, {"WIA_WORLD_SIZE", "2"}, {"WIA_ROOT_ADDR", "h"}},
                        "missing ':port'");
  }
  SUBCASE("torchrun: the root sits on MASTER_PORT + 1 unless a port is configured") {
    const wb::EnvMap env = {{"RANK", "1"},
                            {"WORLD_SIZE", "8"},
                            {"LOCAL_RANK", "1"},
                            {"LOCAL_WORLD_SIZE", "4"},
                            {"MASTER_ADDR", "node0"},
                            {"MASTER_PORT", "29500"}};
    auto info = wb::detect_launcher(env, 0, 1000);
    CHECK(info.launcher == wb::Launcher::kTorchrun);
    CHECK(info.root_address == "node0:29501");
    CHECK(info.local_size == 4);
    CHECK(info.secret_derived);
    CHECK(wb::detect_launcher(env, 31000, 1000).root_address == "node0:31000");
    wb::EnvMap v6 = env;
    v6["MASTER_ADDR"] = "fd00::1";
    CHECK(wb::detect_launcher(v6, 0, 1000).root_address == "[fd00::1]:29501");
    wb::EnvMap no_master = env;
    no_master.erase("MASTER_ADDR");
    expect_config_error(no_master, "MASTER_ADDR");
  }
  SUBCASE("Open MPI on one node: file rendezvous keyed by the job id") {
    const wb::EnvMap env = {{"OMPI_COMM_WORLD_RANK", "3"},
                            {"OMPI_COMM_WORLD_SIZE", "4"},
                            {"OMPI_COMM_WORLD_LOCAL_RANK", "3"},
                            {"OMPI_COMM_WORLD_LOCAL_SIZE", "4"},
                            {"OMPI_MCA_ess_base_jobid", "1177747457"},
                            {"PMIX_NAMESPACE", "1177747457"},
                            {"TMPDIR", "/scratch"}};
    const auto info = wb::detect_launcher(env, 0, 1000);
    CHECK(info.launcher == wb::Launcher::kOpenMpi);
    CHECK(info.rank == 3);
    CHECK(info.local_rank == 3);
    CHECK(info.root_address.empty());
    CHECK(info.rendezvous_file == "/scratch/wia-bootstrap-1000-ompi-1177747457");
    CHECK_FALSE(info.secret);  // the file rendezvous makes a random one
  }
  SUBCASE("Open MPI across nodes needs WIA_ROOT_ADDR") {
    wb::EnvMap env = {{"OMPI_COMM_WORLD_RANK", "3"},
                      {"OMPI_COMM_WORLD_SIZE", "4"},
                      {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"},
                      {"OMPI_MCA_ess_base_jobid", "5"}};
    expect_config_error(env, "spans several nodes (4 ranks, 2 on this node)");
    env["WIA_ROOT_ADDR"] = "[fd00::1]:4000";
    CHECK(wb::detect_launcher(env, 0, 1000).root_address == "[fd00::1]:4000");
  }
  SUBCASE("MPICH / Hydra") {
    const auto info = wb::detect_launcher({{"PMI_RANK", "1"},
                                           {"PMI_SIZE", "2"},
                                           {"MPI_LOCALRANKID", "1"},
                                           {"MPI_LOCALNRANKS", "2"},
                                           {"PMI_KVSNAME", "kvs_42_0"}},
                                          0, 1000);
    CHECK(info.launcher == wb::Launcher::kMpich);
    CHECK(info.local_rank == 1);
    CHECK(info.rendezvous_file == "/tmp/wia-bootstrap-1000-pmi-kvs_42_0");
    expect_config_error({{"PMI_RANK", "1"}, {"PMI_SIZE", "2"}}, "no job id");
  }
  SUBCASE("Slurm") {
    wb::EnvMap env = {{"SLURM_PROCID", "5"},  {"SLURM_NTASKS", "8"},
                      {"SLURM_LOCALID", "1"}, {"SLURM_JOB_ID", "777"},
                      {"SLURM_STEP_ID", "2"}, {"SLURM_STEP_NUM_NODES", "1"}};
    const auto info = wb::detect_launcher(env, 0, 1000);
    CHECK(info.launcher == wb::Launcher::kSlurm);
    CHECK(info.rank == 5);
    CHECK(info.local_rank == 1);
    CHECK(info.rendezvous_file == "/tmp/wia-bootstrap-1000-slurm-777.2");
    env["SLURM_STEP_NUM_NODES"] = "4";
    expect_config_error(env, "WIA_ROOT_ADDR");
  }
}

TEST_CASE("bootstrap: launcher precedence and secrets") {
  const wb::EnvMap slurm = {{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "1"}, {"SLURM_JOB_ID", "9"}};
  wb::EnvMap env = slurm;
  env.insert({{"OMPI_COMM_WORLD_RANK", "2"},
              {"OMPI_COMM_WORLD_SIZE", "4"},
              {"OMPI_MCA_ess_base_jobid", "7"}});
  CHECK(wb::detect_launcher(env, 0, 0).launcher == wb::Launcher::kOpenMpi);  // mpirun in sbatch
  env.insert({{"PMI_RANK", "1"}, {"PMI_SIZE", "4"}});
  CHECK(wb::detect_launcher(env, 0, 0).launcher == wb::Launcher::kOpenMpi);
  env.insert({{"RANK", "3"}, {"WORLD_SIZE", "4"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "100"}});
  CHECK(wb::detect_launcher(env, 0, 0).launcher == wb::Launcher::kTorchrun);  // torchrun in srun
  env.insert({{"WIA_RANK", "1"}, {"WIA_WORLD_SIZE", "4"}, {"WIA_ROOT_ADDR", "h:7"}});
  const auto info = wb::detect_launcher(env, 0, 0);
  CHECK(info.launcher == wb::Launcher::kWia);
  CHECK(info.rank == 1);
  // A lone RANK (set by many unrelated tools) is not torchrun.
  wb::EnvMap lone = slurm;
  lone["RANK"] = "3";
  CHECK(wb::detect_launcher(lone, 0, 0).launcher == wb::Launcher::kSlurm);

  // Derived secrets agree across the ranks of a job and differ between jobs.
  const wb::EnvMap r0 = {{"RANK", "0"},
                         {"WORLD_SIZE", "2"},
                         {"MASTER_ADDR", "h"},
                         {"MASTER_PORT", "100"},
                         {"TORCHELASTIC_RUN_ID", "job1"}};
  wb::EnvMap r1 = r0;
  r1["RANK"] = "1";
  wb::EnvMap other_job = r1;
  other_job["TORCHELASTIC_RUN_ID"] = "job2";
  CHECK(*wb::detect_launcher(r0, 0, 0).secret == *wb::detect_launcher(r1, 0, 0).secret);
  CHECK_FALSE(*wb::detect_launcher(r1, 0, 0).secret ==
              *wb::detect_launcher(other_job, 0, 0).secret);
  wb::EnvMap keyed = r1;
  keyed["WIA_AUTH_KEY"] = "0123456789abcdef0123456789abcdef";
  const auto with_key = wb::detect_launcher(keyed, 0, 0);
  CHECK_FALSE(with_key.secret_derived);
  CHECK(*with_key.secret == wb::secret_from_text("0123456789abcdef0123456789abcdef"));
}

TEST_CASE("bootstrap: options from the configuration and the environment") {
  std::map<std::string, std::string> vars = {{"WIA_BOOTSTRAP_TIMEOUT_MS", "1234"},
                                             {"WIA_BOOTSTRAP_PORT", "4321"},
                                             {"WIA_BOOTSTRAP_IFNAME", "eth"},
                                             {"WIA_HOSTID", "fake-host"}};
  auto lookup = [&vars](const char* name) -> const char* {
    auto it = vars.find(name);
    return it == vars.end() ? nullptr : it->second.c_str();
  };
  {
    const wia::Config config = wia::Config::parse("", "test", lookup);
    const auto options = wb::Options::from_config(config, lookup);
    CHECK(options.timeout == std::chrono::milliseconds(1234));
    CHECK(options.port == 4321);
    CHECK(options.ifname == "eth");
    CHECK(options.host_id == "fake-host");
    CHECK(options.family == 0);
  }
  vars["WIA_SOCKET_IFNAME"] = "=lo";
  vars["WIA_SOCKET_FAMILY"] = "AF_INET6";
  {
    const wia::Config config = wia::Config::parse("bootstrap:\n  timeout_ms: 99\n", "test", lookup);
    const auto options = wb::Options::from_config(config, lookup);
    CHECK(options.timeout == std::chrono::milliseconds(1234));  // env beats YAML
    CHECK(options.ifname == "=lo");
    CHECK(options.family == AF_INET6);
  }
  vars["WIA_SOCKET_FAMILY"] = "AF_UNIX";
  const wia::Config config = wia::Config::parse("", "test", lookup);
  CHECK_THROWS_AS(wb::Options::from_config(config, lookup), wia::Error);
  // The default, with nothing set.
  const wia::Config plain;
  CHECK(plain.get_int("bootstrap.timeout_ms") == wb::kDefaultTimeout.count());
}

TEST_CASE("bootstrap: unique ids round-trip and corruption is detected") {
  wb::Options options;
  options.ifname = "=lo";
  options.family = AF_INET;
  options.timeout = std::chrono::milliseconds(2000);
  const wb::UniqueId id = wb::create_unique_id(options);
  CHECK(contains(wb::describe_unique_id(id), "127.0.0.1:"));
  static_assert(sizeof(wb::UniqueId) == 128);
  wb::UniqueId broken = id;
  broken.bytes[30] ^= 0x40;  // inside the secret
  try {
    wb::describe_unique_id(broken);
    FAIL("accepted a corrupt id");
  } catch (const wia::Error& e) {
    CHECK(e.status() == WIA_ERROR_INVALID_ARGUMENT);
    CHECK(contains(e.what(), "corrupt"));
  }
  wb::Options nothing = options;
  nothing.ifname = "no-such-interface";
  try {
    wb::create_unique_id(nothing);
    FAIL("created an id without an interface");
  } catch (const wia::Error& e) {
    CHECK(e.status() == WIA_ERROR_CONFIG);
    CHECK(contains(e.what(), "no-such-interface"));
    CHECK(contains(e.what(), "lo 127.0.0.1"));
  }
}
