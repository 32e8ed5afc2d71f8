// SPDX-License-Identifier: Apache-2.0
// What the fuzz targets share: an empty environment (a target must not
// depend on the shell it runs in), an invariant check that stops the run
// with the reason, and a reader that splits the fuzzer's bytes into fields.
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <span>
#include <string>
#include <string_view>

#include "common/error.hpp"
#include "common/log.hpp"
#include "config/config.hpp"

namespace wia::fuzz {

inline EnvLookup no_env() {
  return [](const char*) -> const char* { return nullptr; };
}

// An invariant the library promises was broken: libFuzzer records abort()
// as a crash and saves the input.
[[noreturn]] inline void broken(const std::string& what) {
  std::fprintf(stderr, "fuzz invariant broken: %s\n", what.c_str());
  std::fflush(stderr);
  std::abort();
}
inline void check(bool ok, const std::string& what) {
  if (!ok) broken(what);
}

// A rejected input must come back as wia::Error with the expected status
// and a message a user can act on (it names something).
inline void check_rejection(const Error& e, wia_status_t expected, std::string_view where) {
  check(e.status() == expected, std::string(where) + ": status " + status_name(e.status()) +
                                    ", expected " + status_name(expected) + ": " + e.what());
  check(std::strlen(e.what()) > 0, std::string(where) + ": error without a message");
}

// The library logs warnings for rejected input; thousands of runs a second
// would flood the terminal, so the targets log errors only.
inline void quiet_logs() {
  static const bool once = [] {
    log::configure(log::Level::error, "");
    return true;
  }();
  (void)once;
}

// Consumes the fuzzer's bytes front to back; reads past the end give zeros.
class Bytes {
 public:
  Bytes(const std::uint8_t* data, std::size_t size) : data_(data), size_(size) {}
  std::uint8_t u8() { return pos_ < size_ ? data_[pos_++] : 0; }
  std::uint16_t u16() { return static_cast<std::uint16_t>(u8() | (u8() << 8)); }
  std::uint32_t u32() { return u16() | (static_cast<std::uint32_t>(u16()) << 16); }
  std::uint64_t u64() { return u32() | (static_cast<std::uint64_t>(u32()) << 32); }
  std::span<const std::uint8_t> take(std::size_t n) {
    n = n < size_ - pos_ ? n : size_ - pos_;
    std::span<const std::uint8_t> out(data_ + pos_, n);
    pos_ += n;
    return out;
  }
  std::span<const std::uint8_t> rest() { return take(size_ - pos_); }
  std::size_t remaining() const { return size_ - pos_; }

 private:
  const std::uint8_t* data_;
  std::size_t size_;
  std::size_t pos_ = 0;
};

// A file in memory whose path the file loaders can open (they take paths,
// as the tools and the runtime give them): the input goes through the very
// code that reads a user's file, with no disk traffic per run.
class MemFile {
 public:
  explicit MemFile(const char* name) : fd_(::memfd_create(name, 0)) {
    check(fd_ >= 0, "memfd_create failed");
    path_ = "/proc/self/fd/" + std::to_string(fd_);
  }
  ~MemFile() { ::close(fd_); }
  MemFile(const MemFile&) = delete;
  MemFile& operator=(const MemFile&) = delete;
  const std::string& write(std::string_view text) {
    check(::ftruncate(fd_, 0) == 0, "ftruncate failed");
    check(::pwrite(fd_, text.data(), text.size(), 0) == static_cast<ssize_t>(text.size()),
          "pwrite failed");
    return path_;
  }
  const std::string& path() const { return path_; }

 private:
  int fd_;
  std::string path_;
};

inline std::string_view as_text(std::span<const std::uint8_t> bytes) {
  return {reinterpret_cast<const char*>(bytes.data()), bytes.size()};
}

}  // namespace wia::fuzz
