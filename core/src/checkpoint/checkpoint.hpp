// SPDX-License-Identifier: Apache-2.0
// A checkpoint in memory (what to save, or what was loaded), the save
// pipeline (stage -> compress and write this rank's shard -> rank 0
// commits once every shard is durable) and the loader. The C API
// (api/api_checkpoint.cpp) resolves communicators and streams into the
// Group and the staging copies used here; this layer knows files only.
#pragma once

#include <wia/wia.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "checkpoint/format.hpp"
#include "checkpoint/staging_pool.hpp"

namespace wia::checkpoint {

// The ranks that save together.
struct Group {
  int rank = 0;
  int nranks = 1;
  // The maximum of v over every rank (a collective call on every rank).
  std::function<std::uint64_t(std::uint64_t v)> agree_max = [](std::uint64_t v) { return v; };
};

// A validated wia_checkpoint_config_t.
struct Settings {
  std::string dir;
  bool async = false;
  wia_checkpoint_compression_t compression = WIA_CKPT_COMPRESS_NONE;
  int level = 0;
  int keep_last = 0;
  wia_checkpoint_shard_mode_t shard_mode = WIA_CKPT_SHARDED;
  std::uint32_t timeout_ms = 600000;
  Group group;
  // Whether this rank writes a shard (every rank, or rank 0 when replicated).
  bool writes_shard() const { return shard_mode == WIA_CKPT_SHARDED || group.rank == 0; }
};

// A tensor to save: read when a save is called.
struct Source {
  Kind kind = Kind::kTensor;
  std::string name;
  const void* data = nullptr;
  wia_datatype_t dtype = WIA_FLOAT32;
  std::uint64_t count = 0;
  std::uint64_t bytes() const;
};

// Staging buffers of one save, already filled by the caller's copies.
struct Staging {
  std::vector<StagingBuffer> buffers;  // one per Source, bytes() each
};

class Checkpoint {
 public:
  Checkpoint() = default;
  ~Checkpoint();
  Checkpoint(const Checkpoint&) = delete;
  Checkpoint& operator=(const Checkpoint&) = delete;

  // --- filling ---
  void add(Source source);
  // Adds a tensor whose bytes are copied now and kept by the checkpoint
  // (library state such as a compression residual, which has no caller
  // buffer to read at save time).
  void add_copy(Kind kind, std::string name, std::vector<float> values);
  void set_metadata(const std::string& name, MetaValue value);
  const std::vector<Source>& sources() const { return sources_; }

  // --- saving ---
  // The sequence number of the next save to settings.dir: 1 + the newest
  // checkpoint any rank sees there, agreed over the group (collective).
  // Creates the directory and, on rank 0, takes its lock.
  static std::uint64_t next_seq(const Settings& settings);
  // A save numbered `seq` failed on this rank before its writer started:
  // leaves the marker that makes the other ranks fail at once.
  static void report_failed_save(const Settings& settings, std::uint64_t seq,
                                 const std::string& message) noexcept;
  // Starts the background writer for sequence `seq` from the filled staging.
  void start_save(const Settings& settings, std::uint64_t seq, Staging staging);
  // Waits for the pending save; its status (SUCCESS when none pending).
  // The message of a failure is kept for wait_message().
  wia_status_t wait();
  const std::string& wait_message() const { return save_message_; }
  bool save_pending() const { return writer_.joinable(); }

  // --- loaded contents ---
  // Loads checkpoint directory `path` (empty: the latest of settings.dir)
  // for settings.group.rank.
  static std::unique_ptr<Checkpoint> load(const std::string& path, const Settings& settings);
  struct Loaded {
    TensorRecord record;
    std::vector<std::byte> data;
  };
  // The loaded tensor, or nullptr.
  const Loaded* find(Kind kind, const std::string& name) const;
  bool loaded() const { return is_loaded_; }
  const std::vector<Loaded>& loaded_tensors() const { return loaded_; }
  const std::map<std::string, MetaValue>& all_metadata() const { return metadata_; }
  const MetaValue* metadata(const std::string& name) const;
  const std::string& path() const { return path_; }

 private:
  void run_save(const Settings& settings, std::uint64_t seq, Staging staging,
                const std::vector<Source>& sources,
                const std::map<std::string, MetaValue>& metadata);

  std::vector<Source> sources_;
  std::vector<std::unique_ptr<std::vector<float>>> copies_;  // what add_copy keeps
  std::map<std::string, MetaValue> metadata_;
  std::vector<Loaded> loaded_;
  bool is_loaded_ = false;
  std::string path_;

  std::mutex join_mu_;  // wait() from the owner and from wia_finalize
  std::thread writer_;
  std::uint32_t save_timeout_ms_ = 0;
  wia_status_t save_status_ = WIA_SUCCESS;
  std::string save_message_;
};

// Waits for every save still pending in this process (wia_finalize).
void wait_for_pending_saves() noexcept;

}  // namespace wia::checkpoint
