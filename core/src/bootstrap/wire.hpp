// SPDX-License-Identifier: Apache-2.0
// The bootstrap wire format: a 16-byte frame header and little-endian
// payloads, encoded byte by byte so ranks of any endianness agree. Every
// length read from the network is checked against a bound before anything
// is allocated; a frame that breaks a rule is a ProtocolError, which costs
// the sender its connection and nothing else.
//
//   offset 0  u32 magic    0x42414957 ("WIAB" in memory order)
//   offset 4  u16 version  kWireVersion
//   offset 6  u16 type     FrameType
//   offset 8  u32 length   payload bytes that follow the header
//   offset 12 u32 reserved must be 0
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace wia::bootstrap::wire {

inline constexpr std::uint32_t kMagic = 0x42414957;
inline constexpr std::uint16_t kWireVersion = 1;
inline constexpr std::size_t kHeaderBytes = 16;
inline constexpr std::size_t kNonceBytes = 16;
inline constexpr std::size_t kMacBytes = 8;

// Largest blob one rank may contribute to an all-gather, send point to
// point, or store under one key. The bootstrap carries connection handles
// and small tables, not data.
inline constexpr std::size_t kMaxBlobBytes = 1 << 20;
inline constexpr std::size_t kMaxKeyBytes = 1024;
inline constexpr std::size_t kMaxTextBytes = 4096;  // host ids, error text
// Bound on any frame a rank sends to the root (a blob plus its fields).
inline constexpr std::size_t kMaxRequestBytes = kMaxBlobBytes + kMaxKeyBytes + 64;
// Bound on a frame the root sends to a rank, other than all-gather results
// (whose exact length the rank knows in advance).
inline constexpr std::size_t kMaxReplyBytes = kMaxBlobBytes + kMaxTextBytes + 64;
// Largest job the bootstrap accepts; bounds tables sized by the rank count.
inline constexpr std::uint32_t kMaxRanks = 1u << 20;

enum class FrameType : std::uint16_t {
  // Handshake.
  kChallenge = 1,  // root -> rank: server nonce
  kAuth = 2,       // rank -> root: client nonce, MAC(server nonce, client nonce)
  kAuthOk = 3,     // root -> rank: MAC(client nonce, server nonce): the root knows the secret too
  kHello = 4,      // rank -> root: rank, size, pid, host id, host name
  kWelcome = 5,    // root -> rank: every rank's host id (the rendezvous is complete)
  // Collectives (all-gather; a barrier is an all-gather of nothing).
  kGather = 6,        // rank -> root: seq, kind, blob
  kGatherResult = 7,  // root -> rank: seq, every rank's blob in rank order
  // Point to point and key-value.
  kSend = 8,     // rank -> root: dst, tag, blob
  kDeliver = 9,  // root -> rank: src, tag, blob
  kPut = 10,     // rank -> root: key, value
  kGet = 11,     // rank -> root: request id, key (answered when the key exists)
  kValue = 12,   // root -> rank: request id, value
  // Failure and shutdown.
  kAbort = 13,          // rank -> root: reason; the root fails every rank
  kError = 14,          // root -> rank: status, message; the job's bootstrap has failed
  kTimeoutReport = 15,  // rank -> root: what it waited for; the root names who is missing
  kBye = 16,            // rank -> root: this rank is closing cleanly
};

const char* frame_type_name(FrameType type);

// Thrown for a malformed frame; caught by whoever owns the connection.
class ProtocolError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct Header {
  FrameType type{};
  std::uint32_t length = 0;
};

void encode_header(FrameType type, std::uint32_t length, std::uint8_t out[kHeaderBytes]);
// Validates magic, version and the reserved field (not the length: its
// bound depends on who reads and when). Throws ProtocolError naming what is
// wrong, e.g. "bad magic 0x20544547 (not a libwia bootstrap peer)".
Header decode_header(const std::uint8_t in[kHeaderBytes]);

// Little-endian fields of `n` bytes (n <= 8) outside a frame: the unique
// id's fields, a MAC as the bytes it is compared as.
inline void store_le(std::uint8_t* p, std::uint64_t v, int n) {
  for (int i = 0; i < n; ++i) p[i] = static_cast<std::uint8_t>(v >> (8 * i));
}
inline std::uint64_t load_le(const std::uint8_t* p, int n) {
  std::uint64_t v = 0;
  for (int i = n - 1; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

// Appends little-endian fields to a frame under construction.
class Writer {
 public:
  explicit Writer(FrameType type);
  Writer& u8(std::uint8_t v);
  Writer& u16(std::uint16_t v);
  Writer& u32(std::uint32_t v);
  Writer& u64(std::uint64_t v);
  Writer& i32(std::int32_t v) { return u32(static_cast<std::uint32_t>(v)); }
  Writer& bytes(std::span<const std::uint8_t> data);  // raw, no length
  Writer& blob(std::span<const std::uint8_t> data);   // u32 length + bytes
  Writer& text(std::string_view s);                   // u32 length + bytes
  // The whole frame, header included (length filled in).
  std::vector<std::uint8_t> finish();  // moves the buffer out

 private:
  std::vector<std::uint8_t> buf_;
};

// Reads fields from a payload; any read past the end, or a length above
// its bound, throws ProtocolError.
class Reader {
 public:
  explicit Reader(std::span<const std::uint8_t> payload) : data_(payload) {}
  std::uint8_t u8();
  std::uint16_t u16();
  std::uint32_t u32();
  std::uint64_t u64();
  std::int32_t i32() { return static_cast<std::int32_t>(u32()); }
  std::span<const std::uint8_t> bytes(std::size_t n);
  std::span<const std::uint8_t> blob(std::size_t max_bytes);
  std::string text(std::size_t max_bytes);
  std::size_t remaining() const { return data_.size() - pos_; }
  // Throws unless every byte was consumed (trailing junk is an error too).
  void expect_end() const;

 private:
  std::span<const std::uint8_t> data_;
  std::size_t pos_ = 0;
};

// What a rank's all-gather call was, so a mismatch can be named.
enum class GatherKind : std::uint8_t { kAllGather = 1, kBarrier = 2 };
const char* gather_kind_name(GatherKind kind);

// What a timeout report is about.
enum class WaitKind : std::uint8_t { kRendezvous = 1, kGather = 2 };

// The MAC each side of the handshake proves the secret with. `role` keeps
// the two directions distinct, so a reflected answer is not accepted.
inline constexpr std::string_view kClientRole = "wia-bootstrap-v1 rank";
inline constexpr std::string_view kServerRole = "wia-bootstrap-v1 root";

}  // namespace wia::bootstrap::wire
