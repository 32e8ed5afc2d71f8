// SPDX-License-Identifier: Apache-2.0
// What every YAML file loader of the core starts with (topology files,
// model files): parsing the file, and errors that name file:line:column
// and the key. A loader derives from YamlFile and reads the returned root.
#pragma once

#include <yaml-cpp/yaml.h>

#include <initializer_list>
#include <string>

namespace wia {

class YamlFile {
 public:
  // `kind` names the file in errors: "topology file", "model file".
  YamlFile(std::string path, std::string kind) : path_(std::move(path)), kind_(std::move(kind)) {}

  const std::string& path() const { return path_; }

  // Parses the whole file. Throws wia::Error(WIA_ERROR_CONFIG):
  // "<path>: cannot open <kind>" or "<path>:L:C: YAML syntax error: ...".
  YAML::Node load() const;

  // "<path>:line:column" (1-based) of a node, "<path>" when it has no mark.
  std::string where(const YAML::Mark& m) const;
  // Throws WIA_ERROR_CONFIG "<where>: key '<key>': <what>".
  [[noreturn]] void fail(const YAML::Mark& m, const std::string& key,
                         const std::string& what) const;
  // Fails on the first key of `map` not in `allowed`, naming it as
  // prefix + key and listing the allowed ones.
  void check_keys(const YAML::Node& map, const std::string& prefix,
                  std::initializer_list<const char*> allowed) const;
  // The node's text; fails unless it is a single value.
  std::string scalar(const YAML::Node& n, const std::string& key) const;

 private:
  std::string path_;
  std::string kind_;
};

}  // namespace wia
