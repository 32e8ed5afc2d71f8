// SPDX-License-Identifier: Apache-2.0
// wia-bench: sweep message sizes for one collective over in-process host
// devices and print an nccl-tests-style table (time, algbw, busbw, #wrong
// for out-of-place and in-place) plus the bound: the busbw a pure memory
// copy of every rank's data reaches when measured in the same run, and the
// ratio achieved / bound; for an in-process all-reduce also the pass bound
// (Bench::pass_bound_us: one hand-written reduction pass over the same
// buffers) and the ratio to it.
//
//   wia-bench [-b 8] [-e 64M] [-f 2] [--op allreduce] [--dtype float32]
//             [--redop sum] [--algo auto] [--ranks 4] [-n iters] [-w warmup]
//             [-c 0|1] [--procs N | --procs-from-env] [--sizes 8,64K,1M]
//             [--compress topk:0.01|randomk:0.1|int8|int4|onebit|lowrank:4|fp16|bf16]
//             [--profile-overhead] [--trace FILE] [--plot FILE.png]
//             [--predict [--rounds N]] [--rewrite-inputs]
//
// Three ways to run:
//  - in-process (default): --ranks N host devices in this process, one
//    communicator over all of them;
//  - --procs N: N processes on this machine, one rank each on host device 0,
//    over a process communicator (shm inside the node, tcp between nodes;
//    WIA_TRANSPORT forces one). The tool forks and execs itself N times
//    (tools/common/tool_ranks.hpp: rank variables and a unique id that
//    leads to the rendezvous root this process runs);
//  - --procs-from-env: one rank of a job a launcher started (mpirun, srun,
//    torchrun, or WIA_RANK/WIA_WORLD_SIZE/WIA_ROOT_ADDR); detected without the
//    option when OMPI_COMM_WORLD_SIZE, PMI_SIZE or WIA_WORLD_SIZE is set.
// Across processes rank 0 prints the table: time is the slowest rank's, the
// data check runs on every rank and #wrong is the sum over ranks (both
// gathered with small all-reduces on the same communicator, outside the
// timed loops).
//
// --compress METHOD times wia_all_reduce_compressed instead and prints, per
// size, the bytes each rank puts on the wire and the compression ratio, the
// algbw on the original size, the relative L2 error of one call from a
// reset against the exact sum, and the plain all-reduce of the same size
// timed in the same run (speedup = its time / the compressed time).
//
// --op takes a comma-separated list (--op allreduce,allgather): one table
// per collective, one after another on the same communicator.
//
// --predict (all-reduce) times, per size, AUTO and then every all-reduce
// algorithm forced (one_shot up to 8 ranks, hierarchical across nodes),
// out of place, and prints beside each measured time the cost model's
// prediction for that call (wia_get_selected_algorithm's
// estimated_time_ms: the tuner's model of this communicator, measured
// links included when tuner.link_file / WIA_TUNER_LINK_FILE names a
// wia-bw --output file) and predicted / measured; then which algorithm
// AUTO ran and AUTO's measured time over the best forced algorithm's.
// Every algorithm is timed once per round, in --rounds N (default 2)
// alternating rounds, and keeps its fastest. A closing summary gives, from
// 64 KiB up, the range of predicted / measured (AUTO, and every row) and
// the worst AUTO / best.
//
// --plot FILE.png draws, after the sweep, busbw (out-of-place, GB/s)
// against the size (log2 axis) per collective run, each with its bound as
// a dashed line, titled with the communicator kind, rank count and
// transport. The rendering is matplotlib's (Debian python3-matplotlib):
// wia_plot.py, installed to share/wia/ beside this tool, reads the figures
// from a temporary JSON file. The interpreter is /usr/bin/python3 when it
// exists (Debian's, where python3-matplotlib installs its module; a
// python3 first on PATH may be a pyenv or venv one without it), else
// python3 from PATH. Checked before the sweep: the directory of FILE is
// writable, the script is found and matplotlib imports; any failure is one
// line naming what is wrong (the package to install when matplotlib is
// missing) and exit status 1.
#include <sched.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <wia/wia.h>

#include <algorithm>
#include <atomic>
#include <barrier>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "kernels/cpu_copy.hpp"
#include "kernels/cpu_reduce.hpp"
#include "kernels/element_access.hpp"
#include "tool_ranks.hpp"
#include "wia_common/text.hpp"

namespace {

using Clock = std::chrono::steady_clock;

struct Options {
  std::uint64_t min_bytes = 8;
  std::uint64_t max_bytes = 64ull << 20;
  double factor = 2;
  wia_collective_op_t op = WIA_COLLECTIVE_ALLREDUCE;               // ops[0]
  std::vector<wia_collective_op_t> ops{WIA_COLLECTIVE_ALLREDUCE};  // --op A,B,...
  wia_datatype_t dtype = WIA_FLOAT32;
  wia_reduce_op_t redop = WIA_REDUCE_SUM;
  wia_algorithm_id_t algo = WIA_ALGORITHM_AUTO;
  std::uint32_t chunks = 0;  // --chunks: the call's num_chunks (0: the tuner's)
  int ranks = 4;
  int iters = 0;   // 0 = by size
  int warmup = 3;
  bool check = true;
  bool ranks_given = false;
  std::vector<std::uint64_t> sizes;  // --sizes: these instead of -b/-e/-f
  int procs = 0;              // --procs N: spawn N processes
  bool procs_from_env = false;  // one rank of a launched job
  bool compressed = false;      // --compress
  bool compression_stream = false;  // --compression-stream
  bool profile_overhead = false;  // --profile-overhead
  bool rewrite_inputs = false;    // --rewrite-inputs
  bool predict = false;           // --predict
  int predict_rounds = 2;         // --rounds
  std::string trace;              // --trace FILE: WIA_TRACE for every rank
  std::string plot;               // --plot FILE.png
  std::string compress_name;
  wia_compression_config_t compress{};
};

[[noreturn]] void usage(const char* why) {
  if (why) std::fprintf(stderr, "wia-bench: %s\n", why);
  std::fprintf(
      stderr,
      "usage: wia-bench [-b MIN] [-e MAX] [-f FACTOR] [--op allreduce|broadcast|reduce|\n"
      "                 allgather|reducescatter|alltoall] [--dtype float32|...] [--redop\n"
      "                 sum|prod|min|max|avg] [--algo auto|ring|tree|binomial|rabenseifner|\n"
      "                 recursive_doubling|recursive_halving|bruck|chain|scatter_allgather|\n"
      "                 direct|pairwise|one_shot|hierarchical] [--ranks N] [-n ITERS]\n"
      "                 [-w WARMUP] [-c 0|1] [--chunks K] [--procs N | --procs-from-env]\n"
      "                 [--sizes S1,S2,...]\n"
      "                 [--compress topk:R|randomk:R|int8|int4|onebit|lowrank:R|fp16|bf16\n"
      "                 [--compression-stream]]\n"
      "                 [--profile-overhead] [--trace FILE] [--plot FILE.png]\n"
      "                 [--predict [--rounds N]] [--rewrite-inputs]\n"
      "--op also takes the spec's spellings: all_reduce, all_gather, reduce_scatter, all_to_all;\n"
      "several, comma-separated (--op allreduce,allgather), run one after another.\n"
      "sizes take K, M, G suffixes; size = bytes of the whole vector (nccl-tests);\n"
      "--sizes lists the sizes to run instead of the -b/-e/-f sweep.\n"
      "--chunks K: the calls' pipeline depth (num_chunks; default 0, the tuner's).\n"
      "--ranks N: N host devices in this process (default 4); --procs N: N processes,\n"
      "one rank each; --procs-from-env: one rank of a job started by mpirun, srun,\n"
      "torchrun or WIA_RANK/WIA_WORLD_SIZE/WIA_ROOT_ADDR.\n"
      "--compress: wia_all_reduce_compressed (allreduce, float32/float16/bfloat16, sum/avg)\n"
      "with error feedback for topk, onebit and lowrank; R is k_ratio (topk, randomk) or\n"
      "the rank (lowrank); compared with the plain all-reduce timed in the same run.\n"
      "--compression-stream: each rank encodes on a second stream of its device, so a\n"
      "large call's segments overlap (docs/compression.md, \"Pipelining\").\n"
      "--rewrite-inputs: before each timed call every rank stores to each cache line of\n"
      "its input (values kept), as a training loop writes its gradients, and only the\n"
      "calls are timed: peers then read inputs from the writer's cache, not their own.\n"
      "--profile-overhead: each size with and without wia_enable_comm_profiling\n"
      "(process communicators: --procs N), alternating, and the difference.\n"
      "--trace FILE: each rank writes its timeline as Chrome/Perfetto JSON to\n"
      "FILE.rank<N> ('%%r' in FILE: replaced by the rank instead), with --procs N or\n"
      "--procs-from-env (docs/profiling.md).\n"
      "--predict: all-reduce, each size AUTO and every algorithm forced, measured beside\n"
      "the cost model's prediction (tuner.link_file / WIA_TUNER_LINK_FILE: measured links)\n"
      "and predicted / measured; AUTO's time over the best forced algorithm's; --rounds N\n"
      "(default 2): alternating rounds, each algorithm's fastest kept.\n"
      "--plot FILE.png: after the sweep, a chart of busbw vs size (log2) per op with its\n"
      "bound, drawn by wia_plot.py with /usr/bin/python3 and matplotlib (Debian package\n"
      "python3-matplotlib; docs/profiling.md).\n");
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

// --compress METHOD[:PARAM] -> a compression config (the library's spelling).
wia_compression_config_t compress_arg(const std::string& text) {
  wia_compression_config_t c{};
  if (wia_compression_config_from_string(text.c_str(), &c) != WIA_SUCCESS)
    usage(("--compress: " + std::string(wia_get_last_error())).c_str());
  return c;
}

template <typename T>
T pick(const char* name, const char* value, std::initializer_list<std::pair<const char*, T>> all) {
  for (const auto& [n, v] : all)
    if (!std::strcmp(n, value)) return v;
  usage((std::string("unknown ") + name + " '" + value + "'").c_str());
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> const char* {
      if (i + 1 >= argc) usage((a + " needs a value").c_str());
      return argv[++i];
    };
    if (a == "-b") o.min_bytes = size_arg(next());
    else if (a == "-e") o.max_bytes = size_arg(next());
    else if (a == "-f") o.factor = std::atof(next());
    else if (a == "-n") o.iters = std::atoi(next());
    else if (a == "-w") o.warmup = std::atoi(next());
    else if (a == "-c") o.check = std::atoi(next()) != 0;
    else if (a == "--ranks") o.ranks = std::atoi(next()), o.ranks_given = true;
    else if (a == "--procs") o.procs = std::atoi(next());
    else if (a == "--sizes") {
      const std::string list = next();
      for (std::size_t at = 0; at <= list.size();) {
        const std::size_t comma = std::min(list.find(',', at), list.size());
        o.sizes.push_back(size_arg(list.substr(at, comma - at)));
        at = comma + 1;
      }
      o.max_bytes = *std::max_element(o.sizes.begin(), o.sizes.end());
      o.min_bytes = *std::min_element(o.sizes.begin(), o.sizes.end());
    }
    else if (a == "--procs-from-env") o.procs_from_env = true;
    else if (a == "--profile-overhead") o.profile_overhead = true;
    else if (a == "--rewrite-inputs") o.rewrite_inputs = true;
    else if (a == "--predict") o.predict = true;
    else if (a == "--rounds") o.predict_rounds = std::max(1, std::atoi(next()));
    else if (a == "--trace") o.trace = next();
    else if (a == "--plot") o.plot = next();
    else if (a == "--compress") {
      o.compress_name = next();
      o.compress = compress_arg(o.compress_name);
      o.compressed = true;
    }
    else if (a == "--compression-stream") o.compression_stream = true;
    else if (a == "--op") {
      o.ops.clear();
      const std::string list = next();
      for (std::size_t at = 0; at <= list.size();) {
        const std::size_t comma = std::min(list.find(',', at), list.size());
        const std::string one = list.substr(at, comma - at);
        at = comma + 1;
        // The spec's own spellings (all_reduce, ...) are accepted too.
        const wia_collective_op_t op =
            pick<wia_collective_op_t>("op", one.c_str(),
                                      {{"allreduce", WIA_COLLECTIVE_ALLREDUCE},
                                       {"all_reduce", WIA_COLLECTIVE_ALLREDUCE},
                                       {"broadcast", WIA_COLLECTIVE_BROADCAST},
                                       {"reduce", WIA_COLLECTIVE_REDUCE},
                                       {"allgather", WIA_COLLECTIVE_ALLGATHER},
                                       {"all_gather", WIA_COLLECTIVE_ALLGATHER},
                                       {"reducescatter", WIA_COLLECTIVE_REDUCE_SCATTER},
                                       {"reduce_scatter", WIA_COLLECTIVE_REDUCE_SCATTER},
                                       {"alltoall", WIA_COLLECTIVE_ALLTOALL},
                                       {"all_to_all", WIA_COLLECTIVE_ALLTOALL}});
        if (std::find(o.ops.begin(), o.ops.end(), op) == o.ops.end()) o.ops.push_back(op);
      }
      o.op = o.ops.front();
    }
    else if (a == "--dtype")
      o.dtype = pick<wia_datatype_t>(
          "dtype", next(),
          {{"int8", WIA_INT8}, {"uint8", WIA_UINT8}, {"int32", WIA_INT32}, {"uint32", WIA_UINT32},
           {"int64", WIA_INT64}, {"uint64", WIA_UINT64}, {"float16", WIA_FLOAT16},
           {"bfloat16", WIA_BFLOAT16}, {"float32", WIA_FLOAT32}, {"float64", WIA_FLOAT64}});
    else if (a == "--redop")
      o.redop = pick<wia_reduce_op_t>("redop", next(),
                                      {{"sum", WIA_REDUCE_SUM}, {"prod", WIA_REDUCE_PROD},
                                       {"min", WIA_REDUCE_MIN}, {"max", WIA_REDUCE_MAX},
                                       {"avg", WIA_REDUCE_AVG}});
    else if (a == "--chunks")
      o.chunks = static_cast<std::uint32_t>(std::max(0, std::atoi(next())));
    else if (a == "--algo")
      o.algo = pick<wia_algorithm_id_t>(
          "algo", next(),
          {{"auto", WIA_ALGORITHM_AUTO}, {"ring", WIA_ALGORITHM_RING}, {"tree", WIA_ALGORITHM_TREE},
           {"binomial", WIA_ALGORITHM_BINOMIAL}, {"rabenseifner", WIA_ALGORITHM_RABENSEIFNER},
           {"recursive_doubling", WIA_ALGORITHM_RECURSIVE_DOUBLING},
           {"recursive_halving", WIA_ALGORITHM_RECURSIVE_HALVING}, {"bruck", WIA_ALGORITHM_BRUCK},
           {"chain", WIA_ALGORITHM_CHAIN}, {"scatter_allgather", WIA_ALGORITHM_SCATTER_ALLGATHER},
           {"direct", WIA_ALGORITHM_DIRECT}, {"pairwise", WIA_ALGORITHM_PAIRWISE},
           {"one_shot", WIA_ALGORITHM_ONE_SHOT},
           {"hierarchical", WIA_ALGORITHM_HIERARCHICAL}});
    else if (a == "-h" || a == "--help") usage(nullptr);
    else usage(("unknown option '" + a + "'").c_str());
  }
  if (o.ranks < 1 || o.ranks > 64) usage("--ranks must be 1..64");
  if (o.procs < 0 || o.procs > 256) usage("--procs must be 1..256");
  if ((o.procs > 0) + o.procs_from_env + o.ranks_given > 1)
    usage("--ranks, --procs and --procs-from-env exclude each other");
  if (!o.trace.empty() && o.procs == 0 && !o.procs_from_env)
    usage("--trace records process communicators: use --procs N or --procs-from-env");
  if (o.factor <= 1) usage("-f must be > 1");
  if (o.min_bytes > o.max_bytes) usage("-b must not exceed -e");
  if (o.ops.size() > 1 && (o.compressed || o.profile_overhead))
    usage(
        "--op lists several collectives only for the plain sweep (not with --compress or "
        "--profile-overhead)");
  if (o.predict && (o.compressed || o.profile_overhead || !o.plot.empty() ||
                    o.ops.size() > 1 || o.op != WIA_COLLECTIVE_ALLREDUCE))
    usage("--predict runs the plain all-reduce sweep: --op allreduce, without --compress, "
          "--profile-overhead or --plot");
  if (!o.plot.empty() && (o.compressed || o.profile_overhead))
    usage("--plot draws the plain sweep: not with --compress or --profile-overhead");
  if (o.compression_stream && !o.compressed) usage("--compression-stream needs --compress");
  if (o.compressed) {
    if (o.op != WIA_COLLECTIVE_ALLREDUCE) usage("--compress needs --op allreduce");
    if (o.dtype != WIA_FLOAT32 && o.dtype != WIA_FLOAT16 && o.dtype != WIA_BFLOAT16)
      usage("--compress needs --dtype float32, float16 or bfloat16");
    if (o.redop != WIA_REDUCE_SUM && o.redop != WIA_REDUCE_AVG)
      usage("--compress needs --redop sum or avg");
  }
  return o;
}

[[noreturn]] void die(const char* what, wia_status_t st) {
  std::fprintf(stderr, "wia-bench: %s: %s\n  %s\n", what, wia_status_string(st),
               wia_get_last_error());
  std::exit(1);
}
#define CHECK_WIA(call)                \
  do {                                 \
    wia_status_t st_ = (call);         \
    if (st_ != WIA_SUCCESS) die(#call, st_); \
  } while (0)

// nccl-tests' bus-bandwidth factors: busbw = algbw * factor.
double bus_factor(wia_collective_op_t op, int p) {
  switch (op) {
    case WIA_COLLECTIVE_ALLREDUCE: return 2.0 * (p - 1) / p;
    case WIA_COLLECTIVE_ALLGATHER:
    case WIA_COLLECTIVE_REDUCE_SCATTER:
    case WIA_COLLECTIVE_ALLTOALL: return static_cast<double>(p - 1) / p;
    default: return 1.0;
  }
}

const char* op_name(wia_collective_op_t op) {
  switch (op) {
    case WIA_COLLECTIVE_ALLREDUCE: return "allreduce";
    case WIA_COLLECTIVE_BROADCAST: return "broadcast";
    case WIA_COLLECTIVE_REDUCE: return "reduce";
    case WIA_COLLECTIVE_ALLGATHER: return "allgather";
    case WIA_COLLECTIVE_REDUCE_SCATTER: return "reducescatter";
    case WIA_COLLECTIVE_ALLTOALL: return "alltoall";
    default: return "?";
  }
}

// One rank this process drives: its global rank, stream and buffers.
struct Rank {
  int rank = 0;
  wia_stream_t stream = nullptr;
  wia_stream_t side = nullptr;  // --compression-stream: where the codec runs
  char* in = nullptr;   // out-of-place input
  char* out = nullptr;  // output (also the in-place buffer)
  std::vector<void*> in_shards, out_shards;
};

class Bench {
 public:
  // In-process: o.ranks host devices, one communicator over all of them.
  explicit Bench(const Options& o) : o_(o), es_(wia::kernels::dtype_size(o.dtype)) {
    nranks_ = o.ranks;
    std::vector<wia_device_t> devs(o.ranks);
    for (int i = 0; i < o.ranks; ++i) devs[i] = i;
    CHECK_WIA(wia_create_communicator(devs.data(), o.ranks, &comm_));
    ranks_.resize(o.ranks);
    for (int r = 0; r < o.ranks; ++r) {
      ranks_[r].rank = r;
      CHECK_WIA(wia_create_stream_on(r, &ranks_[r].stream));
      if (o.compression_stream) CHECK_WIA(wia_create_stream_on(r, &ranks_[r].side));
      allocate(ranks_[r], r);
    }
  }
  // Across processes: this process is rank wia_comm_rank(comm) of `comm`, on
  // the current device, posting on the default stream.
  Bench(const Options& o, wia_communicator_t comm)
      : o_(o), es_(wia::kernels::dtype_size(o.dtype)), comm_(comm), distributed_(true) {
    nranks_ = wia_comm_size(comm);
    wia_device_t dev = 0;
    CHECK_WIA(wia_get_device(&dev));
    ranks_.resize(1);
    ranks_[0].rank = wia_comm_rank(comm);
    if (o.compression_stream) CHECK_WIA(wia_create_stream_on(dev, &ranks_[0].side));
    allocate(ranks_[0], dev);
  }
  ~Bench() {
    for (auto& r : ranks_) {
      wia_free(r.in);
      wia_free(r.out);
      if (r.stream) wia_destroy_stream(r.stream);
      if (r.side) wia_destroy_stream(r.side);
    }
    wia_destroy_communicator(comm_);
  }

  int nranks() const { return nranks_; }
  bool distributed() const { return distributed_; }

  // Input and output elements per rank for a vector of `count` elements.
  std::uint64_t in_elems(std::uint64_t count) const {
    switch (o_.op) {
      case WIA_COLLECTIVE_ALLGATHER: return count / nranks_;
      default: return count;
    }
  }
  std::uint64_t out_elems(std::uint64_t count) const {
    switch (o_.op) {
      case WIA_COLLECTIVE_REDUCE_SCATTER: return count / nranks_;
      default: return count;
    }
  }
  std::uint64_t buffer_bytes(std::uint64_t bytes) const { return bytes + 64; }

  // The count argument of the call for a vector of `count` elements.
  std::uint64_t call_count(std::uint64_t count) const {
    switch (o_.op) {
      case WIA_COLLECTIVE_ALLGATHER:
      case WIA_COLLECTIVE_REDUCE_SCATTER:
      case WIA_COLLECTIVE_ALLTOALL: return count / nranks_;
      default: return count;
    }
  }

  void post(std::uint64_t count, bool in_place) {
    wia_collective_config_t cfg{};
    cfg.operation = o_.op;
    cfg.reduction_op = o_.redop;
    cfg.datatype = o_.dtype;
    cfg.algorithm = o_.algo;
    cfg.num_chunks = o_.chunks;
    const std::uint64_t n = call_count(count);
    if (compressing_) {
      // Each call posts several collectives and host tasks: no group.
      for (Rank& k : ranks_) {
        char* send = in_place ? k.out : k.in;
        wia_compression_config_t c = o_.compress;
        c.compression_stream = k.side;
        CHECK_WIA(wia_all_reduce_compressed_ex(comm_, send, k.out, n, o_.dtype, o_.redop, &c,
                                               k.stream));
      }
      return;
    }
    if (!distributed_) CHECK_WIA(wia_group_start());
    for (Rank& k : ranks_) {
      const int r = k.rank;
      char* send = in_place ? k.out : k.in;
      if (in_place && o_.op == WIA_COLLECTIVE_ALLGATHER) send = k.out + r * n * es_;
      char* recv = k.out;
      if (in_place && o_.op == WIA_COLLECTIVE_REDUCE_SCATTER) recv = k.out + r * n * es_;
      wia_status_t st = WIA_SUCCESS;
      switch (o_.op) {
        case WIA_COLLECTIVE_ALLREDUCE: st = wia_all_reduce(comm_, send, recv, n, &cfg, k.stream); break;
        case WIA_COLLECTIVE_BROADCAST: st = wia_broadcast_ex(comm_, send, recv, n, 0, &cfg, k.stream); break;
        case WIA_COLLECTIVE_REDUCE: st = wia_reduce(comm_, send, recv, n, 0, &cfg, k.stream); break;
        case WIA_COLLECTIVE_ALLGATHER: st = wia_all_gather_ex(comm_, send, recv, n, &cfg, k.stream); break;
        case WIA_COLLECTIVE_REDUCE_SCATTER: st = wia_reduce_scatter(comm_, send, recv, n, &cfg, k.stream); break;
        case WIA_COLLECTIVE_ALLTOALL:
          k.in_shards.resize(nranks_);
          k.out_shards.resize(nranks_);
          for (int j = 0; j < nranks_; ++j) {
            k.in_shards[j] = send + j * n * es_;
            k.out_shards[j] = recv + j * n * es_;
          }
          st = wia_all_to_all(comm_, k.in_shards.data(), k.out_shards.data(), n, &cfg, k.stream);
          break;
        default: break;
      }
      // In a group the calls only queue; errors surface at group end. Across
      // processes a failed post is final (the communicator is broken).
      if (distributed_ && st != WIA_SUCCESS) die("posting the collective", st);
    }
    if (!distributed_) CHECK_WIA(wia_group_end());
  }

  void sync() {
    for (auto& r : ranks_) CHECK_WIA(wia_stream_synchronize(r.stream));
  }

  double value(int rank, std::uint64_t i) const {
    if (o_.redop == WIA_REDUCE_PROD) return (i + rank) % 3 == 0 ? 2.0 : 1.0;
    return static_cast<double>((i * 7 + static_cast<std::uint64_t>(rank) * 3) % 9) - 4.0;
  }

  void fill(std::uint64_t count, bool in_place) {
    const std::uint64_t n = call_count(count);
    for (Rank& k : ranks_) {
      const int r = k.rank;
      char* input = in_place ? k.out : k.in;
      std::uint64_t elems = in_elems(count);
      if (in_place && o_.op == WIA_COLLECTIVE_ALLGATHER) input = k.out + r * n * es_;
      if (o_.op == WIA_COLLECTIVE_ALLGATHER) elems = n;
      for (std::uint64_t i = 0; i < elems; ++i)
        wia::kernels::store_element(input, i, o_.dtype, value(r, i));
    }
  }

  // Number of wrong output elements over the ranks of this process.
  std::uint64_t verify(std::uint64_t count) const {
    const std::uint64_t n = call_count(count);
    const int p = nranks_;
    const bool is_float = o_.dtype == WIA_FLOAT16 || o_.dtype == WIA_BFLOAT16 ||
                          o_.dtype == WIA_FLOAT32 || o_.dtype == WIA_FLOAT64;
    auto reduced = [&](std::uint64_t i) {
      double acc = value(0, i);
      for (int r = 1; r < p; ++r) {
        const double v = value(r, i);
        switch (o_.redop) {
          case WIA_REDUCE_PROD: acc *= v; break;
          case WIA_REDUCE_MIN: acc = std::min(acc, v); break;
          case WIA_REDUCE_MAX: acc = std::max(acc, v); break;
          default: acc += v; break;
        }
      }
      if (o_.redop == WIA_REDUCE_AVG) acc = is_float ? acc / p : std::trunc(acc / p);
      // Round the reference into the type the way the library stores it.
      char tmp[8];
      wia::kernels::store_element(tmp, 0, o_.dtype, acc);
      return wia::kernels::load_element(tmp, 0, o_.dtype);
    };
    std::uint64_t wrong = 0;
    auto expect = [&](const char* buf, std::uint64_t i, double want) {
      // The value as the datatype holds it: the inputs were stored the same
      // way (uint8 wraps value()'s negative numbers, halves round).
      char held[8];
      wia::kernels::store_element(held, 0, o_.dtype, want);
      want = wia::kernels::load_element(held, 0, o_.dtype);
      const double got = wia::kernels::load_element(buf, i, o_.dtype);
      const double tol = is_float ? 1e-2 * std::max(1.0, std::fabs(want)) : 0;
      if (!(std::fabs(got - want) <= tol)) ++wrong;
    };
    for (const Rank& k : ranks_) {
      const int r = k.rank;
      const char* out = k.out;
      switch (o_.op) {
        case WIA_COLLECTIVE_ALLREDUCE:
          for (std::uint64_t i = 0; i < n; ++i) expect(out, i, reduced(i));
          break;
        case WIA_COLLECTIVE_REDUCE:
          if (r == 0)
            for (std::uint64_t i = 0; i < n; ++i) expect(out, i, reduced(i));
          break;
        case WIA_COLLECTIVE_BROADCAST:
          for (std::uint64_t i = 0; i < n; ++i) expect(out, i, value(0, i));
          break;
        case WIA_COLLECTIVE_ALLGATHER:
          for (int q = 0; q < p; ++q)
            for (std::uint64_t i = 0; i < n; ++i) expect(out, q * n + i, value(q, i));
          break;
        case WIA_COLLECTIVE_REDUCE_SCATTER:
          // In place the result sits at out + r*n; out of place at out.
          for (std::uint64_t i = 0; i < n; ++i) expect(out + (last_in_place_ ? r * n * es_ : 0), i, reduced(r * n + i));
          break;
        case WIA_COLLECTIVE_ALLTOALL:
          for (int q = 0; q < p; ++q)
            for (std::uint64_t i = 0; i < n; ++i) expect(out, q * n + i, value(q, r * n + i));
          break;
        default: break;
      }
    }
    return wrong;
  }

  // The relative L2 error of every rank's all-reduce output against the
  // exact sum (double), over the ranks of the job.
  double relative_error(std::uint64_t count) {
    double sums[2] = {0, 0};  // squared error, squared reference
    for (const Rank& k : ranks_)
      for (std::uint64_t i = 0; i < count; ++i) {
        double want = 0;
        for (int r = 0; r < nranks_; ++r) want += value(r, i);
        if (o_.redop == WIA_REDUCE_AVG) want /= nranks_;
        const double got = wia::kernels::load_element(k.out, i, o_.dtype);
        sums[0] += (got - want) * (got - want);
        sums[1] += want * want;
      }
    reduce_small(sums, 2, WIA_FLOAT64, WIA_REDUCE_SUM);
    return sums[1] > 0 ? std::sqrt(sums[0] / sums[1]) : std::sqrt(sums[0]);
  }

  // One compressed call from a reset (no residual carried in): its error.
  double check_compressed(std::uint64_t count, bool in_place) {
    CHECK_WIA(wia_compression_reset(comm_));
    fill(count, in_place);
    post(count, in_place);
    sync();
    const double e = relative_error(count);
    CHECK_WIA(wia_compression_reset(comm_));
    return e;
  }
  // Whether post() runs the compressed all-reduce (the plain one otherwise).
  void set_compressing(bool on) { compressing_ = on; }

  // Median time per call in microseconds over `iters` back-to-back posts;
  // across processes each repetition starts after a barrier and counts the
  // slowest rank. Records the algorithm the timed calls ran.
  double time_us(std::uint64_t count, bool in_place, int iters) {
    for (int i = 0; i < o_.warmup; ++i) post(count, in_place);
    sync();
    std::vector<double> samples;
    for (int rep = 0; rep < 3; ++rep) {
      barrier();
      if (o_.rewrite_inputs) {
        // Each call alone, its inputs dirtied first, outside the timing.
        double us = 0;
        for (int i = 0; i < iters; ++i) {
          rewrite_inputs(count, in_place);
          const auto t0 = Clock::now();
          post(count, in_place);
          sync();
          us += std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
        }
        samples.push_back(us / iters);
        continue;
      }
      const auto t0 = Clock::now();
      for (int i = 0; i < iters; ++i) post(count, in_place);
      sync();
      samples.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count() / iters);
    }
    const wia_algorithm_t algo = wia_get_selected_algorithm(comm_);
    last_algorithm_ = algo.name ? algo.name : "?";
    last_estimate_us_ = algo.estimated_time_ms * 1e3;
    max_over_ranks(samples);
    std::sort(samples.begin(), samples.end());
    return samples[1];
  }

  // --rewrite-inputs: a store to every cache line of each local rank's
  // input, values unchanged, so the line is modified in this core's cache.
  void rewrite_inputs(std::uint64_t count, bool in_place) {
    for (Rank& k : ranks_) {
      volatile char* p = in_place ? k.out : k.in;
      const std::uint64_t bytes = in_elems(count) * es_;
      for (std::uint64_t i = 0; i < bytes; i += 64) p[i] = p[i];
    }
  }

  // Wrong elements over all ranks of the job.
  std::uint64_t check(std::uint64_t count, bool in_place) {
    last_in_place_ = in_place;
    fill(count, in_place);
    if (o_.rewrite_inputs) rewrite_inputs(count, in_place);  // must keep every value
    post(count, in_place);
    sync();
    return sum_over_ranks(verify(count));
  }

  // The bound: every rank copies its input to its output once, all ranks at
  // once (one thread each in-process, one process each across processes,
  // as the collective has), median of 3.
  double copy_bound_us(std::uint64_t count, int iters) {
    const std::uint64_t bytes = std::max(in_elems(count), out_elems(count)) * es_;
    const int local = static_cast<int>(ranks_.size());
    std::vector<double> samples;
    for (int rep = 0; rep < 3; ++rep) {
      barrier();
      std::atomic<int> ready{0};
      std::vector<std::thread> threads;
      const auto t0 = Clock::now();
      for (int r = 0; r < local; ++r)
        threads.emplace_back([&, r] {
          ready.fetch_add(1);
          while (ready.load() < local) std::this_thread::yield();
          for (int i = 0; i < iters; ++i) std::memcpy(ranks_[r].out, ranks_[r].in, bytes);
        });
      for (auto& t : threads) t.join();
      samples.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count() / iters);
    }
    max_over_ranks(samples);
    std::sort(samples.begin(), samples.end());
    return samples[1];
  }

  // The pass bound (in-process all-reduce): the least an all-reduce of
  // these buffers can do in memory, run by hand with no library in
  // between. Each of min(ranks, CPUs) threads takes an equal share of the
  // elements and, slice by slice, reduces every rank's input with the
  // library's CPU kernel into a buffer of its own and copies the result to
  // every rank's output; the threads meet at a barrier after each call,
  // as a collective's ranks do. The copy bound lets each rank copy only its
  // own data call after call, which on a 2-core machine keeps half the
  // ranks' buffers in cache; an all-reduce reads every rank's input each
  // call. The fastest of 16 KiB slices (in L1 when copied), 256 KiB (in
  // L2, fewer switches between the streams) and 16 KiB written with
  // streaming stores (no read for ownership of the outputs); median of 3.
  double pass_bound_us(std::uint64_t count, int iters) {
    const int p = static_cast<int>(ranks_.size());
    // The CPUs this process may use, as the engine counts them (the core's
    // usable_cpu_count is not exported to tools).
    cpu_set_t cpus;
    const int ncpu = sched_getaffinity(0, sizeof(cpus), &cpus) == 0 ? CPU_COUNT(&cpus) : 1;
    const int nthreads = std::clamp(ncpu, 1, p);
    double best = 0;
    struct Variant {
      std::uint64_t slice_bytes;
      bool streaming;
    };
    for (const Variant v : {Variant{16 << 10, false}, Variant{256 << 10, false},
                            Variant{16 << 10, true}}) {
      const std::uint64_t slice = std::max<std::uint64_t>(1, v.slice_bytes / es_);
      std::vector<double> samples;
      for (int rep = 0; rep < 3; ++rep) {
        std::barrier calls(nthreads);
        std::vector<std::thread> threads;
        const auto t0 = Clock::now();
        for (int t = 0; t < nthreads; ++t)
          threads.emplace_back([&, t] {
            const std::uint64_t lo = count * t / nthreads, hi = count * (t + 1) / nthreads;
            std::vector<char> reduced(slice * es_);
            std::vector<const void*> srcs(p);
            for (int i = 0; i < iters; ++i) {
              for (std::uint64_t off = lo; off < hi; off += slice) {
                const std::uint64_t n = std::min(slice, hi - off);
                for (int r = 0; r < p; ++r) srcs[r] = ranks_[r].in + off * es_;
                wia_reduce_args_v1_t a{};
                a.struct_size = sizeof(a);
                a.dtype = o_.dtype;
                a.op = o_.redop;
                a.nsrcs = static_cast<std::uint32_t>(p);
                a.count = n;
                a.dst = reduced.data();
                a.srcs = srcs.data();
                if (wia::kernels::reduce(a) != WIA_SUCCESS) die("the pass bound's reduction", WIA_ERROR_INTERNAL);
                for (int r = 0; r < p; ++r) {
                  if (v.streaming)
                    wia::kernels::copy_streaming(ranks_[r].out + off * es_, reduced.data(), n * es_);
                  else
                    std::memcpy(ranks_[r].out + off * es_, reduced.data(), n * es_);
                }
              }
              if (v.streaming) wia::kernels::streaming_fence();
              calls.arrive_and_wait();
            }
          });
        for (auto& th : threads) th.join();
        samples.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count() / iters);
      }
      std::sort(samples.begin(), samples.end());
      if (best == 0 || samples[1] < best) best = samples[1];
    }
    return best;
  }

  const std::string& last_algorithm() const { return last_algorithm_; }
  // The cost model's estimate for the calls time_us() last timed.
  double last_estimate_us() const { return last_estimate_us_; }
  // --predict: the algorithm post() asks for from now on.
  void set_algorithm(wia_algorithm_id_t a) { o_.algo = a; }
  wia_communicator_t comm() const { return comm_; }
  // --op A,B: the collective post() runs from now on.
  void set_op(wia_collective_op_t op) { o_.op = op; }

  // Across processes, what one call of `count` elements travelled over, as
  // the profiler reports it ("shm", "windows", "tcp", ...): one untimed call
  // with profiling enabled, collective (every rank runs it). In-process the
  // ranks are host devices of this process: "memory".
  std::string transport(std::uint64_t count) {
    if (!distributed_) return "memory";
    const wia_comm_profiling_t track = {true, false, false};
    std::string name = "?";
    if (wia_enable_comm_profiling(comm_, &track) != WIA_SUCCESS) return name;
    post(count, false);
    sync();
    if (wia_comm_profile_report_t* r = wia_get_comm_profile(comm_)) {
      for (int i = 0; i < r->num_collectives; ++i)
        if (r->collectives[i].invocation_count > 0 && r->collectives[i].transport &&
            *r->collectives[i].transport)
          name = r->collectives[i].transport;
      wia_free_comm_profile(r);
    }
    wia_disable_comm_profiling(comm_);
    wia_reset_comm_profile(comm_);
    return name;
  }

 private:
  void allocate(Rank& k, wia_device_t dev) {
    const std::uint64_t cap = buffer_bytes(o_.max_bytes);
    CHECK_WIA(wia_malloc_on(dev, reinterpret_cast<void**>(&k.in), cap));
    CHECK_WIA(wia_malloc_on(dev, reinterpret_cast<void**>(&k.out), cap));
    std::memset(k.in, 0, cap);  // fault pages in outside the timing
    std::memset(k.out, 0, cap);
  }

  // Small all-reduces on the benchmarked communicator that gather the
  // figures across processes (no-ops in-process).
  void reduce_small(void* data, std::size_t count, wia_datatype_t type, wia_reduce_op_t op) {
    if (!distributed_) return;
    wia_collective_config_t cfg{};
    cfg.operation = WIA_COLLECTIVE_ALLREDUCE;
    cfg.datatype = type;
    cfg.reduction_op = op;
    CHECK_WIA(wia_all_reduce(comm_, data, data, count, &cfg, nullptr));
    CHECK_WIA(wia_stream_synchronize(nullptr));
  }
  void barrier() {
    std::int32_t token = 1;
    reduce_small(&token, 1, WIA_INT32, WIA_REDUCE_SUM);
  }
  void max_over_ranks(std::vector<double>& v) {
    reduce_small(v.data(), v.size(), WIA_FLOAT64, WIA_REDUCE_MAX);
  }
  std::uint64_t sum_over_ranks(std::uint64_t v) {
    reduce_small(&v, 1, WIA_UINT64, WIA_REDUCE_SUM);
    return v;
  }

  Options o_;
  std::size_t es_;
  int nranks_ = 0;
  wia_communicator_t comm_ = nullptr;
  bool distributed_ = false;
  std::vector<Rank> ranks_;
  bool last_in_place_ = false;
  bool compressing_ = false;
  std::string last_algorithm_ = "?";
  double last_estimate_us_ = 0;
};

// The table of --compress: compressed against plain, per size.
int run_compressed_sweep(const Options& o, Bench& bench, const std::vector<std::uint64_t>& sizes,
                         bool print) {
  const std::size_t es = wia::kernels::dtype_size(o.dtype);
  const int p = bench.nranks();
  if (print) {
    std::printf("# wia-bench: compressed allreduce (%s)  ranks %d (%s)  dtype %s  redop %s%s\n",
                o.compress_name.c_str(), p,
                bench.distributed() ? "processes, one rank each" : "in-process host devices",
                wia::kernels::dtype_name(o.dtype), wia::kernels::reduce_op_name(o.redop),
                o.compression_stream ? "  compression stream" : "");
    std::printf("# wire = bytes each rank sends (wia_compression_wire_bytes); cratio = the plain "
                "ring all-reduce's wire / wire; algbw on the original size; relerr = |out - exact|_2 / |exact|_2 "
                "of one call from a reset; speedup = plain all-reduce time / compressed time, "
                "both measured in this run\n");
    std::printf("#%11s %12s %8s %10s %7s | %9s %8s %9s | %9s %8s %9s | %9s %8s\n", "size",
                "count", "type", "wire", "cratio", "time(us)", "algbw", "relerr", "time(us)",
                "algbw", "relerr", "plain(us)", "speedup");
    std::printf("#%11s %12s %8s %10s %7s | %28s | %28s | %18s\n", "(B)", "(elements)", "", "(B)",
                "", "out-of-place (GB/s)", "in-place (GB/s)", "same size, plain");
    std::fflush(stdout);
  }
  for (const std::uint64_t bytes : sizes) {
    const std::uint64_t count = bytes / es;
    if (count == 0) continue;
    std::size_t wire = 0, plain_wire = 0;
    const wia_compression_config_t none{};
    CHECK_WIA(wia_compression_wire_bytes(count, o.dtype, &o.compress, p, &wire));
    CHECK_WIA(wia_compression_wire_bytes(count, o.dtype, &none, p, &plain_wire));
    const int iters = o.iters > 0 ? o.iters
                                  : static_cast<int>(std::clamp<std::uint64_t>(
                                        (64ull << 20) / (count * es), 3, 200));
    bench.set_compressing(true);
    const double e_oop = o.check ? bench.check_compressed(count, false) : 0;
    const double t_oop = bench.time_us(count, false, iters);
    const double e_ip = o.check ? bench.check_compressed(count, true) : 0;
    const double t_ip = bench.time_us(count, true, iters);
    bench.set_compressing(false);
    const double t_plain = bench.time_us(count, false, iters);
    const double gb = static_cast<double>(count * es) / 1e3;
    if (print) {
      std::printf("%12llu %12llu %8s %10zu %7.1f | %9.2f %8.2f %9.2e | %9.2f %8.2f %9.2e | %9.2f "
                  "%8.2f\n",
                  static_cast<unsigned long long>(count * es),
                  static_cast<unsigned long long>(count), wia::kernels::dtype_name(o.dtype), wire,
                  wire ? static_cast<double>(plain_wire) / static_cast<double>(wire) : 1.0,
                  t_oop, gb / t_oop,
                  e_oop, t_ip, gb / t_ip, e_ip, t_plain, t_plain / t_oop);
      std::fflush(stdout);
    }
  }
  return 0;
}

// --profile-overhead: each size timed with profiling off and on,
// alternating (15 rounds below 1 MiB, where a timing lasts milliseconds, 5
// above; off then on, then on then off, ...). The overhead is the median
// over rounds of on / off - 1, each round's two timings taken one right
// after the other, so that a load that comes and goes on a shared machine
// weighs on both alike; the
// columns off and on are the fastest of each, and a comment line gives
// their ratio and the rounds' range.
int run_profile_overhead(const Options& o, Bench& bench, const std::vector<std::uint64_t>& sizes,
                         bool print) {
  if (!bench.distributed()) {
    std::fprintf(stderr, "wia-bench: --profile-overhead profiles process communicators: use "
                         "--procs N\n");
    return 2;
  }
  const std::size_t es = wia::kernels::dtype_size(o.dtype);
  if (print) {
    std::printf(
        "# wia-bench: %s with and without wia_enable_comm_profiling, ranks %d, "
        "alternating (15 rounds below 1 MiB, 5 above); off, on: the fastest of each; "
        "overhead: the median of the rounds' on / off - 1\n",
        op_name(o.op), bench.nranks());
    std::printf("#%11s %12s %12s %12s %9s\n", "size(B)", "off(us)", "on(us)", "busbw-off", "overhead");
    std::fflush(stdout);
  }
  const wia_comm_profiling_t all = {true, true, true};
  for (const std::uint64_t bytes : sizes) {
    const std::uint64_t count = bytes / es;
    if (count == 0) continue;
    const int iters = o.iters > 0 ? o.iters
                                  : static_cast<int>(std::clamp<std::uint64_t>(
                                        (256ull << 20) / (count * es), 5, 2000));
    const int rounds = bytes < (1u << 20) ? 15 : 5;
    double off = 1e30, on = 1e30;
    std::vector<double> ratios;
    for (int round = 0; round < rounds; ++round) {
      // Off first in even rounds, on first in odd ones: whatever the
      // second timing of a pair gains or loses from the first is on both.
      auto timed_on = [&] {
        CHECK_WIA(wia_enable_comm_profiling(bench.comm(), &all));
        const double us = bench.time_us(count, false, iters);
        CHECK_WIA(wia_disable_comm_profiling(bench.comm()));
        CHECK_WIA(wia_reset_comm_profile(bench.comm()));
        return us;
      };
      double off_us = 0, on_us = 0;
      if (round % 2 == 0) {
        off_us = bench.time_us(count, false, iters);
        on_us = timed_on();
      } else {
        on_us = timed_on();
        off_us = bench.time_us(count, false, iters);
      }
      off = std::min(off, off_us);
      on = std::min(on, on_us);
      ratios.push_back(on_us / off_us - 1);
    }
    std::sort(ratios.begin(), ratios.end());
    const double median = rounds % 2
                              ? ratios[ratios.size() / 2]
                              : (ratios[ratios.size() / 2 - 1] + ratios[ratios.size() / 2]) / 2;
    if (print) {
      std::printf("%12llu %12.2f %12.2f %12.3f %8.2f%%\n", static_cast<unsigned long long>(bytes),
                  off, on, static_cast<double>(bytes) / off / 1e3, median * 100);
      std::printf("#%11s fastest on / fastest off - 1: %+.2f%%; rounds (%d): %+.2f%% .. %+.2f%%\n",
                  "", (on / off - 1) * 100, rounds, ratios.front() * 100, ratios.back() * 100);
      std::fflush(stdout);
    }
  }
  return 0;
}

// The sweep and the table, printed by rank 0 (the only rank in-process).
// --sizes, or the -b/-e/-f sweep.
std::vector<std::uint64_t> sweep_sizes(const Options& o) {
  std::vector<std::uint64_t> sizes = o.sizes;
  if (sizes.empty())
    for (std::uint64_t bytes = o.min_bytes; bytes <= o.max_bytes;
         bytes = std::max<std::uint64_t>(bytes + 1, static_cast<std::uint64_t>(bytes * o.factor)))
      sizes.push_back(bytes);
  return sizes;
}

// What --plot draws of one collective's sweep.
struct PlotPoint {
  std::uint64_t bytes = 0;
  double busbw = 0, busbw_inplace = 0, bound = 0;  // GB/s; bound 0 (one rank): none
  std::string algorithm;
};
struct PlotSeries {
  std::string op, transport;
  std::vector<PlotPoint> points;
};

// Whether the sweep prints the pass bound (Bench::pass_bound_us): an
// all-reduce of several ranks in this process.
bool pass_bound(const Options& o, const Bench& bench) {
  return !bench.distributed() && o.op == WIA_COLLECTIVE_ALLREDUCE && bench.nranks() > 1 &&
         !o.compressed;
}

// The table of one collective (o.op), its figures appended to `series`.
int run_plain_sweep(const Options& o, Bench& bench, const std::vector<std::uint64_t>& sizes,
                    bool print, PlotSeries& series) {
  series.op = op_name(o.op);
  const std::size_t es = wia::kernels::dtype_size(o.dtype);
  const int p = bench.nranks();
  if (print) {
    if (!bench.distributed()) {
      std::printf("# wia-bench: %s  ranks %d (in-process host devices)  dtype %s  redop %s\n",
                  op_name(o.op), p, wia::kernels::dtype_name(o.dtype),
                  wia::kernels::reduce_op_name(o.redop));
      std::printf("# bound = busbw of every rank copying its data once (memcpy, all ranks in "
                  "parallel), measured in this run; ratio = out-of-place busbw / bound\n");
      if (pass_bound(o, bench))
        std::printf("# pass = busbw of one hand-written pass (each element of every input reduced "
                    "once and written to every output, min(ranks, CPUs) threads, a barrier per "
                    "call), measured in this run; /pass = out-of-place busbw / pass\n");
    } else {
      const char* transport = std::getenv("WIA_TRANSPORT");
      std::printf("# wia-bench: %s  ranks %d (processes, one rank each, %d node(s), transport "
                  "%s)  dtype %s  redop %s\n",
                  op_name(o.op), p, wia_comm_node_count(bench.comm()),
                  transport && *transport ? transport : "auto: shm inside a node, tcp between",
                  wia::kernels::dtype_name(o.dtype), wia::kernels::reduce_op_name(o.redop));
      if (const char* binding = wia::tools::spawned_binding())
        std::printf("# ranks (--procs): %s\n", binding);
      std::printf("# time = slowest rank (median of 3 repetitions, each after a barrier); "
                  "#wrong = sum over ranks\n");
      std::printf("# bound = busbw of every rank copying its data once (memcpy, each rank in its "
                  "own process, all at once after a barrier, slowest rank), measured in this run; "
                  "ratio = out-of-place busbw / bound\n");
    }
    std::printf("#%11s %12s %8s %6s %18s | %9s %8s %8s %6s | %9s %8s %8s %6s | %8s %6s%s\n", "size",
                "count", "type", "redop", "algorithm", "time(us)", "algbw", "busbw", "#wrong",
                "time(us)", "algbw", "busbw", "#wrong", "bound", "ratio",
                pass_bound(o, bench) ? " |     pass  /pass" : "");
    std::printf("#%11s %12s %8s %6s %18s | %36s | %36s | %8s %6s\n", "(B)", "(elements)", "", "",
                "", "out-of-place (GB/s)", "in-place (GB/s)", "(GB/s)", "");
    std::fflush(stdout);
  }
  std::uint64_t total_wrong = 0;
  for (const std::uint64_t bytes : sizes) {
    std::uint64_t count = bytes / es;
    // Vector sizes must split evenly for the per-rank collectives.
    if (o.op == WIA_COLLECTIVE_ALLGATHER || o.op == WIA_COLLECTIVE_REDUCE_SCATTER ||
        o.op == WIA_COLLECTIVE_ALLTOALL)
      count -= count % p;
    if (count == 0) continue;
    const int iters = o.iters > 0 ? o.iters
                                  : static_cast<int>(std::clamp<std::uint64_t>(
                                        (256ull << 20) / (count * es), 5, 1000));
    const std::uint64_t wrong_oop = o.check ? bench.check(count, false) : 0;
    const double t_oop = bench.time_us(count, false, iters);
    const std::string algo = bench.last_algorithm();
    const std::uint64_t wrong_ip = o.check ? bench.check(count, true) : 0;
    const double t_ip = bench.time_us(count, true, iters);
    const double t_bound = bench.copy_bound_us(count, iters);
    const double t_pass = pass_bound(o, bench) ? bench.pass_bound_us(count, iters) : 0;
    const double gb = static_cast<double>(count * es) / 1e3;  // bytes/us -> GB/s
    const double bf = bus_factor(o.op, p);
    const double busbw_oop = gb / t_oop * bf;
    const double bound = gb / t_bound * bf;
    if (print) {
      std::printf("%12llu %12llu %8s %6s %18s | %9.2f %8.2f %8.2f %6llu | %9.2f %8.2f %8.2f %6llu "
                  "| %8.2f %6.2f",
                  static_cast<unsigned long long>(count * es), static_cast<unsigned long long>(count),
                  wia::kernels::dtype_name(o.dtype), wia::kernels::reduce_op_name(o.redop),
                  algo.c_str(), t_oop, gb / t_oop, busbw_oop,
                  static_cast<unsigned long long>(wrong_oop), t_ip, gb / t_ip, gb / t_ip * bf,
                  static_cast<unsigned long long>(wrong_ip), bound,
                  bound > 0 ? busbw_oop / bound : 0.0);  // 1 rank: no bus traffic
      if (t_pass > 0) std::printf(" | %8.2f %5.2f", gb / t_pass * bf, t_pass / t_oop);
      std::printf("\n");
      std::fflush(stdout);
    }
    total_wrong += wrong_oop + wrong_ip;
    series.points.push_back({count * es, busbw_oop, gb / t_ip * bf, bound, algo});
  }
  if (print)
    std::printf("# %s: %llu wrong element(s) in all checks\n", total_wrong ? "FAILED" : "ok",
                static_cast<unsigned long long>(total_wrong));
  return total_wrong ? 1 : 0;
}

// --plot: where wia_plot.py is. Installed: <bindir>/WIA_PLOT_REL_DIR (share/wia
// beside bin/); in the build tree: the source file, whose path is compiled in.
std::string plot_script() {
  std::vector<std::string> candidates;
  char self[4096];
  const ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  if (n > 0) {
    std::string dir(self, static_cast<std::size_t>(n));
    dir.resize(dir.rfind('/') + 1);
    candidates.push_back(dir + WIA_PLOT_REL_DIR "/wia_plot.py");
  }
  candidates.push_back(WIA_PLOT_SOURCE);
  for (const std::string& c : candidates)
    if (access(c.c_str(), R_OK) == 0) return c;
  std::string where;
  for (const std::string& c : candidates) where += (where.empty() ? "" : ", ") + c;
  std::fprintf(stderr,
               "wia-bench: --plot: wia_plot.py not found (looked at %s; cmake --install "
               "puts it in share/wia/)\n",
               where.c_str());
  return {};
}

// Debian's interpreter first: python3-matplotlib installs for it, and a
// python3 first on PATH may be a pyenv shim or venv without the module.
const char* plot_python() {
  return access("/usr/bin/python3", X_OK) == 0 ? "/usr/bin/python3" : "python3";
}

// Runs python3 wia_plot.py ARGS... with our stdout and stderr; its exit status
// (127 when it could not be started).
int run_plot_script(const std::string& script, const std::vector<std::string>& args) {
  std::vector<std::string> all{plot_python(), script};
  all.insert(all.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& a : all) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::fflush(stdout);
  std::fflush(stderr);
  // posix_spawn, not fork: the host devices' worker threads are running.
  pid_t pid = 0;
  if (const int err = posix_spawnp(&pid, argv[0], nullptr, nullptr, argv.data(), environ)) {
    std::fprintf(stderr,
                 "wia-bench: --plot: cannot run %s: %s (install python3 and "
                 "python3-matplotlib)\n",
                 argv[0], std::strerror(err));
    return 127;
  }
  int status = 0;
  while (waitpid(pid, &status, 0) < 0)
    if (errno != EINTR) return 127;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

// Before the sweep, so a long run does not end in a chart that cannot be
// drawn: FILE's directory is a writable directory, the script is found and
// matplotlib imports. False after saying why on stderr.
bool plot_precheck(const std::string& file) {
  const std::size_t slash = file.rfind('/');
  const std::string dir = slash == std::string::npos ? "."
                          : slash == 0               ? "/"
                                                     : file.substr(0, slash);
  struct stat st {};
  const char* why = nullptr;
  if (stat(dir.c_str(), &st) != 0)
    why = std::strerror(errno);
  else if (!S_ISDIR(st.st_mode))
    why = "not a directory";
  else if (access(dir.c_str(), W_OK | X_OK) != 0)
    why = std::strerror(errno);
  if (why) {
    std::fprintf(stderr, "wia-bench: --plot %s: cannot write into %s: %s\n", file.c_str(),
                 dir.c_str(), why);
    return false;
  }
  const std::string script = plot_script();
  if (script.empty()) return false;
  const int rc = run_plot_script(script, {"--check"});
  if (rc >= 128)
    std::fprintf(stderr, "wia-bench: --plot: %s %s --check died of signal %d\n", plot_python(),
                 script.c_str(), rc - 128);
  return rc == 0;
}

std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (const char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    if (static_cast<unsigned char>(c) < 0x20) {
      char esc[8];
      std::snprintf(esc, sizeof esc, "\\u%04x", c);
      out += esc;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

// null for what cannot be drawn: not finite, or (a bound) not positive.
std::string json_number(double v, bool positive = false) {
  if (!std::isfinite(v) || (positive && v <= 0)) return "null";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.6g", v);
  return buf;
}

// Writes the figures to a temporary JSON file and has wia_plot.py draw them
// into o.plot. 0, or 1 after the script or this function said why.
int write_plot(const Options& o, const Bench& bench, const std::vector<PlotSeries>& all) {
  const char* tmpdir = std::getenv("TMPDIR");
  std::string data =
      std::string(tmpdir && *tmpdir ? tmpdir : "/tmp") + "/wia-bench-plot-XXXXXX.json";
  const int fd = mkstemps(data.data(), 5);
  if (fd < 0) {
    std::fprintf(stderr, "wia-bench: --plot: cannot create a temporary file %s: %s\n", data.c_str(),
                 std::strerror(errno));
    return 1;
  }
  std::string j = "{\"comm\": ";
  if (bench.distributed())
    j +=
        json_string("processes, " + std::to_string(wia_comm_node_count(bench.comm())) + " node(s)");
  else
    j += json_string("in-process host devices");
  j += ", \"ranks\": " + std::to_string(bench.nranks());
  j += ", \"dtype\": " + json_string(wia::kernels::dtype_name(o.dtype));
  j += ", \"redop\": " + json_string(wia::kernels::reduce_op_name(o.redop));
  j += ", \"series\": [";
  for (std::size_t i = 0; i < all.size(); ++i) {
    const PlotSeries& s = all[i];
    j += std::string(i ? ",\n  " : "\n  ") + "{\"op\": " + json_string(s.op) +
         ", \"transport\": " + json_string(s.transport) + ", \"points\": [";
    for (std::size_t k = 0; k < s.points.size(); ++k) {
      const PlotPoint& p = s.points[k];
      j += std::string(k ? ", " : "") + "{\"bytes\": " + std::to_string(p.bytes) +
           ", \"busbw\": " + json_number(p.busbw) +
           ", \"busbw_inplace\": " + json_number(p.busbw_inplace) +
           ", \"bound\": " + json_number(p.bound, true) +
           ", \"algorithm\": " + json_string(p.algorithm) + "}";
    }
    j += "]}";
  }
  j += "\n]}\n";
  const bool written = write(fd, j.data(), j.size()) == static_cast<ssize_t>(j.size());
  close(fd);
  int rc = 1;
  if (!written) {
    std::fprintf(stderr, "wia-bench: --plot: cannot write %s: %s\n", data.c_str(),
                 std::strerror(errno));
  } else if (const std::string script = plot_script(); !script.empty()) {
    rc = run_plot_script(script, {data, o.plot}) == 0 ? 0 : 1;
    if (rc) std::fprintf(stderr, "wia-bench: --plot %s: not written\n", o.plot.c_str());
  }
  unlink(data.c_str());
  return rc;
}

// --predict: per size, AUTO and every applicable all-reduce algorithm
// forced, measured against the cost model's estimate for the same call.
int run_predict_sweep(const Options& o, Bench& bench, const std::vector<std::uint64_t>& sizes,
                      bool print) {
  const std::size_t es = wia::kernels::dtype_size(o.dtype);
  const int p = bench.nranks();
  struct Forced {
    wia_algorithm_id_t id;
    const char* name;
  };
  std::vector<Forced> forced = {{WIA_ALGORITHM_RING, "ring"},
                                {WIA_ALGORITHM_TREE, "tree"},
                                {WIA_ALGORITHM_BINOMIAL, "binomial"},
                                {WIA_ALGORITHM_RABENSEIFNER, "rabenseifner"},
                                {WIA_ALGORITHM_RECURSIVE_DOUBLING, "recursive_doubling"},
                                {WIA_ALGORITHM_DIRECT, "direct"}};
  if (p <= 8) forced.push_back({WIA_ALGORITHM_ONE_SHOT, "one_shot"});
  if (bench.distributed() && wia_comm_node_count(bench.comm()) > 1)
    forced.push_back({WIA_ALGORITHM_HIERARCHICAL, "hierarchical"});
  if (print) {
    const char* link_file = std::getenv("WIA_TUNER_LINK_FILE");
    const char* transport = std::getenv("WIA_TRANSPORT");
    std::printf("# wia-bench --predict: allreduce  ranks %d (%s)  dtype %s  redop %s\n", p,
                !bench.distributed() ? "in-process host devices"
                : transport && *transport ? transport
                                          : "processes, auto transport",
                wia::kernels::dtype_name(o.dtype), wia::kernels::reduce_op_name(o.redop));
    std::printf("# links: %s\n", link_file && *link_file
                                     ? link_file
                                     : "the communicator's default figures (or tuner.link_file)");
    std::printf("# measured = out-of-place time (median of 3 repetitions%s, fastest of %d "
                "alternating rounds); predicted = the "
                "cost model's estimate for that call (wia_get_selected_algorithm); ratio = "
                "predicted / measured\n",
                bench.distributed() ? ", slowest rank" : "", o.predict_rounds);
    std::printf("# auto row: the algorithm AUTO ran; auto/best = its measured time / the "
                "fastest forced algorithm's\n");
    std::printf("#%11s %-24s %12s %12s %7s  %s\n", "size(B)", "algorithm", "measured(us)",
                "predicted(us)", "ratio", "");
    std::fflush(stdout);
  }
  std::uint64_t total_wrong = 0;
  // From 64 KiB: ranges of predicted / measured and the worst AUTO / best.
  double auto_lo = 1e30, auto_hi = 0, all_lo = 1e30, all_hi = 0, worst_auto = 0;
  int rows = 0, rows_within = 0;
  for (const std::uint64_t bytes : sizes) {
    const std::uint64_t count = bytes / es;
    if (count == 0) continue;
    const int iters = o.iters > 0 ? o.iters
                                  : static_cast<int>(std::clamp<std::uint64_t>(
                                        (256ull << 20) / (count * es), 5, 1000));
    bench.set_algorithm(WIA_ALGORITHM_AUTO);
    if (o.check) total_wrong += bench.check(count, false);
    struct Row {
      std::string name;
      double measured, predicted;
    };
    // Row 0 is AUTO. The machine's speed drifts between minutes: every
    // algorithm is timed once per round, rounds alternate, and each keeps
    // its fastest round, so AUTO and the forced ones see the same drift.
    std::vector<Row> table(forced.size() + 1, Row{"", 1e30, 0});
    std::string auto_algo;
    for (int round = 0; round < o.predict_rounds; ++round)
      for (std::size_t i = 0; i < table.size(); ++i) {
        bench.set_algorithm(i == 0 ? WIA_ALGORITHM_AUTO : forced[i - 1].id);
        // Each forced algorithm's data is checked once, as AUTO's above.
        if (o.check && round == 0 && i > 0) total_wrong += bench.check(count, false);
        const double t = bench.time_us(count, false, iters);
        if (i > 0) table[i].name = forced[i - 1].name;
        if (t >= table[i].measured) continue;
        // The prediction and AUTO's pick of the round that is kept.
        table[i].measured = t;
        table[i].predicted = bench.last_estimate_us();
        if (i == 0) auto_algo = bench.last_algorithm();
      }
    bench.set_algorithm(WIA_ALGORITHM_AUTO);
    const double t_auto = table[0].measured, e_auto = table[0].predicted;
    table.erase(table.begin());
    double best = 1e30;
    std::string best_name;
    for (const Row& r : table)
      if (r.measured < best) best = r.measured, best_name = r.name;
    const bool counted = count * es >= (64u << 10);
    auto note = [&](double predicted, double measured, bool is_auto) {
      const double r = predicted / measured;
      if (!counted) return;
      all_lo = std::min(all_lo, r), all_hi = std::max(all_hi, r);
      ++rows;
      rows_within += r >= 0.75 && r <= 1.25;
      if (is_auto) auto_lo = std::min(auto_lo, r), auto_hi = std::max(auto_hi, r);
    };
    note(e_auto, t_auto, true);
    for (const Row& r : table) note(r.predicted, r.measured, false);
    worst_auto = std::max(worst_auto, t_auto / best);
    if (print) {
      std::printf("%12llu %-24s %12.2f %12.2f %7.2f  auto/best %.2f (best: %s)\n",
                  static_cast<unsigned long long>(count * es), ("auto:" + auto_algo).c_str(),
                  t_auto, e_auto, e_auto / t_auto, t_auto / best, best_name.c_str());
      for (const Row& r : table)
        std::printf("%12s %-24s %12.2f %12.2f %7.2f\n", "", r.name.c_str(), r.measured,
                    r.predicted, r.predicted / r.measured);
      std::fflush(stdout);
    }
  }
  if (print) {
    if (rows > 0)
      std::printf("# from 64 KiB: predicted/measured auto %.2f - %.2f, all rows %.2f - %.2f "
                  "(%d of %d within 25%%); auto/best at most %.2f\n",
                  auto_lo, auto_hi, all_lo, all_hi, rows_within, rows, worst_auto);
    std::printf("# %s: %llu wrong element(s) in the checks (AUTO and every forced algorithm)\n",
                total_wrong ? "FAILED" : "ok", static_cast<unsigned long long>(total_wrong));
  }
  return total_wrong ? 1 : 0;
}

int run_sweep(const Options& o, Bench& bench, bool print) {
  const std::vector<std::uint64_t> sizes = sweep_sizes(o);
  if (o.predict) return run_predict_sweep(o, bench, sizes, print);
  if (o.compressed) return run_compressed_sweep(o, bench, sizes, print);
  if (o.profile_overhead) return run_profile_overhead(o, bench, sizes, print);
  int rc = 0;
  std::vector<PlotSeries> series;
  for (const wia_collective_op_t op : o.ops) {
    Options one = o;
    one.op = op;
    bench.set_op(op);
    series.emplace_back();
    rc |= run_plain_sweep(one, bench, sizes, print, series.back());
    // Every rank takes part in the probe; rank 0 keeps the answer.
    if (!o.plot.empty() && !series.back().points.empty()) {
      const std::size_t es = wia::kernels::dtype_size(o.dtype);
      series.back().transport = bench.transport(series.back().points.front().bytes / es);
    }
  }
  if (print && !o.plot.empty() && write_plot(o, bench, series) != 0) rc = 1;
  return rc;
}

// One rank of a job: from the unique id our spawner passed, else from the
// launcher's variables.
int run_rank(const Options& o) {
  wia::tools::default_one_device_per_process();
  wia_communicator_t comm = nullptr;
  CHECK_WIA(wia::tools::join_job("wia-bench", &comm));
  const int rank = wia_comm_rank(comm);
  int rc = 0;
  {
    Bench bench(o, comm);
    rc = run_sweep(o, bench, rank == 0);
  }
  wia_finalize();
  return rc;
}

}  // namespace

int main(int argc, char** argv) {
  Options o = parse(argc, argv);
  // Inherited by the spawned ranks; each writes its file at wia_finalize.
  if (!o.trace.empty()) setenv("WIA_TRACE", o.trace.c_str(), 1);
  // The ranks --procs spawns (WIA_TOOL_UNIQUE_ID set) were checked by their parent.
  if (!o.plot.empty() && !std::getenv("WIA_TOOL_UNIQUE_ID") && !plot_precheck(o.plot)) return 1;
  if (o.procs > 0) return wia::tools::spawn_local_ranks("wia-bench", o.procs, argc, argv);
  if (o.procs_from_env || (!o.ranks_given && wia::tools::launched_by_launcher()))
    return run_rank(o);
  // In-process host devices: one per rank unless the user configured some.
  if (!std::getenv("WIA_HOST_DEVICES") && !std::getenv("WIA_CONFIG"))
    setenv("WIA_HOST_DEVICES", std::to_string(o.ranks).c_str(), 1);
  int ndev = 0;
  CHECK_WIA(wia_get_device_count(&ndev));
  if (ndev < o.ranks) {
    std::fprintf(stderr, "wia-bench: %d ranks need %d devices, %d available (WIA_HOST_DEVICES)\n",
                 o.ranks, o.ranks, ndev);
    return 1;
  }
  Bench bench(o);
  return run_sweep(o, bench, true);
}
