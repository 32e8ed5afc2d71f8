// SPDX-License-Identifier: Apache-2.0
#include "checkpoint/durable_io.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <mutex>

#include "common/error.hpp"
#include "wia_common/text.hpp"

namespace wia::checkpoint {
namespace {

[[noreturn]] void io_fail(const std::string& what, const std::string& path, int err) {
  throw Error(WIA_ERROR_IO, fmt::format("{} {}: {}", what, path, common::errno_text(err)));
}

std::string parent_of(const std::string& path) {
  const auto slash = path.rfind('/');
  return slash == std::string::npos ? std::string(".") : path.substr(0, slash == 0 ? 1 : slash);
}

// A checkpoint file opened to be read, and its size. A missing file is
// WIA_ERROR_CORRUPT: a checkpoint's files are the checkpoint.
int open_for_reading(const std::string& path, std::size_t* size) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) throw Error(WIA_ERROR_CORRUPT, fmt::format("{}: missing", path));
    io_fail("cannot open", path, errno);
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    io_fail("cannot stat", path, err);
  }
  *size = static_cast<std::size_t>(st.st_size);
  return fd;
}

}  // namespace

DurableFile::DurableFile(std::string path) : path_(std::move(path)), tmp_(path_ + ".tmp") {
  fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) io_fail("cannot create", tmp_, errno);
}

DurableFile::~DurableFile() {
  if (fd_ >= 0) {
    ::close(fd_);
    ::unlink(tmp_.c_str());
  }
}

void DurableFile::write(std::span<const std::byte> bytes) {
  const std::byte* p = bytes.data();
  std::size_t left = bytes.size();
  while (left > 0) {
    const ssize_t n = ::write(fd_, p, left);
    if (n < 0) {
      if (errno == EINTR) continue;
      io_fail("writing", tmp_, errno);  // ENOSPC, EDQUOT, EIO: the destructor removes tmp_
    }
    p += n;
    left -= static_cast<std::size_t>(n);
    written_ += static_cast<std::uint64_t>(n);
  }
}

void DurableFile::write(const std::string& text) {
  write(std::as_bytes(std::span(text.data(), text.size())));
}

void DurableFile::commit() {
  if (::fsync(fd_) != 0) io_fail("fsync of", tmp_, errno);
  const int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) {
    const int err = errno;
    ::unlink(tmp_.c_str());
    io_fail("closing", tmp_, err);
  }
  if (::rename(tmp_.c_str(), path_.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp_.c_str());
    io_fail("renaming into", path_, err);
  }
  sync_directory(parent_of(path_));
}

void write_durable(const std::string& path, const std::string& text) {
  DurableFile f(path);
  f.write(text);
  f.commit();
}

void sync_directory(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) io_fail("cannot open directory", dir, errno);
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  if (rc != 0) io_fail("fsync of directory", dir, err);
}

std::vector<std::byte> read_whole(const std::string& path) {
  std::size_t size = 0;
  const int fd = open_for_reading(path, &size);
  std::vector<std::byte> bytes(size);
  std::size_t got = 0;
  while (got < bytes.size()) {
    const ssize_t n = ::read(fd, bytes.data() + got, bytes.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = n < 0 ? errno : EIO;
      ::close(fd);
      io_fail("reading", path, err);
    }
    got += static_cast<std::size_t>(n);
  }
  ::close(fd);
  return bytes;
}

MappedFile::MappedFile(const std::string& path) {
  const int fd = open_for_reading(path, &size_);
  if (size_ > 0) {
    void* m = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE | MAP_POPULATE, fd, 0);
    if (m == MAP_FAILED) {
      const int err = errno;
      ::close(fd);
      io_fail("cannot map", path, err);
    }
    ::madvise(m, size_, MADV_SEQUENTIAL);
    data_ = static_cast<const std::byte*>(m);
  }
  ::close(fd);
}

MappedFile::~MappedFile() {
  if (data_ != nullptr) ::munmap(const_cast<std::byte*>(data_), size_);
}

void make_directories(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) io_fail("cannot create directory", dir, ec.value());
  if (!std::filesystem::is_directory(dir, ec))
    throw Error(WIA_ERROR_IO, fmt::format("checkpoint directory {} is not a directory", dir));
}

void lock_directory(const std::string& dir) {
  static std::mutex mu;
  static auto* held = new std::map<std::string, int>();  // dir -> fd, kept until exit
  std::lock_guard lock(mu);
  std::error_code ec;
  const std::string key = std::filesystem::weakly_canonical(dir, ec).string();
  if (held->count(key) != 0) return;
  const std::string path = dir + "/LOCK";
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) io_fail("cannot create lock file", path, errno);
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    char pid[32] = {};
    const ssize_t n = ::pread(fd, pid, sizeof(pid) - 1, 0);
    ::close(fd);
    if (err == EWOULDBLOCK)
      throw Error(
          WIA_ERROR_IO,
          fmt::format("checkpoint directory {} is in use by another job (process {} holds "
                      "{}); give each job its own checkpoint_dir",
                      dir, n > 0 ? std::string(pid, strnlen(pid, sizeof(pid))) : "?", path));
    io_fail("cannot lock", path, err);
  }
  const std::string me = std::to_string(::getpid());
  if (::ftruncate(fd, 0) != 0 || ::pwrite(fd, me.data(), me.size(), 0) < 0) {
    // The pid only improves the message another job gets; the lock holds.
  }
  (*held)[key] = fd;
}

}  // namespace wia::checkpoint
