// SPDX-License-Identifier: Apache-2.0
#include "checkpoint_report.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.hpp"
#include "checkpoint/format.hpp"
#include "common/error.hpp"

namespace wia_info {
namespace {
namespace fs = std::filesystem;
namespace ck = wia::checkpoint;

std::string text_of(const fs::path& p) {
  std::ifstream in(p);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

std::string show(const ck::MetaValue& v) {
  switch (v.type) {
    case ck::MetaValue::Type::kInt:
      return std::to_string(v.i);
    case ck::MetaValue::Type::kDouble:
      return fmt::format("{}", v.d);
    case ck::MetaValue::Type::kString:
      return "\"" + v.bytes + "\"";
    default:
      return fmt::format("<{} bytes>", v.bytes.size());
  }
}

// Loads and verifies every shard of a committed checkpoint; false when one fails.
bool report_committed(const fs::path& dir, const std::string& mark) {
  const fs::path commit = dir / ck::kCommitName;
  ck::CommitRecord rec;
  try {
    rec = ck::parse_commit_record(text_of(commit), commit.string());
  } catch (const wia::Error& e) {
    fmt::print("  {}{}: DAMAGED: {}\n", dir.filename().string(), mark, e.what());
    return false;
  }
  const int shards = rec.shard_mode == WIA_CKPT_REPLICATED ? 1 : rec.nranks;
  std::uint64_t bytes = 0, tensors = 0;
  std::string metadata;
  for (int r = 0; r < shards; ++r) {
    ck::Settings s;
    s.group.rank = r;
    s.group.nranks = rec.nranks;
    try {
      const auto loaded = ck::Checkpoint::load(dir.string(), s);
      for (const auto& t : loaded->loaded_tensors()) bytes += t.data.size();
      tensors += loaded->loaded_tensors().size();
      if (r == 0)
        for (const auto& [name, v] : loaded->all_metadata())
          metadata += fmt::format("{}{}={}", metadata.empty() ? "" : ", ", name, show(v));
    } catch (const wia::Error& e) {
      fmt::print("  {}{}: DAMAGED (rank {}): {}: {}\n", dir.filename().string(), mark, r,
                 wia::status_name(e.status()), e.what());
      return false;
    }
  }
  fmt::print("  {}{}: committed, {} rank(s) {}, {} tensor(s), {:.1f} MiB, verified{}{}\n",
             dir.filename().string(), mark, rec.nranks,
             rec.shard_mode == WIA_CKPT_REPLICATED ? "replicated" : "sharded", tensors,
             static_cast<double>(bytes) / (1 << 20), metadata.empty() ? "" : "; ", metadata);
  return true;
}

}  // namespace

int checkpoint_report(const std::string& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    std::fprintf(stderr, "wia-info: --checkpoints %s: not a directory\n", dir.c_str());
    return 1;
  }
  std::vector<std::pair<std::uint64_t, fs::path>> found;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    std::uint64_t seq;
    if (ck::parse_checkpoint_name(e.path().filename().string(), &seq))
      found.emplace_back(seq, e.path());
  }
  std::sort(found.begin(), found.end());
  std::uint64_t latest = 0;
  const fs::path latest_file = fs::path(dir) / ck::kLatestName;
  std::string latest_text = fs::exists(latest_file, ec) ? text_of(latest_file) : "";
  if (!latest_text.empty() && latest_text.back() == '\n') latest_text.pop_back();
  const bool latest_ok = latest_text.empty() || ck::parse_checkpoint_name(latest_text, &latest);
  fmt::print("checkpoint directory {}: {} checkpoint(s); latest: {}\n", dir, found.size(),
             latest_text.empty() ? "none"
             : latest_ok         ? latest_text
                                 : "DAMAGED ('" + latest_text + "')");
  bool ok = latest_ok;
  for (const auto& [seq, path] : found) {
    const std::string mark = seq == latest ? " (latest)" : "";
    if (fs::exists(path / ck::kCommitName, ec)) {
      ok &= report_committed(path, mark);
      continue;
    }
    std::string failed;
    std::size_t files = 0;
    for (const auto& f : fs::directory_iterator(path, ec)) {
      ++files;
      if (f.path().extension() == ".failed")
        failed +=
            fmt::format("; {}: {}", f.path().stem().string(), text_of(f.path()).substr(0, 200));
    }
    fmt::print("  {}{}: uncommitted ({} file(s), never loaded){}\n", path.filename().string(), mark,
               files, failed);
    if (seq == latest) ok = false;  // latest must name a committed one
  }
  if (latest != 0 &&
      std::none_of(found.begin(), found.end(), [&](const auto& f) { return f.first == latest; })) {
    fmt::print("  latest names {}, which is not there\n", latest_text);
    ok = false;
  }
  return ok ? 0 : 1;
}

}  // namespace wia_info
