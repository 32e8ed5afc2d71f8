// SPDX-License-Identifier: Apache-2.0
// Provider sections: kept raw until declare_provider() validates them
// against the provider's wia_param_decl_v1_t list.
#include <doctest/doctest.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "config/config.hpp"
#include "test_env.hpp"

namespace wia {
namespace {

using test::error_of;
using test::FakeEnv;
using test::no_env;

constexpr std::uint32_t kDeclSize = sizeof(wia_param_decl_v1_t);

const wia_param_decl_v1_t kHost[] = {
    {kDeclSize, WIA_PARAM_INT, "devices", "0", "Virtual devices; 0 = one per NUMA node", 0, 64},
    {kDeclSize, WIA_PARAM_SIZE, "memory_limit", "0", "Per-device memory limit; 0 = unlimited", 0,
     INT64_MAX},
    {kDeclSize, WIA_PARAM_BOOL, "peer_access", "true", "Allow direct peer access", 0, 0},
};

Config parse(std::string_view yaml, const EnvLookup& env = no_env()) {
  return Config::parse(yaml, "f.yaml", env);
}

// Message of declaring the host parameters over `yaml`.
std::string declare_error(std::string_view yaml, const EnvLookup& env = no_env()) {
  Config config = parse(yaml, env);  // must not throw: provider sections wait
  return error_of([&] { config.declare_provider("host", kHost); });
}

std::string param(const Config& config, const char* provider, const char* key) {
  const char* value = config.provider_param(provider, key);
  REQUIRE_MESSAGE(value != nullptr, (std::string(provider) + "." + key));
  return value;
}

TEST_CASE("provider config: declared defaults apply when the section is absent") {
  Config config = parse("log:\n  level: info\n");
  CHECK(config.provider_param("host", "devices") == nullptr);  // not declared yet
  config.declare_provider("host", kHost);
  CHECK(param(config, "host", "devices") == "0");
  CHECK(param(config, "host", "memory_limit") == "0");
  CHECK(param(config, "host", "peer_access") == "true");
  CHECK(config.get("host.devices").source == "default");
  CHECK(config.get("host.devices").description == "Virtual devices; 0 = one per NUMA node");
  CHECK(config.provider_param("host", "nope") == nullptr);
  CHECK(config.provider_param("cuda", "devices") == nullptr);
}

TEST_CASE("provider config: section values are validated, canonical and sourced") {
  Config config = parse(
      "host:\n"
      "  devices: 4\n"
      "  memory_limit: 4M\n"
      "  peer_access: no\n");
  config.declare_provider("host", kHost);
  CHECK(param(config, "host", "devices") == "4");
  CHECK(param(config, "host", "memory_limit") == "4194304");
  CHECK(param(config, "host", "peer_access") == "false");
  CHECK(config.get_int("host.devices") == 4);
  CHECK(config.get_int("host.memory_limit") == 4 << 20);
  CHECK_FALSE(config.get_bool("host.peer_access"));
  CHECK(config.get("host.devices").source == "f.yaml:2:3");
  CHECK(config.get("host.peer_access").source == "f.yaml:4:3");
}

TEST_CASE("provider config: every boolean spelling") {
  for (auto [text, expected] : {std::pair{"true", "true"},
                                {"false", "false"},
                                {"yes", "true"},
                                {"no", "false"},
                                {"1", "true"},
                                {"0", "false"},
                                {"TRUE", "true"},
                                {"No", "false"}}) {
    CAPTURE(text);
    Config config = parse(std::string("host:\n  peer_access: ") + text + "\n");
    config.declare_provider("host", kHost);
    CHECK(param(config, "host", "peer_access") == expected);
  }
}

TEST_CASE("provider config: unknown keys suggest a declared key") {
  CHECK(declare_error("host:\n  devcies: 2\n") ==
        "unknown key 'host.devcies' at f.yaml:2:3; did you mean 'host.devices'?");
  CHECK(declare_error("host:\n  peer-access: true\n") ==
        "unknown key 'host.peer-access' at f.yaml:2:3; did you mean 'host.peer_access'?");
  CHECK(declare_error("host:\n  threads: 2\n") ==
        "unknown key 'host.threads' at f.yaml:2:3; valid keys under 'host': devices, "
        "memory_limit, peer_access");
}

TEST_CASE("provider config: types and ranges are checked with the value's position") {
  CHECK(declare_error("host:\n  devices: many\n") ==
        "invalid value 'many' for 'host.devices' at f.yaml:2:12: expected an integer");
  CHECK(declare_error("host:\n  devices: 1.5\n") ==
        "invalid value '1.5' for 'host.devices' at f.yaml:2:12: expected an integer");
  CHECK(declare_error("host:\n  devices: 65\n") ==
        "invalid value '65' for 'host.devices' at f.yaml:2:12: out of range: must be between 0 "
        "and 64");
  CHECK(declare_error("host:\n  devices: -1\n") ==
        "invalid value '-1' for 'host.devices' at f.yaml:2:12: out of range: must be between 0 "
        "and 64");
  CHECK(declare_error("host:\n  memory_limit: 4X\n") ==
        "invalid value '4X' for 'host.memory_limit' at f.yaml:2:17: expected a size in bytes "
        "(e.g. 4096, 64K, 4M, 1G)");
  CHECK(declare_error("host:\n  peer_access: maybe\n") ==
        "invalid value 'maybe' for 'host.peer_access' at f.yaml:2:16: expected a boolean "
        "(true/false, yes/no, 1/0)");
  CHECK(declare_error("host:\n  devices: [1, 2]\n") ==
        "invalid value for 'host.devices' at f.yaml:2:12: expected an integer, found a list");
  CHECK(declare_error("host:\n  devices:\n") ==
        "missing value for 'host.devices' at f.yaml:2:3: expected an integer");
  CHECK(declare_error("host:\n  devices: 1\n  devices: 2\n") ==
        "duplicate key 'host.devices' at f.yaml:3:3; first given at f.yaml:2:3");
}

TEST_CASE("provider config: size ranges are shown with suffixes") {
  const wia_param_decl_v1_t decl[] = {
      {kDeclSize, WIA_PARAM_SIZE, "buffer", "64K", "Staging buffer", 4096, 1 << 30}};
  Config config = parse("tcp:\n  buffer: 2G\n");
  CHECK(error_of([&] { config.declare_provider("tcp", decl); }) ==
        "invalid value '2G' for 'tcp.buffer' at f.yaml:2:11: out of range: must be between 4K "
        "and 1G");
  Config ok = parse("tcp:\n  buffer: 1M\n");
  ok.declare_provider("tcp", decl);
  CHECK(ok.get_int("tcp.buffer") == 1 << 20);
}

TEST_CASE("provider config: WIA_<PROVIDER>_<KEY> overrides the section") {
  FakeEnv env{{"WIA_HOST_DEVICES", "8"}, {"WIA_HOST_MEMORY_LIMIT", "1G"}};
  Config config = parse("host:\n  devices: 2\n", env.lookup());
  config.declare_provider("host", kHost);
  CHECK(param(config, "host", "devices") == "8");
  CHECK(config.get("host.devices").source == "env WIA_HOST_DEVICES");
  CHECK(param(config, "host", "memory_limit") == "1073741824");
  CHECK(config.get("host.peer_access").source == "default");

  CHECK(declare_error("", FakeEnv{{"WIA_HOST_DEVICES", "100"}}.lookup()) ==
        "invalid value '100' for 'host.devices' in environment variable WIA_HOST_DEVICES: out "
        "of range: must be between 0 and 64");
  CHECK(declare_error("", FakeEnv{{"WIA_HOST_PEER_ACCESS", "sometimes"}}.lookup()) ==
        "invalid value 'sometimes' for 'host.peer_access' in environment variable "
        "WIA_HOST_PEER_ACCESS: expected a boolean (true/false, yes/no, 1/0)");
}

TEST_CASE("provider config: undeclared sections are reported with their position") {
  Config config = parse(
      "host:\n"
      "  devices: 2\n"
      "cuda:\n"
      "  anything: 1\n"
      "ze:\n");
  auto before = config.undeclared_sections();
  REQUIRE(before.size() == 3);
  CHECK(before[0] == std::pair<std::string, std::string>{"cuda", "f.yaml:3:1"});
  CHECK(before[1] == std::pair<std::string, std::string>{"host", "f.yaml:1:1"});
  CHECK(before[2] == std::pair<std::string, std::string>{"ze", "f.yaml:5:1"});
  config.declare_provider("host", kHost);
  auto after = config.undeclared_sections();
  REQUIRE(after.size() == 2);
  CHECK(after[0].first == "cuda");
  CHECK(after[1].first == "ze");
  CHECK(config.provider_param("cuda", "anything") == nullptr);
}

TEST_CASE("provider config: a failed declaration changes nothing") {
  Config config = parse("host:\n  devices: 99\n");
  error_of([&] { config.declare_provider("host", kHost); });
  CHECK(config.provider_param("host", "devices") == nullptr);
  CHECK(config.entries().count("host.devices") == 0);
  REQUIRE(config.undeclared_sections().size() == 1);
}

TEST_CASE("provider config: a provider without parameters accepts no keys") {
  Config empty = parse("shm:\n");
  empty.declare_provider("shm", {});
  CHECK(empty.undeclared_sections().empty());
  Config config = parse("shm: {size: 1}\n");
  CHECK(error_of([&] { config.declare_provider("shm", {}); }) ==
        "unknown key 'shm.size' at f.yaml:1:7; no keys are valid under 'shm'");
}

TEST_CASE("provider config: dotted parameter keys nest in YAML and map to one variable") {
  const wia_param_decl_v1_t decl[] = {
      {kDeclSize, WIA_PARAM_INT, "socket.threads", "2", "Threads per socket", 1, 16},
      {kDeclSize, WIA_PARAM_STRING, "iface", nullptr, "Interface", 0, 0},
  };
  Config config = parse("tcp:\n  socket:\n    threads: 4\n");
  config.declare_provider("tcp", decl);
  CHECK(param(config, "tcp", "socket.threads") == "4");
  CHECK(config.get("tcp.socket.threads").source == "f.yaml:3:5");
  CHECK(param(config, "tcp", "iface").empty());

  Config env = parse("", FakeEnv{{"WIA_TCP_SOCKET_THREADS", "8"}}.lookup());
  env.declare_provider("tcp", decl);
  CHECK(param(env, "tcp", "socket.threads") == "8");

  Config bad = parse("tcp:\n  socket:\n    treads: 4\n");
  CHECK(error_of([&] { bad.declare_provider("tcp", decl); }) ==
        "unknown key 'tcp.socket.treads' at f.yaml:3:5; did you mean 'tcp.socket.threads'?");
  Config flat = parse("tcp:\n  socket: 4\n");
  CHECK(error_of([&] { flat.declare_provider("tcp", decl); }) ==
        "'tcp.socket' at f.yaml:2:3 must be a mapping of keys, found a scalar");
}

TEST_CASE("provider config: entries() includes declared provider keys") {
  Config config = parse("host:\n  devices: 3\n");
  CHECK(config.entries().count("host.devices") == 0);
  config.declare_provider("host", kHost);
  auto entries = config.entries();
  CHECK(entries["host.devices"].text == "3");
  CHECK(entries["host.devices"].source == "f.yaml:2:3");
  CHECK(entries["host.memory_limit"].description == "Per-device memory limit; 0 = unlimited");
  CHECK(entries.count("log.level") == 1);
}

TEST_CASE("provider config: broken declarations are the provider's fault") {
  auto decl_error = [](std::vector<wia_param_decl_v1_t> decls, const char* name = "host") {
    Config config;
    return error_of([&] { config.declare_provider(name, decls); }, WIA_ERROR_INVALID_ARGUMENT);
  };
  wia_param_decl_v1_t good = kHost[0];
  wia_param_decl_v1_t d = good;

  d.struct_size = 0;
  CHECK(decl_error({d}) ==
        "provider 'host' parameter #0 'devices': struct_size 0 is smaller than "
        "wia_param_decl_v1_t (" +
            std::to_string(sizeof(wia_param_decl_v1_t)) + ")");
  d = good;
  d.key = nullptr;
  CHECK(decl_error({good, d}) ==
        "provider 'host' parameter #1: key must be non-empty lower-case a-z, 0-9, '_', '-', '.'");
  d.key = "Devices";
  CHECK(decl_error({d}).starts_with("provider 'host' parameter #0 'Devices': key must be"));
  d = good;
  const int bad_type = 42;  // as a C provider could store it; no C++ enum holds 42
  static_assert(sizeof d.type == sizeof bad_type);
  std::memcpy(&d.type, &bad_type, sizeof bad_type);
  CHECK(decl_error({d}) == "provider 'host' parameter #0 'devices': unknown type 42");
  d = good;
  d.min_value = 10;
  d.max_value = 1;
  CHECK(decl_error({d}) == "provider 'host' parameter #0 'devices': min_value 10 > max_value 1");
  d = good;
  d.default_value = "99";
  CHECK(decl_error({d}) ==
        "provider 'host' parameter 'host.devices': invalid default '99': out of range: must be "
        "between 0 and 64");
  d = good;
  d.default_value = nullptr;
  CHECK(decl_error({d}) == "provider 'host' parameter #0 'devices': no default value");
  CHECK(decl_error({good, good}) == "provider 'host' parameter #1 'devices': declared twice");
  d = good;
  d.key = "devices.count";
  CHECK(decl_error({good, d}) ==
        "provider 'host' parameter #1 'devices.count': conflicts with 'host.devices'");
  CHECK(decl_error({good}, "log") ==
        "provider name 'log' collides with the core configuration section of that name");
  CHECK(decl_error({good}, "") == "invalid provider name '' (use a-z, 0-9, '_', '-')");

  Config twice;
  twice.declare_provider("host", kHost);
  CHECK(error_of([&] { twice.declare_provider("host", kHost); }, WIA_ERROR_INVALID_ARGUMENT) ==
        "provider 'host' declared its parameters twice");
}

TEST_CASE("provider config: provider_param pointers stay valid") {
  Config config = parse("host:\n  devices: 5\n");
  config.declare_provider("host", kHost);
  const char* devices = config.provider_param("host", "devices");
  const wia_param_decl_v1_t other[] = {{kDeclSize, WIA_PARAM_INT, "streams", "1", "Streams", 1, 8}};
  for (const char* name : {"tcp", "shm", "ofi", "verbs"}) config.declare_provider(name, other);
  Config moved = std::move(config);
  CHECK(devices == moved.provider_param("host", "devices"));
  CHECK(std::string(devices) == "5");
}

}  // namespace
}  // namespace wia
