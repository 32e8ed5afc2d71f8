// SPDX-License-Identifier: Apache-2.0
// first_invalid_utf8 (common/utf8.hpp) against Python's own decoder's
// verdicts on the classic malformed forms (RFC 3629, Unicode table 3-7).
#include <doctest/doctest.h>

#include <string>

#include "common/utf8.hpp"

using wia::first_invalid_utf8;
constexpr auto npos = std::string::npos;

TEST_CASE("utf8: valid text of every length is accepted") {
  CHECK(first_invalid_utf8("") == npos);
  CHECK(first_invalid_utf8("layer0.weight") == npos);
  CHECK(first_invalid_utf8("\xc3\xa9t\xc3\xa9") == npos);            // 2-byte
  CHECK(first_invalid_utf8("\xe2\x82\xac \xef\xbf\xbd") == npos);    // 3-byte, U+FFFD itself
  CHECK(first_invalid_utf8("\xf0\x9f\x9a\x80") == npos);             // 4-byte
  CHECK(first_invalid_utf8("\xf4\x8f\xbf\xbf") == npos);             // U+10FFFF
  CHECK(first_invalid_utf8("\xed\x9f\xbf") == npos);                 // U+D7FF
  CHECK(first_invalid_utf8(std::string("a\0b", 3)) == npos);         // NUL is a character
}

TEST_CASE("utf8: malformed forms are found at their first byte") {
  CHECK(first_invalid_utf8("ab\xff") == 2);              // never in UTF-8
  CHECK(first_invalid_utf8("\x80") == 0);                // lone continuation
  CHECK(first_invalid_utf8("x\xc0\xaf") == 1);           // overlong '/'
  CHECK(first_invalid_utf8("\xc1\xbf") == 0);            // overlong
  CHECK(first_invalid_utf8("\xe0\x80\xaf") == 0);        // overlong, 3 bytes
  CHECK(first_invalid_utf8("\xf0\x80\x80\xaf") == 0);    // overlong, 4 bytes
  CHECK(first_invalid_utf8("exp\xed\xa0\x80") == 3);     // surrogate U+D800
  CHECK(first_invalid_utf8("\xf4\x90\x80\x80") == 0);    // U+110000
  CHECK(first_invalid_utf8("\xf5\x80\x80\x80") == 0);    // no such lead byte
  CHECK(first_invalid_utf8("ok\xe2\x82") == 2);          // cut short at the end
  CHECK(first_invalid_utf8("\xe2\x28\xa1") == 0);        // bad third byte
  CHECK(first_invalid_utf8("\xf0\x9f\x9a\x41") == 0);    // bad fourth byte
}
