// SPDX-License-Identifier: Apache-2.0
// Placement search (placement.hpp): exhaustive branch and bound for small
// problems, greedy construction plus move/swap refinement beyond.
#include "placement/placement.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "common/error.hpp"

namespace wia::place {

namespace {

// Weight of pair (a, b) in the cost: bytes, or 1 per communicating pair.
std::vector<double> weights(const Problem& p) {
  std::vector<double> w(p.traffic);
  if (p.objective == Objective::kLatency)
    for (double& v : w) v = v > 0.0 ? 1.0 : 0.0;
  for (int a = 0; a < p.parts; ++a) w[static_cast<std::size_t>(a) * p.parts + a] = 0.0;
  return w;
}

struct Search {
  const Problem& p;
  std::vector<double> w;
  std::vector<int> device_of;
  std::vector<int> count;           // parts per device
  std::vector<std::uint64_t> used;  // memory per device

  explicit Search(const Problem& prob)
      : p(prob),
        w(weights(prob)),
        device_of(static_cast<std::size_t>(prob.parts), -1),
        count(static_cast<std::size_t>(prob.devices), 0),
        used(static_cast<std::size_t>(prob.devices), 0) {}

  double traffic(int a, int b) const {
    return p.traffic[static_cast<std::size_t>(a) * p.parts + b];
  }
  double weight(int a, int b) const { return w[static_cast<std::size_t>(a) * p.parts + b]; }
  double cost(int i, int j) const {
    return p.link_cost[static_cast<std::size_t>(i) * p.devices + j];
  }
  bool cross(int i, int j) const {
    return p.node_of[static_cast<std::size_t>(i)] != p.node_of[static_cast<std::size_t>(j)];
  }
  std::uint64_t mem(int part) const {
    return p.memory.empty() ? 0 : p.memory[static_cast<std::size_t>(part)];
  }
  bool fits(int part, int d) const {
    const auto ud = static_cast<std::size_t>(d);
    if (count[ud] >= p.max_per_device) return false;
    return p.device_memory == 0 || used[ud] + mem(part) <= p.device_memory;
  }
  void put(int part, int d) {
    device_of[static_cast<std::size_t>(part)] = d;
    ++count[static_cast<std::size_t>(d)];
    used[static_cast<std::size_t>(d)] += mem(part);
  }
  void take(int part) {
    const int d = device_of[static_cast<std::size_t>(part)];
    --count[static_cast<std::size_t>(d)];
    used[static_cast<std::size_t>(d)] -= mem(part);
    device_of[static_cast<std::size_t>(part)] = -1;
  }
  // The score of every pair between `part` (at device d) and the placed
  // parts other than `part` and `skip`.
  Score contribution(int part, int d, int skip = -1) const {
    Score s;
    for (int q = 0; q < p.parts; ++q) {
      const int dq = device_of[static_cast<std::size_t>(q)];
      if (q == part || q == skip || dq < 0) continue;
      s.cost += weight(part, q) * cost(d, dq) + weight(q, part) * cost(dq, d);
      if (cross(d, dq)) s.cross_node_bytes += traffic(part, q) + traffic(q, part);
    }
    return s;
  }
  Score pair(int a, int da, int b, int db) const {
    Score s;
    s.cost = weight(a, b) * cost(da, db) + weight(b, a) * cost(db, da);
    if (cross(da, db)) s.cross_node_bytes = traffic(a, b) + traffic(b, a);
    return s;
  }
};

Score plus(Score a, const Score& b) {
  a.cost += b.cost;
  a.cross_node_bytes += b.cross_node_bytes;
  return a;
}
Score minus(Score a, const Score& b) {
  a.cost -= b.cost;
  a.cross_node_bytes -= b.cross_node_bytes;
  return a;
}

// Parts by decreasing total traffic (heavy parts first prune best).
std::vector<int> heavy_first(const Problem& p) {
  std::vector<double> total(static_cast<std::size_t>(p.parts), 0.0);
  for (int a = 0; a < p.parts; ++a)
    for (int b = 0; b < p.parts; ++b)
      if (a != b)
        total[static_cast<std::size_t>(a)] += p.traffic[static_cast<std::size_t>(a) * p.parts + b] +
                                              p.traffic[static_cast<std::size_t>(b) * p.parts + a];
  std::vector<int> order(static_cast<std::size_t>(p.parts));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
    return total[static_cast<std::size_t>(a)] > total[static_cast<std::size_t>(b)];
  });
  return order;
}

std::vector<int> sequential(const Problem& p) {
  Search s(p);
  int d = 0;
  for (int part = 0; part < p.parts; ++part) {
    int tries = 0;
    while (!s.fits(part, d) && tries < p.devices) {
      d = (d + 1) % p.devices;
      ++tries;
    }
    if (tries == p.devices) return {};
    s.put(part, d);
  }
  return s.device_of;
}

// Grow from the heaviest part: next, the unplaced part most coupled to the
// placed ones, onto the device where it adds the least.
std::vector<int> greedy(const Problem& p) {
  Search s(p);
  std::vector<char> placed(static_cast<std::size_t>(p.parts), 0);
  const std::vector<int> order = heavy_first(p);
  for (int step = 0; step < p.parts; ++step) {
    int next = -1;
    double best_affinity = -1.0;
    for (int a : order) {
      if (placed[static_cast<std::size_t>(a)]) continue;
      double affinity = 0.0;
      for (int b = 0; b < p.parts; ++b)
        if (placed[static_cast<std::size_t>(b)]) affinity += s.traffic(a, b) + s.traffic(b, a);
      if (affinity > best_affinity) {
        best_affinity = affinity;
        next = a;
      }
    }
    int best_d = -1;
    Score best_score;
    for (int d = 0; d < p.devices; ++d) {
      if (!s.fits(next, d)) continue;
      const Score c = s.contribution(next, d);
      if (best_d < 0 || better(p, c, best_score)) {
        best_d = d;
        best_score = c;
      }
    }
    if (best_d < 0) return {};
    s.put(next, best_d);
    placed[static_cast<std::size_t>(next)] = 1;
  }
  return s.device_of;
}

// Best-improvement moves and swaps until none improves.
std::size_t refine(const Problem& p, std::vector<int>& device_of) {
  Search s(p);
  for (int part = 0; part < p.parts; ++part) s.put(part, device_of[static_cast<std::size_t>(part)]);
  const Score zero;
  std::size_t improvements = 0;
  for (int round = 0; round < 100000; ++round) {
    Score best_delta;
    int kind = 0, a = -1, b = -1;  // 1 move a -> device b; 2 swap parts a, b
    for (int part = 0; part < p.parts; ++part) {
      const int from = s.device_of[static_cast<std::size_t>(part)];
      const Score here = s.contribution(part, from);
      for (int d = 0; d < p.devices; ++d) {
        if (d == from || !s.fits(part, d)) continue;
        const Score delta = minus(s.contribution(part, d), here);
        if (better(p, delta, kind ? best_delta : zero)) {
          best_delta = delta;
          kind = 1;
          a = part;
          b = d;
        }
      }
    }
    for (int x = 0; x < p.parts; ++x)
      for (int y = x + 1; y < p.parts; ++y) {
        const int dx = s.device_of[static_cast<std::size_t>(x)];
        const int dy = s.device_of[static_cast<std::size_t>(y)];
        if (dx == dy) continue;
        if (p.device_memory != 0) {
          const auto ux = static_cast<std::size_t>(dx), uy = static_cast<std::size_t>(dy);
          if (s.used[ux] - s.mem(x) + s.mem(y) > p.device_memory ||
              s.used[uy] - s.mem(y) + s.mem(x) > p.device_memory)
            continue;
        }
        Score delta = minus(plus(s.contribution(x, dy, y), s.contribution(y, dx, x)),
                            plus(s.contribution(x, dx, y), s.contribution(y, dy, x)));
        delta = plus(delta, minus(s.pair(x, dy, y, dx), s.pair(x, dx, y, dy)));
        if (better(p, delta, kind ? best_delta : zero)) {
          best_delta = delta;
          kind = 2;
          a = x;
          b = y;
        }
      }
    if (kind == 0) break;
    if (kind == 1) {
      s.take(a);
      s.put(a, b);
    } else {
      const int da = s.device_of[static_cast<std::size_t>(a)];
      const int db = s.device_of[static_cast<std::size_t>(b)];
      s.take(a);
      s.take(b);
      s.put(a, db);
      s.put(b, da);
    }
    ++improvements;
  }
  device_of = s.device_of;
  return improvements;
}

// Depth-first branch and bound over parts in heavy-first order.
struct Exhaustive {
  Search s;
  std::vector<int> order;
  std::vector<int> best;
  Score best_score;
  bool have_best = false;
  std::uint64_t nodes = 0, budget;
  bool exhausted = false;

  Exhaustive(const Problem& p, std::uint64_t node_budget)
      : s(p), order(heavy_first(p)), budget(node_budget) {}

  void dfs(std::size_t k, const Score& partial) {
    if (exhausted) return;
    // The budget counts evaluated placements of one part (each O(parts)).
    nodes += static_cast<std::uint64_t>(s.p.devices);
    if (nodes > budget) {
      exhausted = true;
      return;
    }
    if (have_best && !better(s.p, partial, best_score)) return;
    if (k == order.size()) {
      best = s.device_of;
      best_score = partial;
      have_best = true;
      return;
    }
    const int part = order[k];
    for (int d = 0; d < s.p.devices; ++d) {
      if (!s.fits(part, d)) continue;
      const Score add = s.contribution(part, d);
      s.put(part, d);
      dfs(k + 1, plus(partial, add));
      s.take(part);
      if (exhausted) return;
    }
  }
};

}  // namespace

bool better(const Problem& p, const Score& a, const Score& b) {
  auto less = [](double x, double y) {
    return x < y - 1e-9 * std::max({1.0, std::fabs(x), std::fabs(y)});
  };
  if (p.cross_node_first) {
    if (less(a.cross_node_bytes, b.cross_node_bytes)) return true;
    if (less(b.cross_node_bytes, a.cross_node_bytes)) return false;
  }
  return less(a.cost, b.cost);
}

Score evaluate(const Problem& p, const std::vector<int>& device_of) {
  Search s(p);
  Score total;
  for (int a = 0; a < p.parts; ++a)
    for (int b = a + 1; b < p.parts; ++b)
      total = plus(total, s.pair(a, device_of[static_cast<std::size_t>(a)], b,
                                 device_of[static_cast<std::size_t>(b)]));
  return total;
}

std::string violation(const Problem& p, const std::vector<int>& device_of) {
  if (device_of.size() != static_cast<std::size_t>(p.parts)) return "wrong number of parts";
  std::vector<int> count(static_cast<std::size_t>(p.devices), 0);
  std::vector<std::uint64_t> used(static_cast<std::size_t>(p.devices), 0);
  for (int a = 0; a < p.parts; ++a) {
    const int d = device_of[static_cast<std::size_t>(a)];
    if (d < 0 || d >= p.devices) return fmt::format("part {} has no device", a);
    ++count[static_cast<std::size_t>(d)];
    used[static_cast<std::size_t>(d)] +=
        p.memory.empty() ? 0 : p.memory[static_cast<std::size_t>(a)];
  }
  for (int d = 0; d < p.devices; ++d) {
    if (count[static_cast<std::size_t>(d)] > p.max_per_device)
      return fmt::format("device {} holds {} parts (max {})", d, count[static_cast<std::size_t>(d)],
                         p.max_per_device);
    if (p.device_memory != 0 && used[static_cast<std::size_t>(d)] > p.device_memory)
      return fmt::format("device {} holds {} bytes (max {})", d, used[static_cast<std::size_t>(d)],
                         p.device_memory);
  }
  return {};
}

Problem Problem::from(const topo::Topology& t, Objective objective) {
  Problem p;
  p.objective = objective;
  p.devices = t.n;
  p.node_of = t.node_of;
  p.link_cost.assign(static_cast<std::size_t>(t.n) * t.n, 0.0);
  for (int i = 0; i < t.n; ++i)
    for (int j = 0; j < t.n; ++j) {
      if (i == j) continue;
      const auto k = t.at(i, j);
      const bool linked = t.bandwidth[k] > 0.0;
      if (objective == Objective::kBandwidth)
        p.link_cost[k] = linked ? 1.0 / (t.bandwidth[k] * 1e9) : kNoLink;
      else
        p.link_cost[k] = linked ? t.latency[k] : kNoLink;
    }
  return p;
}

Result solve(const Problem& p, Method method) {
  if (p.parts < 0 || p.devices < 1)
    throw Error(WIA_ERROR_INVALID_ARGUMENT,
                fmt::format("placement of {} parts on {} devices", p.parts, p.devices));
  if (static_cast<std::int64_t>(p.max_per_device) * p.devices < p.parts)
    throw Error(WIA_ERROR_INVALID_ARGUMENT,
                fmt::format("{} parts do not fit on {} devices of at most {} parts each", p.parts,
                            p.devices, p.max_per_device));
  if (p.device_memory != 0)
    for (int a = 0; a < p.parts; ++a)
      if (p.memory[static_cast<std::size_t>(a)] > p.device_memory)
        throw Error(
            WIA_ERROR_INVALID_ARGUMENT,
            fmt::format("part {} ({}) needs {} bytes; a device holds {}", a,
                        p.names.empty() ? std::string("?") : p.names[static_cast<std::size_t>(a)],
                        p.memory[static_cast<std::size_t>(a)], p.device_memory));
  Result r;
  if (p.parts == 0) {
    r.optimal = true;
    r.method = "nothing to place";
    return r;
  }
  if (method == Method::kSequential) {
    r.device_of = sequential(p);
    if (r.device_of.empty())
      throw Error(WIA_ERROR_INVALID_ARGUMENT, "the parts do not fit the devices' memory in order");
    r.score = evaluate(p, r.device_of);
    r.method = "sequential";
    return r;
  }
  if (method != Method::kExhaustive) {
    std::size_t improvements = 0;
    for (auto start : {greedy(p), sequential(p)}) {
      if (start.empty()) continue;
      const std::size_t n = refine(p, start);
      const Score sc = evaluate(p, start);
      if (r.device_of.empty() || better(p, sc, r.score)) {
        r.device_of = start;
        r.score = sc;
        improvements = n;
      }
    }
    r.method = fmt::format("greedy + move/swap refinement ({} improvements)", improvements);
    if (method == Method::kHeuristic) {
      if (r.device_of.empty())
        throw Error(WIA_ERROR_INVALID_ARGUMENT,
                    "no assignment found that respects device memory (try exhaustive search)");
      return r;
    }
  }
  Exhaustive ex(p, method == Method::kExhaustive ? ~0ull : kExhaustiveBudget);
  if (!r.device_of.empty()) {  // the heuristic's answer bounds the search
    ex.best = r.device_of;
    ex.best_score = r.score;
    ex.have_best = true;
  }
  ex.dfs(0, Score{});
  if (!ex.exhausted) {
    if (!ex.have_best)
      throw Error(WIA_ERROR_INVALID_ARGUMENT, "no assignment respects the devices' capacity");
    r.device_of = ex.best;
    r.score = ex.best_score;
    r.optimal = true;
    r.method = fmt::format("exhaustive branch and bound ({} evaluations)", ex.nodes);
  }
  if (r.device_of.empty())
    throw Error(WIA_ERROR_INVALID_ARGUMENT, "no assignment found that respects device memory");
  return r;
}

}  // namespace wia::place
