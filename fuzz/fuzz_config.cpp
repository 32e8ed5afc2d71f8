// SPDX-License-Identifier: Apache-2.0
// fuzz_config: a whole YAML configuration file through what the runtime
// does with it: Config::parse (core keys validated at once), the provider
// sections validated against declared parameters, and the selector's
// rules and groups.
//
// Invariants beyond "no crash":
//  - a rejected file is a wia::Error(WIA_ERROR_CONFIG) with a message, never
//    another exception (the runtime turns only wia::Error into a status);
//  - every accepted value is canonical: writing the effective configuration
//    back as YAML and parsing it again gives the same text for every key.
#include <yaml-cpp/yaml.h>

#include <map>
#include <string>
#include <vector>

#include "fuzz_common.hpp"
#include "selector/selector.hpp"

namespace {

using wia::fuzz::check;

// Provider parameter tables of every type, so a provider section exercises
// the same validation a loaded provider's declaration would.
constexpr std::uint32_t kDecl = sizeof(wia_param_decl_v1_t);
const wia_param_decl_v1_t kParams[] = {
    {kDecl, WIA_PARAM_INT, "devices", "4", "devices", 1, 64},
    {kDecl, WIA_PARAM_SIZE, "max_message", "1G", "largest message", 1, INT64_MAX},
    {kDecl, WIA_PARAM_BOOL, "enable", "true", "on or off", 0, 0},
    {kDecl, WIA_PARAM_STRING, "ifname", "", "interfaces", 0, 0},
};
const char* const kProviders[] = {"host", "shm", "tcp"};

// "log.level" = "info" -> log: {level: info}.
void put(YAML::Node root, const std::string& dotted, const std::string& text) {
  const auto dot = dotted.find('.');
  if (dot == std::string::npos) {
    root[dotted] = text;
    return;
  }
  YAML::Node child = root[dotted.substr(0, dot)];
  put(child, dotted.substr(dot + 1), text);
}

std::map<std::string, std::string> texts(const wia::Config& c) {
  std::map<std::string, std::string> out;
  for (const auto& [key, value] : c.entries()) out[key] = value.text;
  return out;
}

void declare_all(wia::Config& c) {
  for (const char* p : kProviders) c.declare_provider(p, kParams);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  wia::fuzz::quiet_logs();
  const std::string_view text = wia::fuzz::as_text({data, size});
  wia::Config config;
  try {
    config = wia::Config::parse(text, "fuzz.yaml", wia::fuzz::no_env());
    declare_all(config);
  } catch (const wia::Error& e) {
    wia::fuzz::check_rejection(e, WIA_ERROR_CONFIG, "Config::parse");
    return 0;
  }
  try {
    (void)wia::selector::load_rules(config, nullptr, wia::fuzz::no_env());
  } catch (const wia::Error& e) {
    wia::fuzz::check_rejection(e, WIA_ERROR_CONFIG, "selector::load_rules");
  }

  // Round trip of the effective values.
  const auto first = texts(config);
  YAML::Node root(YAML::NodeType::Map);
  for (const auto& [key, value] : first) put(root, key, value);
  YAML::Emitter out;
  out << root;
  check(out.good(), "emitting the effective configuration failed: " + out.GetLastError());
  const std::string again_text = out.c_str();
  try {
    wia::Config again = wia::Config::parse(again_text, "again.yaml", wia::fuzz::no_env());
    declare_all(again);
    const auto second = texts(again);
    for (const auto& [key, value] : first) {
      auto it = second.find(key);
      check(it != second.end(), "key '" + key + "' lost on the round trip");
      check(it->second == value, "key '" + key + "': '" + value + "' read back as '" + it->second +
                                     "'\n--- written:\n" + again_text);
    }
  } catch (const wia::Error& e) {
    wia::fuzz::broken(std::string("the effective configuration, written back, is rejected: ") +
                      e.what() + "\n--- written:\n" + again_text);
  }
  return 0;
}
