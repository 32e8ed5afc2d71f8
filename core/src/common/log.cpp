// SPDX-License-Identifier: Apache-2.0
// spdlog behind log.hpp. The logger is private: it is never registered in
// spdlog's global registry, so an application that uses spdlog itself keeps
// its own default logger, pattern and level untouched.
#include "common/log.hpp"

#include <fcntl.h>
#include <spdlog/logger.h>
#include <spdlog/pattern_formatter.h>
#include <spdlog/sinks/base_sink.h>
#include <unistd.h>

#include <atomic>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>

namespace wia::log {

namespace {

constexpr const char* kLevelNames[] = {"trace", "debug", "info", "warn", "error", "off"};
constexpr const char* kPattern = "[%Y-%m-%d %H:%M:%S.%e] [wia %P] [%*] %v";

spdlog::level::level_enum to_spdlog(Level level) {
  switch (level) {
    case Level::trace:
      return spdlog::level::trace;
    case Level::debug:
      return spdlog::level::debug;
    case Level::info:
      return spdlog::level::info;
    case Level::warn:
      return spdlog::level::warn;
    case Level::error:
      return spdlog::level::err;
    case Level::off:
      break;
  }
  return spdlog::level::off;
}

Level from_spdlog(spdlog::level::level_enum level) {
  switch (level) {
    case spdlog::level::trace:
      return Level::trace;
    case spdlog::level::debug:
      return Level::debug;
    case spdlog::level::info:
      return Level::info;
    case spdlog::level::warn:
      return Level::warn;
    case spdlog::level::err:
    case spdlog::level::critical:
      return Level::error;
    default:
      return Level::off;
  }
}

// spdlog's %l prints "warning"; users configure "warn", so the log shows
// the names they type in log.level.
class LevelFlag final : public spdlog::custom_flag_formatter {
 public:
  void format(const spdlog::details::log_msg& msg, const std::tm&,
              spdlog::memory_buf_t& dest) override {
    std::string_view name = level_name(from_spdlog(msg.level));
    dest.append(name.data(), name.data() + name.size());
  }
  std::unique_ptr<custom_flag_formatter> clone() const override {
    return std::make_unique<LevelFlag>();
  }
};

// Writes each formatted line with one write(2). With O_APPEND that keeps
// lines of several processes sharing one log file whole, and nothing sits
// in a stdio buffer when the process dies.
class FdSink final : public spdlog::sinks::base_sink<std::mutex> {
 public:
  FdSink(int fd, bool owned) : fd_(fd), owned_(owned) {}
  ~FdSink() override {
    if (owned_) ::close(fd_);
  }
  FdSink(const FdSink&) = delete;
  FdSink& operator=(const FdSink&) = delete;

 protected:
  void sink_it_(const spdlog::details::log_msg& msg) override {
    spdlog::memory_buf_t line;
    formatter_->format(msg, line);
    const char* p = line.data();
    std::size_t left = line.size();
    while (left > 0) {
      ssize_t n = ::write(fd_, p, left);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return;  // nowhere left to report a failing log; drop the line
      p += n;
      left -= static_cast<std::size_t>(n);
    }
  }
  void flush_() override {}  // nothing is buffered

 private:
  int fd_;
  bool owned_;
};

std::shared_ptr<spdlog::logger> make_logger(int fd, bool owned) {
  auto logger = std::make_shared<spdlog::logger>("wia", std::make_shared<FdSink>(fd, owned));
  auto formatter = std::make_unique<spdlog::pattern_formatter>();
  formatter->add_flag<LevelFlag>('*').set_pattern(kPattern);
  logger->set_formatter(std::move(formatter));
  logger->set_level(spdlog::level::trace);  // the threshold is ours (enabled())
  return logger;
}

// A logger for `file` ("" = stderr). When the file cannot be opened,
// returns the stderr logger and sets *error.
std::shared_ptr<spdlog::logger> open_logger(const std::string& file, std::string* error) {
  if (!file.empty()) {
    int fd = ::open(file.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd >= 0) return make_logger(fd, true);
    *error = fmt::format("cannot open log file '{}': {}; logging to standard error", file,
                         std::strerror(errno));
  }
  return make_logger(STDERR_FILENO, false);
}

void emit(spdlog::logger& logger, Level level, std::string_view tag, std::string_view message) {
  try {
    if (tag.empty())
      logger.log(to_spdlog(level), "{}", message);
    else
      logger.log(to_spdlog(level), "[{}] {}", tag, message);
  } catch (...) {
    // Logging never throws into its caller (spdlog reports its own errors).
  }
}

struct State {
  std::atomic<int> threshold{static_cast<int>(Level::warn)};
  std::mutex mutex;                        // guards the three below
  std::shared_ptr<spdlog::logger> logger;  // swapped whole by configure()
  std::string file;                        // what `logger` writes to ("" = stderr)
  std::string failed_file;                 // last file that failed to open

  // Messages logged before the configuration is loaded (provider search,
  // config parsing itself) already follow WIA_LOG_LEVEL / WIA_LOG_FILE.
  State() {
    std::string warning;
    Level level = Level::warn;
    if (const char* text = std::getenv("WIA_LOG_LEVEL")) {
      if (!parse_level(text, &level))
        warning = fmt::format(
            "ignoring WIA_LOG_LEVEL='{}': expected one of error, warn, info, debug, trace, off",
            text);
    }
    threshold.store(static_cast<int>(level));
    const char* path = std::getenv("WIA_LOG_FILE");
    std::string open_error;
    logger = open_logger(path ? path : "", &open_error);
    file = open_error.empty() && path ? path : "";
    if (!open_error.empty()) failed_file = path;
    // Written directly: write() would re-enter state() while it is built.
    if (level != Level::off) {
      if (!warning.empty()) emit(*logger, Level::warn, "log", warning);
      if (!open_error.empty()) emit(*logger, Level::warn, "log", open_error);
    }
  }
};

// Never destroyed: code in other static destructors (provider unload at
// exit) may still log, and must not find a dead logger.
State& state() {
  static State* s = new State();
  return *s;
}

}  // namespace

bool parse_level(std::string_view text, Level* level) {
  for (int i = 0; i <= static_cast<int>(Level::off); ++i) {
    std::string_view name = kLevelNames[i];
    if (name.size() == text.size() &&
        std::equal(name.begin(), name.end(), text.begin(), [](char a, char b) {
          return a == std::tolower(static_cast<unsigned char>(b));
        })) {
      *level = static_cast<Level>(i);
      return true;
    }
  }
  return false;
}

const char* level_name(Level level) {
  auto i = static_cast<std::size_t>(level);
  return i < std::size(kLevelNames) ? kLevelNames[i] : "off";
}

void configure(Level level, const std::string& file) {
  State& s = state();
  std::shared_ptr<spdlog::logger> logger;
  std::string open_error;
  {
    std::lock_guard<std::mutex> lock(s.mutex);
    // Reopening the same file would be harmless, but keeping the open one
    // means a reconfigure (level change only) never loses a line.
    if (file != s.file) {
      s.logger = open_logger(file, &open_error);
      if (open_error.empty()) {
        s.file = file;
        s.failed_file.clear();
      } else {
        s.file.clear();
        // One warning per bad path, however often it is configured again.
        if (s.failed_file == file) open_error.clear();
        s.failed_file = file;
      }
    }
    s.threshold.store(static_cast<int>(level));
    logger = s.logger;
  }
  // The user asked for a file and is not getting it: say so even when the
  // threshold is above warn; "off" alone silences it.
  if (!open_error.empty() && level != Level::off) emit(*logger, Level::warn, "log", open_error);
}

bool enabled(Level level) {
  return level < Level::off &&
         static_cast<int>(level) >= state().threshold.load(std::memory_order_relaxed);
}

void write(Level level, std::string_view tag, std::string_view message) {
  if (!enabled(level)) return;
  State& s = state();
  std::shared_ptr<spdlog::logger> logger;
  {
    std::lock_guard<std::mutex> lock(s.mutex);
    logger = s.logger;
  }
  emit(*logger, level, tag, message);
}

}  // namespace wia::log
