// SPDX-License-Identifier: Apache-2.0
// Which copy of the codecs' hot loops runs (compress/simd.hpp).
#include "compress/simd.hpp"

#include <atomic>

#include "compress/codec.hpp"

namespace wia::compress {
namespace {

bool cpu_has_avx2() noexcept {
#if defined(WIA_CODEC_HAVE_AVX2)
  return __builtin_cpu_supports("avx2");
#else
  return false;
#endif
}

std::atomic<bool>& avx2_on() noexcept {
  static std::atomic<bool> on{cpu_has_avx2()};
  return on;
}

}  // namespace

bool use_avx2() noexcept { return avx2_on().load(std::memory_order_relaxed); }

bool codec_force_baseline(bool on) noexcept {
  const bool have = cpu_has_avx2();
  avx2_on().store(have && !on, std::memory_order_relaxed);
  return have;
}

}  // namespace wia::compress
