// SPDX-License-Identifier: Apache-2.0
#include "checkpoint/format.hpp"

#include <fmt/format.h>
#include <lz4.h>
#include <xxhash.h>
#include <yaml-cpp/yaml.h>
#include <zstd.h>

#include <cinttypes>
#include <cstdio>
#include <cstring>

#include "common/error.hpp"
#include "common/utf8.hpp"
#include "kernels/cpu_reduce.hpp"

namespace wia::checkpoint {
namespace {

constexpr char kMagic[8] = {'W', 'I', 'A', 'C', 'K', 'P', 'T', '\0'};
constexpr const char* kTrailer = "# xxh3 ";

[[noreturn]] void corrupt(const std::string& path, const std::string& what) {
  throw Error(WIA_ERROR_CORRUPT, fmt::format("{}: {}", path, what));
}

// Text read back as a name, key or string value: what the writer refuses
// (not UTF-8) is damage when read.
std::string utf8_text(std::string text, const std::string& what, const std::string& path) {
  const std::size_t bad = first_invalid_utf8(text);
  if (bad != std::string::npos)
    corrupt(path, fmt::format("{} is not valid UTF-8 (byte {})", what, bad));
  return text;
}

std::string hex64(std::uint64_t v) { return fmt::format("{:016x}", v); }

std::string with_trailer(const std::string& body) {
  return body + kTrailer + hex64(checksum(body)) + "\n";
}

// The YAML body of a file after checking its trailer.
YAML::Node checked_yaml(const std::string& text, const std::string& path) {
  const std::string marker = std::string("\n") + kTrailer;
  const auto at = text.rfind(marker);
  if (at == std::string::npos || text.size() != at + marker.size() + 16 + 1 || text.back() != '\n')
    corrupt(path, "no checksum line at the end (truncated or not written by libwia)");
  const std::string body = text.substr(0, at + 1);
  const std::string want = text.substr(at + marker.size(), 16);
  if (hex64(checksum(body)) != want)
    corrupt(path, fmt::format("checksum mismatch (file says {}, content is {})", want,
                              hex64(checksum(body))));
  try {
    return YAML::Load(body);
  } catch (const YAML::Exception& e) {
    corrupt(path, fmt::format("not valid YAML: {}", e.what()));
  }
}

template <typename T>
T get(const YAML::Node& n, const char* key, const std::string& path) {
  const YAML::Node v = n[key];
  if (!v) corrupt(path, fmt::format("key '{}' is missing", key));
  try {
    return v.as<T>();
  } catch (const YAML::Exception&) {
    corrupt(path, fmt::format("key '{}' has a value of the wrong type", key));
  }
}

void check_version(int version, const std::string& path) {
  if (version > kFormatVersion)
    throw Error(WIA_ERROR_NOT_SUPPORTED,
                fmt::format("{}: format_version {} is newer than this libwia reads ({})", path,
                            version, kFormatVersion));
  if (version < 1) corrupt(path, fmt::format("format_version {} is not valid", version));
}

const char* codec_name(wia_checkpoint_compression_t c) {
  switch (c) {
    case WIA_CKPT_COMPRESS_LZ4:
      return "lz4";
    case WIA_CKPT_COMPRESS_ZSTD:
      return "zstd";
    default:
      return "none";
  }
}

wia_checkpoint_compression_t codec_of(const std::string& name, const std::string& path) {
  if (name == "none") return WIA_CKPT_COMPRESS_NONE;
  if (name == "lz4") return WIA_CKPT_COMPRESS_LZ4;
  if (name == "zstd") return WIA_CKPT_COMPRESS_ZSTD;
  corrupt(path, fmt::format("unknown compression '{}'", name));
}

const char* mode_name(wia_checkpoint_shard_mode_t m) {
  return m == WIA_CKPT_REPLICATED ? "replicated" : "sharded";
}

wia_checkpoint_shard_mode_t mode_of(const std::string& name, const std::string& path) {
  if (name == "sharded") return WIA_CKPT_SHARDED;
  if (name == "replicated") return WIA_CKPT_REPLICATED;
  corrupt(path, fmt::format("unknown shard_mode '{}'", name));
}

Kind kind_of(const std::string& name, const std::string& path) {
  for (Kind k : {Kind::kModel, Kind::kOptimizer, Kind::kTensor, Kind::kResidual})
    if (name == kind_name(k)) return k;
  corrupt(path, fmt::format("unknown tensor kind '{}'", name));
}

wia_datatype_t dtype_of(const std::string& name, const std::string& path) {
  for (int d = 0; d < WIA_DATATYPE_COUNT; ++d)
    if (name == kernels::dtype_name(static_cast<wia_datatype_t>(d)))
      return static_cast<wia_datatype_t>(d);
  corrupt(path, fmt::format("unknown datatype '{}'", name));
}

std::string to_hex(const std::string& bytes) {
  std::string out;
  out.reserve(bytes.size() * 2);
  for (unsigned char c : bytes) out += fmt::format("{:02x}", c);
  return out;
}

std::string from_hex(const std::string& hex, const std::string& path) {
  if (hex.size() % 2 != 0) corrupt(path, "odd-length hex in metadata");
  std::string out(hex.size() / 2, '\0');
  for (std::size_t i = 0; i < out.size(); ++i) {
    unsigned v = 0;
    if (std::sscanf(hex.c_str() + 2 * i, "%2x", &v) != 1) corrupt(path, "bad hex in metadata");
    out[i] = static_cast<char>(v);
  }
  return out;
}

std::uint64_t parse_hex64(const std::string& s, const std::string& path) {
  if (s.size() != 16 || s.find_first_not_of("0123456789abcdef") != std::string::npos)
    corrupt(path, fmt::format("'{}' is not a 16-digit checksum", s));
  return std::strtoull(s.c_str(), nullptr, 16);
}

void put_u32(std::vector<std::byte>& out, std::size_t at, std::uint32_t v) {
  std::memcpy(out.data() + at, &v, 4);
}

}  // namespace

const char* kind_name(Kind kind) noexcept {
  switch (kind) {
    case Kind::kModel:
      return "model";
    case Kind::kOptimizer:
      return "optimizer";
    case Kind::kResidual:
      return "residual";
    default:
      return "tensor";
  }
}

std::uint64_t checksum(std::span<const std::byte> bytes) noexcept {
  return XXH3_64bits(bytes.data(), bytes.size());
}
std::uint64_t checksum(const std::string& text) noexcept {
  return XXH3_64bits(text.data(), text.size());
}

RunningChecksum::RunningChecksum() : state_(XXH3_createState()) {
  if (state_ == nullptr) throw Error(WIA_ERROR_OUT_OF_MEMORY, "checksum state");
  XXH3_64bits_reset(static_cast<XXH3_state_t*>(state_));
}
RunningChecksum::~RunningChecksum() { XXH3_freeState(static_cast<XXH3_state_t*>(state_)); }
void RunningChecksum::add(std::span<const std::byte> bytes) noexcept {
  XXH3_64bits_update(static_cast<XXH3_state_t*>(state_), bytes.data(), bytes.size());
}
std::uint64_t RunningChecksum::value() const noexcept {
  return XXH3_64bits_digest(static_cast<const XXH3_state_t*>(state_));
}

std::string checkpoint_name(std::uint64_t seq) { return fmt::format("ckpt-{:08}", seq); }

bool parse_checkpoint_name(const std::string& name, std::uint64_t* seq) {
  if (name.size() < 13 || name.size() > 25 || name.compare(0, 5, "ckpt-") != 0) return false;
  if (name.find_first_not_of("0123456789", 5) != std::string::npos) return false;
  *seq = std::strtoull(name.c_str() + 5, nullptr, 10);
  return true;
}

std::string shard_data_name(int rank) { return fmt::format("rank-{:05}.data", rank); }
std::string shard_manifest_name(int rank) { return fmt::format("rank-{:05}.yaml", rank); }

std::string to_text(const ShardManifest& m) {
  YAML::Emitter y;
  y << YAML::BeginMap;
  y << YAML::Key << "format_version" << YAML::Value << m.format_version;
  y << YAML::Key << "seq" << YAML::Value << m.seq;
  y << YAML::Key << "rank" << YAML::Value << m.rank;
  y << YAML::Key << "nranks" << YAML::Value << m.nranks;
  y << YAML::Key << "shard_mode" << YAML::Value << mode_name(m.shard_mode);
  y << YAML::Key << "compression" << YAML::Value << codec_name(m.compression);
  y << YAML::Key << "data_bytes" << YAML::Value << m.data_bytes;
  y << YAML::Key << "tensors" << YAML::Value << YAML::BeginSeq;
  for (const auto& t : m.tensors) {
    y << YAML::Flow << YAML::BeginMap;
    y << YAML::Key << "kind" << YAML::Value << kind_name(t.kind);
    y << YAML::Key << "name" << YAML::Value << YAML::DoubleQuoted << t.name;
    y << YAML::Key << "dtype" << YAML::Value << kernels::dtype_name(t.dtype);
    y << YAML::Key << "count" << YAML::Value << t.count;
    y << YAML::Key << "offset" << YAML::Value << t.offset;
    y << YAML::Key << "stored_bytes" << YAML::Value << t.stored_bytes;
    y << YAML::Key << "xxh3" << YAML::Value << hex64(t.checksum);
    y << YAML::EndMap;
  }
  y << YAML::EndSeq;
  y << YAML::Key << "metadata" << YAML::Value << YAML::BeginMap;
  for (const auto& [name, v] : m.metadata) {
    y << YAML::Key << YAML::DoubleQuoted << name << YAML::Value << YAML::Flow << YAML::BeginMap;
    switch (v.type) {
      case MetaValue::Type::kInt:
        y << YAML::Key << "int" << YAML::Value << v.i;
        break;
      case MetaValue::Type::kDouble: {
        // The value for people, its bits for the reader: no rounding either way.
        std::uint64_t bits;
        std::memcpy(&bits, &v.d, 8);
        y << YAML::Key << "double" << YAML::Value << fmt::format("{}", v.d);
        y << YAML::Key << "bits" << YAML::Value << hex64(bits);
        break;
      }
      case MetaValue::Type::kString:
        y << YAML::Key << "string" << YAML::Value << YAML::DoubleQuoted << v.bytes;
        break;
      case MetaValue::Type::kBytes:
        y << YAML::Key << "bytes" << YAML::Value << to_hex(v.bytes);
        break;
    }
    y << YAML::EndMap;
  }
  y << YAML::EndMap << YAML::EndMap;
  return with_trailer(std::string(y.c_str()) + "\n");
}

std::string to_text(const CommitRecord& r) {
  YAML::Emitter y;
  y << YAML::BeginMap;
  y << YAML::Key << "format_version" << YAML::Value << r.format_version;
  y << YAML::Key << "seq" << YAML::Value << r.seq;
  y << YAML::Key << "nranks" << YAML::Value << r.nranks;
  y << YAML::Key << "shard_mode" << YAML::Value << mode_name(r.shard_mode);
  y << YAML::Key << "shards" << YAML::Value << YAML::BeginSeq;
  for (std::size_t i = 0; i < r.shard_checksums.size(); ++i) {
    y << YAML::Flow << YAML::BeginMap;
    y << YAML::Key << "manifest" << YAML::Value << shard_manifest_name(static_cast<int>(i));
    y << YAML::Key << "xxh3" << YAML::Value << hex64(r.shard_checksums[i]);
    y << YAML::EndMap;
  }
  y << YAML::EndSeq << YAML::EndMap;
  return with_trailer(std::string(y.c_str()) + "\n");
}

namespace {

// A manifest whose checksum is right but whose YAML has another shape (a
// scalar or a list where a mapping belongs) makes yaml-cpp throw its own
// exceptions from operator[] and as<>(); they must reach the caller as
// WIA_ERROR_CORRUPT naming the file like every other damage, not escape as
// an unknown exception (found by fuzz_checkpoint).
template <typename Read>
auto read_manifest(const std::string& path, Read read) {
  try {
    return read();
  } catch (const YAML::Exception& e) {
    corrupt(path, fmt::format("not a libwia manifest: {}", e.what()));
  }
}

ShardManifest read_shard_manifest(const std::string& text, const std::string& path) {
  const YAML::Node y = checked_yaml(text, path);
  ShardManifest m;
  m.format_version = get<int>(y, "format_version", path);
  check_version(m.format_version, path);
  m.seq = get<std::uint64_t>(y, "seq", path);
  m.rank = get<int>(y, "rank", path);
  m.nranks = get<int>(y, "nranks", path);
  m.shard_mode = mode_of(get<std::string>(y, "shard_mode", path), path);
  m.compression = codec_of(get<std::string>(y, "compression", path), path);
  m.data_bytes = get<std::uint64_t>(y, "data_bytes", path);
  for (const auto& t : y["tensors"]) {
    TensorRecord r;
    r.kind = kind_of(get<std::string>(t, "kind", path), path);
    r.name = utf8_text(get<std::string>(t, "name", path), "a tensor name", path);
    r.dtype = dtype_of(get<std::string>(t, "dtype", path), path);
    r.count = get<std::uint64_t>(t, "count", path);
    r.offset = get<std::uint64_t>(t, "offset", path);
    r.stored_bytes = get<std::uint64_t>(t, "stored_bytes", path);
    r.checksum = parse_hex64(get<std::string>(t, "xxh3", path), path);
    m.tensors.push_back(std::move(r));
  }
  for (const auto& kv : y["metadata"]) {
    const auto name = utf8_text(kv.first.as<std::string>(), "a metadata name", path);
    const YAML::Node v = kv.second;
    MetaValue mv;
    if (v["int"]) {
      mv.type = MetaValue::Type::kInt;
      mv.i = get<std::int64_t>(v, "int", path);
    } else if (v["bits"]) {
      mv.type = MetaValue::Type::kDouble;
      const std::uint64_t bits = parse_hex64(get<std::string>(v, "bits", path), path);
      std::memcpy(&mv.d, &bits, 8);
    } else if (v["string"]) {
      mv.type = MetaValue::Type::kString;
      mv.bytes = utf8_text(get<std::string>(v, "string", path),
                           fmt::format("the string of metadata '{}'", name), path);
    } else if (v["bytes"]) {
      mv.type = MetaValue::Type::kBytes;
      mv.bytes = from_hex(get<std::string>(v, "bytes", path), path);
    } else {
      corrupt(path, fmt::format("metadata '{}' has no value", name));
    }
    m.metadata[name] = std::move(mv);
  }
  return m;
}

CommitRecord read_commit_record(const std::string& text, const std::string& path) {
  const YAML::Node y = checked_yaml(text, path);
  CommitRecord r;
  r.format_version = get<int>(y, "format_version", path);
  check_version(r.format_version, path);
  r.seq = get<std::uint64_t>(y, "seq", path);
  r.nranks = get<int>(y, "nranks", path);
  r.shard_mode = mode_of(get<std::string>(y, "shard_mode", path), path);
  for (const auto& s : y["shards"])
    r.shard_checksums.push_back(parse_hex64(get<std::string>(s, "xxh3", path), path));
  if (r.nranks < 1 || static_cast<int>(r.shard_checksums.size()) !=
                          (r.shard_mode == WIA_CKPT_REPLICATED ? 1 : r.nranks))
    corrupt(path, fmt::format("{} shard entries for {} ranks", r.shard_checksums.size(), r.nranks));
  return r;
}

}  // namespace

ShardManifest parse_shard_manifest(const std::string& text, const std::string& path) {
  return read_manifest(path, [&] { return read_shard_manifest(text, path); });
}

CommitRecord parse_commit_record(const std::string& text, const std::string& path) {
  return read_manifest(path, [&] { return read_commit_record(text, path); });
}

std::vector<std::byte> data_header(std::uint64_t seq) {
  std::vector<std::byte> h(16);
  std::memcpy(h.data(), kMagic, 7);
  h[7] = static_cast<std::byte>(kFormatVersion);
  std::memcpy(h.data() + 8, &seq, 8);
  return h;
}

void check_data_header(std::span<const std::byte> file, std::uint64_t seq,
                       const std::string& path) {
  if (file.size() < 16 || std::memcmp(file.data(), kMagic, 7) != 0)
    corrupt(path, "not a libwia checkpoint data file (bad header)");
  std::uint64_t got;
  std::memcpy(&got, file.data() + 8, 8);
  if (got != seq || static_cast<int>(file[7]) != kFormatVersion)
    corrupt(path, fmt::format("header names checkpoint {} format {}, expected {} format {}", got,
                              static_cast<int>(file[7]), seq, kFormatVersion));
}

std::uint64_t encode_blocks(std::span<const std::byte> raw, wia_checkpoint_compression_t codec,
                            int level, std::vector<std::byte>& out) {
  const std::size_t start = out.size();
  for (std::size_t at = 0; at < raw.size(); at += kBlockBytes) {
    const std::size_t n = std::min(kBlockBytes, raw.size() - at);
    const char* src = reinterpret_cast<const char*>(raw.data() + at);
    const std::size_t head = out.size();
    std::size_t bound = n;
    if (codec == WIA_CKPT_COMPRESS_LZ4)
      bound = static_cast<std::size_t>(LZ4_compressBound(static_cast<int>(n)));
    if (codec == WIA_CKPT_COMPRESS_ZSTD) bound = ZSTD_compressBound(n);
    out.resize(head + 8 + bound);
    char* dst = reinterpret_cast<char*>(out.data() + head + 8);
    std::size_t stored = 0;
    if (codec == WIA_CKPT_COMPRESS_LZ4) {
      // level > 1 is LZ4's acceleration (faster, larger); 1 is the default.
      const int rc = LZ4_compress_fast(src, dst, static_cast<int>(n), static_cast<int>(bound),
                                       level > 1 ? level : 1);
      stored = rc > 0 ? static_cast<std::size_t>(rc) : 0;
    } else if (codec == WIA_CKPT_COMPRESS_ZSTD) {
      const std::size_t rc = ZSTD_compress(dst, bound, src, n, level != 0 ? level : 3);
      stored = ZSTD_isError(rc) ? 0 : rc;
    }
    if (stored == 0 || stored >= n) {  // incompressible (or no codec): keep it raw
      std::memcpy(dst, src, n);
      stored = n;
    }
    put_u32(out, head, static_cast<std::uint32_t>(n));
    put_u32(out, head + 4, static_cast<std::uint32_t>(stored));
    out.resize(head + 8 + stored);
  }
  return out.size() - start;
}

std::array<std::byte, 8> raw_block_header(std::size_t n) {
  std::array<std::byte, 8> h;
  const auto v = static_cast<std::uint32_t>(n);
  std::memcpy(h.data(), &v, 4);
  std::memcpy(h.data() + 4, &v, 4);
  return h;
}

void decode_blocks(std::span<const std::byte> stored, wia_checkpoint_compression_t codec,
                   std::span<std::byte> raw, const std::string& what) {
  std::size_t in = 0;
  std::size_t done = 0;
  while (done < raw.size()) {
    if (stored.size() - in < 8) corrupt(what, "blocks end early");
    std::uint32_t n, s;
    std::memcpy(&n, stored.data() + in, 4);
    std::memcpy(&s, stored.data() + in + 4, 4);
    in += 8;
    if (n == 0 || n > kBlockBytes || n > raw.size() - done || s > stored.size() - in || s > n)
      corrupt(what, fmt::format("block header at byte {} is damaged", in - 8));
    const char* src = reinterpret_cast<const char*>(stored.data() + in);
    char* dst = reinterpret_cast<char*>(raw.data() + done);
    if (s == n) {
      std::memcpy(dst, src, n);
    } else {
      std::size_t got = 0;
      if (codec == WIA_CKPT_COMPRESS_ZSTD) {
        const std::size_t rc = ZSTD_decompress(dst, n, src, s);
        got = ZSTD_isError(rc) ? 0 : rc;
      } else if (codec == WIA_CKPT_COMPRESS_LZ4) {
        const int rc = LZ4_decompress_safe(src, dst, static_cast<int>(s), static_cast<int>(n));
        got = rc > 0 ? static_cast<std::size_t>(rc) : 0;
      }
      if (got != n) corrupt(what, fmt::format("block at byte {} does not decompress", in - 8));
    }
    in += s;
    done += n;
  }
  if (in != stored.size()) corrupt(what, "blocks do not fill the recorded size");
}

}  // namespace wia::checkpoint
