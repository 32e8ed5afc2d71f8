// SPDX-License-Identifier: Apache-2.0
// What a checkpoint is on disk (docs/checkpoints.md):
//
//   <checkpoint_dir>/latest                 "ckpt-00000007\n": the newest committed one
//   <checkpoint_dir>/LOCK                   held by the saving job's rank 0
//   <checkpoint_dir>/ckpt-00000007/
//       rank-00000.data                     the shard's tensors, block-compressed
//       rank-00000.yaml                     the shard's manifest
//       MANIFEST.yaml                       the commit record (rank 0, last)
//
// Every YAML file ends in a line "# xxh3 <16 hex digits>" over the bytes
// before it; MANIFEST.yaml also records each shard manifest's checksum, so
// a file from another checkpoint is caught too. A data file is a 16-byte
// header ("WIACKPT", format version, sequence number) and then each tensor
// as blocks of [u32 raw bytes][u32 stored bytes][stored bytes]; stored ==
// raw means the block is kept uncompressed. Each tensor's XXH3-64 of its
// raw bytes is in the shard manifest.
#pragma once

#include <wia/wia.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <vector>

namespace wia::checkpoint {

inline constexpr int kFormatVersion = 1;
inline constexpr std::size_t kBlockBytes = std::size_t{1} << 20;

// kResidual: an error-feedback residual of the compression API (fp32).
enum class Kind : std::uint8_t { kModel, kOptimizer, kTensor, kResidual };
const char* kind_name(Kind kind) noexcept;

struct MetaValue {
  enum class Type : std::uint8_t { kInt, kDouble, kString, kBytes } type = Type::kInt;
  std::int64_t i = 0;
  double d = 0;
  std::string bytes;  // kString and kBytes
};

// One tensor as a shard manifest records it.
struct TensorRecord {
  Kind kind = Kind::kTensor;
  std::string name;
  wia_datatype_t dtype = WIA_FLOAT32;
  std::uint64_t count = 0;
  std::uint64_t offset = 0;        // first block in the data file
  std::uint64_t stored_bytes = 0;  // its blocks, headers included
  std::uint64_t checksum = 0;      // XXH3-64 of the raw bytes
};

struct ShardManifest {
  int format_version = kFormatVersion;
  std::uint64_t seq = 0;
  int rank = 0;
  int nranks = 1;
  wia_checkpoint_shard_mode_t shard_mode = WIA_CKPT_SHARDED;
  wia_checkpoint_compression_t compression = WIA_CKPT_COMPRESS_NONE;
  std::uint64_t data_bytes = 0;  // size of the data file
  std::vector<TensorRecord> tensors;
  std::map<std::string, MetaValue> metadata;
};

struct CommitRecord {
  int format_version = kFormatVersion;
  std::uint64_t seq = 0;
  int nranks = 1;
  wia_checkpoint_shard_mode_t shard_mode = WIA_CKPT_SHARDED;
  std::vector<std::uint64_t> shard_checksums;  // of each rank-NNNNN.yaml, by rank
};

std::uint64_t checksum(std::span<const std::byte> bytes) noexcept;
std::uint64_t checksum(const std::string& text) noexcept;

// checksum() of bytes that arrive in pieces.
class RunningChecksum {
 public:
  RunningChecksum();
  ~RunningChecksum();
  RunningChecksum(const RunningChecksum&) = delete;
  RunningChecksum& operator=(const RunningChecksum&) = delete;
  void add(std::span<const std::byte> bytes) noexcept;
  std::uint64_t value() const noexcept;

 private:
  void* state_;  // XXH3_state_t, kept out of this header
};

// Names inside a checkpoint directory.
std::string checkpoint_name(std::uint64_t seq);  // "ckpt-00000007"
// The sequence number of a "ckpt-NNNNNNNN" name; false for anything else.
bool parse_checkpoint_name(const std::string& name, std::uint64_t* seq);
std::string shard_data_name(int rank);      // "rank-00000.data"
std::string shard_manifest_name(int rank);  // "rank-00000.yaml"
inline constexpr const char* kCommitName = "MANIFEST.yaml";
inline constexpr const char* kLatestName = "latest";

// YAML text with its checksum line. Parsing checks the checksum and the
// format; `path` names the file in WIA_ERROR_CORRUPT errors.
std::string to_text(const ShardManifest& m);
std::string to_text(const CommitRecord& r);
ShardManifest parse_shard_manifest(const std::string& text, const std::string& path);
CommitRecord parse_commit_record(const std::string& text, const std::string& path);

// The 16-byte header of a data file.
std::vector<std::byte> data_header(std::uint64_t seq);
void check_data_header(std::span<const std::byte> file, std::uint64_t seq, const std::string& path);

// Appends `raw` as blocks to `out`; returns the bytes appended.
// level 0 = the codec's default.
std::uint64_t encode_blocks(std::span<const std::byte> raw, wia_checkpoint_compression_t codec,
                            int level, std::vector<std::byte>& out);
// The 8-byte header of a block of n bytes kept raw.
std::array<std::byte, 8> raw_block_header(std::size_t n);
// Decodes stored blocks into exactly raw.size() bytes; throws
// WIA_ERROR_CORRUPT naming `what` when they do not decode to that.
void decode_blocks(std::span<const std::byte> stored, wia_checkpoint_compression_t codec,
                   std::span<std::byte> raw, const std::string& what);

}  // namespace wia::checkpoint
