// SPDX-License-Identifier: Apache-2.0
// Sockets for the bootstrap: addresses (IPv4 and IPv6, "host:port" and
// "[v6]:port"), interface choice with NCCL_SOCKET_IFNAME semantics, and
// I/O where every wait has a deadline and can be woken by an abort fd.
#pragma once

#include <sys/socket.h>

#include <chrono>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace wia::bootstrap {

using Clock = std::chrono::steady_clock;
using Deadline = Clock::time_point;

// Milliseconds left until `deadline`, clamped to [0, INT_MAX] for poll().
int ms_until(Deadline deadline);

// Owns a file descriptor; closes it once.
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() { reset(); }
  Fd(Fd&& other) noexcept : fd_(other.release()) {}
  Fd& operator=(Fd&& other) noexcept {
    if (this != &other) {
      reset();
      fd_ = other.release();
    }
    return *this;
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int release() {
    const int fd = fd_;
    fd_ = -1;
    return fd;
  }
  void reset(int fd = -1);

 private:
  int fd_ = -1;
};

struct SocketAddress {
  sockaddr_storage storage{};
  socklen_t length = 0;

  int family() const { return storage.ss_family; }
  std::uint16_t port() const;
  void set_port(std::uint16_t port);
  bool is_loopback() const;
  bool is_link_local() const;  // fe80::/10; unusable without a scope
  // "10.0.0.1:29500" or "[::1]:29500".
  std::string to_string() const;
  // Just the address: "10.0.0.1" or "::1".
  std::string host_string() const;
  static SocketAddress from(const sockaddr* sa, socklen_t len);
};

struct HostPort {
  std::string host;  // without brackets
  std::uint16_t port = 0;
};
// Parses "host:port", "1.2.3.4:port", "[::1]:port". Returns nullopt and
// sets *why ("missing ':port'", "port 70000 is not in 1..65535", "IPv6
// addresses need brackets: [::1]:29500") otherwise.
std::optional<HostPort> parse_host_port(std::string_view text, std::string* why);

// getaddrinfo for a stream socket. Throws wia::Error(WIA_ERROR_CONFIG)
// naming the host when it does not resolve.
std::vector<SocketAddress> resolve(const std::string& host, std::uint16_t port);

// One address of one local interface.
struct InterfaceAddress {
  std::string ifname;
  SocketAddress address;  // port 0
  bool loopback = false;
};
// Every address of every interface that is up (getifaddrs), IPv4 and IPv6.
std::vector<InterfaceAddress> list_interfaces();

// NCCL_SOCKET_IFNAME semantics: a comma-separated list of name prefixes
// ("eth,ib"); a leading '^' excludes the listed names instead ("^docker,lo");
// '=' after the optional '^' makes the names exact ("=eth0", "^=lo"). An
// empty spec matches every name.
bool ifname_matches(std::string_view spec, std::string_view ifname);

// The address a root advertises. With a spec, the first address whose
// interface matches it (loopback allowed if it matches). Without one: a
// non-loopback interface that is not a container bridge (docker*, virbr*),
// then such a bridge, then loopback. IPv6 link-local addresses are never
// chosen. `family` AF_INET or AF_INET6 takes only that family (AF_UNSPEC:
// either, IPv4 first). Pure: tested over made-up tables. Returns nullopt when
// nothing qualifies.
std::optional<InterfaceAddress> choose_interface(std::span<const InterfaceAddress> interfaces,
                                                 std::string_view spec, int family);
// "lo 127.0.0.1, eth0 10.0.0.2" for error messages.
std::string describe_interfaces(std::span<const InterfaceAddress> interfaces);

// A listening TCP socket on `address` (port 0 = ephemeral), non-blocking,
// SO_REUSEADDR. An IPv6 wildcard address also accepts IPv4. Throws
// wia::Error(WIA_ERROR_IO) naming the address and errno text.
Fd listen_on(const SocketAddress& address, int backlog);
SocketAddress local_address(int fd);
SocketAddress peer_address(int fd);
// The wildcard address of `family` with `port`.
SocketAddress wildcard_address(int family, std::uint16_t port);
// `host` read as a numeric IPv4 or IPv6 address ("10.0.0.2", "::1") with
// `port`; nullopt when it is a name, not a number.
std::optional<SocketAddress> numeric_address(const std::string& host, std::uint16_t port);
// The loopback address of `family` (AF_INET6: ::1, else 127.0.0.1) with `port`.
SocketAddress loopback_address(int family, std::uint16_t port);

void set_nonblocking(int fd);
void set_nodelay(int fd);

// Connects with a deadline; on failure returns an invalid Fd and sets
// *error to the errno (ETIMEDOUT at the deadline). The socket is left
// non-blocking.
Fd connect_before(const SocketAddress& address, Deadline deadline, int* error);

enum class IoResult { kOk, kTimeout, kClosed, kWoken, kError };

// Blocking-style I/O on a non-blocking socket: poll()s until done, the
// deadline passes, the peer closes, or `wake_fd` (if >= 0) is readable.
// *error receives the errno on kError.
IoResult send_all(int fd, std::span<const std::uint8_t> data, Deadline deadline, int wake_fd,
                  int* error);
IoResult recv_all(int fd, std::span<std::uint8_t> data, Deadline deadline, int wake_fd, int* error);

}  // namespace wia::bootstrap
