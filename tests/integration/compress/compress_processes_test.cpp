// SPDX-License-Identifier: Apache-2.0
// wia_all_reduce_compressed and wia_all_reduce_sparse_ex on process
// communicators: forked ranks joined by a unique id, over shm and tcp.
// Each rank derives every rank's input from (rank, index), so it checks its
// output against a reference of its own: top-k's exact selected sum, error
// feedback's identity (output + the all-reduced residuals = the dense sum),
// the half cast's bound, and the sparse dense sum. Exit status 0 = right.
#include <doctest/doctest.h>
#include <sys/wait.h>
#include <unistd.h>
#include <wia/wia.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

namespace {

constexpr std::size_t kN = 4096;

float input(int rank, std::size_t i) {
  const std::uint64_t h = (i * 2654435761u + static_cast<std::uint64_t>(rank) * 40503u) % 10007u;
  return (static_cast<float>(h) - 5003.0f) / 1000.0f;
}

// Rank 0 writes the id to a file the others poll (bounded).
bool exchange_id(int rank, const std::string& path, wia_unique_id_t* id) {
  if (rank == 0) {
    if (wia_get_unique_id(id) != WIA_SUCCESS) return false;
    const std::string tmp = path + ".tmp";
    FILE* f = std::fopen(tmp.c_str(), "wb");
    if (!f || std::fwrite(id, sizeof *id, 1, f) != 1) return false;
    std::fclose(f);
    return std::rename(tmp.c_str(), path.c_str()) == 0;
  }
  for (int i = 0; i < 4000; ++i) {
    if (FILE* f = std::fopen(path.c_str(), "rb")) {
      const bool ok = std::fread(id, sizeof *id, 1, f) == 1;
      std::fclose(f);
      if (ok) return true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return false;
}

#define EXPECT(cond)                                                                      \
  do {                                                                                    \
    if (!(cond)) {                                                                        \
      std::fprintf(stderr, "rank %d: %s failed at line %d (%s)\n", rank, #cond, __LINE__, \
                   wia_get_last_error());                                                 \
      return 10;                                                                          \
    }                                                                                     \
  } while (0)

// This rank's communicator of the job (nullptr on failure).
wia_communicator_t join(int rank, int nranks, const std::string& id_path) {
  wia_unique_id_t id;
  wia_communicator_t comm = nullptr;
  if (!exchange_id(rank, id_path, &id) ||
      wia_create_communicator_from_id(&id, nranks, rank, &comm) != WIA_SUCCESS)
    return nullptr;
  return comm;
}

// How often comm's profile saw collective `name` (-1: no profile).
int invocations(wia_communicator_t comm, const char* name) {
  wia_comm_profile_report_t* report = wia_get_comm_profile(comm);
  if (report == nullptr) return -1;
  int n = 0;
  for (int c = 0; c < report->num_collectives; ++c)
    if (std::strcmp(report->collectives[c].name, name) == 0)
      n += report->collectives[c].invocation_count;
  wia_free_comm_profile(report);
  return n;
}

// int8 in two phases (docs/compression.md, "Quantize"): each entry of
// chunk c within the steps of the quantized parts (every rank's input, or
// every host's sum across hosts: part(k, i) for k < parts) plus one step of
// the total's chunk. Returns the first entry out of bounds, or n.
std::size_t outside_int8_bound(const std::vector<float>& out, const std::vector<double>& dense,
                               std::size_t n, int parts,
                               const std::function<double(int, std::size_t)>& part) {
  for (std::size_t base = 0; base < n; base += 256) {
    const std::size_t end = std::min(n, base + 256);
    double b1 = 0, smin = dense[base], smax = dense[base];
    for (int k = 0; k < parts; ++k) {
      double mn = part(k, base), mx = mn;
      for (std::size_t i = base; i < end; ++i)
        mn = std::min(mn, part(k, i)), mx = std::max(mx, part(k, i));
      b1 += (mx - mn) / 255;
    }
    for (std::size_t i = base; i < end; ++i)
      smin = std::min(smin, dense[i]), smax = std::max(smax, dense[i]);
    const double bound = b1 + (smax - smin + 2 * b1) / 255;
    for (std::size_t i = base; i < end; ++i)
      if (std::fabs(out[i] - dense[i]) > bound * (1 + 1e-4) + 1e-4) return i;
  }
  return n;
}

// Whether every rank holds rank 0's vector (broadcast and compared).
bool same_as_rank0(wia_communicator_t comm, const std::vector<float>& out) {
  std::vector<float> first(out);
  return wia_broadcast(comm, first.data(), first.size(), 0, WIA_FLOAT32, nullptr) ==
             WIA_SUCCESS &&
         wia_stream_synchronize(nullptr) == WIA_SUCCESS && first == out;
}

int body(int rank, int nranks, const std::string& id_path) {
  wia_communicator_t comm = join(rank, nranks, id_path);
  EXPECT(comm != nullptr);
  std::vector<float> x(kN), out(kN), res(kN), res_sum(kN);
  std::vector<double> dense(kN, 0);
  for (std::size_t i = 0; i < kN; ++i) {
    x[i] = input(rank, i);
    for (int r = 0; r < nranks; ++r) dense[i] += input(r, i);
  }
  wia_collective_config_t sum{};
  sum.datatype = WIA_FLOAT32;
  sum.reduction_op = WIA_REDUCE_SUM;

  // Top-k 1% without feedback: exactly the sum of every rank's top-k.
  wia_compression_config_t topk{};
  topk.method = WIA_COMPRESS_TOPK;
  topk.parameters.topk.k_ratio = 0.01;
  topk.parameters.topk.use_magnitude = true;
  EXPECT(wia_all_reduce_compressed(comm, x.data(), out.data(), kN, &topk, nullptr) == WIA_SUCCESS);
  EXPECT(wia_stream_synchronize(nullptr) == WIA_SUCCESS);
  {
    const std::size_t k = 41;  // ceil(0.01 * 4096)
    std::vector<double> ref(kN, 0);
    for (int r = 0; r < nranks; ++r) {
      std::vector<std::size_t> idx(kN);
      std::iota(idx.begin(), idx.end(), 0);
      std::stable_sort(idx.begin(), idx.end(), [&](auto a, auto b) {
        return std::fabs(input(r, a)) > std::fabs(input(r, b));
      });
      for (std::size_t j = 0; j < k; ++j) ref[idx[j]] += input(r, idx[j]);
    }
    for (std::size_t i = 0; i < kN; ++i) EXPECT(std::fabs(out[i] - ref[i]) < 1e-4);
  }

  // Error feedback, one step from a reset, for five methods.
  wia_compression_config_t cfgs[5] = {};
  cfgs[0] = topk;
  cfgs[1].method = WIA_COMPRESS_QUANTIZE;
  cfgs[1].parameters.quantize.num_bits = 8;
  cfgs[1].parameters.quantize.use_dynamic_range = true;
  cfgs[2].method = WIA_COMPRESS_ONEBIT;
  cfgs[2].parameters.onebit.use_error_feedback = true;
  cfgs[3].method = WIA_COMPRESS_RANDOMK;
  cfgs[3].parameters.randomk.k_ratio = 0.1;
  cfgs[3].parameters.randomk.seed = 7;
  cfgs[4].method = WIA_COMPRESS_LOWRANK;  // two all-reduces with a host step between
  cfgs[4].parameters.lowrank.rank = 2;
  for (auto& c : cfgs) {
    c.error_feedback = c.method != WIA_COMPRESS_ONEBIT;
    EXPECT(wia_compression_reset(comm) == WIA_SUCCESS);
    EXPECT(wia_all_reduce_compressed(comm, x.data(), out.data(), kN, &c, nullptr) == WIA_SUCCESS);
    EXPECT(wia_stream_synchronize(nullptr) == WIA_SUCCESS);
    EXPECT(wia_compression_get_residual(comm, x.data(), res.data(), kN) == WIA_SUCCESS);
    EXPECT(wia_all_reduce(comm, res.data(), res_sum.data(), kN, &sum, nullptr) == WIA_SUCCESS);
    EXPECT(wia_stream_synchronize(nullptr) == WIA_SUCCESS);
    for (std::size_t i = 0; i < kN; ++i) EXPECT(std::fabs(out[i] + res_sum[i] - dense[i]) < 1e-3);
  }

  // int8 without error feedback: shards reduced where they land and
  // gathered quantized; every rank gets the same vector, within the bound of
  // every rank's step plus one step of the sum (docs/compression.md).
  {
    wia_compression_config_t q{};
    q.method = WIA_COMPRESS_QUANTIZE;
    q.parameters.quantize.num_bits = 8;
    q.parameters.quantize.use_dynamic_range = true;
    EXPECT(wia_all_reduce_compressed(comm, x.data(), out.data(), kN, &q, nullptr) == WIA_SUCCESS);
    EXPECT(wia_stream_synchronize(nullptr) == WIA_SUCCESS);
    EXPECT(outside_int8_bound(out, dense, kN, nranks,
                              [](int r, std::size_t i) { return double(input(r, i)); }) == kN);
    // Every rank holds the same result as rank 0.
    EXPECT(same_as_rank0(comm, out));
  }

  // FP16: within the half-precision rounding of the partial sums.
  wia_compression_config_t h{};
  h.method = WIA_COMPRESS_FP16;
  EXPECT(wia_all_reduce_compressed(comm, x.data(), out.data(), kN, &h, nullptr) == WIA_SUCCESS);
  EXPECT(wia_stream_synchronize(nullptr) == WIA_SUCCESS);
  for (std::size_t i = 0; i < kN; ++i) {
    double mag = 0;
    for (int r = 0; r < nranks; ++r) mag += std::fabs(input(r, i));
    EXPECT(std::fabs(out[i] - dense[i]) <= (nranks + 2) * 0x1p-11 * mag);
  }

  // Sparse, dense form: the sum of every rank's scattered pairs.
  std::vector<std::uint32_t> idx(100);
  std::vector<float> val(100);
  std::vector<double> ref(kN, 0);
  for (int r = 0; r < nranks; ++r)
    for (std::size_t j = 0; j < 100; ++j) {
      const auto i = static_cast<std::uint32_t>((j * 37 + static_cast<std::size_t>(r) * 11) % kN);
      ref[i] += input(r, j);
      if (r == rank) idx[j] = i, val[j] = input(r, j);
    }
  EXPECT(wia_all_reduce_sparse_ex(comm, val.data(), idx.data(), 100, out.data(), kN, WIA_FLOAT32,
                                  nullptr) == WIA_SUCCESS);
  EXPECT(wia_stream_synchronize(nullptr) == WIA_SUCCESS);
  for (std::size_t i = 0; i < kN; ++i) EXPECT(std::fabs(out[i] - ref[i]) < 1e-4);

  EXPECT(wia_destroy_communicator(comm) == WIA_SUCCESS);
  return 0;
}

// Two faked hosts (WIA_HOSTID) of 2 ranks each: float32 calls without
// error feedback reduce dense inside a host and compress only between
// hosts. Checked: int8 within the bound of quantizing each host's sum (not
// each rank's input) plus one step of the total, the same vector on every
// rank, and the exchange off the communicator itself (its profile has no
// all-to-all: the flat call's shards would be one); the fp16 cast (padded
// blocks, an average) and random-k (which stays flat) within their bounds;
// with compression.across_hosts off (`flat`) the all-to-all is back on the
// communicator.
int across_hosts_body(int rank, int nranks, const std::string& id_path, bool flat) {
  wia_communicator_t comm = join(rank, nranks, id_path);
  EXPECT(comm != nullptr);
  EXPECT(wia_comm_node_count(comm) == 2);
  std::vector<float> x(kN), out(kN);
  std::vector<double> dense(kN, 0), host_sum[2] = {std::vector<double>(kN, 0),
                                                    std::vector<double>(kN, 0)};
  for (std::size_t i = 0; i < kN; ++i) {
    x[i] = input(rank, i);
    for (int r = 0; r < nranks; ++r) {
      dense[i] += input(r, i);
      host_sum[r / 2][i] += input(r, i);
    }
  }
  wia_comm_profiling_t prof{};
  EXPECT(wia_enable_comm_profiling(comm, &prof) == WIA_SUCCESS);
  wia_compression_config_t q{};
  q.method = WIA_COMPRESS_QUANTIZE;
  q.parameters.quantize.num_bits = 8;
  q.parameters.quantize.use_dynamic_range = true;
  EXPECT(wia_all_reduce_compressed(comm, x.data(), out.data(), kN, &q, nullptr) == WIA_SUCCESS);
  EXPECT(wia_stream_synchronize(nullptr) == WIA_SUCCESS);
  EXPECT(invocations(comm, "alltoall") == (flat ? 1 : 0));
  // The flat bound quantizes every rank's input; across hosts, each host's
  // sum: the steps of the 2 host sums, then one step of the total.
  EXPECT(outside_int8_bound(out, dense, kN, flat ? nranks : 2, [&](int k, std::size_t i) {
           return flat ? double(input(k, i)) : host_sum[k][i];
         }) == kN);
  EXPECT(same_as_rank0(comm, out));

  // FP16 over a count that is not a multiple of the 2 ranks per host
  // (padded blocks), averaged: within the rounding of the partial sums.
  const std::size_t odd = kN - 3;
  wia_compression_config_t h{};
  h.method = WIA_COMPRESS_FP16;
  std::fill(out.begin(), out.end(), 42.0f);
  EXPECT(wia_all_reduce_compressed_ex(comm, x.data(), out.data(), odd, WIA_FLOAT32,
                                      WIA_REDUCE_AVG, &h, nullptr) == WIA_SUCCESS);
  EXPECT(wia_stream_synchronize(nullptr) == WIA_SUCCESS);
  for (std::size_t i = 0; i < odd; ++i) {
    double mag = 0;
    for (int r = 0; r < nranks; ++r) mag += std::fabs(input(r, i));
    EXPECT(std::fabs(out[i] - dense[i] / nranks) <= (nranks + 2) * 0x1p-11 * mag / nranks + 1e-6);
  }
  for (std::size_t i = odd; i < kN; ++i) EXPECT(out[i] == 42.0f);  // nothing past count

  // Random-k 10% without feedback (flat: its messages are small), scaled by
  // n/k: unbiased, so the mean over 40 steps nears the sum.
  wia_compression_config_t rk{};
  rk.method = WIA_COMPRESS_RANDOMK;
  rk.parameters.randomk.k_ratio = 0.1;
  rk.parameters.randomk.seed = 3;
  std::vector<double> mean(kN, 0);
  const int steps = 40;
  for (int t = 0; t < steps; ++t) {
    EXPECT(wia_all_reduce_compressed(comm, x.data(), out.data(), kN, &rk, nullptr) ==
           WIA_SUCCESS);
    EXPECT(wia_stream_synchronize(nullptr) == WIA_SUCCESS);
    for (std::size_t i = 0; i < kN; ++i) mean[i] += out[i] / steps;
  }
  double err = 0, norm = 0;
  for (std::size_t i = 0; i < kN; ++i)
    err += (mean[i] - dense[i]) * (mean[i] - dense[i]), norm += dense[i] * dense[i];
  // Variance per entry (n/k - 1) x^2 / steps: relative error about 0.47.
  EXPECT(std::sqrt(err / norm) < 0.7);
  EXPECT(wia_destroy_communicator(comm) == WIA_SUCCESS);
  return 0;
}

// A plain wia_all_reduce of 2 MiB of float32 on two faked hosts with
// compression.link_codec auto or a selector rule's compress key (the YAML
// of the run): compressed (int8
// between hosts) when the link file makes the link between hosts slow,
// plain when it is fast. Compressed: no all-reduce on the communicator
// itself (the exchange ran on the hosts' split communicators), the error
// of quantizing each host's sum (clearly not a float32 sum's rounding),
// the same vector on every rank. Plain: one all-reduce, float32 exact.
int link_codec_body(int rank, int nranks, const std::string& id_path, bool expect_codec) {
  wia_communicator_t comm = join(rank, nranks, id_path);
  EXPECT(comm != nullptr);
  constexpr std::size_t n = 1u << 19;
  std::vector<float> x(n), out(n);
  std::vector<double> dense(n, 0);
  for (std::size_t i = 0; i < n; ++i) {
    x[i] = input(rank, i);
    for (int r = 0; r < nranks; ++r) dense[i] += input(r, i);
  }
  wia_comm_profiling_t prof{};
  EXPECT(wia_enable_comm_profiling(comm, &prof) == WIA_SUCCESS);
  wia_collective_config_t sum{};
  sum.datatype = WIA_FLOAT32;
  sum.reduction_op = WIA_REDUCE_SUM;
  EXPECT(wia_all_reduce(comm, x.data(), out.data(), n, &sum, nullptr) == WIA_SUCCESS);
  EXPECT(wia_stream_synchronize(nullptr) == WIA_SUCCESS);
  EXPECT(invocations(comm, "allreduce") == (expect_codec ? 0 : 1));
  double worst = 0;
  for (std::size_t i = 0; i < n; ++i) worst = std::max(worst, std::fabs(out[i] - dense[i]));
  if (expect_codec) {
    // int8 of each host's sum: within its bound, and clearly not a float32
    // sum's rounding.
    std::vector<std::vector<double>> host_sum(2, std::vector<double>(n, 0));
    for (int r = 0; r < nranks; ++r)
      for (std::size_t i = 0; i < n; ++i) host_sum[r / 2][i] += input(r, i);
    EXPECT(outside_int8_bound(out, dense, n, 2,
                              [&](int k, std::size_t i) { return host_sum[k][i]; }) == n);
    EXPECT(worst > 1e-3);
  } else {
    EXPECT(worst < 1e-4);
  }
  EXPECT(same_as_rank0(comm, out));
  EXPECT(wia_destroy_communicator(comm) == WIA_SUCCESS);
  return 0;
}

// Rank 1 runs with another compression.pipeline_segment_bytes (variant 5):
// a compressed call fails at once on both ranks, naming the keys, instead
// of posting different collectives; plain all-reduces still work.
int keys_differ_body(int rank, int nranks, const std::string& id_path) {
  wia_communicator_t comm = join(rank, nranks, id_path);
  EXPECT(comm != nullptr);
  std::vector<float> x(kN, 1.0f + static_cast<float>(rank)), out(kN);
  wia_compression_config_t q{};
  q.method = WIA_COMPRESS_QUANTIZE;
  q.parameters.quantize.num_bits = 8;
  q.parameters.quantize.use_dynamic_range = true;
  EXPECT(wia_all_reduce_compressed(comm, x.data(), out.data(), kN, &q, nullptr) ==
         WIA_ERROR_MISMATCH);
  const std::string why = wia_get_last_error();
  EXPECT(why.find("the compression.* keys differ across ranks (rank 1: pipeline_segment_bytes "
                  "4096") != std::string::npos);
  wia_collective_config_t sum{};
  sum.datatype = WIA_FLOAT32;
  sum.reduction_op = WIA_REDUCE_SUM;
  EXPECT(wia_all_reduce(comm, x.data(), out.data(), kN, &sum, nullptr) == WIA_SUCCESS);
  EXPECT(wia_stream_synchronize(nullptr) == WIA_SUCCESS);
  EXPECT(out[0] == 3.0f && out[kN - 1] == 3.0f);
  EXPECT(wia_destroy_communicator(comm) == WIA_SUCCESS);
  return 0;
}

// Forks nranks processes running body; their exit statuses (-1 if killed
// at the deadline). variant: 0 body, 1 and 2 across_hosts_body (2 flat),
// 3 and 4 link_codec_body (3 expecting the codec); 1-4 on two faked hosts;
// 5 keys_differ_body.
std::vector<int> run(int nranks, const char* transport, int variant = 0,
                     const std::string& extra_yaml = "") {
  char cfg[] = "/tmp/wia-compress-proc-XXXXXX.yaml";
  const int fd = mkstemps(cfg, 5);
  const std::string yaml = "host:\n  devices: 1\ncollectives:\n  timeout_ms: 20000\n" + extra_yaml;
  REQUIRE(fd >= 0);
  REQUIRE(write(fd, yaml.data(), yaml.size()) == static_cast<ssize_t>(yaml.size()));
  close(fd);
  char idp[] = "/tmp/wia-compress-id-XXXXXX";
  const int fd2 = mkstemp(idp);
  close(fd2);
  std::remove(idp);
  std::vector<pid_t> pids;
  for (int r = 0; r < nranks; ++r) {
    const pid_t pid = fork();
    if (pid == 0) {
      if (transport) setenv("WIA_TRANSPORT", transport, 1);
      if (variant >= 1 && variant <= 4)
        setenv("WIA_HOSTID", r < nranks / 2 ? "hostA" : "hostB", 1);
      if (variant == 5 && r == 1) setenv("WIA_COMPRESSION_PIPELINE_SEGMENT_BYTES", "4096", 1);
      if (variant == 2) setenv("WIA_COMPRESSION_ACROSS_HOSTS", "false", 1);
      if (wia_init_with_config(cfg) != WIA_SUCCESS) _exit(11);
      const int rc = variant == 5 ? keys_differ_body(r, nranks, idp)
                     : variant >= 3 ? link_codec_body(r, nranks, idp, variant == 3)
                     : variant    ? across_hosts_body(r, nranks, idp, variant == 2)
                                  : body(r, nranks, idp);
      wia_finalize();
      _exit(rc);
    }
    pids.push_back(pid);
  }
  std::vector<int> st(nranks, -999);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  for (int left = nranks; left > 0;) {
    for (int r = 0; r < nranks; ++r) {
      int s = 0;
      if (st[r] == -999 && waitpid(pids[r], &s, WNOHANG) == pids[r])
        st[r] = WIFEXITED(s) ? WEXITSTATUS(s) : -WTERMSIG(s), --left;
    }
    if (left > 0 && std::chrono::steady_clock::now() > deadline) {
      for (int r = 0; r < nranks; ++r)
        if (st[r] == -999) kill(pids[r], SIGKILL), waitpid(pids[r], nullptr, 0), st[r] = -1;
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  std::remove(cfg);
  std::remove(idp);
  return st;
}

}  // namespace

TEST_CASE("compressed and sparse all-reduce across 2 and 4 processes over shm and tcp") {
  for (const char* transport : {"shm", "tcp"})
    for (int n : {2, 4}) {
      INFO(transport << " with " << n << " processes");
      const auto st = run(n, transport);
      for (int r = 0; r < n; ++r) {
        INFO("rank " << r);
        CHECK(st[r] == 0);
      }
    }
}

TEST_CASE("across two hosts: dense inside a host, compressed between hosts") {
  for (const int variant : {1, 2}) {
    INFO((variant == 1 ? "across hosts" : "flat (compression.across_hosts false)"));
    const auto st = run(4, nullptr, variant);
    for (int r = 0; r < 4; ++r) {
      INFO("rank " << r);
      CHECK(st[r] == 0);
    }
  }
}

TEST_CASE(
    "compression between hosts as a link property: auto, or a selector rule, compresses a slow "
    "link only") {
  char tmpl[] = "/tmp/wia-link-codec-XXXXXX";
  REQUIRE(mkdtemp(tmpl) != nullptr);
  for (const double between : {0.125, 100.0}) {
    INFO(between << " GB/s between the hosts");
    const std::string links = std::string(tmpl) + "/links.yaml";
    FILE* f = std::fopen(links.c_str(), "w");
    REQUIRE(f != nullptr);
    std::fprintf(f,
                 "nodes:\n  - {name: a, devices: [\"r0:host0\", \"r1:host0\"]}\n"
                 "  - {name: b, devices: [\"r2:host0\", \"r3:host0\"]}\n"
                 "links:\n  - {between: intra_node, type: shared_memory, bandwidth_gbps: 20, "
                 "latency_us: 1}\n"
                 "  - {between: inter_node, type: ethernet_100g, bandwidth_gbps: %g, "
                 "latency_us: 50}\n",
                 between);
    std::fclose(f);
    const std::string files = "tuner:\n  link_file: " + links + "\n";
    const auto st = run(4, nullptr, between < 1 ? 3 : 4,
                        files + "compression:\n  link_codec: auto\n");
    for (int r = 0; r < 4; ++r) {
      INFO("rank " << r);
      CHECK(st[r] == 0);
    }
    // The same from a selector rule's compress key for the links between
    // nodes: int8 when the link is slower than 10 GB/s.
    const std::string rule =
        "selector:\n  rules:\n    - match: different_nodes\n      transports: [tcp]\n"
        "      compress: {method: int8, when: \"bandwidth < 10GB/s\"}\n";
    const auto by_rule = run(4, nullptr, between < 1 ? 3 : 4, files + rule);
    for (int r = 0; r < 4; ++r) {
      INFO("selector rule, rank " << r);
      CHECK(by_rule[r] == 0);
    }
  }
  std::remove((std::string(tmpl) + "/links.yaml").c_str());
  rmdir(tmpl);
}

TEST_CASE("ranks whose compression keys differ: compressed calls fail on every rank, naming them") {
  const auto st = run(2, "shm", 5);
  for (int r = 0; r < 2; ++r) {
    INFO("rank " << r);
    CHECK(st[r] == 0);
  }
}
