// SPDX-License-Identifier: Apache-2.0
#include "bootstrap/wire.hpp"

#include <fmt/core.h>

namespace wia::bootstrap::wire {

const char* frame_type_name(FrameType type) {
  switch (type) {
    case FrameType::kChallenge:
      return "challenge";
    case FrameType::kAuth:
      return "auth";
    case FrameType::kAuthOk:
      return "auth-ok";
    case FrameType::kHello:
      return "hello";
    case FrameType::kWelcome:
      return "welcome";
    case FrameType::kGather:
      return "gather";
    case FrameType::kGatherResult:
      return "gather-result";
    case FrameType::kSend:
      return "send";
    case FrameType::kDeliver:
      return "deliver";
    case FrameType::kPut:
      return "put";
    case FrameType::kGet:
      return "get";
    case FrameType::kValue:
      return "value";
    case FrameType::kAbort:
      return "abort";
    case FrameType::kError:
      return "error";
    case FrameType::kTimeoutReport:
      return "timeout-report";
    case FrameType::kBye:
      return "bye";
  }
  return "unknown";
}

const char* gather_kind_name(GatherKind kind) {
  switch (kind) {
    case GatherKind::kAllGather:
      return "all_gather";
    case GatherKind::kBarrier:
      return "barrier";
  }
  return "unknown";
}

namespace {

void put_le(std::uint8_t* p, std::uint64_t v, int n) {
  for (int i = 0; i < n; ++i) p[i] = static_cast<std::uint8_t>(v >> (8 * i));
}
std::uint64_t get_le(const std::uint8_t* p, int n) {
  std::uint64_t v = 0;
  for (int i = n - 1; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

}  // namespace

void encode_header(FrameType type, std::uint32_t length, std::uint8_t out[kHeaderBytes]) {
  put_le(out, kMagic, 4);
  put_le(out + 4, kWireVersion, 2);
  put_le(out + 6, static_cast<std::uint16_t>(type), 2);
  put_le(out + 8, length, 4);
  put_le(out + 12, 0, 4);
}

Header decode_header(const std::uint8_t in[kHeaderBytes]) {
  const auto magic = static_cast<std::uint32_t>(get_le(in, 4));
  if (magic != kMagic) {
    throw ProtocolError(fmt::format("bad magic 0x{:08x} (not a libwia bootstrap peer)", magic));
  }
  const auto version = static_cast<std::uint16_t>(get_le(in + 4, 2));
  if (version != kWireVersion) {
    throw ProtocolError(fmt::format(
        "bootstrap protocol version {} (this libwia speaks version {}; mixed libwia versions?)",
        version, kWireVersion));
  }
  const auto type = static_cast<std::uint16_t>(get_le(in + 6, 2));
  if (type < static_cast<std::uint16_t>(FrameType::kChallenge) ||
      type > static_cast<std::uint16_t>(FrameType::kBye)) {
    throw ProtocolError(fmt::format("unknown frame type {}", type));
  }
  if (get_le(in + 12, 4) != 0) throw ProtocolError("reserved header field is not zero");
  return Header{static_cast<FrameType>(type), static_cast<std::uint32_t>(get_le(in + 8, 4))};
}

Writer::Writer(FrameType type) : buf_(kHeaderBytes) { encode_header(type, 0, buf_.data()); }
Writer& Writer::u8(std::uint8_t v) {
  buf_.push_back(v);
  return *this;
}
Writer& Writer::u16(std::uint16_t v) {
  buf_.resize(buf_.size() + 2);
  put_le(buf_.data() + buf_.size() - 2, v, 2);
  return *this;
}
Writer& Writer::u32(std::uint32_t v) {
  buf_.resize(buf_.size() + 4);
  put_le(buf_.data() + buf_.size() - 4, v, 4);
  return *this;
}
Writer& Writer::u64(std::uint64_t v) {
  buf_.resize(buf_.size() + 8);
  put_le(buf_.data() + buf_.size() - 8, v, 8);
  return *this;
}
Writer& Writer::bytes(std::span<const std::uint8_t> data) {
  buf_.insert(buf_.end(), data.begin(), data.end());
  return *this;
}
Writer& Writer::blob(std::span<const std::uint8_t> data) {
  u32(static_cast<std::uint32_t>(data.size()));
  return bytes(data);
}
Writer& Writer::text(std::string_view s) {
  return blob({reinterpret_cast<const std::uint8_t*>(s.data()), s.size()});
}
std::vector<std::uint8_t> Writer::finish() {
  const auto length = static_cast<std::uint32_t>(buf_.size() - kHeaderBytes);
  put_le(buf_.data() + 8, length, 4);
  return std::move(buf_);
}

std::span<const std::uint8_t> Reader::bytes(std::size_t n) {
  if (n > remaining()) {
    throw ProtocolError(
        fmt::format("payload truncated: needed {} more bytes, {} left", n, remaining()));
  }
  auto out = data_.subspan(pos_, n);
  pos_ += n;
  return out;
}
std::uint8_t Reader::u8() { return bytes(1)[0]; }
std::uint16_t Reader::u16() { return static_cast<std::uint16_t>(get_le(bytes(2).data(), 2)); }
std::uint32_t Reader::u32() { return static_cast<std::uint32_t>(get_le(bytes(4).data(), 4)); }
std::uint64_t Reader::u64() { return get_le(bytes(8).data(), 8); }
std::span<const std::uint8_t> Reader::blob(std::size_t max_bytes) {
  const std::uint32_t n = u32();
  if (n > max_bytes) {
    throw ProtocolError(fmt::format("field of {} bytes exceeds its bound of {}", n, max_bytes));
  }
  return bytes(n);
}
std::string Reader::text(std::size_t max_bytes) {
  auto b = blob(max_bytes);
  return std::string(reinterpret_cast<const char*>(b.data()), b.size());
}
void Reader::expect_end() const {
  if (remaining() != 0)
    throw ProtocolError(fmt::format("{} trailing bytes in payload", remaining()));
}

}  // namespace wia::bootstrap::wire
