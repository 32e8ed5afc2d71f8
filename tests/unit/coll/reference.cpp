// SPDX-License-Identifier: Apache-2.0
#include "reference.hpp"

#include <cmath>
#include <cstring>
#include <limits>
#include <sstream>

#include "coll/registry.hpp"
#include "common/error.hpp"
#include "kernels/cpu_reduce.hpp"

namespace wia::coll::test {

bool is_float(wia_datatype_t t) {
  return t == WIA_FLOAT16 || t == WIA_BFLOAT16 || t == WIA_FLOAT32 || t == WIA_FLOAT64;
}

int bit_width(wia_datatype_t t) { return static_cast<int>(kernels::dtype_size(t) * 8); }

namespace {
bool is_signed_int(wia_datatype_t t) { return t == WIA_INT8 || t == WIA_INT32 || t == WIA_INT64; }
std::uint64_t mask_of(wia_datatype_t t) {
  const int w = bit_width(t);
  return w == 64 ? ~std::uint64_t{0} : (std::uint64_t{1} << w) - 1;
}
std::int64_t sign_extend(wia_datatype_t t, std::uint64_t bits) {
  const int w = bit_width(t);
  if (w == 64) return static_cast<std::int64_t>(bits);
  const std::uint64_t sign = std::uint64_t{1} << (w - 1);
  return static_cast<std::int64_t>((bits ^ sign) - sign);
}
std::uint64_t splitmix(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
long double unit_roundoff(wia_datatype_t t) {
  switch (t) {
    case WIA_FLOAT16:
      return std::ldexp(1.0L, -11);
    case WIA_BFLOAT16:
      return std::ldexp(1.0L, -8);
    case WIA_FLOAT32:
      return std::ldexp(1.0L, -24);
    default:
      return std::ldexp(1.0L, -53);
  }
}
long double smallest_normal(wia_datatype_t t) {
  switch (t) {
    case WIA_FLOAT16:
      return std::ldexp(1.0L, -14);
    case WIA_FLOAT64:
      return std::numeric_limits<double>::min();
    default:
      return std::numeric_limits<float>::min();
  }
}
}  // namespace

std::uint64_t load_bits(wia_datatype_t t, const std::byte* base, std::uint64_t i) {
  const std::size_t es = kernels::dtype_size(t);
  std::uint64_t v = 0;
  std::memcpy(&v, base + i * es, es);  // little endian
  return v;
}

void store_bits(wia_datatype_t t, std::byte* base, std::uint64_t i, std::uint64_t bits) {
  const std::size_t es = kernels::dtype_size(t);
  std::memcpy(base + i * es, &bits, es);
}

long double to_value(wia_datatype_t t, std::uint64_t bits) {
  switch (t) {
    case WIA_FLOAT16:
      return kernels::half_to_float(static_cast<std::uint16_t>(bits));
    case WIA_BFLOAT16:
      return kernels::bfloat16_to_float(static_cast<std::uint16_t>(bits));
    case WIA_FLOAT32: {
      float f;
      const auto b = static_cast<std::uint32_t>(bits);
      std::memcpy(&f, &b, 4);
      return f;
    }
    case WIA_FLOAT64: {
      double d;
      std::memcpy(&d, &bits, 8);
      return d;
    }
    default:
      return is_signed_int(t) ? static_cast<long double>(sign_extend(t, bits))
                              : static_cast<long double>(bits & mask_of(t));
  }
}

std::uint64_t from_value(wia_datatype_t t, long double v) {
  switch (t) {
    case WIA_FLOAT16:
      return kernels::float_to_half(static_cast<float>(v));
    case WIA_BFLOAT16:
      return kernels::float_to_bfloat16(static_cast<float>(v));
    case WIA_FLOAT32: {
      const float f = static_cast<float>(v);
      std::uint32_t b;
      std::memcpy(&b, &f, 4);
      return b;
    }
    case WIA_FLOAT64: {
      const double d = static_cast<double>(v);
      std::uint64_t b;
      std::memcpy(&b, &d, 8);
      return b;
    }
    default:
      return static_cast<std::uint64_t>(static_cast<std::int64_t>(v)) & mask_of(t);
  }
}

Expect reduce_reference(wia_datatype_t t, wia_reduce_op_t op, std::span<const std::uint64_t> xs) {
  Expect e;
  const auto p = static_cast<long double>(xs.size());
  if (!is_float(t)) {
    const std::uint64_t m = mask_of(t);
    std::uint64_t acc = xs[0] & m;
    for (std::size_t i = 1; i < xs.size(); ++i) {
      const std::uint64_t x = xs[i] & m;
      switch (op) {
        case WIA_REDUCE_SUM:
        case WIA_REDUCE_AVG:
          acc = (acc + x) & m;
          break;
        case WIA_REDUCE_PROD:
          acc = (acc * x) & m;
          break;
        case WIA_REDUCE_MIN:
        case WIA_REDUCE_MAX: {
          const bool less = is_signed_int(t) ? sign_extend(t, x) < sign_extend(t, acc) : x < acc;
          if ((op == WIA_REDUCE_MIN) == less) acc = x;
          break;
        }
        default:
          break;
      }
    }
    if (op == WIA_REDUCE_AVG && xs.size() > 1) {
      if (is_signed_int(t))
        acc =
            static_cast<std::uint64_t>(sign_extend(t, acc) / static_cast<std::int64_t>(xs.size())) &
            m;
      else
        acc = acc / xs.size();
    }
    e.bits = acc;
    return e;
  }
  long double acc = to_value(t, xs[0]);
  long double mag = std::fabs(acc);
  for (std::size_t i = 1; i < xs.size(); ++i) {
    const long double x = to_value(t, xs[i]);
    switch (op) {
      case WIA_REDUCE_SUM:
      case WIA_REDUCE_AVG:
        acc += x;
        mag += std::fabs(x);
        break;
      case WIA_REDUCE_PROD:
        acc *= x;
        break;
      case WIA_REDUCE_MIN:
        acc = std::min(acc, x);
        break;
      case WIA_REDUCE_MAX:
        acc = std::max(acc, x);
        break;
      default:
        break;
    }
  }
  const long double u = unit_roundoff(t);
  e.exact = false;
  switch (op) {
    case WIA_REDUCE_SUM:
      e.tol = 2 * p * u * mag;
      break;
    case WIA_REDUCE_AVG:
      acc /= p;
      e.tol = 2 * u * mag + 2 * u * std::fabs(acc);
      break;
    case WIA_REDUCE_PROD:
      e.tol = 2 * p * u * std::fabs(acc);
      break;
    default:
      e.tol = 0;
      break;  // MIN/MAX pick an input: exact
  }
  if (op != WIA_REDUCE_MIN && op != WIA_REDUCE_MAX) e.tol += smallest_normal(t);
  e.value = acc;
  e.bits = from_value(t, acc);
  return e;
}

bool matches(wia_datatype_t t, const Expect& e, std::uint64_t got) {
  if (e.exact) return (got & mask_of(t)) == (e.bits & mask_of(t));
  const long double v = to_value(t, got);
  if (std::isnan(v)) return false;
  return std::fabs(v - e.value) <= e.tol;
}

std::string Case::describe() const {
  std::ostringstream os;
  os << collective_name(collective) << '/' << algorithm_name(algorithm) << " p=" << nranks
     << " count=" << count << ' ' << kernels::dtype_name(dtype) << ' '
     << kernels::reduce_op_name(op) << " root=" << root << " chunks=" << num_chunks
     << (in_place ? " in-place" : " out-of-place") << (sim.rendezvous ? " rendezvous" : " eager")
     << " seed=" << sim.seed;
  if (groups) {
    os << " groups=[";
    for (std::int32_t r = 0; r < groups->nranks(); ++r)
      os << (r ? "," : "") << groups->group_of_rank()[static_cast<std::size_t>(r)];
    os << ']';
  }
  return os.str();
}

namespace {

// Generated input element of rank r at index i, suited to op and dtype.
std::uint64_t input_bits(const Case& c, std::int32_t r, std::uint64_t i) {
  const std::uint64_t h = splitmix((static_cast<std::uint64_t>(r) << 40) ^ i ^
                                   (static_cast<std::uint64_t>(c.dtype) << 56) ^ 0x5eed);
  if (!is_float(c.dtype)) return h & mask_of(c.dtype);
  long double v;
  if (c.op == WIA_REDUCE_PROD) {
    // |x| in [0.5, 2): products of 8 stay far from overflow in every type.
    v = 0.5L + static_cast<long double>(h % 1536) / 1024.0L;
    if (h & (1ull << 40)) v = -v;
  } else {
    // Mixed magnitudes so that sums really round in the narrow types.
    v = (static_cast<long double>(h % 20001) - 10000.0L) / 2560.0L;
  }
  return from_value(c.dtype, v);
}

struct Region2 {
  BufferKind kind;
  std::uint32_t shard;
  std::uint64_t offset;
};

struct RankPlan {
  // Initial contents (applied after junk fill).
  std::vector<std::pair<Region2, std::vector<std::uint64_t>>> fills;
  // Expected contents after the run.
  std::vector<std::pair<Region2, std::vector<Expect>>> checks;
};

std::vector<Expect> exact(const std::vector<std::uint64_t>& bits) {
  std::vector<Expect> out(bits.size());
  for (std::size_t i = 0; i < bits.size(); ++i) out[i].bits = bits[i];
  return out;
}
std::vector<std::uint64_t> poison(wia_datatype_t t, const std::vector<Expect>& e) {
  std::vector<std::uint64_t> out(e.size());
  for (std::size_t i = 0; i < e.size(); ++i) out[i] = ~e[i].bits & mask_of(t);
  return out;
}

}  // namespace

std::string run_case(const Case& c) {
  CollArgs a;
  a.collective = c.collective;
  a.algorithm = c.algorithm;
  a.op = c.op;
  a.dtype = c.dtype;
  a.count = c.count;
  a.nranks = c.nranks;
  a.root = c.root;
  a.options.num_chunks = c.num_chunks;
  a.options.in_place = c.in_place;
  a.options.peer_offset = c.peer_offset;
  a.options.groups = c.groups;
  Schedule s;
  try {
    s = build_schedule(a);
  } catch (const Error& e) {
    return std::string("build failed: ") + e.what();
  }
  const std::int32_t p = c.nranks;
  const std::uint64_t n = c.count;
  const wia_datatype_t t = c.dtype;
  const bool ip = c.in_place;
  // in[r]: rank r's input (layout per collective, see below).
  std::vector<std::vector<std::uint64_t>> in(static_cast<std::size_t>(p));
  std::uint64_t in_len = n;
  if (c.collective == Collective::kReduceScatter || c.collective == Collective::kAllToAll)
    in_len = n * static_cast<std::uint64_t>(p);
  for (std::int32_t r = 0; r < p; ++r) {
    in[r].resize(in_len);
    for (std::uint64_t i = 0; i < in_len; ++i) in[r][i] = input_bits(c, r, i);
  }
  auto reduced = [&](std::uint64_t first, std::uint64_t len) {
    std::vector<Expect> out(len);
    std::vector<std::uint64_t> xs(static_cast<std::size_t>(p));
    for (std::uint64_t i = 0; i < len; ++i) {
      for (std::int32_t r = 0; r < p; ++r) xs[r] = in[r][first + i];
      out[i] = reduce_reference(t, c.op, xs);
    }
    return out;
  };
  std::vector<RankPlan> plan(static_cast<std::size_t>(p));
  const Region2 send0{BufferKind::kUserSend, 0, 0};
  const Region2 recv0{BufferKind::kUserRecv, 0, 0};
  auto input_and_output = [&](RankPlan& pl, std::int32_t r, std::vector<Expect> out) {
    // Out of place: input in send, output poisoned. In place: input in recv.
    if (ip) {
      pl.fills.push_back({recv0, in[r]});
    } else {
      pl.fills.push_back({send0, in[r]});
      pl.checks.push_back({send0, exact(in[r])});
      pl.fills.push_back({recv0, poison(t, out)});
    }
    pl.checks.push_back({recv0, std::move(out)});
  };
  switch (c.collective) {
    case Collective::kAllReduce: {
      const std::vector<Expect> out = reduced(0, n);
      for (std::int32_t r = 0; r < p; ++r) input_and_output(plan[r], r, out);
      break;
    }
    case Collective::kSendRecv: {
      for (std::int32_t r = 0; r < p; ++r) {
        const std::int32_t from = ((r - c.peer_offset) % p + p) % p;
        input_and_output(plan[r], r, exact(in[from]));
      }
      break;
    }
    case Collective::kBroadcast: {
      const std::vector<Expect> out = exact(in[c.root]);
      for (std::int32_t r = 0; r < p; ++r) {
        RankPlan& pl = plan[r];
        if (r == c.root) {
          input_and_output(pl, r, out);
        } else {
          pl.fills.push_back({recv0, poison(t, out)});
          pl.checks.push_back({recv0, out});
        }
      }
      break;
    }
    case Collective::kReduce: {
      const std::vector<Expect> out = reduced(0, n);
      for (std::int32_t r = 0; r < p; ++r) {
        RankPlan& pl = plan[r];
        if (r == c.root) {
          input_and_output(pl, r, out);
        } else {
          // Non-roots' buffers are inputs only and must stay intact.
          const Region2 where = ip ? recv0 : send0;
          pl.fills.push_back({where, in[r]});
          pl.checks.push_back({where, exact(in[r])});
        }
      }
      break;
    }
    case Collective::kAllGather: {
      for (std::int32_t r = 0; r < p; ++r) {
        RankPlan& pl = plan[r];
        for (std::int32_t q = 0; q < p; ++q) {
          const Region2 block{BufferKind::kUserRecv, 0, n * static_cast<std::uint64_t>(q)};
          if (!(ip && q == r)) pl.fills.push_back({block, poison(t, exact(in[q]))});
          pl.checks.push_back({block, exact(in[q])});
        }
        if (ip) {
          pl.fills.push_back(
              {{BufferKind::kUserRecv, 0, n * static_cast<std::uint64_t>(r)}, in[r]});
        } else {
          pl.fills.push_back({send0, in[r]});
          pl.checks.push_back({send0, exact(in[r])});
        }
      }
      break;
    }
    case Collective::kReduceScatter: {
      for (std::int32_t r = 0; r < p; ++r) {
        RankPlan& pl = plan[r];
        const std::uint64_t mine = n * static_cast<std::uint64_t>(r);
        std::vector<Expect> out = reduced(mine, n);
        if (ip) {
          pl.fills.push_back({recv0, in[r]});
          for (std::int32_t q = 0; q < p; ++q) {
            if (q == r) continue;
            const std::uint64_t off = n * static_cast<std::uint64_t>(q);
            std::vector<std::uint64_t> rest(in[r].begin() + off, in[r].begin() + off + n);
            pl.checks.push_back({{BufferKind::kUserRecv, 0, off}, exact(rest)});
          }
          pl.checks.push_back({{BufferKind::kUserRecv, 0, mine}, std::move(out)});
        } else {
          pl.fills.push_back({send0, in[r]});
          pl.checks.push_back({send0, exact(in[r])});
          pl.fills.push_back({recv0, poison(t, out)});
          pl.checks.push_back({recv0, std::move(out)});
        }
      }
      break;
    }
    case Collective::kAllToAll: {
      for (std::int32_t r = 0; r < p; ++r) {
        RankPlan& pl = plan[r];
        for (std::int32_t j = 0; j < p; ++j) {
          const auto shard = static_cast<std::uint32_t>(j);
          const std::uint64_t off = n * static_cast<std::uint64_t>(j);
          std::vector<std::uint64_t> mine(in[r].begin() + off, in[r].begin() + off + n);
          const std::uint64_t theirs_off = n * static_cast<std::uint64_t>(r);
          std::vector<std::uint64_t> theirs(in[j].begin() + theirs_off,
                                            in[j].begin() + theirs_off + n);
          const Region2 out{BufferKind::kRecvShard, shard, 0};
          if (ip) {
            pl.fills.push_back({out, mine});
          } else {
            const Region2 src{BufferKind::kSendShard, shard, 0};
            pl.fills.push_back({src, mine});
            pl.checks.push_back({src, exact(mine)});
            pl.fills.push_back({out, poison(t, exact(theirs))});
          }
          pl.checks.push_back({out, exact(theirs)});
        }
      }
      break;
    }
  }

  SimMemory mem(s);
  std::uint64_t junk = splitmix(c.sim.seed ^ 0xbadc0de);
  for (std::int32_t r = 0; r < p; ++r) {
    for (BufferKind k : {BufferKind::kUserSend, BufferKind::kUserRecv, BufferKind::kScratch,
                         BufferKind::kSendShard, BufferKind::kRecvShard}) {
      const std::uint32_t shards =
          (k == BufferKind::kSendShard || k == BufferKind::kRecvShard) ? p : 1;
      for (std::uint32_t sh = 0; sh < shards; ++sh)
        for (std::byte& b : mem.buffer(r, k, sh)) b = static_cast<std::byte>(junk = splitmix(junk));
    }
    for (const auto& [reg, bits] : plan[r].fills) {
      std::span<std::byte> buf = mem.buffer(r, reg.kind, reg.shard);
      const std::uint64_t es = kernels::dtype_size(t);
      if ((reg.offset + bits.size()) * es > buf.size())
        return "test bug: fill outside " + std::string(buffer_kind_name(reg.kind)) + " of rank " +
               std::to_string(r);
      for (std::size_t i = 0; i < bits.size(); ++i)
        store_bits(t, buf.data(), reg.offset + i, bits[i]);
    }
  }
  const SimResult res = simulate(s, mem, c.sim);
  if (!res.ok()) return res.message;

  std::ostringstream bad;
  int nbad = 0;
  for (std::int32_t r = 0; r < p && nbad < 5; ++r) {
    for (const auto& [reg, expect] : plan[r].checks) {
      std::span<std::byte> buf = mem.buffer(r, reg.kind, reg.shard);
      const std::uint64_t es = kernels::dtype_size(t);
      if ((reg.offset + expect.size()) * es > buf.size()) {
        bad << "rank " << r << ' ' << buffer_kind_name(reg.kind) << " is too small\n";
        ++nbad;
        continue;
      }
      for (std::size_t i = 0; i < expect.size() && nbad < 5; ++i) {
        const std::uint64_t got = load_bits(t, buf.data(), reg.offset + i);
        if (matches(t, expect[i], got)) continue;
        bad << "rank " << r << ' ' << buffer_kind_name(reg.kind) << '[' << reg.shard << "]["
            << reg.offset + i << "]: got " << to_value(t, got) << " (0x" << std::hex << got
            << std::dec << ") expected "
            << (expect[i].exact ? to_value(t, expect[i].bits) : expect[i].value) << " tol "
            << static_cast<double>(expect[i].tol) << '\n';
        ++nbad;
      }
    }
  }
  return bad.str();
}

}  // namespace wia::coll::test
