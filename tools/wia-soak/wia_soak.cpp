// SPDX-License-Identifier: Apache-2.0
// wia-soak: random collectives, point-to-point exchanges and communicator
// splits and frees, every result checked against a reference this program
// computes itself, while RSS, open descriptors and /dev/shm are watched for
// growth.
//
//   wia-soak [--seed S] [--ops N] [--seconds S] [--ranks N | --procs P]
//            [--transport shm|tcp] [--max-size 64M] [--rss-bound 16M]
//            [--fd-bound 0] [--verbose]
//
//  - default: device-based communicators over --ranks host devices of this
//    process (2..6, from the seed when not given);
//  - --procs P: P processes on this machine (tools/common/tool_ranks.hpp),
//    one rank each, process communicators over --transport (shm or tcp;
//    the library's default selection when not given).
//
// Every process draws the same plan from the seed (printed first, so
// `--seed S` with the same options replays a failure exactly): which
// communicator, operation, datatype, reduction, size (0 - --max-size,
// weighted toward small), algorithm, chunk count, root, and per rank
// in-place or not and a buffer offset. Inputs are small integers times a
// power of two chosen per datatype so that every sum, product, minimum and
// maximum is exact in that datatype whatever order the library reduces in:
// the reference is computed in int64 and compared exactly (AVG: within one
// unit in the last place of the datatype, integers truncated). The
// half-precision encodings are this file's own, not the library's kernels.
// 64 bytes before and after every output region are checked untouched.
//
// Leaks: after a warm-up (one operation of each kind at --max-size on the
// world communicator, one split and free), each process samples its RSS,
// its open descriptors and the /dev/shm entries whose names mention "wia"
// or one of the job's pids; at the end (every other communicator freed) it
// samples again. Growth beyond --rss-bound / --fd-bound, or any new
// /dev/shm entry, fails the run. Exit status 0: no wrong element, no
// failed call, no leak.
#include <dirent.h>
#include <malloc.h>
#include <unistd.h>
#include <wia/wia.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <functional>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "tool_ranks.hpp"

namespace {

using Clock = std::chrono::steady_clock;

// ---------------------------------------------------------------------------
// Options

struct Options {
  std::uint64_t seed = 0;
  bool seed_given = false;
  long ops = 1000;
  double seconds = 0;  // 0: --ops decides
  int ranks = 0;       // device mode; 0 = from the seed (2..6)
  int procs = 0;
  bool procs_from_env = false;
  std::string transport;
  std::uint64_t max_bytes = 64ull << 20;
  std::uint64_t rss_bound = 16ull << 20;
  long fd_bound = 0;
  bool verbose = false;
  long corrupt_op = -1;  // --corrupt-op N: the checker's self-test
};

[[noreturn]] void usage(const char* why) {
  if (why) std::fprintf(stderr, "wia-soak: %s\n", why);
  std::fprintf(stderr,
               "usage: wia-soak [--seed S] [--ops N] [--seconds S] [--ranks N | --procs P]\n"
               "                [--transport shm|tcp] [--max-size BYTES] [--rss-bound BYTES]\n"
               "                [--fd-bound N] [--verbose] [--corrupt-op N]\n"
               "--ranks N: N host devices of this process (2..6; default from the seed);\n"
               "--procs P: P processes, one rank each (2..6 for the soak);\n"
               "--ops N (default 1000) or --seconds S, whichever ends first when both are set;\n"
               "sizes take K, M, G suffixes; --corrupt-op N flips one result byte of\n"
               "operation N before it is checked (the checker's self-test: must fail).\n");
  std::exit(2);
}

std::uint64_t parse_bytes(const std::string& text) {
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  if (end == text.c_str() || v < 0) usage(("bad size '" + text + "'").c_str());
  double mult = 1;
  if (*end == 'K' || *end == 'k')
    mult = 1024, ++end;
  else if (*end == 'M' || *end == 'm')
    mult = 1024.0 * 1024, ++end;
  else if (*end == 'G' || *end == 'g')
    mult = 1024.0 * 1024 * 1024, ++end;
  if (*end != '\0') usage(("bad size '" + text + "'").c_str());
  return static_cast<std::uint64_t>(v * mult);
}

Options parse(int argc, char** argv) {
  Options o;
  bool ops_given = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) usage((a + " needs a value").c_str());
      return argv[++i];
    };
    if (a == "--seed")
      o.seed = std::strtoull(next().c_str(), nullptr, 0), o.seed_given = true;
    else if (a == "--ops")
      o.ops = std::atol(next().c_str()), ops_given = true;
    else if (a == "--seconds")
      o.seconds = std::atof(next().c_str());
    else if (a == "--ranks")
      o.ranks = std::atoi(next().c_str());
    else if (a == "--procs")
      o.procs = std::atoi(next().c_str());
    else if (a == "--procs-from-env")
      o.procs_from_env = true;
    else if (a == "--transport")
      o.transport = next();
    else if (a == "--max-size")
      o.max_bytes = parse_bytes(next());
    else if (a == "--rss-bound")
      o.rss_bound = parse_bytes(next());
    else if (a == "--fd-bound")
      o.fd_bound = std::atol(next().c_str());
    else if (a == "--verbose")
      o.verbose = true;
    else if (a == "--corrupt-op")
      o.corrupt_op = std::atol(next().c_str());
    else if (a == "-h" || a == "--help")
      usage(nullptr);
    else
      usage(("unknown option '" + a + "'").c_str());
  }
  if (o.seconds > 0 && !ops_given) o.ops = -1;  // time alone decides
  if (o.ranks != 0 && (o.ranks < 1 || o.ranks > 64)) usage("--ranks must be 1..64");
  if (o.procs < 0 || o.procs > 64) usage("--procs must be 1..64");
  if (o.ranks != 0 && (o.procs > 0 || o.procs_from_env))
    usage("--ranks (device mode) and --procs exclude each other");
  if (!o.transport.empty() && o.transport != "shm" && o.transport != "tcp")
    usage("--transport must be shm or tcp");
  if (!o.transport.empty() && o.procs == 0 && !o.procs_from_env)
    usage("--transport needs --procs (device communicators use no transport)");
  if (o.max_bytes > (1ull << 30)) usage("--max-size is at most 1G");
  return o;
}

// ---------------------------------------------------------------------------
// Random numbers: splitmix64, so every process (and every replay) draws the
// same sequence whatever the standard library's distributions do.

std::uint64_t mix(std::uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

struct Rng {
  std::uint64_t state;
  std::uint64_t next() { return mix(state++ * 0x2545f4914f6cdd1dull); }
  std::uint64_t below(std::uint64_t n) { return n ? next() % n : 0; }
  bool chance(double p) { return static_cast<double>(next() >> 11) * 0x1.0p-53 < p; }
};

// ---------------------------------------------------------------------------
// Datatypes, as this program encodes them (independently of the library).

struct TypeInfo {
  const char* name;
  std::size_t size;
  bool is_float;
  bool is_signed;
  int mant_bits;    // floats: explicit mantissa bits (ulp of AVG results)
  std::int64_t lo;  // SUM/MIN/MAX/AVG inputs: k in [lo, lo + 2^span_bits)
  int span_bits;
  int scale_log2;  // value = k * 2^scale_log2 (floats)
};

// Ranges keep six ranks' sums exact in every type (e.g. bfloat16: |k| <= 16,
// a sum of six stays below 2^8; float16: quarters up to 16, sums below 2^11
// quarters).
const TypeInfo kTypes[WIA_DATATYPE_COUNT] = {
    {"int8", 1, false, true, 0, -16, 5, 0},
    {"uint8", 1, false, false, 0, 0, 5, 0},
    {"int32", 4, false, true, 0, -(1ll << 26), 27, 0},
    {"uint32", 4, false, false, 0, 0, 28, 0},
    {"int64", 8, false, true, 0, -(1ll << 58), 59, 0},
    {"uint64", 8, false, false, 0, 0, 60, 0},
    {"float16", 2, true, true, 10, -64, 7, -2},
    {"bfloat16", 2, true, true, 7, -16, 5, 0},
    {"float32", 4, true, true, 23, -(1ll << 16), 17, -8},
    {"float64", 8, true, true, 52, -(1ll << 40), 41, -20},
};

const char* kRedopNames[] = {"sum", "prod", "min", "max", "avg"};

// Our own binary16 encoding of a value that is exactly representable as a
// normal number (or zero): every input is, by construction.
std::uint16_t to_half_exact(double v) {
  const float f = static_cast<float>(v);
  std::uint32_t bits;
  std::memcpy(&bits, &f, 4);
  const auto sign = static_cast<std::uint16_t>((bits >> 16) & 0x8000);
  if ((bits & 0x7fffffff) == 0) return sign;
  const int exp = static_cast<int>((bits >> 23) & 0xff) - 127 + 15;
  return static_cast<std::uint16_t>(sign | (exp << 10) | ((bits >> 13) & 0x3ff));
}

double from_half(std::uint16_t h) {
  const int sign = h >> 15, exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
  double v;
  if (exp == 0)
    v = std::ldexp(mant, -24);
  else if (exp == 31)
    v = mant ? NAN : INFINITY;
  else
    v = std::ldexp(1024 + mant, exp - 25);
  return sign ? -v : v;
}

double from_bfloat(std::uint16_t b) {
  const std::uint32_t bits = static_cast<std::uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// Element i = k * 2^scale_log2 (integer types: k).
void store(void* buf, std::uint64_t i, wia_datatype_t t, std::int64_t k, int scale_log2) {
  const TypeInfo& ti = kTypes[t];
  char* p = static_cast<char*>(buf) + i * ti.size;
  const double v = ti.is_float ? std::ldexp(static_cast<double>(k), scale_log2) : 0;
  switch (t) {
    case WIA_INT8: {
      const auto x = static_cast<std::int8_t>(k);
      std::memcpy(p, &x, 1);
      break;
    }
    case WIA_UINT8: {
      const auto x = static_cast<std::uint8_t>(k);
      std::memcpy(p, &x, 1);
      break;
    }
    case WIA_INT32: {
      const auto x = static_cast<std::int32_t>(k);
      std::memcpy(p, &x, 4);
      break;
    }
    case WIA_UINT32: {
      const auto x = static_cast<std::uint32_t>(k);
      std::memcpy(p, &x, 4);
      break;
    }
    case WIA_INT64: {
      std::memcpy(p, &k, 8);
      break;
    }
    case WIA_UINT64: {
      const auto x = static_cast<std::uint64_t>(k);
      std::memcpy(p, &x, 8);
      break;
    }
    case WIA_FLOAT16: {
      const auto x = to_half_exact(v);
      std::memcpy(p, &x, 2);
      break;
    }
    case WIA_BFLOAT16: {
      const float f = static_cast<float>(v);  // exact: |k| <= 16
      std::uint32_t bits;
      std::memcpy(&bits, &f, 4);
      const auto x = static_cast<std::uint16_t>(bits >> 16);
      std::memcpy(p, &x, 2);
      break;
    }
    case WIA_FLOAT32: {
      const auto x = static_cast<float>(v);
      std::memcpy(p, &x, 4);
      break;
    }
    case WIA_FLOAT64: {
      std::memcpy(p, &v, 8);
      break;
    }
    default:
      break;
  }
}

// An element as int64 (integer types) or double (floats).
std::int64_t load_int(const void* buf, std::uint64_t i, wia_datatype_t t) {
  const char* p = static_cast<const char*>(buf) + i * kTypes[t].size;
  switch (t) {
    case WIA_INT8: {
      std::int8_t x;
      std::memcpy(&x, p, 1);
      return x;
    }
    case WIA_UINT8: {
      std::uint8_t x;
      std::memcpy(&x, p, 1);
      return x;
    }
    case WIA_INT32: {
      std::int32_t x;
      std::memcpy(&x, p, 4);
      return x;
    }
    case WIA_UINT32: {
      std::uint32_t x;
      std::memcpy(&x, p, 4);
      return x;
    }
    case WIA_INT64: {
      std::int64_t x;
      std::memcpy(&x, p, 8);
      return x;
    }
    case WIA_UINT64: {
      std::uint64_t x;
      std::memcpy(&x, p, 8);
      return static_cast<std::int64_t>(x);
    }
    default:
      return 0;
  }
}
double load_float(const void* buf, std::uint64_t i, wia_datatype_t t) {
  const char* p = static_cast<const char*>(buf) + i * kTypes[t].size;
  switch (t) {
    case WIA_FLOAT16: {
      std::uint16_t x;
      std::memcpy(&x, p, 2);
      return from_half(x);
    }
    case WIA_BFLOAT16: {
      std::uint16_t x;
      std::memcpy(&x, p, 2);
      return from_bfloat(x);
    }
    case WIA_FLOAT32: {
      float x;
      std::memcpy(&x, p, 4);
      return x;
    }
    case WIA_FLOAT64: {
      double x;
      std::memcpy(&x, p, 8);
      return x;
    }
    default:
      return 0;
  }
}

// ---------------------------------------------------------------------------
// One operation's plan, drawn identically by every process.

enum class OpKind {
  kAllReduce,
  kBroadcast,
  kReduce,
  kAllGather,
  kReduceScatter,
  kAllToAll,
  kSendRecv
};
const char* kOpNames[] = {"allreduce",     "broadcast", "reduce",  "allgather",
                          "reducescatter", "alltoall",  "sendrecv"};

const char* algo_name(wia_algorithm_id_t a) {
  switch (a) {
    case WIA_ALGORITHM_AUTO:
      return "auto";
    case WIA_ALGORITHM_RING:
      return "ring";
    case WIA_ALGORITHM_TREE:
      return "tree";
    case WIA_ALGORITHM_BINOMIAL:
      return "binomial";
    case WIA_ALGORITHM_RABENSEIFNER:
      return "rabenseifner";
    case WIA_ALGORITHM_RECURSIVE_DOUBLING:
      return "recursive_doubling";
    case WIA_ALGORITHM_RECURSIVE_HALVING:
      return "recursive_halving";
    case WIA_ALGORITHM_BRUCK:
      return "bruck";
    case WIA_ALGORITHM_CHAIN:
      return "chain";
    case WIA_ALGORITHM_SCATTER_ALLGATHER:
      return "scatter_allgather";
    case WIA_ALGORITHM_DIRECT:
      return "direct";
    case WIA_ALGORITHM_PAIRWISE:
      return "pairwise";
    case WIA_ALGORITHM_ONE_SHOT:
      return "one_shot";
    default:
      return "?";
  }
}

// The algorithms each collective has (docs/collectives.md); hierarchical
// is left out: it needs a rank grouping these one-node communicators lack.
std::vector<wia_algorithm_id_t> algorithms_of(OpKind k) {
  switch (k) {
    case OpKind::kAllReduce:
      return {WIA_ALGORITHM_RING,
              WIA_ALGORITHM_TREE,
              WIA_ALGORITHM_BINOMIAL,
              WIA_ALGORITHM_RABENSEIFNER,
              WIA_ALGORITHM_RECURSIVE_DOUBLING,
              WIA_ALGORITHM_DIRECT,
              WIA_ALGORITHM_ONE_SHOT};
    case OpKind::kBroadcast:
      return {WIA_ALGORITHM_BINOMIAL, WIA_ALGORITHM_CHAIN, WIA_ALGORITHM_SCATTER_ALLGATHER};
    case OpKind::kReduce:
      return {WIA_ALGORITHM_BINOMIAL, WIA_ALGORITHM_CHAIN};
    case OpKind::kAllGather:
      return {WIA_ALGORITHM_RING, WIA_ALGORITHM_RECURSIVE_DOUBLING, WIA_ALGORITHM_BRUCK};
    case OpKind::kReduceScatter:
      return {WIA_ALGORITHM_RING, WIA_ALGORITHM_RECURSIVE_HALVING};
    case OpKind::kAllToAll:
      return {WIA_ALGORITHM_DIRECT, WIA_ALGORITHM_PAIRWISE};
    default:
      return {};
  }
}

struct Op {
  long index = 0;
  std::uint64_t seed = 0;  // of the inputs
  int comm = 0;            // index into the pool
  OpKind kind{};
  wia_datatype_t dtype = WIA_FLOAT32;
  wia_reduce_op_t redop = WIA_REDUCE_SUM;
  wia_algorithm_id_t algo = WIA_ALGORITHM_AUTO;
  std::uint32_t chunks = 0;
  std::uint64_t n = 0;  // elements per rank (all-reduce, broadcast, reduce,
                        // send/recv: the vector; the others: one block)
  int root = 0;
  bool shards_api = false;             // all-to-all through wia_all_to_all
  std::vector<std::uint8_t> in_place;  // per comm rank
  std::vector<std::uint32_t> offset;   // per comm rank, elements
  std::vector<int> partner;            // send/recv: per comm rank, -1 = none

  // Inputs are k * 2^scale(); products are of plain small integers.
  int scale() const { return redop == WIA_REDUCE_PROD ? 0 : kTypes[dtype].scale_log2; }

  std::string describe(const std::vector<int>& members) const {
    std::string m;
    for (std::size_t i = 0; i < members.size(); ++i)
      m += (i ? "," : "") + std::to_string(members[i]);
    std::string ip, off;
    for (auto x : in_place) ip += x ? '1' : '0';
    for (std::size_t i = 0; i < offset.size(); ++i)
      off += (i ? "," : "") + std::to_string(offset[i]);
    char buf[512];
    std::snprintf(buf, sizeof buf,
                  "op #%ld: %s on comm %d (world ranks %s) dtype %s redop %s count %llu algo %s "
                  "chunks %u root %d in-place %s offsets %s%s",
                  index, kOpNames[static_cast<int>(kind)], comm, m.c_str(), kTypes[dtype].name,
                  kRedopNames[redop], static_cast<unsigned long long>(n), algo_name(algo), chunks,
                  root, ip.c_str(), off.c_str(), shards_api ? " (shards api)" : "");
    return buf;
  }
};

// Bytes of the whole vector: weighted toward small so a run of thousands
// stays quick, but every band up to `max` is reached.
std::uint64_t draw_bytes(Rng& rng, std::uint64_t max) {
  const std::uint64_t r = rng.below(1000);
  if (r < 30) return 0;
  double lo = 1, hi;
  if (r < 600)
    hi = 4096;  // 57%: up to 4 KiB
  else if (r < 900)
    lo = 4096, hi = 1 << 20;  // 30%: to 1 MiB
  else if (r < 985)
    lo = 1 << 20, hi = 8 << 20;  // 8.5%: to 8 MiB
  else
    lo = 8 << 20, hi = 64 << 20;  // 1.5%: to 64 MiB
  hi = std::min<double>(hi, static_cast<double>(max));
  lo = std::min(lo, hi);
  const double u = static_cast<double>(rng.next() >> 11) * 0x1.0p-53;
  return static_cast<std::uint64_t>(std::exp(std::log(lo) + u * (std::log(hi) - std::log(lo))));
}

// ---------------------------------------------------------------------------
// Input values and the reference.

// Per-rank stream of inputs: element i of comm rank r of an operation.
struct Gen {
  std::uint64_t base;
  wia_datatype_t t;
  bool prod;
  int shift;
  std::int64_t lo;
  Gen(std::uint64_t op_seed, int rank, wia_datatype_t type, wia_reduce_op_t redop)
      : base(mix(op_seed ^ mix(static_cast<std::uint64_t>(rank) + 1))),
        t(type),
        prod(redop == WIA_REDUCE_PROD),
        shift(64 - kTypes[type].span_bits),
        lo(kTypes[type].lo) {}
  std::int64_t operator()(std::uint64_t i) const {
    const std::uint64_t h = mix(base + i * 0x9e3779b97f4a7c15ull);
    if (prod) {
      // Products of six stay exact: |k| <= 2 (unsigned types: 1 or 2).
      if (!kTypes[t].is_signed) return 1 + static_cast<std::int64_t>(h >> 63);
      static const std::int64_t kProd[4] = {-2, -1, 1, 2};
      return kProd[h >> 62];
    }
    return lo + static_cast<std::int64_t>(h >> shift);
  }
};

// ---------------------------------------------------------------------------
// Leak watch.

struct Sample {
  std::uint64_t rss = 0;
  long fds = 0;
  std::set<std::string> shm;
};

std::set<std::string> shm_entries(const std::vector<long>& pids) {
  std::set<std::string> out;
  DIR* d = opendir("/dev/shm");
  if (!d) return out;
  while (dirent* e = readdir(d)) {
    const std::string name = e->d_name;
    if (name == "." || name == "..") continue;
    std::string lower = name;
    for (auto& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    bool ours = lower.find("wia") != std::string::npos;
    for (long pid : pids) ours |= name.find(std::to_string(pid)) != std::string::npos;
    if (ours) out.insert(name);
  }
  closedir(d);
  return out;
}

Sample sample(const std::vector<long>& pids) {
  Sample s;
  // Free memory glibc keeps in its heaps is not a leak: hand it back first
  // (see main() for the thresholds), so RSS counts what is live.
  malloc_trim(0);
  std::ifstream statm("/proc/self/statm");
  std::uint64_t size = 0, resident = 0;
  statm >> size >> resident;
  s.rss = resident * static_cast<std::uint64_t>(sysconf(_SC_PAGESIZE));
  if (DIR* d = opendir("/proc/self/fd")) {
    while (dirent* e = readdir(d))
      if (e->d_name[0] != '.') ++s.fds;
    closedir(d);
    --s.fds;  // the DIR's own descriptor
  }
  s.shm = shm_entries(pids);
  return s;
}

// ---------------------------------------------------------------------------
// The soak.

[[noreturn]] void die(const std::string& what, wia_status_t st, const std::string& op,
                      std::uint64_t seed) {
  std::fprintf(stderr, "wia-soak: FAILED: %s: %s\n  %s\n  during %s\n  replay with --seed %llu\n",
               what.c_str(), wia_status_string(st), wia_get_last_error(), op.c_str(),
               static_cast<unsigned long long>(seed));
  std::exit(1);
}

struct CommEntry {
  std::vector<int> members;             // world ranks (device mode: devices), comm rank order
  wia_communicator_t handle = nullptr;  // null where this process is not a member
  bool live = true;
};

struct LocalRank {
  int world = 0;
  wia_device_t device = 0;
  wia_stream_t stream = nullptr;  // null: the device's default stream
  char* in = nullptr;
  char* out = nullptr;
};

constexpr std::size_t kGuard = 64;       // bytes checked untouched around outputs
constexpr std::uint32_t kMaxOffset = 7;  // elements
constexpr unsigned char kCanary = 0xc3;

class Soak {
 public:
  // make_world: a new communicator over every rank (the soak's comm 0),
  // made twice: for the warm-up and for the run, so that the leak watch's
  // samples are taken with no communicator of the soak alive, and what a
  // communicator caches while it lives (scratch grown to its largest
  // call) counts only if it outlives it. `agree`: the job's own
  // communicator, for the --seconds agreement (process mode).
  Soak(const Options& o, std::function<wia_communicator_t()> make_world, wia_communicator_t agree,
       int world_size, std::vector<LocalRank> local, bool distributed)
      : o_(o),
        make_world_(std::move(make_world)),
        agree_(agree),
        world_size_(world_size),
        local_(std::move(local)),
        distributed_(distributed) {
    CommEntry w;
    for (int r = 0; r < world_size; ++r) w.members.push_back(r);
    w.live = false;
    comms_.push_back(w);
    cap_ = o.max_bytes + 2 * kGuard + kMaxOffset * 8 + 64;
    for (LocalRank& k : local_) {
      check(wia_malloc_on(k.device, reinterpret_cast<void**>(&k.in), cap_), "wia_malloc_on");
      check(wia_malloc_on(k.device, reinterpret_cast<void**>(&k.out), cap_), "wia_malloc_on");
      std::memset(k.in, 0, cap_);  // resident from the start, not grown into
      std::memset(k.out, 0, cap_);
    }
    expected_.assign(cap_, 0);
    rng_.state = mix(o.seed);
  }
  ~Soak() {
    for (LocalRank& k : local_) {
      wia_free(k.in);
      wia_free(k.out);
    }
  }

  void set_pids(std::vector<long> pids) { pids_ = std::move(pids); }

  // Runs the soak; returns the number of wrong elements and failed checks
  // seen by this process.
  int run() {
    const auto start = Clock::now();
    new_world();
    warm_up();
    free_all();
    before_ = sample(pids_);
    new_world();
    long done = static_cast<long>(ops_run_);
    for (long step = 0;; ++step) {
      if (o_.ops >= 0 && done >= o_.ops) break;
      if (o_.seconds > 0 && step % 8 == 0 && time_is_up(start)) break;
      const std::uint64_t r = rng_.below(1000);
      const int live = live_count();
      if (r < 20 && live < 6)
        split();
      else if (r < 40 && live > 1)
        free_one();
      else
        run_op(draw_op(pick_comm())), ++done;
    }
    free_all();
    after_ = sample(pids_);
    seconds_ = std::chrono::duration<double>(Clock::now() - start).count();
    return static_cast<int>(std::min<std::uint64_t>(wrong_, 1u << 30));
  }

  std::uint64_t wrong() const { return wrong_; }
  std::uint64_t ops_run() const { return ops_run_; }
  std::uint64_t bytes_checked() const { return bytes_checked_; }
  std::uint64_t splits() const { return splits_; }
  std::uint64_t frees() const { return frees_; }
  double seconds() const { return seconds_; }
  const Sample& before() const { return before_; }
  const Sample& after() const { return after_; }

 private:
  void check(wia_status_t st, const std::string& what) {
    if (st != WIA_SUCCESS) die(what, st, current_, o_.seed);
  }

  int live_count() const {
    int n = 0;
    for (const auto& c : comms_) n += c.live;
    return n;
  }

  int pick_comm() {
    std::vector<int> live;
    for (std::size_t c = 0; c < comms_.size(); ++c)
      if (comms_[c].live) live.push_back(static_cast<int>(c));
    return live[rng_.below(live.size())];
  }

  // Whether every process agrees that --seconds has passed (rank 0's clock
  // decides, through a small all-reduce on the world communicator).
  bool time_is_up(Clock::time_point start) {
    std::int32_t up =
        std::chrono::duration<double>(Clock::now() - start).count() >= o_.seconds ? 1 : 0;
    if (!distributed_) return up != 0;
    if (local_[0].world != 0) up = 0;
    wia_collective_config_t cfg{};
    cfg.datatype = WIA_INT32;
    cfg.reduction_op = WIA_REDUCE_MAX;
    current_ = "the --seconds agreement";
    check(wia_all_reduce(agree_, &up, &up, 1, &cfg, nullptr), "wia_all_reduce");
    check(wia_stream_synchronize(nullptr), "wia_stream_synchronize");
    return up != 0;
  }

  // One operation of each kind at --max-size on the world communicator and
  // one split and free, so that caches and staging buffers sized by the
  // largest call exist before the leak watch's first sample.
  void warm_up() {
    for (int k = 0; k <= static_cast<int>(OpKind::kSendRecv); ++k) {
      Op op = draw_op(0, static_cast<OpKind>(k), o_.max_bytes);
      run_op(op);
    }
    split();
  }

  void new_world() {
    current_ = "creating the world communicator";
    comms_[0].handle = make_world_();
    comms_[0].live = true;
  }
  void free_all() {
    for (std::size_t c = 0; c < comms_.size(); ++c)
      if (comms_[c].live) free_comm(static_cast<int>(c));
  }

  Op draw_op(int comm, std::optional<OpKind> forced = std::nullopt,
             std::uint64_t forced_bytes = ~0ull) {
    const CommEntry& c = comms_[static_cast<std::size_t>(comm)];
    const int p = static_cast<int>(c.members.size());
    Op op;
    op.index = static_cast<long>(ops_run_);
    op.seed = rng_.next();
    op.comm = comm;
    static const int kWeights[] = {25, 12, 12, 13, 13, 13, 12};
    int w = static_cast<int>(rng_.below(100));
    int k = 0;
    while (w >= kWeights[k]) w -= kWeights[k], ++k;
    op.kind = forced ? *forced : static_cast<OpKind>(k);
    op.dtype = static_cast<wia_datatype_t>(rng_.below(WIA_DATATYPE_COUNT));
    op.redop = static_cast<wia_reduce_op_t>(rng_.below(WIA_REDUCE_OP_COUNT));
    const std::uint64_t bytes =
        forced_bytes != ~0ull ? forced_bytes : draw_bytes(rng_, o_.max_bytes);
    const std::uint64_t es = kTypes[op.dtype].size;
    std::uint64_t count = bytes / es;
    const bool blocks = op.kind == OpKind::kAllGather || op.kind == OpKind::kReduceScatter ||
                        op.kind == OpKind::kAllToAll;
    op.n = blocks ? count / static_cast<std::uint64_t>(p) : count;
    const auto algos = algorithms_of(op.kind);
    if (!algos.empty() && rng_.chance(0.5)) op.algo = algos[rng_.below(algos.size())];
    if (rng_.chance(0.3)) op.chunks = 1 + static_cast<std::uint32_t>(rng_.below(8));
    op.root = static_cast<int>(rng_.below(static_cast<std::uint64_t>(p)));
    op.shards_api = rng_.chance(0.5);
    op.in_place.resize(static_cast<std::size_t>(p));
    op.offset.resize(static_cast<std::size_t>(p));
    op.partner.assign(static_cast<std::size_t>(p), -1);
    // All-to-all in place needs every rank's shards in place (through the
    // contiguous API: send == recv); the other collectives mix freely.
    const bool all_in_place = rng_.chance(0.5);
    for (int r = 0; r < p; ++r) {
      // (A send and a receive on one buffer would overwrite what is sent.)
      op.in_place[static_cast<std::size_t>(r)] =
          op.kind == OpKind::kAllToAll ? all_in_place
                                       : rng_.chance(0.4) && op.kind != OpKind::kSendRecv;
      op.offset[static_cast<std::size_t>(r)] =
          rng_.chance(0.25) ? static_cast<std::uint32_t>(1 + rng_.below(kMaxOffset)) : 0;
    }
    if (op.kind == OpKind::kSendRecv) {
      // A random matching of the ranks; each pair exchanges both ways.
      std::vector<int> order(static_cast<std::size_t>(p));
      for (int r = 0; r < p; ++r) order[static_cast<std::size_t>(r)] = r;
      for (int r = p - 1; r > 0; --r)
        std::swap(order[static_cast<std::size_t>(r)],
                  order[rng_.below(static_cast<std::uint64_t>(r) + 1)]);
      for (int i = 0; i + 1 < p; i += 2) {
        op.partner[static_cast<std::size_t>(order[i])] = order[i + 1];
        op.partner[static_cast<std::size_t>(order[i + 1])] = order[i];
      }
    }
    return op;
  }

  // Where this comm rank's input and output live for `op`.
  struct Buffers {
    char* send;
    char* recv;
    char* out;                // where the result is read back
    std::uint64_t out_elems;  // elements of the result region
    char* region;             // the whole region the call may write
    std::uint64_t region_bytes;
  };
  Buffers buffers(const Op& op, int r, const LocalRank& k, int p) const {
    const std::uint64_t es = kTypes[op.dtype].size;
    const std::uint64_t off = op.offset[static_cast<std::size_t>(r)] * es;
    const bool ip = op.in_place[static_cast<std::size_t>(r)] != 0;
    const std::uint64_t n = op.n, P = static_cast<std::uint64_t>(p);
    char* in = k.in + kGuard + off;
    char* out = k.out + kGuard + off;
    Buffers b{};
    switch (op.kind) {
      case OpKind::kAllGather:
        b.recv = out;
        b.send = ip ? out + static_cast<std::uint64_t>(r) * n * es : in;
        b.out = out, b.out_elems = n * P;
        break;
      case OpKind::kReduceScatter:
        b.send = ip ? out : in;
        b.recv = ip ? out + static_cast<std::uint64_t>(r) * n * es : out;
        b.out = b.recv, b.out_elems = n;
        break;
      case OpKind::kAllToAll:
        b.send = ip ? out : in;
        b.recv = out;
        b.out = out, b.out_elems = n * P;
        break;
      default:
        b.send = ip ? out : in;
        b.recv = out;
        b.out = out, b.out_elems = n;
        break;
    }
    b.region = out;
    b.region_bytes = (op.kind == OpKind::kAllGather || op.kind == OpKind::kReduceScatter ||
                      op.kind == OpKind::kAllToAll)
                         ? n * P * es
                         : n * es;
    return b;
  }

  // Fills this comm rank's input (where the call reads it) and the guards.
  void prepare(const Op& op, int r, LocalRank& k, int p) {
    const Buffers b = buffers(op, r, k, p);
    const std::uint64_t es = kTypes[op.dtype].size;
    const Gen gen(op.seed, r, op.dtype, op.redop);
    std::uint64_t in_elems = op.n;
    if (op.kind == OpKind::kReduceScatter || op.kind == OpKind::kAllToAll)
      in_elems = op.n * static_cast<std::uint64_t>(p);
    if (op.kind != OpKind::kBroadcast || r == op.root || op.in_place[static_cast<std::size_t>(r)])
      for (std::uint64_t i = 0; i < in_elems; ++i) store(b.send, i, op.dtype, gen(i), op.scale());
    if (op.kind == OpKind::kBroadcast && r != op.root)
      // Non-root broadcast inputs are never read: garbage proves it.
      std::memset(b.send, 0x5a, in_elems * es);
    std::memset(b.region - kGuard, kCanary, kGuard);
    std::memset(b.region + b.region_bytes, kCanary, kGuard);
  }

  void report_wrong(const Op& op, const std::string& what) {
    if (wrong_reports_++ < 10)
      std::fprintf(stderr, "wia-soak: WRONG: %s\n  in %s\n  replay with --seed %llu\n",
                   what.c_str(),
                   op.describe(comms_[static_cast<std::size_t>(op.comm)].members).c_str(),
                   static_cast<unsigned long long>(o_.seed));
  }

  // Counts wrong elements of comm rank r's result.
  void verify(const Op& op, int r, const LocalRank& k, int p) {
    const Buffers b = buffers(op, r, k, p);
    const TypeInfo& ti = kTypes[op.dtype];
    const std::uint64_t n = op.n;
    std::uint64_t bad = 0;
    for (std::size_t g = 0; g < kGuard; ++g) {
      if (static_cast<unsigned char>(b.region[-1 - static_cast<std::ptrdiff_t>(g)]) != kCanary ||
          static_cast<unsigned char>(b.region[b.region_bytes + g]) != kCanary) {
        ++bad;
      }
    }
    if (bad) {
      report_wrong(op, "comm rank " + std::to_string(r) + ": " + std::to_string(bad) +
                           " guard byte(s) around the output were overwritten");
      wrong_ += bad;
      bad = 0;
    }
    std::vector<Gen> gens;
    for (int q = 0; q < p; ++q) gens.emplace_back(op.seed, q, op.dtype, op.redop);
    // The exact reduction of element i over the ranks, in int64.
    auto reduced = [&](std::uint64_t i) {
      std::int64_t acc = gens[0](i);
      for (int q = 1; q < p; ++q) {
        const std::int64_t v = gens[static_cast<std::size_t>(q)](i);
        switch (op.redop) {
          case WIA_REDUCE_PROD:
            acc *= v;
            break;
          case WIA_REDUCE_MIN:
            acc = std::min(acc, v);
            break;
          case WIA_REDUCE_MAX:
            acc = std::max(acc, v);
            break;
          default:
            acc += v;
            break;
        }
      }
      return acc;
    };
    std::uint64_t first_bad = ~0ull;
    std::string first_text;
    auto expect = [&](std::uint64_t idx, std::int64_t k_want, bool average) {
      bool ok;
      double got_v = 0, want_v = 0;
      if (!ti.is_float) {
        std::int64_t want = k_want;
        if (average) want = k_want / p;  // one truncating division
        const std::int64_t got = load_int(b.out, idx, op.dtype);
        // Unsigned 64-bit values stay below 2^63 here.
        ok = got == want;
        got_v = static_cast<double>(got), want_v = static_cast<double>(want);
      } else {
        want_v = std::ldexp(static_cast<double>(k_want), op.scale());
        got_v = load_float(b.out, idx, op.dtype);
        if (!average) {
          ok = got_v == want_v;
        } else {
          want_v /= p;
          int e = 0;
          std::frexp(std::max(std::fabs(want_v), 1e-300), &e);
          const double ulp = std::ldexp(1.0, e - 1 - ti.mant_bits);
          ok = std::fabs(got_v - want_v) <= ulp;
        }
      }
      if (!ok) {
        if (bad == 0) {
          first_bad = idx;
          char t[160];
          std::snprintf(t, sizeof t, "got %.17g, want %.17g", got_v, want_v);
          first_text = t;
        }
        ++bad;
      }
    };
    const bool avg = op.redop == WIA_REDUCE_AVG &&
                     (op.kind == OpKind::kAllReduce || op.kind == OpKind::kReduce ||
                      op.kind == OpKind::kReduceScatter);
    const auto P = static_cast<std::uint64_t>(p);
    if (!avg) {
      // Exact results: the expected bytes in the datatype, compared at once;
      // element by element only where they differ. Results every rank
      // shares are encoded once per operation.
      const bool shared = op.kind == OpKind::kAllReduce || op.kind == OpKind::kReduce ||
                          op.kind == OpKind::kBroadcast || op.kind == OpKind::kAllGather;
      if (op.kind == OpKind::kReduce && r != op.root) return;
      const int from = op.kind == OpKind::kSendRecv ? op.partner[static_cast<std::size_t>(r)] : 0;
      if (from < 0) return;
      const int sc = op.scale();
      char* e = expected_.data();
      if (!shared || expected_for_ != op.index) {
        switch (op.kind) {
          case OpKind::kAllReduce:
          case OpKind::kReduce:
            for (std::uint64_t i = 0; i < n; ++i) store(e, i, op.dtype, reduced(i), sc);
            break;
          case OpKind::kBroadcast:
            for (std::uint64_t i = 0; i < n; ++i)
              store(e, i, op.dtype, gens[static_cast<std::size_t>(op.root)](i), sc);
            break;
          case OpKind::kAllGather:
            for (std::uint64_t q = 0; q < P; ++q)
              for (std::uint64_t i = 0; i < n; ++i) store(e, q * n + i, op.dtype, gens[q](i), sc);
            break;
          case OpKind::kReduceScatter:
            for (std::uint64_t i = 0; i < n; ++i)
              store(e, i, op.dtype, reduced(static_cast<std::uint64_t>(r) * n + i), sc);
            break;
          case OpKind::kAllToAll:
            for (std::uint64_t q = 0; q < P; ++q)
              for (std::uint64_t i = 0; i < n; ++i)
                store(e, q * n + i, op.dtype, gens[q](static_cast<std::uint64_t>(r) * n + i), sc);
            break;
          case OpKind::kSendRecv:
            for (std::uint64_t i = 0; i < n; ++i)
              store(e, i, op.dtype, gens[static_cast<std::size_t>(from)](i), sc);
            break;
        }
        expected_for_ = shared ? op.index : -1;
      }
      const std::uint64_t bytes = b.out_elems * ti.size;
      bytes_checked_ += bytes;
      if (std::memcmp(b.out, e, bytes) == 0) return;
      for (std::uint64_t i = 0; i < b.out_elems; ++i) {
        if (std::memcmp(b.out + i * ti.size, e + i * ti.size, ti.size) == 0) continue;
        if (bad == 0) {
          first_bad = i;
          char t[160];
          if (ti.is_float)
            std::snprintf(t, sizeof t, "got %.17g, want %.17g", load_float(b.out, i, op.dtype),
                          load_float(e, i, op.dtype));
          else
            std::snprintf(t, sizeof t, "got %lld, want %lld",
                          static_cast<long long>(load_int(b.out, i, op.dtype)),
                          static_cast<long long>(load_int(e, i, op.dtype)));
          first_text = t;
        }
        ++bad;
      }
      report_wrong(op, "comm rank " + std::to_string(r) + ": " + std::to_string(bad) +
                           " wrong element(s), first at " + std::to_string(first_bad) + ": " +
                           first_text);
      wrong_ += bad;
      return;
    }
    switch (op.kind) {
      case OpKind::kAllReduce:
        for (std::uint64_t i = 0; i < n; ++i) expect(i, reduced(i), avg);
        break;
      case OpKind::kReduce:
        if (r == op.root)
          for (std::uint64_t i = 0; i < n; ++i) expect(i, reduced(i), avg);
        break;
      case OpKind::kBroadcast:
        for (std::uint64_t i = 0; i < n; ++i)
          expect(i, gens[static_cast<std::size_t>(op.root)](i), false);
        break;
      case OpKind::kAllGather:
        for (std::uint64_t q = 0; q < P; ++q)
          for (std::uint64_t i = 0; i < n; ++i) expect(q * n + i, gens[q](i), false);
        break;
      case OpKind::kReduceScatter:
        for (std::uint64_t i = 0; i < n; ++i)
          expect(i, reduced(static_cast<std::uint64_t>(r) * n + i), avg);
        break;
      case OpKind::kAllToAll:
        for (std::uint64_t q = 0; q < P; ++q)
          for (std::uint64_t i = 0; i < n; ++i)
            expect(q * n + i, gens[q](static_cast<std::uint64_t>(r) * n + i), false);
        break;
      case OpKind::kSendRecv: {
        const int from = op.partner[static_cast<std::size_t>(r)];
        if (from >= 0)
          for (std::uint64_t i = 0; i < n; ++i)
            expect(i, gens[static_cast<std::size_t>(from)](i), false);
        break;
      }
    }
    bytes_checked_ += b.out_elems * ti.size;
    if (bad) {
      report_wrong(op, "comm rank " + std::to_string(r) + ": " + std::to_string(bad) +
                           " wrong element(s), first at " + std::to_string(first_bad) + ": " +
                           first_text);
      wrong_ += bad;
    }
  }

  void post(const Op& op, int r, LocalRank& k, int p) {
    const CommEntry& c = comms_[static_cast<std::size_t>(op.comm)];
    const Buffers b = buffers(op, r, k, p);
    wia_collective_config_t cfg{};
    cfg.reduction_op = op.redop;
    cfg.datatype = op.dtype;
    cfg.algorithm = op.algo;
    cfg.num_chunks = op.chunks;
    const std::uint64_t es = kTypes[op.dtype].size;
    wia_status_t st = WIA_SUCCESS;
    const char* what = kOpNames[static_cast<int>(op.kind)];
    switch (op.kind) {
      case OpKind::kAllReduce:
        cfg.operation = WIA_COLLECTIVE_ALLREDUCE;
        st = wia_all_reduce(c.handle, b.send, b.recv, op.n, &cfg, k.stream);
        break;
      case OpKind::kBroadcast:
        cfg.operation = WIA_COLLECTIVE_BROADCAST;
        if (op.in_place[static_cast<std::size_t>(r)] && op.algo == WIA_ALGORITHM_AUTO &&
            op.chunks == 0)
          st = wia_broadcast(c.handle, b.recv, op.n, op.root, op.dtype, k.stream);
        else
          st = wia_broadcast_ex(c.handle, b.send, b.recv, op.n, op.root, &cfg, k.stream);
        break;
      case OpKind::kReduce:
        cfg.operation = WIA_COLLECTIVE_REDUCE;
        st = wia_reduce(c.handle, b.send, b.recv, op.n, op.root, &cfg, k.stream);
        break;
      case OpKind::kAllGather:
        cfg.operation = WIA_COLLECTIVE_ALLGATHER;
        st = wia_all_gather_ex(c.handle, b.send, b.recv, op.n, &cfg, k.stream);
        break;
      case OpKind::kReduceScatter:
        cfg.operation = WIA_COLLECTIVE_REDUCE_SCATTER;
        st = wia_reduce_scatter(c.handle, b.send, b.recv, op.n, &cfg, k.stream);
        break;
      case OpKind::kAllToAll: {
        cfg.operation = WIA_COLLECTIVE_ALLTOALL;
        if (op.shards_api) {
          std::vector<void*> sends(static_cast<std::size_t>(p)), recvs(static_cast<std::size_t>(p));
          for (int j = 0; j < p; ++j) {
            sends[static_cast<std::size_t>(j)] = b.send + static_cast<std::uint64_t>(j) * op.n * es;
            recvs[static_cast<std::size_t>(j)] = b.recv + static_cast<std::uint64_t>(j) * op.n * es;
          }
          st = wia_all_to_all(c.handle, sends.data(), recvs.data(), op.n, &cfg, k.stream);
        } else {
          st = wia_all_to_all_contiguous(c.handle, b.send, b.recv, op.n, &cfg, k.stream);
        }
        break;
      }
      case OpKind::kSendRecv: {
        const int peer = op.partner[static_cast<std::size_t>(r)];
        if (peer < 0) break;
        // The lower rank of a pair sends first, the higher receives first,
        // so neither waits on the other whatever the transport buffers.
        if (r < peer) {
          st = wia_comm_send(c.handle, b.send, op.n, op.dtype, peer, k.stream);
          if (st == WIA_SUCCESS)
            st = wia_comm_recv(c.handle, b.recv, op.n, op.dtype, peer, k.stream);
        } else {
          st = wia_comm_recv(c.handle, b.recv, op.n, op.dtype, peer, k.stream);
          if (st == WIA_SUCCESS)
            st = wia_comm_send(c.handle, b.send, op.n, op.dtype, peer, k.stream);
        }
        break;
      }
    }
    check(st, what);
  }

  // The comm rank of local rank k in comm c, or -1.
  int comm_rank(const CommEntry& c, const LocalRank& k) const {
    for (std::size_t i = 0; i < c.members.size(); ++i)
      if (c.members[i] == k.world) return static_cast<int>(i);
    return -1;
  }

  void run_op(const Op& op) {
    const CommEntry& c = comms_[static_cast<std::size_t>(op.comm)];
    const int p = static_cast<int>(c.members.size());
    current_ = op.describe(c.members);
    if (o_.verbose && (local_[0].world == 0 || !distributed_))
      std::printf("%s\n", current_.c_str()), std::fflush(stdout);
    ++ops_run_;
    std::vector<std::pair<int, LocalRank*>> mine;
    for (LocalRank& k : local_) {
      const int r = comm_rank(c, k);
      if (r >= 0) mine.emplace_back(r, &k);
    }
    if (mine.empty()) return;
    for (auto& [r, k] : mine) prepare(op, r, *k, p);
    if (!distributed_) check(wia_group_start(), "wia_group_start");
    for (auto& [r, k] : mine) post(op, r, *k, p);
    if (!distributed_) check(wia_group_end(), "wia_group_end");
    for (auto& [r, k] : mine) check(wia_stream_synchronize(k->stream), "wia_stream_synchronize");
    if (op.index == o_.corrupt_op) {
      const Buffers b = buffers(op, mine[0].first, *mine[0].second, p);
      if (b.out_elems > 0) b.out[0] = static_cast<char>(b.out[0] ^ 0x10);
    }
    for (auto& [r, k] : mine) verify(op, r, *k, p);
    if (o_.verbose && (local_[0].world == 0 || !distributed_)) {
      std::ifstream status("/proc/self/status");
      std::string line, rss;
      while (std::getline(status, line))
        if (line.rfind("Rss", 0) == 0) rss += " " + line.substr(0, line.size() - 3);
      std::printf("  done;%s KiB\n", rss.c_str());
    }
  }

  // A new communicator: a split of a live one (process mode) or a random
  // ordered subset of the devices (device mode, whose communicators have
  // no split: spec 6.6 builds them over a subset).
  void split() {
    ++splits_;
    if (!distributed_) {
      const int k = 1 + static_cast<int>(rng_.below(static_cast<std::uint64_t>(world_size_)));
      std::vector<int> order(static_cast<std::size_t>(world_size_));
      for (int r = 0; r < world_size_; ++r) order[static_cast<std::size_t>(r)] = r;
      for (int r = world_size_ - 1; r > 0; --r)
        std::swap(order[static_cast<std::size_t>(r)],
                  order[rng_.below(static_cast<std::uint64_t>(r) + 1)]);
      order.resize(static_cast<std::size_t>(k));
      CommEntry e;
      e.members = order;
      std::vector<wia_device_t> devs;
      for (int w : order) devs.push_back(local_[static_cast<std::size_t>(w)].device);
      current_ = "creating a communicator over " + std::to_string(k) + " device(s)";
      check(wia_create_communicator(devs.data(), k, &e.handle), "wia_create_communicator");
      if (wia_comm_size(e.handle) != k) {
        ++wrong_;
        std::fprintf(stderr, "wia-soak: WRONG: a communicator of %d devices has size %d\n", k,
                     wia_comm_size(e.handle));
      }
      for (int i = 0; i < k; ++i)
        if (wia_comm_rank_of_device(e.handle, devs[static_cast<std::size_t>(i)]) != i) {
          ++wrong_;
          std::fprintf(stderr, "wia-soak: WRONG: device %d is not rank %d of its communicator\n",
                       devs[static_cast<std::size_t>(i)], i);
        }
      comms_.push_back(std::move(e));
      return;
    }
    const int parent = pick_comm();
    const std::vector<int> pm = comms_[static_cast<std::size_t>(parent)].members;
    const int p = static_cast<int>(pm.size());
    std::vector<int> color(static_cast<std::size_t>(p)), key(static_cast<std::size_t>(p));
    for (int r = 0; r < p; ++r) {
      color[static_cast<std::size_t>(r)] =
          rng_.chance(0.2) ? WIA_COMM_SPLIT_NOCOLOR : static_cast<int>(rng_.below(3));
      key[static_cast<std::size_t>(r)] = static_cast<int>(rng_.below(4));
    }
    const int me = comm_rank(comms_[static_cast<std::size_t>(parent)], local_[0]);
    wia_communicator_t mine = nullptr;
    current_ = "splitting comm " + std::to_string(parent);
    if (me >= 0)
      check(wia_comm_split(comms_[static_cast<std::size_t>(parent)].handle,
                           color[static_cast<std::size_t>(me)], key[static_cast<std::size_t>(me)],
                           &mine),
            "wia_comm_split");
    for (int col = 0; col < 3; ++col) {
      std::vector<int> group;  // parent ranks of this color, by (key, parent rank)
      for (int r = 0; r < p; ++r)
        if (color[static_cast<std::size_t>(r)] == col) group.push_back(r);
      if (group.empty()) continue;
      std::stable_sort(group.begin(), group.end(), [&](int a, int b) {
        return key[static_cast<std::size_t>(a)] < key[static_cast<std::size_t>(b)];
      });
      CommEntry e;
      for (int r : group) e.members.push_back(pm[static_cast<std::size_t>(r)]);
      if (me >= 0 && color[static_cast<std::size_t>(me)] == col) {
        e.handle = mine;
        const int want =
            static_cast<int>(std::find(group.begin(), group.end(), me) - group.begin());
        if (!mine || wia_comm_size(mine) != static_cast<int>(group.size()) ||
            wia_comm_rank(mine) != want) {
          ++wrong_;
          std::fprintf(stderr,
                       "wia-soak: WRONG: split of comm %d: color %d: got size %d rank %d, want "
                       "size %zu rank %d (replay with --seed %llu)\n",
                       parent, col, mine ? wia_comm_size(mine) : -1,
                       mine ? wia_comm_rank(mine) : -1, group.size(), want,
                       static_cast<unsigned long long>(o_.seed));
        }
      }
      comms_.push_back(std::move(e));
    }
    if (me >= 0 && color[static_cast<std::size_t>(me)] < 0 && mine != nullptr) {
      ++wrong_;
      std::fprintf(stderr, "wia-soak: WRONG: a split with no color returned a communicator\n");
    }
  }

  void free_comm(int c) {
    CommEntry& e = comms_[static_cast<std::size_t>(c)];
    e.live = false;
    ++frees_;
    if (e.handle) {
      current_ = "destroying comm " + std::to_string(c);
      check(wia_destroy_communicator(e.handle), "wia_destroy_communicator");
      e.handle = nullptr;
    }
  }

  void free_one() {
    std::vector<int> candidates;
    for (std::size_t c = 1; c < comms_.size(); ++c)
      if (comms_[c].live) candidates.push_back(static_cast<int>(c));
    if (!candidates.empty()) free_comm(candidates[rng_.below(candidates.size())]);
  }

  const Options& o_;
  std::function<wia_communicator_t()> make_world_;
  wia_communicator_t agree_;
  int world_size_;
  std::vector<LocalRank> local_;
  bool distributed_;
  std::vector<CommEntry> comms_;
  std::uint64_t cap_ = 0;
  Rng rng_{0};
  std::string current_ = "start-up";
  std::uint64_t wrong_ = 0, ops_run_ = 0, bytes_checked_ = 0, splits_ = 0, frees_ = 0;
  int wrong_reports_ = 0;
  double seconds_ = 0;
  std::vector<long> pids_;
  Sample before_, after_;
  std::vector<char> expected_;  // the expected result bytes of one rank
  long expected_for_ = -1;      // the operation whose shared result expected_ holds
};

// The run's figures; true when no leak bound was broken.
bool report_leaks(const Options& o, const Soak& s, const char* who, bool print) {
  const auto& b = s.before();
  const auto& a = s.after();
  const long long rss = static_cast<long long>(a.rss) - static_cast<long long>(b.rss);
  const long fds = a.fds - b.fds;
  std::vector<std::string> added;
  for (const auto& e : a.shm)
    if (!b.shm.count(e)) added.push_back(e);
  const bool ok = rss <= static_cast<long long>(o.rss_bound) && fds <= o.fd_bound && added.empty();
  if (print || !ok) {
    std::printf(
        "# %s: RSS %.1f -> %.1f MiB (%+.2f MiB, bound %.0f MiB), fds %ld -> %ld (%+ld, "
        "bound %ld), /dev/shm entries of this job %zu -> %zu (%zu new)%s\n",
        who, b.rss / 1048576.0, a.rss / 1048576.0, rss / 1048576.0, o.rss_bound / 1048576.0, b.fds,
        a.fds, fds, o.fd_bound, b.shm.size(), a.shm.size(), added.size(), ok ? "" : "  LEAK");
    for (const auto& e : added) std::printf("#   new /dev/shm entry: %s\n", e.c_str());
    std::fflush(stdout);
  }
  return ok;
}

std::uint64_t fresh_seed() {
  std::random_device rd;
  return (static_cast<std::uint64_t>(rd()) << 32 | rd()) ^
         static_cast<std::uint64_t>(std::time(nullptr));
}

// One rank of a process job (spawned by --procs, or by a launcher).
int run_rank(const Options& o) {
  wia::tools::default_one_device_per_process();
  wia_communicator_t world = nullptr;
  if (const wia_status_t st = wia::tools::join_job("wia-soak", &world); st != WIA_SUCCESS) {
    std::fprintf(stderr, "wia-soak: joining the job: %s\n  %s\n", wia_status_string(st),
                 wia_get_last_error());
    return 1;
  }
  const int rank = wia_comm_rank(world), size = wia_comm_size(world);
  LocalRank k;
  k.world = rank;
  wia_get_device(&k.device);
  std::vector<long> pids{static_cast<long>(getpid()), static_cast<long>(getppid())};
  int failed = 0;
  {
    // The soak's communicators are all split from the job's, so that the
    // job's own one (kept for the totals) is never among those it frees.
    auto make_world = [&]() {
      wia_communicator_t c = nullptr;
      if (const wia_status_t st = wia_comm_split(world, 0, rank, &c); st != WIA_SUCCESS)
        die("wia_comm_split (the soak's world)", st, "creating the world communicator", o.seed);
      return c;
    };
    Soak soak(o, make_world, world, size, {k}, true);
    soak.set_pids(pids);
    soak.run();
    const bool leaks_ok = report_leaks(o, soak, ("rank " + std::to_string(rank)).c_str(), false);
    // The job's totals, gathered on the world communicator.
    std::uint64_t totals[5] = {soak.wrong(), soak.ops_run(), soak.bytes_checked(),
                               leaks_ok ? 0u : 1u, 0};
    std::int64_t growth[3] = {
        static_cast<std::int64_t>(soak.after().rss) - static_cast<std::int64_t>(soak.before().rss),
        soak.after().fds - soak.before().fds,
        static_cast<std::int64_t>(soak.after().shm.size()) -
            static_cast<std::int64_t>(soak.before().shm.size())};
    wia_collective_config_t cfg{};
    cfg.datatype = WIA_UINT64;
    cfg.reduction_op = WIA_REDUCE_SUM;
    wia_all_reduce(world, totals, totals, 5, &cfg, nullptr);
    cfg.datatype = WIA_INT64;
    cfg.reduction_op = WIA_REDUCE_MAX;
    wia_all_reduce(world, growth, growth, 3, &cfg, nullptr);
    if (wia_stream_synchronize(nullptr) != WIA_SUCCESS) {
      std::fprintf(stderr, "wia-soak: gathering the totals: %s\n", wia_get_last_error());
      failed = 1;
    }
    if (rank == 0) {
      std::printf(
          "# wia-soak: %d processes (transport %s): %llu ops on rank 0 in %.1f s, %llu "
          "splits, %llu frees; %llu bytes checked over all ranks\n",
          size, o.transport.empty() ? "auto" : o.transport.c_str(),
          static_cast<unsigned long long>(soak.ops_run()), soak.seconds(),
          static_cast<unsigned long long>(soak.splits()),
          static_cast<unsigned long long>(soak.frees()),
          static_cast<unsigned long long>(totals[2]));
      report_leaks(o, soak, "rank 0", true);
      std::printf("# largest growth over the ranks: RSS %+.2f MiB, fds %+lld, /dev/shm %+lld\n",
                  static_cast<double>(growth[0]) / 1048576.0, static_cast<long long>(growth[1]),
                  static_cast<long long>(growth[2]));
      std::printf("# %s: %llu wrong element(s), %llu rank(s) over a leak bound\n",
                  totals[0] || totals[3] ? "FAILED" : "ok",
                  static_cast<unsigned long long>(totals[0]),
                  static_cast<unsigned long long>(totals[3]));
      std::fflush(stdout);
    }
    failed |= soak.wrong() != 0 || !leaks_ok || totals[0] != 0 || totals[3] != 0;
  }
  wia_finalize();
  return failed;
}

int run_devices(const Options& o) {
  const int ranks = o.ranks;
  if (!std::getenv("WIA_HOST_DEVICES") && !std::getenv("WIA_CONFIG"))
    setenv("WIA_HOST_DEVICES", std::to_string(ranks).c_str(), 1);
  int ndev = 0;
  if (wia_get_device_count(&ndev) != WIA_SUCCESS || ndev < ranks) {
    std::fprintf(stderr, "wia-soak: %d ranks need %d devices, %d available: %s\n", ranks, ranks,
                 ndev, wia_get_last_error());
    return 1;
  }
  std::vector<LocalRank> local(static_cast<std::size_t>(ranks));
  std::vector<wia_device_t> devs;
  for (int r = 0; r < ranks; ++r) {
    local[static_cast<std::size_t>(r)].world = r;
    local[static_cast<std::size_t>(r)].device = r;
    if (wia_create_stream_on(r, &local[static_cast<std::size_t>(r)].stream) != WIA_SUCCESS) {
      std::fprintf(stderr, "wia-soak: wia_create_stream_on(%d): %s\n", r, wia_get_last_error());
      return 1;
    }
    devs.push_back(r);
  }
  auto make_world = [&]() {
    wia_communicator_t c = nullptr;
    if (const wia_status_t st = wia_create_communicator(devs.data(), ranks, &c); st != WIA_SUCCESS)
      die("wia_create_communicator", st, "creating the world communicator", o.seed);
    return c;
  };
  int failed = 0;
  {
    Soak soak(o, make_world, nullptr, ranks, local, false);
    soak.set_pids({static_cast<long>(getpid())});
    soak.run();
    std::printf(
        "# wia-soak: %d host devices in one process: %llu ops in %.1f s, %llu "
        "communicators created, %llu freed; %llu bytes checked\n",
        ranks, static_cast<unsigned long long>(soak.ops_run()), soak.seconds(),
        static_cast<unsigned long long>(soak.splits()),
        static_cast<unsigned long long>(soak.frees()),
        static_cast<unsigned long long>(soak.bytes_checked()));
    const bool leaks_ok = report_leaks(o, soak, "process", true);
    std::printf("# %s: %llu wrong element(s)%s\n", soak.wrong() || !leaks_ok ? "FAILED" : "ok",
                static_cast<unsigned long long>(soak.wrong()),
                leaks_ok ? "" : ", leak bound broken");
    std::fflush(stdout);
    failed = soak.wrong() != 0 || !leaks_ok;
  }
  for (auto& k : local) wia_destroy_stream(k.stream);
  wia_finalize();
  return failed;
}

}  // namespace

int main(int argc, char** argv) {
  // RSS should count live memory. By default glibc raises its mmap
  // threshold (up to 32 MiB) and its trim threshold (twice that) after
  // large blocks are freed, and then keeps freed blocks of up to 32 MiB as
  // the top of each thread's arena, which malloc_trim does not return for
  // arenas other than the main one: a 16 MiB input snapshot freed on a
  // stream thread stayed resident (+32 MiB over 100 operations, none of it
  // allocated). Fixed thresholds make every block from 1 MiB up an mmap of
  // its own, returned on free, and trim heap tops above 1 MiB.
  mallopt(M_MMAP_THRESHOLD, 1 << 20);
  mallopt(M_TRIM_THRESHOLD, 1 << 20);
  Options o = parse(argc, argv);
  const bool is_rank =
      o.procs_from_env || (o.procs == 0 && o.ranks == 0 && wia::tools::launched_by_launcher());
  if (!o.seed_given && !is_rank) o.seed = fresh_seed();
  if (o.ranks == 0 && o.procs == 0 && !is_rank) o.ranks = 2 + static_cast<int>(mix(o.seed) % 5);
  if (!is_rank) {
    std::printf("# wia-soak: seed %llu (replay: --seed %llu with the same options)\n",
                static_cast<unsigned long long>(o.seed), static_cast<unsigned long long>(o.seed));
    std::fflush(stdout);
  }
  if (o.procs > 0) {
    if (!o.transport.empty()) setenv("WIA_TRANSPORT", o.transport.c_str(), 1);
    // The ranks get the seed this process drew.
    std::vector<std::string> args(argv, argv + argc);
    if (!o.seed_given) args.insert(args.end(), {"--seed", std::to_string(o.seed)});
    std::vector<char*> argp;
    for (auto& a : args) argp.push_back(a.data());
    argp.push_back(nullptr);
    const std::set<std::string> shm_before = shm_entries({static_cast<long>(getpid())});
    const int rc = wia::tools::spawn_local_ranks("wia-soak", o.procs, static_cast<int>(args.size()),
                                                 argp.data());
    // Whatever the ranks left in /dev/shm after they all exited.
    int left = 0;
    for (const auto& e : shm_entries({static_cast<long>(getpid())}))
      if (!shm_before.count(e)) std::printf("# left in /dev/shm: %s\n", e.c_str()), ++left;
    if (rc != 0)
      std::printf("# FAILED (exit status %d); replay with --seed %llu\n", rc,
                  static_cast<unsigned long long>(o.seed));
    return rc != 0 ? rc : left != 0;
  }
  if (is_rank) return run_rank(o);
  return run_devices(o);
}
