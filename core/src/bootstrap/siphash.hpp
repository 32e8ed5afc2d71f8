// SPDX-License-Identifier: Apache-2.0
// SipHash-2-4 (Aumasson and Bernstein, "SipHash: a fast short-input PRF",
// 2012): the keyed MAC behind the bootstrap's challenge-response, and the
// 128-bit secrets it is keyed with. Small and dependency-free on purpose:
// the bootstrap must authenticate peers before anything else is loaded.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

namespace wia::bootstrap {

// A 128-bit secret shared by every rank of one job; the SipHash key.
struct Secret {
  std::array<std::uint8_t, 16> bytes{};
  friend bool operator==(const Secret&, const Secret&) = default;
};

// SipHash-2-4 of `message` under `key` (64-bit output, as in the paper).
std::uint64_t siphash24(const Secret& key, std::span<const std::uint8_t> message);

// Fresh secret from getrandom(2). Throws wia::Error(WIA_ERROR_IO) if the
// kernel has no entropy source (never silently weak).
Secret random_secret();
// Fills `out` from getrandom(2); throws like random_secret().
void random_bytes(std::span<std::uint8_t> out);

// A secret derived from text (WIA_AUTH_KEY, or job facts when nothing
// better exists): two SipHash-2-4 evaluations under fixed public keys. This
// is not a password hash: the text must itself be hard to guess for the
// result to be.
Secret secret_from_text(std::string_view text);

// Lower-case hex and back; from_hex returns false on bad length or digit.
std::string to_hex(std::span<const std::uint8_t> bytes);
bool from_hex(std::string_view hex, std::span<std::uint8_t> out);

// Compares without an early exit, so a MAC check does not leak through
// timing how many leading bytes were right.
bool constant_time_equal(std::span<const std::uint8_t> a, std::span<const std::uint8_t> b);

}  // namespace wia::bootstrap
