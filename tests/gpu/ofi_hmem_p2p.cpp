// SPDX-License-Identifier: Apache-2.0
// The ofi provider's device-memory path (FI_HMEM) on a real GPU and a real
// libfabric that claims it: two processes, wia_send / wia_recv of cuda
// device buffers over ofi (forced by the YAML given), device to device,
// host to device and device to host at an eager and a large size at
// unaligned offsets; every byte checked, and the profile must show the
// transfers "direct" and nothing staged. Built and carried by
// tests/gpu/bundle.sh, run by tests/gpu/ofi_hmem.sh; the same program runs
// on the CUDA and libfabric test doubles (WIA_CUDA_LIBRARY, ofi.library).
//
//   wia-ofi-hmem-p2p CONFIG.yaml
// Exit status: 0 passed, 1 failed (the reason on stderr), 3 the data
// arrived but every device transfer was staged (a fabric that claims
// FI_HMEM yet refuses this device's registration, as Debian's shm does
// for CUDA: the log at WIA_LOG_LEVEL=info says why).
#include <sys/wait.h>
#include <unistd.h>
#include <wia/wia.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

namespace {

constexpr std::size_t kSize = (4u << 20) + 8192;

int fail(int rank, const char* what) {
  std::fprintf(stderr, "rank %d: %s: %s\n", rank, what, wia_get_last_error());
  return 1;
}

std::uint8_t pattern(int round, std::size_t i) {
  std::uint64_t x = i * 2654435761u ^ static_cast<std::uint64_t>(round) * 0x9E3779B97F4A7C15ull;
  x ^= x >> 29;
  return static_cast<std::uint8_t>(x * 0xBF58476D1CE4E5B9ull >> 56);
}

int device_of(const char* provider) {
  int n = 0;
  wia_get_device_count(&n);
  for (int d = 0; d < n; ++d) {
    wia_device_properties_t p;
    if (wia_get_device_properties(d, &p) == WIA_SUCCESS && std::string(p.provider) == provider)
      return d;
  }
  return -1;
}

// Rank 0 publishes the unique id in `path`; rank 1 waits for it (30 s).
bool exchange_id(int rank, const std::string& path, wia_unique_id_t* id) {
  if (rank == 0) {
    if (wia_get_unique_id(id) != WIA_SUCCESS) return false;
    const std::string tmp = path + ".tmp";
    FILE* f = std::fopen(tmp.c_str(), "wb");
    if (f == nullptr || std::fwrite(id, sizeof(*id), 1, f) != 1) return false;
    std::fclose(f);
    return std::rename(tmp.c_str(), path.c_str()) == 0;
  }
  for (int i = 0; i < 3000; ++i) {
    if (FILE* f = std::fopen(path.c_str(), "rb")) {
      const bool ok = std::fread(id, sizeof(*id), 1, f) == 1;
      std::fclose(f);
      if (ok) return true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

struct Transfer {
  bool from_device, to_device;
  std::size_t send_off, recv_off, len;
  const char* what;
};

int rank_main(int rank, const std::string& id_path) {
  const int gpu = device_of("cuda");
  const int host = device_of("host");
  if (gpu < 0 || host < 0 || wia_set_device(host) != WIA_SUCCESS) {
    std::fprintf(stderr, "rank %d: no cuda device (%d) or host device (%d)\n", rank, gpu, host);
    return 1;
  }
  wia_unique_id_t id;
  if (!exchange_id(rank, id_path, &id)) return fail(rank, "unique id");
  wia_communicator_t comm = nullptr;
  if (wia_create_communicator_from_id(&id, 2, rank, &comm) != WIA_SUCCESS)
    return fail(rank, "communicator");
  wia_distributed_config_t dist = {};
  wia_gpudirect_config_t g = {.enable_rdma = true,
                              .enable_async_copy = false,
                              .max_inline_size = 0,
                              .use_write_semantics = true};
  wia_comm_profiling_t prof = {.enable_bandwidth_tracking = true,
                               .enable_latency_tracking = false,
                               .enable_overlap_analysis = false};
  if (wia_enable_gpudirect_rdma(&dist, &g) != WIA_SUCCESS ||
      wia_enable_comm_profiling(comm, &prof) != WIA_SUCCESS)
    return fail(rank, "gpudirect or profiling");
  void* dev = nullptr;
  if (wia_malloc_on(gpu, &dev, kSize) != WIA_SUCCESS) return fail(rank, "wia_malloc_on");
  const Transfer transfers[] = {
      {true, true, 3, 5, 100, "device to device, eager"},
      {true, true, 4097, 13, 4u << 20, "device to device, large"},
      {false, true, 0, 1001, 3000, "host to device, eager"},
      {false, true, 0, 7, 1u << 20, "host to device, large"},
      {true, false, 9, 0, 64, "device to host, eager"},
      {true, false, 65535, 0, (2u << 20) + 1, "device to host, large"},
  };
  int sends = 0, recvs = 0, round = 0;
  std::vector<std::uint8_t> buf(kSize);
  for (const Transfer& t : transfers) {
    ++round;
    if (rank == 0) {
      for (std::size_t i = 0; i < kSize; ++i) buf[i] = pattern(round, i);
      const std::uint8_t* from = buf.data() + t.send_off;
      if (t.from_device) {
        if (wia_memcpy(dev, buf.data(), kSize) != WIA_SUCCESS) return fail(rank, "fill");
        from = static_cast<const std::uint8_t*>(dev) + t.send_off;
        ++sends;
      }
      if (wia_send(0, 1, from, t.len, nullptr) != WIA_SUCCESS) return fail(rank, t.what);
    } else {
      std::uint8_t* into = buf.data() + t.recv_off;
      if (t.to_device) {
        if (wia_memset(dev, 0x5A, kSize) != WIA_SUCCESS) return fail(rank, "memset");
        into = static_cast<std::uint8_t*>(dev) + t.recv_off;
        ++recvs;
      } else {
        std::fill(buf.begin(), buf.end(), std::uint8_t{0x5A});
      }
      if (wia_recv(0, 0, into, t.len, nullptr) != WIA_SUCCESS) return fail(rank, t.what);
    }
    if (wia_stream_synchronize(nullptr) != WIA_SUCCESS) return fail(rank, t.what);
    if (rank == 1) {
      if (t.to_device && wia_memcpy(buf.data(), dev, kSize) != WIA_SUCCESS)
        return fail(rank, "read back");
      for (std::size_t i = 0; i < kSize; ++i) {
        const bool in = i >= t.recv_off && i < t.recv_off + t.len;
        const std::uint8_t want = in ? pattern(round, i - t.recv_off + t.send_off) : 0x5A;
        if (buf[i] != want) {
          std::fprintf(stderr, "rank 1: %s: byte %zu is %u, want %u\n", t.what, i, buf[i], want);
          return 1;
        }
      }
    }
  }
  wia_free(dev);
  wia_comm_profile_report_t* r = wia_get_comm_profile(comm);
  const char* direct_name = rank == 0 ? "send_direct" : "recv_direct";
  int direct = 0;
  bool staged = false;
  for (int i = 0; r != nullptr && i < r->num_collectives; ++i) {
    const std::string name = r->collectives[i].name;
    if (name == direct_name) direct = static_cast<int>(r->collectives[i].invocation_count);
    if (name == "send_staged" || name == "recv_staged") staged = true;
  }
  wia_free_comm_profile(r);
  const int want = rank == 0 ? sends : recvs;
  if (direct == 0 && staged) {
    wia_destroy_communicator(comm);
    std::fprintf(stderr, "rank %d: every device transfer was staged, data checked\n", rank);
    return 3;
  }
  if (direct != want || staged) {
    std::fprintf(stderr,
                 "rank %d: %d of %d device transfers went direct%s (the log at "
                 "WIA_LOG_LEVEL=info says why)\n",
                 rank, direct, want, staged ? ", some were staged" : "");
    return 1;
  }
  if (wia_destroy_communicator(comm) != WIA_SUCCESS) return fail(rank, "destroy");
  std::fprintf(stderr, "rank %d: %d device transfers direct over ofi, data checked\n", rank, want);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s CONFIG.yaml\n", argv[0]);
    return 2;
  }
  char tmpl[] = "/tmp/wia-ofi-hmem-id-XXXXXX";
  const int fd = mkstemp(tmpl);
  if (fd < 0) return 1;
  close(fd);
  std::remove(tmpl);
  const std::string id_path = tmpl;
  pid_t pids[2];
  for (int rank = 0; rank < 2; ++rank) {
    pids[rank] = fork();
    if (pids[rank] == 0) {
      if (wia_init_with_config(argv[1]) != WIA_SUCCESS) {
        std::fprintf(stderr, "rank %d: init: %s\n", rank, wia_get_last_error());
        _exit(1);
      }
      const int rc = rank_main(rank, id_path);
      wia_finalize();
      _exit(rc);
    }
  }
  int failed = 0, staged = 0;
  for (pid_t pid : pids) {
    int st = 0;
    waitpid(pid, &st, 0);
    if (WIFEXITED(st) && WEXITSTATUS(st) == 3)
      ++staged;
    else if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
      ++failed;
  }
  std::remove(id_path.c_str());
  const int rc = failed > 0 ? 1 : staged > 0 ? 3 : 0;
  std::printf("ofi FI_HMEM p2p: %s\n", rc == 0 ? "PASSED" : rc == 3 ? "STAGED" : "FAILED");
  return rc;
}
