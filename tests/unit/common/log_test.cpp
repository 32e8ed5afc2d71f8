// SPDX-License-Identifier: Apache-2.0
// Logging: format, filtering, files, fallback, reconfiguration under load.
#include "common/log.hpp"

#include <doctest/doctest.h>
#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace wia {
namespace {

std::vector<std::string> read_lines(const std::string& path) {
  std::ifstream in(path);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

class TempDir {
 public:
  TempDir() {
    std::string templ = (std::filesystem::temp_directory_path() / "wia-log-XXXXXX").string();
    REQUIRE(::mkdtemp(templ.data()) != nullptr);
    path_ = templ;
  }
  ~TempDir() {
    log::configure(log::Level::warn, "");  // close files before removing them
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  std::string file(const std::string& name) const { return (path_ / name).string(); }

 private:
  std::filesystem::path path_;
};

// Sends stderr to a file for the lifetime of the object.
class CaptureStderr {
 public:
  explicit CaptureStderr(const std::string& path) {
    std::fflush(stderr);
    saved_ = ::dup(STDERR_FILENO);
    int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    REQUIRE(fd >= 0);
    ::dup2(fd, STDERR_FILENO);
    ::close(fd);
  }
  ~CaptureStderr() {
    std::fflush(stderr);
    ::dup2(saved_, STDERR_FILENO);
    ::close(saved_);
  }

 private:
  int saved_;
};

const std::regex kLine(
    R"(\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3}\] \[wia (\d+)\] \[(\w+)\] \[(\w+)\] (.*))");

TEST_CASE("log: level names parse in any case and round-trip") {
  for (auto level : {log::Level::trace, log::Level::debug, log::Level::info, log::Level::warn,
                     log::Level::error, log::Level::off}) {
    log::Level parsed;
    REQUIRE(log::parse_level(log::level_name(level), &parsed));
    CHECK(parsed == level);
  }
  log::Level level = log::Level::trace;
  CHECK((log::parse_level("WARN", &level) && level == log::Level::warn));
  CHECK_FALSE(log::parse_level("warning", &level));
  CHECK_FALSE(log::parse_level("", &level));
  CHECK(std::string(log::level_name(log::Level::warn)) == "warn");
}

TEST_CASE("log: lines carry time, pid, level and tag, and follow the threshold") {
  TempDir dir;
  const std::string path = dir.file("wia.log");
  log::configure(log::Level::info, path);
  CHECK_FALSE(log::enabled(log::Level::debug));
  CHECK(log::enabled(log::Level::info));
  log::trace("loader", "message {}", "trace");
  log::debug("loader", "message {}", "debug");
  log::info("loader", "message {}", "info");
  log::warn("config", "message {}", "warn");
  log::error("host", "message {}", 42);
  log::write(log::Level::off, "loader", "never written");

  auto lines = read_lines(path);
  REQUIRE(lines.size() == 3);
  const std::string pid = std::to_string(::getpid());
  const char* expected[][3] = {{"info", "loader", "message info"},
                               {"warn", "config", "message warn"},
                               {"error", "host", "message 42"}};
  for (std::size_t i = 0; i < lines.size(); ++i) {
    CAPTURE(lines[i]);
    std::smatch m;
    REQUIRE(std::regex_match(lines[i], m, kLine));
    CHECK(m[1] == pid);
    CHECK(m[2] == expected[i][0]);
    CHECK(m[3] == expected[i][1]);
    CHECK(m[4] == expected[i][2]);
  }

  log::configure(log::Level::off, path);
  log::error("loader", "suppressed");
  CHECK_FALSE(log::enabled(log::Level::error));
  log::configure(log::Level::trace, path);  // same file: appended, not truncated
  log::trace("loader", "now visible");
  lines = read_lines(path);
  REQUIRE(lines.size() == 4);
  CHECK(lines[3].ends_with("[trace] [loader] now visible"));
}

TEST_CASE("log: an existing file is appended to") {
  TempDir dir;
  const std::string path = dir.file("existing.log");
  std::ofstream(path) << "earlier line\n";
  log::configure(log::Level::warn, path);
  log::warn("loader", "appended");
  auto lines = read_lines(path);
  REQUIRE(lines.size() == 2);
  CHECK(lines[0] == "earlier line");
  CHECK(lines[1].ends_with("[warn] [loader] appended"));
}

TEST_CASE("log: an unopenable file falls back to stderr with one warning") {
  TempDir dir;
  const std::string bad = dir.file("no-such-dir/wia.log");
  const std::string captured = dir.file("stderr.txt");
  {
    CaptureStderr capture(captured);
    CHECK_NOTHROW(log::configure(log::Level::warn, bad));
    CHECK_NOTHROW(log::configure(log::Level::info, bad));  // no second warning
    log::info("loader", "still logged");
    log::configure(log::Level::warn, "");
  }
  CHECK_FALSE(std::filesystem::exists(dir.file("no-such-dir")));  // nothing created
  auto lines = read_lines(captured);
  REQUIRE(lines.size() == 2);
  CHECK(lines[0].ends_with("[warn] [log] cannot open log file '" + bad +
                           "': No such file or directory; logging to standard error"));
  CHECK(lines[1].ends_with("[info] [loader] still logged"));
}

TEST_CASE("log: reconfiguring while threads log loses and tears no line") {
  TempDir dir;
  const std::string a = dir.file("a.log"), b = dir.file("b.log");
  log::configure(log::Level::info, a);
  constexpr int kThreads = 4, kPerThread = 200;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([t] {
      for (int i = 0; i < kPerThread; ++i) log::info("worker", "thread {} line {}", t, i);
    });
  }
  for (int i = 0; i < 50; ++i) log::configure(log::Level::info, i % 2 ? a : b);
  for (auto& thread : threads) thread.join();
  log::configure(log::Level::warn, "");

  int total = 0;
  for (const auto& path : {a, b}) {
    for (const auto& line : read_lines(path)) {
      CAPTURE(line);
      CHECK(std::regex_match(line, kLine));
      ++total;
    }
  }
  CHECK(total == kThreads * kPerThread);
}

// Runs only as the ctest entry common_log_env, in a fresh process started
// with WIA_LOG_LEVEL=debug and WIA_LOG_FILE set (see tests.cmake).
TEST_CASE("log: first use honours WIA_LOG_LEVEL and WIA_LOG_FILE" * doctest::skip()) {
  const char* path = std::getenv("WIA_LOG_FILE");
  REQUIRE(path != nullptr);
  const std::string token = std::to_string(::getpid());
  CHECK(log::enabled(log::Level::debug));
  CHECK_FALSE(log::enabled(log::Level::trace));
  log::debug("early", "debug before configure {}", token);
  log::trace("early", "trace before configure {}", token);
  int debug_lines = 0, trace_lines = 0;
  for (const auto& line : read_lines(path)) {
    if (line.ends_with("[debug] [early] debug before configure " + token)) ++debug_lines;
    if (line.find("trace before configure " + token) != std::string::npos) ++trace_lines;
  }
  CHECK(debug_lines == 1);
  CHECK(trace_lines == 0);
  log::configure(log::Level::warn, "");
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace wia
