// SPDX-License-Identifier: Apache-2.0
// Crash safety with real processes and SIGKILL. A trainer process resumes
// from the latest checkpoint and then saves asynchronously, step after
// step, until it is killed at a random moment (staging, compressing,
// writing, committing or pruning). After each kill a fresh verifier
// process must load `latest` intact, with the tensors every step's formula
// gives for the iteration it records, and every committed checkpoint left
// in the directory must load too. The parent never starts the library, so
// forking it stays safe.
#include <doctest/doctest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>
#include <wia/wia.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <random>
#include <string>
#include <thread>
#include <vector>

namespace {
namespace fs = std::filesystem;

constexpr std::size_t kWeights = 3u << 20;  // 12 MiB of float: a save takes a while
constexpr std::size_t kMoments = 1u << 18;

float weight(int step, std::size_t i) {
  return static_cast<float>((i * 40503u + static_cast<unsigned>(step) * 7919u) % 65521u) * 0.25f;
}
float moment(int step, std::size_t i) {
  return static_cast<float>(step) - static_cast<float>(i % 13);
}

struct State {
  std::vector<float> w = std::vector<float>(kWeights);
  std::vector<float> m = std::vector<float>(kMoments);
  wia_tensor_ref_t wref{"w", w.data(), kWeights, WIA_FLOAT32};
  wia_tensor_ref_t mref{"m", m.data(), kMoments, WIA_FLOAT32};
  wia_model_t model{};
  wia_optimizer_t opt{};
  State() {
    model.tensors = &wref;
    model.num_tensors = 1;
    opt.tensors = &mref;
    opt.num_tensors = 1;
  }
  void fill(int step) {
    for (std::size_t i = 0; i < kWeights; ++i) w[i] = weight(step, i);
    for (std::size_t i = 0; i < kMoments; ++i) m[i] = moment(step, i);
  }
  bool holds(int step) const {
    for (std::size_t i = 0; i < kWeights; ++i)
      if (w[i] != weight(step, i)) return false;
    for (std::size_t i = 0; i < kMoments; ++i)
      if (m[i] != moment(step, i)) return false;
    return true;
  }
};

wia_checkpoint_config_t config_for(const std::string& dir) {
  wia_checkpoint_config_t cfg{};
  cfg.checkpoint_dir = dir.c_str();
  cfg.async_checkpointing = true;
  cfg.compression = WIA_CKPT_COMPRESS_LZ4;
  cfg.keep_last = 3;
  return cfg;
}

// Loads a checkpoint into s and returns its iteration; -1 and a message on failure.
int load_and_check(wia_checkpoint_t* c, State& s, const std::string& what) {
  if (c == nullptr) {
    std::fprintf(stderr, "%s: %s\n", what.c_str(), wia_get_last_error());
    return -1;
  }
  int iter = -1;
  if (wia_get_checkpoint_metadata(c, "iteration", &iter) != WIA_SUCCESS ||
      wia_restore_model(&s.model, c) != WIA_SUCCESS ||
      wia_restore_optimizer(&s.opt, c) != WIA_SUCCESS) {
    std::fprintf(stderr, "%s: %s\n", what.c_str(), wia_get_last_error());
    wia_free_checkpoint(c);
    return -1;
  }
  wia_free_checkpoint(c);
  if (!s.holds(iter)) {
    std::fprintf(stderr, "%s: tensors differ from iteration %d's\n", what.c_str(), iter);
    return -1;
  }
  return iter;
}

// The trainer: resume, then save every step until killed. Writes one byte
// to `ready` after its first commit.
[[noreturn]] void trainer(const std::string& dir, int ready) {
  if (wia_init() != WIA_SUCCESS) _exit(3);
  const auto cfg = config_for(dir);
  State s;
  int step = 0;
  wia_checkpoint_t* latest = nullptr;
  if (wia_load_checkpoint_ex(nullptr, &cfg, &latest) == WIA_SUCCESS)
    step = load_and_check(latest, s, "trainer resume") + 1;
  if (step < 0) _exit(4);
  wia_stream_t stream = nullptr;
  if (wia_create_stream(&stream) != WIA_SUCCESS) _exit(5);
  for (bool first = true;; first = false, ++step) {
    s.fill(step);
    wia_checkpoint_t* c = wia_create_checkpoint();
    wia_checkpoint_add_model(c, &s.model);
    wia_checkpoint_add_optimizer(c, &s.opt);
    wia_checkpoint_add_metadata(c, "iteration", &step);
    if (wia_save_checkpoint_async(c, &cfg, stream) != WIA_SUCCESS) _exit(6);
    // "Training" overwrites the tensors as soon as the stream has staged them.
    if (wia_stream_synchronize(stream) != WIA_SUCCESS) _exit(7);
    s.fill(-1);
    if (wia_free_checkpoint(c) != WIA_SUCCESS) {
      std::fprintf(stderr, "trainer: save: %s\n", wia_get_last_error());
      _exit(8);
    }
    if (first && write(ready, "r", 1) != 1) _exit(9);
  }
}

// The verifier: latest loads intact, and so does every committed one.
// Writes the latest iteration to `out` and exits 0 when all is well.
[[noreturn]] void verifier(const std::string& dir, int out) {
  if (wia_init() != WIA_SUCCESS) _exit(3);
  const auto cfg = config_for(dir);
  State s;
  const int latest = load_and_check(wia_load_latest_checkpoint(&cfg), s, "latest");
  if (latest < 0) _exit(10);
  int committed = 0;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (!fs::exists(e.path() / "MANIFEST.yaml")) continue;
    if (load_and_check(wia_load_checkpoint(e.path().c_str()), s, e.path().string()) < 0) _exit(11);
    ++committed;
  }
  wia_finalize();
  // keep_last = 3, plus one when the kill came between a commit and its pruning.
  if (committed < 1 || committed > 4) _exit(12);
  const std::string text = std::to_string(latest);
  _exit(write(out, text.data(), text.size()) == static_cast<ssize_t>(text.size()) ? 0 : 13);
}

int wait_exit(pid_t pid, int limit_s) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(limit_s);
  for (;;) {
    int st = 0;
    if (waitpid(pid, &st, WNOHANG) == pid) return WIFEXITED(st) ? WEXITSTATUS(st) : -WTERMSIG(st);
    if (std::chrono::steady_clock::now() > deadline) {
      kill(pid, SIGKILL);
      waitpid(pid, nullptr, 0);
      return -1000;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
}

TEST_CASE("checkpoint: SIGKILL at 20 random moments of async saves never leaves latest broken") {
  setenv("WIA_HOST_DEVICES", "1", 1);
  setenv("WIA_LOG_LEVEL", "error", 1);
  std::string dir = "/tmp/wia_ckpt_crash_XXXXXX";
  REQUIRE(mkdtemp(dir.data()) != nullptr);
  std::mt19937 rng(20261204);
  std::uniform_int_distribution<int> delay_ms(0, 400);
  int previous = -1;
  for (int trial = 0; trial < 20; ++trial) {
    CAPTURE(trial);
    int ready[2];
    REQUIRE(pipe(ready) == 0);
    const pid_t t = fork();
    if (t == 0) trainer(dir, ready[1]);
    close(ready[1]);
    char b = 0;
    const bool committed_once = read(ready[0], &b, 1) == 1;
    close(ready[0]);
    REQUIRE_MESSAGE(committed_once, "the trainer died before its first commit");
    std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms(rng)));
    kill(t, SIGKILL);
    CHECK(wait_exit(t, 30) == -SIGKILL);  // still running when killed: no save failed

    int out[2];
    REQUIRE(pipe(out) == 0);
    const pid_t v = fork();
    if (v == 0) verifier(dir, out[1]);
    close(out[1]);
    const int rc = wait_exit(v, 60);
    char text[32] = {};
    const ssize_t n = read(out[0], text, sizeof(text) - 1);
    close(out[0]);
    REQUIRE_MESSAGE(rc == 0, "verifier exit " << rc);
    REQUIRE(n > 0);
    const int latest = std::atoi(text);
    // Every trainer committed at least once after resuming, so latest moved on.
    CHECK(latest > previous);
    previous = latest;
  }
  std::error_code ec;
  fs::remove_all(dir, ec);
}

}  // namespace
