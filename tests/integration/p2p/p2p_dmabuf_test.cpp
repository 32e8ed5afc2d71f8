// SPDX-License-Identifier: Apache-2.0
// GPUDirect RDMA through dma-bufs, end to end between real processes
// (docs/point-to-point.md, "Device buffers"): wia_send / wia_recv of
// device buffers of the CUDA test double (tests/providers/fake-cuda) over
// the verbs provider on the libibverbs double (tests/providers/fake-ibverbs)
// with verbs.dmabuf on. The chain under test is the core's: the cuda
// provider exports the allocation (mem_export_dmabuf), the core registers
// it once per allocation (reg_mr with the fd) and passes the registration
// to every send and receive, and wia_free releases it. The double moves
// the bytes through the dma-buf fd only, so data that arrives proves the
// registration was used.
//  - slices at three offsets of one allocation, data checked, one
//    registration per allocation and process, none left after wia_free, a
//    new registration for the next allocation, "direct" in the profile;
//  - a device that cannot export a dma-buf: staged, the reason in the log;
//  - small messages from a HOST buffer into a device buffer (eager on the
//    wire: the verbs provider writes them into device memory on its
//    loopback QP), data checked, the receive direct.
#include <dlfcn.h>
#include <doctest/doctest.h>
#include <unistd.h>
#include <wia/wia.h>

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "p2p_common.hpp"
#include "process_harness.hpp"

namespace {
using namespace wia::test::processes;
using namespace wia::test::p2p;

// The libibverbs double's counters in this process (the verbs provider
// loaded it): ibv_reg_dmabuf_mr calls, those registrations still live, and
// plain ibv_reg_mr calls (host memory: a device buffer handed over without
// its registration would be registered that way, as if it were host memory).
struct NicCounters {
  std::uint64_t (*calls)() = nullptr;
  std::int64_t (*live)() = nullptr;
  std::uint64_t (*host_calls)() = nullptr;
  bool load() {
    void* lib = dlopen(WIA_FAKE_IBVERBS_FILE, RTLD_NOW | RTLD_NOLOAD);
    if (lib == nullptr) return false;
    calls = reinterpret_cast<std::uint64_t (*)()>(dlsym(lib, "fake_ibv_reg_dmabuf_mr_calls"));
    live = reinterpret_cast<std::int64_t (*)()>(dlsym(lib, "fake_ibv_dmabuf_mrs_live"));
    host_calls = reinterpret_cast<std::uint64_t (*)()>(dlsym(lib, "fake_ibv_reg_mr_calls"));
    dlclose(lib);  // the provider keeps it loaded
    return calls != nullptr && live != nullptr && host_calls != nullptr;
  }
};

// One transfer from rank 0's device buffer to rank 1's, bytes [off,
// off + len), rank 1 checking what arrived and that nothing around moved.
int slice(int rank, void* dev, std::size_t size, std::size_t off, std::size_t len, int round) {
  auto* at = static_cast<char*>(dev) + off;
  std::vector<std::uint8_t> host(size);
  if (rank == 0) {
    for (std::size_t i = 0; i < size; ++i) host[i] = pattern(round, i);
    if (wia_memcpy(dev, host.data(), size) != WIA_SUCCESS) return fail(rank, "fill");
    if (wia_send(0, 1, at, len, nullptr) != WIA_SUCCESS) return fail(rank, "send");
  } else {
    if (wia_memset(dev, 0x5A, size) != WIA_SUCCESS) return fail(rank, "memset");
    if (wia_recv(0, 0, at, len, nullptr) != WIA_SUCCESS) return fail(rank, "recv");
  }
  if (wia_stream_synchronize(nullptr) != WIA_SUCCESS) return fail(rank, "synchronize");
  if (rank == 1) {
    if (wia_memcpy(host.data(), dev, size) != WIA_SUCCESS) return fail(rank, "read back");
    for (std::size_t i = 0; i < size; ++i) {
      const std::uint8_t want = i >= off && i < off + len ? pattern(round, i) : 0x5A;
      if (host[i] != want) {
        std::fprintf(stderr, "rank 1: slice [%zu, +%zu) round %d: byte %zu is %u, want %u\n", off,
                     len, round, i, host[i], want);
        return kWrong;
      }
    }
  }
  return kOk;
}

// Rank 0 sends [0, len) of a host buffer; rank 1 receives it into its
// device buffer at `off` and checks it, and that nothing around moved.
int host_to_device(int rank, void* dev, std::size_t size, std::size_t off, std::size_t len,
                   int round) {
  std::vector<std::uint8_t> host(size);
  if (rank == 0) {
    for (std::size_t i = 0; i < len; ++i) host[i] = pattern(round, i);
    if (wia_send(0, 1, host.data(), len, nullptr) != WIA_SUCCESS) return fail(rank, "send");
  } else {
    if (wia_memset(dev, 0x5A, size) != WIA_SUCCESS) return fail(rank, "memset");
    if (wia_recv(0, 0, static_cast<char*>(dev) + off, len, nullptr) != WIA_SUCCESS)
      return fail(rank, "recv");
  }
  if (wia_stream_synchronize(nullptr) != WIA_SUCCESS) return fail(rank, "synchronize");
  if (rank == 1) {
    if (wia_memcpy(host.data(), dev, size) != WIA_SUCCESS) return fail(rank, "read back");
    for (std::size_t i = 0; i < size; ++i) {
      const std::uint8_t want = i >= off && i < off + len ? pattern(round, i - off) : 0x5A;
      if (host[i] != want) {
        std::fprintf(stderr,
                     "rank 1: host to device [%zu, +%zu) round %d: byte %zu is %u, want %u\n", off,
                     len, round, i, host[i], want);
        return kWrong;
      }
    }
  }
  return kOk;
}

// Runs 2 ranks with stderr in <log_base>.<rank>; returns their statuses.
std::vector<int> run_logged(const std::string& log_base, const RankBody& body,
                            std::vector<std::pair<std::string, std::string>> env) {
  env.push_back({"TEST_WIA_ID", unique_id_env()});
  env.push_back({"WIA_CUDA_LIBRARY", WIA_FAKE_CUDA_FILE});
  env.push_back({"WIA_VERBS_LIBRARY", WIA_FAKE_IBVERBS_FILE});
  env.push_back({"WIA_TRANSPORT", "verbs"});
  env.push_back({"WIA_LOG_LEVEL", "info"});
  return run_ranks(2, base_yaml(), body, env, {}, 180,
                   [log_base](int rank) { RankLogs::redirect(log_base, rank); });
}

// Joins, turns GPUDirect and profiling on, finds the cuda device and the
// libibverbs double's counters (loaded by the verbs provider at init);
// nullptr after a message.
wia_communicator_t start(int rank, int n, int* gpu, NicCounters* nic) {
  wia_communicator_t comm = join_with_gpudirect(rank, n, gpu);
  if (!comm) return nullptr;
  if (!nic->load()) {
    std::fprintf(stderr, "rank %d: the libibverbs double %s is not loaded: %s\n", rank,
                 WIA_FAKE_IBVERBS_FILE, dlerror());
    return nullptr;
  }
  return comm;
}

}  // namespace

#if defined(WIA_FAKE_CUDA_FILE) && defined(WIA_FAKE_IBVERBS_FILE)
TEST_CASE(
    "device buffers reach the NIC through a dma-buf registration: data checked, one "
    "registration per allocation, released by wia_free") {
  const RankLogs logs;
  const auto st = run_logged(
      logs.base,
      [](int rank, int n) {
        int gpu = -1;
        NicCounters nic;
        wia_communicator_t comm = start(rank, n, &gpu, &nic);
        if (!comm) return kApiError;
        const std::uint64_t calls0 = nic.calls(), host_calls0 = nic.host_calls();
        const std::size_t size = (1u << 20) + 8192;
        void* dev = nullptr;
        if (wia_malloc_on(gpu, &dev, size) != WIA_SUCCESS) return fail(rank, "malloc_on");
        // Three slices of one allocation: one registration serves them all.
        const std::size_t slices[][2] = {{0, 100}, {4096, 65536}, {0, size}};
        int round = 0;
        for (const auto& s : slices)
          if (const int rc = slice(rank, dev, size, s[0], s[1], round++); rc != kOk) return rc;
        if (nic.calls() - calls0 != 1 || nic.live() != 1 || nic.host_calls() != host_calls0) {
          std::fprintf(stderr,
                       "rank %d: %llu dma-buf registrations made, %lld live, %llu host "
                       "registrations; want 1, 1, 0\n",
                       rank, static_cast<unsigned long long>(nic.calls() - calls0),
                       static_cast<long long>(nic.live()),
                       static_cast<unsigned long long>(nic.host_calls() - host_calls0));
          return kWrong;
        }
        if (wia_free(dev) != WIA_SUCCESS) return fail(rank, "free");
        if (nic.live() != 0) {
          std::fprintf(stderr, "rank %d: %lld dma-buf registrations live after wia_free\n", rank,
                       static_cast<long long>(nic.live()));
          return kWrong;
        }
        // A new allocation (perhaps at the same address) gets its own.
        if (wia_malloc_on(gpu, &dev, size) != WIA_SUCCESS) return fail(rank, "malloc_on again");
        if (const int rc = slice(rank, dev, size, 0, size, round++); rc != kOk) return rc;
        if (nic.calls() - calls0 != 2 || nic.live() != 1) {
          std::fprintf(stderr, "rank %d: second allocation: %llu registrations, %lld live\n", rank,
                       static_cast<unsigned long long>(nic.calls() - calls0),
                       static_cast<long long>(nic.live()));
          return kWrong;
        }
        wia_free(dev);
        wia_comm_profile_report_t* r = wia_get_comm_profile(comm);
        const wia_collective_profile_t* e = entry(r, rank == 0 ? "send_direct" : "recv_direct");
        const bool counted = e && e->invocation_count == 4 && std::string(e->algorithm) == "direct";
        wia_free_comm_profile(r);
        if (!counted) {
          std::fprintf(stderr, "rank %d: no 4 direct transfers in the profile\n", rank);
          return kWrong;
        }
        return wia_destroy_communicator(comm) == WIA_SUCCESS ? kOk : fail(rank, "destroy");
      },
      {});
  for (int rank : {0, 1}) {
    const std::string log = logs.of(rank);
    INFO(log);
    CHECK(log.find("device memory straight to the transport") != std::string::npos);
    CHECK(log.find("through a dma-buf") != std::string::npos);
  }
  check_all(st);
}

TEST_CASE(
    "small messages from a host buffer land in a device buffer (the NIC writes them in): data "
    "checked, the receive direct") {
  const RankLogs logs;
  const auto st = run_logged(
      logs.base,
      [](int rank, int n) {
        int gpu = -1;
        NicCounters nic;
        wia_communicator_t comm = start(rank, n, &gpu, &nic);
        if (!comm) return kApiError;
        const std::uint64_t calls0 = nic.calls();
        const std::size_t size = 16384;
        void* dev = nullptr;
        if (wia_malloc_on(gpu, &dev, size) != WIA_SUCCESS) return fail(rank, "malloc_on");
        // Both below the verbs eager limit (8 KiB - 48 B): they arrive in host
        // slots; 4 KiB at an odd offset inside the allocation.
        const std::size_t cases[][2] = {{0, 100}, {1001, 4096}};
        int round = 20;
        for (const auto& c : cases)
          if (const int rc = host_to_device(rank, dev, size, c[0], c[1], round++); rc != kOk)
            return rc;
        // Rank 1 received into its allocation's dma-buf registration (not staged).
        if (rank == 1 && nic.calls() - calls0 != 1) {
          std::fprintf(stderr, "rank 1: %llu dma-buf registrations, want 1\n",
                       static_cast<unsigned long long>(nic.calls() - calls0));
          return kWrong;
        }
        wia_free(dev);
        if (rank == 1) {
          wia_comm_profile_report_t* r = wia_get_comm_profile(comm);
          const wia_collective_profile_t* e = entry(r, "recv_direct");
          const bool direct = e && e->invocation_count == 2;
          wia_free_comm_profile(r);
          if (!direct) {
            std::fprintf(stderr, "rank 1: no 2 direct receives in the profile\n");
            return kWrong;
          }
        }
        return wia_destroy_communicator(comm) == WIA_SUCCESS ? kOk : fail(rank, "destroy");
      },
      {});
  INFO(logs.of(0));
  INFO(logs.of(1));
  check_all(st);
}

TEST_CASE("a device that cannot export a dma-buf is staged through host memory, saying why") {
  const RankLogs logs;
  const auto st = run_logged(
      logs.base,
      [](int rank, int n) {
        int gpu = -1;
        NicCounters nic;
        wia_communicator_t comm = start(rank, n, &gpu, &nic);
        if (!comm) return kApiError;
        const std::uint64_t calls0 = nic.calls();
        const std::size_t size = 300000;
        void* dev = nullptr;
        if (wia_malloc_on(gpu, &dev, size) != WIA_SUCCESS) return fail(rank, "malloc_on");
        if (const int rc = slice(rank, dev, size, 1000, 200000, 7); rc != kOk) return rc;
        wia_free(dev);
        if (nic.calls() != calls0) {
          std::fprintf(stderr, "rank %d: a dma-buf registration was made\n", rank);
          return kWrong;
        }
        wia_comm_profile_report_t* r = wia_get_comm_profile(comm);
        const bool staged = entry(r, rank == 0 ? "send_staged" : "recv_staged") != nullptr;
        wia_free_comm_profile(r);
        if (!staged) return kWrong;
        return wia_destroy_communicator(comm) == WIA_SUCCESS ? kOk : fail(rank, "destroy");
      },
      {{"WIA_FAKE_CUDA_FAULT", "no_dmabuf"}});
  for (int rank : {0, 1}) {
    const std::string log = logs.of(rank);
    INFO(log);
    CHECK(log.find("device memory staged through pinned host memory") != std::string::npos);
    CHECK(log.find("DMA_BUF_SUPPORTED is 0") != std::string::npos);
  }
  check_all(st);
}
#endif
