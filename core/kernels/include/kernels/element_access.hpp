// SPDX-License-Identifier: Apache-2.0
// Reading and writing one element of any wia_datatype_t as a double: for
// tests, benchmarks and tools that fill and check buffers of every type.
// Not for hot paths.
#pragma once

#include <wia/status.h>

#include <cstdint>

namespace wia::kernels {

// Element i of a buffer of dtype, converted to double (exact for every
// integer below 2^53 and for every float16/bfloat16/float32 value).
double load_element(const void* base, std::uint64_t i, wia_datatype_t dtype) noexcept;
// Stores v into element i: integers are converted like a C cast of the
// value truncated to long long (so they wrap), floats round to nearest even.
void store_element(void* base, std::uint64_t i, wia_datatype_t dtype, double v) noexcept;

}  // namespace wia::kernels
