// SPDX-License-Identifier: Apache-2.0
// The file operations a crash-safe commit is made of: a file is written
// under a temporary name, fsynced, renamed over its final name, and its
// directory fsynced, so after a crash it holds either the old content or
// the new, never part. Every failure is WIA_ERROR_IO naming the path and
// the operating system's reason; a failed write removes its temporary.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace wia::checkpoint {

// A file being written under "<path>.tmp"; commit() makes it "<path>".
// Destroyed without commit(), the temporary is removed.
class DurableFile {
 public:
  explicit DurableFile(std::string path);
  ~DurableFile();
  DurableFile(const DurableFile&) = delete;
  DurableFile& operator=(const DurableFile&) = delete;

  void write(std::span<const std::byte> bytes);
  void write(const std::string& text);
  std::uint64_t size() const { return written_; }
  // fsync, close, rename to the final name, fsync the directory.
  void commit();

 private:
  std::string path_;
  std::string tmp_;
  int fd_ = -1;
  std::uint64_t written_ = 0;
};

// Writes `text` to `path` durably (DurableFile in one call).
void write_durable(const std::string& path, const std::string& text);
// fsync of a directory, so a rename or unlink in it survives a crash.
void sync_directory(const std::string& dir);
// The whole file. Throws WIA_ERROR_CORRUPT "<path>: missing" when it does
// not exist (a checkpoint's files are the checkpoint), IO otherwise.
std::vector<std::byte> read_whole(const std::string& path);
// A whole file mapped read-only (the page cache itself, no copy), for
// data files that are decoded straight out of it. Errors as read_whole.
class MappedFile {
 public:
  explicit MappedFile(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  std::span<const std::byte> bytes() const { return {data_, size_}; }

 private:
  const std::byte* data_ = nullptr;
  std::size_t size_ = 0;
};

// Creates dir and its parents (mkdir -p).
void make_directories(const std::string& dir);

// An exclusive lock on "<dir>/LOCK" (flock) held until the process exits,
// so two jobs never write one checkpoint directory. Throws IO naming the
// directory and the pid recorded in the lock when another process holds it.
// Taking a lock this process already holds is a no-op.
void lock_directory(const std::string& dir);

}  // namespace wia::checkpoint
