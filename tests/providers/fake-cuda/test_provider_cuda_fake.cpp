// SPDX-License-Identifier: Apache-2.0
// The cuda provider on the CUDA driver double (libcuda.so.1 of this
// folder, named by WIA_CUDA_LIBRARY in the ctest entry), through the
// public C API only: its devices, collectives of a communicator over the
// two fake GPUs (run by the core's device engine, because GPU memory is
// not host-accessible), and the injected faults.
//
// A fault is read by the double at its first use and a provider's load is
// decided at init, so each fault runs in a fresh process: this binary
// re-executed with WIA_CUDA_FAKE_TEST_SCENARIO set, which a static
// initialiser runs before doctest starts; the scenario prints one line
// and exits 0 when the library behaved as expected.
#include <dlfcn.h>
#include <doctest/doctest.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>
#include <wia/wia.h>

#include "cuda_driver_api.h"

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

namespace {

constexpr int kRanks = 2;

// Only the cuda provider, from this build, on the double.
void select_cuda_provider() {
  setenv("WIA_PROVIDER_PATH", WIA_CUDA_PROVIDER_FILE, 1);
  setenv("WIA_PROVIDERS_ENABLE", "cuda", 1);
  if (std::getenv("WIA_CUDA_LIBRARY") == nullptr) setenv("WIA_CUDA_LIBRARY", WIA_FAKE_CUDA_FILE, 1);
}

bool contains(const std::string& text, const char* part) {
  return text.find(part) != std::string::npos;
}

// ---------------------------------------------------------------------------
// Fault scenarios, each in its own process.

int report(bool ok, const std::string& what) {
  std::printf("%s\n", what.c_str());
  std::fflush(stdout);
  return ok ? 0 : 1;
}

// Three GPUs; GPU 1 is lost after a number of driver calls (the double's
// WIA_FAKE_CUDA_LOST_DEVICE). All-reduces run until one fails; then the
// communicator names rank 1 as failed, revoke / agree / shrink act for
// the whole process, and the shrunk communicator of GPUs 0 and 2 (origin
// ranks 0 and 2) computes right. A stream of a lost GPU is abandoned, as
// an application must.
int device_lost_shrink() {
  constexpr int kGpus = 3;
  constexpr std::size_t n = 4096;
  wia_stream_t s[kGpus] = {};
  float* buf[kGpus] = {};
  for (int r = 0; r < kGpus; ++r)
    if (wia_create_stream_on(r, &s[r]) != WIA_SUCCESS ||
        wia_malloc_on(r, reinterpret_cast<void**>(&buf[r]), n * sizeof(float)) != WIA_SUCCESS)
      return report(false, std::string("setup: ") + wia_get_last_error());
  const wia_device_t devices[kGpus] = {0, 1, 2};
  wia_communicator_t comm = nullptr;
  if (wia_create_communicator(devices, kGpus, &comm) != WIA_SUCCESS)
    return report(false, std::string("communicator: ") + wia_get_last_error());
  wia_collective_config_t cfg{};
  cfg.datatype = WIA_FLOAT32;
  cfg.reduction_op = WIA_REDUCE_SUM;
  std::vector<float> host(n);
  // Every rank's input is (origin rank + 1) * (i % 7): the sum is known.
  auto fill = [&](int origin, float* dev) {
    for (std::size_t i = 0; i < n; ++i) host[i] = static_cast<float>((origin + 1) * (i % 7));
    return wia_memcpy(dev, host.data(), n * sizeof(float)) == WIA_SUCCESS;
  };
  auto check = [&](const float* dev, int weight) {
    if (wia_memcpy(host.data(), dev, n * sizeof(float)) != WIA_SUCCESS) return false;
    for (std::size_t i = 0; i < n; ++i)
      if (host[i] != static_cast<float>(weight * (i % 7))) return false;
    return true;
  };
  int steps = 0;
  std::string failure;
  for (; steps < 2000 && failure.empty(); ++steps) {
    for (int r = 0; r < kGpus; ++r)
      if (!fill(r, buf[r])) failure = std::string("fill: ") + wia_get_last_error();
    if (!failure.empty()) break;
    wia_group_start();
    for (int r = 0; r < kGpus; ++r)
      if (wia_all_reduce(comm, buf[r], buf[r], n, &cfg, s[r]) != WIA_SUCCESS && failure.empty())
        failure = std::string("post: ") + wia_get_last_error();
    wia_group_end();
    for (int r = 0; r < kGpus; ++r)
      if (wia_stream_synchronize(s[r]) != WIA_SUCCESS && failure.empty())
        failure = std::string("sync: ") + wia_get_last_error();
    if (failure.empty())
      for (int r = 0; r < kGpus; ++r)
        if (!check(buf[r], 1 + 2 + 3))
          return report(false, "step " + std::to_string(steps) + ": wrong sum on rank " +
                                   std::to_string(r));
  }
  if (failure.empty()) return report(false, "GPU 1 was never lost");
  int failed[kGpus] = {-1, -1, -1}, nfailed = -1, flag = 1;
  const bool detected = wia_detect_device_failure(comm) &&
                        wia_comm_get_failed(comm, failed, kGpus, &nfailed) == WIA_SUCCESS &&
                        nfailed == 1 && failed[0] == 1;
  const bool agreed = wia_comm_revoke(comm) == WIA_SUCCESS &&
                      wia_comm_agree_failed(comm, &flag, failed, kGpus, &nfailed) == WIA_SUCCESS &&
                      flag == 1 && nfailed == 1 && failed[0] == 1;
  wia_communicator_t next = nullptr;
  if (wia_create_communicator_fault_tolerant(&next, comm) != WIA_SUCCESS)
    return report(false, std::string("shrink: ") + wia_get_last_error());
  int o0 = -1, o1 = -1, size = -1;
  const bool renumbered = wia_comm_size(next) == 2 &&
                          wia_comm_origin_rank(next, 0, &o0, &size) == WIA_SUCCESS &&
                          wia_comm_origin_rank(next, 1, &o1, &size) == WIA_SUCCESS && o0 == 0 &&
                          o1 == 2 && size == 3;
  bool right = true;
  for (int step = 0; step < 5 && right; ++step) {
    right = fill(0, buf[0]) && fill(2, buf[2]);
    wia_group_start();
    right = right && wia_all_reduce(next, buf[0], buf[0], n, &cfg, s[0]) == WIA_SUCCESS &&
            wia_all_reduce(next, buf[2], buf[2], n, &cfg, s[2]) == WIA_SUCCESS;
    wia_group_end();
    right = right && wia_stream_synchronize(s[0]) == WIA_SUCCESS &&
            wia_stream_synchronize(s[2]) == WIA_SUCCESS && check(buf[0], 1 + 3) &&
            check(buf[2], 1 + 3);
  }
  const std::string after = right ? "" : wia_get_last_error();
  // The old communicator goes, whatever its lost GPU says.
  wia_destroy_communicator(comm);
  const bool released = wia_destroy_communicator(next) == WIA_SUCCESS;
  return report(detected && agreed && renumbered && right && released,
                "lost after " + std::to_string(steps) + " all-reduces (" + failure +
                    "); detected " + std::to_string(detected) + ", agreed " +
                    std::to_string(agreed) + ", renumbered " + std::to_string(renumbered) +
                    ", shrunk communicator right " + std::to_string(right) + " " + after +
                    ", released " + std::to_string(released));
}

int scenario(const std::string& name) {
  select_cuda_provider();
  const wia_status_t init = wia_init();
  const std::string init_error = init == WIA_SUCCESS ? "" : wia_get_last_error();
  if (name == "no_device" || name == "missing_library") {
    // providers.enable=cuda turns "absent" into an init error that quotes
    // the provider's state and reason, as wia-info shows them.
    const char* reason = name == "no_device" ? "cuInit: CUDA_ERROR_NO_DEVICE" : "not found";
    return report(
        init != WIA_SUCCESS && contains(init_error, "absent") && contains(init_error, reason),
        "init: " + std::string(wia_status_string(init)) + ": " + init_error);
  }
  if (init != WIA_SUCCESS) return report(false, "init failed: " + init_error);
  int rc = 1;
  if (name == "oom") {
    void* p = nullptr;
    const wia_status_t st = wia_malloc_on(0, &p, 4096);
    const std::string error = st == WIA_SUCCESS ? "" : wia_get_last_error();
    rc = report(st == WIA_ERROR_OUT_OF_MEMORY && p == nullptr && contains(error, "cuMemAlloc"),
                "malloc: " + std::string(wia_status_string(st)) + ": " + error);
  } else if (name == "stream_error") {
    // An all-reduce over the two GPUs: its first on-device reduction is the
    // process's first kernel launch, which the double fails.
    constexpr std::size_t n = 1024;
    const wia_device_t devices[2] = {0, 1};
    wia_stream_t s[2] = {};
    void* buf[2] = {};
    wia_communicator_t comm = nullptr;
    for (int r = 0; r < 2; ++r)
      if (wia_create_stream_on(r, &s[r]) != WIA_SUCCESS ||
          wia_malloc_on(r, &buf[r], n * sizeof(float)) != WIA_SUCCESS ||
          wia_memset(buf[r], 0, n * sizeof(float)) != WIA_SUCCESS)
        return report(false, std::string("setup: ") + wia_get_last_error());
    if (wia_create_communicator(devices, 2, &comm) != WIA_SUCCESS)
      return report(false, std::string("communicator: ") + wia_get_last_error());
    const wia_collective_config_t cfg{
        WIA_COLLECTIVE_ALLREDUCE, WIA_REDUCE_SUM, WIA_FLOAT32, WIA_ALGORITHM_AUTO, 0, 0};
    std::string errors;
    int failed = 0;
    wia_group_start();
    for (int r = 0; r < 2; ++r)
      if (wia_all_reduce(comm, buf[r], buf[r], n, &cfg, s[r]) != WIA_SUCCESS)
        return report(false, std::string("post: ") + wia_get_last_error());
    if (wia_group_end() != WIA_SUCCESS)
      return report(false, std::string("group end: ") + wia_get_last_error());
    for (int r = 0; r < 2; ++r) {
      if (wia_stream_synchronize(s[r]) != WIA_SUCCESS) {
        ++failed;
        errors += std::string(" [rank ") + std::to_string(r) + "] " + wia_get_last_error();
      }
    }
    // The double reports a launch failure once, on the stream that ran the
    // kernel: an internal stream of the device engine, rank 0's or rank
    // 1's. The users' streams may therefore complete; the engine must not
    // lose the failure: in a later all-reduce each rank either fails to
    // post or its stream reports the failure (no timeout), and the
    // communicator's asynchronous error is set.
    // The engine asks each rank's stream at its next post; a stream still
    // finishing its last record answers "busy" (no error yet), so the
    // failure surfaces at one of the next few collectives, never later and
    // never as a timeout.
    std::string next_errors;
    int next_failed = 0;
    for (int attempt = 0; attempt < 10 && next_failed == 0; ++attempt) {
      next_errors.clear();
      bool posted[2] = {};
      wia_group_start();
      for (int r = 0; r < 2; ++r) {
        posted[r] = wia_all_reduce(comm, buf[r], buf[r], n, &cfg, s[r]) == WIA_SUCCESS;
        if (!posted[r]) {
          ++next_failed;
          next_errors +=
              std::string(" [post, rank ") + std::to_string(r) + "] " + wia_get_last_error();
        }
      }
      wia_group_end();  // its status repeats a post's error
      for (int r = 0; r < 2; ++r)
        if (posted[r] && wia_stream_synchronize(s[r]) != WIA_SUCCESS) {
          ++next_failed;
          next_errors +=
              std::string(" [sync, rank ") + std::to_string(r) + "] " + wia_get_last_error();
        }
    }
    const bool next_fails = next_failed == 2 && contains(next_errors, "CUDA_ERROR_LAUNCH_FAILED") &&
                            !contains(next_errors, "timed out");
    const std::string next_error = next_errors;
    const bool async_reported = wia_comm_get_async_error(comm) != WIA_SUCCESS;
    // Then everything is released normally.
    bool clean = true;
    for (int r = 0; r < 2; ++r) clean = clean && wia_stream_synchronize(s[r]) == WIA_SUCCESS;
    wia_destroy_communicator(comm);
    for (int r = 0; r < 2; ++r)
      clean = clean && wia_free(buf[r]) == WIA_SUCCESS && wia_destroy_stream(s[r]) == WIA_SUCCESS;
    if (!clean) return report(false, std::string("teardown failed: ") + wia_get_last_error());
    rc = report((failed == 0 || contains(errors, "CUDA_ERROR_LAUNCH_FAILED")) && next_fails &&
                    async_reported,
                "synchronize:" + (errors.empty() ? std::string(" ok") : errors) +
                    "; next all-reduce:" + next_error +
                    "; async error reported: " + (async_reported ? "yes" : "no"));
  } else if (name == "device_lost_shrink") {
    rc = device_lost_shrink();
  } else {
    return report(false, "unknown scenario " + name);
  }
  if (wia_finalize() != WIA_SUCCESS) return report(false, "finalize failed");
  return rc;
}

[[maybe_unused]] const int kScenario = [] {
  if (const char* name = std::getenv("WIA_CUDA_FAKE_TEST_SCENARIO")) std::_Exit(scenario(name));
  return 0;
}();

struct ChildResult {
  int status = -1;  // exit status, 128 + signal, or -1 when killed at the deadline
  std::string output;
};

// Runs scenario `name` in a re-executed copy of this binary with `env`
// added; kills it after 60 s (a hang is a failure, not a stuck ctest).
ChildResult run_scenario(const std::string& name, const std::vector<std::string>& env) {
  int out[2];
  REQUIRE(pipe(out) == 0);
  const pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    dup2(out[1], STDOUT_FILENO);
    close(out[0]);
    close(out[1]);
    setenv("WIA_CUDA_FAKE_TEST_SCENARIO", name.c_str(), 1);
    for (const std::string& kv : env) putenv(const_cast<char*>(kv.c_str()));
    execl("/proc/self/exe", "test_provider_cuda_fake", static_cast<char*>(nullptr));
    _exit(127);
  }
  close(out[1]);
  ChildResult r;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  char buf[512];
  for (;;) {
    pollfd pfd{out[0], POLLIN, 0};
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      kill(pid, SIGKILL);
      r.output += "[killed after 60 s]";
      break;
    }
    if (poll(&pfd, 1, static_cast<int>(left.count())) <= 0) continue;
    const ssize_t n = read(out[0], buf, sizeof(buf));
    if (n <= 0) break;
    r.output.append(buf, static_cast<std::size_t>(n));
  }
  close(out[0]);
  int st = 0;
  waitpid(pid, &st, 0);
  const bool killed = WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL && contains(r.output, "[killed");
  r.status = killed ? -1 : (WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st));
  return r;
}

// ---------------------------------------------------------------------------
// Collectives: buffers on both fake GPUs, references in double precision.

// bfloat16 <-> double by hand (not through the kernels under test).
double bf16_to_double(std::uint16_t b) {
  const std::uint32_t bits = static_cast<std::uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}
std::uint16_t bf16_of_small_integer(int v) {  // exact for |v| < 256
  const float f = static_cast<float>(v);
  std::uint32_t bits;
  std::memcpy(&bits, &f, sizeof(bits));
  return static_cast<std::uint16_t>(bits >> 16);
}

struct Ranks {
  wia_communicator_t comm = nullptr;
  wia_stream_t stream[kRanks] = {};
  std::vector<void*> owned;

  Ranks() {
    select_cuda_provider();
    REQUIRE_MESSAGE(wia_init() == WIA_SUCCESS, wia_get_last_error());
    const wia_device_t devices[kRanks] = {0, 1};
    for (int r = 0; r < kRanks; ++r)
      REQUIRE_MESSAGE(wia_create_stream_on(r, &stream[r]) == WIA_SUCCESS, wia_get_last_error());
    REQUIRE_MESSAGE(wia_create_communicator(devices, kRanks, &comm) == WIA_SUCCESS,
                    wia_get_last_error());
  }
  ~Ranks() {
    for (int r = 0; r < kRanks; ++r) CHECK(wia_stream_synchronize(stream[r]) == WIA_SUCCESS);
    CHECK(wia_destroy_communicator(comm) == WIA_SUCCESS);
    for (void* p : owned) CHECK(wia_free(p) == WIA_SUCCESS);
    for (int r = 0; r < kRanks; ++r) CHECK(wia_destroy_stream(stream[r]) == WIA_SUCCESS);
    CHECK(wia_finalize() == WIA_SUCCESS);
  }
  // A buffer on rank r's GPU holding `init` (or zeros).
  template <typename T>
  T* on_gpu(int r, std::size_t count, const std::vector<T>& init = {}) {
    void* p = nullptr;
    REQUIRE_MESSAGE(wia_malloc_on(r, &p, count * sizeof(T)) == WIA_SUCCESS, wia_get_last_error());
    owned.push_back(p);
    std::vector<T> host = init.empty() ? std::vector<T>(count) : init;
    REQUIRE(wia_memcpy(p, host.data(), count * sizeof(T)) == WIA_SUCCESS);
    return static_cast<T*>(p);
  }
  template <typename T>
  std::vector<T> read(const T* p, std::size_t count) {
    std::vector<T> host(count);
    REQUIRE(wia_memcpy(host.data(), p, count * sizeof(T)) == WIA_SUCCESS);
    return host;
  }
  void sync() {
    for (int r = 0; r < kRanks; ++r)
      REQUIRE_MESSAGE(wia_stream_synchronize(stream[r]) == WIA_SUCCESS, wia_get_last_error());
  }
};

// Rank r's element i: distinct per rank, not all integers.
float input(int r, std::size_t i) {
  return static_cast<float>((i * 37 + static_cast<std::size_t>(r) * 11) % 101) * 0.125f - 4.0f +
         static_cast<float>(r);
}

void check_close(double got, double ref, double rel, std::size_t i) {
  INFO("element " << i << ": got " << got << ", reference " << ref);
  REQUIRE(std::fabs(got - ref) <= rel * std::max(1.0, std::fabs(ref)));
}

}  // namespace

TEST_CASE("the double's GPUs appear as the cuda provider's devices") {
  select_cuda_provider();
  REQUIRE_MESSAGE(wia_init() == WIA_SUCCESS, wia_get_last_error());
  int count = 0;
  REQUIRE(wia_get_device_count(&count) == WIA_SUCCESS);
  REQUIRE(count == 2);
  for (int d = 0; d < count; ++d) {
    wia_device_properties_t props{};
    REQUIRE(wia_get_device_properties(d, &props) == WIA_SUCCESS);
    CHECK(props.kind == WIA_DEVICE_KIND_GPU);
    CHECK(std::string(props.provider) == "cuda");
    CHECK(std::string(props.name) == "Fake CUDA Device " + std::to_string(d));
    CHECK(std::string(props.pci_bus_id) == "0000:0" + std::to_string(d) + ":00.0");
    CHECK(props.total_memory == (16ull << 30));
  }
  CHECK(wia_can_access_peer(0, 1));
  CHECK(wia_finalize() == WIA_SUCCESS);
}

TEST_CASE("all-reduce over the two cuda devices: float32 sum and avg, bfloat16 sum") {
  Ranks k;
  constexpr std::size_t n = 4099;  // not a multiple of any chunking
  for (const wia_reduce_op_t op : {WIA_REDUCE_SUM, WIA_REDUCE_AVG}) {
    CAPTURE(op);
    float* send[kRanks];
    float* recv[kRanks];
    for (int r = 0; r < kRanks; ++r) {
      std::vector<float> v(n);
      for (std::size_t i = 0; i < n; ++i) v[i] = input(r, i);
      send[r] = k.on_gpu<float>(r, n, v);
      recv[r] = k.on_gpu<float>(r, n);
    }
    const wia_collective_config_t cfg{WIA_COLLECTIVE_ALLREDUCE, op, WIA_FLOAT32,
                                      WIA_ALGORITHM_AUTO,       0,  0};
    REQUIRE(wia_group_start() == WIA_SUCCESS);  // one thread, two GPUs
    for (int r = 0; r < kRanks; ++r)
      REQUIRE_MESSAGE(wia_all_reduce(k.comm, send[r], recv[r], n, &cfg, k.stream[r]) == WIA_SUCCESS,
                      wia_get_last_error());
    REQUIRE(wia_group_end() == WIA_SUCCESS);
    k.sync();
    for (int r = 0; r < kRanks; ++r) {
      const auto got = k.read(recv[r], n);
      for (std::size_t i = 0; i < n; ++i) {
        double ref = 0;
        for (int q = 0; q < kRanks; ++q) ref += static_cast<double>(input(q, i));
        if (op == WIA_REDUCE_AVG) ref /= kRanks;
        check_close(got[i], ref, 1e-6, i);
      }
    }
  }
  // bfloat16: small integers are exact in bfloat16 and so is their sum
  // (below 256), so the result must equal the reference exactly.
  std::uint16_t* send[kRanks];
  for (int r = 0; r < kRanks; ++r) {
    std::vector<std::uint16_t> v(n);
    for (std::size_t i = 0; i < n; ++i)
      v[i] = bf16_of_small_integer(static_cast<int>((i + 3 * r) % 120) - 60);
    send[r] = k.on_gpu<std::uint16_t>(r, n, v);
  }
  const wia_collective_config_t cfg{
      WIA_COLLECTIVE_ALLREDUCE, WIA_REDUCE_SUM, WIA_BFLOAT16, WIA_ALGORITHM_AUTO, 0, 0};
  REQUIRE(wia_group_start() == WIA_SUCCESS);  // one thread, two GPUs
  for (int r = 0; r < kRanks; ++r)  // in place
    REQUIRE(wia_all_reduce(k.comm, send[r], send[r], n, &cfg, k.stream[r]) == WIA_SUCCESS);
  REQUIRE(wia_group_end() == WIA_SUCCESS);
  k.sync();
  for (int r = 0; r < kRanks; ++r) {
    const auto got = k.read(send[r], n);
    for (std::size_t i = 0; i < n; ++i) {
      double ref = 0;
      for (int q = 0; q < kRanks; ++q) ref += static_cast<double>((i + 3 * q) % 120) - 60.0;
      INFO("rank " << r << " element " << i);
      REQUIRE(bf16_to_double(got[i]) == ref);
    }
  }
}

TEST_CASE("broadcast, all-gather and reduce-scatter over the two cuda devices") {
  Ranks k;
  constexpr std::size_t n = 1031;
  SUBCASE("broadcast from rank 1") {
    float* buf[kRanks];
    for (int r = 0; r < kRanks; ++r) {
      std::vector<float> v(n);
      for (std::size_t i = 0; i < n; ++i) v[i] = input(r, i);
      buf[r] = k.on_gpu<float>(r, n, v);
    }
    REQUIRE(wia_group_start() == WIA_SUCCESS);  // one thread, two GPUs
    for (int r = 0; r < kRanks; ++r)
      REQUIRE_MESSAGE(wia_broadcast(k.comm, buf[r], n, 1, WIA_FLOAT32, k.stream[r]) == WIA_SUCCESS,
                      wia_get_last_error());
    REQUIRE(wia_group_end() == WIA_SUCCESS);
    k.sync();
    for (int r = 0; r < kRanks; ++r) {
      const auto got = k.read(buf[r], n);
      for (std::size_t i = 0; i < n; ++i) REQUIRE(got[i] == input(1, i));
    }
  }
  SUBCASE("all-gather") {
    float* send[kRanks];
    float* recv[kRanks];
    for (int r = 0; r < kRanks; ++r) {
      std::vector<float> v(n);
      for (std::size_t i = 0; i < n; ++i) v[i] = input(r, i);
      send[r] = k.on_gpu<float>(r, n, v);
      recv[r] = k.on_gpu<float>(r, kRanks * n);
    }
    REQUIRE(wia_group_start() == WIA_SUCCESS);  // one thread, two GPUs
    for (int r = 0; r < kRanks; ++r)
      REQUIRE_MESSAGE(
          wia_all_gather(k.comm, send[r], recv[r], n, WIA_FLOAT32, k.stream[r]) == WIA_SUCCESS,
          wia_get_last_error());
    REQUIRE(wia_group_end() == WIA_SUCCESS);
    k.sync();
    for (int r = 0; r < kRanks; ++r) {
      const auto got = k.read(recv[r], kRanks * n);
      for (int q = 0; q < kRanks; ++q)
        for (std::size_t i = 0; i < n; ++i) REQUIRE(got[q * n + i] == input(q, i));
    }
  }
  SUBCASE("reduce-scatter (sum)") {
    float* send[kRanks];
    float* recv[kRanks];
    for (int r = 0; r < kRanks; ++r) {
      std::vector<float> v(kRanks * n);
      for (std::size_t i = 0; i < kRanks * n; ++i) v[i] = input(r, i);
      send[r] = k.on_gpu<float>(r, kRanks * n, v);
      recv[r] = k.on_gpu<float>(r, n);
    }
    const wia_collective_config_t cfg{
        WIA_COLLECTIVE_REDUCE_SCATTER, WIA_REDUCE_SUM, WIA_FLOAT32, WIA_ALGORITHM_AUTO, 0, 0};
    REQUIRE(wia_group_start() == WIA_SUCCESS);  // one thread, two GPUs
    for (int r = 0; r < kRanks; ++r)
      REQUIRE_MESSAGE(
          wia_reduce_scatter(k.comm, send[r], recv[r], n, &cfg, k.stream[r]) == WIA_SUCCESS,
          wia_get_last_error());
    REQUIRE(wia_group_end() == WIA_SUCCESS);
    k.sync();
    for (int r = 0; r < kRanks; ++r) {
      const auto got = k.read(recv[r], n);
      for (std::size_t i = 0; i < n; ++i) {
        double ref = 0;
        for (int q = 0; q < kRanks; ++q) ref += static_cast<double>(input(q, r * n + i));
        check_close(got[i], ref, 1e-6, i);
      }
    }
  }
}

TEST_CASE("ranks of one process on cuda devices must post inside a group; refused clearly") {
  Ranks k;
  constexpr std::size_t n = 64;
  float* buf[kRanks];
  for (int r = 0; r < kRanks; ++r) buf[r] = k.on_gpu<float>(r, n, std::vector<float>(n, 1.0f));
  const wia_collective_config_t cfg{
      WIA_COLLECTIVE_ALLREDUCE, WIA_REDUCE_SUM, WIA_FLOAT32, WIA_ALGORITHM_AUTO, 0, 0};
  // Outside a group the first rank's post would park its stream in a host
  // function that waits for the others, which CUDA forbids: refused, and
  // nothing registered, so the next grouped call still matches.
  CHECK(wia_all_reduce(k.comm, buf[0], buf[0], n, &cfg, k.stream[0]) == WIA_ERROR_INVALID_ARGUMENT);
  CHECK(contains(wia_get_last_error(), "wia_group_start"));
  REQUIRE(wia_group_start() == WIA_SUCCESS);
  for (int r = 0; r < kRanks; ++r)
    REQUIRE(wia_all_reduce(k.comm, buf[r], buf[r], n, &cfg, k.stream[r]) == WIA_SUCCESS);
  REQUIRE(wia_group_end() == WIA_SUCCESS);
  k.sync();
  for (int r = 0; r < kRanks; ++r)
    for (float v : k.read(buf[r], n)) REQUIRE(v == static_cast<float>(kRanks));
}

TEST_CASE("wia_launch_kernel: a caller's module and kernel on a cuda stream, with clear errors") {
  Ranks k;
  constexpr std::uint64_t n = 1000;
  std::vector<std::uint32_t> init(n);
  for (std::uint64_t i = 0; i < n; ++i) init[i] = static_cast<std::uint32_t>(i * 3);
  std::uint32_t* data = k.on_gpu<std::uint32_t>(1, n, init);
  // The double does not parse images; the GPU script loads real PTX.
  const char image[] = "// a caller's module";
  wia_module_t m = nullptr;
  REQUIRE_MESSAGE(wia_module_load(1, image, sizeof(image), &m) == WIA_SUCCESS,
                  wia_get_last_error());
  wia_kernel_t missing = nullptr;
  CHECK(wia_kernel_create(m, "no_such_kernel", &missing) != WIA_SUCCESS);
  CHECK(contains(wia_get_last_error(), "no_such_kernel"));
  CHECK(contains(wia_get_last_error(), "CUDA_ERROR_NOT_FOUND"));
  wia_kernel_t add = nullptr;
  REQUIRE(wia_kernel_create(m, "wia_test_add_u32", &add) == WIA_SUCCESS);
  const std::uint32_t grid[3] = {4, 1, 1}, block[3] = {256, 1, 1};
  REQUIRE(wia_kernel_set_launch(add, grid, block, 0) == WIA_SUCCESS);
  const std::uint32_t value = 7;
  REQUIRE(wia_kernel_set_arg(add, 0, &data, sizeof(data)) == WIA_SUCCESS);
  REQUIRE(wia_kernel_set_arg(add, 2, &value, sizeof(value)) == WIA_SUCCESS);
  // Argument 1 is missing: named, nothing launched.
  CHECK(wia_launch_kernel(add, k.stream[1]) == WIA_ERROR_INVALID_ARGUMENT);
  CHECK(contains(wia_get_last_error(), "argument 1 was never set"));
  REQUIRE(wia_kernel_set_arg(add, 1, &n, sizeof(n)) == WIA_SUCCESS);
  // A stream of another device cannot run it.
  CHECK(wia_launch_kernel(add, k.stream[0]) == WIA_ERROR_INVALID_ARGUMENT);
  CHECK(contains(wia_get_last_error(), "belongs to device 1"));
  REQUIRE_MESSAGE(wia_launch_kernel(add, k.stream[1]) == WIA_SUCCESS, wia_get_last_error());
  REQUIRE(wia_launch_kernel(add, k.stream[1]) == WIA_SUCCESS);  // twice: + 14
  // The module cannot go while a kernel of it lives.
  CHECK(wia_module_unload(m) == WIA_ERROR_INVALID_ARGUMENT);
  k.sync();
  const auto got = k.read(data, n);
  std::uint64_t wrong = 0;
  for (std::uint64_t i = 0; i < n; ++i) wrong += got[i] != static_cast<std::uint32_t>(i * 3 + 14);
  CHECK(wrong == 0);
  CHECK(wia_kernel_destroy(add) == WIA_SUCCESS);
  CHECK(wia_kernel_destroy(add) == WIA_ERROR_INVALID_HANDLE);
  CHECK(wia_module_unload(m) == WIA_SUCCESS);
  CHECK(wia_module_unload(m) == WIA_ERROR_INVALID_HANDLE);
}

TEST_CASE("wia_scale on cuda memory runs the provider's kernel with the host path's results") {
  Ranks ranks;
  constexpr std::size_t n = 1000;
  // float32: the product in float; int32: truncated toward zero;
  // bfloat16: small integers * 0.5, exact in bfloat16.
  std::vector<float> f(n);
  std::vector<std::int32_t> i32(n);
  std::vector<std::uint16_t> bf(n);
  for (std::size_t i = 0; i < n; ++i) {
    f[i] = static_cast<float>(i) * 0.25f - 100.0f;
    i32[i] = static_cast<std::int32_t>(i) - 500;
    bf[i] = bf16_of_small_integer(static_cast<int>(i % 200) - 100);
  }
  float* df = ranks.on_gpu(1, n, f);
  std::int32_t* di = ranks.on_gpu(1, n, i32);
  std::uint16_t* db = ranks.on_gpu(1, n, bf);
  REQUIRE_MESSAGE(wia_scale(df, 1.5, n, ranks.stream[1]) == WIA_SUCCESS, wia_get_last_error());
  REQUIRE(wia_scale_ex(di, 1.5, n, WIA_INT32, ranks.stream[1]) == WIA_SUCCESS);
  REQUIRE(wia_scale_ex(db, 0.5, n, WIA_BFLOAT16, ranks.stream[1]) == WIA_SUCCESS);
  ranks.sync();
  const auto gf = ranks.read(df, n);
  const auto gi = ranks.read(di, n);
  const auto gb = ranks.read(db, n);
  std::size_t wrong = 0;
  for (std::size_t i = 0; i < n; ++i) {
    wrong += gf[i] != f[i] * 1.5f;
    wrong += gi[i] != static_cast<std::int32_t>(std::trunc(static_cast<double>(i32[i]) * 1.5));
    wrong += bf16_to_double(gb[i]) != 0.5 * static_cast<double>(static_cast<int>(i % 200) - 100);
  }
  CHECK(wrong == 0);
  // A kernel of device 0 must not touch device 1's memory: refused, named.
  CHECK(wia_scale(df, 2.0, n, ranks.stream[0]) == WIA_ERROR_INVALID_ARGUMENT);
  CHECK(contains(wia_get_last_error(), "the memory is on device 1"));
  // A count past the allocation's end, even one that would wrap the end
  // address, is refused before anything runs.
  CHECK(wia_scale(df, 2.0, SIZE_MAX / 2, ranks.stream[1]) == WIA_ERROR_INVALID_ARGUMENT);
  ranks.sync();
  CHECK(ranks.read(df, n) == gf);
}

TEST_CASE("a rank whose group ends before its peers posted is an error, not a parked stream") {
  Ranks k;
  constexpr std::size_t n = 16;
  float* buf = k.on_gpu<float>(0, n, std::vector<float>(n, 1.0f));
  const wia_collective_config_t cfg{
      WIA_COLLECTIVE_ALLREDUCE, WIA_REDUCE_SUM, WIA_FLOAT32, WIA_ALGORITHM_AUTO, 0, 0};
  REQUIRE(wia_group_start() == WIA_SUCCESS);
  REQUIRE(wia_all_reduce(k.comm, buf, buf, n, &cfg, k.stream[0]) == WIA_SUCCESS);
  CHECK(wia_group_end() == WIA_ERROR_INVALID_ARGUMENT);
  CHECK(contains(wia_get_last_error(), "was not posted by every rank"));
  CHECK(wia_stream_synchronize(k.stream[0]) == WIA_ERROR_INVALID_ARGUMENT);
}

TEST_CASE("the caller's current CUDA context is what it was after every libwia call") {
  Ranks k;
  // The double is the library the provider opened; the test drives it too.
  void* lib = dlopen(WIA_FAKE_CUDA_FILE, RTLD_NOW | RTLD_NOLOAD);
  REQUIRE(lib != nullptr);
  auto get_proc =
      reinterpret_cast<wia_PFN_cuGetProcAddress>(dlsym(lib, WIA_CUDA_GET_PROC_ADDRESS_SYMBOL));
  REQUIRE(reinterpret_cast<void*>(get_proc) != nullptr);
  auto entry = [&](const char* name) {
    void* fn = nullptr;
    int found = 0;
    REQUIRE(get_proc(name, &fn, WIA_CUDA_API_VERSION, 0, &found) == WIA_CUDA_SUCCESS);
    return fn;
  };
  auto retain = reinterpret_cast<wia_PFN_cuDevicePrimaryCtxRetain>(entry("cuDevicePrimaryCtxRetain"));
  auto release = reinterpret_cast<wia_PFN_cuDevicePrimaryCtxRelease>(entry("cuDevicePrimaryCtxRelease"));
  auto set_current = reinterpret_cast<wia_PFN_cuCtxSetCurrent>(entry("cuCtxSetCurrent"));
  auto get_current = reinterpret_cast<wia_PFN_cuCtxGetCurrent>(entry("cuCtxGetCurrent"));
  wia_CUcontext mine = nullptr;
  REQUIRE(retain(&mine, 1) == WIA_CUDA_SUCCESS);
  REQUIRE(set_current(mine) == WIA_CUDA_SUCCESS);
  // Calls that make device 0's context current inside the provider.
  void* p = nullptr;
  REQUIRE(wia_malloc_on(0, &p, 4096) == WIA_SUCCESS);
  REQUIRE(wia_memset(p, 0, 4096) == WIA_SUCCESS);
  wia_CUcontext now = nullptr;
  REQUIRE(get_current(&now) == WIA_CUDA_SUCCESS);
  CHECK(now == mine);
  REQUIRE(wia_free(p) == WIA_SUCCESS);
  set_current(nullptr);
  release(1);
  dlclose(lib);
}

TEST_CASE("faults: each gives a clear error, nothing crashes or hangs") {
  struct Case {
    const char* scenario;
    std::vector<std::string> env;
  };
  const Case cases[] = {
      {"no_device", {"WIA_FAKE_CUDA_FAULT=no_device"}},
      {"missing_library", {"WIA_CUDA_LIBRARY=/nonexistent/libcuda.so.1"}},
      {"oom", {"WIA_FAKE_CUDA_FAULT=oom"}},
      {"stream_error", {"WIA_FAKE_CUDA_FAULT=stream_error"}},
      {"device_lost_shrink",
       {"WIA_FAKE_CUDA_DEVICES=3", "WIA_FAKE_CUDA_FAULT=device_lost", "WIA_FAKE_CUDA_LOST_DEVICE=1",
        "WIA_FAKE_CUDA_FAULT_AFTER=400"}},
  };
  for (const Case& c : cases) {
    const ChildResult r = run_scenario(c.scenario, c.env);
    INFO(c.scenario << " (status " << r.status << "): " << r.output);
    CHECK(r.status == 0);
  }
}
