// SPDX-License-Identifier: Apache-2.0
// Vectorisable CPU reduction kernels for every (datatype, op) of the spec.
// Built as a small static library (wia_cpu_kernels) so that both the host
// provider (which must not link the core) and core code that reduces in
// host memory (schedule simulator, shm/tcp receive paths) share one
// implementation.
#pragma once

#include <wia/provider.h>

#include <cstddef>
#include <cstdint>

namespace wia::kernels {

// Bytes per element of dtype, 0 for an invalid value.
std::size_t dtype_size(wia_datatype_t dtype) noexcept;
// "float32", "bfloat16", ... ; "invalid" for an unknown value.
const char* dtype_name(wia_datatype_t dtype) noexcept;
// "sum", "prod", "min", "max", "avg"; "invalid" for an unknown value.
const char* reduce_op_name(wia_reduce_op_t op) noexcept;

// dst[i] = srcs[0][i] op ... op srcs[n-1][i], then /= divisor when > 1
// (AVG with divisor 0 divides by nsrcs). Exactly the semantics documented
// for wia_reduce_args_v1_t in provider.h. Returns WIA_ERROR_INVALID_ARGUMENT
// for a bad dtype/op/nsrcs. float16/bfloat16 accumulate in float32 and
// round to nearest even once per output element.
wia_status_t reduce(const wia_reduce_args_v1_t& args) noexcept;
// reduce() without the checks, for callers that built `args` themselves
// from validated values (a hot path where the checks cost as much as
// reducing a few elements). Bad arguments are undefined behaviour.
wia_status_t reduce_unchecked(const wia_reduce_args_v1_t& args) noexcept;

// dst = a op b over `count` elements, resolved once for a caller that
// reduces two sources of one dtype and op over and over (a small
// all-reduce between two ranks): the kernel reduce_unchecked runs for
// them (dst may not alias a source), so the result is the same bit for
// bit. Empty (explicit false) for AVG, float16 and bfloat16, which take
// more than one kernel call.
struct PairReduce {
  const void* kernels = nullptr;
  void (*fn)(const void* kernels, void* dst, const void* a, const void* b,
             std::size_t count) = nullptr;
  explicit operator bool() const { return fn != nullptr; }
  void operator()(void* dst, const void* a, const void* b, std::size_t count) const {
    fn(kernels, dst, a, b, count);
  }
};
PairReduce pair_reduce(wia_datatype_t dtype, wia_reduce_op_t op) noexcept;

// The checks reduce() performs before touching memory: NULL when `args`
// is valid, otherwise a static English phrase naming the problem ("dst
// overlaps a source", ...). Lets an asynchronous caller (a provider
// stream) reject bad arguments when the work is enqueued, not when it
// runs. count == 0 is valid whatever the pointers are.
const char* reduce_args_error(const wia_reduce_args_v1_t& args) noexcept;

// Testing hook: float16 uses hardware conversions (F16C, 256- or 512-bit)
// where the CPU has them and portable bit manipulation elsewhere. Tests
// force each implementation in turn so one machine covers them all.
// Returns false (and changes nothing) when the CPU cannot run `path`.
enum class Float16Path { kAuto, kPortable, kF16c256, kF16c512 };
bool force_float16_path_for_testing(Float16Path path) noexcept;

// Scalar conversions used by the kernels, tests and tools.
float half_to_float(std::uint16_t h) noexcept;
std::uint16_t float_to_half(float f) noexcept;  // round to nearest even
float bfloat16_to_float(std::uint16_t b) noexcept;
std::uint16_t float_to_bfloat16(float f) noexcept;  // round to nearest even
// The same over n elements, vectorised (F16C where the CPU has it): the
// results equal the scalar forms bit for bit, except that F16C returns
// signalling NaNs quieted (still NaN).
void half_to_float_n(const std::uint16_t* in, float* out, std::size_t n) noexcept;
void float_to_half_n(const float* in, std::uint16_t* out, std::size_t n) noexcept;
void bfloat16_to_float_n(const std::uint16_t* in, float* out, std::size_t n) noexcept;
void float_to_bfloat16_n(const float* in, std::uint16_t* out, std::size_t n) noexcept;

}  // namespace wia::kernels
