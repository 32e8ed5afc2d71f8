// SPDX-License-Identifier: Apache-2.0
// fuzz_shm_ring: the shm transport's ring records (providers/shm/shm_wire.hpp)
// as the receiving process reads them from the segment its peer writes:
// RxRing::next, the validation every record header passes before the
// provider looks at its payload, and RxRing::consume.
//
// Input: [u8 ring size / 64 - 4][u32 tail / 64][u32 head - tail][u32 seq]
// then the ring's bytes. A hostile or broken peer controls the head index
// and every byte of the ring; the receiver controls its tail.
//
// Invariants beyond "no crash":
//  - a record handed on lies wholly inside the ring: its header and its
//    len payload bytes end at or before the ring's end (the provider copies
//    len bytes from the payload pointer);
//  - records are consecutive (their seq counts up from the receiver's) and
//    consuming them never moves the tail past the peer's head;
//  - a record refused is refused with a reason.
#include <vector>

#include "fuzz_common.hpp"
#include "shm.hpp"

namespace {

namespace shm = wia::shm;
using wia::fuzz::check;

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  wia::fuzz::Bytes in(data, size);
  const std::uint64_t ring_size = 64 * (4 + in.u8() % 61);
  const std::uint64_t tail = std::uint64_t{in.u32()} * 64;
  const std::uint64_t head = tail + in.u32();
  const std::uint32_t seq = in.u32();

  // The ring's bytes in a buffer of exactly its size, so ASan reports any
  // read past its end.
  std::vector<std::uint8_t> ring(ring_size);
  const auto body = in.take(ring_size);
  std::memcpy(ring.data(), body.data(), body.size());
  shm::wire::RingControl control;
  control.head.store(head);
  control.tail.store(tail);

  shm::RxRing rx;
  rx.ctl = &control;
  rx.data = ring.data();
  rx.size = ring_size;
  rx.tail = tail;
  rx.pos = tail % ring_size;
  rx.seq = seq;
  for (int records = 0; records < 4096; ++records) {
    shm::wire::RecordHeader h;
    const std::uint8_t* payload = nullptr;
    std::string why;
    const auto peek = rx.next(&h, &payload, &why);
    if (peek == shm::RxRing::Peek::kEmpty) break;
    if (peek == shm::RxRing::Peek::kCorrupt) {
      check(!why.empty(), "a corrupt record without a reason");
      break;
    }
    check(h.seq == seq + static_cast<std::uint32_t>(records), "records out of sequence");
    check(payload >= ring.data() + sizeof(h) && payload <= ring.data() + ring_size,
          "payload pointer outside the ring");
    check(h.len <= static_cast<std::uint64_t>(ring.data() + ring_size - payload),
          "record of " + std::to_string(h.len) + " bytes runs past the ring's end");
    // What the provider does with an eager payload: read every byte.
    volatile std::uint8_t sink = 0;
    for (std::uint64_t i = 0; i < h.len; ++i) sink = sink + payload[i];
    rx.consume(h);
    check(rx.tail <= head, "consumed past the peer's head");
    check(rx.pos == rx.tail % ring_size, "ring position lost track of the tail");
  }
  return 0;
}
