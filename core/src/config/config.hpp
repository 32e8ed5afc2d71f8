// SPDX-License-Identifier: Apache-2.0
// Effective configuration: embedded defaults < YAML file < WIA_* environment.
// Every value remembers where it came from, for `wia-info --config`.
#pragma once

#include <wia/provider.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace YAML {
class Node;
}

namespace wia {

// Where a value came from: "default", "<file>:<line>:<col>", "env WIA_X".
struct ConfigValue {
  std::string text;  // canonical text of the value; lists as "a,b,c"
  std::string source;
  std::string description;  // from the schema or the provider's declaration
};

// Reads an environment variable; returns nullptr when unset. Injectable so
// tests need not touch the real environment.
using EnvLookup = std::function<const char*(const char*)>;
EnvLookup process_env();

// Const members may be called from any thread; declare_provider() must not
// run concurrently with anything else on the same Config (the loader calls
// it while loading, before the runtime is shared).
class Config {
 public:
  // Builds the effective configuration. `yaml_path` empty = embedded
  // defaults (plus the environment). Core keys are validated at once; sections named after
  // providers are kept raw until declare_provider() validates them.
  // Throws wia::Error(WIA_ERROR_CONFIG) naming file:line:column and key for
  // syntax errors, unknown keys (with the closest valid key suggested),
  // wrong types and out-of-range values.
  static Config load(const std::string& yaml_path, const EnvLookup& env = process_env());
  // Same, from text (name is used in messages in place of a file name).
  static Config parse(std::string_view yaml_text, const std::string& name,
                      const EnvLookup& env = process_env());
  // File discovery in one place: the file named by WIA_CONFIG when it is
  // set and non-empty, else the embedded defaults; WIA_* overrides apply
  // either way. A WIA_CONFIG naming an unreadable file is an error.
  static Config load_from_env(const EnvLookup& env = process_env());

  // For all three: `env` is kept, as declare_provider() reads
  // WIA_<PROVIDER>_<KEY> through it later; what it captures must outlive
  // the Config.

  // Compiled-in defaults only; the environment is ignored.
  Config();
  ~Config();
  Config(Config&&) noexcept;
  Config& operator=(Config&&) noexcept;

  // Core keys (dotted paths, e.g. "log.level", "providers.search_path"),
  // and provider keys ("host.devices") once declared. get_int() answers for
  // int and size keys (sizes in bytes); get_string() for any key (canonical
  // text). Throws wia::Error(WIA_ERROR_INTERNAL) for a key not in the
  // schema or a getter that does not match the key's type.
  const ConfigValue& get(std::string_view key) const;
  std::int64_t get_int(std::string_view key) const;
  bool get_bool(std::string_view key) const;
  std::string get_string(std::string_view key) const;
  std::vector<std::string> get_list(std::string_view key) const;

  // Name of the YAML file (or of the text given to parse()); empty when
  // only embedded defaults were used.
  const std::string& file() const;

  // The YAML node of a structured key (cfg::structured_schema(), e.g.
  // "selector.rules"), marks included, unvalidated: its owner validates it
  // and names file() with the node's line and column. nullptr when the file
  // does not give the key (or `key` is not a structured key).
  const YAML::Node* structured(std::string_view key) const;

  // Validate the top-level section named `provider` (and WIA_<PROVIDER>_*
  // variables) against the provider's declared parameters, filling
  // defaults. Throws wia::Error(WIA_ERROR_CONFIG) with file:line:column and
  // key. Afterwards provider_param() answers for that provider. A broken
  // declaration (no key, bad type, invalid default, min > max, duplicate
  // key, struct_size too small) throws WIA_ERROR_INVALID_ARGUMENT naming the
  // provider and entry; a provider name that is a core section, or a second
  // declaration of one provider, throws WIA_ERROR_INVALID_ARGUMENT too.
  // Nothing is recorded when it throws.
  void declare_provider(std::string_view provider, std::span<const wia_param_decl_v1_t> params);
  // Value text of a declared provider parameter; nullptr if not declared.
  // The pointer stays valid for the Config's lifetime.
  const char* provider_param(std::string_view provider, std::string_view key) const;

  // Top-level sections that are neither core sections nor declared
  // providers (e.g. a `cuda:` section on a machine without CUDA): their
  // names and the source of each.
  std::vector<std::pair<std::string, std::string>> undeclared_sections() const;

  // Every effective value, sorted by key ("host.devices" etc. included
  // once declared), for `wia-info --config`.
  std::map<std::string, ConfigValue> entries() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace wia
