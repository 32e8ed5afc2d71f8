// SPDX-License-Identifier: Apache-2.0
// UTF-8 validation for text that goes into YAML files. YAML is Unicode:
// yaml-cpp's emitter writes every byte sequence that is not UTF-8 as
// U+FFFD, so two different names could be written as one and a restore
// would give back a name that was never saved. Such text is refused where
// it enters instead (found by fuzz_checkpoint).
#pragma once

#include <cstddef>
#include <string_view>

namespace wia {

// The offset of the first byte that does not start or continue a valid
// UTF-8 character (overlong forms, surrogates and code points past
// U+10FFFF included), or npos when the whole text is valid.
inline std::size_t first_invalid_utf8(std::string_view s) {
  std::size_t i = 0;
  const std::size_t n = s.size();
  while (i < n) {
    const auto b = static_cast<unsigned char>(s[i]);
    std::size_t len = 0;
    unsigned lo = 0x80, hi = 0xBF;  // the range of the second byte
    if (b < 0x80) {
      ++i;
      continue;
    } else if (b >= 0xC2 && b <= 0xDF) {
      len = 2;
    } else if (b >= 0xE0 && b <= 0xEF) {
      len = 3;
      if (b == 0xE0) lo = 0xA0;  // overlong
      if (b == 0xED) hi = 0x9F;  // UTF-16 surrogates
    } else if (b >= 0xF0 && b <= 0xF4) {
      len = 4;
      if (b == 0xF0) lo = 0x90;  // overlong
      if (b == 0xF4) hi = 0x8F;  // past U+10FFFF
    } else {
      return i;
    }
    if (i + len > n) return i;
    const auto second = static_cast<unsigned char>(s[i + 1]);
    if (second < lo || second > hi) return i;
    for (std::size_t k = 2; k < len; ++k) {
      const auto c = static_cast<unsigned char>(s[i + k]);
      if (c < 0x80 || c > 0xBF) return i;
    }
    i += len;
  }
  return std::string_view::npos;
}

}  // namespace wia
