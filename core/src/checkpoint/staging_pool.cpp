// SPDX-License-Identifier: Apache-2.0
#include "checkpoint/staging_pool.hpp"

#include <fmt/format.h>
#include <sys/mman.h>
#include <unistd.h>

#include <map>
#include <mutex>

#include "common/error.hpp"

namespace wia::checkpoint {
namespace {

constexpr std::size_t kHugePage = std::size_t{2} << 20;

struct Pool {
  std::mutex mu;
  std::multimap<std::size_t, std::byte*> free;  // capacity -> buffer
  std::size_t free_bytes = 0;
  std::size_t limit = static_cast<std::size_t>(sysconf(_SC_PHYS_PAGES)) *
                      static_cast<std::size_t>(sysconf(_SC_PAGESIZE)) / 4;
};

Pool& pool() {
  static auto* p = new Pool();
  return *p;
}

std::size_t rounded(std::size_t bytes) {
  const std::size_t unit = bytes >= kHugePage ? kHugePage : 4096;
  return (std::max<std::size_t>(bytes, 1) + unit - 1) / unit * unit;
}

}  // namespace

StagingBuffer StagingBuffer::take(std::size_t bytes) {
  const std::size_t cap = rounded(bytes);
  StagingBuffer b;
  {
    Pool& p = pool();
    std::lock_guard lock(p.mu);
    // The smallest free buffer that fits, if it is not wastefully large.
    const auto it = p.free.lower_bound(cap);
    if (it != p.free.end() && it->first <= 2 * cap) {
      b.data_ = it->second;
      b.capacity_ = it->first;
      p.free_bytes -= it->first;
      p.free.erase(it);
      return b;
    }
  }
  void* m = ::mmap(nullptr, cap, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED)
    throw Error(WIA_ERROR_OUT_OF_MEMORY,
                fmt::format("cannot map a staging buffer of {} bytes for a checkpoint", cap));
  if (cap >= kHugePage) ::madvise(m, cap, MADV_HUGEPAGE);  // advice: fine if refused
  b.data_ = static_cast<std::byte*>(m);
  b.capacity_ = cap;
  return b;
}

StagingBuffer::StagingBuffer(StagingBuffer&& o) noexcept : data_(o.data_), capacity_(o.capacity_) {
  o.data_ = nullptr;
  o.capacity_ = 0;
}

StagingBuffer& StagingBuffer::operator=(StagingBuffer&& o) noexcept {
  if (this != &o) {
    StagingBuffer drop(std::move(*this));
    data_ = o.data_;
    capacity_ = o.capacity_;
    o.data_ = nullptr;
    o.capacity_ = 0;
  }
  return *this;
}

StagingBuffer::~StagingBuffer() {
  if (data_ == nullptr) return;
  Pool& p = pool();
  {
    std::lock_guard lock(p.mu);
    if (p.free_bytes + capacity_ <= p.limit) {
      p.free.emplace(capacity_, data_);
      p.free_bytes += capacity_;
      return;
    }
  }
  ::munmap(data_, capacity_);
}

void release_staging_pool() noexcept {
  Pool& p = pool();
  std::lock_guard lock(p.mu);
  for (const auto& [cap, data] : p.free) ::munmap(data, cap);
  p.free.clear();
  p.free_bytes = 0;
}

}  // namespace wia::checkpoint
