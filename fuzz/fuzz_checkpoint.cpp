// SPDX-License-Identifier: Apache-2.0
// fuzz_checkpoint: what a restore reads from disk (docs/checkpoints.md):
// shard manifests (rank-NNNNN.yaml), commit records (MANIFEST.yaml), data
// file headers and the compressed blocks of a tensor.
//
// The first byte picks the input: 0 shard manifest, 1 commit record,
// 2 blocks to decode, 3 raw bytes to encode and decode, 4 a data header.
// With bit 0x80 set the harness re-signs a manifest (replaces its checksum
// line with the right one), so mutations reach the YAML reader rather than
// all stopping at the checksum.
//
// Invariants beyond "no crash":
//  - damaged input is a wia::Error(WIA_ERROR_CORRUPT) naming the file (a
//    newer format version: WIA_ERROR_NOT_SUPPORTED),
//    never another exception (a restore must report which file is bad);
//  - a manifest that parses is canonical: to_text(parse(text)) parses to
//    the same text again;
//  - decoding writes exactly the raw span it is given (ASan checks the
//    bounds) and encode -> decode gives back the raw bytes for every codec.
#include <string>
#include <vector>

#include "checkpoint/format.hpp"
#include "fuzz_common.hpp"

namespace {

namespace ck = wia::checkpoint;
using wia::fuzz::check;

constexpr const char* kPath = "ckpt-00000001/rank-00000.yaml";

std::string resign(std::string_view text) {
  std::string body(text);
  const auto at = body.rfind("\n# xxh3 ");
  if (at != std::string::npos) body.resize(at + 1);
  if (body.empty() || body.back() != '\n') body += '\n';
  return body + fmt::format("# xxh3 {:016x}\n", ck::checksum(body));
}

template <typename Parse>
void manifest(const std::string& text, Parse parse) {
  std::string canonical;
  try {
    canonical = ck::to_text(parse(text, kPath));
  } catch (const wia::Error& e) {
    // A newer format is refused as not supported, everything else as corrupt.
    wia::fuzz::check_rejection(
        e, e.status() == WIA_ERROR_NOT_SUPPORTED ? WIA_ERROR_NOT_SUPPORTED : WIA_ERROR_CORRUPT,
        "checkpoint manifest");
    check(std::string(e.what()).find(kPath) != std::string::npos,
          std::string("the error does not name the file: ") + e.what());
    return;
  }
  try {
    const std::string again = ck::to_text(parse(canonical, kPath));
    check(again == canonical, "manifest not canonical:\n" + canonical + "---\n" + again);
  } catch (const wia::Error& e) {
    wia::fuzz::broken(std::string("a written manifest is rejected: ") + e.what() + "\n" +
                      canonical);
  }
}

wia_checkpoint_compression_t codec_of(std::uint8_t b) {
  return static_cast<wia_checkpoint_compression_t>(b % 3);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  wia::fuzz::quiet_logs();
  wia::fuzz::Bytes in(data, size);
  const std::uint8_t mode = in.u8();
  switch (mode & 0x7f) {
    case 0:
    case 1: {
      const std::string_view text = wia::fuzz::as_text(in.rest());
      const std::string input = (mode & 0x80) ? resign(text) : std::string(text);
      if ((mode & 0x7f) == 0)
        manifest(input, [](const std::string& t, const std::string& p) {
          return ck::parse_shard_manifest(t, p);
        });
      else
        manifest(input, [](const std::string& t, const std::string& p) {
          return ck::parse_commit_record(t, p);
        });
      break;
    }
    case 2: {
      const auto codec = codec_of(in.u8());
      // Up to 4 MiB of output: several 1 MiB blocks.
      const std::size_t raw_bytes = in.u32() % (std::size_t{4} << 20);
      const auto stored = in.rest();
      std::vector<std::byte> raw(raw_bytes);
      try {
        ck::decode_blocks({reinterpret_cast<const std::byte*>(stored.data()), stored.size()}, codec,
                          raw, "tensor 'w'");
      } catch (const wia::Error& e) {
        wia::fuzz::check_rejection(e, WIA_ERROR_CORRUPT, "decode_blocks");
      }
      break;
    }
    case 3: {
      const auto codec = codec_of(in.u8());
      const int level = in.u8() % 8;
      const auto raw = in.rest();
      const std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(raw.data()),
                                             raw.size());
      std::vector<std::byte> stored;
      const std::uint64_t n = ck::encode_blocks(bytes, codec, level, stored);
      check(n == stored.size(), "encode_blocks: returned size differs from what it appended");
      std::vector<std::byte> back(raw.size());
      try {
        ck::decode_blocks(stored, codec, back, "round trip");
      } catch (const wia::Error& e) {
        wia::fuzz::broken(std::string("encoded blocks do not decode: ") + e.what());
      }
      check(std::equal(back.begin(), back.end(), bytes.begin()), "round trip changed the bytes");
      break;
    }
    case 4: {
      const std::uint64_t seq = in.u64();
      const auto file = in.rest();
      try {
        ck::check_data_header({reinterpret_cast<const std::byte*>(file.data()), file.size()}, seq,
                              "rank-00000.data");
      } catch (const wia::Error& e) {
        wia::fuzz::check_rejection(e, WIA_ERROR_CORRUPT, "check_data_header");
      }
      break;
    }
    default:
      break;
  }
  return 0;
}
