// SPDX-License-Identifier: Apache-2.0
// wia-bw: bandwidth and latency of every ordered pair, as four matrices
// (GB/s uni, GB/s bidi, us 4 KiB, us 1 MiB), and optionally as a topology
// file with the measured figures (docs/topology.md "Bandwidth benchmark").
//
// Two kinds of pairs:
//  - devices of this process (default): peer copies through
//    wia_benchmark_bandwidth (spec 6.2.2);
//  - ranks of a job (--procs N spawns N local processes, --procs-from-env
//    joins a launcher's job): point-to-point send/recv on a process
//    communicator, one pair at a time while the other ranks wait in a
//    barrier. Latency = half a ping-pong's round trip; unidirectional = one
//    message of --bytes and a 1-byte acknowledgement; bidirectional = one
//    message each way at once (the reverse direction on a second
//    communicator split from the first, so the two do not queue behind
//    each other). Rank 0 prints the matrices with each rank's host and each
//    link's transport, and over tcp the socket-path share the cost model
//    prices loopback tcp with (one way / both ways together).
//
// --output FILE writes each link's bandwidth_gbps = unidirectional GB/s and
// latency_us = alpha fitted through the 4 KiB and 1 MiB points, over the
// discovered devices, or one device per rank (node = host) across
// processes. wia-info --topology-file shows it, --topology-diff compares a
// declared topology with it, and tuner.link_file (WIA_TUNER_LINK_FILE)
// gives it to communicators and to wia_discover_topology.
#include <fmt/core.h>
#include <wia/topology.h>
#include <wia/wia.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "common/error.hpp"
#include "discovery/discovery.hpp"
#include "tool_ranks.hpp"
#include "topology/topology.hpp"
#include "tuner/cost_model.hpp"
#include "wia_common/text.hpp"

namespace {

using Clock = std::chrono::steady_clock;

constexpr std::size_t kSmall = 4 << 10;  // latency points, as wia_benchmark_bandwidth
constexpr std::size_t kLarge = 1 << 20;
constexpr std::size_t kDefaultBytes = 32 << 20;
// Across processes a ping-pong is microseconds and its single samples
// vary by 10x on this machine (a descheduled peer), so the latency median
// needs many more samples than the bandwidth one.
constexpr int kWarmup = 5;
constexpr int kLatencyRepeats = 100;
constexpr int kBandwidthRepeats = 5;

struct Options {
  std::string output;  // "" = no file
  int procs = 0;
  bool procs_from_env = false;
  std::size_t bytes = 0;  // 0 = default
  int repeats = 0;        // 0 = defaults (100 latency, 5 bandwidth)
};

void usage(FILE* out) {
  std::fputs(
      "usage: wia-bw [--output FILE] [--procs N | --procs-from-env] [--bytes SIZE]\n"
      "              [--repeats N] [--help]\n"
      "  Measures every ordered pair (2 warm-up runs, then medians): unidirectional and\n"
      "  bidirectional GB/s, latency of a 4 KiB and a 1 MiB message in us (one way).\n"
      "  Pairs of this process's devices (default): peer copies of 32 MiB\n"
      "    (wia_benchmark_bandwidth); WIA_HOST_DEVICES=N for N host devices.\n"
      "  --procs N        pairs of ranks: spawn N processes on this machine, one rank each,\n"
      "                   over a process communicator (shm inside a node, tcp between\n"
      "                   nodes; WIA_TRANSPORT=tcp forces one); point-to-point send/recv,\n"
      "                   one pair at a time, the other ranks idle\n"
      "  --procs-from-env the same, as one rank of a job started by mpirun, srun, torchrun\n"
      "                   or WIA_RANK/WIA_WORLD_SIZE/WIA_ROOT_ADDR (docs/processes.md)\n"
      "  --bytes SIZE     across processes: message size for GB/s (default 32M; K, M, G)\n"
      "  --repeats N      across processes: timed repeats of every figure (default 100\n"
      "                   for latency, 5 for GB/s)\n"
      "  --output FILE    write a topology file with the measured links (bandwidth_gbps =\n"
      "                   unidirectional, latency_us = alpha fitted through 4 KiB and\n"
      "                   1 MiB; one device per rank across processes) for tuner.link_file /\n"
      "                   WIA_TUNER_LINK_FILE (communicators, wia_discover_topology)\n",
      out);
}

[[noreturn]] void usage_error(const std::string& why) {
  std::fprintf(stderr, "wia-bw: %s\n", why.c_str());
  usage(stderr);
  std::exit(2);
}

// --bytes: the project's one size grammar (wia_common/text.hpp), at least 1.
std::size_t bytes_arg(const std::string& s) {
  std::uint64_t bytes = 0;
  std::string why;
  if (!wia::common::parse_size(s, &bytes, &why))
    usage_error("--bytes: '" + s + "' is not a size (" + why + "; e.g. 65536, 256K, 32M)");
  if (bytes == 0) usage_error("--bytes: '" + s + "' is not a size (e.g. 65536, 256K, 32M)");
  return static_cast<std::size_t>(bytes);
}

int parse_int(const std::string& option, const std::string& s, int lo, int hi) {
  char* end = nullptr;
  const long v = std::strtol(s.c_str(), &end, 10);
  if (end == s.c_str() || *end != '\0' || v < lo || v > hi)
    usage_error(fmt::format("{} must be {}..{}, got '{}'", option, lo, hi, s));
  return static_cast<int>(v);
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) usage_error(a + " needs a value");
      return argv[++i];
    };
    if (a == "--output")
      o.output = next();
    else if (a == "--procs")
      o.procs = parse_int(a, next(), 2, 256);
    else if (a == "--procs-from-env")
      o.procs_from_env = true;
    else if (a == "--bytes")
      o.bytes = bytes_arg(next());
    else if (a == "--repeats")
      o.repeats = parse_int(a, next(), 1, 10000);
    else if (a == "--help" || a == "-h")
      usage(stdout), std::exit(0);
    else
      usage_error("unknown option '" + a + "'");
  }
  if (o.procs > 0 && o.procs_from_env)
    usage_error("--procs and --procs-from-env exclude each other");
  return o;
}

// The four matrices, labelled `prefix`0, `prefix`1, ...
void print_matrices(int n, const char* prefix, const std::string& bw_title,
                    const std::vector<wia_bandwidth_benchmark_t>& m) {
  const auto un = static_cast<std::size_t>(n);
  auto matrix = [&](const std::string& title, auto cell) {
    fmt::print("{}\n{:>8}", title, "");
    for (int b = 0; b < n; ++b) fmt::print("{:>10}", fmt::format("{}{}", prefix, b));
    fmt::print("\n");
    for (int a = 0; a < n; ++a) {
      fmt::print("{:>8}", fmt::format("{}{}", prefix, a));
      for (int b = 0; b < n; ++b)
        fmt::print("{:>10}",
                   a == b ? std::string("-")
                          : fmt::format("{:.2f}", cell(m[static_cast<std::size_t>(a) * un + b])));
      fmt::print("\n");
    }
    fmt::print("\n");
  };
  matrix("Unidirectional (GB/s, " + bw_title + "):",
         [](const auto& x) { return x.unidirectional_gbps; });
  matrix("Bidirectional (GB/s, " + bw_title + " each way, both ways together):",
         [](const auto& x) { return x.bidirectional_gbps; });
  matrix("Latency 4 KiB (us):", [](const auto& x) { return x.latency_small; });
  matrix("Latency 1 MiB (us):", [](const auto& x) { return x.latency_large; });
}

std::string size_name(std::size_t bytes) {
  if (bytes % (1 << 20) == 0) return fmt::format("{} MiB", bytes >> 20);
  if (bytes % (1 << 10) == 0) return fmt::format("{} KiB", bytes >> 10);
  return fmt::format("{} B", bytes);
}

// Over tcp links: the share of one direction's time a message takes on each
// end's socket path when a message goes each way at once (one way /
// both ways together), the figure the cost model prices loopback tcp with
// (tuner::kLoopbackTcpSocketShare; docs/collectives.md, "How the model is
// calibrated"). Nothing when no link is tcp.
void print_socket_share(int n, const wia_topology_t& topo,
                        const std::vector<wia_bandwidth_benchmark_t>& m) {
  double lo = 0, hi = 0;
  for (int a = 0; a < n; ++a)
    for (int b = 0; b < n; ++b) {
      const auto& x = m[static_cast<std::size_t>(a) * static_cast<std::size_t>(n) + b];
      if (a == b || std::string(topo.link_type[a][b]) != "tcp" || !(x.bidirectional_gbps > 0))
        continue;
      const double share = x.unidirectional_gbps / x.bidirectional_gbps;
      lo = lo == 0 ? share : std::min(lo, share);
      hi = std::max(hi, share);
    }
  if (hi == 0) return;
  fmt::print(
      "tcp socket-path share per message (one way / both ways together): {:.2f} - {:.2f} "
      "(the cost model's: {:.2f})\n\n",
      lo, hi, wia::tuner::kLoopbackTcpSocketShare);
}

// ---- devices of this process ------------------------------------------------

int run_devices(const Options& o) {
  int n = 0;
  if (wia_get_device_count(&n) != WIA_SUCCESS) {
    std::fprintf(stderr, "wia-bw: %s\n", wia_get_last_error());
    return 1;
  }
  if (n < 2) {
    std::fprintf(stderr,
                 "wia-bw: %d device(s); at least 2 are needed (e.g. WIA_HOST_DEVICES=2, or "
                 "--procs 2 for pairs of processes)\n",
                 n);
    return 1;
  }
  const auto un = static_cast<std::size_t>(n);
  std::vector<wia_bandwidth_benchmark_t> m(un * un);
  for (int a = 0; a < n; ++a)
    for (int b = 0; b < n; ++b) {
      if (a == b) continue;
      if (wia_benchmark_bandwidth(a, b, &m[static_cast<std::size_t>(a) * un + b]) != WIA_SUCCESS) {
        std::fprintf(stderr, "wia-bw: device %d -> %d: %s\n", a, b, wia_get_last_error());
        return 1;
      }
    }
  print_matrices(n, "d", "32 MiB", m);

  if (!o.output.empty()) {
    try {
      wia::topo::Topology t = wia::discovery::discover_topology();
      if (t.n != n) throw wia::Error(WIA_ERROR_INTERNAL, "device count changed during the run");
      for (int a = 0; a < n; ++a)
        for (int b = 0; b < n; ++b) {
          if (a == b) continue;
          const auto& x = m[static_cast<std::size_t>(a) * un + b];
          t.bandwidth[t.at(a, b)] = x.unidirectional_gbps;
          t.latency[t.at(a, b)] = wia::discovery::alpha_from(x);
        }
      wia::topo::export_yaml(t, o.output);
      fmt::print("wrote {} (bandwidth_gbps = unidirectional, latency_us = fitted alpha)\n",
                 o.output);
    } catch (const wia::Error& e) {
      std::fprintf(stderr, "wia-bw: %s\n", e.what());
      return 1;
    }
  }
  wia_finalize();
  return 0;
}

// ---- ranks of a job -----------------------------------------------------------

// A failed call ends this rank; its peers then see the broken communicator
// (or its exit) and fail within their timeout, and the spawner reports it.
class RankError {
 public:
  std::string what;
};

void check(wia_status_t st, int rank, const std::string& what) {
  if (st != WIA_SUCCESS)
    throw RankError{fmt::format("rank {}: {}: {}: {}", rank, what, wia_status_string(st),
                                wia_get_last_error())};
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// One rank's side of the measurements. `data` carries every measured
// message; `back` only the reverse direction of the bidirectional run, so
// that it does not wait behind the forward one (a process communicator runs
// its operations in posting order). Barriers run on `world`, where no
// point-to-point traffic is posted: its collectives stay in step on every
// rank while only two ranks exchange messages on `data`.
class PairBench {
 public:
  PairBench(wia_communicator_t world, const Options& o)
      : world_(world),
        me_(wia_comm_rank(world)),
        bytes_(o.bytes ? o.bytes : kDefaultBytes),
        latency_repeats_(o.repeats ? o.repeats : kLatencyRepeats),
        bandwidth_repeats_(o.repeats ? o.repeats : kBandwidthRepeats) {
    check(wia_comm_split(world_, 0, me_, &data_), me_, "wia_comm_split (data)");
    check(wia_comm_split(world_, 0, me_, &back_), me_, "wia_comm_split (reverse direction)");
    check(wia_create_stream(&forward_stream_), me_, "wia_create_stream");
    check(wia_create_stream(&back_stream_), me_, "wia_create_stream");
    const std::size_t cap = std::max(bytes_, kLarge);
    check(wia_malloc(&send_, cap), me_, fmt::format("wia_malloc({} B)", cap));
    check(wia_malloc(&recv_, cap), me_, fmt::format("wia_malloc({} B)", cap));
    std::memset(send_, 0x5a, cap);  // fault the pages in outside the timing
    std::memset(recv_, 0, cap);
  }
  ~PairBench() {
    wia_free(send_);
    wia_free(recv_);
    if (forward_stream_) wia_destroy_stream(forward_stream_);
    if (back_stream_) wia_destroy_stream(back_stream_);
    if (back_) wia_destroy_communicator(back_);
    if (data_) wia_destroy_communicator(data_);
  }
  PairBench(const PairBench&) = delete;
  PairBench& operator=(const PairBench&) = delete;

  wia_communicator_t data() const { return data_; }
  std::size_t bytes() const { return bytes_; }

  void barrier() {
    std::int32_t token = 1;
    wia_collective_config_t cfg{};
    cfg.operation = WIA_COLLECTIVE_ALLREDUCE;
    cfg.datatype = WIA_INT32;
    cfg.reduction_op = WIA_REDUCE_SUM;
    check(wia_all_reduce(world_, &token, &token, 1, &cfg, nullptr), me_, "barrier");
    check(wia_stream_synchronize(nullptr), me_, "barrier");
  }

  // Sums every rank's rows into every rank (only the measuring rank of a
  // pair wrote its cell).
  void sum(std::vector<double>& v) {
    wia_collective_config_t cfg{};
    cfg.operation = WIA_COLLECTIVE_ALLREDUCE;
    cfg.datatype = WIA_FLOAT64;
    cfg.reduction_op = WIA_REDUCE_SUM;
    check(wia_all_reduce(world_, v.data(), v.data(), v.size(), &cfg, nullptr), me_,
          "gathering the results");
    check(wia_stream_synchronize(nullptr), me_, "gathering the results");
  }

  // The pair (me, peer) with me measuring; the peer calls serve(me).
  wia_bandwidth_benchmark_t measure(int peer) {
    wia_bandwidth_benchmark_t r{};
    r.latency_small = run(peer, true, &PairBench::ping_pong, kSmall, latency_repeats_) / 2;
    r.latency_large = run(peer, true, &PairBench::ping_pong, kLarge, latency_repeats_) / 2;
    r.unidirectional_gbps =
        bytes_ / 1e3 / run(peer, true, &PairBench::one_way, bytes_, bandwidth_repeats_);
    r.bidirectional_gbps =
        2 * bytes_ / 1e3 / run(peer, true, &PairBench::both_ways, bytes_, bandwidth_repeats_);
    return r;
  }
  void serve(int peer) {
    run(peer, false, &PairBench::ping_pong, kSmall, latency_repeats_);
    run(peer, false, &PairBench::ping_pong, kLarge, latency_repeats_);
    run(peer, false, &PairBench::one_way, bytes_, bandwidth_repeats_);
    run(peer, false, &PairBench::both_ways, bytes_, bandwidth_repeats_);
  }

 private:
  using Step = void (PairBench::*)(int peer, bool measuring, std::size_t bytes);

  // Warm-up, then the median of `repeats` timed steps, in us (as seen by
  // the measuring rank; 0 on the other).
  double run(int peer, bool measuring, Step step, std::size_t bytes, int repeats) {
    std::vector<double> us;
    for (int i = 0; i < kWarmup + repeats; ++i) {
      const auto t0 = Clock::now();
      (this->*step)(peer, measuring, bytes);
      if (i >= kWarmup)
        us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
    }
    return median(us);
  }

  void send(wia_communicator_t c, const void* buf, std::size_t n, int peer, wia_stream_t s) {
    check(wia_comm_send(c, buf, n, WIA_UINT8, peer, s), me_,
          fmt::format("send of {} B to rank {}", n, peer));
  }
  void recv(wia_communicator_t c, void* buf, std::size_t n, int peer, wia_stream_t s) {
    check(wia_comm_recv(c, buf, n, WIA_UINT8, peer, s), me_,
          fmt::format("receive of {} B from rank {}", n, peer));
  }
  void sync(wia_stream_t s) { check(wia_stream_synchronize(s), me_, "wia_stream_synchronize"); }

  // n bytes there and `reply` bytes back; the measuring rank times it.
  void exchange(int peer, bool measuring, std::size_t n, std::size_t reply) {
    if (measuring) {
      send(data_, send_, n, peer, forward_stream_);
      recv(data_, recv_, reply, peer, forward_stream_);
    } else {
      recv(data_, recv_, n, peer, forward_stream_);
      send(data_, send_, reply, peer, forward_stream_);
    }
    sync(forward_stream_);
  }
  // There and back: the round trip.
  void ping_pong(int peer, bool measuring, std::size_t n) { exchange(peer, measuring, n, n); }
  // One message and a 1-byte acknowledgement: complete at the receiver.
  void one_way(int peer, bool measuring, std::size_t n) { exchange(peer, measuring, n, 1); }
  // A 1-byte ping-pong lines both ranks up (the untimed peer starts first,
  // by at most one small message), then one message each way at once.
  void both_ways(int peer, bool measuring, std::size_t n) {
    ping_pong(peer, measuring, 1);
    if (measuring) {
      send(data_, send_, n, peer, forward_stream_);
      recv(back_, recv_, n, peer, back_stream_);
    } else {
      recv(data_, recv_, n, peer, forward_stream_);
      send(back_, send_, n, peer, back_stream_);
    }
    sync(forward_stream_);
    sync(back_stream_);
  }

  wia_communicator_t world_;
  int me_;
  std::size_t bytes_;
  int latency_repeats_, bandwidth_repeats_;
  wia_communicator_t data_ = nullptr, back_ = nullptr;
  wia_stream_t forward_stream_ = nullptr, back_stream_ = nullptr;
  void* send_ = nullptr;
  void* recv_ = nullptr;
};

// "host/rank3:host0" -> "host0".
std::string device_of(const char* full) {
  const std::string s = full;
  const auto colon = s.rfind(':');
  return colon == std::string::npos ? s : s.substr(colon + 1);
}

std::string transport_of(const char* link_type) {
  const std::string t = link_type;
  return t == "shared_memory" ? "shm" : t;
}

int run_ranks(const Options& o) {
  wia::tools::default_one_device_per_process();
  wia_communicator_t world = nullptr;
  if (const wia_status_t st = wia::tools::join_job("wia-bw", &world); st != WIA_SUCCESS) {
    std::fprintf(stderr, "wia-bw: joining the job: %s: %s\n", wia_status_string(st),
                 wia_get_last_error());
    return 1;
  }
  const int me = wia_comm_rank(world), p = wia_comm_size(world);
  int rc = 0;
  wia_topology_t topo{};
  try {
    if (p < 2) throw RankError{fmt::format("the job has {} rank(s); pairs need at least 2", p)};
    PairBench bench(world, o);
    // Hosts and each link's transport, from the communicator that carries
    // the measured messages (before any of them: it is collective).
    check(wia_comm_discover_topology(bench.data(), &topo), me, "wia_comm_discover_topology");
    const auto up = static_cast<std::size_t>(p);
    std::vector<double> cells(up * up * 4, 0.0);
    for (int a = 0; a < p; ++a)
      for (int b = 0; b < p; ++b) {
        if (a == b) continue;
        bench.barrier();  // every other pair has finished
        if (me == a) {
          const wia_bandwidth_benchmark_t r = bench.measure(b);
          double* c = &cells[(static_cast<std::size_t>(a) * up + b) * 4];
          c[0] = r.unidirectional_gbps, c[1] = r.bidirectional_gbps;
          c[2] = r.latency_small, c[3] = r.latency_large;
        } else if (me == b) {
          bench.serve(a);
        }
      }
    bench.barrier();
    bench.sum(cells);
    if (me == 0) {
      std::vector<wia_bandwidth_benchmark_t> m(up * up);
      for (std::size_t k = 0; k < up * up; ++k)
        m[k] = {cells[4 * k], cells[4 * k + 1], cells[4 * k + 2], cells[4 * k + 3]};
      fmt::print(
          "# wia-bw: {} ranks (processes, one rank each), {} node(s); point-to-point "
          "send/recv on a process communicator, one pair at a time, the others idle\n",
          p, topo.num_nodes);
      fmt::print("Ranks:\n{:>8}  {:<24} {}\n", "", "host", "device");
      for (int r = 0; r < p; ++r)
        fmt::print("{:>8}  {:<24} {}\n", fmt::format("r{}", r),
                   topo.node_names[topo.node_of_device[r]], device_of(topo.device_names[r]));
      fmt::print("\nTransport per link:\n{:>8}", "");
      for (int b = 0; b < p; ++b) fmt::print("{:>10}", fmt::format("r{}", b));
      fmt::print("\n");
      for (int a = 0; a < p; ++a) {
        fmt::print("{:>8}", fmt::format("r{}", a));
        for (int b = 0; b < p; ++b)
          fmt::print("{:>10}", a == b ? std::string("-") : transport_of(topo.link_type[a][b]));
        fmt::print("\n");
      }
      fmt::print("\n");
      print_matrices(p, "r", size_name(bench.bytes()), m);
      print_socket_share(p, topo, m);
      if (!o.output.empty()) {
        for (int a = 0; a < p; ++a)
          for (int b = 0; b < p; ++b) {
            if (a == b) continue;
            const auto& x = m[static_cast<std::size_t>(a) * up + b];
            topo.bandwidth_gbps[a][b] = x.unidirectional_gbps;
            topo.latency_us[a][b] = wia::discovery::alpha_from(x);
          }
        check(wia_export_topology_yaml(&topo, o.output.c_str()), me,
              fmt::format("writing {}", o.output));
        fmt::print(
            "wrote {} (one device per rank; bandwidth_gbps = unidirectional, latency_us "
            "= fitted alpha)\n",
            o.output);
      }
      std::fflush(stdout);
    }
  } catch (const RankError& e) {
    std::fprintf(stderr, "wia-bw: %s\n", e.what.c_str());
    rc = 1;
  }
  wia_free_topology(&topo);
  wia_destroy_communicator(world);
  wia_finalize();
  return rc;
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  if (o.procs > 0) return wia::tools::spawn_local_ranks("wia-bw", o.procs, argc, argv);
  // Under a launcher (its variables set) without --procs-from-env too, as
  // wia-bench does.
  if (o.procs_from_env || wia::tools::launched_by_launcher()) return run_ranks(o);
  if (o.bytes != 0 || o.repeats != 0)
    usage_error(
        "--bytes and --repeats apply across processes (--procs, --procs-from-env); "
        "device pairs measure 32 MiB as wia_benchmark_bandwidth does");
  return run_devices(o);
}
