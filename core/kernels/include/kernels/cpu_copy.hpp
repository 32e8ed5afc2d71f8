// SPDX-License-Identifier: Apache-2.0
// Copies whose destination is written around the caches (non-temporal
// stores), for outputs too large to be read again from cache: a store that
// misses otherwise first reads its line from memory (read for ownership),
// so a plain copy to memory moves three bytes per byte copied and a
// streaming one two. glibc's memcpy streams only above its own threshold
// (99 MiB on the 2026-12-05 host), which a copy split into chunks never
// reaches.
#pragma once

#include <cstddef>

namespace wia::kernels {

// memcpy(dst, src, bytes) with non-temporal stores where the CPU has them
// (x86-64: SSE2, 16-byte stores after an unaligned head; elsewhere plain
// memcpy). The stores are weakly ordered: call streaming_fence() before
// publishing the data to another thread.
void copy_streaming(void* dst, const void* src, std::size_t bytes) noexcept;

// Orders the streaming stores before later stores (x86 sfence).
void streaming_fence() noexcept;

}  // namespace wia::kernels
