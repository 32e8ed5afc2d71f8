// SPDX-License-Identifier: Apache-2.0
// Logging for the core: spdlog behind a narrow interface, so only log.cpp
// includes spdlog. Each line carries a subsystem tag ("loader", "config",
// "host", ...). Providers log through host services, which land here with
// the provider's name as tag.
#pragma once

#include <fmt/core.h>

#include <string>
#include <string_view>

namespace wia::log {

enum class Level { trace = 0, debug = 1, info = 2, warn = 3, error = 4, off = 5 };

// Parse "error|warn|info|debug|trace|off"; false for anything else.
bool parse_level(std::string_view text, Level* level);
const char* level_name(Level level);

// (Re)configure: threshold and optional file ("" = stderr). Thread-safe.
void configure(Level level, const std::string& file);
bool enabled(Level level);
void write(Level level, std::string_view tag, std::string_view message);

template <typename... Args>
void at(Level level, std::string_view tag, fmt::format_string<Args...> f, Args&&... args) {
  if (enabled(level)) write(level, tag, fmt::format(f, std::forward<Args>(args)...));
}
template <typename... Args>
void trace(std::string_view tag, fmt::format_string<Args...> f, Args&&... a) {
  at(Level::trace, tag, f, std::forward<Args>(a)...);
}
template <typename... Args>
void debug(std::string_view tag, fmt::format_string<Args...> f, Args&&... a) {
  at(Level::debug, tag, f, std::forward<Args>(a)...);
}
template <typename... Args>
void info(std::string_view tag, fmt::format_string<Args...> f, Args&&... a) {
  at(Level::info, tag, f, std::forward<Args>(a)...);
}
template <typename... Args>
void warn(std::string_view tag, fmt::format_string<Args...> f, Args&&... a) {
  at(Level::warn, tag, f, std::forward<Args>(a)...);
}
template <typename... Args>
void error(std::string_view tag, fmt::format_string<Args...> f, Args&&... a) {
  at(Level::error, tag, f, std::forward<Args>(a)...);
}

}  // namespace wia::log
