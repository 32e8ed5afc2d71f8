// SPDX-License-Identifier: Apache-2.0
// Checkpoints across 3 real processes of one job (process communicator,
// shm): sharded saves write one shard per rank and commit once, replicated
// saves write rank 0's only, and each rank restores exactly what it saved
// (recomputed here from rank and step). A sharded checkpoint loaded by a
// job of another size is refused.
#include <doctest/doctest.h>
#include <wia/wia.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "process_harness.hpp"

namespace {
using namespace wia::test::processes;
namespace fs = std::filesystem;

// A model of one tensor.
wia_model_t model_of(wia_tensor_ref_t& ref) {
  wia_model_t m{};
  m.tensors = &ref;
  m.num_tensors = 1;
  return m;
}

double entry(int rank, int step, std::size_t i) {
  return static_cast<double>(rank) * 1e6 + static_cast<double>(step) * 1e3 + static_cast<double>(i);
}

std::string g_dir;  // set before the fork: every rank sees the same directory

// Saves (sharded or replicated) at steps 1 and 2, async on the default
// stream, then loads the latest and checks it.
int save_and_load(int rank, int nranks, wia_checkpoint_shard_mode_t mode) {
  wia_communicator_t comm = join(rank, nranks);
  if (!comm) return kApiError;
  const int content_rank = mode == WIA_CKPT_REPLICATED ? 0 : rank;
  std::vector<double> w(50000 + 1000 * static_cast<std::size_t>(rank));
  if (mode == WIA_CKPT_REPLICATED) w.resize(50000);
  wia_tensor_ref_t ref{"w", w.data(), w.size(), WIA_FLOAT64};
  const wia_model_t model = model_of(ref);
  wia_checkpoint_config_t cfg{};
  cfg.checkpoint_dir = g_dir.c_str();
  cfg.async_checkpointing = true;
  cfg.compression = WIA_CKPT_COMPRESS_ZSTD;
  cfg.shard_mode = mode;
  cfg.comm = comm;
  cfg.timeout_ms = 30000;
  for (int step = 1; step <= 2; ++step) {
    for (std::size_t i = 0; i < w.size(); ++i) w[i] = entry(content_rank, step, i);
    wia_checkpoint_t* c = wia_create_checkpoint();
    wia_checkpoint_add_model(c, &model);
    wia_checkpoint_add_metadata(c, "step", &step);
    if (wia_save_checkpoint_async(c, &cfg, nullptr) != WIA_SUCCESS ||
        wia_free_checkpoint(c) != WIA_SUCCESS) {
      std::fprintf(stderr, "rank %d: save: %s\n", rank, wia_get_last_error());
      return kApiError;
    }
  }
  std::fill(w.begin(), w.end(), 0.0);
  wia_checkpoint_t* l = wia_load_latest_checkpoint(&cfg);
  int step = 0;
  if (l == nullptr || wia_get_checkpoint_metadata(l, "step", &step) != WIA_SUCCESS ||
      wia_restore_model(&model, l) != WIA_SUCCESS) {
    std::fprintf(stderr, "rank %d: load: %s\n", rank, wia_get_last_error());
    return kApiError;
  }
  int wrong = step != 2;
  for (std::size_t i = 0; i < w.size(); ++i) wrong += w[i] != entry(content_rank, 2, i);
  if (mode == WIA_CKPT_SHARDED && rank == 0) {
    // A one-process load of a 3-rank sharded checkpoint is refused.
    wia_checkpoint_t* solo = nullptr;
    const wia_status_t st = wia_load_checkpoint_ex(wia_checkpoint_path(l), nullptr, &solo);
    if (st != WIA_ERROR_MISMATCH ||
        std::string(wia_get_last_error()).find("saved by 3 ranks") == std::string::npos) {
      std::fprintf(stderr, "rank 0: solo load: %d %s\n", st, wia_get_last_error());
      ++wrong;
    }
  }
  wia_free_checkpoint(l);
  wia_destroy_communicator(comm);
  if (wrong) std::fprintf(stderr, "rank %d: %d wrong\n", rank, wrong);
  return wrong ? kWrong : kOk;
}

std::vector<std::string> files_in(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

}  // namespace

TEST_CASE("checkpoints across 3 processes: sharded and replicated saves, collective commit") {
  for (auto mode : {WIA_CKPT_SHARDED, WIA_CKPT_REPLICATED}) {
    CAPTURE(mode);
    g_dir = "/tmp/wia_ckpt_ranks_XXXXXX";
    REQUIRE(mkdtemp(g_dir.data()) != nullptr);
    const auto st =
        run_ranks(3, base_yaml(), [mode](int r, int n) { return save_and_load(r, n, mode); },
                  {{"TEST_WIA_ID", unique_id_env()}});
    check_all(st);
    // Both saves committed, numbered 1 and 2, with the shards the mode writes.
    CHECK(files_in(g_dir) ==
          std::vector<std::string>{"LOCK", "ckpt-00000001", "ckpt-00000002", "latest"});
    const auto expected =
        mode == WIA_CKPT_SHARDED
            ? std::vector<std::string>{"MANIFEST.yaml",   "rank-00000.data", "rank-00000.yaml",
                                       "rank-00001.data", "rank-00001.yaml", "rank-00002.data",
                                       "rank-00002.yaml"}
            : std::vector<std::string>{"MANIFEST.yaml", "rank-00000.data", "rank-00000.yaml"};
    CHECK(files_in(g_dir + "/ckpt-00000002") == expected);
    // What an operator sees: wia-info --checkpoints verifies every shard.
    const std::string report =
        run_command(std::string(WIA_TEST_WIA_INFO) + " --checkpoints " + g_dir);
    INFO(report);
    CHECK(report.find("2 checkpoint(s); latest: ckpt-00000002") != std::string::npos);
    CHECK(
        report.find(mode == WIA_CKPT_SHARDED
                        ? "ckpt-00000002 (latest): committed, 3 rank(s) sharded, 3 tensor(s)"
                        : "ckpt-00000002 (latest): committed, 3 rank(s) replicated, 1 tensor(s)") !=
        std::string::npos);
    CHECK(report.find("verified; step=2") != std::string::npos);
    if (mode == WIA_CKPT_SHARDED) {
      // A flipped byte in rank 1's data: named, and the exit status says so.
      const std::string data = g_dir + "/ckpt-00000002/rank-00001.data";
      std::fstream f(data, std::ios::in | std::ios::out | std::ios::binary);
      f.seekp(100);
      f.put('\x7f');
      f.close();
      const std::string bad =
          run_command(std::string(WIA_TEST_WIA_INFO) + " --checkpoints " + g_dir + "; echo rc=$?");
      CHECK(bad.find("ckpt-00000002 (latest): DAMAGED (rank 1): WIA_ERROR_CORRUPT") !=
            std::string::npos);
      CHECK(bad.find("rc=1") != std::string::npos);
      CHECK(bad.find("ckpt-00000001: committed") != std::string::npos);
    }
    std::error_code ec;
    fs::remove_all(g_dir, ec);
  }
}

namespace {

constexpr std::size_t kShard = 1u << 20;  // 8 MiB of double per rank: a save takes a while

// Saves a sharded checkpoint every step until a save fails (a rank died).
int save_until_failure(int rank, int nranks) {
  wia_communicator_t comm = join(rank, nranks);
  if (!comm) return kApiError;
  std::vector<double> w(kShard);
  wia_tensor_ref_t ref{"w", w.data(), w.size(), WIA_FLOAT64};
  const wia_model_t model = model_of(ref);
  wia_checkpoint_config_t cfg{};
  cfg.checkpoint_dir = g_dir.c_str();
  cfg.async_checkpointing = true;
  cfg.comm = comm;
  cfg.timeout_ms = 3000;
  for (int step = 1; step < 100000; ++step) {
    for (std::size_t i = 0; i < w.size(); ++i) w[i] = entry(rank, step, i);
    wia_checkpoint_t* c = wia_create_checkpoint();
    wia_checkpoint_add_model(c, &model);
    wia_checkpoint_add_metadata(c, "step", &step);
    const wia_status_t posted = wia_save_checkpoint_async(c, &cfg, nullptr);
    const wia_status_t done = wia_free_checkpoint(c);
    if (posted != WIA_SUCCESS || done != WIA_SUCCESS) {
      std::fprintf(stderr, "rank %d: step %d: %s\n", rank, step, wia_get_last_error());
      wia_comm_abort(comm);
      return kSawError;
    }
  }
  return kNoError;
}

// Every rank loads its shard of latest: all name the same step and hold
// exactly that step's values.
int verify_latest(int rank, int nranks) {
  wia_communicator_t comm = join(rank, nranks);
  if (!comm) return kApiError;
  wia_checkpoint_config_t cfg{};
  cfg.checkpoint_dir = g_dir.c_str();
  cfg.comm = comm;
  wia_checkpoint_t* l = wia_load_latest_checkpoint(&cfg);
  if (l == nullptr) {
    std::fprintf(stderr, "rank %d: %s\n", rank, wia_get_last_error());
    return kWrong;
  }
  int step = -1;
  std::vector<double> w(kShard, 0.0);
  if (wia_get_checkpoint_metadata(l, "step", &step) != WIA_SUCCESS ||
      wia_restore_tensor(l, "w", w.data(), w.size(), WIA_FLOAT64) != WIA_ERROR_INVALID_ARGUMENT)
    return kWrong;  // it is a model tensor, not a plain one
  wia_tensor_ref_t ref{"w", w.data(), w.size(), WIA_FLOAT64};
  const wia_model_t model = model_of(ref);
  if (wia_restore_model(&model, l) != WIA_SUCCESS) return kWrong;
  wia_free_checkpoint(l);
  std::size_t wrong = 0;
  for (std::size_t i = 0; i < w.size(); ++i) wrong += w[i] != entry(rank, step, i);
  // The step must be the same on every rank: all-reduce max and min agree.
  std::int64_t mx = step, mn = -static_cast<std::int64_t>(step);
  wia_collective_config_t c{};
  c.reduction_op = WIA_REDUCE_MAX;
  c.datatype = WIA_INT64;
  if (wia_all_reduce(comm, &mx, &mx, 1, &c, nullptr) != WIA_SUCCESS ||
      wia_all_reduce(comm, &mn, &mn, 1, &c, nullptr) != WIA_SUCCESS ||
      wia_stream_synchronize(nullptr) != WIA_SUCCESS)
    return kApiError;
  wia_destroy_communicator(comm);
  std::fprintf(stderr, "rank %d: latest is step %d, %zu wrong\n", rank, step, wrong);
  return wrong == 0 && step >= 1 && mx == -mn ? kOk : kWrong;
}

}  // namespace

TEST_CASE(
    "checkpoints across 3 processes: a rank SIGKILLed during saves never leaves latest broken") {
  std::mt19937 rng(42);
  for (int trial = 0; trial < 3; ++trial) {
    CAPTURE(trial);
    g_dir = "/tmp/wia_ckpt_kill_XXXXXX";
    REQUIRE(mkdtemp(g_dir.data()) != nullptr);
    const int delay_ms = std::uniform_int_distribution<int>(400, 1200)(rng);
    const auto st = run_ranks(
        3, base_yaml(3000), save_until_failure, {{"TEST_WIA_ID", unique_id_env()}},
        [delay_ms](std::vector<pid_t>& pids) {
          std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
          kill(pids[2], SIGKILL);
        },
        60);
    CHECK(st[0] == kSawError);
    CHECK(st[1] == kSawError);
    CHECK(st[2] == -SIGKILL);
    const auto v = run_ranks(3, base_yaml(), verify_latest, {{"TEST_WIA_ID", unique_id_env()}});
    check_all(v);
    std::error_code ec;
    fs::remove_all(g_dir, ec);
  }
}
