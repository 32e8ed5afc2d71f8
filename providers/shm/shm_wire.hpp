// SPDX-License-Identifier: Apache-2.0
// What the two processes of an shm connection share: the listener handle,
// the hello/welcome messages of the Unix-socket handshake, the layout of
// the shared segment and the records in its rings. Everything here is read
// from memory the peer can write, so every field is validated before use
// (see RxRing::next in shm.hpp). Tests include this header to
// play a misbehaving peer.
#pragma once

#include <wia/provider.h>

#include <atomic>
#include <cstddef>
#include <cstdint>

namespace wia::shm::wire {

constexpr std::uint64_t kHandleMagic = 0x31764d4853414957ull;   // "WIASHMv1"
constexpr std::uint32_t kHelloMagic = 0x6c6c6548u;              // "Hell"
constexpr std::uint32_t kWelcomeMagic = 0x636c6557u;            // "Welc"
constexpr std::uint64_t kSegmentMagic = 0x4745534d48534957ull;  // "WISHMSEG"
constexpr std::uint32_t kProtocolVersion = 1;
constexpr std::size_t kSecretSize = 16;
constexpr std::size_t kSocketNameSize = 48;

// The listener handle (WIA_TRANSPORT_HANDLE_SIZE bytes, zero padded).
struct Handle {
  std::uint64_t magic;
  std::uint32_t version;
  std::uint32_t listener_pid;
  std::uint8_t boot_id[16];  // this node's /proc/sys/kernel/random/boot_id
  std::uint8_t secret[kSecretSize];
  char socket_name[kSocketNameSize];  // abstract namespace, without the leading NUL
};
static_assert(sizeof(Handle) <= WIA_TRANSPORT_HANDLE_SIZE);

// Connector -> listener, with the segment's memfd in SCM_RIGHTS.
struct Hello {
  std::uint32_t magic;
  std::uint32_t version;
  std::uint8_t secret[kSecretSize];
  std::uint64_t cookie;
  std::uint64_t ring_size;   // bytes of each direction's ring
  std::uint64_t probe_addr;  // a word of the connector the listener may try to read (CMA probe)
  std::uint64_t probe_value;
  std::uint32_t pid;
  std::uint32_t flags;  // kCmaAllowed when the connector lets the peer read its memory
};

// Listener -> connector: the connection is up.
struct Welcome {
  std::uint32_t magic;
  std::uint32_t version;
  std::uint64_t probe_addr;
  std::uint64_t probe_value;
  std::uint32_t pid;
  std::uint32_t flags;
};

constexpr std::uint32_t kCmaAllowed = 1u;

// Remote-access key of a registered region (WIA_RKEY_SIZE bytes, zero
// padded): put/get reach [base, base + len) of process `pid` with CMA.
constexpr std::uint64_t kRkeyMagic = 0x3179654b4d485357ull;  // "WSHMKey1"
struct Rkey {
  std::uint64_t magic;
  std::uint32_t pid;
  std::uint32_t reserved;
  std::uint64_t base;
  std::uint64_t len;
};
static_assert(sizeof(Rkey) <= WIA_RKEY_SIZE);

// Segment: header, two ring controls, two ring data areas. Direction 0
// carries connector -> listener traffic, direction 1 the reverse.
struct alignas(64) RingControl {
  std::atomic<std::uint64_t> head;  // bytes ever produced; written by the producer only
  char pad0[56];
  std::atomic<std::uint64_t> tail;  // bytes ever consumed; written by the consumer only
  char pad1[56];
};
static_assert(sizeof(RingControl) == 128);
static_assert(std::atomic<std::uint64_t>::is_always_lock_free);

struct alignas(64) SegmentHeader {
  std::uint64_t magic;
  std::uint64_t ring_size;
  char pad[48];
  RingControl ring[2];
};

constexpr std::size_t segment_size(std::uint64_t ring_size) {
  return sizeof(SegmentHeader) + 2 * static_cast<std::size_t>(ring_size);
}
constexpr std::size_t ring_data_offset(int direction, std::uint64_t ring_size) {
  return sizeof(SegmentHeader) + static_cast<std::size_t>(direction) * ring_size;
}

// Records are 64-byte aligned: a header, then `len` payload bytes.
enum RecordType : std::uint16_t {
  kPad = 1,    // skip to the end of the ring (len = bytes skipped after the header)
  kEager = 2,  // a whole message inline: tag, msg_size == len
  kRts = 3,    // ready to send: tag, msg_size, id = send id, addr = sender buffer
  kCts = 4,    // clear to send (staged): id = send id, addr = receiver's recv id
  kData = 5,   // a chunk of a staged message: id = recv id, addr = offset, len bytes
  kFin = 6,    // a send is finished by the receiver: id = send id, flags kFinError on failure
};
constexpr std::uint16_t kRtsCmaOk = 1u;  // RTS: the receiver may read the buffer with CMA
constexpr std::uint16_t kFinError = 1u;  // FIN: the receive failed (buffer too small, ...)

struct RecordHeader {
  std::uint16_t type;
  std::uint16_t flags;
  std::uint32_t seq;  // consecutive per direction, starting at 0
  std::uint64_t tag;
  std::uint64_t len;  // payload bytes following this header in the ring
  std::uint64_t msg_size;
  std::uint64_t id;
  std::uint64_t addr;
};
static_assert(sizeof(RecordHeader) == 48);
constexpr std::uint64_t kRecordAlign = 64;

constexpr std::uint64_t record_span(std::uint64_t len) {
  return (sizeof(RecordHeader) + len + kRecordAlign - 1) & ~(kRecordAlign - 1);
}

}  // namespace wia::shm::wire
