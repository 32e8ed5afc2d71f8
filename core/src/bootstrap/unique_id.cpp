// SPDX-License-Identifier: Apache-2.0
// The unique id (bootstrap.hpp: UniqueId), NCCL style: create_unique_id()
// starts a root in this process and packs its address and the job's secret
// into 128 bytes; describe_unique_id() and from_unique_id() unpack them.
//
// Layout (multi-byte fields little-endian unless said otherwise):
//   0  "WIAU"        magic
//   4  u8            version (kIdVersion)
//   5  u8            4 = IPv4, 6 = IPv6
//   6  u16 big-end.  port
//   8  16 bytes      address (IPv4 in the first 4)
//   24 u32           IPv6 scope id
//   28 16 bytes      secret
//   44 u64           SipHash-2-4 under the all-zero key of bytes 0..43
//   52..127          zero
#include <arpa/inet.h>
#include <fmt/core.h>
#include <netinet/in.h>

#include <cstring>
#include <span>
#include <string_view>

#include "bootstrap/bootstrap.hpp"
#include "bootstrap/hosted_roots.hpp"
#include "bootstrap/join.hpp"
#include "bootstrap/wire.hpp"
#include "common/error.hpp"
#include "common/log.hpp"

namespace wia::bootstrap {

namespace {

constexpr std::string_view kTag = "bootstrap";
constexpr char kIdMagic[4] = {'W', 'I', 'A', 'U'};
constexpr std::uint8_t kIdVersion = 1;
constexpr std::size_t kIdCheckedBytes = 44;  // bytes covered by the check field

// What an id holds.
struct Ticket {
  SocketAddress address;
  Secret secret;
};

UniqueId encode_id(const SocketAddress& address, const Secret& secret) {
  UniqueId id;
  auto& b = id.bytes;
  std::memcpy(b.data(), kIdMagic, 4);
  b[4] = kIdVersion;
  b[5] = address.family() == AF_INET6 ? 6 : 4;
  b[6] = static_cast<std::uint8_t>(address.port() >> 8);
  b[7] = static_cast<std::uint8_t>(address.port() & 0xff);
  if (address.family() == AF_INET6) {
    const auto& sin6 = reinterpret_cast<const sockaddr_in6&>(address.storage);
    std::memcpy(b.data() + 8, &sin6.sin6_addr, 16);
    wire::store_le(b.data() + 24, sin6.sin6_scope_id, 4);
  } else {
    const auto& sin = reinterpret_cast<const sockaddr_in&>(address.storage);
    std::memcpy(b.data() + 8, &sin.sin_addr, 4);
  }
  std::memcpy(b.data() + 28, secret.bytes.data(), 16);
  // A check over the rest catches ids mangled in transit (not forgery: the
  // key is public).
  wire::store_le(b.data() + kIdCheckedBytes,
                 siphash24(Secret{}, std::span<const std::uint8_t>(b.data(), kIdCheckedBytes)), 8);
  return id;
}

Ticket decode_id(const UniqueId& id) {
  const auto& b = id.bytes;
  const bool intact =
      std::memcmp(b.data(), kIdMagic, 4) == 0 && b[4] == kIdVersion && (b[5] == 4 || b[5] == 6) &&
      wire::load_le(b.data() + kIdCheckedBytes, 8) ==
          siphash24(Secret{}, std::span<const std::uint8_t>(b.data(), kIdCheckedBytes));
  if (!intact) {
    throw Error(WIA_ERROR_INVALID_ARGUMENT,
                "bootstrap: the unique id is corrupt or was not made by create_unique_id() (bad "
                "magic, version or check)");
  }
  Ticket t;
  const std::uint16_t port = static_cast<std::uint16_t>((b[6] << 8) | b[7]);
  if (b[5] == 6) {
    auto& sin6 = reinterpret_cast<sockaddr_in6&>(t.address.storage);
    sin6.sin6_family = AF_INET6;
    std::memcpy(&sin6.sin6_addr, b.data() + 8, 16);
    sin6.sin6_scope_id = static_cast<std::uint32_t>(wire::load_le(b.data() + 24, 4));
    t.address.length = sizeof(sockaddr_in6);
  } else {
    auto& sin = reinterpret_cast<sockaddr_in&>(t.address.storage);
    sin.sin_family = AF_INET;
    std::memcpy(&sin.sin_addr, b.data() + 8, 4);
    t.address.length = sizeof(sockaddr_in);
  }
  t.address.set_port(port);
  std::memcpy(t.secret.bytes.data(), b.data() + 28, 16);
  return t;
}

}  // namespace

UniqueId create_unique_id(const Options& options) {
  const auto interfaces = list_interfaces();
  const auto chosen = choose_interface(interfaces, options.ifname, options.family);
  if (!chosen) {
    throw Error(
        WIA_ERROR_CONFIG,
        fmt::format(
            "bootstrap: no usable interface address{}{}; interfaces: {}",
            options.ifname.empty() ? "" : " matches WIA_SOCKET_IFNAME='" + options.ifname + "'",
            options.family == AF_INET    ? " (IPv4 only)"
            : options.family == AF_INET6 ? " (IPv6 only)"
                                         : "",
            describe_interfaces(interfaces)));
  }
  Fd listener = listen_on(chosen->address, 1024);
  SocketAddress advertised = chosen->address;
  advertised.set_port(local_address(listener.get()).port());
  const Secret secret = random_secret();
  start_hosted_root(std::move(listener), secret, options, 0);
  log::debug(kTag, "unique id leads to {} (interface {})", advertised.to_string(), chosen->ifname);
  return encode_id(advertised, secret);
}

std::string describe_unique_id(const UniqueId& id) { return decode_id(id).address.to_string(); }

std::unique_ptr<Bootstrap> Bootstrap::from_unique_id(const UniqueId& id, int rank, int size,
                                                     const Options& options) {
  const Ticket ticket = decode_id(id);
  Target target{{ticket.address}, ticket.secret, ticket.address.to_string()};
  return Joiner::join([&](std::string*) { return target; }, rank, size, options,
                      find_hosted_root(ticket.secret), false);
}

}  // namespace wia::bootstrap
