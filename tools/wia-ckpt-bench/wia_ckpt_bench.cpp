// SPDX-License-Identifier: Apache-2.0
// wia-ckpt-bench [--dir DIR] [--size BYTES] [--reps N]
//
// Measures, on float32 tensors that look like trained weights (normally
// distributed, so barely compressible) in DIR (default /tmp):
//   - the bound: writing the same bytes with write(2) + fsync, and reading
//     them back, measured in the same run;
//   - wia_save_checkpoint with each codec, as a ratio to that write bound;
//   - wia_save_checkpoint_async: how long the calling thread is blocked,
//     as a ratio to the synchronous save (goal <= 0.1);
//   - loading (read, decode, verify checksums) against the read bound;
//   - each codec's encode throughput on one core, in GB/s.
// Every figure is the best of --reps runs.
#include <fcntl.h>
#include <fmt/core.h>
#include <unistd.h>
#include <wia/wia.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "checkpoint/format.hpp"
#include "wia_common/text.hpp"

namespace {
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

[[noreturn]] void die(const std::string& what) {
  std::fprintf(stderr, "wia-ckpt-bench: %s\n", what.c_str());
  std::exit(1);
}

void ok(wia_status_t st, const char* what) {
  if (st != WIA_SUCCESS) die(fmt::format("{}: {}", what, wia_get_last_error()));
}

// write(2) + fsync of `bytes` into a fresh file, then read it back.
std::pair<double, double> raw_write_read(const std::string& path, const std::vector<float>& data) {
  const auto t0 = Clock::now();
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) die("cannot create " + path);
  const char* p = reinterpret_cast<const char*>(data.data());
  std::size_t left = data.size() * sizeof(float);
  while (left > 0) {
    const ssize_t n = ::write(fd, p, std::min<std::size_t>(left, 16u << 20));
    if (n <= 0) die("write " + path);
    p += n;
    left -= static_cast<std::size_t>(n);
  }
  ::fsync(fd);
  ::close(fd);
  const double w = seconds_since(t0);
  const auto t1 = Clock::now();
  std::vector<char> back(data.size() * sizeof(float));
  const int rfd = ::open(path.c_str(), O_RDONLY);
  std::size_t got = 0;
  while (got < back.size()) {
    const ssize_t n = ::read(rfd, back.data() + got, back.size() - got);
    if (n <= 0) die("read " + path);
    got += static_cast<std::size_t>(n);
  }
  ::close(rfd);
  const double r = seconds_since(t1);
  fs::remove(path);
  return {w, r};
}

}  // namespace

int main(int argc, char** argv) {
  std::string dir = "/tmp";
  std::uint64_t size = 1ull << 30;
  int reps = 3;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) die(a + " needs a value");
      return argv[++i];
    };
    std::string why;
    if (a == "--dir") {
      dir = next();
    } else if (a == "--size") {
      const std::string v = next();
      if (!wia::common::parse_size(v, &size, &why)) die("--size " + v + ": " + why);
    } else if (a == "--reps") {
      reps = std::max(1, std::atoi(next().c_str()));
    } else {
      die("unknown option " + a + " (--dir DIR --size BYTES --reps N)");
    }
  }
  const std::size_t n = size / sizeof(float);
  std::vector<float> weights(n);
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  for (auto& w : weights) w = normal(rng);

  const std::string work = dir + "/wia-ckpt-bench-" + std::to_string(::getpid());
  fs::create_directories(work);
  double write_s = 1e30, read_s = 1e30;
  for (int r = 0; r < reps; ++r) {
    const auto [w, rd] = raw_write_read(work + "/raw", weights);
    write_s = std::min(write_s, w);
    read_s = std::min(read_s, rd);
  }
  // The staging copy's own bound: one memcpy into memory already touched.
  double memcpy_s = 1e30;
  {
    std::vector<float> copy(n, 0.0f);
    for (int r = 0; r < reps; ++r) {
      const auto t0 = Clock::now();
      std::memcpy(copy.data(), weights.data(), n * sizeof(float));
      memcpy_s = std::min(memcpy_s, seconds_since(t0));
    }
  }
  const double gb = static_cast<double>(n * sizeof(float)) / 1e9;
  fmt::print("checkpoint of {:.2f} GB of float32 in {} (best of {})\n", gb, dir, reps);
  fmt::print(
      "bound: write+fsync {:.3f} s ({:.2f} GB/s), read {:.3f} s ({:.2f} GB/s), memcpy "
      "{:.3f} s ({:.2f} GB/s)\n",
      write_s, gb / write_s, read_s, gb / read_s, memcpy_s, gb / memcpy_s);

  ok(wia_init(), "wia_init");
  wia_stream_t stream = nullptr;
  ok(wia_create_stream(&stream), "wia_create_stream");
  wia_tensor_ref_t ref{"weights", weights.data(), n, WIA_FLOAT32};
  wia_model_t model{};
  model.tensors = &ref;
  model.num_tensors = 1;
  fmt::print("{:<6} {:>9} {:>8} {:>12} {:>7} {:>8} {:>9} {:>8} {:>7} {:>9}\n", "codec", "save s",
             "/bound", "async block", "/sync", "/memcpy", "load s", "/bound", "ratio", "enc GB/s");
  const std::pair<wia_checkpoint_compression_t, const char*> codecs[] = {
      {WIA_CKPT_COMPRESS_NONE, "none"},
      {WIA_CKPT_COMPRESS_LZ4, "lz4"},
      {WIA_CKPT_COMPRESS_ZSTD, "zstd"}};
  for (const auto& [codec, name] : codecs) {
    const std::string cdir = work + "/" + name;
    wia_checkpoint_config_t cfg{};
    cfg.checkpoint_dir = cdir.c_str();
    cfg.compression = codec;
    cfg.keep_last = 1;
    cfg.async_checkpointing = true;
    double save_s = 1e30, block_s = 1e30, load_s = 1e30, enc_s = 1e30;
    std::uint64_t stored = 0;
    for (int r = 0; r < reps; ++r) {
      wia_checkpoint_t* c = wia_create_checkpoint();
      ok(wia_checkpoint_add_model(c, &model), "add_model");
      auto t0 = Clock::now();
      ok(wia_save_checkpoint(c, &cfg), "wia_save_checkpoint");
      save_s = std::min(save_s, seconds_since(t0));
      t0 = Clock::now();
      ok(wia_save_checkpoint_async(c, &cfg, stream), "wia_save_checkpoint_async");
      block_s = std::min(block_s, seconds_since(t0));
      ok(wia_checkpoint_wait(c), "wia_checkpoint_wait");
      ok(wia_free_checkpoint(c), "wia_free_checkpoint");
      t0 = Clock::now();
      wia_checkpoint_t* l = wia_load_latest_checkpoint(&cfg);
      if (l == nullptr) die(std::string("load: ") + wia_get_last_error());
      load_s = std::min(load_s, seconds_since(t0));
      ok(wia_free_checkpoint(l), "free");
      // The codec alone, one core.
      std::vector<std::byte> out;
      out.reserve(n * sizeof(float) + (n * sizeof(float) >> 6) + 4096);
      t0 = Clock::now();
      stored = wia::checkpoint::encode_blocks(std::as_bytes(std::span(weights)), codec, 0, out);
      enc_s = std::min(enc_s, seconds_since(t0));
    }
    fmt::print(
        "{:<6} {:>9.3f} {:>8.2f} {:>12.4f} {:>7.3f} {:>8.2f} {:>9.3f} {:>8.2f} {:>7.3f} {:>9.2f}\n",
        name, save_s, save_s / write_s, block_s, block_s / save_s, block_s / memcpy_s, load_s,
        load_s / read_s, static_cast<double>(stored) / static_cast<double>(n * sizeof(float)),
        gb / enc_s);
  }
  wia_destroy_stream(stream);
  wia_finalize();
  fs::remove_all(work);
  fmt::print(
      "(/bound: time over the raw write or read of the same bytes; /sync: blocking time of an "
      "async save over a synchronous save, goal <= 0.1, and over one memcpy of the same bytes; "
      "ratio: stored / raw bytes)\n");
  return 0;
}
