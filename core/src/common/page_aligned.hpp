// SPDX-License-Identifier: Apache-2.0
// An allocator for staging buffers that the transports and the kernel
// copy into: page aligned, so that bulk copies (memcpy's `rep movsb`, the
// kernel's copy of process_vm_readv) start on a cache line and a page.
// malloc's large blocks start 16 bytes into a page.
#pragma once

#include <cstddef>
#include <new>

namespace wia {

template <class T>
struct PageAligned {
  using value_type = T;
  static constexpr std::align_val_t kAlign{4096};
  PageAligned() = default;
  template <class U>
  PageAligned(const PageAligned<U>&) noexcept {}
  T* allocate(std::size_t n) { return static_cast<T*>(::operator new(n * sizeof(T), kAlign)); }
  void deallocate(T* p, std::size_t) noexcept { ::operator delete(p, kAlign); }
  template <class U>
  bool operator==(const PageAligned<U>&) const noexcept {
    return true;
  }
};

}  // namespace wia
