// SPDX-License-Identifier: Apache-2.0
// fuzz_placement: a model file (docs/placement.md) through
// place::load_model_yaml and then what wia-info --place does with it:
// a Problem on a real topology (config/topologies/2socket-pcie.yaml, and
// 4node-ib-hdr.yaml for the cross-node ordering) solved by every method.
//
// Invariants beyond "no crash":
//  - a rejected file is a wia::Error(WIA_ERROR_CONFIG) with a message;
//  - a model's traffic is finite and non-negative, one row per part;
//  - a solution places every part on a device of the topology, respects
//    the capacities (violation() is empty) and its reported score is
//    evaluate() of its assignment; an exhaustive (optimal) answer is never
//    beaten by the heuristic's.
#include <cmath>

#include "fuzz_common.hpp"
#include "placement/placement.hpp"

namespace {

using wia::fuzz::check;

// Exhaustive search grows as devices^parts; the solver's own budget bounds
// it, but small models keep a run in milliseconds.
constexpr std::size_t kMaxParts = 12;

const wia::topo::Topology& topology(int which) {
  static const wia::topo::Topology kTopologies[] = {
      wia::topo::load_yaml(WIA_FUZZ_SOURCE_DIR "/config/topologies/2socket-pcie.yaml"),
      wia::topo::load_yaml(WIA_FUZZ_SOURCE_DIR "/config/topologies/4node-ib-hdr.yaml"),
  };
  return kTopologies[which];
}

void check_result(const wia::place::Problem& p, const wia::place::Result& r, const char* how) {
  const std::string what = std::string(how) + " placement: ";
  check(r.device_of.size() == static_cast<std::size_t>(p.parts), what + "not one device per part");
  for (int d : r.device_of) check(d >= 0 && d < p.devices, what + "device out of range");
  const std::string why = wia::place::violation(p, r.device_of);
  check(why.empty(), what + "breaks a capacity: " + why);
  const wia::place::Score s = wia::place::evaluate(p, r.device_of);
  check(!wia::place::better(p, s, r.score) && !wia::place::better(p, r.score, s),
        what + "reported score differs from evaluate()");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  wia::fuzz::quiet_logs();
  static wia::fuzz::MemFile file("model.yaml");
  wia::place::ModelFile m;
  try {
    m = wia::place::load_model_yaml(file.write(wia::fuzz::as_text({data, size})));
  } catch (const wia::Error& e) {
    wia::fuzz::check_rejection(e, WIA_ERROR_CONFIG, "place::load_model_yaml");
    return 0;
  }
  const std::size_t parts = m.names.size();
  check(m.memory.size() == parts, "memory: not one entry per part");
  check(m.traffic.size() == parts * parts, "traffic: not parts x parts");
  for (double v : m.traffic) check(std::isfinite(v) && v >= 0.0, "traffic not finite and >= 0");
  if (parts == 0 || parts > kMaxParts) return 0;

  // Which topology and objective: from the input's size, so the corpus
  // covers both without a field the YAML would have to carry.
  const int which = static_cast<int>(size % 2);
  const auto& t = topology(which);
  wia::place::Problem p = wia::place::Problem::from(
      t, size % 3 == 0 ? wia::place::Objective::kLatency : wia::place::Objective::kBandwidth);
  p.parts = static_cast<int>(parts);
  p.traffic = m.traffic;
  p.memory = m.memory;
  p.names = m.names;
  p.cross_node_first = which == 1;
  p.max_per_device = std::max(1, (p.parts + t.n - 1) / std::max(t.n, 1));
  using wia::place::Method;
  wia::place::Result best;
  bool have_optimal = false;
  for (Method method : {Method::kAuto, Method::kHeuristic, Method::kSequential}) {
    wia::place::Result r;
    try {
      r = wia::place::solve(p, method);
    } catch (const wia::Error& e) {
      wia::fuzz::check_rejection(e, WIA_ERROR_INVALID_ARGUMENT, "place::solve");
      continue;
    }
    check_result(p, r, r.method.c_str());
    if (r.optimal) {
      best = r;
      have_optimal = true;
    } else if (have_optimal) {
      check(!wia::place::better(p, r.score, best.score),
            r.method + " beat the optimal " + best.method);
    }
  }
  return 0;
}
