// SPDX-License-Identifier: Apache-2.0
// Text helpers with one definition for the whole project: the size grammar
// of configuration values and provider parameters, errno messages, and
// whitespace trimming. Plain C++ with no dependency, so providers (which
// never link the core) and the core alike can link it.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace wia::common {

// Parses a byte count: decimal digits, then an optional binary suffix K, M,
// G or T (1K = 1024, any case), which may be followed by "B" or "iB"
// ("64K", "64kb", "64KiB" are the same); a lone "B" is allowed too ("512B").
// Whitespace around the whole text is ignored, none is allowed inside.
// Rejects empty text, signs ("-1", "+1"), fractions, unknown suffixes and
// values over UINT64_MAX after the multiplier. On success sets *bytes and
// returns true; on failure leaves *bytes alone, returns false and, when
// `why` is set, stores a short reason ("unknown suffix 'X'") for the
// caller to put after the key or parameter it names.
bool parse_size(std::string_view text, std::uint64_t* bytes, std::string* why = nullptr);

// printf into a std::string (cut at 1023 bytes).
std::string format(const char* fmt, ...) __attribute__((format(printf, 1, 2)));

// strerror_r(err) followed by " (errno N)". Thread safe.
std::string errno_text(int err);

// `s` without leading and trailing whitespace (std::isspace).
std::string_view trim(std::string_view s);

}  // namespace wia::common
