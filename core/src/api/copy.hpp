// SPDX-License-Identifier: Apache-2.0
// Copy planning for the memory and peer-to-peer API: find each pointer's
// device, check ranges, and pick direct, peer or host-staged execution.
#pragma once

#include <wia/wia.h>

#include <cstddef>

namespace wia::api {

enum class CopyMode { sync, async };

// Plain copy (wia_memcpy*): same device, host<->device, or device<->device
// (delegates to peer_copy when the devices differ).
void copy(void* dst, const void* src, std::size_t size, wia_stream_t stream, CopyMode mode);
// wia_memset*.
void set(void* ptr, int value, std::size_t size, wia_stream_t stream, CopyMode mode);
// wia_memcpy_peer*: direct when the devices can peer, otherwise staged
// through pinned host memory.
void peer_copy(void* dst, const void* src, std::size_t size, wia_stream_t stream, CopyMode mode);

// Validates one copy without enqueuing it (for all-or-nothing batches);
// throws with a message naming the problem.
void validate_copy(void* dst, const void* src, std::size_t size);

}  // namespace wia::api
