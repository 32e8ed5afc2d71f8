// SPDX-License-Identifier: Apache-2.0
// Effective configuration: compiled-in schema defaults, then the YAML file,
// then WIA_* variables. Validation happens while walking the YAML tree so
// every message can name the file, line, column and full key path.
#include "config/config.hpp"

#include <fmt/core.h>
#include <yaml-cpp/eventhandler.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>
#include <type_traits>

#include "common/error.hpp"
#include "common/utf8.hpp"
#include "config/schema.hpp"

namespace wia {

EnvLookup process_env() {
  return [](const char* name) -> const char* { return std::getenv(name); };
}

namespace {

using cfg::Spec;
using cfg::Value;
using cfg::ValueType;

[[noreturn]] void fail(std::string message) { throw Error(WIA_ERROR_CONFIG, std::move(message)); }
[[noreturn]] void bad_declaration(std::string message) {
  throw Error(WIA_ERROR_INVALID_ARGUMENT, std::move(message));
}
[[noreturn]] void bad_param(const std::string& provider, std::size_t index, const char* key,
                            std::string_view what) {
  bad_declaration(fmt::format("provider '{}' parameter #{}{}: {}", provider, index,
                              key ? fmt::format(" '{}'", key) : std::string(), what));
}

// Whether `text` holds a second YAML document, and where it starts (a null
// mark when the parser gave no position for it). Not YAML::LoadAll: on some malformed text (a flow
// sequence's end at the start of a line, fuzz/corpus/config/
// regress-endless-documents.yaml) yaml-cpp 0.7's parser reports an endless
// run of empty documents, and LoadAll allocated until the process died.
// Counting stops at the second document whatever the parser says.
bool second_document(const std::string& text, YAML::Mark* where) {
  struct Marks : YAML::EventHandler {
    int document = 0;  // index of the document being handled
    bool have = false;
    YAML::Mark second = YAML::Mark::null_mark();
    void at(const YAML::Mark& m) {
      if (document == 1 && !have) {
        second = m;
        have = true;
      }
    }
    void OnDocumentStart(const YAML::Mark&) override {}
    void OnDocumentEnd() override {}
    void OnNull(const YAML::Mark& m, YAML::anchor_t) override { at(m); }
    void OnAlias(const YAML::Mark& m, YAML::anchor_t) override { at(m); }
    void OnScalar(const YAML::Mark& m, const std::string&, YAML::anchor_t,
                  const std::string&) override {
      at(m);
    }
    void OnSequenceStart(const YAML::Mark& m, const std::string&, YAML::anchor_t,
                         YAML::EmitterStyle::value) override {
      at(m);
    }
    void OnSequenceEnd() override {}
    void OnMapStart(const YAML::Mark& m, const std::string&, YAML::anchor_t,
                    YAML::EmitterStyle::value) override {
      at(m);
    }
    void OnMapEnd() override {}
  } marks;
  std::istringstream in(text);
  YAML::Parser parser(in);
  for (; marks.document < 2; ++marks.document) {
    if (!parser.HandleNextDocument(marks)) return false;
  }
  *where = marks.second;
  return true;
}

// 1-based, as editors count. A node without a mark (never the case for
// parsed nodes, but cheap to guard) is reported by file name alone.
std::string location(const std::string& file, const YAML::Mark& mark) {
  if (mark.is_null()) return file;
  return fmt::format("{}:{}:{}", file, mark.line + 1, mark.column + 1);
}

const char* node_kind(const YAML::Node& node) {
  switch (node.Type()) {
    case YAML::NodeType::Null:
      return "nothing";
    case YAML::NodeType::Scalar:
      return "a scalar";
    case YAML::NodeType::Sequence:
      return "a list";
    case YAML::NodeType::Map:
      return "a mapping";
    case YAML::NodeType::Undefined:
      break;
  }
  return "an undefined node";
}

std::string expected_text(const Spec& spec) {
  if (spec.type != ValueType::kEnum) return cfg::type_phrase(spec.type);
  std::string text = "one of ";
  for (std::size_t i = 0; i < spec.allowed.size(); ++i) text += (i ? ", " : "") + spec.allowed[i];
  return text;
}

// A mapping key must be a scalar name without '.': the dot is what joins
// names into key paths, so "log.level:" written flat would be a second,
// unchecked spelling of log: {level: ...}.
void check_key_name(const std::string& file, const YAML::Node& key, const char* what,
                    const std::string& parent) {
  if (!key.IsScalar())
    fail(fmt::format("{}{} at {} must be a plain name, found {}", what, parent,
                     location(file, key.Mark()), node_kind(key)));
  if (key.Scalar().find('.') != std::string::npos)
    fail(fmt::format("dotted key '{}' at {}: write it nested, one mapping level per '.'",
                     key.Scalar(), location(file, key.Mark())));
}

std::string join(const std::vector<std::string>& items) {
  std::string out;
  for (const auto& item : items) out += (out.empty() ? "" : ", ") + item;
  return out;
}

// One effective value: the typed form for getters, the text form (with its
// source and description) for get() and entries().
struct Entry {
  Spec spec;
  Value value;
  ConfigValue shown;

  void set(Value v, std::string source) {
    value = std::move(v);
    shown.text = value.text;
    shown.source = std::move(source);
  }
};
using EntryMap = std::map<std::string, Entry, std::less<>>;

// The keys of one tree (the core schema, or one provider's declaration):
// leaves by full path, plus every proper prefix, which must be a mapping.
class KeyIndex {
 public:
  explicit KeyIndex(const std::vector<Spec>& specs) {
    for (const auto& spec : specs) {
      leaves_.emplace(spec.key, &spec);
      for (std::size_t dot = spec.key.find('.'); dot != std::string::npos;
           dot = spec.key.find('.', dot + 1))
        interior_.insert(spec.key.substr(0, dot));
    }
  }
  const Spec* leaf(std::string_view path) const {
    auto it = leaves_.find(path);
    return it == leaves_.end() ? nullptr : it->second;
  }
  bool interior(std::string_view path) const { return interior_.count(path) != 0; }
  std::vector<std::string> paths() const {
    std::vector<std::string> all(interior_.begin(), interior_.end());
    for (const auto& [key, spec] : leaves_) all.push_back(key);
    return all;
  }
  // Names directly under `path`, for "valid keys under 'log': file, level".
  std::vector<std::string> children(const std::string& path) const {
    std::set<std::string> names;
    std::string prefix = path + ".";
    auto add = [&](const std::string& key) {
      if (key.compare(0, prefix.size(), prefix) != 0) return;
      std::string rest = key.substr(prefix.size());
      names.insert(rest.substr(0, rest.find('.')));
    };
    for (const auto& key : interior_) add(key);
    for (const auto& [key, spec] : leaves_) add(key);
    return {names.begin(), names.end()};
  }
  std::vector<std::string> top_sections() const {
    std::set<std::string> names;
    for (const auto& [key, spec] : leaves_) names.insert(key.substr(0, key.find('.')));
    return {names.begin(), names.end()};
  }

 private:
  std::map<std::string, const Spec*, std::less<>> leaves_;
  std::set<std::string, std::less<>> interior_;
};

// Validates YAML subtrees against one KeyIndex, writing into `out` (which
// holds the defaults beforehand).
class Walker {
 public:
  // `structured`, when given, receives the nodes of structured keys
  // (cfg::structured_schema()); without it they are unknown keys.
  Walker(const std::string& file, const KeyIndex& index, EntryMap* out,
         std::map<std::string, YAML::Node, std::less<>>* structured = nullptr)
      : file_(file), index_(index), out_(out), structured_(structured) {}

  // `node` is the value of key `path` (whose key node sits at key_mark).
  void section(const YAML::Node& node, const std::string& path, const YAML::Mark& key_mark) {
    if (node.IsNull()) return;  // "log:" with nothing under it changes nothing
    if (!node.IsMap())
      fail(fmt::format("'{}' at {} must be a mapping of keys, found {}", path,
                       location(file_, key_mark), node_kind(node)));
    std::map<std::string, YAML::Mark> seen;
    for (const auto& pair : node) {
      // Copies: yaml-cpp's iterator hands out a temporary pair, and Node is
      // a cheap handle.
      const YAML::Node key = pair.first;
      const YAML::Node value = pair.second;
      check_key_name(file_, key, "a key under ", "'" + path + "'");
      std::string full = path + "." + key.Scalar();
      // yaml-cpp keeps both pairs of a duplicated key; iteration shows them.
      auto [prev, fresh] = seen.emplace(full, key.Mark());
      if (!fresh)
        fail(fmt::format("duplicate key '{}' at {}; first given at {}", full,
                         location(file_, key.Mark()), location(file_, prev->second)));
      if (const Spec* spec = index_.leaf(full)) {
        assign(*spec, key, value);
      } else if (index_.interior(full)) {
        section(value, full, key.Mark());
      } else if (structured_ != nullptr && is_structured(full)) {
        (*structured_)[full] = value;
      } else {
        unknown(full, path, key.Mark());
      }
    }
  }

  void assign(const Spec& spec, const YAML::Node& key, const YAML::Node& node) {
    Value value;
    if (spec.type == ValueType::kList) {
      value = list_value(spec, node);
    } else if (node.IsNull() && spec.type == ValueType::kString) {
      value.text.clear();  // "file:" with no value: the empty string
    } else if (node.IsNull()) {
      fail(fmt::format("missing value for '{}' at {}: expected {}", spec.key,
                       location(file_, key.Mark()), expected_text(spec)));
    } else if (!node.IsScalar()) {
      fail(fmt::format("invalid value for '{}' at {}: expected {}, found {}", spec.key,
                       location(file_, node.Mark()), expected_text(spec), node_kind(node)));
    } else {
      std::string why;
      if (!cfg::parse_value(spec, node.Scalar(), &value, &why))
        fail(fmt::format("invalid value '{}' for '{}' at {}: {}", node.Scalar(), spec.key,
                         location(file_, node.Mark()), why));
    }
    (*out_)[spec.key].set(std::move(value), location(file_, key.Mark()));
  }

 private:
  Value list_value(const Spec& spec, const YAML::Node& node) {
    if (node.IsNull()) return cfg::make_list({});
    if (node.IsScalar()) {
      Value value;
      std::string why;
      // Lists accept any text that is UTF-8 (parse_value's one refusal).
      if (!cfg::parse_value(spec, node.Scalar(), &value, &why))
        fail(fmt::format("invalid value '{}' for '{}' at {}: {}", node.Scalar(), spec.key,
                         location(file_, node.Mark()), why));
      return value;
    }
    if (!node.IsSequence())
      fail(fmt::format("invalid value for '{}' at {}: expected {}, found {}", spec.key,
                       location(file_, node.Mark()), expected_text(spec), node_kind(node)));
    std::vector<std::string> items;
    for (const auto& item : node) {
      if (!item.IsScalar())
        fail(fmt::format("invalid item in '{}' at {}: expected a string, found {}", spec.key,
                         location(file_, item.Mark()), node_kind(item)));
      // Each item as a scalar value is checked (UTF-8: written back as
      // other text otherwise; found by fuzz_config).
      if (const std::size_t bad = first_invalid_utf8(item.Scalar()); bad != std::string::npos)
        fail(fmt::format("invalid item in '{}' at {}: is not valid UTF-8 (byte {} of {})",
                         spec.key, location(file_, item.Mark()), bad, item.Scalar().size()));
      items.push_back(item.Scalar());
    }
    return cfg::make_list(std::move(items));
  }

  [[noreturn]] void unknown(const std::string& full, const std::string& path,
                            const YAML::Mark& mark) {
    std::string suggestion = cfg::closest_match(full, index_.paths());
    if (suggestion.empty()) suggestion = same_name_elsewhere(full);
    if (!suggestion.empty())
      fail(fmt::format("unknown key '{}' at {}; did you mean '{}'?", full, location(file_, mark),
                       suggestion));
    std::vector<std::string> valid = index_.children(path);
    if (valid.empty())
      fail(fmt::format("unknown key '{}' at {}; no keys are valid under '{}'", full,
                       location(file_, mark), path));
    fail(fmt::format("unknown key '{}' at {}; valid keys under '{}': {}", full,
                     location(file_, mark), path, join(valid)));
  }

  // "log.enable" is no typo of "providers.enable" but still most likely
  // meant it: the right name in the wrong section.
  std::string same_name_elsewhere(const std::string& full) const {
    std::string name = full.substr(full.rfind('.'));  // ".enable"
    for (const auto& path : index_.paths())
      if (path.ends_with(name) && path != full) return path;
    return {};
  }

  static bool is_structured(std::string_view full) {
    for (const auto& row : cfg::structured_schema())
      if (row.key == full) return true;
    return false;
  }

  const std::string& file_;
  const KeyIndex& index_;
  EntryMap* out_;
  std::map<std::string, YAML::Node, std::less<>>* structured_;
};

const std::vector<Spec>& core_specs() {
  static const std::vector<Spec> specs = [] {
    std::vector<Spec> out;
    for (const auto& row : cfg::core_schema()) out.push_back(Spec::from(row));
    return out;
  }();
  return specs;
}

const KeyIndex& core_index() {
  static const KeyIndex index(core_specs());
  return index;
}

// Seeds `out` with the defaults of `specs`. A default that fails its own
// rules is a programming error of whoever declared it.
void seed_defaults(const std::vector<Spec>& specs, EntryMap* out,
                   const std::function<void(const Spec&, const std::string&)>& on_bad) {
  for (const auto& spec : specs) {
    Value value;
    std::string why;
    if (!cfg::parse_value(spec, spec.default_value, &value, &why)) on_bad(spec, why);
    Entry& entry = (*out)[spec.key];
    entry.spec = spec;
    entry.shown.description = spec.description;
    entry.set(std::move(value), "default");
  }
}

void apply_env(const std::vector<Spec>& specs, const EnvLookup& env, EntryMap* out) {
  if (!env) return;
  for (const auto& spec : specs) {
    std::string name = cfg::env_var_name(spec.key);
    const char* text = env(name.c_str());
    if (text == nullptr) continue;
    Value value;
    std::string why;
    if (!cfg::parse_value(spec, text, &value, &why))
      fail(fmt::format("invalid value '{}' for '{}' in environment variable {}: {}", text, spec.key,
                       name, why));
    (*out)[spec.key].set(std::move(value), "env " + name);
  }
}

bool valid_param_key(std::string_view key) {
  if (key.empty() || key.front() == '.' || key.back() == '.') return false;
  char prev = 0;
  for (char c : key) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' || c == '-' || c == '.';
    if (!ok || (c == '.' && prev == '.')) return false;
    prev = c;
  }
  return true;
}

}  // namespace

struct Config::Impl {
  struct Section {
    YAML::Node node;  // kept raw, marks included, until declared
    YAML::Mark mark;  // of the section's name
  };

  std::string file;
  EnvLookup env;
  EntryMap entries;
  std::map<std::string, Section, std::less<>> raw_sections;
  std::set<std::string, std::less<>> declared;
  std::map<std::string, YAML::Node, std::less<>> structured;  // selector.rules, ...

  Impl() {
    seed_defaults(core_specs(), &entries, [](const Spec& spec, const std::string& why) {
      throw Error(WIA_ERROR_INTERNAL, fmt::format("compiled-in default '{}' of '{}' is invalid: {}",
                                                  spec.default_value, spec.key, why));
    });
  }

  void load_yaml(std::string_view text);
  const Entry& entry(std::string_view key) const {
    auto it = entries.find(key);
    if (it == entries.end())
      throw Error(WIA_ERROR_INTERNAL, fmt::format("no configuration key '{}'", key));
    return it->second;
  }
  const Entry& typed(std::string_view key, std::initializer_list<ValueType> types,
                     const char* wanted) const {
    const Entry& e = entry(key);
    if (std::find(types.begin(), types.end(), e.spec.type) == types.end())
      throw Error(WIA_ERROR_INTERNAL, fmt::format("configuration key '{}' is of type {}, not {}",
                                                  key, cfg::type_name(e.spec.type), wanted));
    return e;
  }
};

void Config::Impl::load_yaml(std::string_view text) {
  YAML::Node root;
  bool more_than_one = false;
  YAML::Mark second = YAML::Mark::null_mark();
  try {
    const std::string whole(text);
    root = YAML::Load(whole);  // the first document only
    more_than_one = second_document(whole, &second);
  } catch (const YAML::ParserException& e) {
    fail(fmt::format("YAML syntax error at {}: {}", location(file, e.mark), e.msg));
  } catch (const YAML::Exception& e) {
    fail(fmt::format("cannot parse {}: {}", file, e.what()));
  }
  if (more_than_one)
    fail(fmt::format("{} holds more than one YAML document, expected one (the second starts at {})",
                     file, location(file, second)));
  if (!root.IsDefined() || root.IsNull()) return;  // empty file or comments only
  if (!root.IsMap())
    fail(fmt::format("the top level of {} must be a mapping of sections, found {} at {}", file,
                     node_kind(root), location(file, root.Mark())));

  const KeyIndex& index = core_index();
  const std::vector<std::string> core_sections = index.top_sections();
  Walker walker(file, index, &entries, &structured);
  std::map<std::string, YAML::Mark> seen;
  for (const auto& pair : root) {
    const YAML::Node key = pair.first;  // copies, see Walker::section
    const YAML::Node value = pair.second;
    check_key_name(file, key, "a section name", "");
    const std::string& name = key.Scalar();
    auto [prev, fresh] = seen.emplace(name, key.Mark());
    if (!fresh)
      fail(fmt::format("duplicate section '{}' at {}; first given at {}", name,
                       location(file, key.Mark()), location(file, prev->second)));
    if (index.interior(name)) {
      walker.section(value, name, key.Mark());
      continue;
    }
    // Any other section belongs to a provider that may not exist on this
    // machine, so it cannot be rejected. One edit away from a core section
    // it is far more likely a typo ("provider:", "lgo:") than a provider.
    for (const auto& core : core_sections) {
      if (cfg::edit_distance(name, core) <= 1)
        fail(fmt::format("unknown section '{}' at {}; did you mean '{}'?", name,
                         location(file, key.Mark()), core));
    }
    if (!value.IsNull() && !value.IsMap())
      fail(fmt::format("section '{}' at {} must be a mapping of keys, found {}", name,
                       location(file, key.Mark()), node_kind(value)));
    raw_sections[name] = Section{value, key.Mark()};
  }
}

Config::Config() : impl_(std::make_unique<Impl>()) {}
Config::~Config() = default;
Config::Config(Config&&) noexcept = default;
Config& Config::operator=(Config&&) noexcept = default;

Config Config::parse(std::string_view yaml_text, const std::string& name, const EnvLookup& env) {
  Config config;
  config.impl_->file = name;
  config.impl_->env = env;
  config.impl_->load_yaml(yaml_text);
  apply_env(core_specs(), env, &config.impl_->entries);
  return config;
}

Config Config::load(const std::string& yaml_path, const EnvLookup& env) {
  if (yaml_path.empty()) {
    Config config;
    config.impl_->env = env;
    apply_env(core_specs(), env, &config.impl_->entries);
    return config;
  }
  std::ifstream in(yaml_path, std::ios::binary);
  if (!in)
    fail(fmt::format("cannot read configuration file {}: {}", yaml_path, std::strerror(errno)));
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) fail(fmt::format("cannot read configuration file {}: read error", yaml_path));
  return parse(text.str(), yaml_path, env);
}

Config Config::load_from_env(const EnvLookup& env) {
  const char* path = env ? env("WIA_CONFIG") : nullptr;
  if (path == nullptr || *path == '\0') return load("", env);
  try {
    return load(path, env);
  } catch (const Error& e) {
    // Say where the path came from, or "no such file" puzzles the user.
    if (std::string_view(e.what()).starts_with("cannot read"))
      fail(fmt::format("{} (named by WIA_CONFIG)", e.what()));
    throw;
  }
}

const std::string& Config::file() const { return impl_->file; }

const YAML::Node* Config::structured(std::string_view key) const {
  auto it = impl_->structured.find(key);
  return it == impl_->structured.end() ? nullptr : &it->second;
}

const ConfigValue& Config::get(std::string_view key) const { return impl_->entry(key).shown; }

std::int64_t Config::get_int(std::string_view key) const {
  return impl_->typed(key, {ValueType::kInt, ValueType::kSize}, "int").value.number;
}

bool Config::get_bool(std::string_view key) const {
  return impl_->typed(key, {ValueType::kBool}, "bool").value.flag;
}

std::string Config::get_string(std::string_view key) const { return impl_->entry(key).value.text; }

std::vector<std::string> Config::get_list(std::string_view key) const {
  return impl_->typed(key, {ValueType::kList}, "list").value.items;
}

void Config::declare_provider(std::string_view provider,
                              std::span<const wia_param_decl_v1_t> params) {
  const std::string name(provider);
  if (name.empty() || !valid_param_key(name) || name.find('.') != std::string::npos)
    bad_declaration(fmt::format("invalid provider name '{}' (use a-z, 0-9, '_', '-')", name));
  const auto core_sections = core_index().top_sections();
  if (std::find(core_sections.begin(), core_sections.end(), name) != core_sections.end())
    bad_declaration(fmt::format(
        "provider name '{}' collides with the core configuration section of that name", name));
  if (impl_->declared.count(name))
    bad_declaration(fmt::format("provider '{}' declared its parameters twice", name));

  // Convert and check the declaration before touching any YAML, so a
  // provider bug is reported as such and not as a user error.
  std::vector<Spec> specs;
  specs.reserve(params.size());
  for (std::size_t i = 0; i < params.size(); ++i) {
    const wia_param_decl_v1_t& decl = params[i];
    auto bad = [&](std::string_view what) { bad_param(name, i, decl.key, what); };
    if (decl.struct_size < sizeof(wia_param_decl_v1_t))
      bad(fmt::format("struct_size {} is smaller than wia_param_decl_v1_t ({})", decl.struct_size,
                      sizeof(wia_param_decl_v1_t)));
    if (decl.key == nullptr || !valid_param_key(decl.key))
      bad("key must be non-empty lower-case a-z, 0-9, '_', '-', '.'");
    Spec spec;
    spec.key = name + "." + decl.key;
    // Read as an integer: a C provider may store any value in the enum
    // field, and loading an out-of-range enum is undefined in C++.
    std::underlying_type_t<wia_param_type_t> raw_type;
    std::memcpy(&raw_type, &decl.type, sizeof raw_type);
    switch (raw_type) {
      case WIA_PARAM_INT:
        spec.type = ValueType::kInt;
        break;
      case WIA_PARAM_BOOL:
        spec.type = ValueType::kBool;
        break;
      case WIA_PARAM_STRING:
        spec.type = ValueType::kString;
        break;
      case WIA_PARAM_SIZE:
        spec.type = ValueType::kSize;
        break;
      default:
        bad(fmt::format("unknown type {}", raw_type));
    }
    if (decl.default_value == nullptr && spec.type != ValueType::kString) bad("no default value");
    spec.default_value = decl.default_value ? decl.default_value : "";
    spec.description = decl.description ? decl.description : "";
    if (spec.type == ValueType::kInt || spec.type == ValueType::kSize) {
      if (decl.min_value > decl.max_value)
        bad(fmt::format("min_value {} > max_value {}", decl.min_value, decl.max_value));
      spec.min_value = decl.min_value;
      spec.max_value = decl.max_value;
    }
    for (const auto& other : specs) {
      if (other.key == spec.key) bad("declared twice");
      // "a" and "a.b" cannot both be values: "a" would be a leaf and a mapping.
      if (other.key.starts_with(spec.key + ".") || spec.key.starts_with(other.key + "."))
        bad(fmt::format("conflicts with '{}'", other.key));
    }
    specs.push_back(std::move(spec));
  }

  EntryMap values;
  seed_defaults(specs, &values, [&](const Spec& spec, const std::string& why) {
    bad_declaration(fmt::format("provider '{}' parameter '{}': invalid default '{}': {}", name,
                                spec.key, spec.default_value, why));
  });
  const KeyIndex index(specs);
  auto raw = impl_->raw_sections.find(name);
  if (raw != impl_->raw_sections.end()) {
    Walker walker(impl_->file, index, &values);
    walker.section(raw->second.node, name, raw->second.mark);
  }
  apply_env(specs, impl_->env, &values);

  // Validated in full: only now does the configuration change.
  impl_->entries.merge(values);
  impl_->declared.insert(name);
}

const char* Config::provider_param(std::string_view provider, std::string_view key) const {
  if (!impl_->declared.count(provider)) return nullptr;
  auto it = impl_->entries.find(fmt::format("{}.{}", provider, key));
  return it == impl_->entries.end() ? nullptr : it->second.value.text.c_str();
}

std::vector<std::pair<std::string, std::string>> Config::undeclared_sections() const {
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& [name, section] : impl_->raw_sections)
    if (!impl_->declared.count(name)) out.emplace_back(name, location(impl_->file, section.mark));
  return out;
}

std::map<std::string, ConfigValue> Config::entries() const {
  std::map<std::string, ConfigValue> out;
  for (const auto& [key, entry] : impl_->entries) out.emplace(key, entry.shown);
  return out;
}

}  // namespace wia
