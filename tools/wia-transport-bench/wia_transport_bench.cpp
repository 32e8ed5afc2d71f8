// SPDX-License-Identifier: Apache-2.0
// wia-transport-bench: point-to-point latency and bandwidth of any
// transport provider, through the provider ABI only.
//
//   wia-transport-bench --provider tcp --sizes 8:64M
//
// The program forks its second process itself. Each process loads the
// provider through the core's registry (so YAML/WIA_CONFIG and WIA_<NAME>_*
// variables apply, e.g. WIA_TCP_STREAMS=4); rank 0 listens, hands the
// handle to rank 1 through a pipe, and accepts. Per size it reports:
//  - latency: half of the median round trip of a ping-pong;
//  - bandwidth: rank 0 streams messages with a window of outstanding sends,
//    rank 1 acknowledges the last one with a zero-byte message; GB/s =
//    bytes / time (10^9 bytes per second), median of --repeats runs.
#include <sched.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/error.hpp"
#include "config/config.hpp"
#include "provider/registry.hpp"
#include "wia_common/text.hpp"

namespace {

using Clock = std::chrono::steady_clock;

struct Options {
  std::string provider;
  std::uint64_t min_size = 8, max_size = 64ull << 20;
  int factor = 2;
  std::string endpoint;  // name or index; empty = first intra-node endpoint
  int window = 4;
  int repeats = 3;
  double seconds_per_size = 0.2;  // measurement budget that sizes the iteration count
  int timeout_s = 60;
  std::map<std::string, std::string> params;
  std::vector<int> cpus;  // --cpus A,B: rank r runs on cpus[r]; empty = unbound
};

[[noreturn]] void usage(const char* why) {
  if (why != nullptr) std::fprintf(stderr, "wia-transport-bench: %s\n\n", why);
  std::fprintf(stderr,
               "usage: wia-transport-bench --provider NAME [--sizes MIN:MAX] [--factor F]\n"
               "         [--endpoint NAME|INDEX] [--window W] [--repeats R] [--time S]\n"
               "         [--param KEY=VALUE]... [--timeout S] [--cpus A,B]\n"
               "  --sizes     message sizes, e.g. 8:64M (default), powers of --factor (2)\n"
               "  --endpoint  endpoint by name or index (default: the first intra-node one)\n"
               "  --window    outstanding sends in the bandwidth test (default 4)\n"
               "  --repeats   bandwidth runs per size, the median is shown (default 3)\n"
               "  --time      seconds of traffic per size and test, roughly (default 0.2)\n"
               "  --param     provider parameter, as in its YAML section (e.g. streams=4)\n"
               "  --cpus      rank 0 runs on CPU A, rank 1 on CPU B, bound once the provider\n"
               "              is loaded (a library's constructor may reset the mask before)\n");
  std::exit(2);
}

// A size option: the project's one size grammar (wia_common/text.hpp).
std::uint64_t size_arg(const std::string& text) {
  std::uint64_t bytes = 0;
  std::string why;
  if (!wia::common::parse_size(text, &bytes, &why))
    usage(("bad size '" + text + "': " + why).c_str());
  return bytes;
}

Options parse_args(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage((a + " needs a value").c_str());
      return argv[++i];
    };
    if (a == "--provider")
      o.provider = value();
    else if (a == "--sizes") {
      const std::string v = value();
      const auto colon = v.find(':');
      o.min_size = size_arg(v.substr(0, colon));
      o.max_size = colon == std::string::npos ? o.min_size : size_arg(v.substr(colon + 1));
    } else if (a == "--factor")
      o.factor = std::atoi(value().c_str());
    else if (a == "--endpoint")
      o.endpoint = value();
    else if (a == "--window")
      o.window = std::atoi(value().c_str());
    else if (a == "--repeats")
      o.repeats = std::atoi(value().c_str());
    else if (a == "--time")
      o.seconds_per_size = std::atof(value().c_str());
    else if (a == "--timeout")
      o.timeout_s = std::atoi(value().c_str());
    else if (a == "--param") {
      const std::string v = value();
      const auto eq = v.find('=');
      if (eq == std::string::npos) usage("--param needs KEY=VALUE");
      o.params[v.substr(0, eq)] = v.substr(eq + 1);
    } else if (a == "--cpus") {
      const std::string v = value();
      int a0 = -1, a1 = -1;
      char end = 0;
      if (std::sscanf(v.c_str(), "%d,%d%c", &a0, &a1, &end) != 2 || a0 < 0 || a1 < 0 ||
          a0 >= CPU_SETSIZE || a1 >= CPU_SETSIZE)
        usage(("--cpus needs two CPU numbers A,B, not '" + v + "'").c_str());
      o.cpus = {a0, a1};
    } else if (a == "-h" || a == "--help")
      usage(nullptr);
    else
      usage(("unknown option " + a).c_str());
  }
  if (o.provider.empty()) usage("--provider is required");
  if (o.factor < 2 || o.window < 1 || o.repeats < 1 || o.min_size > o.max_size)
    usage("bad --factor, --window, --repeats or --sizes");
  return o;
}

[[noreturn]] void die(int rank, const std::string& what) {
  std::fprintf(stderr, "wia-transport-bench (rank %d): %s\n", rank, what.c_str());
  std::exit(1);
}

// One process's view: the loaded provider and its connection to the peer.
class Rank {
 public:
  Rank(const Options& o, int rank) : o_(o), rank_(rank) {
    std::string yaml = "providers:\n  enable: [" + o.provider + "]\n";
    if (!o.params.empty()) {
      yaml += o.provider + ":\n";
      for (const auto& [k, v] : o.params) yaml += "  " + k + ": \"" + v + "\"\n";
    }
    try {
      config_ = std::make_unique<wia::Config>(wia::Config::parse(yaml, "wia-transport-bench"));
      registry_ = wia::ProviderRegistry::load(*config_);
    } catch (const wia::Error& e) {
      die(rank, e.what());
    }
    provider_ = registry_->find(o.provider);
    if (provider_ == nullptr || provider_->transport() == nullptr)
      die(rank, "provider " + o.provider + " offers no transport");
    ops_ = provider_->transport();
    ctx_ = provider_->ctx();
    endpoint_ = pick_endpoint();
  }

  ~Rank() {
    if (conn_ != nullptr) ops_->close(ctx_, conn_);
  }

  std::string endpoint_text() const {
    return endpoint_name_ + " (endpoint " + std::to_string(endpoint_) + ")";
  }

  void listen_and_accept(int handle_out) {
    char handle[WIA_TRANSPORT_HANDLE_SIZE];
    wia_listener_t l = nullptr;
    check(ops_->listen(ctx_, endpoint_, handle, &l), "listen");
    if (::write(handle_out, handle, sizeof(handle)) != static_cast<ssize_t>(sizeof(handle)))
      die(rank_, "cannot pass the handle to rank 1");
    const auto deadline = Clock::now() + std::chrono::seconds(o_.timeout_s);
    std::uint64_t cookie = 0;
    for (;;) {
      wia::clear_provider_error();
      const wia_status_t st = ops_->accept(ctx_, l, &cookie, &conn_);
      check(st, "accept");
      if (st == WIA_SUCCESS) break;
      if (Clock::now() > deadline) die(rank_, "accept timed out");
      ::usleep(100);
    }
    check(ops_->close_listener(ctx_, l), "close_listener");
  }

  void connect(int handle_in) {
    char handle[WIA_TRANSPORT_HANDLE_SIZE];
    std::size_t got = 0;
    while (got < sizeof(handle)) {
      const ssize_t n = ::read(handle_in, handle + got, sizeof(handle) - got);
      if (n <= 0) die(rank_, "no handle from rank 0");
      got += static_cast<std::size_t>(n);
    }
    const auto deadline = Clock::now() + std::chrono::seconds(o_.timeout_s);
    for (;;) {
      wia::clear_provider_error();
      const wia_status_t st = ops_->connect(ctx_, endpoint_, handle, 1, &conn_);
      check(st, "connect");
      if (st == WIA_SUCCESS) break;
      if (Clock::now() > deadline) die(rank_, "connect timed out");
    }
  }

  wia_request_t send(const void* buf, std::uint64_t n, std::uint64_t tag) {
    return post(true, const_cast<void*>(buf), n, tag);
  }
  wia_request_t recv(void* buf, std::uint64_t n, std::uint64_t tag) {
    return post(false, buf, n, tag);
  }

  void wait(wia_request_t r) {
    const auto deadline = Clock::now() + std::chrono::seconds(o_.timeout_s);
    for (unsigned spins = 0;; ++spins) {
      wia::clear_provider_error();
      int32_t done = 0;
      check(ops_->test(ctx_, r, &done, nullptr), "test");
      if (done) return;
      // Spin (the peer is on the other core), but let a peer that shares
      // our core run now and then: oversubscribed spinning is ruinous.
      if ((spins & 63) == 63) sched_yield();
      if ((spins & 1023) == 1023 && Clock::now() > deadline) die(rank_, "a request timed out");
    }
  }

 private:
  wia_request_t post(bool is_send, void* buf, std::uint64_t n, std::uint64_t tag) {
    for (;;) {
      wia::clear_provider_error();
      wia_request_t r = nullptr;
      const wia_status_t st = is_send ? ops_->isend(ctx_, conn_, buf, n, tag, nullptr, &r)
                                      : ops_->irecv(ctx_, conn_, buf, n, tag, nullptr, &r);
      check(st, is_send ? "isend" : "irecv");
      if (r != nullptr) return r;  // NULL: no resources now, retry
    }
  }

  void check(wia_status_t st, const char* what) const {
    try {
      wia::check_provider(*provider_, st, what);
    } catch (const wia::Error& e) {
      die(rank_, e.what());
    }
  }

  int32_t pick_endpoint() {
    int32_t count = 0;
    check(ops_->endpoint_count(ctx_, &count), "endpoint_count");
    if (count == 0) die(rank_, "provider " + o_.provider + " has no endpoint");
    int32_t chosen = -1;
    for (int32_t i = 0; i < count && chosen < 0; ++i) {
      wia_transport_props_v1_t p{};
      p.struct_size = sizeof(p);
      check(ops_->endpoint_props(ctx_, i, &p), "endpoint_props");
      const bool match = o_.endpoint.empty()
                             ? (p.flags & WIA_TRANSPORT_FLAG_INTRA_NODE) &&
                                   !(p.flags & WIA_TRANSPORT_FLAG_INTER_NODE)
                             : o_.endpoint == p.name || o_.endpoint == std::to_string(i);
      if (match) {
        chosen = i;
        endpoint_name_ = p.name;
      }
    }
    if (chosen < 0 && o_.endpoint.empty()) {
      wia_transport_props_v1_t p{};
      p.struct_size = sizeof(p);
      check(ops_->endpoint_props(ctx_, 0, &p), "endpoint_props");
      chosen = 0;
      endpoint_name_ = p.name;
    }
    if (chosen < 0) die(rank_, "no endpoint named " + o_.endpoint);
    return chosen;
  }

  const Options& o_;
  int rank_;
  std::unique_ptr<wia::Config> config_;
  std::unique_ptr<wia::ProviderRegistry> registry_;
  const wia::Provider* provider_ = nullptr;
  const wia_transport_ops_v1_t* ops_ = nullptr;
  void* ctx_ = nullptr;
  int32_t endpoint_ = 0;
  std::string endpoint_name_;
  wia_conn_t conn_ = nullptr;
};

std::vector<std::uint64_t> sizes_of(const Options& o) {
  std::vector<std::uint64_t> sizes;
  for (std::uint64_t s = o.min_size; s <= o.max_size; s *= static_cast<std::uint64_t>(o.factor)) {
    sizes.push_back(s);
    if (s == 0) break;
  }
  return sizes;
}

// Iterations for a size: enough traffic for ~seconds_per_size at 2 GB/s,
// within [5, 10000]. Both ranks compute the same number.
int iterations(const Options& o, std::uint64_t size) {
  const double bytes = o.seconds_per_size * 2e9;
  const double n = bytes / static_cast<double>(std::max<std::uint64_t>(size, 4096));
  return static_cast<int>(std::clamp(n, 5.0, 10000.0));
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

void run(Rank& r, int rank, const Options& o, std::vector<char>& buf, std::vector<char>& buf2) {
  const bool header = rank == 0;
  if (header) std::printf("# %12s %8s %12s %10s\n", "size(B)", "iters", "latency(us)", "bw(GB/s)");
  char ack = 0;
  for (std::uint64_t size : sizes_of(o)) {
    const int iters = iterations(o, size);
    // Ping-pong (10 warm-up round trips first).
    const int lat_iters = std::min(iters, 1000);
    double lat_us = 0;
    for (int i = -10; i < lat_iters; ++i) {
      const auto t0 = Clock::now();
      if (rank == 0) {
        r.wait(r.send(buf.data(), size, 1));
        r.wait(r.recv(buf2.data(), size, 2));
      } else {
        r.wait(r.recv(buf2.data(), size, 1));
        r.wait(r.send(buf.data(), size, 2));
      }
      if (i >= 0) lat_us += std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
    }
    lat_us /= 2.0 * lat_iters;
    // Streaming with a window, acknowledged by a zero-byte message.
    std::vector<double> rates;
    for (int rep = 0; rep < o.repeats; ++rep) {
      std::vector<wia_request_t> window;
      const auto t0 = Clock::now();
      for (int i = 0; i < iters; ++i) {
        if (static_cast<int>(window.size()) == o.window) {
          r.wait(window.front());
          window.erase(window.begin());
        }
        window.push_back(rank == 0 ? r.send(buf.data(), size, 3) : r.recv(buf2.data(), size, 3));
      }
      for (wia_request_t w : window) r.wait(w);
      if (rank == 0)
        r.wait(r.recv(&ack, 0, 4));
      else
        r.wait(r.send(&ack, 0, 4));
      const double s = std::chrono::duration<double>(Clock::now() - t0).count();
      rates.push_back(static_cast<double>(size) * iters / s / 1e9);
    }
    if (header) {
      std::printf("  %12" PRIu64 " %8d %12.2f %10.3f\n", size, iters, lat_us, median(rates));
      std::fflush(stdout);
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse_args(argc, argv);
  int pipefd[2];
  if (::pipe(pipefd) != 0) die(0, "pipe failed");
  std::fflush(nullptr);
  const pid_t pid = ::fork();
  if (pid < 0) die(0, "fork failed");
  const int rank = pid == 0 ? 1 : 0;
  // Buffers are allocated and touched before timing: first-touch page
  // faults are not the transport's cost.
  std::vector<char> buf(std::max<std::uint64_t>(o.max_size, 1), 'x');
  std::vector<char> buf2(std::max<std::uint64_t>(o.max_size, 1), 'y');
  int code = 0;
  {
    Rank r(o, rank);
    // Bound only now: libfabric's dlopen runs libinfinipath's constructor,
    // which saves the CPU mask, sets its own and restores the saved one, so
    // a mask set from outside meanwhile (taskset -p on the forked rank) was
    // silently undone and both ranks shared one CPU (docs/transport-ofi.md).
    if (!o.cpus.empty()) {
      cpu_set_t set;
      CPU_ZERO(&set);
      CPU_SET(o.cpus[static_cast<std::size_t>(rank)], &set);
      if (::sched_setaffinity(0, sizeof set, &set) != 0)
        die(rank, "cannot run on CPU " + std::to_string(o.cpus[static_cast<std::size_t>(rank)]) +
                      ": " + std::strerror(errno));
    }
    if (rank == 0) {
      ::close(pipefd[0]);
      r.listen_and_accept(pipefd[1]);
      std::printf(
          "# wia-transport-bench: provider %s, %s, 2 processes, window %d, "
          "median of %d bandwidth runs\n",
          o.provider.c_str(), r.endpoint_text().c_str(), o.window, o.repeats);
      for (const auto& [k, v] : o.params)
        std::printf("# %s.%s = %s\n", o.provider.c_str(), k.c_str(), v.c_str());
    } else {
      ::close(pipefd[1]);
      r.connect(pipefd[0]);
    }
    run(r, rank, o, buf, buf2);
  }
  if (rank == 1) return 0;
  int status = 0;
  if (::waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    std::fprintf(stderr, "wia-transport-bench: rank 1 failed\n");
    code = 1;
  }
  return code;
}
