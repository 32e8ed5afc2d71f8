// SPDX-License-Identifier: Apache-2.0
// kernels::copy_streaming (core/kernels/include/kernels/cpu_copy.hpp)
// against a byte-by-byte reference: every destination alignment, lengths
// around the 16-byte head and the 64-byte body, and nothing written
// outside [dst, dst + bytes).
#include <doctest/doctest.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "kernels/cpu_copy.hpp"

TEST_CASE("copy_streaming copies exactly the bytes asked, at every alignment") {
  constexpr std::size_t kGuard = 64;
  std::vector<std::uint8_t> src(4096 + 64);
  for (std::size_t i = 0; i < src.size(); ++i) src[i] = static_cast<std::uint8_t>(i * 131 + 7);
  for (std::size_t dst_misalign = 0; dst_misalign < 16; ++dst_misalign)
    for (std::size_t src_misalign : {0, 1, 8, 13})
      for (std::size_t bytes : {0, 1, 15, 16, 17, 63, 64, 65, 127, 128, 129, 1000, 4096}) {
        std::vector<std::uint8_t> dst(kGuard + 16 + bytes + kGuard, 0xAB);
        std::uint8_t* d = dst.data() + kGuard + dst_misalign;
        const std::uint8_t* s = src.data() + src_misalign;
        wia::kernels::copy_streaming(d, s, bytes);
        wia::kernels::streaming_fence();
        std::size_t wrong = 0;
        for (std::size_t i = 0; i < dst.size(); ++i) {
          const std::uint8_t* at = dst.data() + i;
          const bool inside = at >= d && at < d + bytes;
          const std::uint8_t want = inside ? s[at - d] : 0xAB;
          wrong += dst[i] != want;
        }
        INFO("dst misaligned by ", dst_misalign, ", src by ", src_misalign, ", ", bytes, " bytes");
        CHECK(wrong == 0);
      }
}
