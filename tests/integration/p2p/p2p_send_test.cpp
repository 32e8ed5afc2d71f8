// SPDX-License-Identifier: Apache-2.0
// Spec 6.10.1 wia_send / wia_recv with real processes (docs/point-to-point.md):
//  - host buffers between 2, 3 and 4 ranks, 8 B to 4 MiB, over shm and tcp,
//    on one node and on two faked nodes whose ranks interleave (so (node,
//    device) is not rank / devices_per_node), every byte checked against a
//    pattern the receiver computes on its own;
//  - tags (_ex): messages of two tags and two messages of one tag land
//    where their tags and order say;
//  - the seed's 6.10 communicator (WIA_NET_RDMA) and 6.10.1 snippet, then a
//    transfer, and the profiling report's entries;
//  - device buffers of the CUDA test double staged through pinned host
//    memory, with the path in the log and the profile;
//  - bad input and faults: unknown (node, device), NULL buffer, negative
//    tag, no communicator, mismatched sizes (both sides name both sizes),
//    a peer killed mid-receive (an error within the timeout).
#include <arpa/inet.h>
#include <doctest/doctest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>
#include <wia/wia.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "p2p_common.hpp"
#include "process_harness.hpp"

namespace {
using namespace wia::test::processes;
using namespace wia::test::p2p;

// Byte i of the message from `src` to `dst` with `tag` and `size`: every
// message differs, so a message delivered to the wrong receive fails.
std::uint8_t pattern(int src, int dst, int tag, std::size_t size, std::size_t i) {
  std::uint64_t x = static_cast<std::uint64_t>(src) * 1000003u ^
                    static_cast<std::uint64_t>(dst) * 7919u ^
                    (static_cast<std::uint64_t>(tag) << 20) ^ size * 31u ^ i * 2654435761u;
  x ^= x >> 13;
  x *= 0x9E3779B97F4A7C15ull;
  x ^= x >> 29;
  return static_cast<std::uint8_t>(x);
}

void fill(std::vector<std::uint8_t>& b, int src, int dst, int tag) {
  for (std::size_t i = 0; i < b.size(); ++i) b[i] = pattern(src, dst, tag, b.size(), i);
}

// The first wrong byte, or -1.
long first_wrong(const std::vector<std::uint8_t>& b, int src, int dst, int tag) {
  for (std::size_t i = 0; i < b.size(); ++i)
    if (b[i] != pattern(src, dst, tag, b.size(), i)) return static_cast<long>(i);
  return -1;
}

const std::size_t kSizes[] = {8, 1000, 65539, 4u << 20};

// Where rank p lives, computed from the launch, not asked of the library.
struct Where {
  int node, device;
};
Where where(int p, bool two_hosts) {
  if (!two_hosts) return {0, p};
  return {p % 2, p / 2};  // even ranks on hostA, odd on hostB
}

// A ring: every rank sends to the next and receives from the previous,
// even ranks sending first and odd ranks receiving first.
int ring(int rank, int n, bool two_hosts) {
  if (two_hosts) setenv("WIA_HOSTID", rank % 2 ? "hostB" : "hostA", 1);
  wia_communicator_t comm = join(rank, n);
  if (!comm) return kApiError;
  const Where me = where(rank, two_hosts);
  if (wia_comm_node_rank(comm) != me.node || wia_comm_local_rank(comm) != me.device) {
    std::fprintf(stderr, "rank %d: layout (%d, %d), expected (%d, %d)\n", rank,
                 wia_comm_node_rank(comm), wia_comm_local_rank(comm), me.node, me.device);
    return kWrong;
  }
  const int next = (rank + 1) % n, prev = (rank + n - 1) % n;
  const Where to = where(next, two_hosts), from = where(prev, two_hosts);
  for (std::size_t size : kSizes) {
    std::vector<std::uint8_t> out(size), in(size, 0xEE);
    fill(out, rank, next, 0);
    auto send = [&] { return wia_send(to.node, to.device, out.data(), size, nullptr); };
    auto recv = [&] { return wia_recv(from.node, from.device, in.data(), size, nullptr); };
    if ((rank % 2 == 0 ? send() : recv()) != WIA_SUCCESS) return fail(rank, "first post");
    if ((rank % 2 == 0 ? recv() : send()) != WIA_SUCCESS) return fail(rank, "second post");
    if (wia_stream_synchronize(nullptr) != WIA_SUCCESS) return fail(rank, "synchronize");
    if (const long w = first_wrong(in, prev, rank, 0); w >= 0) {
      std::fprintf(stderr, "rank %d: %zu B from rank %d: byte %ld wrong\n", rank, size, prev, w);
      return kWrong;
    }
  }
  // Tags: rank 0 sends rank 1 a message of tag 7, one of tag 3 and two of
  // tag 5; rank 1 receives them in the same order into separate buffers.
  // Each must hold its own tag's pattern (and the two of tag 5 differ by
  // size, so their order shows).
  if (rank < 2) {
    const Where peer = where(1 - rank, two_hosts);
    const int tags[] = {7, 3, 5, 5};
    const std::size_t sizes[] = {4096, 24, 1 << 20, 100};
    std::vector<std::vector<std::uint8_t>> bufs;
    for (int k = 0; k < 4; ++k) {
      bufs.emplace_back(sizes[k], 0xEE);
      if (rank == 0) fill(bufs.back(), 0, 1, tags[k]);
      const wia_status_t st = rank == 0 ? wia_send_ex(comm, peer.node, peer.device, bufs[k].data(),
                                                      sizes[k], tags[k], nullptr)
                                        : wia_recv_ex(comm, peer.node, peer.device, bufs[k].data(),
                                                      sizes[k], tags[k], nullptr);
      if (st != WIA_SUCCESS) return fail(rank, "tagged post");
    }
    if (wia_stream_synchronize(nullptr) != WIA_SUCCESS) return fail(rank, "tagged synchronize");
    for (int k = 0; rank == 1 && k < 4; ++k)
      if (const long w = first_wrong(bufs[k], 0, 1, tags[k]); w >= 0) {
        std::fprintf(stderr, "rank 1: message %d (tag %d): byte %ld wrong\n", k, tags[k], w);
        return kWrong;
      }
  }
  // Several senders, received in the opposite order: every other rank
  // sends rank 0 1 MiB with its rank as the tag, and rank 0 receives from
  // the highest rank first. Each sender has one operation, so nothing
  // depends on the transport buffering a message.
  if (n >= 3) {
    const std::size_t size = 1 << 20;
    if (rank > 0) {
      std::vector<std::uint8_t> out(size);
      fill(out, rank, 0, rank);
      const Where zero = where(0, two_hosts);
      if (wia_send_ex(comm, zero.node, zero.device, out.data(), size, rank, nullptr) !=
              WIA_SUCCESS ||
          wia_stream_synchronize(nullptr) != WIA_SUCCESS)
        return fail(rank, "fan-in send");
    } else {
      std::vector<std::vector<std::uint8_t>> in(static_cast<std::size_t>(n));
      for (int p = n - 1; p >= 1; --p) {
        in[p].assign(size, 0xEE);
        const Where w = where(p, two_hosts);
        if (wia_recv_ex(comm, w.node, w.device, in[p].data(), size, p, nullptr) != WIA_SUCCESS)
          return fail(rank, "fan-in receive");
      }
      if (wia_stream_synchronize(nullptr) != WIA_SUCCESS) return fail(rank, "fan-in synchronize");
      for (int p = 1; p < n; ++p)
        if (const long w = first_wrong(in[p], p, 0, p); w >= 0) {
          std::fprintf(stderr, "rank 0: fan-in from rank %d: byte %ld wrong\n", p, w);
          return kWrong;
        }
    }
  }
  return wia_destroy_communicator(comm) == WIA_SUCCESS ? kOk : fail(rank, "destroy");
}

std::uint16_t free_port() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  REQUIRE(fd >= 0);
  REQUIRE(bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  REQUIRE(getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0);
  close(fd);
  return ntohs(a.sin_port);
}

}  // namespace

TEST_CASE("wia_send/wia_recv: host buffers around a ring of 2, 3 and 4 ranks, 8 B to 4 MiB") {
  struct Variant {
    int n;
    const char* transport;  // "" = the defaults (shm on one node)
    bool two_hosts;
  };
  const Variant variants[] = {
      {2, "", false}, {3, "", false}, {4, "", false}, {2, "tcp", true}, {4, "tcp", true}};
  for (const Variant& v : variants) {
    CAPTURE(v.n);
    CAPTURE(v.transport);
    CAPTURE(v.two_hosts);
    std::vector<std::pair<std::string, std::string>> env = {{"TEST_WIA_ID", unique_id_env()}};
    if (*v.transport) env.emplace_back("WIA_TRANSPORT", v.transport);
    const bool two = v.two_hosts;
    check_all(run_ranks(
        v.n, base_yaml(), [two](int rank, int n) { return ring(rank, n, two); }, env));
  }
}

// The seed's 6.10 config (2 faked nodes, WIA_NET_RDMA) and 6.10.1 snippet,
// then transfers the profile counts; each rank's log goes to
// LOG_BASE.<rank> (debug level, so the per-link transport choice is in it).
void seed_distributed_example(const std::string& yaml, const std::string& log_base) {
  const std::uint16_t port = free_port();
  const std::vector<std::pair<std::string, std::string>> env = {
      {"WIA_WORLD_SIZE", "2"},
      {"WIA_ROOT_ADDR", "127.0.0.1:" + std::to_string(port)},
      {"WIA_LOG_LEVEL", "debug"}};
  const auto st = run_ranks(
      2, yaml,
      [](int rank, int) {
        // Multi-node communicator spanning 2 nodes, 1 device each
        wia_distributed_config_t dist_cfg = {
            .num_nodes = 2,
            .devices_per_node = 1,
            .network_backend = WIA_NET_RDMA,
            .rdma_device = "mlx5_0",
            .rdma_port = 1,

            .use_gpu_direct_rdma = true,  // RDMA directly to/from GPU memory
            .compression = WIA_NET_COMPRESS_AUTO};
        wia_communicator_t global_comm;
        if (wia_create_distributed_communicator(&dist_cfg, &global_comm) != WIA_SUCCESS)
          return fail(rank, "create");
        if (wia_comm_size(global_comm) != 2 || wia_comm_node_rank(global_comm) != rank ||
            wia_comm_local_rank(global_comm) != 0)
          return kWrong;

        // Enable GPUDirect RDMA
        wia_gpudirect_config_t gpudirect = {.enable_rdma = true,
                                            .enable_async_copy = true,
                                            .max_inline_size = 256,  // bytes
                                            .use_write_semantics = true};
        dist_cfg.use_gpu_direct_rdma = false;
        if (wia_enable_gpudirect_rdma(&dist_cfg, &gpudirect) != WIA_SUCCESS)
          return fail(rank, "wia_enable_gpudirect_rdma");
        if (!dist_cfg.use_gpu_direct_rdma) return kWrong;  // follows enable_rdma

        wia_comm_profiling_t prof = {.enable_bandwidth_tracking = true,
                                     .enable_latency_tracking = true,
                                     .enable_overlap_analysis = false};
        if (wia_enable_comm_profiling(global_comm, &prof) != WIA_SUCCESS)
          return fail(rank, "profiling");
        // Transfers automatically use GPUDirect when available
        const int dst_node = 1 - rank, dst_device = 0;
        const std::size_t size = 1 << 16;
        std::vector<std::uint8_t> gpu_buffer(size), got(size);
        fill(gpu_buffer, rank, 1 - rank, 0);
        wia_stream_t stream = nullptr;
        for (int round = 0; round < 3; ++round) {
          if (rank == 0 &&
              wia_send(dst_node, dst_device, gpu_buffer.data(), size, stream) != WIA_SUCCESS)
            return fail(rank, "wia_send");
          if (wia_recv(1 - rank, 0, got.data(), size, stream) != WIA_SUCCESS)
            return fail(rank, "wia_recv");
          if (rank == 1 &&
              wia_send(dst_node, dst_device, gpu_buffer.data(), size, stream) != WIA_SUCCESS)
            return fail(rank, "wia_send");
          if (wia_stream_synchronize(stream) != WIA_SUCCESS) return fail(rank, "synchronize");
          if (first_wrong(got, 1 - rank, rank, 0) >= 0) return kWrong;
        }
        wia_comm_profile_report_t* r = wia_get_comm_profile(global_comm);
        const wia_collective_profile_t* s = entry(r, "send");
        const wia_collective_profile_t* v = entry(r, "recv");
        const bool counted = s && v && s->invocation_count == 3 && v->invocation_count == 3 &&
                             s->bytes == 3 * size && v->bytes == 3 * size &&
                             std::string(s->algorithm) == "host" &&
                             std::string(v->algorithm) == "host";
        if (!counted)
          std::fprintf(stderr, "rank %d: profile without 3 sends and 3 receives of %zu B\n", rank,
                       size);
        wia_free_comm_profile(r);
        if (!counted) return kWrong;
        return wia_destroy_communicator(global_comm) == WIA_SUCCESS ? kOk : kApiError;
      },
      env, {}, 120,
      [log_base](int rank) {
        setenv("WIA_RANK", std::to_string(rank).c_str(), 1);
        setenv("WIA_HOSTID", rank ? "nodeB" : "nodeA", 1);
        const std::string path = log_base + "." + std::to_string(rank);
        if (!std::freopen(path.c_str(), "w", stderr)) _exit(kApiError);
      });
  check_all(st);
}

// Runs the seed example with `yaml` and checks that both directions of the
// link between the two faked nodes used `transport`.
void seed_distributed_example_over(const std::string& yaml, const std::string& transport) {
  char log_tmpl[] = "/tmp/wia-p2p-seed-XXXXXX";
  const int fd = mkstemp(log_tmpl);
  REQUIRE(fd >= 0);
  close(fd);
  const std::string log_base = log_tmpl;
  seed_distributed_example(yaml, log_base);
  for (int rank = 0; rank < 2; ++rank) {
    const std::string log = read_file(log_base + "." + std::to_string(rank));
    const std::string link = "rank " + std::to_string(rank) + " -> rank " +
                             std::to_string(1 - rank) + ": " + transport + " ";
    INFO(log);
    CHECK(log.find(link) != std::string::npos);
    std::remove((log_base + "." + std::to_string(rank)).c_str());
  }
  std::remove(log_base.c_str());
}

TEST_CASE(
    "the seed's 6.10 communicator (WIA_NET_RDMA) and 6.10.1 GPUDirect snippet, then a "
    "transfer the profile counts") {
  // ofi is left out: this case is about wia_send, not about which fabric
  // libfabric offers here (the next case forces it); links between the two
  // faked nodes fall back to tcp, as the seed's config asks on a cluster
  // without RDMA.
  seed_distributed_example_over(base_yaml() + "providers:\n  disable: [ofi]\n", "tcp");
}

// Issue 21: the seed's 6.10 example runs on ofi when YAML forces it (the
// settings of config/examples/ofi.yaml). ctest runs it as p2p_send_ofi,
// with WIA_TEST_OFI=1, when the provider is built.
TEST_CASE("the seed's 6.10 example forced onto ofi (tcp;ofi_rxm) by YAML") {
  if (std::getenv("WIA_TEST_OFI") == nullptr) {
    MESSAGE("skipped: WIA_TEST_OFI is not set (ctest runs it as p2p_send_ofi)");
    return;
  }
  seed_distributed_example_over(base_yaml() +
                                    "selector:\n  transport: ofi\n"
                                    "ofi:\n  provider: \"tcp;ofi_rxm\"\n  inter_node: all\n",
                                "ofi");
}

TEST_CASE("bad input: unknown (node, device), NULL buffer, self, negative tag, no communicator") {
  check_all(run_ranks(
      2, base_yaml(),
      [](int rank, int n) {
        char byte = 0;
        // Before any process communicator exists.
        if (wia_send(0, 1 - rank, &byte, 1, nullptr) != WIA_ERROR_INVALID_ARGUMENT ||
            !std::strstr(wia_get_last_error(), "no distributed communicator"))
          return fail(rank, "wia_send without a communicator");
        wia_communicator_t comm = join(rank, n);
        if (!comm) return kApiError;
        struct Bad {
          int node, device;
          const void* buf;
          std::size_t size;
          int tag;
          const char* needle;
        };
        const Bad bad[] = {
            {0, 2, &byte, 1, 0,
             "(dst_node 0, dst_device 2) names no rank of the communicator, which has 2 rank(s) "
             "on 1 node(s): node 0 has devices 0..1"},
            {1, 0, &byte, 1, 0, "(dst_node 1, dst_device 0) names no rank"},
            {-1, 0, &byte, 1, 0, "(dst_node -1, dst_device 0) names no rank"},
            {0, rank, &byte, 1, 0, "is the calling rank"},
            {0, 1 - rank, nullptr, 16, 0, "buffer is NULL but size is 16"},
            {0, 1 - rank, &byte, 1, -4, "tag -4 is negative"},
        };
        for (const Bad& b : bad) {
          const wia_status_t st =
              wia_send_ex(comm, b.node, b.device, b.buf, b.size, b.tag, nullptr);
          if (st != WIA_ERROR_INVALID_ARGUMENT || !std::strstr(wia_get_last_error(), b.needle)) {
            std::fprintf(stderr, "rank %d: expected '%s', got %d: %s\n", rank, b.needle,
                         static_cast<int>(st), wia_get_last_error());
            return kWrong;
          }
        }
        if (wia_recv(3, 3, &byte, 1, nullptr) != WIA_ERROR_INVALID_ARGUMENT ||
            !std::strstr(wia_get_last_error(), "wia_recv: (src_node 3, src_device 3)"))
          return fail(rank, "wia_recv of an unknown rank");
        // A communicator over this process's devices is no target of
        // wia_send_ex, and creating one does not change wia_send's.
        const wia_device_t dev0 = 0;
        wia_communicator_t local = nullptr;
        if (wia_create_communicator(&dev0, 1, &local) != WIA_SUCCESS)
          return fail(rank, "device communicator");
        if (wia_send_ex(local, 0, 0, &byte, 1, 0, nullptr) != WIA_ERROR_NOT_SUPPORTED ||
            !std::strstr(wia_get_last_error(), "needs a process communicator"))
          return fail(rank, "wia_send_ex on a device communicator");
        if (wia_destroy_communicator(local) != WIA_SUCCESS) return kApiError;
        // Zero bytes from a NULL buffer are fine, and still a message.
        if (wia_send(0, 1 - rank, nullptr, 0, nullptr) != WIA_SUCCESS ||
            wia_recv(0, 1 - rank, nullptr, 0, nullptr) != WIA_SUCCESS ||
            wia_stream_synchronize(nullptr) != WIA_SUCCESS)
          return fail(rank, "zero-byte message");
        // The communicator is unharmed by the refused calls.
        std::int32_t v = rank + 1, sum = 0;
        wia_collective_config_t cfg{};
        cfg.datatype = WIA_INT32;
        cfg.reduction_op = WIA_REDUCE_SUM;
        if (wia_all_reduce(comm, &v, &sum, 1, &cfg, nullptr) != WIA_SUCCESS ||
            wia_stream_synchronize(nullptr) != WIA_SUCCESS || sum != 3)
          return fail(rank, "all-reduce after the refused calls");
        if (wia_destroy_communicator(comm) != WIA_SUCCESS) return kApiError;
        // The communicator created last is gone.
        if (wia_send(0, 1 - rank, &byte, 1, nullptr) != WIA_ERROR_INVALID_ARGUMENT ||
            !std::strstr(wia_get_last_error(), "was destroyed"))
          return fail(rank, "wia_send after destroy");
        return kOk;
      },
      {{"TEST_WIA_ID", unique_id_env()}}));
}

namespace {

// Rank 0 sends one size, rank 1 posts another, over each transport: both
// ranks' errors name both sizes (rank 0's through rank 1's abort message).
// `extra` adds environment variables to both ranks.
void check_mismatched_sizes(const std::vector<std::pair<std::string, std::string>>& extra = {}) {
  struct Sizes {
    std::size_t sent, posted;
  };
  for (const char* transport : {"shm", "tcp"})
    for (const Sizes z : {Sizes{64, 128}, Sizes{128, 64}}) {
      CAPTURE(transport);
      CAPTURE(z.sent);
      CAPTURE(z.posted);
      // A smaller message is ours to report (WIA_ERROR_MISMATCH); a larger
      // one the transport refuses (WIA_ERROR_REMOTE, "does not fit"), in its
      // words: either way both sizes are in the message.
      const std::string needle = z.sent < z.posted ? "sent " + std::to_string(z.sent) +
                                                         " B, the receive was posted for " +
                                                         std::to_string(z.posted) + " B"
                                                   : std::string("does not fit");
      std::vector<std::pair<std::string, std::string>> env = {{"TEST_WIA_ID", unique_id_env()},
                                                              {"WIA_TRANSPORT", transport}};
      env.insert(env.end(), extra.begin(), extra.end());
      const auto st = run_ranks(
          2, base_yaml(5000),
          [z, needle](int rank, int n) {
            wia_communicator_t comm = join(rank, n);
            if (!comm) return kApiError;
            std::vector<char> buf(128, 1);
            if (rank == 0) {
              if (wia_send(0, 1, buf.data(), z.sent, nullptr) != WIA_SUCCESS) return kApiError;
              // The sender learns of it at its next operation at the latest.
              wia_recv(0, 1, buf.data(), 8, nullptr);
            } else if (wia_recv(0, 0, buf.data(), z.posted, nullptr) != WIA_SUCCESS) {
              return kApiError;
            }
            const wia_status_t s = wia_stream_synchronize(nullptr);
            const std::string msg = wia_get_last_error();
            int r = error_naming(rank, s, msg, {needle.c_str()});
            if (r == kSawError && (msg.find(std::to_string(z.sent)) == std::string::npos ||
                                   msg.find(std::to_string(z.posted)) == std::string::npos))
              r = kWrong;
            wia_destroy_communicator(comm);
            return r;
          },
          env);
      check_all(st, kSawError);
    }
}

}  // namespace

TEST_CASE(
    "mismatched sizes: the receiver's error names both sizes, and so does the sender's "
    "next call") {
  check_mismatched_sizes();
}

// Rank 1's abort arrives behind heartbeats and right before its close:
// the transport keeps the abort as unexpected until the control receive
// is posted again, and fails rank 0's receive at the close. Rank 0 must
// still report rank 1's reason, not the closed connection (a control poll
// that took one message per peer reported "EOF on the control socket"
// over tcp, about 1 run in 20 on a loaded machine without the injection).
TEST_CASE("mismatched sizes: the abort behind another control message still names both sizes") {
  check_mismatched_sizes({{"WIA_TEST_HEARTBEATS_BEFORE_ABORT", "8"}});
}

TEST_CASE("a peer killed while a rank waits in wia_recv: an error naming it within the timeout") {
  const auto t0 = std::chrono::steady_clock::now();
  const auto st = run_ranks(
      2, base_yaml(3000),
      [](int rank, int n) {
        wia_communicator_t comm = join(rank, n);
        if (!comm) return kApiError;
        if (rank == 0) {
          usleep(300 * 1000);  // rank 1 is in its receive by now
          raise(SIGKILL);
        }
        std::vector<char> buf(1 << 20);
        if (wia_recv(0, 0, buf.data(), buf.size(), nullptr) != WIA_SUCCESS) return kApiError;
        const wia_status_t s = wia_stream_synchronize(nullptr);
        const int r = error_naming(rank, s, wia_get_last_error(), {"rank 0"});
        wia_destroy_communicator(comm);
        return r;
      },
      {{"TEST_WIA_ID", unique_id_env()}, {"WIA_TRANSPORT", "tcp"}}, {}, 60);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  CHECK(st[0] == -SIGKILL);
  CHECK(st[1] == kSawError);
  CHECK(secs < 20);
}

TEST_CASE("a receive whose sender never sends times out naming it") {
  const auto t0 = std::chrono::steady_clock::now();
  const auto st = run_ranks(
      2, base_yaml(1500),
      [](int rank, int n) {
        wia_communicator_t comm = join(rank, n);
        if (!comm) return kApiError;
        int r = kOk;
        if (rank == 0) {
          std::vector<char> buf(4096);
          if (wia_recv_ex(comm, 0, 1, buf.data(), buf.size(), 42, nullptr) != WIA_SUCCESS)
            return fail(rank, "recv");
          const wia_status_t s = wia_stream_synchronize(nullptr);
          r = s == WIA_ERROR_TIMEOUT ? error_naming(rank, s, wia_get_last_error(),
                                                    {"timed out after 1500 ms: rank 1 has not "
                                                     "posted the matching send"})
                                     : kWrong;
        } else {
          usleep(2500 * 1000);  // never sends
        }
        wia_destroy_communicator(comm);
        return r;
      },
      {{"TEST_WIA_ID", unique_id_env()}, {"WIA_TRANSPORT", "tcp"}}, {}, 60);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  CHECK(st[0] == kSawError);
  CHECK(st[1] == kOk);
  CHECK(secs < 15);
}

#ifdef WIA_FAKE_CUDA_FILE
TEST_CASE(
    "device buffers of the CUDA double are staged through pinned host memory, data "
    "checked, the path in the log and the profile") {
  for (const bool enable_rdma : {true, false}) {
    CAPTURE(enable_rdma);
    char log_tmpl[] = "/tmp/wia-p2p-log-XXXXXX";
    const int fd = mkstemp(log_tmpl);
    REQUIRE(fd >= 0);
    close(fd);
    const std::string log_base = log_tmpl;
    const auto st = run_ranks(
        2, base_yaml(),
        [enable_rdma](int rank, int n) {
          const int host = device_of("host"), gpu = device_of("cuda");
          if (host < 0 || gpu < 0) {
            std::fprintf(stderr, "rank %d: host device %d, cuda device %d\n", rank, host, gpu);
            return kApiError;
          }
          if (wia_set_device(host) != WIA_SUCCESS) return fail(rank, "set_device");
          wia_communicator_t comm = join(rank, n);
          if (!comm) return kApiError;
          wia_distributed_config_t dist_cfg = {};
          wia_gpudirect_config_t g = {.enable_rdma = enable_rdma,
                                      .enable_async_copy = true,
                                      .max_inline_size = 256,
                                      .use_write_semantics = false};
          if (wia_enable_gpudirect_rdma(&dist_cfg, &g) != WIA_SUCCESS)
            return fail(rank, "gpudirect");
          wia_comm_profiling_t prof = {.enable_bandwidth_tracking = true,
                                       .enable_latency_tracking = false,
                                       .enable_overlap_analysis = false};
          if (wia_enable_comm_profiling(comm, &prof) != WIA_SUCCESS) return fail(rank, "profiling");
          for (std::size_t size : kSizes) {
            void* dev = nullptr;
            if (wia_malloc_on(gpu, &dev, size) != WIA_SUCCESS) return fail(rank, "malloc_on");
            std::vector<std::uint8_t> host_buf(size, 0xEE);
            if (rank == 0) {
              fill(host_buf, 0, 1, 0);
              if (wia_memcpy(dev, host_buf.data(), size) != WIA_SUCCESS)
                return fail(rank, "fill device buffer");
              if (wia_send(0, 1, dev, size, nullptr) != WIA_SUCCESS) return fail(rank, "send");
            } else {
              if (wia_memset(dev, 0, size) != WIA_SUCCESS) return fail(rank, "memset");
              if (wia_recv(0, 0, dev, size, nullptr) != WIA_SUCCESS) return fail(rank, "recv");
            }
            if (wia_stream_synchronize(nullptr) != WIA_SUCCESS) return fail(rank, "synchronize");
            if (rank == 1) {
              if (wia_memcpy(host_buf.data(), dev, size) != WIA_SUCCESS)
                return fail(rank, "read device buffer");
              if (const long w = first_wrong(host_buf, 0, 1, 0); w >= 0) {
                std::fprintf(stderr, "rank 1: %zu B staged: byte %ld wrong\n", size, w);
                return kWrong;
              }
            }
            wia_free(dev);
          }
          wia_comm_profile_report_t* r = wia_get_comm_profile(comm);
          const wia_collective_profile_t* e = entry(r, rank == 0 ? "send_staged" : "recv_staged");
          const bool counted =
              e && e->invocation_count == 4 && std::string(e->algorithm) == "staged";
          wia_free_comm_profile(r);
          if (!counted) {
            std::fprintf(stderr, "rank %d: no 4 staged transfers in the profile\n", rank);
            return kWrong;
          }
          return wia_destroy_communicator(comm) == WIA_SUCCESS ? kOk : kApiError;
        },
        {{"TEST_WIA_ID", unique_id_env()},
         {"WIA_CUDA_LIBRARY", WIA_FAKE_CUDA_FILE},
         {"WIA_LOG_LEVEL", "info"}},
        {}, 180,
        [log_base](int rank) {
          const std::string path = log_base + "." + std::to_string(rank);
          if (!std::freopen(path.c_str(), "w", stderr)) _exit(kApiError);
        });
    const std::string log0 = read_file(log_base + ".0"), log1 = read_file(log_base + ".1");
    for (const std::string* l : {&log0, &log1}) {
      INFO(*l);
      CHECK(l->find("device memory staged through pinned host memory") != std::string::npos);
      CHECK(l->find(enable_rdma ? "which does not take device memory" : "enable_rdma is false") !=
            std::string::npos);
    }
    check_all(st);
    std::remove(log_base.c_str());
    std::remove((log_base + ".0").c_str());
    std::remove((log_base + ".1").c_str());
  }
}
TEST_CASE(
    "a staged receive whose sender is killed fails naming it and leaves the device "
    "buffer as it was") {
  const auto st = run_ranks(
      2, base_yaml(3000),
      [](int rank, int n) {
        const int host = device_of("host"), gpu = device_of("cuda");
        if (host < 0 || gpu < 0 || wia_set_device(host) != WIA_SUCCESS) return kApiError;
        wia_communicator_t comm = join(rank, n);
        if (!comm) return kApiError;
        if (rank == 0) {
          usleep(300 * 1000);  // rank 1 is in its receive by now
          raise(SIGKILL);
        }
        const std::size_t size = 1 << 20;
        void* dev = nullptr;
        if (wia_malloc_on(gpu, &dev, size) != WIA_SUCCESS || wia_memset(dev, 0x5A, size) != 0)
          return fail(rank, "device buffer");
        if (wia_recv(0, 0, dev, size, nullptr) != WIA_SUCCESS) return fail(rank, "recv");
        const wia_status_t s = wia_stream_synchronize(nullptr);
        const int r = error_naming(rank, s, wia_get_last_error(), {"rank 0"});
        std::vector<std::uint8_t> back(size);
        if (wia_memcpy(back.data(), dev, size) != WIA_SUCCESS) return fail(rank, "read back");
        for (std::size_t i = 0; i < size; ++i)
          if (back[i] != 0x5A) {
            std::fprintf(stderr, "rank 1: byte %zu of the device buffer changed\n", i);
            return kWrong;
          }
        wia_free(dev);
        wia_destroy_communicator(comm);
        return r;
      },
      {{"TEST_WIA_ID", unique_id_env()},
       {"WIA_TRANSPORT", "tcp"},
       {"WIA_CUDA_LIBRARY", WIA_FAKE_CUDA_FILE}},
      {}, 60);
  CHECK(st[0] == -SIGKILL);
  CHECK(st[1] == kSawError);
}
#endif
