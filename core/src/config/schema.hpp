// SPDX-License-Identifier: Apache-2.0
// The configuration schema: the table of core keys (schema.cpp) and the
// rules that turn text into a validated, typed value. Provider parameters
// (wia_param_decl_v1_t) are converted to the same Spec, so core keys and
// provider keys obey exactly one set of rules.
#pragma once

#include <wia/provider.h>

#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace wia::cfg {

enum class ValueType {
  kInt,     // signed 64-bit decimal, bounded by [min_value, max_value]
  kSize,    // bytes; "4096", "64K", "4M", "1G", "2T" (binary multiples)
  kBool,    // true/false, yes/no, 1/0 (any case)
  kString,  // free text
  kEnum,    // one of `allowed` (any case in input, canonical spelling kept)
  kList,    // strings; YAML sequence, or text separated by ',' or ':'
};

// "an integer", "a size", ... as used in "expected an integer".
const char* type_phrase(ValueType type);
// "int", "size", "bool", "string", "enum", "list" for tables and docs.
const char* type_name(ValueType type);

constexpr std::int64_t kNoMin = std::numeric_limits<std::int64_t>::min();
constexpr std::int64_t kNoMax = std::numeric_limits<std::int64_t>::max();

// One row of the core schema table. Plain literals, so the table is a
// constexpr array that reads like documentation.
struct KeySpec {
  std::string_view key;  // dotted path: "log.level"
  ValueType type;
  std::string_view default_value;   // text form; must itself be valid
  std::string_view description;     // one line, shown by wia-info --config
  std::string_view allowed = {};    // kEnum only: "error|warn|info"
  std::int64_t min_value = kNoMin;  // kInt/kSize only, inclusive
  std::int64_t max_value = kNoMax;  // kInt/kSize only, inclusive
};

// The compiled-in core keys, in table order.
std::span<const KeySpec> core_schema();

// Keys whose value is a YAML structure (e.g. selector.rules, a list of
// mappings) that the subsystem owning it validates: the loader only keeps
// the node, marks included, so that subsystem can name file:line:column.
// Their section must also hold at least one KeySpec row. No environment
// variable sets them.
struct StructuredKeySpec {
  std::string_view key;
  std::string_view description;
};
std::span<const StructuredKeySpec> structured_schema();

// Runtime form of a key, owning its strings (provider declarations point
// into a shared object that may be unloaded before the Config dies).
struct Spec {
  std::string key;  // full dotted path, provider keys prefixed: "host.devices"
  ValueType type = ValueType::kString;
  std::string default_value;
  std::string description;
  std::vector<std::string> allowed;  // kEnum
  std::int64_t min_value = kNoMin;
  std::int64_t max_value = kNoMax;

  static Spec from(const KeySpec& row);
};

// A validated value. `text` is canonical: decimal integers, sizes in bytes,
// "true"/"false", the enum's own spelling, list items joined with ','.
struct Value {
  std::string text;
  std::int64_t number = 0;         // kInt, kSize
  bool flag = false;               // kBool
  std::vector<std::string> items;  // kList
};

// Validates `text` against `spec`. Returns false and sets *why to the
// reason ("expected an integer", "out of range: must be between 0 and 64",
// "expected one of error, warn") when invalid. Lists are split on ',' and
// ':'; empty items are dropped.
bool parse_value(const Spec& spec, std::string_view text, Value* out, std::string* why);
// Same for a list given item by item (a YAML sequence).
Value make_list(std::vector<std::string> items);

// Parsers behind parse_value, exposed for tests and for code that reads a
// size or boolean outside the schema.
bool parse_int(std::string_view text, std::int64_t* value);
bool parse_size(std::string_view text, std::int64_t* bytes);
bool parse_bool(std::string_view text, bool* value);
// Largest exact binary suffix: 1048576 -> "1M", 1000 -> "1000".
std::string format_size(std::int64_t bytes);

// "WIA_" + path upper-cased, '.' and '-' -> '_': log.level -> WIA_LOG_LEVEL.
std::string env_var_name(std::string_view key_path);

// Optimal-string-alignment (restricted Damerau-Levenshtein) distance: the
// edit count with adjacent transpositions, the usual typo model.
std::size_t edit_distance(std::string_view a, std::string_view b);
// The candidate closest to `wrong` when it is close enough to be a likely
// typo, else empty.
std::string closest_match(std::string_view wrong, std::span<const std::string> candidates);

}  // namespace wia::cfg
