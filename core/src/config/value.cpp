// SPDX-License-Identifier: Apache-2.0
// Value rules shared by core keys and provider parameters (schema.hpp).
#include <fmt/core.h>

#include <algorithm>
#include <cctype>
#include <charconv>

#include "common/utf8.hpp"
#include "config/schema.hpp"
#include "wia_common/text.hpp"

namespace wia::cfg {

namespace {

using common::trim;

bool iequals(std::string_view a, std::string_view b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return std::tolower(static_cast<unsigned char>(x)) ==
                  std::tolower(static_cast<unsigned char>(y));
         });
}

std::string range_text(const Spec& spec) {
  auto show = [&](std::int64_t v) {
    return spec.type == ValueType::kSize ? format_size(v) : std::to_string(v);
  };
  if (spec.min_value != kNoMin && spec.max_value != kNoMax)
    return fmt::format("must be between {} and {}", show(spec.min_value), show(spec.max_value));
  if (spec.min_value != kNoMin) return fmt::format("must be at least {}", show(spec.min_value));
  return fmt::format("must be at most {}", show(spec.max_value));
}

std::string join(const std::vector<std::string>& items, std::string_view sep) {
  std::string out;
  for (const auto& item : items) {
    if (!out.empty()) out += sep;
    out += item;
  }
  return out;
}

}  // namespace

const char* type_phrase(ValueType type) {
  switch (type) {
    case ValueType::kInt:
      return "an integer";
    case ValueType::kSize:
      return "a size in bytes (e.g. 4096, 64K, 4M, 1G)";
    case ValueType::kBool:
      return "a boolean (true/false, yes/no, 1/0)";
    case ValueType::kString:
      return "a string";
    case ValueType::kEnum:
      return "one of the allowed names";
    case ValueType::kList:
      return "a list of strings";
  }
  return "a value";
}

const char* type_name(ValueType type) {
  switch (type) {
    case ValueType::kInt:
      return "int";
    case ValueType::kSize:
      return "size";
    case ValueType::kBool:
      return "bool";
    case ValueType::kString:
      return "string";
    case ValueType::kEnum:
      return "enum";
    case ValueType::kList:
      return "list";
  }
  return "?";
}

Spec Spec::from(const KeySpec& row) {
  Spec spec;
  spec.key = row.key;
  spec.type = row.type;
  spec.default_value = row.default_value;
  spec.description = row.description;
  spec.min_value = row.min_value;
  spec.max_value = row.max_value;
  std::string_view rest = row.allowed;
  while (!rest.empty()) {
    std::size_t bar = rest.find('|');
    spec.allowed.emplace_back(rest.substr(0, bar));
    rest = bar == std::string_view::npos ? std::string_view{} : rest.substr(bar + 1);
  }
  return spec;
}

bool parse_int(std::string_view text, std::int64_t* value) {
  text = trim(text);
  // from_chars rejects a leading '+', which people do write ("+1").
  if (text.size() > 1 && text.front() == '+' && text[1] != '-') text.remove_prefix(1);
  if (text.empty()) return false;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), *value);
  return ec == std::errc{} && end == text.data() + text.size();
}

bool parse_size(std::string_view text, std::int64_t* bytes) {
  // One grammar for the whole project (wia_common/text.hpp); the schema's
  // values are signed, so sizes stop at INT64_MAX here.
  std::uint64_t number = 0;
  if (!common::parse_size(text, &number) || number > static_cast<std::uint64_t>(kNoMax))
    return false;
  *bytes = static_cast<std::int64_t>(number);
  return true;
}

bool parse_bool(std::string_view text, bool* value) {
  text = trim(text);
  for (std::string_view yes : {"true", "yes", "1"}) {
    if (iequals(text, yes)) {
      *value = true;
      return true;
    }
  }
  for (std::string_view no : {"false", "no", "0"}) {
    if (iequals(text, no)) {
      *value = false;
      return true;
    }
  }
  return false;
}

std::string format_size(std::int64_t bytes) {
  if (bytes == 0) return "0";
  constexpr std::pair<unsigned, char> kUnits[] = {{40, 'T'}, {30, 'G'}, {20, 'M'}, {10, 'K'}};
  for (auto [shift, unit] : kUnits) {
    std::int64_t mask = (std::int64_t{1} << shift) - 1;
    if ((bytes & mask) == 0) return fmt::format("{}{}", bytes >> shift, unit);
  }
  return std::to_string(bytes);
}

Value make_list(std::vector<std::string> items) {
  Value value;
  std::erase_if(items, [](const std::string& s) { return s.empty(); });
  value.text = join(items, ",");
  value.items = std::move(items);
  return value;
}

bool parse_value(const Spec& spec, std::string_view text, Value* out, std::string* why) {
  // YAML holds Unicode: a value that is not UTF-8 would be written back
  // (wia-info --config, the effective configuration) as other text
  // (yaml-cpp turns the bad bytes into U+FFFD). Found by fuzz_config.
  if (const std::size_t bad = first_invalid_utf8(text); bad != std::string_view::npos) {
    *why = fmt::format("is not valid UTF-8 (byte {} of {})", bad, text.size());
    return false;
  }
  Value value;
  switch (spec.type) {
    case ValueType::kInt:
    case ValueType::kSize: {
      bool ok = spec.type == ValueType::kInt ? parse_int(text, &value.number)
                                             : parse_size(text, &value.number);
      if (!ok) {
        *why = fmt::format("expected {}", type_phrase(spec.type));
        return false;
      }
      if (value.number < spec.min_value || value.number > spec.max_value) {
        *why = "out of range: " + range_text(spec);
        return false;
      }
      value.text = std::to_string(value.number);
      break;
    }
    case ValueType::kBool:
      if (!parse_bool(text, &value.flag)) {
        *why = fmt::format("expected {}", type_phrase(spec.type));
        return false;
      }
      value.text = value.flag ? "true" : "false";
      break;
    case ValueType::kString:
      value.text = text;
      break;
    case ValueType::kEnum: {
      auto it = std::find_if(spec.allowed.begin(), spec.allowed.end(),
                             [&](const std::string& a) { return iequals(trim(text), a); });
      if (it == spec.allowed.end()) {
        *why = "expected one of " + join(spec.allowed, ", ");
        return false;
      }
      value.text = *it;
      break;
    }
    case ValueType::kList: {
      std::vector<std::string> items;
      std::size_t start = 0;
      for (std::size_t i = 0; i <= text.size(); ++i) {
        if (i == text.size() || text[i] == ',' || text[i] == ':') {
          items.emplace_back(trim(text.substr(start, i - start)));
          start = i + 1;
        }
      }
      value = make_list(std::move(items));
      break;
    }
  }
  *out = std::move(value);
  return true;
}

std::string env_var_name(std::string_view key_path) {
  std::string name = "WIA_";
  for (char c : key_path)
    name += (c == '.' || c == '-') ? '_'
                                   : static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return name;
}

std::size_t edit_distance(std::string_view a, std::string_view b) {
  // Three rolling rows: the transposition step looks two rows back.
  std::vector<std::size_t> prev2(b.size() + 1), prev(b.size() + 1), cur(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      std::size_t cost = a[i - 1] == b[j - 1] ? 0 : 1;
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + cost});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1])
        cur[j] = std::min(cur[j], prev2[j - 2] + 1);
    }
    std::swap(prev2, prev);
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

std::string closest_match(std::string_view wrong, std::span<const std::string> candidates) {
  const std::string* best = nullptr;
  std::size_t best_distance = 0;
  for (const auto& candidate : candidates) {
    std::size_t d = edit_distance(wrong, candidate);
    if (best == nullptr || d < best_distance) {
      best = &candidate;
      best_distance = d;
    }
  }
  // Up to three edits, and no more than a third of the candidate: close
  // enough to be a slip of the fingers, far enough from a different word.
  if (best == nullptr || best_distance == 0 || best_distance > 3 ||
      best_distance * 3 > best->size())
    return {};
  return *best;
}

}  // namespace wia::cfg
