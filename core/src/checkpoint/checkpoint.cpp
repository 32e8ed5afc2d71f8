// SPDX-License-Identifier: Apache-2.0
#include "checkpoint/checkpoint.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <set>

#include "checkpoint/durable_io.hpp"
#include "common/error.hpp"
#include "common/log.hpp"
#include "common/utf8.hpp"
#include "kernels/cpu_reduce.hpp"

namespace wia::checkpoint {
namespace fs = std::filesystem;
namespace {

using Clock = std::chrono::steady_clock;

// Saves started and not yet waited for, so wia_finalize can finish them.
std::mutex& pending_mu() {
  static auto* mu = new std::mutex();
  return *mu;
}
std::set<Checkpoint*>& pending() {
  static auto* set = new std::set<Checkpoint*>();
  return *set;
}

// Commits to one directory are made one at a time in this process, so
// `latest` only ever moves forward.
std::mutex& commit_mu() {
  static auto* mu = new std::mutex();
  return *mu;
}

std::string read_text(const std::string& path) {
  const auto bytes = read_whole(path);
  return std::string(reinterpret_cast<const char*>(bytes.data()), bytes.size());
}

// The newest sequence number under dir, committed or not (0 when none).
std::uint64_t newest_seq_in(const std::string& dir) {
  std::uint64_t newest = 0;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    std::uint64_t seq;
    if (parse_checkpoint_name(e.path().filename().string(), &seq)) newest = std::max(newest, seq);
  }
  return newest;
}

// The committed checkpoints under dir, oldest first.
std::vector<std::uint64_t> committed_in(const std::string& dir) {
  std::vector<std::uint64_t> seqs;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    std::uint64_t seq;
    if (parse_checkpoint_name(e.path().filename().string(), &seq) &&
        fs::exists(e.path() / kCommitName, ec))
      seqs.push_back(seq);
  }
  std::sort(seqs.begin(), seqs.end());
  return seqs;
}

// The sequence number `latest` names (0 when there is no latest file).
std::uint64_t latest_seq(const std::string& dir) {
  const std::string path = dir + "/" + kLatestName;
  std::error_code ec;
  if (!fs::exists(path, ec)) return 0;
  std::string text = read_text(path);
  if (!text.empty() && text.back() == '\n') text.pop_back();
  std::uint64_t seq = 0;
  if (!parse_checkpoint_name(text, &seq))
    throw Error(WIA_ERROR_CORRUPT,
                fmt::format("{}: does not name a checkpoint ('{}')", path, text.substr(0, 64)));
  return seq;
}

// Polls (bounded) until ready() holds; a rank's "<rank>.failed" marker
// ends the wait early with that rank's message.
void wait_until(const std::function<bool()>& ready, const std::string& ckpt_dir,
                std::uint32_t timeout_ms, const std::string& what) {
  const auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
  for (;;) {
    if (ready()) return;
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(ckpt_dir, ec)) {
      if (e.path().extension() != ".failed") continue;
      std::string why;
      try {
        why = read_text(e.path().string());
      } catch (const Error&) {
      }
      throw Error(WIA_ERROR_REMOTE, fmt::format("{}: {} failed to save its shard: {}", ckpt_dir,
                                                e.path().stem().string(), why));
    }
    if (Clock::now() > deadline)
      throw Error(WIA_ERROR_TIMEOUT,
                  fmt::format("{}: {} did not happen within {} ms (timeout_ms); the checkpoint "
                              "stays uncommitted",
                              ckpt_dir, what, timeout_ms));
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

// Writes this rank's data file and shard manifest; returns the manifest text.
std::string write_shard(const Settings& s, std::uint64_t seq, const std::string& ckpt_dir,
                        const std::vector<Source>& sources, const Staging& staging,
                        const std::map<std::string, MetaValue>& metadata) {
  ShardManifest m;
  m.seq = seq;
  m.rank = s.group.rank;
  m.nranks = s.group.nranks;
  m.shard_mode = s.shard_mode;
  m.compression = s.compression;
  m.metadata = metadata;

  DurableFile data(ckpt_dir + "/" + shard_data_name(s.group.rank));
  data.write(data_header(seq));
  // Blocks are encoded and written a few at a time, so the output buffer
  // stays small whatever the tensor's size.
  constexpr std::size_t kPiece = 16 * kBlockBytes;
  std::vector<std::byte> out;
  for (std::size_t i = 0; i < sources.size(); ++i) {
    const Source& src = sources[i];
    const std::span<const std::byte> raw(staging.buffers[i].data(), src.bytes());
    TensorRecord r{src.kind, src.name, src.dtype, src.count, data.size(), 0, 0};
    RunningChecksum sum;
    for (std::size_t at = 0; at < raw.size(); at += kPiece) {
      const auto piece = raw.subspan(at, std::min(kPiece, raw.size() - at));
      sum.add(piece);
      if (s.compression == WIA_CKPT_COMPRESS_NONE) {
        // Raw blocks go to the file from the staging buffer itself.
        for (std::size_t b = 0; b < piece.size(); b += kBlockBytes) {
          const auto block = piece.subspan(b, std::min(kBlockBytes, piece.size() - b));
          data.write(raw_block_header(block.size()));
          data.write(block);
          r.stored_bytes += 8 + block.size();
        }
        continue;
      }
      out.clear();
      r.stored_bytes += encode_blocks(piece, s.compression, s.level, out);
      data.write(out);
    }
    r.checksum = sum.value();
    m.tensors.push_back(std::move(r));
  }
  m.data_bytes = data.size();
  data.commit();
  std::string text = to_text(m);
  write_durable(ckpt_dir + "/" + shard_manifest_name(s.group.rank), text);
  return text;
}

// Rank 0: once every shard manifest is durable, the commit record, then
// `latest`, then pruning.
void commit(const Settings& s, std::uint64_t seq, const std::string& ckpt_dir,
            const std::string& own_manifest) {
  const int shards = s.shard_mode == WIA_CKPT_REPLICATED ? 1 : s.group.nranks;
  wait_until(
      [&] {
        std::error_code ec;
        for (int r = 1; r < shards; ++r)
          if (!fs::exists(ckpt_dir + "/" + shard_manifest_name(r), ec)) return false;
        return true;
      },
      ckpt_dir, s.timeout_ms, "every rank's shard");
  CommitRecord rec;
  rec.seq = seq;
  rec.nranks = s.group.nranks;
  rec.shard_mode = s.shard_mode;
  rec.shard_checksums.push_back(checksum(own_manifest));
  for (int r = 1; r < shards; ++r)
    rec.shard_checksums.push_back(checksum(read_text(ckpt_dir + "/" + shard_manifest_name(r))));
  write_durable(ckpt_dir + "/" + kCommitName, to_text(rec));

  std::lock_guard lock(commit_mu());
  if (seq > latest_seq(s.dir))
    write_durable(s.dir + "/" + kLatestName, checkpoint_name(seq) + "\n");
  if (s.keep_last > 0) {
    auto seqs = committed_in(s.dir);
    const std::uint64_t newest = latest_seq(s.dir);
    std::erase_if(seqs, [&](std::uint64_t q) { return q >= newest; });
    // `newest` is kept; of the rest, the keep_last - 1 youngest.
    const std::size_t keep = static_cast<std::size_t>(s.keep_last - 1);
    for (std::size_t i = 0; i + keep < seqs.size(); ++i) {
      // Uncommit first, so a crash halfway through the removal leaves a
      // directory nobody loads rather than a committed one with holes.
      const std::string old = s.dir + "/" + checkpoint_name(seqs[i]);
      std::error_code ec;
      fs::remove(old + "/" + kCommitName, ec);
      if (!ec) sync_directory(old);
      fs::remove_all(old, ec);
      if (ec)
        log::warn("checkpoint", "could not prune {}: {}", checkpoint_name(seqs[i]), ec.message());
    }
    sync_directory(s.dir);
  }
}

// Names and strings go into the YAML manifest, which holds only UTF-8
// (common/utf8.hpp): anything else would be saved as another name. The
// message shows the text with its bytes above 0x7e as \xNN.
void require_utf8(const std::string& text, const std::string& what) {
  const std::size_t bad = first_invalid_utf8(text);
  if (bad == std::string::npos) return;
  std::string shown;
  for (const char ch : text.substr(0, 64)) {
    const auto b = static_cast<unsigned char>(ch);
    shown += b >= 0x20 && b < 0x7f ? std::string(1, ch) : fmt::format("\\x{:02x}", b);
  }
  throw Error(WIA_ERROR_INVALID_ARGUMENT,
              fmt::format("{} '{}{}' is not valid UTF-8 (byte {} of {}); use bytes metadata for "
                          "binary data",
                          what, shown, text.size() > 64 ? "..." : "", bad, text.size()));
}

}  // namespace

std::uint64_t Source::bytes() const { return count * kernels::dtype_size(dtype); }

Checkpoint::~Checkpoint() { wait(); }

void Checkpoint::add(Source source) {
  if (source.name.empty() || source.name.size() > WIA_CHECKPOINT_NAME_MAX)
    throw Error(WIA_ERROR_INVALID_ARGUMENT,
                fmt::format("tensor name of {} bytes (allowed: 1 to {})", source.name.size(),
                            WIA_CHECKPOINT_NAME_MAX));
  require_utf8(source.name, "tensor name");
  for (const auto& s : sources_)
    if (s.kind == source.kind && s.name == source.name)
      throw Error(
          WIA_ERROR_INVALID_ARGUMENT,
          fmt::format("{} tensor '{}' is already in the checkpoint", kind_name(s.kind), s.name));
  if (source.count > 0 && source.data == nullptr)
    throw Error(WIA_ERROR_INVALID_ARGUMENT,
                fmt::format("{} tensor '{}': data is NULL", kind_name(source.kind), source.name));
  sources_.push_back(std::move(source));
}

void Checkpoint::add_copy(Kind kind, std::string name, std::vector<float> values) {
  auto kept = std::make_unique<std::vector<float>>(std::move(values));
  add({kind, std::move(name), kept->data(), WIA_FLOAT32, kept->size()});
  copies_.push_back(std::move(kept));
}

void Checkpoint::set_metadata(const std::string& name, MetaValue value) {
  if (name.empty() || name.size() > WIA_CHECKPOINT_NAME_MAX)
    throw Error(WIA_ERROR_INVALID_ARGUMENT,
                fmt::format("metadata name of {} bytes (allowed: 1 to {})", name.size(),
                            WIA_CHECKPOINT_NAME_MAX));
  require_utf8(name, "metadata name");
  if (value.type == MetaValue::Type::kString)
    require_utf8(value.bytes, fmt::format("the string of metadata '{}'", name));
  metadata_[name] = std::move(value);
}

const MetaValue* Checkpoint::metadata(const std::string& name) const {
  const auto it = metadata_.find(name);
  return it == metadata_.end() ? nullptr : &it->second;
}

const Checkpoint::Loaded* Checkpoint::find(Kind kind, const std::string& name) const {
  for (const auto& l : loaded_)
    if (l.record.kind == kind && l.record.name == name) return &l;
  return nullptr;
}

std::uint64_t Checkpoint::next_seq(const Settings& s) {
  make_directories(s.dir);
  if (s.group.rank == 0) lock_directory(s.dir);
  // Saves posted back to back have not created their directories yet, so
  // this process also remembers the numbers it handed out.
  static std::mutex mu;
  static auto* given = new std::map<std::string, std::uint64_t>();
  std::uint64_t proposal;
  {
    std::lock_guard lock(mu);
    proposal = std::max(newest_seq_in(s.dir), (*given)[s.dir]) + 1;
  }
  const std::uint64_t seq = s.group.agree_max(proposal);
  std::lock_guard lock(mu);
  (*given)[s.dir] = std::max((*given)[s.dir], seq);
  return seq;
}

void Checkpoint::start_save(const Settings& settings, std::uint64_t seq, Staging staging) {
  if (writer_.joinable())
    throw Error(WIA_ERROR_INVALID_ARGUMENT,
                "a save of this checkpoint is still pending: wia_checkpoint_wait first");
  path_ = settings.dir + "/" + checkpoint_name(seq);
  save_status_ = WIA_SUCCESS;
  save_message_.clear();
  save_timeout_ms_ = settings.timeout_ms;
  {
    std::lock_guard lock(pending_mu());
    pending().insert(this);
  }
  // The writer works on a snapshot: the caller may add to this checkpoint
  // (or set metadata) while it writes.
  writer_ = std::thread([this, settings, seq, staging = std::move(staging), sources = sources_,
                         metadata = metadata_]() mutable {
    run_save(settings, seq, std::move(staging), sources, metadata);
  });
}

void Checkpoint::report_failed_save(const Settings& s, std::uint64_t seq,
                                    const std::string& message) noexcept {
  // Tells the other ranks at once instead of letting them time out. Best
  // effort: on a full disk even this may not be written.
  try {
    const std::string ckpt_dir = s.dir + "/" + checkpoint_name(seq);
    std::error_code ec;
    fs::create_directory(ckpt_dir, ec);
    write_durable(ckpt_dir + "/" + fmt::format("rank-{:05}.failed", s.group.rank), message);
  } catch (const std::exception&) {
  }
}

void Checkpoint::run_save(const Settings& s, std::uint64_t seq, Staging staging,
                          const std::vector<Source>& sources,
                          const std::map<std::string, MetaValue>& metadata) {
  const std::string ckpt_dir = s.dir + "/" + checkpoint_name(seq);
  try {
    std::error_code ec;
    fs::create_directory(ckpt_dir, ec);
    if (ec) throw Error(WIA_ERROR_IO, fmt::format("cannot create {}: {}", ckpt_dir, ec.message()));
    std::string manifest;
    if (s.writes_shard()) manifest = write_shard(s, seq, ckpt_dir, sources, staging, metadata);
    staging.buffers.clear();  // the staged copies are on disk now
    if (s.group.rank == 0) {
      commit(s, seq, ckpt_dir, manifest);
    } else {
      // Done when `latest` names it (or a later one), not when its
      // MANIFEST appears: rank 0 writes `latest` after, and a rank that
      // loads right after its save must find this checkpoint.
      wait_until(
          [&] {
            try {
              return latest_seq(s.dir) >= seq;
            } catch (const Error&) {
              return false;  // being replaced right now
            }
          },
          ckpt_dir, s.timeout_ms, "rank 0's commit");
    }
  } catch (const Error& e) {
    save_status_ = e.status();
    save_message_ = e.what();
  } catch (const std::exception& e) {
    save_status_ = WIA_ERROR_INTERNAL;
    save_message_ = e.what();
  }
  if (save_status_ != WIA_SUCCESS && save_status_ != WIA_ERROR_REMOTE)
    report_failed_save(s, seq, save_message_);
}

wia_status_t Checkpoint::wait() {
  std::lock_guard join_lock(join_mu_);
  if (writer_.joinable()) writer_.join();  // the writer's own waits are bounded
  {
    std::lock_guard lock(pending_mu());
    pending().erase(this);
  }
  return save_status_;
}

std::unique_ptr<Checkpoint> Checkpoint::load(const std::string& path, const Settings& s) {
  std::string dir = path;
  if (dir.empty()) {
    std::error_code ec;
    if (!fs::is_directory(s.dir, ec))
      throw Error(WIA_ERROR_UNAVAILABLE,
                  fmt::format("checkpoint directory {} does not exist", s.dir));
    const std::uint64_t seq = latest_seq(s.dir);
    if (seq == 0)
      throw Error(
          WIA_ERROR_UNAVAILABLE,
          fmt::format("no checkpoint was committed in {} (no '{}' file)", s.dir, kLatestName));
    dir = s.dir + "/" + checkpoint_name(seq);
  }
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  const std::string commit_path = dir + "/" + kCommitName;
  const CommitRecord rec = parse_commit_record(read_text(commit_path), commit_path);
  std::uint64_t name_seq = 0;
  if (parse_checkpoint_name(fs::path(dir).filename().string(), &name_seq) && name_seq != rec.seq)
    throw Error(WIA_ERROR_CORRUPT,
                fmt::format("{}: records checkpoint {} but sits in {}", commit_path, rec.seq, dir));

  int shard = 0;
  if (rec.shard_mode == WIA_CKPT_SHARDED) {
    if (rec.nranks != s.group.nranks)
      throw Error(WIA_ERROR_MISMATCH,
                  fmt::format("{} was saved by {} ranks (sharded); this job has {}: load it with "
                              "the same number of ranks",
                              dir, rec.nranks, s.group.nranks));
    shard = s.group.rank;
  }
  const std::string manifest_path = dir + "/" + shard_manifest_name(shard);
  const std::string text = read_text(manifest_path);
  if (checksum(text) != rec.shard_checksums[static_cast<std::size_t>(shard)])
    throw Error(WIA_ERROR_CORRUPT, fmt::format("{}: is not the shard manifest {} committed",
                                               manifest_path, commit_path));
  const ShardManifest m = parse_shard_manifest(text, manifest_path);
  if (m.seq != rec.seq || m.rank != shard)
    throw Error(WIA_ERROR_CORRUPT,
                fmt::format("{}: names checkpoint {} rank {}", manifest_path, m.seq, m.rank));

  const std::string data_path = dir + "/" + shard_data_name(shard);
  const MappedFile mapped(data_path);
  const auto file = mapped.bytes();
  check_data_header(file, m.seq, data_path);
  if (file.size() != m.data_bytes)
    throw Error(WIA_ERROR_CORRUPT, fmt::format("{}: {} bytes, the manifest records {}", data_path,
                                               file.size(), m.data_bytes));
  auto ckpt = std::make_unique<Checkpoint>();
  for (const auto& t : m.tensors) {
    const std::string what =
        fmt::format("{} ({} tensor '{}')", data_path, kind_name(t.kind), t.name);
    if (t.offset < 16 || t.offset > file.size() || t.stored_bytes > file.size() - t.offset)
      throw Error(WIA_ERROR_CORRUPT, what + ": lies outside the file");
    Loaded l;
    l.record = t;
    l.data.resize(t.count * kernels::dtype_size(t.dtype));
    decode_blocks(file.subspan(t.offset, t.stored_bytes), m.compression, l.data, what);
    if (checksum(l.data) != t.checksum)
      throw Error(WIA_ERROR_CORRUPT, what + ": checksum mismatch (the data was damaged)");
    ckpt->loaded_.push_back(std::move(l));
  }
  ckpt->metadata_ = m.metadata;
  ckpt->is_loaded_ = true;
  ckpt->path_ = dir;
  return ckpt;
}

void wait_for_pending_saves() noexcept {
  struct Release {
    ~Release() { release_staging_pool(); }
  } release;
  for (;;) {
    Checkpoint* c = nullptr;
    {
      std::lock_guard lock(pending_mu());
      if (pending().empty()) return;
      c = *pending().begin();
    }
    if (c->wait() != WIA_SUCCESS)
      log::warn("checkpoint", "{}: the save pending at finalize failed: {}", c->path(),
                c->wait_message());
  }
}

}  // namespace wia::checkpoint
