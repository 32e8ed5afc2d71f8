// SPDX-License-Identifier: Apache-2.0
// Writing and reading the one-node rendezvous file (rendezvous_file.hpp).
#include "bootstrap/rendezvous_file.hpp"

#include <fcntl.h>
#include <fmt/core.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string_view>
#include <vector>

#include "common/error.hpp"

namespace wia::bootstrap {

void write_rendezvous_file(const std::string& path, const SocketAddress& address,
                           const Secret& secret, int size) {
  const std::string tmp = fmt::format("{}.tmp.{}", path, getpid());
  ::unlink(tmp.c_str());
  Fd fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600));
  if (!fd.valid()) {
    throw Error(WIA_ERROR_IO, fmt::format("bootstrap: rank 0 cannot create the rendezvous file {}: "
                                          "{}",
                                          tmp, std::strerror(errno)));
  }
  const std::string text =
      fmt::format("wia-bootstrap 1 {} {} {}\n", address.to_string(), to_hex(secret.bytes), size);
  const bool written =
      ::write(fd.get(), text.data(), text.size()) == static_cast<ssize_t>(text.size());
  fd.reset();
  if (!written || ::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    throw Error(WIA_ERROR_IO, fmt::format("bootstrap: rank 0 cannot write the rendezvous file {}: "
                                          "{}",
                                          path, std::strerror(err)));
  }
}

std::optional<PublishedRoot> read_rendezvous_file(const std::string& path, int size,
                                                  std::string* waiting) {
  Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW));
  if (!fd.valid()) {
    *waiting = fmt::format(
        "found no rendezvous file {} (rank 0 did not start, or runs on another "
        "node: multi-node jobs need WIA_ROOT_ADDR)",
        path);
    return std::nullopt;
  }
  struct stat st {};
  if (fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != geteuid() ||
      (st.st_mode & 077) != 0) {
    throw Error(WIA_ERROR_IO,
                fmt::format("bootstrap: refusing rendezvous file {}: it must be a regular file "
                            "owned by uid {} with mode 0600 (it has uid {}, mode {:o})",
                            path, geteuid(), st.st_uid, st.st_mode & 07777));
  }
  char buf[512] = {};
  const ssize_t n = ::read(fd.get(), buf, sizeof buf - 1);
  std::string_view text(buf, static_cast<std::size_t>(std::max<ssize_t>(n, 0)));
  // Fields: magic, version, address, secret, size.
  std::vector<std::string_view> fields;
  while (!text.empty()) {
    const auto space = text.find_first_of(" \n");
    if (space != 0) fields.push_back(text.substr(0, space));
    if (space == std::string_view::npos) break;
    text.remove_prefix(space + 1);
  }
  PublishedRoot published;
  std::string why;
  const auto hp = fields.size() == 5 ? parse_host_port(fields[2], &why) : std::nullopt;
  if (fields.size() != 5 || fields[0] != "wia-bootstrap" || fields[1] != "1" || !hp ||
      !from_hex(fields[3], published.secret.bytes)) {
    *waiting = fmt::format("rendezvous file {} is malformed", path);
    return std::nullopt;  // maybe a different libwia version; wait for the right one
  }
  if (fields[4] != std::to_string(size)) {
    throw Error(WIA_ERROR_INVALID_ARGUMENT,
                fmt::format("bootstrap: rank 0 runs a job of {} ranks (rendezvous file {}), this "
                            "rank was told {}",
                            fields[4], path, size));
  }
  const auto address = numeric_address(hp->host, hp->port);
  if (!address) {
    *waiting = fmt::format("rendezvous file {} names no numeric address", path);
    return std::nullopt;
  }
  published.address = *address;
  return published;
}

}  // namespace wia::bootstrap
