// SPDX-License-Identifier: Apache-2.0
#include "bootstrap/socket.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <fmt/core.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <tuple>

#include "common/error.hpp"

namespace wia::bootstrap {

int ms_until(Deadline deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  if (left.count() <= 0) return 0;
  // Round up so a wait never ends a hair before its deadline and spins.
  return static_cast<int>(std::min<long long>(left.count() + 1, INT_MAX));
}

void Fd::reset(int fd) {
  if (fd_ >= 0) ::close(fd_);
  fd_ = fd;
}

std::uint16_t SocketAddress::port() const {
  if (family() == AF_INET) return ntohs(reinterpret_cast<const sockaddr_in&>(storage).sin_port);
  if (family() == AF_INET6) return ntohs(reinterpret_cast<const sockaddr_in6&>(storage).sin6_port);
  return 0;
}

void SocketAddress::set_port(std::uint16_t port) {
  if (family() == AF_INET) reinterpret_cast<sockaddr_in&>(storage).sin_port = htons(port);
  if (family() == AF_INET6) reinterpret_cast<sockaddr_in6&>(storage).sin6_port = htons(port);
}

bool SocketAddress::is_loopback() const {
  if (family() == AF_INET) {
    const auto a = ntohl(reinterpret_cast<const sockaddr_in&>(storage).sin_addr.s_addr);
    return (a >> 24) == 127;
  }
  if (family() == AF_INET6) {
    const auto& a = reinterpret_cast<const sockaddr_in6&>(storage).sin6_addr;
    return IN6_IS_ADDR_LOOPBACK(&a) != 0;
  }
  return false;
}

bool SocketAddress::is_link_local() const {
  if (family() != AF_INET6) return false;
  const auto& a = reinterpret_cast<const sockaddr_in6&>(storage).sin6_addr;
  return IN6_IS_ADDR_LINKLOCAL(&a) != 0;
}

std::string SocketAddress::host_string() const {
  char text[INET6_ADDRSTRLEN] = {};
  if (family() == AF_INET) {
    inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in&>(storage).sin_addr, text, sizeof text);
  } else if (family() == AF_INET6) {
    inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6&>(storage).sin6_addr, text,
              sizeof text);
  } else {
    return "<no address>";
  }
  return text;
}

std::string SocketAddress::to_string() const {
  if (family() == AF_INET6) return fmt::format("[{}]:{}", host_string(), port());
  return fmt::format("{}:{}", host_string(), port());
}

SocketAddress SocketAddress::from(const sockaddr* sa, socklen_t len) {
  SocketAddress out;
  len = std::min<socklen_t>(len, sizeof out.storage);
  std::memcpy(&out.storage, sa, len);
  out.length = len;
  return out;
}

std::optional<HostPort> parse_host_port(std::string_view text, std::string* why) {
  HostPort out;
  std::string_view port_text;
  if (!text.empty() && text.front() == '[') {
    const auto close = text.find(']');
    if (close == std::string_view::npos) {
      *why = "'[' without a closing ']'";
      return std::nullopt;
    }
    out.host = std::string(text.substr(1, close - 1));
    if (close + 1 >= text.size() || text[close + 1] != ':') {
      *why = "missing ':port' after the bracketed address";
      return std::nullopt;
    }
    port_text = text.substr(close + 2);
  } else {
    const auto colon = text.rfind(':');
    if (colon == std::string_view::npos) {
      *why = "missing ':port'";
      return std::nullopt;
    }
    if (text.find(':') != colon) {
      *why = "IPv6 addresses need brackets, e.g. [::1]:29500";
      return std::nullopt;
    }
    out.host = std::string(text.substr(0, colon));
    port_text = text.substr(colon + 1);
  }
  if (out.host.empty()) {
    *why = "empty host";
    return std::nullopt;
  }
  long port = 0;
  if (port_text.empty() || port_text.size() > 5 ||
      !std::all_of(port_text.begin(), port_text.end(),
                   [](char c) { return c >= '0' && c <= '9'; })) {
    *why = fmt::format("port '{}' is not a number", port_text);
    return std::nullopt;
  }
  for (char c : port_text) port = port * 10 + (c - '0');
  if (port < 1 || port > 65535) {
    *why = fmt::format("port {} is not in 1..65535", port);
    return std::nullopt;
  }
  out.port = static_cast<std::uint16_t>(port);
  return out;
}

std::vector<SocketAddress> resolve(const std::string& host, std::uint16_t port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* list = nullptr;
  const std::string service = std::to_string(port);
  const int rc = getaddrinfo(host.c_str(), service.c_str(), &hints, &list);
  if (rc != 0) {
    throw Error(WIA_ERROR_CONFIG,
                fmt::format("bootstrap: cannot resolve host '{}': {}", host, gai_strerror(rc)));
  }
  std::vector<SocketAddress> out;
  for (addrinfo* ai = list; ai != nullptr; ai = ai->ai_next) {
    if (ai->ai_family == AF_INET || ai->ai_family == AF_INET6) {
      out.push_back(SocketAddress::from(ai->ai_addr, ai->ai_addrlen));
    }
  }
  freeaddrinfo(list);
  return out;
}

std::vector<InterfaceAddress> list_interfaces() {
  ifaddrs* list = nullptr;
  std::vector<InterfaceAddress> out;
  if (getifaddrs(&list) != 0) return out;
  for (ifaddrs* ifa = list; ifa != nullptr; ifa = ifa->ifa_next) {
    if (ifa->ifa_addr == nullptr || (ifa->ifa_flags & IFF_UP) == 0) continue;
    const int family = ifa->ifa_addr->sa_family;
    if (family != AF_INET && family != AF_INET6) continue;
    InterfaceAddress entry;
    entry.ifname = ifa->ifa_name;
    entry.address = SocketAddress::from(
        ifa->ifa_addr, family == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6));
    entry.loopback = (ifa->ifa_flags & IFF_LOOPBACK) != 0 || entry.address.is_loopback();
    out.push_back(std::move(entry));
  }
  freeifaddrs(list);
  return out;
}

bool ifname_matches(std::string_view spec, std::string_view ifname) {
  if (spec.empty()) return true;
  bool exclude = false;
  bool exact = false;
  if (spec.front() == '^') {
    exclude = true;
    spec.remove_prefix(1);
  }
  if (!spec.empty() && spec.front() == '=') {
    exact = true;
    spec.remove_prefix(1);
  }
  bool listed = false;
  while (!spec.empty() && !listed) {
    const auto comma = spec.find(',');
    const std::string_view name = spec.substr(0, comma);
    spec = comma == std::string_view::npos ? std::string_view{} : spec.substr(comma + 1);
    if (name.empty()) continue;
    listed = exact ? ifname == name : ifname.substr(0, name.size()) == name;
  }
  return exclude ? !listed : listed;
}

std::optional<InterfaceAddress> choose_interface(std::span<const InterfaceAddress> interfaces,
                                                 std::string_view spec, int family) {
  // Lower rank = better; candidates are compared by (rank, family order,
  // table order) so the choice is deterministic.
  auto is_bridge = [](const std::string& name) {
    return name.rfind("docker", 0) == 0 || name.rfind("virbr", 0) == 0;
  };
  auto family_order = [family](int f) {
    if (family == AF_INET6) return f == AF_INET6 ? 0 : 1;
    return f == AF_INET ? 0 : 1;
  };
  const InterfaceAddress* best = nullptr;
  std::tuple<int, int> best_key{};
  for (const auto& entry : interfaces) {
    if (entry.address.is_link_local()) continue;
    if (family != AF_UNSPEC && family != entry.address.family()) continue;
    int rank = 0;
    if (!spec.empty()) {
      if (!ifname_matches(spec, entry.ifname)) continue;
    } else {
      rank = entry.loopback ? 2 : is_bridge(entry.ifname) ? 1 : 0;
    }
    const std::tuple<int, int> key{rank, family_order(entry.address.family())};
    if (best == nullptr || key < best_key) {
      best = &entry;
      best_key = key;
    }
  }
  if (best == nullptr) return std::nullopt;
  return *best;
}

std::string describe_interfaces(std::span<const InterfaceAddress> interfaces) {
  std::string out;
  for (const auto& entry : interfaces) {
    if (!out.empty()) out += ", ";
    out += entry.ifname + " " + entry.address.host_string();
  }
  return out.empty() ? "none" : out;
}

void set_nonblocking(int fd) {
  const int flags = fcntl(fd, F_GETFL, 0);
  if (flags >= 0) fcntl(fd, F_SETFL, flags | O_NONBLOCK);
}

void set_nodelay(int fd) {
  const int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

SocketAddress wildcard_address(int family, std::uint16_t port) {
  SocketAddress out;
  if (family == AF_INET6) {
    auto& sin6 = reinterpret_cast<sockaddr_in6&>(out.storage);
    sin6.sin6_family = AF_INET6;
    sin6.sin6_addr = in6addr_any;
    sin6.sin6_port = htons(port);
    out.length = sizeof(sockaddr_in6);
  } else {
    auto& sin = reinterpret_cast<sockaddr_in&>(out.storage);
    sin.sin_family = AF_INET;
    sin.sin_addr.s_addr = htonl(INADDR_ANY);
    sin.sin_port = htons(port);
    out.length = sizeof(sockaddr_in);
  }
  return out;
}

std::optional<SocketAddress> numeric_address(const std::string& host, std::uint16_t port) {
  SocketAddress out;
  auto& sin = reinterpret_cast<sockaddr_in&>(out.storage);
  auto& sin6 = reinterpret_cast<sockaddr_in6&>(out.storage);
  if (inet_pton(AF_INET, host.c_str(), &sin.sin_addr) == 1) {
    sin.sin_family = AF_INET;
    out.length = sizeof(sockaddr_in);
  } else if (inet_pton(AF_INET6, host.c_str(), &sin6.sin6_addr) == 1) {
    sin6.sin6_family = AF_INET6;
    out.length = sizeof(sockaddr_in6);
  } else {
    return std::nullopt;
  }
  out.set_port(port);
  return out;
}

SocketAddress loopback_address(int family, std::uint16_t port) {
  return *numeric_address(family == AF_INET6 ? "::1" : "127.0.0.1", port);
}

Fd listen_on(const SocketAddress& address, int backlog) {
  Fd fd(::socket(address.family(), SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!fd.valid()) {
    throw Error(WIA_ERROR_IO, fmt::format("bootstrap: cannot create a socket for {}: {}",
                                          address.to_string(), std::strerror(errno)));
  }
  const int one = 1;
  setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (address.family() == AF_INET6) {
    const int zero = 0;  // a wildcard [::] listener also takes IPv4 clients
    setsockopt(fd.get(), IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);
  }
  if (::bind(fd.get(), reinterpret_cast<const sockaddr*>(&address.storage), address.length) != 0 ||
      ::listen(fd.get(), backlog) != 0) {
    throw Error(WIA_ERROR_IO, fmt::format("bootstrap: cannot listen on {}: {}", address.to_string(),
                                          std::strerror(errno)));
  }
  return fd;
}

SocketAddress local_address(int fd) {
  SocketAddress out;
  out.length = sizeof out.storage;
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&out.storage), &out.length) != 0) out.length = 0;
  return out;
}

SocketAddress peer_address(int fd) {
  SocketAddress out;
  out.length = sizeof out.storage;
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&out.storage), &out.length) != 0) out.length = 0;
  return out;
}

Fd connect_before(const SocketAddress& address, Deadline deadline, int* error) {
  Fd fd(::socket(address.family(), SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!fd.valid()) {
    *error = errno;
    return Fd();
  }
  if (::connect(fd.get(), reinterpret_cast<const sockaddr*>(&address.storage), address.length) ==
      0) {
    set_nodelay(fd.get());
    return fd;
  }
  if (errno != EINPROGRESS) {
    *error = errno;
    return Fd();
  }
  for (;;) {
    pollfd p{fd.get(), POLLOUT, 0};
    const int ready = ::poll(&p, 1, ms_until(deadline));
    if (ready < 0 && errno == EINTR) continue;
    if (ready <= 0) {
      *error = ready == 0 ? ETIMEDOUT : errno;
      return Fd();
    }
    int so_error = 0;
    socklen_t len = sizeof so_error;
    getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &so_error, &len);
    if (so_error != 0) {
      *error = so_error;
      return Fd();
    }
    set_nodelay(fd.get());
    return fd;
  }
}

namespace {

// Waits for `events` on fd, or the wake fd, or the deadline.
IoResult wait_for(int fd, short events, Deadline deadline, int wake_fd, int* error) {
  for (;;) {
    pollfd p[2] = {{fd, events, 0}, {wake_fd, POLLIN, 0}};
    const int ready = ::poll(p, wake_fd >= 0 ? 2 : 1, ms_until(deadline));
    if (ready < 0) {
      if (errno == EINTR) continue;
      *error = errno;
      return IoResult::kError;
    }
    if (wake_fd >= 0 && (p[1].revents & POLLIN) != 0) return IoResult::kWoken;
    if (ready == 0) return IoResult::kTimeout;
    return IoResult::kOk;  // readable/writable, or an error the next call reports
  }
}

}  // namespace

IoResult send_all(int fd, std::span<const std::uint8_t> data, Deadline deadline, int wake_fd,
                  int* error) {
  std::size_t done = 0;
  while (done < data.size()) {
    const ssize_t n = ::send(fd, data.data() + done, data.size() - done, MSG_NOSIGNAL);
    if (n > 0) {
      done += static_cast<std::size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK) {
      *error = errno;
      return errno == EPIPE || errno == ECONNRESET ? IoResult::kClosed : IoResult::kError;
    }
    const IoResult waited = wait_for(fd, POLLOUT, deadline, wake_fd, error);
    if (waited != IoResult::kOk) return waited;
  }
  return IoResult::kOk;
}

IoResult recv_all(int fd, std::span<std::uint8_t> data, Deadline deadline, int wake_fd,
                  int* error) {
  std::size_t done = 0;
  while (done < data.size()) {
    const ssize_t n = ::recv(fd, data.data() + done, data.size() - done, 0);
    if (n > 0) {
      done += static_cast<std::size_t>(n);
      continue;
    }
    if (n == 0) return IoResult::kClosed;
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) {
      *error = errno;
      return errno == ECONNRESET ? IoResult::kClosed : IoResult::kError;
    }
    const IoResult waited = wait_for(fd, POLLIN, deadline, wake_fd, error);
    if (waited != IoResult::kOk) return waited;
  }
  return IoResult::kOk;
}

}  // namespace wia::bootstrap
