// SPDX-License-Identifier: Apache-2.0
// Reading selector rules from the configuration (schema: docs/selector.md).
// Every error names file:line:column and the key path, like the topology
// files and the rest of the configuration.
#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <initializer_list>
#include <set>

#include "common/error.hpp"
#include "common/log.hpp"
#include "config/schema.hpp"
#include "selector/selector.hpp"

namespace wia::selector {

namespace {

constexpr std::size_t kMaxGroups = 64;  // group membership is a 64-bit mask

struct ClassName {
  const char* name;
  ClassMask mask;
};
constexpr ClassName kClassNames[] = {
    {"same_process", class_bit(LinkClass::kSameProcess)},
    {"same_numa", class_bit(LinkClass::kSameNuma)},
    {"cross_numa", class_bit(LinkClass::kCrossNuma)},
    {"same_node", class_bit(LinkClass::kSameNuma) | class_bit(LinkClass::kCrossNuma)},
    {"inter_process", kAllClasses & ~class_bit(LinkClass::kSameProcess)},
    {"different_nodes", class_bit(LinkClass::kDifferentNodes)},
    {"any", kAllClasses},
};

std::string class_list() {
  std::string s;
  for (const auto& c : kClassNames) s += (s.empty() ? "" : ", ") + std::string(c.name);
  return s;
}

const ClassName* find_class(std::string_view name) {
  for (const auto& c : kClassNames)
    if (name == c.name) return &c;
  return nullptr;
}

std::vector<std::string> known_transports(const TransportAvailability* available) {
  std::vector<std::string> names(std::begin(kBuiltinTransports), std::end(kBuiltinTransports));
  if (available != nullptr)
    for (const auto& [name, state] : available->states())
      if (state.loaded && std::find(names.begin(), names.end(), name) == names.end())
        names.push_back(name);
  return names;
}

// "unknown transport 'tpc' (available: ...); did you mean 'tcp'?"
std::string unknown_transport(const std::string& name, const std::vector<std::string>& known) {
  std::string list;
  for (const auto& k : known) list += (list.empty() ? "" : ", ") + k;
  std::string text = fmt::format("unknown transport '{}' (available: {})", name, list);
  const std::string near = cfg::closest_match(name, known);
  if (!near.empty()) text += fmt::format("; did you mean '{}'?", near);
  return text;
}

void add_default_rules(RuleSet* rs) {
  auto rule = [&](ClassMask classes, const char* label, std::initializer_list<const char*> ts) {
    Rule r;
    r.name = fmt::format("default ({})", label);
    r.where = "default";
    r.match.classes = classes;
    for (const char* t : ts) r.transports.push_back(TransportPref{t, {}});
    r.is_default = true;
    rs->rules.push_back(std::move(r));
  };
  rule(class_bit(LinkClass::kSameProcess), "same_process", {"p2p", "shm", "tcp"});
  rule(class_bit(LinkClass::kSameNuma) | class_bit(LinkClass::kCrossNuma), "same_node",
       {"shm", "tcp"});
  rule(class_bit(LinkClass::kDifferentNodes), "different_nodes", {"verbs", "ofi", "tcp"});
}

class RuleReader {
 public:
  RuleReader(std::string file, std::vector<std::string> known)
      : file_(std::move(file)), known_(std::move(known)) {}

  void groups(const YAML::Node& node, RuleSet* rs) {
    const std::string key = "selector.groups";
    if (node.IsNull()) return;
    if (!node.IsMap())
      fail(node.Mark(), key, "must be a mapping of group names to {nodes: [...], devices: [...]}");
    for (const auto& kv : node) {
      const YAML::Node name_node = kv.first;
      const YAML::Node body = kv.second;
      Group g;
      g.name = scalar(name_node, key);
      g.where = where(name_node.Mark());
      const std::string path = key + "." + g.name;
      for (const auto& other : rs->groups)
        if (other.name == g.name)
          fail(name_node.Mark(), path,
               fmt::format("group defined twice (first at {})", other.where));
      if (!body.IsMap())
        fail(body.Mark(), path,
             "must be a mapping with nodes and/or devices (lists of names or "
             "glob patterns)");
      check_keys(body, path, {"nodes", "devices"});
      if (body["nodes"]) g.node_patterns = names(body["nodes"], path + ".nodes");
      if (body["devices"]) g.device_patterns = names(body["devices"], path + ".devices");
      if (g.node_patterns.empty() && g.device_patterns.empty())
        fail(body.Mark(), path, "names no nodes and no devices");
      if (rs->groups.size() == kMaxGroups)
        fail(name_node.Mark(), path, fmt::format("more than {} groups", kMaxGroups));
      rs->groups.push_back(std::move(g));
    }
  }

  void rules(const YAML::Node& node, RuleSet* rs) {
    const std::string key = "selector.rules";
    if (node.IsNull()) return;
    if (!node.IsSequence())
      fail(node.Mark(), key, "must be a list of rules, each {match: ..., transports: [...]}");
    for (std::size_t k = 0; k < node.size(); ++k) {
      const YAML::Node rn = node[k];
      const std::string path = fmt::format("{}[{}]", key, k);
      if (!rn.IsMap()) fail(rn.Mark(), path, "must be a mapping with match and transports");
      check_keys(rn, path, {"name", "match", "transports", "compress"});
      if (!rn["transports"]) fail(rn.Mark(), path + ".transports", "is required");
      Rule r;
      r.where = where(rn.Mark());
      r.name = rn["name"] ? scalar(rn["name"], path + ".name") : fmt::format("rule {}", k + 1);
      if (rn["match"]) r.match = match(rn["match"], path + ".match", *rs);
      r.transports = transports(rn["transports"], path + ".transports");
      if (rn["compress"]) r.compress = compress(rn["compress"], path + ".compress", r.match);
      rs->rules.push_back(std::move(r));
    }
  }

 private:
  // compress: {method: int8|bf16|auto, when: "bandwidth < 10GB/s"}, on a
  // rule that can decide links between nodes (the compressed all-reduce
  // compresses only what crosses between hosts).
  LinkCompress compress(const YAML::Node& n, const std::string& key, const Match& m) const {
    if (!n.IsMap())
      fail(n.Mark(), key,
           "must be a mapping {method: int8|bf16|auto, when: \"bandwidth < 10GB/s\"}");
    check_keys(n, key, {"method", "when"});
    if (!n["method"]) fail(n.Mark(), key + ".method", "is required (int8, bf16 or auto)");
    LinkCompress c;
    c.where = where(n.Mark());
    c.method = scalar(n["method"], key + ".method");
    if (c.method != "int8" && c.method != "bf16" && c.method != "auto") {
      const std::vector<std::string> methods = {"int8", "bf16", "auto"};
      const std::string near = cfg::closest_match(c.method, methods);
      fail(n["method"].Mark(), key + ".method",
           fmt::format("'{}' is not int8, bf16 or auto{}", c.method,
                       near.empty() ? "" : fmt::format("; did you mean '{}'?", near)));
    }
    if ((m.classes & class_bit(LinkClass::kDifferentNodes)) == 0)
      fail(n.Mark(), key,
           "applies only to links between nodes, and this rule's match has no "
           "different_nodes link");
    if (n["when"]) c.below_gbps = bandwidth_below(n["when"], key + ".when");
    return c;
  }
  // "bandwidth < 10GB/s" (also Gb/s, Gbit/s, MB/s, Mb/s, Mbit/s): GB/s.
  double bandwidth_below(const YAML::Node& n, const std::string& key) const {
    const std::string text = scalar(n, key);
    char unit[16] = {};
    double v = 0;
    int used = 0;
    const bool parsed =
        std::sscanf(text.c_str(), " bandwidth < %lf %15[A-Za-z/]%n", &v, unit, &used) == 2 &&
        static_cast<std::size_t>(used) == text.size();
    const std::string u = unit;
    const double scale = u == "GB/s"                    ? 1.0
                         : u == "Gb/s" || u == "Gbit/s" ? 1.0 / 8
                         : u == "MB/s"                  ? 1e-3
                         : u == "Mb/s" || u == "Mbit/s" ? 1e-3 / 8
                                                        : 0.0;
    if (!parsed || scale == 0.0 || !(v > 0))
      fail(n.Mark(), key,
           fmt::format("'{}' is not \"bandwidth < N UNIT\" with N > 0 and UNIT one of GB/s, "
                       "Gb/s, Gbit/s, MB/s, Mb/s, Mbit/s",
                       text));
    return v * scale;
  }
  std::string where(const YAML::Mark& m) const {
    if (m.is_null()) return file_;
    return fmt::format("{}:{}:{}", file_, m.line + 1, m.column + 1);
  }
  [[noreturn]] void fail(const YAML::Mark& m, const std::string& key,
                         const std::string& what) const {
    throw Error(WIA_ERROR_CONFIG, fmt::format("{}: key '{}': {}", where(m), key, what));
  }
  std::string scalar(const YAML::Node& n, const std::string& key) const {
    if (!n.IsScalar()) fail(n.Mark(), key, "must be a single value");
    return n.Scalar();
  }
  void check_keys(const YAML::Node& map, const std::string& path,
                  std::initializer_list<const char*> allowed) const {
    std::set<std::string> seen;
    for (const auto& kv : map) {
      const std::string key = scalar(kv.first, path);
      bool ok = false;
      for (const char* a : allowed) ok = ok || key == a;
      if (!ok) {
        std::string list;
        std::vector<std::string> cands;
        for (const char* a : allowed) {
          list += (list.empty() ? "" : ", ") + std::string(a);
          cands.emplace_back(a);
        }
        const std::string near = cfg::closest_match(key, cands);
        fail(kv.first.Mark(), path + "." + key,
             fmt::format("unknown key (expected one of: {}){}", list,
                         near.empty() ? "" : fmt::format("; did you mean '{}'?", near)));
      }
      if (!seen.insert(key).second) fail(kv.first.Mark(), path + "." + key, "given twice");
    }
  }
  std::vector<std::string> names(const YAML::Node& n, const std::string& key) const {
    std::vector<std::string> out;
    if (n.IsScalar()) {
      out.push_back(n.Scalar());
      return out;
    }
    if (!n.IsSequence()) fail(n.Mark(), key, "must be a name or a list of names");
    for (std::size_t i = 0; i < n.size(); ++i)
      out.push_back(scalar(n[i], fmt::format("{}[{}]", key, i)));
    return out;
  }

  int group_ref(const YAML::Node& n, const std::string& key, const RuleSet& rs) const {
    const std::string name = scalar(n, key);
    for (std::size_t g = 0; g < rs.groups.size(); ++g)
      if (rs.groups[g].name == name) return static_cast<int>(g);
    std::vector<std::string> all;
    std::string list;
    for (const auto& g : rs.groups) {
      all.push_back(g.name);
      list += (list.empty() ? "" : ", ") + g.name;
    }
    const std::string near = cfg::closest_match(name, all);
    fail(n.Mark(), key,
         fmt::format("no group '{}' under selector.groups ({}){}", name,
                     list.empty() ? "none defined" : "defined: " + list,
                     near.empty() ? "" : fmt::format("; did you mean '{}'?", near)));
  }

  ClassMask classes(const YAML::Node& n, const std::string& key) const {
    ClassMask mask = 0;
    const std::vector<std::string> list = names(n, key);
    if (list.empty()) fail(n.Mark(), key, "names no link class");
    for (const auto& name : list) {
      const ClassName* c = find_class(name);
      if (c == nullptr) {
        std::vector<std::string> all;
        for (const auto& k : kClassNames) all.emplace_back(k.name);
        const std::string near = cfg::closest_match(name, all);
        fail(n.Mark(), key,
             fmt::format("'{}' is not a link class ({}){}", name, class_list(),
                         near.empty() ? "" : fmt::format("; did you mean '{}'?", near)));
      }
      mask = static_cast<ClassMask>(mask | c->mask);
    }
    return mask;
  }

  Match match(const YAML::Node& n, const std::string& key, const RuleSet& rs) const {
    Match m;
    if (n.IsScalar()) {  // shorthand: match: same_process
      m.classes = classes(n, key);
      return m;
    }
    if (!n.IsMap())
      fail(n.Mark(), key,
           fmt::format("must be a link class ({}) or a mapping with class, peer, within, "
                       "between",
                       class_list()));
    check_keys(n, key, {"class", "peer", "within", "between"});
    if (n["class"]) m.classes = classes(n["class"], key + ".class");
    if (n["peer"]) {
      if (!n["peer"].IsScalar()) fail(n["peer"].Mark(), key + ".peer", "must be true or false");
      bool v = false;
      if (!cfg::parse_bool(n["peer"].Scalar(), &v))
        fail(n["peer"].Mark(), key + ".peer",
             fmt::format("must be true or false, got '{}'", n["peer"].Scalar()));
      m.peer = v;
    }
    if (n["within"]) m.within = group_ref(n["within"], key + ".within", rs);
    if (n["between"]) {
      const YAML::Node b = n["between"];
      if (!b.IsSequence() || b.size() != 2)
        fail(b.Mark(), key + ".between", "must name two groups: [A, B]");
      m.between_a = group_ref(b[0], key + ".between[0]", rs);
      m.between_b = group_ref(b[1], key + ".between[1]", rs);
    }
    return m;
  }

  std::vector<TransportPref> transports(const YAML::Node& n, const std::string& key) const {
    std::vector<TransportPref> out;
    if (n.IsScalar()) {
      out.push_back(TransportPref{transport_name(n, key), {}});
      return out;
    }
    if (!n.IsSequence() || n.size() == 0)
      fail(n.Mark(), key, "must be a non-empty list of transports, e.g. [shm, tcp]");
    for (std::size_t i = 0; i < n.size(); ++i) {
      const YAML::Node item = n[i];
      const std::string path = fmt::format("{}[{}]", key, i);
      TransportPref pref;
      if (item.IsScalar()) {
        pref.name = transport_name(item, path);
      } else if (item.IsMap() && item.size() == 1) {
        // "- tcp: {streams: 4}": the transport with its options.
        const auto kv = *item.begin();
        const YAML::Node name = kv.first;
        const YAML::Node opts = kv.second;
        pref.name = transport_name(name, path);
        if (!opts.IsNull()) {
          if (!opts.IsMap())
            fail(opts.Mark(), path + "." + pref.name, "options must be a mapping of key: value");
          for (const auto& o : opts) {
            const YAML::Node ok = o.first;
            const YAML::Node ov = o.second;
            const std::string okey = scalar(ok, path + "." + pref.name);
            const std::string opath = path + "." + pref.name + "." + okey;
            if (!ov.IsScalar()) fail(ov.Mark(), opath, "an option value must be a single value");
            if (!pref.options.emplace(okey, ov.Scalar()).second)
              fail(ok.Mark(), opath, "given twice");
          }
        }
      } else {
        fail(item.Mark(), path, "must be a transport name, or 'name: {option: value, ...}'");
      }
      for (const auto& prev : out)
        if (prev.name == pref.name)
          fail(item.Mark(), path, fmt::format("transport '{}' listed twice", pref.name));
      out.push_back(std::move(pref));
    }
    return out;
  }

  std::string transport_name(const YAML::Node& n, const std::string& key) const {
    const std::string name = scalar(n, key);
    if (std::find(known_.begin(), known_.end(), name) == known_.end())
      fail(n.Mark(), key, unknown_transport(name, known_));
    return name;
  }

  std::string file_;
  std::vector<std::string> known_;
};

// selector.transport / WIA_TRANSPORT: "tcp" (every inter-process link) or
// "class=transport" items.
void add_forced(const std::vector<std::string>& items, const std::string& source,
                const std::vector<std::string>& known, RuleSet* rs) {
  std::vector<Rule> forced;
  for (const auto& item : items) {
    Rule r;
    r.where = source;
    r.passes_on = false;
    std::string cls = "inter_process", name = item;
    if (const auto eq = item.find('='); eq != std::string::npos) {
      cls = item.substr(0, eq);
      name = item.substr(eq + 1);
    }
    const ClassName* c = find_class(cls);
    if (c == nullptr)
      throw Error(WIA_ERROR_CONFIG, fmt::format("{}: '{}': '{}' is not a link class ({})", source,
                                                item, cls, class_list()));
    if (std::find(known.begin(), known.end(), name) == known.end())
      throw Error(WIA_ERROR_CONFIG,
                  fmt::format("{}: '{}': {}", source, item, unknown_transport(name, known)));
    r.name = fmt::format("forced {}={}", cls, name);
    r.match.classes = c->mask;
    r.transports.push_back(TransportPref{name, {}});
    forced.push_back(std::move(r));
  }
  rs->rules.insert(rs->rules.begin(), forced.begin(), forced.end());
}

}  // namespace

std::size_t RuleSet::user_rules() const {
  return static_cast<std::size_t>(
      std::count_if(rules.begin(), rules.end(), [](const Rule& r) { return !r.is_default; }));
}

RuleSet default_rules() {
  RuleSet rs;
  add_default_rules(&rs);
  return rs;
}

RuleSet load_rules(const Config& config, const TransportAvailability* available,
                   const EnvLookup& env) {
  RuleSet rs;
  const std::vector<std::string> known = known_transports(available);
  const YAML::Node* groups = config.structured("selector.groups");
  const YAML::Node* rules = config.structured("selector.rules");
  if (groups != nullptr || rules != nullptr) {
    rs.source = config.file();
    RuleReader reader(config.file(), known);
    if (groups != nullptr) reader.groups(*groups, &rs);
    if (rules != nullptr) reader.rules(*rules, &rs);
  }
  // WIA_TRANSPORT (NCCL_NET style) overrides selector.transport.
  const char* quick = env ? env("WIA_TRANSPORT") : nullptr;
  if (quick != nullptr && *quick != '\0') {
    cfg::Spec spec;
    spec.type = cfg::ValueType::kList;
    cfg::Value v;
    std::string why;
    cfg::parse_value(spec, quick, &v, &why);
    add_forced(v.items, "env WIA_TRANSPORT", known, &rs);
  } else {
    const auto items = config.get_list("selector.transport");
    if (!items.empty()) add_forced(items, config.get("selector.transport").source, known, &rs);
  }
  add_default_rules(&rs);
  return rs;
}

RuleSet load_rules_or_defaults(const Config& config, const TransportAvailability* available,
                               const EnvLookup& env) {
  try {
    return load_rules(config, available, env);
  } catch (const Error& e) {
    RuleSet rs = default_rules();
    rs.fallback_reason = e.what();
    log::warn("selector", "transport rules rejected, using the defaults instead: {}", e.what());
    return rs;
  }
}

}  // namespace wia::selector
