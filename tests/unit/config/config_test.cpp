// SPDX-License-Identifier: Apache-2.0
// Core keys: defaults, YAML values and their sources, every validation
// message, environment precedence, file discovery, and the shipped files.
#include "config/config.hpp"

#include <doctest/doctest.h>
#include <dlfcn.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <vector>

#include "common/log.hpp"
#include "config/schema.hpp"
#include "test_env.hpp"

namespace wia {
namespace {

using test::error_of;
using test::FakeEnv;
using test::no_env;
using test::parse_error;

constexpr const char* kLevels = "expected one of error, warn, info, debug, trace, off";

// A file in a private temporary directory, removed with the directory.
class TempDir {
 public:
  TempDir() {
    std::string templ = (std::filesystem::temp_directory_path() / "wia-config-XXXXXX").string();
    REQUIRE(::mkdtemp(templ.data()) != nullptr);
    path_ = templ;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  std::string write(const std::string& name, std::string_view text) const {
    std::string file = (path_ / name).string();
    std::ofstream(file) << text;
    return file;
  }

 private:
  std::filesystem::path path_;
};

TEST_CASE("config: without a file every core key has its compiled default") {
  std::vector<Config> configs;
  configs.emplace_back();
  configs.push_back(Config::parse("", "f.yaml", no_env()));
  configs.push_back(Config::parse("# only a comment\n", "f.yaml", no_env()));
  configs.push_back(Config::load("", no_env()));
  for (const Config& config : configs) {
    CHECK(config.get_string("log.level") == "warn");
    CHECK(config.get("log.level").source == "default");
    CHECK(config.get("log.level").description == "Lowest severity written to the log");
    CHECK(config.get_string("log.file").empty());
    CHECK(config.get_list("providers.search_path").empty());
    CHECK(config.get_list("providers.enable").empty());
    CHECK(config.get_list("providers.disable").empty());
    CHECK(config.undeclared_sections().empty());
  }
  CHECK(Config().file().empty());
}

TEST_CASE("config: YAML values override defaults and record file:line:column") {
  Config config = Config::parse(
      "log:\n"
      "  level: debug\n"
      "  file: /tmp/wia.log\n"
      "providers:\n"
      "  enable: [host, tcp]\n"
      "  search_path: /opt/a:/opt/b\n"
      "  disable:\n"
      "    - cuda\n"
      "    - ze\n",
      "f.yaml", no_env());
  CHECK(config.file() == "f.yaml");
  CHECK(config.get_string("log.level") == "debug");
  CHECK(config.get("log.level").source == "f.yaml:2:3");
  CHECK(config.get_string("log.file") == "/tmp/wia.log");
  CHECK(config.get("log.file").source == "f.yaml:3:3");
  CHECK(config.get_list("providers.enable") == std::vector<std::string>{"host", "tcp"});
  CHECK(config.get("providers.enable").text == "host,tcp");
  CHECK(config.get("providers.enable").source == "f.yaml:5:3");
  CHECK(config.get_list("providers.search_path") == std::vector<std::string>{"/opt/a", "/opt/b"});
  CHECK(config.get_list("providers.disable") == std::vector<std::string>{"cuda", "ze"});
}

TEST_CASE("config: scalar forms that are accepted") {
  SUBCASE("enum names in any case are stored in their canonical spelling") {
    Config config = Config::parse("log:\n  level: DeBuG\n", "f.yaml", no_env());
    CHECK(config.get_string("log.level") == "debug");
  }
  SUBCASE("an empty string value is the empty string") {
    Config config = Config::parse("log:\n  file:\n", "f.yaml", no_env());
    CHECK(config.get_string("log.file").empty());
    CHECK(config.get("log.file").source == "f.yaml:2:3");
  }
  SUBCASE("an empty list is an empty list, in every spelling") {
    for (const char* yaml :
         {"providers:\n  enable: []\n", "providers:\n  enable:\n", "providers:\n  enable: ''\n"}) {
      Config config = Config::parse(yaml, "f.yaml", no_env());
      CHECK(config.get_list("providers.enable").empty());
      CHECK(config.get("providers.enable").source == "f.yaml:2:3");
    }
  }
  SUBCASE("an empty section changes nothing") {
    Config config = Config::parse("log:\nproviders: {}\n", "f.yaml", no_env());
    CHECK(config.get("log.level").source == "default");
  }
}

TEST_CASE("config: syntax errors name file:line:column") {
  CHECK(parse_error("log:\n  level: [debug\nproviders: {}\n") ==
        "YAML syntax error at f.yaml:3:10: end of sequence flow not found");
  CHECK(parse_error("log:\n  level: a: b\n") ==
        "YAML syntax error at f.yaml:2:11: illegal map value");
}

TEST_CASE("config: unknown keys suggest the closest valid key") {
  CHECK(parse_error("# comment\nlog:\n  levle: debug\n") ==
        "unknown key 'log.levle' at f.yaml:3:3; did you mean 'log.level'?");
  CHECK(parse_error("providers:\n  enabled: [host]\n") ==
        "unknown key 'providers.enabled' at f.yaml:2:3; did you mean 'providers.enable'?");
  CHECK(parse_error("providers:\n  searchpath: [/x]\n") ==
        "unknown key 'providers.searchpath' at f.yaml:2:3; did you mean 'providers.search_path'?");
}

TEST_CASE("config: an unknown key far from every valid key lists the valid ones") {
  CHECK(parse_error("log:\n  colour: red\n") ==
        "unknown key 'log.colour' at f.yaml:2:3; valid keys under 'log': file, level");
  CHECK(parse_error("log:\n  level:\n    verbose: 1\n") ==
        "invalid value for 'log.level' at f.yaml:3:5: " + std::string(kLevels) +
            ", found a mapping");
}

TEST_CASE("config: a known key name in the wrong section points to the right one") {
  CHECK(parse_error("log:\n  enable: [host]\n") ==
        "unknown key 'log.enable' at f.yaml:2:3; did you mean 'providers.enable'?");
}

TEST_CASE("config: dotted keys are refused in favour of nesting") {
  CHECK(parse_error("log.level: debug\n") ==
        "dotted key 'log.level' at f.yaml:1:1: write it nested, one mapping level per '.'");
  CHECK(parse_error("providers:\n  enable.x: 1\n") ==
        "dotted key 'enable.x' at f.yaml:2:3: write it nested, one mapping level per '.'");
}

TEST_CASE("config: a section one edit away from a core section is a typo, not a provider") {
  CHECK(parse_error("provider:\n  enable: [host]\n") ==
        "unknown section 'provider' at f.yaml:1:1; did you mean 'providers'?");
  CHECK(parse_error("lgo:\n  level: info\n") ==
        "unknown section 'lgo' at f.yaml:1:1; did you mean 'log'?");
}

TEST_CASE("config: bad enum values list the allowed ones") {
  CHECK(parse_error("log:\n  level: verbose\n") ==
        "invalid value 'verbose' for 'log.level' at f.yaml:2:10: " + std::string(kLevels));
  CHECK(parse_error("log:\n  level: [info]\n") ==
        "invalid value for 'log.level' at f.yaml:2:10: " + std::string(kLevels) + ", found a list");
  CHECK(parse_error("log:\n  level:\n") ==
        "missing value for 'log.level' at f.yaml:2:3: " + std::string(kLevels));
}

TEST_CASE("config: wrong types for strings and lists") {
  CHECK(parse_error("log:\n  file: {a: 1}\n") ==
        "invalid value for 'log.file' at f.yaml:2:9: expected a string, found a mapping");
  CHECK(parse_error("providers:\n  enable: {host: 1}\n") ==
        "invalid value for 'providers.enable' at f.yaml:2:11: expected a list of strings, found "
        "a mapping");
  CHECK(parse_error("providers:\n  enable:\n    - host\n    - [tcp]\n") ==
        "invalid item in 'providers.enable' at f.yaml:4:7: expected a string, found a list");
}

TEST_CASE("config: sections and the top level must be mappings") {
  CHECK(parse_error("log: debug\n") ==
        "'log' at f.yaml:1:1 must be a mapping of keys, found a scalar");
  CHECK(parse_error("providers:\n  - host\n") ==
        "'providers' at f.yaml:1:1 must be a mapping of keys, found a list");
  CHECK(parse_error("log: {}\ncuda: 5\n") ==
        "section 'cuda' at f.yaml:2:1 must be a mapping of keys, found a scalar");
  CHECK(parse_error("- log\n- host\n") ==
        "the top level of f.yaml must be a mapping of sections, found a list at f.yaml:1:1");
  CHECK(parse_error("log: {}\n---\nlog: {}\n") ==
        "f.yaml holds more than one YAML document, expected one (the second starts at f.yaml:3:1)");
  CHECK(parse_error("? [a, b]\n: 1\n") ==
        "a section name at f.yaml:1:3 must be a plain name, found a list");
  CHECK(parse_error("log:\n  ? [a]\n  : 1\n") ==
        "a key under 'log' at f.yaml:2:5 must be a plain name, found a list");
}

TEST_CASE("config: duplicate keys and sections are errors naming both places") {
  CHECK(parse_error("log:\n  level: info\n  level: debug\n") ==
        "duplicate key 'log.level' at f.yaml:3:3; first given at f.yaml:2:3");
  CHECK(parse_error("log: {level: info, level: debug}\n") ==
        "duplicate key 'log.level' at f.yaml:1:20; first given at f.yaml:1:7");
  CHECK(parse_error("log: {}\nhost: {}\nlog: {}\n") ==
        "duplicate section 'log' at f.yaml:3:1; first given at f.yaml:1:1");
  CHECK(parse_error("host: {}\nhost: {}\n") ==
        "duplicate section 'host' at f.yaml:2:1; first given at f.yaml:1:1");
}

TEST_CASE("config: environment overrides YAML, which overrides defaults") {
  FakeEnv env{
      {"WIA_LOG_LEVEL", "error"}, {"WIA_PROVIDERS_ENABLE", "host,tcp:shm"}, {"WIA_LOG_FILE", ""}};
  Config config =
      Config::parse("log:\n  level: debug\n  file: /tmp/x.log\n", "f.yaml", env.lookup());
  CHECK(config.get_string("log.level") == "error");
  CHECK(config.get("log.level").source == "env WIA_LOG_LEVEL");
  // Set but empty is a value: the empty file name, i.e. standard error.
  CHECK(config.get_string("log.file").empty());
  CHECK(config.get("log.file").source == "env WIA_LOG_FILE");
  CHECK(config.get_list("providers.enable") == std::vector<std::string>{"host", "tcp", "shm"});
  CHECK(config.get("providers.enable").source == "env WIA_PROVIDERS_ENABLE");
  CHECK(config.get("providers.disable").source == "default");

  Config defaults_only = Config::load("", env.lookup());
  CHECK(defaults_only.get_string("log.level") == "error");
}

TEST_CASE("config: an invalid environment value is an error naming the variable") {
  CHECK(parse_error("", FakeEnv{{"WIA_LOG_LEVEL", "loud"}}.lookup()) ==
        "invalid value 'loud' for 'log.level' in environment variable WIA_LOG_LEVEL: " +
            std::string(kLevels));
  // The environment is checked even when the file would have been fine.
  CHECK(parse_error("log:\n  level: info\n", FakeEnv{{"WIA_LOG_LEVEL", ""}}.lookup()) ==
        "invalid value '' for 'log.level' in environment variable WIA_LOG_LEVEL: " +
            std::string(kLevels));
}

TEST_CASE("config: load reads a file and names it in sources and errors") {
  TempDir dir;
  std::string good = dir.write("good.yaml", "log:\n  level: info\n");
  Config config = Config::load(good, no_env());
  CHECK(config.file() == good);
  CHECK(config.get("log.level").source == good + ":2:3");

  std::string bad = dir.write("bad.yaml", "log:\n  level: nope\n");
  CHECK(error_of([&] { Config::load(bad, no_env()); }) ==
        "invalid value 'nope' for 'log.level' at " + bad + ":2:10: " + kLevels);

  std::string missing = dir.write("x", "") + ".missing";
  CHECK(error_of([&] { Config::load(missing, no_env()); }) ==
        "cannot read configuration file " + missing + ": No such file or directory");
}

TEST_CASE("config: WIA_CONFIG names the file, otherwise the embedded defaults apply") {
  TempDir dir;
  std::string file = dir.write("wia.yaml", "log:\n  level: trace\n");
  Config named = Config::load_from_env(FakeEnv{{"WIA_CONFIG", file}}.lookup());
  CHECK(named.file() == file);
  CHECK(named.get_string("log.level") == "trace");

  Config unset = Config::load_from_env(no_env());
  CHECK(unset.file().empty());
  CHECK(unset.get("log.level").source == "default");
  CHECK(Config::load_from_env(FakeEnv{{"WIA_CONFIG", ""}}.lookup()).file().empty());

  std::string missing = file + ".missing";
  CHECK(error_of([&] {
          Config::load_from_env(FakeEnv{{"WIA_CONFIG", missing}}.lookup());
        }) == "cannot read configuration file " + missing +
                  ": No such file or directory (named by WIA_CONFIG)");
}

TEST_CASE("config: getters refuse unknown keys and mismatched types as internal errors") {
  Config config;
  CHECK(error_of([&] { config.get("log.nope"); }, WIA_ERROR_INTERNAL) ==
        "no configuration key 'log.nope'");
  CHECK(error_of([&] { config.get_int("log.level"); }, WIA_ERROR_INTERNAL) ==
        "configuration key 'log.level' is of type enum, not int");
  CHECK(error_of([&] { config.get_bool("providers.enable"); }, WIA_ERROR_INTERNAL) ==
        "configuration key 'providers.enable' is of type list, not bool");
  CHECK(error_of([&] { config.get_list("log.file"); }, WIA_ERROR_INTERNAL) ==
        "configuration key 'log.file' is of type string, not list");
  CHECK(config.get_string("providers.enable").empty());  // text form of any key
}

TEST_CASE("config: entries() lists every core key with value, source and description") {
  Config config = Config::parse("log:\n  level: info\n", "f.yaml",
                                FakeEnv{{"WIA_PROVIDERS_DISABLE", "ze"}}.lookup());
  auto entries = config.entries();
  REQUIRE(entries.size() == cfg::core_schema().size());
  for (const auto& row : cfg::core_schema()) {
    auto it = entries.find(std::string(row.key));
    REQUIRE_MESSAGE(it != entries.end(), std::string(row.key));
    CHECK(it->second.description == row.description);
  }
  CHECK(entries["log.level"].text == "info");
  CHECK(entries["log.level"].source == "f.yaml:2:3");
  CHECK(entries["providers.disable"].text == "ze");
  CHECK(entries["providers.disable"].source == "env WIA_PROVIDERS_DISABLE");
  CHECK(entries["log.file"].source == "default");
}

TEST_CASE("config: moved-from and moved-to configurations keep their values") {
  Config a = Config::parse("log:\n  level: info\n", "f.yaml", no_env());
  Config b = std::move(a);
  CHECK(b.get_string("log.level") == "info");
  Config c;
  c = std::move(b);
  CHECK(c.get("log.level").source == "f.yaml:2:3");
}

TEST_CASE("config: every log.level value is a level the logger understands") {
  for (const auto& row : cfg::core_schema()) {
    if (row.key != "log.level") continue;
    for (const auto& name : cfg::Spec::from(row).allowed) {
      log::Level level;
      REQUIRE_MESSAGE(log::parse_level(name, &level), name);
      CHECK(log::level_name(level) == name);
    }
  }
}

// The host provider's declaration as specified for it; default.yaml states
// these too. (The provider's own table lives in providers/host.)
const wia_param_decl_v1_t kHostParams[] = {
    {sizeof(wia_param_decl_v1_t), WIA_PARAM_INT, "devices", "0",
     "Virtual devices; 0 = one per NUMA node", 0, 64},
    {sizeof(wia_param_decl_v1_t), WIA_PARAM_SIZE, "memory_limit", "0",
     "Memory each device may allocate; 0 = unlimited", 0, INT64_MAX},
    {sizeof(wia_param_decl_v1_t), WIA_PARAM_BOOL, "peer_access", "true",
     "Devices may access each other's memory directly", 0, 0},
};

TEST_CASE("config: config/default.yaml states every core key with its compiled default") {
  const std::string path = std::string(WIA_TEST_SOURCE_DIR) + "/config/default.yaml";
  Config shipped = Config::load(path, no_env());
  Config compiled;
  for (const auto& row : cfg::core_schema()) {
    std::string key(row.key);
    CAPTURE(key);
    CHECK(shipped.get(key).source.starts_with(path + ":"));  // stated, not defaulted
    CHECK(shipped.get(key).text == compiled.get(key).text);
  }
  auto undeclared = shipped.undeclared_sections();
  REQUIRE(undeclared.size() == 1);
  CHECK(undeclared[0].first == "host");

  shipped.declare_provider("host", kHostParams);
  compiled.declare_provider("host", kHostParams);
  for (const auto& decl : kHostParams) {
    std::string key = std::string("host.") + decl.key;
    CAPTURE(key);
    CHECK(shipped.get(key).source.starts_with(path + ":"));
    CHECK(shipped.get(key).text == compiled.get(key).text);
  }
  CHECK(shipped.undeclared_sections().empty());
}

// The parameter table a built provider declares, read from its shared
// object the way the loader reads it, so an example file is checked against
// the provider itself rather than a copy. Empty when that provider is not
// built here (an optional dependency is missing).
std::vector<wia_param_decl_v1_t> built_provider_params(const std::string& name) {
  const std::string path = std::string(WIA_TEST_PROVIDER_DIR) + "/libwia-provider-" + name + ".so";
  if (!std::filesystem::exists(path)) return {};
  void* handle = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  REQUIRE_MESSAGE(handle != nullptr, path << ": " << ::dlerror());
  const auto* desc = static_cast<const wia_provider_v1_t*>(::dlsym(handle, "wia_provider_v1"));
  REQUIRE_MESSAGE(desc != nullptr, path << " exports no wia_provider_v1");
  std::vector<wia_param_decl_v1_t> params(desc->params, desc->params + desc->num_params);
  // Kept loaded: the declarations point at the object's strings.
  return params;
}

TEST_CASE("config: the example files are valid") {
  const std::filesystem::path source(WIA_TEST_SOURCE_DIR);
  int count = 0;
  for (const auto& file : std::filesystem::directory_iterator(source / "config/examples")) {
    if (file.path().extension() != ".yaml") continue;
    CAPTURE(file.path().string());
    Config config = Config::load(file.path().string(), no_env());
    for (const auto& [name, where] : config.undeclared_sections()) {
      CAPTURE(name);
      // A section must name a provider of this project ...
      REQUIRE(std::filesystem::exists(source / "providers" / name / "CMakeLists.txt"));
      // ... and, where that provider is built, use only the keys it declares.
      const auto params = built_provider_params(name);
      if (params.empty()) {
        MESSAGE("provider " << name << " is not built here; its keys are not checked");
        continue;
      }
      config.declare_provider(name, params);
    }
    ++count;
  }
  CHECK(count >= 2);
}

}  // namespace
}  // namespace wia
