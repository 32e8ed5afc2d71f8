// SPDX-License-Identifier: Apache-2.0
// The one size grammar (wia::common::parse_size), errno_text and trim.
#include "wia_common/text.hpp"

#include <doctest/doctest.h>

#include <cerrno>
#include <cstdint>
#include <string>
#include <utility>

using wia::common::errno_text;
using wia::common::parse_size;
using wia::common::trim;

namespace {

bool parses_to(const char* text, std::uint64_t expected) {
  std::uint64_t v = 0;
  return parse_size(text, &v) && v == expected;
}

}  // namespace

TEST_CASE("parse_size: plain decimal bytes") {
  CHECK(parses_to("0", 0));
  CHECK(parses_to("1", 1));
  CHECK(parses_to("4096", 4096));
  CHECK(parses_to("007", 7));
  CHECK(parses_to(" 8M ", 8u << 20));
  CHECK(parses_to("\t64K\n", 64u << 10));
  CHECK(parses_to("18446744073709551615", UINT64_MAX));
}

TEST_CASE("parse_size: every suffix is binary, in any case, with B or iB") {
  const std::uint64_t one = 1;
  for (auto [unit, shift] : {std::pair{"K", 10}, {"M", 20}, {"G", 30}, {"T", 40}}) {
    for (const char* tail : {"", "B", "b", "iB", "ib", "IB"}) {
      for (bool lower : {false, true}) {
        std::string text = "3";
        text += lower ? static_cast<char>(unit[0] + ('a' - 'A')) : unit[0];
        text += tail;
        CAPTURE(text);
        CHECK(parses_to(text.c_str(), 3 * (one << shift)));
      }
    }
  }
  CHECK(parses_to("512B", 512));
  CHECK(parses_to("512b", 512));
}

TEST_CASE("parse_size: overflow at the edge is rejected") {
  std::uint64_t v = 42;
  std::string why;
  CHECK(parses_to("16777215T", std::uint64_t{16777215} << 40));
  CHECK(parses_to("17179869183G", std::uint64_t{17179869183} << 30));
  for (const char* big : {"18446744073709551616", "99999999999999999999999", "16777216T",
                          "17179869184G", "17592186044416M", "18014398509481984K"}) {
    CAPTURE(big);
    CHECK_FALSE(parse_size(big, &v, &why));
    CHECK(why == "too large");
    CHECK(v == 42);  // untouched on failure
  }
}

TEST_CASE("parse_size: junk, empty and negative input say what was wrong") {
  std::uint64_t v = 42;
  std::string why;
  CHECK_FALSE(parse_size("", &v, &why));
  CHECK(why == "empty");
  CHECK_FALSE(parse_size("   ", &v, &why));
  CHECK(why == "empty");
  CHECK_FALSE(parse_size("-1", &v, &why));
  CHECK(why == "negative");
  CHECK_FALSE(parse_size("-4K", &v, &why));
  CHECK(why == "negative");
  CHECK_FALSE(parse_size("4X", &v, &why));
  CHECK(why.find("unknown suffix 'X'") == 0);
  for (const char* bad : {"K", "+1", "1.5M", "4 K", "4Ki", "4iB", "4MBB", "4E", "16E", "0x10",
                          "1,024", "4KK", "abc", "4\tM"}) {
    CAPTURE(bad);
    why.clear();
    CHECK_FALSE(parse_size(bad, &v, &why));
    CHECK_FALSE(why.empty());
  }
  CHECK(v == 42);
  CHECK_FALSE(parse_size("4X", &v));  // `why` is optional
}

TEST_CASE("errno_text names the error and its number") {
  const std::string t = errno_text(ENOENT);
  CHECK(t.find("No such file or directory") == 0);
  CHECK(t.find("(errno " + std::to_string(ENOENT) + ")") != std::string::npos);
}

TEST_CASE("trim removes surrounding whitespace only") {
  CHECK(trim("  a b \t\r\n") == "a b");
  CHECK(trim("") == "");
  CHECK(trim(" \t ") == "");
  CHECK(trim("x") == "x");
}
