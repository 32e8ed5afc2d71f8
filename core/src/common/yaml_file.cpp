// SPDX-License-Identifier: Apache-2.0
#include "common/yaml_file.hpp"

#include <fmt/format.h>

#include "common/error.hpp"

namespace wia {

YAML::Node YamlFile::load() const {
  try {
    return YAML::LoadFile(path_);
  } catch (const YAML::BadFile&) {
    throw Error(WIA_ERROR_CONFIG, fmt::format("{}: cannot open {}", path_, kind_));
  } catch (const YAML::ParserException& e) {
    throw Error(WIA_ERROR_CONFIG, fmt::format("{}: YAML syntax error: {}", where(e.mark), e.msg));
  }
}

std::string YamlFile::where(const YAML::Mark& m) const {
  if (m.is_null()) return path_;
  return fmt::format("{}:{}:{}", path_, m.line + 1, m.column + 1);
}

void YamlFile::fail(const YAML::Mark& m, const std::string& key, const std::string& what) const {
  throw Error(WIA_ERROR_CONFIG, fmt::format("{}: key '{}': {}", where(m), key, what));
}

void YamlFile::check_keys(const YAML::Node& map, const std::string& prefix,
                          std::initializer_list<const char*> allowed) const {
  for (const auto& kv : map) {
    const std::string key = kv.first.Scalar();
    bool ok = false;
    for (const char* a : allowed) ok = ok || key == a;
    if (ok) continue;
    std::string list;
    for (const char* a : allowed) list += (list.empty() ? "" : ", ") + std::string(a);
    fail(kv.first.Mark(), prefix + key, fmt::format("unknown key (expected one of: {})", list));
  }
}

std::string YamlFile::scalar(const YAML::Node& n, const std::string& key) const {
  if (!n.IsScalar()) fail(n.Mark(), key, "must be a single value");
  return n.Scalar();
}

}  // namespace wia
