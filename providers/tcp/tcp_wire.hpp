// SPDX-License-Identifier: Apache-2.0
// The tcp provider's bytes on the wire: the listen handle, the hello each
// connecting socket sends, and the header of every control message.
//
// All integers are in the sender's byte order; the magic numbers make a
// peer of the other byte order fail the validation (mixed-endian clusters
// are not supported, and the error says so). Every structure has a fixed
// size that is checked at compile time, so a reader can never be told to
// read "more header".
#pragma once

#include <wia/provider.h>

#include <cstddef>
#include <cstdint>

namespace wia::tcp {

inline constexpr std::uint16_t kWireVersion = 1;

// --- listen handle (WIA_TRANSPORT_HANDLE_SIZE bytes, carried by the core) ---
inline constexpr std::uint32_t kHandleMagic = 0x57544348u;  // "WTCH"
inline constexpr std::size_t kSecretSize = 16;

struct WireHandle {
  std::uint32_t magic;
  std::uint16_t version;
  std::uint16_t family;              // AF_INET or AF_INET6
  std::uint16_t port;                // network byte order, as in sockaddr
  std::uint16_t reserved;            // 0
  std::uint32_t scope_id;            // IPv6 link-local scope, else 0
  std::uint8_t addr[16];             // in_addr (first 4 bytes) or in6_addr
  std::uint8_t secret[kSecretSize];  // getrandom() per listener
};
static_assert(sizeof(WireHandle) == 48);
static_assert(sizeof(WireHandle) <= WIA_TRANSPORT_HANDLE_SIZE);

// --- hello: first bytes on every socket of a connection, connector -> listener ---
inline constexpr std::uint32_t kHelloMagic = 0x57544c4fu;  // "WTLO"
inline constexpr std::uint16_t kMaxDataStreams = 16;

struct WireHello {
  std::uint32_t magic;
  std::uint16_t version;
  std::uint16_t stream;     // 0 = control socket, 1..nstreams = data sockets
  std::uint16_t nstreams;   // data sockets of this connection, 1..kMaxDataStreams
  std::uint16_t reserved;   // 0
  std::uint32_t reserved2;  // 0
  std::uint8_t secret[kSecretSize];
  std::uint64_t cookie;   // the core's cookie, handed to accept()
  std::uint64_t conn_id;  // random per connect(): groups the sockets of one connection
};
static_assert(sizeof(WireHello) == 48);

// --- control messages (control socket, both directions) ---
inline constexpr std::uint32_t kMsgMagic = 0x5754434du;  // "WTCM"

enum class MsgType : std::uint8_t {
  eager = 1,  // header + `size` payload bytes inline on the control socket
  rts = 2,    // ready to send: `size` bytes wait at the sender for a CTS
  cts = 3,    // clear to send RTS number `seq`; the payload goes over the data sockets
  nak = 4     // RTS number `seq` is refused: the matching receive is too small
};

struct WireMsg {
  std::uint32_t magic;
  std::uint8_t version;
  std::uint8_t type;     // MsgType
  std::uint16_t slices;  // cts: data sockets the payload is striped over; else 0
  std::uint32_t seq;     // eager/rts: per-direction message number; cts/nak: the RTS's
  std::uint32_t check;   // checksum of the other fields (msg_check)
  std::uint64_t tag;
  std::uint64_t size;
};
static_assert(sizeof(WireMsg) == 32);

// FNV-1a over every field but `check`: catches corrupted or misaligned
// headers (a peer that lost track of framing), not an attacker.
inline std::uint32_t msg_check(const WireMsg& m) {
  std::uint32_t h = 2166136261u;
  auto mix = [&h](std::uint64_t v, int bytes) {
    for (int i = 0; i < bytes; ++i) {
      h ^= static_cast<std::uint8_t>(v >> (8 * i));
      h *= 16777619u;
    }
  };
  mix(m.magic, 4);
  mix(m.version, 1);
  mix(m.type, 1);
  mix(m.slices, 2);
  mix(m.seq, 4);
  mix(m.tag, 8);
  mix(m.size, 8);
  return h;
}

inline WireMsg make_msg(MsgType type, std::uint32_t seq, std::uint64_t tag, std::uint64_t size,
                        std::uint16_t slices = 0) {
  WireMsg m{};
  m.slices = slices;
  m.magic = kMsgMagic;
  m.version = static_cast<std::uint8_t>(kWireVersion);
  m.type = static_cast<std::uint8_t>(type);
  m.seq = seq;
  m.tag = tag;
  m.size = size;
  m.check = msg_check(m);
  return m;
}

}  // namespace wia::tcp
