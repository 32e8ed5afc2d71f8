// SPDX-License-Identifier: Apache-2.0
// Level 5: collectives through the libwia core over the provider under
// test. Unlike L0-L4 this goes through the core's own loader, so it checks
// that the provider works for the runtime that will really drive it: the
// core loads only this provider (WIA_PROVIDER_PATH names the file,
// WIA_PROVIDERS_ENABLE its name), builds a communicator over its devices and
// runs every collective, checked against a reference computed here.
//
// Transport providers get a communicator of processes (forked ranks on
// host devices) whose links the core builds over the transport under test.
#include <wia/wia.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "harness.hpp"

namespace wia::conformance {
namespace {

constexpr int kMaxRanks = 8;
constexpr unsigned char kPoison = 0xCD;

std::string absolute(const std::string& path) {
  if (!path.empty() && path[0] == '/') return path;
  char* real = realpath(path.c_str(), nullptr);
  if (real == nullptr) return path;
  std::string out = real;
  std::free(real);
  return out;
}

std::string upper(std::string s) {
  for (char& ch : s) ch = ch == '.' || ch == '-' ? '_' : static_cast<char>(std::toupper(ch));
  return s;
}

// The core, initialised in this (test) process with only the provider under
// test, and the devices that provider contributes.
class CoreSession {
 public:
  explicit CoreSession(Context& c) : c_(c) {
    const std::string name = c.desc().name != nullptr ? c.desc().name : "";
    setenv("WIA_PROVIDER_PATH", absolute(c.options().provider_path).c_str(), 1);
    setenv("WIA_PROVIDERS_ENABLE", name.c_str(), 1);
    // --param KEY=VALUE reaches the core as WIA_<PROVIDER>_<KEY>.
    for (const auto& [key, value] : c.options().params)
      setenv(("WIA_" + upper(name) + "_" + upper(key)).c_str(), value.c_str(), 1);
    static const char* const kLevels[] = {"trace", "debug", "info", "warn", "error", "off"};
    const int level = static_cast<int>(c.options().log_level);
    setenv("WIA_LOG_LEVEL", kLevels[level >= 0 && level <= 5 ? level : 3], 0);
    c.step("wia_init (the core loads the provider)");
    const wia_status_t st = wia_init();
    if (st == WIA_ERROR_UNAVAILABLE)
      throw Skip(std::string("the core reports the provider unavailable: ") + wia_get_last_error());
    check(st, "wia_init with only this provider enabled");
    initialised_ = true;
    int n = 0;
    check(wia_get_device_count(&n), "wia_get_device_count");
    for (int d = 0; d < n; ++d) {
      wia_device_properties_t p{};
      check(wia_get_device_properties(d, &p), "wia_get_device_properties");
      if (name == p.provider && static_cast<int>(devices.size()) < kMaxRanks) devices.push_back(d);
    }
    if (devices.empty())
      throw Skip("the core sees no device of provider '" + name + "' (" + std::to_string(n) +
                 " devices in all)");
  }
  ~CoreSession() {
    if (initialised_) wia_finalize();
  }
  CoreSession(const CoreSession&) = delete;
  CoreSession& operator=(const CoreSession&) = delete;

  void check(wia_status_t st, const std::string& call) {
    if (st == WIA_SUCCESS) return;
    c_.fail("expected: WIA_SUCCESS from " + call + "\n     got: " + status_text(st) + ": " +
            wia_get_last_error());
  }

  std::vector<wia_device_t> devices;

 private:
  Context& c_;
  bool initialised_ = false;
};

// --- inputs and the reference --------------------------------------------------

// Element i of rank r: small integers, so float32 sums of up to 8 ranks are
// exact and any wrong or missing contribution shows.
float input_f32(int rank, std::uint64_t i) {
  return static_cast<float>(static_cast<int>((i * 7 + static_cast<std::uint64_t>(rank) * 13) % 23) -
                            11);
}
std::int32_t input_i32(int rank, std::uint64_t i) {
  return static_cast<std::int32_t>(
      static_cast<std::uint32_t>(i * 2654435761u + static_cast<std::uint64_t>(rank) * 40503u));
}

enum class Kind {
  kAllReduceSum,
  kAllReduceMax,
  kBroadcast,
  kReduce,
  kAllGather,
  kReduceScatter,
  kAllToAll
};

const char* kind_name(Kind k) {
  switch (k) {
    case Kind::kAllReduceSum:
      return "all_reduce(float32, sum)";
    case Kind::kAllReduceMax:
      return "all_reduce(int32, max)";
    case Kind::kBroadcast:
      return "broadcast(int32)";
    case Kind::kReduce:
      return "reduce(float32, sum)";
    case Kind::kAllGather:
      return "all_gather(int32)";
    case Kind::kReduceScatter:
      return "reduce_scatter(float32, sum)";
    case Kind::kAllToAll:
      return "all_to_all(int32)";
  }
  return "?";
}

bool is_f32(Kind k) {
  return k == Kind::kAllReduceSum || k == Kind::kReduce || k == Kind::kReduceScatter;
}

// Reference value of output element i on rank r, or false when rank r has
// no defined output there (reduce on a non-root).
bool expected(Kind kind, int p, int root, std::uint64_t count, int r, std::uint64_t i, double* f,
              std::int32_t* v) {
  switch (kind) {
    case Kind::kAllReduceSum:
    case Kind::kReduce: {
      if (kind == Kind::kReduce && r != root) return false;
      double sum = 0;
      for (int q = 0; q < p; ++q) sum += input_f32(q, i);
      *f = sum;
      return true;
    }
    case Kind::kAllReduceMax: {
      std::int32_t m = input_i32(0, i);
      for (int q = 1; q < p; ++q) m = std::max(m, input_i32(q, i));
      *v = m;
      return true;
    }
    case Kind::kBroadcast:
      *v = input_i32(root, i);
      return true;
    case Kind::kAllGather:
      *v = input_i32(static_cast<int>(i / count), i % count);
      return true;
    case Kind::kReduceScatter: {
      double sum = 0;
      for (int q = 0; q < p; ++q) sum += input_f32(q, static_cast<std::uint64_t>(r) * count + i);
      *f = sum;
      return true;
    }
    case Kind::kAllToAll:
      // Shard q received by r is shard r of q's input.
      *v =
          input_i32(static_cast<int>(i / count), static_cast<std::uint64_t>(r) * count + i % count);
      return true;
  }
  return false;
}

// One run of a collective over every rank with `count` elements per rank
// (per shard for all-to-all, per received block for reduce-scatter).
void run_one(Context& c, CoreSession& core, wia_communicator_t comm,
             const std::vector<wia_stream_t>& streams, Kind kind, std::uint64_t count) {
  const int p = static_cast<int>(core.devices.size());
  const std::size_t es = 4;  // float32 and int32
  std::uint64_t in_elems = count, out_elems = count;
  if (kind == Kind::kAllGather) out_elems = count * p;
  if (kind == Kind::kReduceScatter) in_elems = count * p;
  if (kind == Kind::kAllToAll) in_elems = out_elems = count * p;
  const int root = p - 1;
  const std::string what = std::string(kind_name(kind)) + " of " + std::to_string(count) +
                           " elements over " + std::to_string(p) + " rank(s)";
  c.step(what);

  std::vector<void*> in(p), out(p);
  std::vector<unsigned char> host;
  for (int r = 0; r < p; ++r) {
    const wia_device_t d = core.devices[r];
    core.check(wia_malloc_on(d, &in[r], in_elems * es),
               "wia_malloc_on(device " + std::to_string(d) + ", " + size_text(in_elems * es) + ")");
    core.check(
        wia_malloc_on(d, &out[r], out_elems * es),
        "wia_malloc_on(device " + std::to_string(d) + ", " + size_text(out_elems * es) + ")");
    host.assign(in_elems * es, 0);
    for (std::uint64_t i = 0; i < in_elems; ++i) {
      if (is_f32(kind)) {
        const float v = input_f32(r, i);
        std::memcpy(host.data() + i * es, &v, es);
      } else {
        const std::int32_t v = input_i32(r, i);
        std::memcpy(host.data() + i * es, &v, es);
      }
    }
    if (!host.empty())
      core.check(wia_memcpy(in[r], host.data(), host.size()), "wia_memcpy(host -> device)");
    if (out_elems > 0) core.check(wia_memset(out[r], kPoison, out_elems * es), "wia_memset");
  }

  wia_collective_config_t cfg{};
  cfg.timeout_ms = static_cast<std::uint32_t>(std::max(1000.0, c.ms_left() * 0.5));
  cfg.datatype = is_f32(kind) ? WIA_FLOAT32 : WIA_INT32;
  cfg.reduction_op = kind == Kind::kAllReduceMax ? WIA_REDUCE_MAX : WIA_REDUCE_SUM;
  std::vector<std::vector<void*>> sshards(p, std::vector<void*>(p)),
      rshards(p, std::vector<void*>(p));
  core.check(wia_group_start(), "wia_group_start");
  for (int r = 0; r < p; ++r) {
    wia_status_t st = WIA_SUCCESS;
    switch (kind) {
      case Kind::kAllReduceSum:
      case Kind::kAllReduceMax:
        cfg.operation = WIA_COLLECTIVE_ALLREDUCE;
        st = wia_all_reduce(comm, in[r], out[r], count, &cfg, streams[r]);
        break;
      case Kind::kBroadcast:
        cfg.operation = WIA_COLLECTIVE_BROADCAST;
        st = wia_broadcast_ex(comm, in[r], out[r], count, root, &cfg, streams[r]);
        break;
      case Kind::kReduce:
        cfg.operation = WIA_COLLECTIVE_REDUCE;
        st = wia_reduce(comm, in[r], out[r], count, root, &cfg, streams[r]);
        break;
      case Kind::kAllGather:
        cfg.operation = WIA_COLLECTIVE_ALLGATHER;
        st = wia_all_gather_ex(comm, in[r], out[r], count, &cfg, streams[r]);
        break;
      case Kind::kReduceScatter:
        cfg.operation = WIA_COLLECTIVE_REDUCE_SCATTER;
        st = wia_reduce_scatter(comm, in[r], out[r], count, &cfg, streams[r]);
        break;
      case Kind::kAllToAll:
        cfg.operation = WIA_COLLECTIVE_ALLTOALL;
        for (int j = 0; j < p; ++j) {
          sshards[r][j] = static_cast<unsigned char*>(in[r]) + j * count * es;
          rshards[r][j] = static_cast<unsigned char*>(out[r]) + j * count * es;
        }
        st = wia_all_to_all(comm, sshards[r].data(), rshards[r].data(), count, &cfg, streams[r]);
        break;
    }
    core.check(st, what + ", posted by rank " + std::to_string(r));
  }
  core.check(wia_group_end(), "wia_group_end");
  for (int r = 0; r < p; ++r)
    core.check(wia_stream_synchronize(streams[r]),
               "wia_stream_synchronize after " + what + " (rank " + std::to_string(r) + ")");

  for (int r = 0; r < p; ++r) {
    host.assign(out_elems * es, 0);
    if (!host.empty())
      core.check(wia_memcpy(host.data(), out[r], host.size()), "wia_memcpy(device -> host)");
    for (std::uint64_t i = 0; i < out_elems; ++i) {
      double f = 0;
      std::int32_t v = 0;
      if (!expected(kind, p, root, count, r, i, &f, &v)) break;
      if (is_f32(kind)) {
        float got = 0;
        std::memcpy(&got, host.data() + i * es, es);
        if (got != static_cast<float>(f))
          c.fail("expected: " + what + ": rank " + std::to_string(r) + " element " +
                 std::to_string(i) + " = " + std::to_string(f) +
                 "\n     got: " + std::to_string(got));
      } else {
        std::int32_t got = 0;
        std::memcpy(&got, host.data() + i * es, es);
        if (got != v)
          c.fail("expected: " + what + ": rank " + std::to_string(r) + " element " +
                 std::to_string(i) + " = " + std::to_string(v) +
                 "\n     got: " + std::to_string(got));
      }
    }
  }
  for (int r = 0; r < p; ++r) {
    core.check(wia_free(in[r]), "wia_free");
    core.check(wia_free(out[r]), "wia_free");
  }
}

// Counts: empty, one element, a prime (uneven splits over any rank count),
// and a larger prime that takes the chunked paths.
constexpr std::uint64_t kCounts[] = {0, 1, 1031, 65537};

void collective(Context& c, Kind kind) {
  CoreSession core(c);
  const int p = static_cast<int>(core.devices.size());
  wia_communicator_t comm = nullptr;
  const wia_status_t st = wia_create_communicator(core.devices.data(), p, &comm);
  // An optional capability the core's collectives rely on (host functions
  // on streams, for example) is not a conformance failure: say which.
  if (st == WIA_ERROR_NOT_SUPPORTED)
    throw Skip(std::string("the core cannot build a communicator over this provider: ") +
               wia_get_last_error());
  core.check(st, "wia_create_communicator over the provider's " + std::to_string(p) + " device(s)");
  std::vector<wia_stream_t> streams(p);
  for (int r = 0; r < p; ++r)
    core.check(wia_create_stream_on(core.devices[r], &streams[r]), "wia_create_stream_on");
  for (const std::uint64_t n : kCounts) run_one(c, core, comm, streams, kind, n);
  for (auto s : streams) core.check(wia_destroy_stream(s), "wia_destroy_stream");
  core.check(wia_destroy_communicator(comm), "wia_destroy_communicator");
}

// The L5 test of a transport provider: a communicator of three processes
// (forked, each joining through the launcher variables WIA_RANK /
// WIA_WORLD_SIZE / WIA_ROOT_ADDR) whose links the core must build over
// this transport (WIA_TRANSPORT), on host devices, then all-reduce,
// broadcast and all-gather at 0/1/1031/65537 elements, checked exactly.
// Each rank writes what went wrong to a pipe; the test reports the first.
int free_port() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  int port = 0;
  if (fd >= 0 && bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0)
    port = ntohs(a.sin_port);
  if (fd >= 0) close(fd);
  return port;
}

std::string transport_rank(const std::string& provider, const std::string& path, int rank,
                           int nranks, int port) {
  setenv("WIA_PROVIDER_PATH", path.c_str(), 1);
  setenv("WIA_PROVIDERS_ENABLE", ("host," + provider).c_str(), 1);
  setenv("WIA_TRANSPORT", provider.c_str(), 1);
  setenv("WIA_HOST_DEVICES", "1", 1);
  setenv("WIA_RANK", std::to_string(rank).c_str(), 1);
  setenv("WIA_WORLD_SIZE", std::to_string(nranks).c_str(), 1);
  setenv("WIA_LOCAL_RANK", std::to_string(rank).c_str(), 1);
  setenv("WIA_ROOT_ADDR", ("127.0.0.1:" + std::to_string(port)).c_str(), 1);
  setenv("WIA_COLLECTIVES_TIMEOUT_MS", "30000", 1);
  setenv("WIA_BOOTSTRAP_TIMEOUT_MS", "30000", 1);
  if (wia_init() != WIA_SUCCESS) return std::string("wia_init: ") + wia_get_last_error();
  wia_communicator_t comm = nullptr;
  const wia_status_t created = wia_create_distributed_communicator(nullptr, &comm);
  // No endpoint here (zero is a valid answer): not a conformance failure.
  if (created == WIA_ERROR_UNAVAILABLE)
    return std::string("SKIP:") + wia_get_last_error();
  if (created != WIA_SUCCESS)
    return std::string("wia_create_distributed_communicator: ") + wia_get_last_error();
  std::string error;
  for (const std::uint64_t n : kCounts) {
    std::vector<float> in(n * nranks + 1), out(n * nranks + 1, -1e9f);
    for (std::uint64_t i = 0; i < n; ++i) in[i] = input_f32(rank, i);
    wia_collective_config_t cfg{};
    cfg.datatype = WIA_FLOAT32;
    cfg.reduction_op = WIA_REDUCE_SUM;
    if (wia_all_reduce(comm, in.data(), out.data(), n, &cfg, nullptr) != WIA_SUCCESS ||
        wia_stream_synchronize(nullptr) != WIA_SUCCESS)
      return std::string("all-reduce: ") + wia_get_last_error();
    for (std::uint64_t i = 0; i < n && error.empty(); ++i) {
      float ref = 0;
      for (int q = 0; q < nranks; ++q) ref += input_f32(q, i);
      if (out[i] != ref)
        error = "all-reduce of " + std::to_string(n) + " float32: element " + std::to_string(i) +
                " is " + std::to_string(out[i]) + ", expected " + std::to_string(ref);
    }
    for (std::uint64_t i = 0; i < n; ++i) out[i] = rank == nranks - 1 ? input_f32(rank, i) : -1;
    if (wia_broadcast(comm, out.data(), n, nranks - 1, WIA_FLOAT32, nullptr) != WIA_SUCCESS ||
        wia_stream_synchronize(nullptr) != WIA_SUCCESS)
      return std::string("broadcast: ") + wia_get_last_error();
    for (std::uint64_t i = 0; i < n && error.empty(); ++i)
      if (out[i] != input_f32(nranks - 1, i))
        error = "broadcast of " + std::to_string(n) + " float32: element " + std::to_string(i) +
                " differs from the root's";
    cfg.operation = WIA_COLLECTIVE_ALLGATHER;
    if (wia_all_gather_ex(comm, in.data(), out.data(), n, &cfg, nullptr) != WIA_SUCCESS ||
        wia_stream_synchronize(nullptr) != WIA_SUCCESS)
      return std::string("all-gather: ") + wia_get_last_error();
    for (int q = 0; q < nranks && error.empty(); ++q)
      for (std::uint64_t i = 0; i < n && error.empty(); ++i)
        if (out[q * n + i] != input_f32(q, i))
          error = "all-gather of " + std::to_string(n) + " float32: block of rank " +
                  std::to_string(q) + " element " + std::to_string(i) + " is wrong";
    if (!error.empty()) break;
  }
  if (wia_destroy_communicator(comm) != WIA_SUCCESS && error.empty())
    error = std::string("wia_destroy_communicator: ") + wia_get_last_error();
  wia_finalize();
  return error;
}

void transport_collectives(Context& c) {
  const std::string name = c.desc().name != nullptr ? c.desc().name : "";
  const std::string path = absolute(c.options().provider_path);
  constexpr int kRanks = 3;
  // A transport absent here (init answers WIA_ERROR_UNAVAILABLE: no device)
  // is SKIP with its reason, as at L4. init and fini run before the ranks
  // fork, so no provider thread crosses a fork.
  c.init();
  c.fini();
  // --param KEY=VALUE reaches the ranks' core as WIA_<PROVIDER>_<KEY>.
  for (const auto& [key, value] : c.options().params)
    setenv(("WIA_" + upper(name) + "_" + upper(key)).c_str(), value.c_str(), 1);
  const int port = free_port();
  if (port == 0) c.fail("could not find a free loopback port for the bootstrap root");
  c.step("fork 3 ranks joining one communicator over " + name);
  std::vector<pid_t> pids;
  std::vector<int> fds;
  for (int r = 0; r < kRanks; ++r) {
    int fd[2];
    if (pipe(fd) != 0) c.fail("pipe failed");
    const pid_t pid = fork();
    if (pid == 0) {
      close(fd[0]);
      const std::string err = transport_rank(name, path, r, kRanks, port);
      if (!err.empty() && write(fd[1], err.data(), err.size()) < 0) _exit(3);
      _exit(err.empty() ? 0 : 1);
    }
    close(fd[1]);
    pids.push_back(pid);
    fds.push_back(fd[0]);
  }
  std::string first, skip;
  for (int r = 0; r < kRanks; ++r) {
    std::string text;
    char buf[512];
    ssize_t n;
    while ((n = read(fds[r], buf, sizeof(buf))) > 0) text.append(buf, static_cast<std::size_t>(n));
    close(fds[r]);
    int st = 0;
    waitpid(pids[r], &st, 0);
    if (text.rfind("SKIP:", 0) == 0) {
      skip = text.substr(5);
      continue;
    }
    if (first.empty() && !(WIFEXITED(st) && WEXITSTATUS(st) == 0))
      first = "rank " + std::to_string(r) + ": " +
              (text.empty() ? (WIFSIGNALED(st) ? "killed by signal " + std::to_string(WTERMSIG(st))
                                               : "exited with " + std::to_string(WEXITSTATUS(st)))
                            : text);
  }
  if (first.empty() && !skip.empty())
    throw Skip("the core cannot build links over this transport here: " + skip);
  if (!first.empty()) c.fail("expected: every rank's collectives over " + name + " correct\n     got: " + first);
}

}  // namespace

void register_l5_tests(const wia_provider_v1_t* desc) {
  auto add = [](const char* id, int timeout_ms, const char* what, Kind kind) {
    registry().push_back(
        {id, 5, timeout_ms, what, [kind](Context& c) { collective(c, kind); }, {}});
  };
  if ((desc->caps & WIA_PROVIDER_CAP_DEVICE) != 0) {
    add("L5.coll.all_reduce.sum_f32", 60000,
        "all-reduce float32 sum over the provider's devices, 0/1/1031/65537 elements",
        Kind::kAllReduceSum);
    add("L5.coll.all_reduce.max_i32", 60000, "all-reduce int32 max, same counts",
        Kind::kAllReduceMax);
    add("L5.coll.broadcast", 60000, "broadcast int32 from the last rank, same counts",
        Kind::kBroadcast);
    add("L5.coll.reduce", 60000, "reduce float32 sum to the last rank, same counts", Kind::kReduce);
    add("L5.coll.all_gather", 60000, "all-gather int32, same counts per rank", Kind::kAllGather);
    add("L5.coll.reduce_scatter", 60000, "reduce-scatter float32 sum, same counts per rank",
        Kind::kReduceScatter);
    add("L5.coll.all_to_all", 60000, "all-to-all int32, same counts per shard", Kind::kAllToAll);
  }
  if ((desc->caps & WIA_PROVIDER_CAP_TRANSPORT) != 0)
    registry().push_back({"L5.transport.collectives", 5, 120000,
                          "collectives of a process communicator over this transport",
                          transport_collectives, {}});
}

}  // namespace wia::conformance
