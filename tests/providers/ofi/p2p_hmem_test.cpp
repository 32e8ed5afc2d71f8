// SPDX-License-Identifier: Apache-2.0
// Device memory over the ofi provider (FI_HMEM), end to end between two
// real processes: wia_send / wia_recv of device buffers of the CUDA double
// (tests/providers/fake-cuda) over libfabric's real tcp;ofi_rxm, loaded
// through the double that claims FI_HMEM on top of it
// (tests/providers/fake-hmem-fabric). The chain under test: the fabric
// claims FI_HMEM, the provider claims device memory, the core registers
// each allocation once (reg_mr naming FI_HMEM_CUDA and the device), and
// every transfer touching device memory goes to the fabric with that
// registration's descriptor; the CPU never copies into or out of it.
//  - device to device, host to device, device to host, at eager and large
//    sizes and unaligned offsets: data checked byte for byte (and that
//    nothing around a slice moved), "direct" in the profile and nothing
//    staged, one FI_HMEM_CUDA registration per allocation and process
//    (none left after wia_free), every device send and receive posted on
//    the device memory with its descriptor, no transfer touching it
//    without one (the double's counters);
//  - the same in the provider's rendezvous mode (framed messages and
//    clear-to-send, as on shm), where small device sends are announced;
//  - the real libfabric without the double: tcp;ofi_rxm does not claim
//    FI_HMEM, so a device transfer is staged and the logs say why; shm is
//    not asked for it unless ofi.hmem is on (it costs shm its single-copy
//    path), and then claims it but refuses every device registration
//    (-FI_ENOSYS: Debian builds it without CUDA), which the provider turns
//    into WIA_ERROR_NOT_SUPPORTED, so the core stages, naming that refusal.
#include <dlfcn.h>
#include <doctest/doctest.h>
#include <unistd.h>
#include <wia/wia.h>

#include <cstdint>
#include <cstdlib>
#include <cstdio>
#include <string>
#include <vector>

#include "p2p_common.hpp"
#include "process_harness.hpp"

namespace {
using namespace wia::test::processes;
using namespace wia::test::p2p;

// The fabric double's counters in this process (the ofi provider loaded it).
struct FabricCounters {
  std::uint64_t (*regs)(int) = nullptr;
  std::int64_t (*live)(int) = nullptr;
  std::uint64_t (*transfers)(int) = nullptr;
  std::uint64_t (*bytes)() = nullptr;
  std::uint64_t (*violations)() = nullptr;
  bool load() {
    void* lib = dlopen(WIA_FAKE_HMEM_FABRIC_FILE, RTLD_NOW | RTLD_NOLOAD);
    if (lib == nullptr) return false;
    regs = reinterpret_cast<std::uint64_t (*)(int)>(dlsym(lib, "fake_hmem_fabric_regs"));
    live = reinterpret_cast<std::int64_t (*)(int)>(dlsym(lib, "fake_hmem_fabric_live"));
    transfers =
        reinterpret_cast<std::uint64_t (*)(int)>(dlsym(lib, "fake_hmem_fabric_device_transfers"));
    bytes = reinterpret_cast<std::uint64_t (*)()>(dlsym(lib, "fake_hmem_fabric_device_bytes"));
    violations = reinterpret_cast<std::uint64_t (*)()>(dlsym(lib, "fake_hmem_fabric_violations"));
    dlclose(lib);  // the provider keeps it loaded
    return regs && live && transfers && bytes && violations;
  }
};
constexpr int kCuda = 1;  // FI_HMEM_CUDA

enum class Kind { dev_to_dev, host_to_dev, dev_to_host };

struct Transfer {
  Kind kind;
  std::size_t send_off;  // into the sender's buffer
  std::size_t recv_off;  // into the receiver's buffer
  std::size_t len;
};

// Eager (direct, at most 4 KiB; 64 B fits tcp;ofi_rxm's inject size) and
// announced sizes, at offsets that are not aligned.
const Transfer kTransfers[] = {
    {Kind::dev_to_dev, 0, 0, 1},           {Kind::dev_to_dev, 3, 5, 60},
    {Kind::dev_to_dev, 1001, 77, 3000},    {Kind::dev_to_dev, 4096, 1, 4096},
    {Kind::dev_to_dev, 13, 4099, 4097},    {Kind::dev_to_dev, 7, 9, 300001},
    {Kind::dev_to_dev, 0, 0, 1u << 20},    {Kind::host_to_dev, 0, 1001, 100},
    {Kind::host_to_dev, 0, 3, 4096},       {Kind::host_to_dev, 0, 4097, 200003},
    {Kind::dev_to_host, 9, 0, 7},          {Kind::dev_to_host, 501, 0, 4000},
    {Kind::dev_to_host, 65535, 0, 250001},
};
constexpr std::size_t kSize = (1u << 20) + 8192;  // each rank's device allocation

// One transfer from rank 0 to rank 1; rank 1 checks every byte of its
// buffer: the slice, and that nothing around it moved.
int run_transfer(int rank, void* dev, const Transfer& t, int round) {
  const bool sender_dev = t.kind != Kind::host_to_dev;
  const bool receiver_dev = t.kind != Kind::dev_to_host;
  std::vector<std::uint8_t> host(kSize);
  if (rank == 0) {
    for (std::size_t i = 0; i < kSize; ++i) host[i] = pattern(round, i);
    const std::uint8_t* from = host.data() + t.send_off;
    if (sender_dev) {
      if (wia_memcpy(dev, host.data(), kSize) != WIA_SUCCESS) return fail(rank, "fill");
      from = static_cast<const std::uint8_t*>(dev) + t.send_off;
    }
    if (wia_send(0, 1, from, t.len, nullptr) != WIA_SUCCESS) return fail(rank, "send");
  } else {
    std::uint8_t* into = host.data() + t.recv_off;
    if (receiver_dev) {
      if (wia_memset(dev, 0x5A, kSize) != WIA_SUCCESS) return fail(rank, "memset");
      into = static_cast<std::uint8_t*>(dev) + t.recv_off;
    } else {
      std::fill(host.begin(), host.end(), 0x5A);
    }
    if (wia_recv(0, 0, into, t.len, nullptr) != WIA_SUCCESS) return fail(rank, "recv");
  }
  if (wia_stream_synchronize(nullptr) != WIA_SUCCESS) return fail(rank, "synchronize");
  if (rank == 1) {
    if (receiver_dev && wia_memcpy(host.data(), dev, kSize) != WIA_SUCCESS)
      return fail(rank, "read back");
    for (std::size_t i = 0; i < kSize; ++i) {
      const bool in = i >= t.recv_off && i < t.recv_off + t.len;
      const std::uint8_t want = in ? pattern(round, i - t.recv_off + t.send_off) : 0x5A;
      if (host[i] != want) {
        std::fprintf(stderr,
                     "rank 1: transfer %d (%s, %zu B from +%zu to +%zu): byte %zu is %u, want "
                     "%u\n",
                     round,
                     t.kind == Kind::dev_to_dev    ? "device to device"
                     : t.kind == Kind::host_to_dev ? "host to device"
                                                   : "device to host",
                     t.len, t.send_off, t.recv_off, i, host[i], want);
        return kWrong;
      }
    }
  }
  return kOk;
}

std::string ofi_yaml(const char* library, const char* fabric = "tcp;ofi_rxm") {
  std::string y = base_yaml() +
                  "selector:\n  transport: ofi\n"
                  "ofi:\n  provider: \"" +
                  fabric + "\"\n  inter_node: all\n";
  if (library != nullptr) y += "  library: \"" + std::string(library) + "\"\n";
  return y;
}

// Runs 2 ranks with stderr in <log_base>.<rank>; returns their statuses.
std::vector<int> run_logged(const std::string& log_base, const std::string& yaml,
                            const RankBody& body,
                            std::vector<std::pair<std::string, std::string>> env) {
  env.push_back({"TEST_WIA_ID", unique_id_env()});
  env.push_back({"WIA_CUDA_LIBRARY", WIA_FAKE_CUDA_FILE});
  env.push_back({"WIA_LOG_LEVEL", "info"});
  return run_ranks(2, yaml, body, env, {}, 240,
                   [log_base](int rank) { RankLogs::redirect(log_base, rank); });
}

// Every transfer of kTransfers through the double, then the counters and
// the profile.
int device_transfers_body(int rank, int n) {
  int gpu = -1;
  wia_communicator_t comm = join_with_gpudirect(rank, n, &gpu);
  if (!comm) return kApiError;
  // TEST_LAST_CUDA_DEVICE: the last device of the cuda provider (with
  // logical devices, a slot of a GPU whose ordinal is not its index).
  if (std::getenv("TEST_LAST_CUDA_DEVICE") != nullptr) {
    const int first = gpu;
    int count = 0;
    wia_get_device_count(&count);
    for (int d = gpu + 1; d < count; ++d) {
      wia_device_properties_t p;
      if (wia_get_device_properties(d, &p) == WIA_SUCCESS && std::string(p.provider) == "cuda")
        gpu = d;
    }
    if (gpu == first) {  // the case would test the first slot only
      std::fprintf(stderr, "rank %d: only one cuda device (%d): no second logical slot\n", rank,
                   gpu);
      return kWrong;
    }
  }
  FabricCounters fab;
  if (!fab.load()) {
    std::fprintf(stderr, "rank %d: the fabric double %s is not loaded: %s\n", rank,
                 WIA_FAKE_HMEM_FABRIC_FILE, dlerror());
    return kApiError;
  }
  const std::uint64_t regs0 = fab.regs(kCuda), sends0 = fab.transfers(1), recvs0 = fab.transfers(0),
                      bytes0 = fab.bytes();
  void* dev = nullptr;
  if (wia_malloc_on(gpu, &dev, kSize) != WIA_SUCCESS) return fail(rank, "malloc_on");
  std::uint64_t dev_sends = 0, dev_recvs = 0, dev_bytes = 0;
  int round = 0;
  for (const Transfer& t : kTransfers) {
    if (const int rc = run_transfer(rank, dev, t, round++); rc != kOk) return rc;
    if (t.kind != Kind::host_to_dev) ++dev_sends, dev_bytes += rank == 0 ? t.len : 0;
    if (t.kind != Kind::dev_to_host) ++dev_recvs, dev_bytes += rank == 1 ? t.len : 0;
  }
  // Rank 0 sent from its device allocation, rank 1 received into its own:
  // each posted that many transfers on it, with the descriptor.
  const std::uint64_t want_sends = rank == 0 ? dev_sends : 0;
  const std::uint64_t want_recvs = rank == 1 ? dev_recvs : 0;
  const std::uint64_t regs = fab.regs(kCuda) - regs0, sends = fab.transfers(1) - sends0,
                      recvs = fab.transfers(0) - recvs0, bytes = fab.bytes() - bytes0;
  const std::int64_t live = fab.live(kCuda);
  if (regs != 1 || live != 1 || sends < want_sends || recvs < want_recvs || bytes < dev_bytes ||
      fab.violations() != 0) {
    std::fprintf(
        stderr,
        "rank %d: FI_HMEM_CUDA registrations %llu (live %lld), device sends %llu, "
        "receives %llu, bytes %llu, violations %llu; want 1 (1), >= %llu, >= %llu, "
        ">= %llu, 0\n",
        rank, static_cast<unsigned long long>(regs), static_cast<long long>(live),
        static_cast<unsigned long long>(sends), static_cast<unsigned long long>(recvs),
        static_cast<unsigned long long>(bytes), static_cast<unsigned long long>(fab.violations()),
        static_cast<unsigned long long>(want_sends), static_cast<unsigned long long>(want_recvs),
        static_cast<unsigned long long>(dev_bytes));
    return kWrong;
  }
  if (wia_free(dev) != WIA_SUCCESS) return fail(rank, "free");
  if (fab.live(kCuda) != 0) {
    std::fprintf(stderr, "rank %d: %lld FI_HMEM_CUDA registrations live after wia_free\n", rank,
                 static_cast<long long>(fab.live(kCuda)));
    return kWrong;
  }
  // Every device transfer went direct; nothing was staged.
  wia_comm_profile_report_t* r = wia_get_comm_profile(comm);
  const wia_collective_profile_t* direct = entry(r, rank == 0 ? "send_direct" : "recv_direct");
  const bool staged = entry(r, "send_staged") != nullptr || entry(r, "recv_staged") != nullptr;
  const std::uint64_t want = rank == 0 ? dev_sends : dev_recvs;
  const bool counted = direct && static_cast<std::uint64_t>(direct->invocation_count) == want &&
                       std::string(direct->algorithm) == "direct";
  wia_free_comm_profile(r);
  if (!counted || staged) {
    std::fprintf(stderr, "rank %d: profile: %s %llu direct transfers, %s\n", rank,
                 counted ? "" : "not", static_cast<unsigned long long>(want),
                 staged ? "some staged" : "none staged");
    return kWrong;
  }
  return wia_destroy_communicator(comm) == WIA_SUCCESS ? kOk : fail(rank, "destroy");
}

void check_direct_logs(const RankLogs& logs) {
  for (int rank : {0, 1}) {
    const std::string log = logs.of(rank);
    INFO(log);
    CHECK(log.find("device memory straight to the transport") != std::string::npos);
    CHECK(log.find("FI_HMEM (device memory registered with its interface)") != std::string::npos);
    CHECK(log.find("VIOLATION") == std::string::npos);
  }
}

}  // namespace

#if defined(WIA_FAKE_CUDA_FILE) && defined(WIA_FAKE_HMEM_FABRIC_FILE)
TEST_CASE(
    "ofi with FI_HMEM: device buffers to and from device and host memory, eager and large, "
    "posted on device memory with their registration, one per allocation") {
  const RankLogs logs;
  const auto st =
      run_logged(logs.base, ofi_yaml(WIA_FAKE_HMEM_FABRIC_FILE), device_transfers_body, {});
  check_direct_logs(logs);
  check_all(st);
}

TEST_CASE("ofi with FI_HMEM in rendezvous mode: small device sends are announced, not framed") {
  const RankLogs logs;
  const auto st = run_logged(logs.base, ofi_yaml(WIA_FAKE_HMEM_FABRIC_FILE), device_transfers_body,
                             {{"WIA_OFI_RENDEZVOUS", "on"}});
  check_direct_logs(logs);
  check_all(st);
}

TEST_CASE(
    "ofi with FI_HMEM and a device that cannot export a dma-buf: still direct (registered by "
    "address)") {
  // libfabric reaches device memory through its own driver calls: the
  // core registers the allocation by address, no dma-buf is needed.
  const RankLogs logs;
  const auto st = run_logged(logs.base, ofi_yaml(WIA_FAKE_HMEM_FABRIC_FILE), device_transfers_body,
                             {{"WIA_FAKE_CUDA_FAULT", "no_dmabuf"}});
  check_direct_logs(logs);
  check_all(st);
}

TEST_CASE(
    "ofi with FI_HMEM and a GPU split into logical devices: the registration names the GPU's "
    "ordinal, not the device's index") {
  // One GPU of the double as two devices (cuda.logical_devices_per_gpu):
  // device 1 is GPU 0's second slot. The double refuses a registration
  // whose device.cuda is not the GPU owning the memory, as the CUDA driver
  // under a real fabric would (or would pick another GPU's context).
  const RankLogs logs;
  const auto st = run_logged(logs.base, ofi_yaml(WIA_FAKE_HMEM_FABRIC_FILE), device_transfers_body,
                             {{"WIA_FAKE_CUDA_DEVICES", "1"},
                              {"WIA_CUDA_LOGICAL_DEVICES_PER_GPU", "2"},
                              {"TEST_LAST_CUDA_DEVICE", "1"}});
  check_direct_logs(logs);
  check_all(st);
}

// One staged device-to-device transfer on the real libfabric.
static int staged_body(int rank, int n) {
  int gpu = -1;
  wia_communicator_t comm = join_with_gpudirect(rank, n, &gpu);
  if (!comm) return kApiError;
  void* dev = nullptr;
  if (wia_malloc_on(gpu, &dev, kSize) != WIA_SUCCESS) return fail(rank, "malloc_on");
  if (const int rc = run_transfer(rank, dev, {Kind::dev_to_dev, 5, 7, 200001}, 50); rc != kOk)
    return rc;
  wia_free(dev);
  wia_comm_profile_report_t* r = wia_get_comm_profile(comm);
  const bool staged = entry(r, rank == 0 ? "send_staged" : "recv_staged") != nullptr;
  const bool direct = entry(r, rank == 0 ? "send_direct" : "recv_direct") != nullptr;
  wia_free_comm_profile(r);
  if (!staged || direct) {
    std::fprintf(stderr, "rank %d: not staged\n", rank);
    return kWrong;
  }
  return wia_destroy_communicator(comm) == WIA_SUCCESS ? kOk : fail(rank, "destroy");
}

TEST_CASE(
    "ofi on the real libfabric's tcp;ofi_rxm (no FI_HMEM): device buffers are staged, saying why") {
  const RankLogs logs;
  const auto st = run_logged(logs.base, ofi_yaml(nullptr), staged_body, {});
  for (int rank : {0, 1}) {
    const std::string log = logs.of(rank);
    INFO(log);
    CHECK(log.find("device memory staged through pinned host memory") != std::string::npos);
    CHECK(log.find("does not take device memory of this kind") != std::string::npos);
    CHECK(log.find("no FI_HMEM (device memory is staged through host memory)") !=
          std::string::npos);
  }
  check_all(st);
}

TEST_CASE(
    "ofi on the real libfabric's shm: FI_HMEM not asked for by default (it would cost shm its "
    "single-copy path), device buffers staged") {
  const RankLogs logs;
  const auto st = run_logged(logs.base, ofi_yaml(nullptr, "shm"), staged_body, {});
  for (int rank : {0, 1}) {
    const std::string log = logs.of(rank);
    INFO(log);
    CHECK(log.find("device memory staged through pinned host memory") != std::string::npos);
    CHECK(log.find("FI_HMEM not asked for (it would turn off shm's single-copy path") !=
          std::string::npos);
    CHECK(log.find("FI_HMEM (device memory registered") == std::string::npos);
  }
  check_all(st);
}

TEST_CASE(
    "ofi on the real libfabric's shm with ofi.hmem: on (FI_HMEM claimed, CUDA refused): device "
    "buffers are staged, naming the refusal") {
  const RankLogs logs;
  const auto st =
      run_logged(logs.base, ofi_yaml(nullptr, "shm"), staged_body, {{"WIA_OFI_HMEM", "on"}});
  for (int rank : {0, 1}) {
    const std::string log = logs.of(rank);
    INFO(log);
    CHECK(log.find("device memory staged through pinned host memory") != std::string::npos);
    CHECK(log.find("FI_HMEM_CUDA") != std::string::npos);
    CHECK(log.find("libfabric was built without this memory interface") != std::string::npos);
  }
  check_all(st);
}
#endif
