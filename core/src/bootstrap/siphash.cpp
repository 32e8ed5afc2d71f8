// SPDX-License-Identifier: Apache-2.0
#include "bootstrap/siphash.hpp"

#include <sys/random.h>

#include <cerrno>
#include <cstring>

#include "common/error.hpp"

namespace wia::bootstrap {

namespace {

constexpr std::uint64_t rotl(std::uint64_t x, int b) { return (x << b) | (x >> (64 - b)); }

std::uint64_t load_le64(const std::uint8_t* p) {
  std::uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

struct State {
  std::uint64_t v0, v1, v2, v3;
  void round() {
    v0 += v1;
    v1 = rotl(v1, 13);
    v1 ^= v0;
    v0 = rotl(v0, 32);
    v2 += v3;
    v3 = rotl(v3, 16);
    v3 ^= v2;
    v0 += v3;
    v3 = rotl(v3, 21);
    v3 ^= v0;
    v2 += v1;
    v1 = rotl(v1, 17);
    v1 ^= v2;
    v2 = rotl(v2, 32);
  }
  void compress(std::uint64_t m) {
    v3 ^= m;
    round();
    round();
    v0 ^= m;
  }
};

}  // namespace

std::uint64_t siphash24(const Secret& key, std::span<const std::uint8_t> message) {
  const std::uint64_t k0 = load_le64(key.bytes.data());
  const std::uint64_t k1 = load_le64(key.bytes.data() + 8);
  State s{k0 ^ 0x736f6d6570736575ULL, k1 ^ 0x646f72616e646f6dULL, k0 ^ 0x6c7967656e657261ULL,
          k1 ^ 0x7465646279746573ULL};
  const std::size_t n = message.size();
  const std::size_t whole = n - n % 8;
  for (std::size_t i = 0; i < whole; i += 8) s.compress(load_le64(message.data() + i));
  std::uint64_t last = static_cast<std::uint64_t>(n & 0xff) << 56;
  for (std::size_t i = whole; i < n; ++i)
    last |= static_cast<std::uint64_t>(message[i]) << (8 * (i - whole));
  s.compress(last);
  s.v2 ^= 0xff;
  for (int i = 0; i < 4; ++i) s.round();
  return s.v0 ^ s.v1 ^ s.v2 ^ s.v3;
}

void random_bytes(std::span<std::uint8_t> out) {
  std::size_t done = 0;
  while (done < out.size()) {
    const ssize_t got = getrandom(out.data() + done, out.size() - done, 0);
    if (got < 0) {
      if (errno == EINTR) continue;
      throw Error(WIA_ERROR_IO,
                  std::string("bootstrap: getrandom failed: ") + std::strerror(errno));
    }
    done += static_cast<std::size_t>(got);
  }
}

Secret random_secret() {
  Secret s;
  random_bytes(s.bytes);
  return s;
}

Secret secret_from_text(std::string_view text) {
  // Arbitrary public constants ("wia-bootstrap-k0/k1"); the output's secrecy
  // comes only from the text.
  static constexpr Secret kDeriveA{
      {'w', 'i', 'a', '-', 'b', 'o', 'o', 't', 's', 't', 'r', 'a', 'p', '-', 'k', '0'}};
  static constexpr Secret kDeriveB{
      {'w', 'i', 'a', '-', 'b', 'o', 'o', 't', 's', 't', 'r', 'a', 'p', '-', 'k', '1'}};
  const auto* data = reinterpret_cast<const std::uint8_t*>(text.data());
  const std::span<const std::uint8_t> bytes(data, text.size());
  const std::uint64_t a = siphash24(kDeriveA, bytes);
  const std::uint64_t b = siphash24(kDeriveB, bytes);
  Secret s;
  for (int i = 0; i < 8; ++i) {
    s.bytes[i] = static_cast<std::uint8_t>(a >> (8 * i));
    s.bytes[8 + i] = static_cast<std::uint8_t>(b >> (8 * i));
  }
  return s;
}

std::string to_hex(std::span<const std::uint8_t> bytes) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  out.reserve(bytes.size() * 2);
  for (std::uint8_t b : bytes) {
    out.push_back(kDigits[b >> 4]);
    out.push_back(kDigits[b & 15]);
  }
  return out;
}

bool from_hex(std::string_view hex, std::span<std::uint8_t> out) {
  if (hex.size() != out.size() * 2) return false;
  auto digit = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  for (std::size_t i = 0; i < out.size(); ++i) {
    const int hi = digit(hex[2 * i]);
    const int lo = digit(hex[2 * i + 1]);
    if (hi < 0 || lo < 0) return false;
    out[i] = static_cast<std::uint8_t>(hi * 16 + lo);
  }
  return true;
}

bool constant_time_equal(std::span<const std::uint8_t> a, std::span<const std::uint8_t> b) {
  if (a.size() != b.size()) return false;
  std::uint8_t diff = 0;
  for (std::size_t i = 0; i < a.size(); ++i) diff |= static_cast<std::uint8_t>(a[i] ^ b[i]);
  return diff == 0;
}

}  // namespace wia::bootstrap
