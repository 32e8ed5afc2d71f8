// SPDX-License-Identifier: Apache-2.0
// Checkpoints through the public C API in one process (2 host devices):
// what is restored equals what was saved (values recomputed here from the
// formula that filled them), for every codec, for host memory and for
// device memory; async saves capture the tensors as they were at the call;
// every damaged file is reported by name; bad input is a clear error that
// leaves the previous checkpoint loadable.
#include <doctest/doctest.h>
#include <sys/file.h>
#include <sys/mount.h>
#include <sys/wait.h>
#include <unistd.h>
#include <wia/wia.h>
#include <xxhash.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

namespace {
namespace fs = std::filesystem;

struct Library {
  Library() {
    wia_finalize();
    setenv("WIA_HOST_DEVICES", "2", 1);
    REQUIRE(wia_init() == WIA_SUCCESS);
  }
  ~Library() { wia_finalize(); }
};

struct Scratch {
  std::string path;
  Scratch() {
    std::string t = "/tmp/wia_ckpt_XXXXXX";
    REQUIRE(mkdtemp(t.data()) != nullptr);
    path = t;
  }
  ~Scratch() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

// The value element i of a tensor holds at step `step` (an odd-looking
// pattern, so a shifted or truncated copy cannot match by chance).
float value(int step, std::size_t i, int salt) {
  return static_cast<float>(((i * 2654435761u + static_cast<unsigned>(salt) * 97u) % 10007u)) *
             0.5f -
         2500.0f + static_cast<float>(step);
}

struct Tensors {
  std::vector<float> weights = std::vector<float>(300000);  // > one 1 MiB block
  std::vector<double> bias = std::vector<double>(17);
  std::vector<float> moment = std::vector<float>(1000);
  std::vector<std::int64_t> step_count = std::vector<std::int64_t>(1);
  wia_tensor_ref_t model_refs[2];
  wia_tensor_ref_t opt_refs[2];
  wia_model_t model{};
  wia_optimizer_t opt{};

  Tensors() {
    model_refs[0] = {"layer0.weight", weights.data(), weights.size(), WIA_FLOAT32};
    model_refs[1] = {"layer0.bias", bias.data(), bias.size(), WIA_FLOAT64};
    opt_refs[0] = {"layer0.weight.exp_avg", moment.data(), moment.size(), WIA_FLOAT32};
    opt_refs[1] = {"step", step_count.data(), 1, WIA_INT64};
    model.tensors = model_refs;
    model.num_tensors = 2;
    opt.tensors = opt_refs;
    opt.num_tensors = 2;
  }
  void fill(int step) {
    for (std::size_t i = 0; i < weights.size(); ++i) weights[i] = value(step, i, 1);
    for (std::size_t i = 0; i < bias.size(); ++i) bias[i] = value(step, i, 2) / 3.0;
    for (std::size_t i = 0; i < moment.size(); ++i) moment[i] = value(step, i, 3);
    step_count[0] = 1000000007LL * step;
  }
  void clear() {
    std::fill(weights.begin(), weights.end(), 0.0f);
    std::fill(bias.begin(), bias.end(), 0.0);
    std::fill(moment.begin(), moment.end(), 0.0f);
    step_count[0] = 0;
  }
  // Counts elements that differ from what fill(step) wrote.
  std::size_t wrong(int step) const {
    std::size_t bad = 0;
    for (std::size_t i = 0; i < weights.size(); ++i) bad += weights[i] != value(step, i, 1);
    for (std::size_t i = 0; i < bias.size(); ++i) bad += bias[i] != value(step, i, 2) / 3.0;
    for (std::size_t i = 0; i < moment.size(); ++i) bad += moment[i] != value(step, i, 3);
    bad += step_count[0] != 1000000007LL * step;
    return bad;
  }
};

wia_checkpoint_t* filled(Tensors& t, int step) {
  wia_checkpoint_t* c = wia_create_checkpoint();
  REQUIRE(c != nullptr);
  REQUIRE(wia_checkpoint_add_model(c, &t.model) == WIA_SUCCESS);
  REQUIRE(wia_checkpoint_add_optimizer(c, &t.opt) == WIA_SUCCESS);
  REQUIRE(wia_checkpoint_add_metadata(c, "iteration", &step) == WIA_SUCCESS);
  return c;
}

// Saves t as filled at `step`, synchronously; returns the checkpoint's path.
std::string save_step(Tensors& t, int step, const wia_checkpoint_config_t& cfg) {
  t.fill(step);
  wia_checkpoint_t* c = filled(t, step);
  const wia_status_t st = wia_save_checkpoint(c, &cfg);
  INFO(wia_get_last_error());
  REQUIRE(st == WIA_SUCCESS);
  std::string path = wia_checkpoint_path(c);
  REQUIRE(wia_free_checkpoint(c) == WIA_SUCCESS);
  return path;
}

// Loads the latest checkpoint into t; returns its iteration (-1: none).
int load_latest(Tensors& t, const wia_checkpoint_config_t& cfg) {
  t.clear();
  wia_checkpoint_t* c = wia_load_latest_checkpoint(&cfg);
  if (c == nullptr) return -1;
  int iter = -1;
  CHECK(wia_get_checkpoint_metadata(c, "iteration", &iter) == WIA_SUCCESS);
  CHECK(wia_restore_model(&t.model, c) == WIA_SUCCESS);
  CHECK(wia_restore_optimizer(&t.opt, c) == WIA_SUCCESS);
  wia_free_checkpoint(c);
  return iter;
}

std::string last_error() { return wia_get_last_error(); }

void flip_byte(const std::string& path, std::uintmax_t at) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  REQUIRE(f.good());
  f.seekg(static_cast<std::streamoff>(at));
  char c = 0;
  f.read(&c, 1);
  c = static_cast<char>(c ^ 0x10);
  f.seekp(static_cast<std::streamoff>(at));
  f.write(&c, 1);
}

TEST_CASE("checkpoint: save and restore with every codec, metadata of every type") {
  Library lib;
  for (auto codec : {WIA_CKPT_COMPRESS_NONE, WIA_CKPT_COMPRESS_LZ4, WIA_CKPT_COMPRESS_ZSTD}) {
    CAPTURE(codec);
    Scratch dir;
    wia_checkpoint_config_t cfg{};
    cfg.checkpoint_dir = dir.path.c_str();
    cfg.compression = codec;
    Tensors t;
    t.fill(5);
    wia_checkpoint_t* c = filled(t, 5);
    const std::int64_t big = -(1LL << 50);
    const double pi = 3.141592653589793;
    const unsigned char blob[5] = {0, 255, 1, 128, 7};
    REQUIRE(wia_checkpoint_add_metadata(c, "tokens_seen", &big) == WIA_SUCCESS);
    REQUIRE(wia_checkpoint_add_metadata(c, "lr", &pi) == WIA_SUCCESS);
    REQUIRE(wia_checkpoint_add_metadata(c, "run", "run \"x\": é") == WIA_SUCCESS);
    REQUIRE(wia_checkpoint_add_metadata_bytes(c, "rng", blob, sizeof blob) == WIA_SUCCESS);
    std::vector<std::uint8_t> extra(4096);
    for (std::size_t i = 0; i < extra.size(); ++i) extra[i] = static_cast<std::uint8_t>(i * 31);
    REQUIRE(wia_checkpoint_add_tensor(c, "loader.state", extra.data(), extra.size(), WIA_UINT8) ==
            WIA_SUCCESS);
    INFO(last_error());
    REQUIRE(wia_save_checkpoint(c, &cfg) == WIA_SUCCESS);
    CHECK(std::string(wia_checkpoint_path(c)) == dir.path + "/ckpt-00000001");
    REQUIRE(wia_free_checkpoint(c) == WIA_SUCCESS);

    CHECK(load_latest(t, cfg) == 5);
    CHECK(t.wrong(5) == 0);
    wia_checkpoint_t* l = wia_load_latest_checkpoint(&cfg);
    REQUIRE(l != nullptr);
    std::int64_t big2 = 0;
    double pi2 = 0;
    const char* run = nullptr;
    const void* blob2 = nullptr;
    std::size_t blob_size = 0;
    CHECK(wia_get_checkpoint_metadata(l, "tokens_seen", &big2) == WIA_SUCCESS);
    CHECK(big2 == big);
    CHECK(wia_get_checkpoint_metadata(l, "lr", &pi2) == WIA_SUCCESS);
    CHECK(pi2 == pi);  // bit for bit
    CHECK(wia_get_checkpoint_metadata(l, "run", &run) == WIA_SUCCESS);
    CHECK(std::string(run) == "run \"x\": é");
    CHECK(wia_get_checkpoint_metadata_bytes(l, "rng", &blob2, &blob_size) == WIA_SUCCESS);
    CHECK(blob_size == sizeof blob);
    CHECK(std::memcmp(blob2, blob, sizeof blob) == 0);
    std::vector<std::uint8_t> extra2(4096, 0);
    CHECK(wia_restore_tensor(l, "loader.state", extra2.data(), extra2.size(), WIA_UINT8) ==
          WIA_SUCCESS);
    CHECK(extra2 == extra);
    // An integer too large for int, and a type asked wrongly: errors, not garbage.
    int small = 0;
    CHECK(wia_get_checkpoint_metadata(l, "tokens_seen", &small) == WIA_ERROR_INVALID_ARGUMENT);
    CHECK(last_error().find("does not fit an int") != std::string::npos);
    CHECK(wia_get_checkpoint_metadata(l, "lr", &small) == WIA_ERROR_INVALID_ARGUMENT);
    CHECK(last_error().find("'lr' is a double") != std::string::npos);
    CHECK(wia_get_checkpoint_metadata(l, "nope", &small) == WIA_ERROR_INVALID_ARGUMENT);
    wia_free_checkpoint(l);
    if (codec != WIA_CKPT_COMPRESS_NONE) {
      // The weights pattern repeats every 10007 values: a codec must shrink it.
      const auto stored = fs::file_size(dir.path + "/ckpt-00000001/rank-00000.data");
      CHECK(stored < t.weights.size() * sizeof(float) / 2);
    }
  }
}

TEST_CASE("checkpoint: device memory, and an async save captures the tensors at the call") {
  Library lib;
  Scratch dir;
  wia_checkpoint_config_t cfg{};
  cfg.checkpoint_dir = dir.path.c_str();
  cfg.async_checkpointing = true;
  cfg.compression = WIA_CKPT_COMPRESS_LZ4;
  constexpr std::size_t n = 1 << 20;
  REQUIRE(wia_set_device(1) == WIA_SUCCESS);
  float* dev = nullptr;
  REQUIRE(wia_malloc(reinterpret_cast<void**>(&dev), n * sizeof(float)) == WIA_SUCCESS);
  std::vector<float> host(n);
  for (std::size_t i = 0; i < n; ++i) host[i] = value(1, i, 9);
  REQUIRE(wia_memcpy(dev, host.data(), n * sizeof(float)) == WIA_SUCCESS);
  wia_stream_t stream = nullptr;
  REQUIRE(wia_create_stream(&stream) == WIA_SUCCESS);

  wia_checkpoint_t* c = wia_create_checkpoint();
  REQUIRE(wia_checkpoint_add_tensor(c, "w", dev, n, WIA_FLOAT32) == WIA_SUCCESS);
  REQUIRE(wia_save_checkpoint_async(c, &cfg, stream) == WIA_SUCCESS);
  // Once the stream has passed the staging copy the original may change.
  REQUIRE(wia_stream_synchronize(stream) == WIA_SUCCESS);
  std::vector<float> later(n, -1.0f);
  REQUIRE(wia_memcpy(dev, later.data(), n * sizeof(float)) == WIA_SUCCESS);
  // A second save of the same handle while the first is pending is refused.
  const wia_status_t again = wia_save_checkpoint_async(c, &cfg, stream);
  if (again != WIA_SUCCESS) CHECK(last_error().find("still pending") != std::string::npos);
  REQUIRE(wia_checkpoint_wait(c) == WIA_SUCCESS);
  if (again == WIA_SUCCESS) REQUIRE(wia_checkpoint_wait(c) == WIA_SUCCESS);  // it had finished
  REQUIRE(wia_free_checkpoint(c) == WIA_SUCCESS);

  wia_checkpoint_t* l = wia_load_checkpoint((dir.path + "/ckpt-00000001").c_str());
  INFO(last_error());
  REQUIRE(l != nullptr);
  REQUIRE(wia_restore_tensor(l, "w", dev, n, WIA_FLOAT32) == WIA_SUCCESS);
  std::vector<float> back(n, 0.0f);
  REQUIRE(wia_memcpy(back.data(), dev, n * sizeof(float)) == WIA_SUCCESS);
  CHECK(back == host);
  wia_free_checkpoint(l);
  wia_destroy_stream(stream);
  wia_free(dev);
  REQUIRE(wia_set_device(0) == WIA_SUCCESS);
}

TEST_CASE("checkpoint: a damaged file is WIA_ERROR_CORRUPT naming it, never loaded") {
  Library lib;
  Scratch dir;
  wia_checkpoint_config_t cfg{};
  cfg.checkpoint_dir = dir.path.c_str();
  cfg.compression = WIA_CKPT_COMPRESS_ZSTD;
  Tensors t;
  const std::string ck = save_step(t, 3, cfg);
  const std::string names[] = {"rank-00000.data", "rank-00000.yaml", "MANIFEST.yaml"};
  for (const auto& name : names) {
    const std::string file = ck + "/" + name;
    const auto size = fs::file_size(file);
    for (std::uintmax_t at : {std::uintmax_t{3}, size / 2, size - 20}) {
      CAPTURE(name);
      CAPTURE(at);
      const std::string keep = ck + ".keep";
      fs::copy_file(file, keep, fs::copy_options::overwrite_existing);
      flip_byte(file, at);
      wia_checkpoint_t* out = nullptr;
      CHECK(wia_load_checkpoint_ex(nullptr, &cfg, &out) == WIA_ERROR_CORRUPT);
      CHECK(out == nullptr);
      CHECK(last_error().find(name) != std::string::npos);
      fs::copy_file(keep, file, fs::copy_options::overwrite_existing);
    }
  }
  // Truncated data file, and a missing shard.
  const std::string data = ck + "/rank-00000.data";
  fs::copy_file(data, data + ".keep");
  fs::resize_file(data, fs::file_size(data) - 1);
  CHECK(load_latest(t, cfg) == -1);
  CHECK(last_error().find("rank-00000.data") != std::string::npos);
  fs::remove(data);
  CHECK(load_latest(t, cfg) == -1);
  CHECK(last_error().find("rank-00000.data: missing") != std::string::npos);
  fs::rename(data + ".keep", data);
  // A damaged `latest`.
  std::ofstream(dir.path + "/latest") << "ckpt-0000x001\n";
  wia_checkpoint_t* out = nullptr;
  CHECK(wia_load_checkpoint_ex(nullptr, &cfg, &out) == WIA_ERROR_CORRUPT);
  CHECK(last_error().find("latest") != std::string::npos);
  std::ofstream(dir.path + "/latest") << "ckpt-00000001\n";
  CHECK(load_latest(t, cfg) == 3);
  CHECK(t.wrong(3) == 0);
}

// Rewrites a manifest's text and its checksum line, as a newer libwia
// would have written it.
void rewrite_manifest(const std::string& path, const std::string& from, const std::string& to) {
  std::ifstream in(path);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const auto trailer = text.rfind("# xxh3 ");
  REQUIRE(trailer != std::string::npos);
  std::string body = text.substr(0, trailer);
  const auto at = body.find(from);
  REQUIRE(at != std::string::npos);
  body.replace(at, from.size(), to);
  char sum[17];
  std::snprintf(sum, sizeof sum, "%016llx",
                static_cast<unsigned long long>(XXH3_64bits(body.data(), body.size())));
  std::ofstream(path, std::ios::trunc) << body << "# xxh3 " << sum << "\n";
}

TEST_CASE("checkpoint: a newer format is NOT_SUPPORTED, a consistent but wrong record CORRUPT") {
  Library lib;
  Scratch dir;
  wia_checkpoint_config_t cfg{};
  cfg.checkpoint_dir = dir.path.c_str();
  Tensors t;
  const std::string ck = save_step(t, 4, cfg);
  const std::string manifest = ck + "/MANIFEST.yaml";
  fs::copy_file(manifest, manifest + ".keep");
  rewrite_manifest(manifest, "format_version: 1", "format_version: 2");
  wia_checkpoint_t* out = nullptr;
  CHECK(wia_load_checkpoint_ex(nullptr, &cfg, &out) == WIA_ERROR_NOT_SUPPORTED);
  CHECK(last_error().find("format_version 2 is newer than this libwia reads (1)") !=
        std::string::npos);
  // A valid trailer over a record that names another checkpoint number.
  fs::copy_file(manifest + ".keep", manifest, fs::copy_options::overwrite_existing);
  rewrite_manifest(manifest, "seq: 1", "seq: 9");
  CHECK(wia_load_checkpoint_ex(nullptr, &cfg, &out) == WIA_ERROR_CORRUPT);
  CHECK(last_error().find("records checkpoint 9") != std::string::npos);
  // A shard manifest re-checksummed after an edit no longer matches the commit record.
  fs::copy_file(manifest + ".keep", manifest, fs::copy_options::overwrite_existing);
  rewrite_manifest(ck + "/rank-00000.yaml", "count: 17", "count: 16");
  CHECK(wia_load_checkpoint_ex(nullptr, &cfg, &out) == WIA_ERROR_CORRUPT);
  CHECK(last_error().find("is not the shard manifest") != std::string::npos);
}

TEST_CASE("checkpoint: error-feedback residuals of compressed all-reduces survive a restart") {
  Library lib;
  Scratch dir;
  constexpr std::size_t n = 5000;
  const wia_device_t devs[2] = {0, 1};
  wia_communicator_t comm = nullptr;
  REQUIRE(wia_create_communicator(devs, 2, &comm) == WIA_SUCCESS);
  wia_stream_t streams[2];
  std::vector<float> in[2], out[2];
  for (int r = 0; r < 2; ++r) {
    REQUIRE(wia_create_stream_on(r, &streams[r]) == WIA_SUCCESS);
    in[r].resize(n);
    out[r].resize(n);
    for (std::size_t i = 0; i < n; ++i) in[r][i] = value(r, i, 5) * 1e-3f;
  }
  wia_compression_config_t cc{};
  cc.method = WIA_COMPRESS_TOPK;
  cc.parameters.topk.k_ratio = 0.05;
  cc.parameters.topk.use_magnitude = true;
  cc.error_feedback = true;
  for (int r = 0; r < 2; ++r)
    REQUIRE(wia_all_reduce_compressed(comm, in[r].data(), out[r].data(), n, &cc, streams[r]) ==
            WIA_SUCCESS);
  for (auto s : streams) REQUIRE(wia_stream_synchronize(s) == WIA_SUCCESS);
  std::vector<float> kept(n);
  REQUIRE(wia_compression_get_residual(comm, in[0].data(), kept.data(), n) == WIA_SUCCESS);
  std::size_t nonzero = 0;
  for (float v : kept) nonzero += v != 0.0f;
  REQUIRE(nonzero > n / 2);  // top-k 5 % left most of the gradient behind

  wia_checkpoint_config_t cfg{};
  cfg.checkpoint_dir = dir.path.c_str();
  wia_checkpoint_t* c = wia_create_checkpoint();
  REQUIRE(wia_checkpoint_add_compression_residual(c, comm, "grad0", in[0].data(), n) ==
          WIA_SUCCESS);
  INFO(last_error());
  REQUIRE(wia_save_checkpoint(c, &cfg) == WIA_SUCCESS);
  wia_free_checkpoint(c);

  // "Restart": the library forgets; the new buffer lives elsewhere.
  REQUIRE(wia_compression_reset(comm) == WIA_SUCCESS);
  std::vector<float> moved(n), back(n, 1.0f);
  REQUIRE(wia_compression_get_residual(comm, moved.data(), back.data(), n) == WIA_SUCCESS);
  CHECK(std::count(back.begin(), back.end(), 0.0f) == static_cast<long>(n));
  wia_checkpoint_t* l = wia_load_latest_checkpoint(&cfg);
  REQUIRE(l != nullptr);
  CHECK(wia_restore_compression_residual(l, comm, "grad0", moved.data(), n - 1) ==
        WIA_ERROR_INVALID_ARGUMENT);  // the wrong count names both
  CHECK(last_error().find("holds 5000 x float32") != std::string::npos);
  REQUIRE(wia_restore_compression_residual(l, comm, "grad0", moved.data(), n) == WIA_SUCCESS);
  REQUIRE(wia_compression_get_residual(comm, moved.data(), back.data(), n) == WIA_SUCCESS);
  CHECK(back == kept);
  wia_free_checkpoint(l);
  for (auto s : streams) wia_destroy_stream(s);
  wia_destroy_communicator(comm);
}

TEST_CASE("checkpoint: latest moves forward, keep_last prunes the oldest") {
  Library lib;
  Scratch dir;
  wia_checkpoint_config_t cfg{};
  cfg.checkpoint_dir = dir.path.c_str();
  cfg.keep_last = 2;
  Tensors t;
  for (int step = 10; step <= 50; step += 10) save_step(t, step, cfg);
  CHECK(load_latest(t, cfg) == 50);
  CHECK(t.wrong(50) == 0);
  CHECK(!fs::exists(dir.path + "/ckpt-00000003"));
  CHECK(fs::exists(dir.path + "/ckpt-00000004/MANIFEST.yaml"));
  CHECK(fs::exists(dir.path + "/ckpt-00000005/MANIFEST.yaml"));
  wia_checkpoint_t* old = wia_load_checkpoint((dir.path + "/ckpt-00000004").c_str());
  REQUIRE(old != nullptr);
  t.clear();
  CHECK(wia_restore_model(&t.model, old) == WIA_SUCCESS);
  CHECK(t.weights[7] == value(40, 7, 1));
  wia_free_checkpoint(old);
}

TEST_CASE("checkpoint: bad input is a clear error and the previous checkpoint still loads") {
  Library lib;
  Scratch dir;
  wia_checkpoint_config_t cfg{};
  cfg.checkpoint_dir = dir.path.c_str();
  Tensors t;
  save_step(t, 1, cfg);

  wia_checkpoint_t* c = wia_create_checkpoint();
  const std::string long_name(300, 'n');
  int v = 1;
  CHECK(wia_checkpoint_add_metadata(c, long_name.c_str(), &v) == WIA_ERROR_INVALID_ARGUMENT);
  CHECK(last_error().find("more than 255") != std::string::npos);
  CHECK(wia_checkpoint_add_tensor(c, "x", nullptr, 4, WIA_FLOAT32) == WIA_ERROR_INVALID_ARGUMENT);
  float f[4] = {};
  CHECK(wia_checkpoint_add_tensor(c, "x", f, 4, static_cast<wia_datatype_t>(77)) ==
        WIA_ERROR_INVALID_ARGUMENT);
  REQUIRE(wia_checkpoint_add_tensor(c, "x", f, 4, WIA_FLOAT32) == WIA_SUCCESS);
  CHECK(wia_checkpoint_add_tensor(c, "x", f, 4, WIA_FLOAT32) == WIA_ERROR_INVALID_ARGUMENT);
  CHECK(last_error().find("already in the checkpoint") != std::string::npos);
  // Names and strings must be UTF-8 (the manifest is YAML): "\xff" would
  // be written as U+FFFD, so "a\xff" and "a\xfe" would come back as one.
  CHECK(wia_checkpoint_add_tensor(c, "w\xff", f, 4, WIA_FLOAT32) == WIA_ERROR_INVALID_ARGUMENT);
  CHECK(last_error().find("tensor name 'w\\xff' is not valid UTF-8 (byte 1") != std::string::npos);
  CHECK(wia_checkpoint_add_metadata(c, "k\xc0\xaf", &v) == WIA_ERROR_INVALID_ARGUMENT);
  CHECK(last_error().find("metadata name 'k\\xc0\\xaf' is not valid UTF-8") != std::string::npos);
  CHECK(wia_checkpoint_add_metadata_string(c, "run", "exp\xed\xa0\x80") ==
        WIA_ERROR_INVALID_ARGUMENT);
  CHECK(last_error().find("the string of metadata 'run' 'exp\\xed\\xa0\\x80' is not valid "
                          "UTF-8 (byte 3") != std::string::npos);
  CHECK(wia_checkpoint_add_metadata_string(c, "run", "\xc3\xa9t\xc3\xa9 \xf0\x9f\x9a\x80") ==
        WIA_SUCCESS);
  wia_checkpoint_config_t bad = cfg;
  bad.compression = static_cast<wia_checkpoint_compression_t>(9);
  CHECK(wia_save_checkpoint(c, &bad) == WIA_ERROR_INVALID_ARGUMENT);
  CHECK(last_error().find("config->compression") != std::string::npos);
  bad = cfg;
  bad.checkpoint_dir = nullptr;
  CHECK(wia_save_checkpoint(c, &bad) == WIA_ERROR_INVALID_ARGUMENT);
  // A directory that cannot be created (its parent is a file).
  const std::string file_parent = dir.path + "/plain-file";
  std::ofstream(file_parent) << "x";
  const std::string bad_dir = file_parent + "/ckpts";
  bad.checkpoint_dir = bad_dir.c_str();
  CHECK(wia_save_checkpoint(c, &bad) == WIA_ERROR_IO);
  CHECK(last_error().find(bad_dir) != std::string::npos);
  wia_free_checkpoint(c);

  // Restore into a buffer of the wrong size or type: nothing is written.
  wia_checkpoint_t* l = wia_load_latest_checkpoint(&cfg);
  REQUIRE(l != nullptr);
  std::vector<float> small(10, 42.0f);
  CHECK(wia_restore_tensor(l, "x", small.data(), 10, WIA_FLOAT32) == WIA_ERROR_INVALID_ARGUMENT);
  wia_tensor_ref_t wrong[2] = {t.model_refs[1], {"layer0.weight", small.data(), 10, WIA_FLOAT32}};
  wia_model_t m{};
  m.tensors = wrong;
  m.num_tensors = 2;
  t.bias[0] = 99.0;
  CHECK(wia_restore_model(&m, l) == WIA_ERROR_INVALID_ARGUMENT);
  CHECK(last_error().find("layer0.weight") != std::string::npos);
  CHECK(last_error().find("holds 300000 x float32") != std::string::npos);
  CHECK(t.bias[0] == 99.0);  // checked before anything was copied
  CHECK(small[0] == 42.0f);
  wia_free_checkpoint(l);

  // Nothing saved yet, and no directory at all.
  Scratch empty;
  wia_checkpoint_config_t none{};
  none.checkpoint_dir = empty.path.c_str();
  wia_checkpoint_t* out = reinterpret_cast<wia_checkpoint_t*>(&none);
  CHECK(wia_load_checkpoint_ex(nullptr, &none, &out) == WIA_ERROR_UNAVAILABLE);
  CHECK(out == nullptr);
  CHECK(last_error().find("no checkpoint was committed") != std::string::npos);
  const std::string gone = empty.path + "/nothing-here";
  none.checkpoint_dir = gone.c_str();
  CHECK(wia_load_latest_checkpoint(&none) == nullptr);
  CHECK(last_error().find("does not exist") != std::string::npos);
  CHECK(load_latest(t, cfg) == 1);
  CHECK(t.wrong(1) == 0);
}

TEST_CASE("checkpoint: a directory another job is saving to is refused") {
  Library lib;
  Scratch dir;
  // The other job's rank 0 holds LOCK (a child process takes it with the
  // same flock the library uses; it calls nothing else after fork).
  int ready[2];
  int done[2];
  REQUIRE(pipe(ready) == 0);
  REQUIRE(pipe(done) == 0);
  const pid_t pid = fork();
  if (pid == 0) {
    const int fd = open((dir.path + "/LOCK").c_str(), O_RDWR | O_CREAT, 0644);
    const bool ok = fd >= 0 && flock(fd, LOCK_EX) == 0 && write(fd, "4242", 4) == 4;
    char b = ok ? 'y' : 'n';
    if (write(ready[1], &b, 1) != 1) _exit(1);
    if (read(done[0], &b, 1) != 1) _exit(1);
    _exit(0);
  }
  char b = 0;
  REQUIRE(read(ready[0], &b, 1) == 1);
  REQUIRE(b == 'y');
  wia_checkpoint_config_t cfg{};
  cfg.checkpoint_dir = dir.path.c_str();
  Tensors t;
  t.fill(1);
  wia_checkpoint_t* c = filled(t, 1);
  CHECK(wia_save_checkpoint(c, &cfg) == WIA_ERROR_IO);
  CHECK(last_error().find("in use by another job (process 4242") != std::string::npos);
  REQUIRE(write(done[1], "x", 1) == 1);
  waitpid(pid, nullptr, 0);
  // Once that job is gone the directory is free.
  CHECK(wia_save_checkpoint(c, &cfg) == WIA_SUCCESS);
  wia_free_checkpoint(c);
  for (int fd : {ready[0], ready[1], done[0], done[1]}) close(fd);
}

// A disk that fills up mid-write (a 2 MiB tmpfs), then one made read-only:
// the save fails with the operating system's reason, leaves no temporary
// behind, and the previous checkpoint loads intact. Needs mount(2) (root
// in a private mount namespace or a container); skipped where refused.
TEST_CASE("checkpoint: a full disk and a read-only disk") {
  Library lib;
  Scratch dir;
  if (mount("wia-ckpt", dir.path.c_str(), "tmpfs", 0, "size=2m") != 0) {
    MESSAGE("skipped: cannot mount a tmpfs here (" << std::strerror(errno) << ")");
    return;
  }
  wia_checkpoint_config_t cfg{};
  cfg.checkpoint_dir = dir.path.c_str();
  Tensors t;
  t.weights.resize(100000);  // 400 KB: fits once
  t.model_refs[0].count = t.weights.size();
  save_step(t, 1, cfg);
  std::vector<float> big(1 << 20, 1.0f);  // 4 MiB: does not fit
  wia_checkpoint_t* c = wia_create_checkpoint();
  REQUIRE(wia_checkpoint_add_tensor(c, "big", big.data(), big.size(), WIA_FLOAT32) == WIA_SUCCESS);
  CHECK(wia_save_checkpoint(c, &cfg) == WIA_ERROR_IO);
  CHECK(last_error().find("No space left on device") != std::string::npos);
  CHECK(!fs::exists(dir.path + "/ckpt-00000002/rank-00000.data.tmp"));
  CHECK(load_latest(t, cfg) == 1);
  CHECK(t.wrong(1) == 0);

  // A read-only view of the same directory (a read-only bind mount): the
  // previous checkpoint loads from it, a save is refused.
  Scratch ro;
  REQUIRE(mount(dir.path.c_str(), ro.path.c_str(), nullptr, MS_BIND, nullptr) == 0);
  REQUIRE(mount(nullptr, ro.path.c_str(), nullptr, MS_REMOUNT | MS_BIND | MS_RDONLY, nullptr) == 0);
  wia_checkpoint_config_t ro_cfg = cfg;
  ro_cfg.checkpoint_dir = ro.path.c_str();
  t.fill(2);
  wia_checkpoint_t* small = filled(t, 2);
  CHECK(wia_save_checkpoint(small, &ro_cfg) == WIA_ERROR_IO);
  CHECK(last_error().find("Read-only file system") != std::string::npos);
  CHECK(last_error().find(ro.path) != std::string::npos);
  CHECK(load_latest(t, ro_cfg) == 1);
  CHECK(t.wrong(1) == 0);
  umount2(ro.path.c_str(), MNT_DETACH);
  wia_free_checkpoint(small);
  wia_free_checkpoint(c);
  umount2(dir.path.c_str(), MNT_DETACH);  // lazily: the library keeps LOCK open
}

}  // namespace
