// SPDX-License-Identifier: Apache-2.0
// The one implementation of the shared text helpers (wia_common/text.hpp).
#include "wia_common/text.hpp"

#include <cctype>
#include <charconv>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <limits>
#include <utility>

namespace wia::common {

namespace {

bool iequals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (std::tolower(static_cast<unsigned char>(a[i])) !=
        std::tolower(static_cast<unsigned char>(b[i])))
      return false;
  return true;
}

bool fail(std::string* why, std::string reason) {
  if (why != nullptr) *why = std::move(reason);
  return false;
}

}  // namespace

std::string format(const char* fmt, ...) {
  char buf[1024];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(buf, sizeof(buf), fmt, ap);
  va_end(ap);
  return buf;
}

bool parse_size(std::string_view text, std::uint64_t* bytes, std::string* why) {
  text = trim(text);
  if (text.empty()) return fail(why, "empty");
  if (text.front() == '-') return fail(why, "negative");
  if (text.front() < '0' || text.front() > '9') return fail(why, "expected decimal digits");
  std::uint64_t number = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), number);
  if (ec == std::errc::result_out_of_range) return fail(why, "too large");
  if (ec != std::errc{}) return fail(why, "expected decimal digits");
  std::string_view suffix = text.substr(static_cast<std::size_t>(end - text.data()));
  // Memory sizes are binary throughout the field (NCCL_BUFFSIZE, ulimit):
  // K = 1024. "KB" and "KiB" are accepted as the same thing.
  unsigned shift = 0;
  if (!suffix.empty()) {
    switch (std::toupper(static_cast<unsigned char>(suffix.front()))) {
      case 'K':
        shift = 10;
        break;
      case 'M':
        shift = 20;
        break;
      case 'G':
        shift = 30;
        break;
      case 'T':
        shift = 40;
        break;
      case 'B':
        break;
      default:
        return fail(why, "unknown suffix '" + std::string(suffix) + "' (expected K, M, G or T)");
    }
    std::string_view rest = shift != 0 ? suffix.substr(1) : suffix;
    if (!rest.empty() && !iequals(rest, "B") && !(shift != 0 && iequals(rest, "iB")))
      return fail(why, "unknown suffix '" + std::string(suffix) + "' (expected K, M, G or T)");
  }
  if (number > (std::numeric_limits<std::uint64_t>::max() >> shift)) return fail(why, "too large");
  *bytes = number << shift;
  return true;
}

std::string errno_text(int err) {
  char buf[128];
  // GNU strerror_r returns the message pointer, which may or may not be buf.
  const char* s = strerror_r(err, buf, sizeof(buf));
  return std::string(s) + " (errno " + std::to_string(err) + ")";
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

}  // namespace wia::common
