// SPDX-License-Identifier: Apache-2.0
// Allocation-free queues for the shm transport's hot path: an intrusive
// FIFO, and per-tag FIFOs kept in an open-addressing table. A message
// costs no malloc/free and no node-based hash map (posting a receive or
// buffering an unexpected message used to allocate a map node and a
// std::deque block per tag, and free them again when the tag's queue
// emptied). Only this process's own objects live here; nothing is read
// from shared memory. tests/providers/shm/test_shm_queues.cpp checks them
// against std::map<tag, std::deque>.
#pragma once

#include <cstddef>
#include <cstdint>
#include <new>

namespace wia::shm {

// FIFO of objects linked through their own `T* qnext` member: an object
// is in at most one such queue at a time.
template <class T>
struct Fifo {
  T* head = nullptr;
  T* tail = nullptr;

  bool empty() const noexcept { return head == nullptr; }
  T* front() const noexcept { return head; }
  void push_back(T* x) noexcept {
    x->qnext = nullptr;
    if (tail != nullptr)
      tail->qnext = x;
    else
      head = x;
    tail = x;
  }
  T* pop_front() noexcept {
    T* x = head;
    head = x->qnext;
    if (head == nullptr) tail = nullptr;
    x->qnext = nullptr;
    return x;
  }
  // Forgets the members (they are owned elsewhere).
  void clear() noexcept { head = tail = nullptr; }
};

// One FIFO per 64-bit tag. Linear probing in a power-of-two table kept at
// most half full; a tag's slot is freed (backward-shift deletion, no
// tombstones) when its queue empties, so tags used once do not pile up.
// Growth is the only allocation; it reports failure instead of throwing.
template <class T>
class TagQueues {
 public:
  TagQueues() = default;
  TagQueues(const TagQueues&) = delete;
  TagQueues& operator=(const TagQueues&) = delete;
  ~TagQueues() { delete[] slots_; }

  bool empty() const noexcept { return used_ == 0; }
  std::size_t tags() const noexcept { return used_; }

  // Oldest entry of `tag`, or nullptr.
  T* front(std::uint64_t tag) const noexcept {
    if (used_ == 0) return nullptr;
    const std::size_t i = find(tag);
    return i == kNone ? nullptr : slots_[i].q.head;
  }

  // Removes and returns the oldest entry of `tag`, or nullptr.
  T* pop(std::uint64_t tag) noexcept {
    if (used_ == 0) return nullptr;
    const std::size_t i = find(tag);
    if (i == kNone) return nullptr;
    T* x = slots_[i].q.pop_front();
    if (slots_[i].q.empty()) erase_at(i);
    return x;
  }

  // Appends `x` to the queue of `tag`; false only when growing the table
  // failed (out of memory), and then nothing changed.
  bool push(std::uint64_t tag, T* x) noexcept {
    if ((used_ + 1) * 2 > capacity_ && !grow()) return false;
    std::size_t i = home(tag);
    while (!slots_[i].q.empty() && slots_[i].tag != tag) i = (i + 1) & (capacity_ - 1);
    if (slots_[i].q.empty()) {
      slots_[i].tag = tag;
      ++used_;
    }
    slots_[i].q.push_back(x);
    return true;
  }

  // Forgets every entry (they are owned elsewhere); keeps the table.
  void clear() noexcept {
    for (std::size_t i = 0; i < capacity_; ++i) slots_[i].q.clear();
    used_ = 0;
  }

  // Calls f(T*) on every entry; f may destroy the entry. Leaves the
  // table empty.
  template <class F>
  void drain(F&& f) {
    for (std::size_t i = 0; i < capacity_; ++i) {
      T* x = slots_[i].q.head;
      slots_[i].q.clear();
      while (x != nullptr) {
        T* next = x->qnext;
        f(x);
        x = next;
      }
    }
    used_ = 0;
  }

 private:
  struct Slot {
    std::uint64_t tag = 0;
    Fifo<T> q;  // empty: the slot is free
  };
  static constexpr std::size_t kNone = ~std::size_t{0};

  std::size_t home(std::uint64_t tag) const noexcept {
    // Fibonacci hashing: tags are often small or differ only in high bits.
    return static_cast<std::size_t>((tag * 0x9E3779B97F4A7C15ull) >> shift_);
  }

  std::size_t find(std::uint64_t tag) const noexcept {
    for (std::size_t i = home(tag);; i = (i + 1) & (capacity_ - 1)) {
      if (slots_[i].q.empty()) return kNone;
      if (slots_[i].tag == tag) return i;
    }
  }

  // Frees slot `hole`, moving later members of its probe run back so that
  // every entry stays reachable from its home slot.
  void erase_at(std::size_t hole) noexcept {
    const std::size_t mask = capacity_ - 1;
    for (std::size_t j = (hole + 1) & mask; !slots_[j].q.empty(); j = (j + 1) & mask) {
      const std::size_t h = home(slots_[j].tag);
      // Entry j may fill the hole unless its home lies cyclically in (hole, j].
      const bool stays = hole <= j ? (h > hole && h <= j) : (h > hole || h <= j);
      if (!stays) {
        slots_[hole] = slots_[j];
        hole = j;
      }
    }
    slots_[hole].q.clear();
    --used_;
  }

  bool grow() noexcept {
    const std::size_t cap = capacity_ == 0 ? 16 : capacity_ * 2;
    Slot* fresh = new (std::nothrow) Slot[cap];
    if (fresh == nullptr) return false;
    Slot* old = slots_;
    const std::size_t old_cap = capacity_;
    slots_ = fresh;
    capacity_ = cap;
    unsigned bits = 0;
    while ((std::size_t{1} << bits) < cap) ++bits;
    shift_ = 64 - bits;
    for (std::size_t k = 0; k < old_cap; ++k) {
      if (old[k].q.empty()) continue;
      std::size_t i = home(old[k].tag);
      while (!slots_[i].q.empty()) i = (i + 1) & (capacity_ - 1);
      slots_[i] = old[k];
    }
    delete[] old;
    return true;
  }

  Slot* slots_ = nullptr;
  std::size_t capacity_ = 0;
  std::size_t used_ = 0;
  unsigned shift_ = 64;
};

}  // namespace wia::shm
