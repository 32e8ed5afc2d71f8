// SPDX-License-Identifier: Apache-2.0
// The provider loader against real shared objects: the deliberately broken
// providers of tests/providers (WIA_TEST_BROKEN_PROVIDER_DIR), two valid
// test providers with parameters, and the real host provider in the
// directory next to the core (WIA_TEST_PROVIDER_DIR).
#include <doctest/doctest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "common/error.hpp"
#include "common/log.hpp"
#include "config/config.hpp"
#include "provider/registry.hpp"

namespace fs = std::filesystem;
using wia::Config;
using wia::ProviderRecord;
using wia::ProviderRegistry;
using wia::ProviderState;

namespace {

const std::string kBrokenDir = WIA_TEST_BROKEN_PROVIDER_DIR;
const std::string kProviderDir = WIA_TEST_PROVIDER_DIR;

std::string provider_file(const std::string& dir, const std::string& name) {
  return (fs::path(dir) / ("libwia-provider-" + name + ".so")).string();
}

using Env = std::map<std::string, std::string>;

wia::EnvLookup env_of(const Env& env) {
  auto vars = std::make_shared<const Env>(env);
  return [vars](const char* name) -> const char* {
    auto it = vars->find(name);
    return it == vars->end() ? nullptr : it->second.c_str();
  };
}

// A configuration and the registry loaded from it, built in place: the
// registry's providers keep a pointer to the Config, so it never moves,
// and it is destroyed after the registry.
class Loaded {
 public:
  Loaded(std::string_view yaml, const Env& env)
      : env_(env_of(env)),
        config_(Config::parse(yaml, "test.yaml", env_)),
        registry_(ProviderRegistry::load(config_, env_)) {}

  const ProviderRegistry& registry() const { return *registry_; }
  void unload() { registry_.reset(); }

  // The record of `name`; fails the test when there is not exactly one.
  const ProviderRecord& record(const std::string& name) const {
    const ProviderRecord* found = nullptr;
    int count = 0;
    for (const auto& r : registry_->records()) {
      if (r.name != name) continue;
      found = &r;
      ++count;
    }
    INFO("provider ", name);
    REQUIRE(count == 1);
    return *found;
  }
  int count(const std::string& name) const {
    const auto& records = registry_->records();
    return static_cast<int>(std::count_if(records.begin(), records.end(),
                                          [&](const ProviderRecord& r) { return r.name == name; }));
  }
  std::vector<std::string> loaded_names() const {
    std::vector<std::string> names;
    for (const auto& p : registry_->loaded()) names.push_back(p->name());
    return names;
  }

 private:
  wia::EnvLookup env_;
  Config config_;
  std::unique_ptr<ProviderRegistry> registry_;
};

void check_record(const ProviderRecord& record, ProviderState state, std::string_view reason) {
  INFO("provider ", record.name, " at ", record.path, ": ",
       std::string(wia::provider_state_name(record.state)), ": ", record.reason);
  CHECK(record.state == state);
  CHECK(record.reason.find(reason) != std::string::npos);
}

// A scratch directory removed at the end of the test.
class TempDir {
 public:
  TempDir() {
    std::string pattern = (fs::temp_directory_path() / "wia-loader-test-XXXXXX").string();
    REQUIRE(mkdtemp(pattern.data()) != nullptr);
    path_ = pattern;
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const fs::path& path() const { return path_; }
  std::string copy(const std::string& from, const std::string& as) const {
    fs::path to = path_ / as;
    fs::copy_file(from, to);
    return to.string();
  }

 private:
  fs::path path_;
};

// Sends the log to a file for the test's duration and reads it back.
class LogCapture {
 public:
  explicit LogCapture(wia::log::Level level) {
    wia::log::configure(level, (dir_.path() / "test.log").string());
  }
  ~LogCapture() { wia::log::configure(wia::log::Level::warn, ""); }
  std::string text() const {
    std::ifstream in(dir_.path() / "test.log");
    std::stringstream buffer;
    buffer << in.rdbuf();
    return buffer.str();
  }

 private:
  TempDir dir_;
};

bool contains(const std::string& text, std::string_view part) {
  return text.find(part) != std::string::npos;
}

}  // namespace

TEST_CASE("each broken provider is recorded with the reason naming its defect") {
  Loaded l("", {{"WIA_PROVIDER_PATH", kBrokenDir}});

  check_record(l.record("broken_nosym"), ProviderState::refused,
               "no wia_provider_v1 symbol (not a libwia provider?)");
  check_record(l.record("broken_abi"), ProviderState::refused,
               "built for provider ABI v99, this libwia supports up to v1");
  CHECK(l.record("broken_abi").abi_version == 99);
  check_record(l.record("broken_hostsvc"), ProviderState::refused,
               "needs host services v99, this libwia offers v1");
  check_record(l.record("broken_size"), ProviderState::refused,
               "descriptor struct_size is 24 bytes, smaller than the " +
                   std::to_string(sizeof(wia_provider_v1_t)) + " bytes of a v1 descriptor");
  check_record(l.record("broken_name"), ProviderState::refused,
               "descriptor name 'Broken-Name' is not a valid provider name");
  check_record(l.record("broken_mismatch"), ProviderState::refused,
               "descriptor name 'renamed' does not match the file name (expected "
               "'broken_mismatch')");
  check_record(l.record("broken_caps"), ProviderState::refused,
               "caps has WIA_PROVIDER_CAP_DEVICE but the device table is NULL");
  check_record(l.record("broken_tablever"), ProviderState::refused,
               "device table: abi_version is 7, expected 1");
  check_record(l.record("broken_required"), ProviderState::refused,
               "device table: required entry 'stream_create' is NULL");
  check_record(l.record("broken_optional"), ProviderState::refused,
               "device table: optional entry 'event_elapsed_ms' is NULL but "
               "WIA_DEVICE_CAP_EVENT_TIMING is set in caps");
  check_record(l.record("broken_mustknow"), ProviderState::refused,
               "device table: must_understand has bit(s) 0x8000000000000000 this libwia does not "
               "know");
  check_record(l.record("broken_initfail"), ProviderState::refused,
               "init failed: WIA_ERROR_INTERNAL: simulated failure: firmware handshake timed out");
  check_record(l.record("broken_dep"), ProviderState::refused,
               "libwia_test_missing_dep.so: cannot open shared object file");
  check_record(l.record("broken_undef"), ProviderState::refused,
               "undefined symbol: wia_test_undefined_function");
  check_record(l.record("garbage"), ProviderState::refused, "invalid ELF header");

  // Absent hardware is not a defect.
  check_record(l.record("absent_hw"), ProviderState::absent, "no such hardware");
  CHECK(l.record("absent_hw").reason == "no such hardware");

  // What could be read from a refused descriptor is still shown.
  const ProviderRecord& required = l.record("broken_required");
  CHECK(required.version == "0.0-test");
  CHECK(required.abi_version == 1);
  CHECK(required.caps == WIA_PROVIDER_CAP_DEVICE);
  CHECK(required.path == provider_file(kBrokenDir, "broken_required"));

  // The valid ones load alongside, and so does the real host provider
  // from the directory next to the core.
  check_record(l.record("test_params"), ProviderState::loaded, "");
  CHECK(l.record("test_params").reason.empty());
  check_record(l.record("test_order"), ProviderState::loaded, "");
  check_record(l.record("host"), ProviderState::loaded, "");
  CHECK(fs::equivalent(l.record("host").path, provider_file(kProviderDir, "host")));
  REQUIRE(l.registry().find("host") != nullptr);
  CHECK(l.registry().find("host")->device() != nullptr);
  CHECK(l.registry().find("broken_required") == nullptr);
  CHECK(l.registry().find("absent_hw") == nullptr);

  // Load order: search-path order, then file name.
  const std::vector<std::string> names = l.loaded_names();
  REQUIRE(names.size() >= 3);
  CHECK(names[0] == "test_order");
  CHECK(names[1] == "test_params");
  CHECK(std::find(names.begin(), names.end(), "host") != names.end());
}

TEST_CASE("tables are handed out as the provider built them") {
  Loaded l("", {{"WIA_PROVIDER_PATH", provider_file(kBrokenDir, "test_params")}});
  const wia::Provider* p = l.registry().find("test_params");
  REQUIRE(p != nullptr);
  CHECK(p->device() == nullptr);
  REQUIRE(p->transport() != nullptr);
  CHECK(p->transport()->struct_size == sizeof(wia_transport_ops_v1_t));
  CHECK(p->transport()->caps == 0);
  CHECK(!p->transport()->put);  // optional and not announced
  CHECK(p->name() == "test_params");
  CHECK(p->path() == provider_file(kBrokenDir, "test_params"));
  CHECK(p->ctx() != nullptr);
}

TEST_CASE("the directory next to the core is searched last") {
  Loaded l("", {});
  const auto& path = l.registry().search_path();
  REQUIRE(!path.empty());
  // The test binary lives in <build>/bin, like a tool linking the core
  // statically, so its default is <build>/lib/wia/providers.
  CHECK(fs::equivalent(path.back(), kProviderDir));
  check_record(l.record("host"), ProviderState::loaded, "");
}

TEST_CASE("WIA_PROVIDER_PATH comes before providers.search_path, which comes before the default") {
  TempDir env_dir;
  TempDir yaml_dir;
  const std::string env_copy =
      env_dir.copy(provider_file(kBrokenDir, "test_params"), "libwia-provider-test_params.so");
  const std::string yaml_copy =
      yaml_dir.copy(provider_file(kProviderDir, "host"), "libwia-provider-host.so");
  yaml_dir.copy(provider_file(kBrokenDir, "test_params"), "libwia-provider-test_params.so");

  Loaded l("providers:\n  search_path: [" + yaml_dir.path().string() + "]\n",
           {{"WIA_PROVIDER_PATH", env_dir.path().string()}});
  const auto& path = l.registry().search_path();
  REQUIRE(path.size() == 3);
  CHECK(path[0] == env_dir.path().string());
  CHECK(path[1] == yaml_dir.path().string());
  CHECK(fs::equivalent(path[2], kProviderDir));

  // First of a name wins; later copies are refused as duplicates of it.
  std::vector<const ProviderRecord*> params, host;
  for (const auto& r : l.registry().records()) {
    if (r.name == "test_params") params.push_back(&r);
    if (r.name == "host") host.push_back(&r);
  }
  REQUIRE(params.size() == 2);
  CHECK(params[0]->path == env_copy);
  check_record(*params[0], ProviderState::loaded, "");
  check_record(*params[1], ProviderState::refused, "duplicate of " + env_copy);
  REQUIRE(host.size() == 2);
  CHECK(host[0]->path == yaml_copy);
  check_record(*host[0], ProviderState::loaded, "");
  check_record(*host[1], ProviderState::refused, "duplicate of " + yaml_copy);
  const wia::Provider* loaded_host = l.registry().find("host");
  REQUIRE(loaded_host != nullptr);
  CHECK(loaded_host->path() == yaml_copy);
}

TEST_CASE("a directory reached twice is searched once, without duplicates") {
  Loaded l("providers:\n  search_path: [" + kProviderDir + "/]\n",
           {{"WIA_PROVIDER_PATH", kProviderDir + "::" + kProviderDir + "/../providers"}});
  CHECK(l.registry().search_path().size() == 1);
  check_record(l.record("host"), ProviderState::loaded, "");
  for (const auto& r : l.registry().records())
    CHECK(r.reason.find("duplicate") == std::string::npos);
}

TEST_CASE("a search path entry may name a provider file directly, whatever its name") {
  TempDir dir;
  const std::string renamed = dir.copy(provider_file(kBrokenDir, "test_params"), "custom.so");
  Loaded l("", {{"WIA_PROVIDER_PATH", renamed + ":" + provider_file(kBrokenDir, "test_order")}});
  // The name comes from the descriptor when the file name does not say it.
  check_record(l.record("test_params"), ProviderState::loaded, "");
  CHECK(l.record("test_params").path == renamed);
  check_record(l.record("test_order"), ProviderState::loaded, "");
  CHECK(l.count("broken_required") == 0);  // the directory itself is not searched
}

TEST_CASE("missing search path entries are skipped") {
  Loaded l("", {{"WIA_PROVIDER_PATH", "/nonexistent/wia-providers:" + kBrokenDir + "/missing.so"}});
  CHECK(l.registry().search_path().front() == "/nonexistent/wia-providers");
  check_record(l.record("host"), ProviderState::loaded, "");
}

TEST_CASE("providers.enable loads only the providers it names, without opening the others") {
  Loaded l("providers:\n  enable: [test_params, host]\n", {{"WIA_PROVIDER_PATH", kBrokenDir}});
  check_record(l.record("test_params"), ProviderState::loaded, "");
  check_record(l.record("host"), ProviderState::loaded, "");
  check_record(l.record("test_order"), ProviderState::disabled,
               "not listed in providers.enable (test.yaml:2:");
  // Not even dlopen()ed: garbage would otherwise be refused.
  check_record(l.record("garbage"), ProviderState::disabled, "not listed in providers.enable");
  check_record(l.record("broken_undef"), ProviderState::disabled, "not listed in providers.enable");
  CHECK(l.loaded_names().size() == 2);
}

TEST_CASE("providers.disable excludes the providers it names") {
  Loaded l("providers:\n  disable: [garbage, test_order, host]\n",
           {{"WIA_PROVIDER_PATH", kBrokenDir}});
  check_record(l.record("garbage"), ProviderState::disabled,
               "listed in providers.disable (test.yaml:2:");
  check_record(l.record("test_order"), ProviderState::disabled, "listed in providers.disable");
  check_record(l.record("host"), ProviderState::disabled, "listed in providers.disable");
  check_record(l.record("test_params"), ProviderState::loaded, "");
  check_record(l.record("broken_required"), ProviderState::refused, "stream_create");
}

TEST_CASE("the environment overrides providers.disable like any core key") {
  Loaded l("", {{"WIA_PROVIDER_PATH", kBrokenDir}, {"WIA_PROVIDERS_DISABLE", "host,test_order"}});
  check_record(l.record("host"), ProviderState::disabled, "listed in providers.disable (env");
  check_record(l.record("test_order"), ProviderState::disabled, "listed in providers.disable");
}

TEST_CASE("a provider named in providers.enable that does not load is an error naming it") {
  const Env env = {{"WIA_PROVIDER_PATH", kBrokenDir}};
  SUBCASE("not found, absent and refused are all reported, with their reasons") {
    try {
      Loaded l("providers:\n  enable: [test_params, nosuch, absent_hw, broken_required]\n", env);
      FAIL("load did not throw");
    } catch (const wia::Error& e) {
      const std::string message = e.what();
      INFO(message);
      CHECK(e.status() == WIA_ERROR_UNAVAILABLE);
      CHECK(contains(message, "providers.enable (test.yaml:2:"));
      CHECK(contains(message, "nosuch (libwia-provider-nosuch.so not found in the search path)"));
      CHECK(contains(message, "absent_hw (" + provider_file(kBrokenDir, "absent_hw") +
                                  ": absent: no such hardware)"));
      CHECK(contains(message,
                     "broken_required (" + provider_file(kBrokenDir, "broken_required") +
                         ": refused: device table: required entry 'stream_create' is NULL)"));
      CHECK(contains(message, "search path: " + kBrokenDir + ":"));
      CHECK(!contains(message, "test_params ("));
    }
  }
  SUBCASE("enabled and disabled at once is reported, not silently dropped") {
    try {
      Loaded l("providers:\n  enable: [test_params]\n  disable: [test_params]\n", env);
      FAIL("load did not throw");
    } catch (const wia::Error& e) {
      CHECK(e.status() == WIA_ERROR_UNAVAILABLE);
      CHECK(contains(e.what(), "test_params"));
      CHECK(contains(e.what(), "listed in providers.disable"));
    }
  }
}

TEST_CASE("provider parameters are validated from YAML and the environment before init") {
  const Env env = {{"WIA_PROVIDER_PATH", kBrokenDir}};
  auto endpoint_name = [](const Loaded& l) {
    const wia::Provider* p = l.registry().find("test_params");
    REQUIRE(p != nullptr);
    wia_transport_props_v1_t props{};
    props.struct_size = sizeof(props);
    wia::clear_provider_error();
    wia::check_provider(*p, p->transport()->endpoint_props(p->ctx(), 0, &props), "endpoint_props");
    return std::string(props.name);
  };

  SUBCASE("the declared default") {
    Loaded l("", env);
    CHECK(endpoint_name(l) == "level-3");
  }
  SUBCASE("a YAML value") {
    Loaded l("test_params:\n  level: 7\n", env);
    CHECK(endpoint_name(l) == "level-7");
  }
  SUBCASE("an environment value") {
    Env with_var = env;
    with_var["WIA_TEST_PARAMS_LEVEL"] = "9";
    Loaded l("test_params:\n  level: 7\n", with_var);
    CHECK(endpoint_name(l) == "level-9");
  }
  SUBCASE("an unknown key refuses that provider only, naming file:line:column and a suggestion") {
    Loaded l("test_params:\n  levle: 5\n", env);
    const ProviderRecord& r = l.record("test_params");
    check_record(r, ProviderState::refused, "test_params.levle");
    CHECK(contains(r.reason, "test.yaml:2:3"));
    CHECK(contains(r.reason, "did you mean 'test_params.level'?"));
    check_record(l.record("test_order"), ProviderState::loaded, "");
  }
  SUBCASE("an out-of-range value") {
    Loaded l("test_params:\n  level: 11\n", env);
    check_record(l.record("test_params"), ProviderState::refused, "out of range");
    CHECK(contains(l.record("test_params").reason, "test.yaml:2:"));
  }
}

TEST_CASE("the text a provider passes to set_error reaches check_provider's message") {
  Loaded l("", {{"WIA_PROVIDER_PATH", provider_file(kBrokenDir, "test_params")}});
  const wia::Provider* p = l.registry().find("test_params");
  REQUIRE(p != nullptr);
  const wia_transport_ops_v1_t* ops = p->transport();
  char handle[WIA_TRANSPORT_HANDLE_SIZE] = {};
  wia_listener_t listener = nullptr;

  wia::clear_provider_error();
  try {
    wia::check_provider(*p, ops->listen(p->ctx(), 0, handle, &listener), "listen");
    FAIL("check_provider did not throw");
  } catch (const wia::Error& e) {
    CHECK(e.status() == WIA_ERROR_NOT_SUPPORTED);
    CHECK(std::string(e.what()) == "test_params: listen: listen is not offered by test_params");
  }
  // The message was consumed: a failure without one gets the status text.
  wia::clear_provider_error();
  try {
    wia::check_provider(*p, ops->close_listener(p->ctx(), nullptr), "close_listener");
    FAIL("check_provider did not throw");
  } catch (const wia::Error& e) {
    CHECK(std::string(e.what()) == "test_params: close_listener: operation not supported");
  }
  // Success and "in progress" pass through.
  int32_t count = 0;
  CHECK(wia::check_provider(*p, ops->endpoint_count(p->ctx(), &count), "endpoint_count") ==
        WIA_SUCCESS);
  CHECK(count == 1);
  CHECK(wia::check_provider(*p, WIA_IN_PROGRESS, "x") == WIA_IN_PROGRESS);
}

TEST_CASE("providers log under their own name and are finalised in reverse load order") {
  LogCapture log(wia::log::Level::info);
  {
    Loaded l("providers:\n  enable: [test_order, test_params]\n",
             {{"WIA_PROVIDER_PATH", kBrokenDir}});
    REQUIRE(l.loaded_names() == std::vector<std::string>{"test_order", "test_params"});
  }
  const std::string text = log.text();
  INFO(text);
  CHECK(contains(text, "[test_params] init test_params level=3"));
  CHECK(contains(text, "[test_order] init test_order level=3"));
  const std::size_t fini_params = text.find("[test_params] fini test_params");
  const std::size_t fini_order = text.find("[test_order] fini test_order");
  REQUIRE(fini_params != std::string::npos);
  REQUIRE(fini_order != std::string::npos);
  CHECK(fini_params < fini_order);
}

TEST_CASE("loading logs broken providers at info, absent ones at debug, and warns about nothing") {
  SUBCASE("at info") {
    LogCapture log(wia::log::Level::info);
    { Loaded l("", {{"WIA_PROVIDER_PATH", kBrokenDir}}); }
    const std::string text = log.text();
    INFO(text);
    CHECK(contains(text, "[info] [loader] provider broken_required"));
    CHECK(contains(text, "refused: device table: required entry 'stream_create' is NULL"));
    CHECK(contains(text, "[info] [loader] provider test_params 0.0-test loaded from"));
    CHECK(!contains(text, "absent: no such hardware"));
    CHECK(!contains(text, "[warn]"));
    CHECK(!contains(text, "[error]"));
  }
  SUBCASE("at debug") {
    LogCapture log(wia::log::Level::debug);
    { Loaded l("cudaa:\n  devices: 1\n", {{"WIA_PROVIDER_PATH", kBrokenDir}}); }
    const std::string text = log.text();
    INFO(text);
    CHECK(contains(text, "[debug] [loader] provider absent_hw"));
    CHECK(contains(text, "absent: no such hardware"));
    CHECK(contains(text,
                   "[debug] [loader] configuration section 'cudaa' (test.yaml:1:1) matches "
                   "no provider found"));
    CHECK(!contains(text, "[warn]"));
  }
  SUBCASE("a configuration mistake is an error") {
    LogCapture log(wia::log::Level::warn);
    { Loaded l("test_params:\n  levle: 5\n", {{"WIA_PROVIDER_PATH", kBrokenDir}}); }
    const std::string text = log.text();
    INFO(text);
    CHECK(contains(text, "[error] [loader] provider test_params"));
    CHECK(contains(text, "test_params.levle"));
  }
}

TEST_CASE("a registry can be loaded and unloaded repeatedly") {
  for (int i = 0; i < 3; ++i) {
    Loaded l("", {{"WIA_PROVIDER_PATH", kBrokenDir}});
    CHECK(l.record("test_params").state == ProviderState::loaded);
    l.unload();
  }
}

TEST_CASE("provider states have stable names for wia-info") {
  CHECK(std::string(wia::provider_state_name(ProviderState::loaded)) == "loaded");
  CHECK(std::string(wia::provider_state_name(ProviderState::absent)) == "absent");
  CHECK(std::string(wia::provider_state_name(ProviderState::disabled)) == "disabled");
  CHECK(std::string(wia::provider_state_name(ProviderState::refused)) == "refused");
}
