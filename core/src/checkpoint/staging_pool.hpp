// SPDX-License-Identifier: Apache-2.0
// Host memory that saves stage tensors in. A save's blocking time is its
// staging copy, and first touching fresh memory costs as much as the copy
// itself (a page fault and a zeroing per 4 KiB), so buffers are kept for
// the next save (training saves the same tensors every time) and large
// ones are backed by transparent huge pages (one fault per 2 MiB). The
// free buffers kept are bounded by a quarter of physical memory.
#pragma once

#include <cstddef>

namespace wia::checkpoint {

class StagingBuffer {
 public:
  // A buffer of at least `bytes`; WIA_ERROR_OUT_OF_MEMORY when none can be had.
  static StagingBuffer take(std::size_t bytes);
  StagingBuffer() = default;
  StagingBuffer(StagingBuffer&& o) noexcept;
  StagingBuffer& operator=(StagingBuffer&& o) noexcept;
  ~StagingBuffer();  // back to the pool

  std::byte* data() const { return data_; }

 private:
  std::byte* data_ = nullptr;
  std::size_t capacity_ = 0;
};

// Unmaps every free buffer (wia_finalize).
void release_staging_pool() noexcept;

}  // namespace wia::checkpoint
