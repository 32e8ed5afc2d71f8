// SPDX-License-Identifier: Apache-2.0
// Model files for the tools (docs/placement.md):
//   parts:
//     - {name: embed, memory: 4G}
//     - {name: layer, count: 4, memory: 2G}      # layer0 .. layer3
//   traffic:
//     - {between: [layer0, layer1], bytes: 64M}  # each direction
//     - {from: "layer*", to: embed, bytes: 1M}   # one direction, globs allowed
#include <fmt/format.h>
#include <fnmatch.h>
#include <yaml-cpp/yaml.h>

#include <set>

#include "common/error.hpp"
#include "common/yaml_file.hpp"
#include "config/schema.hpp"
#include "placement/placement.hpp"

namespace wia::place {

namespace {

constexpr int kMaxParts = 4096;

class ModelReader : private YamlFile {
 public:
  explicit ModelReader(std::string file) : YamlFile(std::move(file), "model file") {}

  ModelFile load() {
    const YAML::Node root = YamlFile::load();
    if (!root.IsMap())
      fail(root.Mark(), "", "a model file is a map with keys name, parts, traffic");
    check_keys(root, "", {"name", "parts", "traffic"});
    if (!root["parts"]) fail(root.Mark(), "parts", "is required");
    read_parts(root["parts"]);
    const auto n = static_cast<std::size_t>(m_.names.size());
    m_.traffic.assign(n * n, 0.0);
    if (root["traffic"]) read_traffic(root["traffic"]);
    return std::move(m_);
  }

 private:
  std::int64_t size(const YAML::Node& n, const std::string& key) const {
    std::int64_t v = 0;
    if (!cfg::parse_size(scalar(n, key), &v) || v < 0)
      fail(n.Mark(), key,
           fmt::format("must be a size in bytes (4096, 64M, 2G), got '{}'", n.Scalar()));
    return v;
  }

  void read_parts(const YAML::Node& parts) {
    if (!parts.IsSequence() || parts.size() == 0)
      fail(parts.Mark(), "parts", "must be a non-empty list");
    std::set<std::string> seen;
    for (std::size_t k = 0; k < parts.size(); ++k) {
      const YAML::Node pn = parts[k];
      const std::string path = fmt::format("parts[{}]", k);
      if (!pn.IsMap()) fail(pn.Mark(), path, "must be a map with name (and memory, count)");
      check_keys(pn, path + ".", {"name", "count", "memory"});
      if (!pn["name"]) fail(pn.Mark(), path + ".name", "is required");
      const std::string name = scalar(pn["name"], path + ".name");
      int count = 1;
      if (pn["count"]) {
        std::int64_t c = 0;
        if (!cfg::parse_int(scalar(pn["count"], path + ".count"), &c) || c < 1 || c > kMaxParts)
          fail(pn["count"].Mark(), path + ".count", fmt::format("must be in 1..{}", kMaxParts));
        count = static_cast<int>(c);
      }
      const std::uint64_t memory =
          pn["memory"] ? static_cast<std::uint64_t>(size(pn["memory"], path + ".memory")) : 0;
      for (int c = 0; c < count; ++c) {
        const std::string full = count > 1 || pn["count"] ? fmt::format("{}{}", name, c) : name;
        if (!seen.insert(full).second)
          fail(pn["name"].Mark(), path + ".name", fmt::format("part '{}' is defined twice", full));
        m_.names.push_back(full);
        m_.memory.push_back(memory);
      }
      if (m_.names.size() > static_cast<std::size_t>(kMaxParts))
        fail(pn.Mark(), path, fmt::format("more than {} parts", kMaxParts));
    }
  }

  std::vector<int> parts_matching(const YAML::Node& n, const std::string& key) const {
    const std::string pattern = scalar(n, key);
    std::vector<int> out;
    for (std::size_t i = 0; i < m_.names.size(); ++i)
      if (fnmatch(pattern.c_str(), m_.names[i].c_str(), 0) == 0) out.push_back(static_cast<int>(i));
    if (out.empty())
      fail(n.Mark(), key,
           fmt::format("'{}' names no part (a part name or a glob like 'layer*')", pattern));
    return out;
  }

  void read_traffic(const YAML::Node& traffic) {
    if (!traffic.IsSequence()) fail(traffic.Mark(), "traffic", "must be a list");
    const std::size_t n = m_.names.size();
    for (std::size_t k = 0; k < traffic.size(); ++k) {
      const YAML::Node tn = traffic[k];
      const std::string path = fmt::format("traffic[{}]", k);
      if (!tn.IsMap()) fail(tn.Mark(), path, "must be a map with between (or from, to) and bytes");
      check_keys(tn, path + ".", {"between", "from", "to", "bytes"});
      if (!tn["bytes"]) fail(tn.Mark(), path + ".bytes", "is required");
      const double bytes = static_cast<double>(size(tn["bytes"], path + ".bytes"));
      std::set<std::pair<int, int>> pairs;  // each ordered pair once per entry
      if (tn["between"]) {
        const YAML::Node b = tn["between"];
        if (!b.IsSequence() || b.size() != 2)
          fail(b.Mark(), path + ".between", "must name two parts (or globs): [A, B]");
        const auto as = parts_matching(b[0], path + ".between[0]");
        const auto bs = parts_matching(b[1], path + ".between[1]");
        for (int x : as)
          for (int y : bs)
            if (x != y) {
              pairs.emplace(x, y);
              pairs.emplace(y, x);
            }
      } else {
        if (!tn["from"] || !tn["to"])
          fail(tn.Mark(), path, "needs between: [A, B], or from: and to:");
        const auto fs = parts_matching(tn["from"], path + ".from");
        const auto ts = parts_matching(tn["to"], path + ".to");
        for (int x : fs)
          for (int y : ts)
            if (x != y) pairs.emplace(x, y);
      }
      for (const auto& [x, y] : pairs)
        m_.traffic[static_cast<std::size_t>(x) * n + static_cast<std::size_t>(y)] += bytes;
    }
  }

  ModelFile m_;
};

}  // namespace

ModelFile load_model_yaml(const std::string& path) { return ModelReader(path).load(); }

}  // namespace wia::place
