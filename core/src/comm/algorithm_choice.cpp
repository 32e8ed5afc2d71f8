// SPDX-License-Identifier: Apache-2.0
#include "comm/algorithm_choice.hpp"

#include <cstdlib>
#include <algorithm>
#include <sstream>
#include <vector>

#include <fmt/format.h>

#include "coll/registry.hpp"
#include "common/cpus.hpp"
#include "common/error.hpp"
#include "common/log.hpp"
#include "kernels/cpu_reduce.hpp"
#include "runtime/runtime.hpp"
#include "tuner/cost_model.hpp"

namespace wia::comm {

namespace {

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::stringstream in(s);
  for (std::string item; std::getline(in, item, sep);) out.push_back(item);
  return out;
}

std::uint64_t parse_bytes(const std::string& text, const std::string& rule) {
  if (text.empty()) throw Error(WIA_ERROR_CONFIG, fmt::format("rule '{}': empty size", rule));
  char* end = nullptr;
  const unsigned long long v = std::strtoull(text.c_str(), &end, 10);
  std::uint64_t mult = 1;
  const std::string suffix(end);
  if (suffix == "K" || suffix == "k") mult = 1ull << 10;
  else if (suffix == "M" || suffix == "m") mult = 1ull << 20;
  else if (suffix == "G" || suffix == "g") mult = 1ull << 30;
  else if (!suffix.empty() || end == text.c_str())
    throw Error(WIA_ERROR_CONFIG,
                fmt::format("rule '{}': '{}' is not a size (bytes, with optional K, M or G)", rule,
                            text));
  return v * mult;
}

const char* kCollectiveNames = "allreduce, broadcast, reduce, allgather, reducescatter, alltoall, "
                               "sendrecv or *";

bool collective_by_name(const std::string& name, coll::Collective* out) {
  for (int i = 0; i < coll::kCollectiveCount; ++i) {
    const auto c = static_cast<coll::Collective>(i);
    if (name == coll::collective_name(c)) {
      *out = c;
      return true;
    }
  }
  return false;
}

std::string names_for(coll::Collective c) {
  std::string out;
  for (const coll::AlgorithmInfo* a : coll::algorithms_for(c))
    out += (out.empty() ? "" : ", ") + std::string(a->name);
  return out;
}

std::uint64_t vector_bytes(const coll::CollArgs& a) {
  const std::uint64_t es = kernels::dtype_size(a.dtype);
  switch (a.collective) {
    case coll::Collective::kAllGather:
    case coll::Collective::kReduceScatter:
    case coll::Collective::kAllToAll:
      return a.count * es * static_cast<std::uint64_t>(a.nranks);
    default:
      return a.count * es;
  }
}

// Applies the first matching rule of `rules`; nullopt-like false if none.
bool apply_rules(const std::vector<std::string>& rules, const std::string& origin,
                 const coll::CollArgs& args, AlgorithmChoice* choice) {
  const std::uint64_t bytes = vector_bytes(args);
  for (std::size_t i = 0; i < rules.size(); ++i) {
    AlgorithmRule rule = parse_algorithm_rule(rules[i]);
    if (!rule.any_collective && rule.collective != args.collective) continue;
    if (bytes < rule.min_bytes || bytes >= rule.max_bytes) continue;
    const coll::AlgorithmInfo* info = coll::find_algorithm(args.collective, rule.algorithm_name);
    if (!info) {
      if (rule.any_collective) continue;  // "*:ring" applies where ring exists
      throw Error(WIA_ERROR_CONFIG,
                  fmt::format("{} rule '{}': {} has no algorithm '{}' (available: {})", origin,
                              rules[i], coll::collective_name(args.collective),
                              rule.algorithm_name, names_for(args.collective)));
    }
    choice->algorithm = info->algorithm;
    choice->reason = fmt::format("{} rule '{}'", origin, rules[i]);
    return true;
  }
  return false;
}

}  // namespace

AlgorithmRule parse_algorithm_rule(const std::string& text) {
  const std::vector<std::string> parts = split(text, ':');
  if (parts.size() < 1 || parts.size() > 3 || text.empty())
    throw Error(WIA_ERROR_CONFIG,
                fmt::format("algorithm rule '{}' is not 'collective:algorithm[:MIN-MAX]' or "
                            "'algorithm'",
                            text));
  AlgorithmRule rule;
  if (parts.size() == 1) {  // "ring": every collective that has it
    rule.any_collective = true;
    rule.algorithm_name = parts[0];
    return rule;
  }
  if (parts[0] == "*") {
    rule.any_collective = true;
  } else if (!collective_by_name(parts[0], &rule.collective)) {
    throw Error(WIA_ERROR_CONFIG, fmt::format("algorithm rule '{}': unknown collective '{}' "
                                              "(use {})",
                                              text, parts[0], kCollectiveNames));
  }
  rule.algorithm_name = parts[1];
  if (!rule.any_collective && !coll::find_algorithm(rule.collective, rule.algorithm_name))
    throw Error(WIA_ERROR_CONFIG,
                fmt::format("algorithm rule '{}': {} has no algorithm '{}' (available: {})", text,
                            parts[0], rule.algorithm_name, names_for(rule.collective)));
  if (parts.size() == 3) {
    const auto range = split(parts[2], '-');
    if (range.size() != 2)
      throw Error(WIA_ERROR_CONFIG,
                  fmt::format("algorithm rule '{}': size range '{}' is not MIN-MAX", text,
                              parts[2]));
    rule.min_bytes = parse_bytes(range[0], text);
    rule.max_bytes = parse_bytes(range[1], text);
    if (rule.max_bytes <= rule.min_bytes)
      throw Error(WIA_ERROR_CONFIG,
                  fmt::format("algorithm rule '{}': empty size range", text));
  }
  return rule;
}

tuner::LinkModel in_process_link_model(std::int32_t nranks) {
  return tuner::LinkModel::host_threads(nranks, usable_cpu_count());
}

AlgorithmChoice choose_algorithm(const coll::CollArgs& args, coll::Algorithm requested,
                                 tuner::Selector& selector) {
  AlgorithmChoice choice;
  // An algorithm chosen by a caller or a rule still gets the chunk count
  // the cost model finds best for it (a call's own num_chunks wins over
  // this in the communicators).
  auto chunk_it = [&] {
    const tuner::Selection& s = selector.select_chunks(args, choice.algorithm);
    choice.num_chunks = s.num_chunks;
    choice.estimated_ms = s.estimated_ms;
  };
  if (requested != coll::Algorithm::kAuto) {
    if (!coll::find_algorithm(args.collective, requested))
      throw Error(WIA_ERROR_INVALID_ARGUMENT,
                  fmt::format("{} has no algorithm '{}' (available: {})",
                              coll::collective_name(args.collective),
                              coll::algorithm_name(requested), names_for(args.collective)));
    choice.algorithm = requested;
    choice.reason = "call config";
    chunk_it();
    return choice;
  }
  if (const char* env = std::getenv("WIA_ALGO"); env && *env) {
    if (apply_rules(split(env, ','), "WIA_ALGO", args, &choice)) {
      chunk_it();
      return choice;
    }
  }
  const std::vector<std::string> rules =
      Runtime::get().config().get_list("collectives.algorithm");
  if (apply_rules(rules, "collectives.algorithm", args, &choice)) {
    chunk_it();
    return choice;
  }
  const tuner::Selection& sel = selector.select(args.collective, args.count, args.dtype);
  choice.algorithm = sel.algorithm;
  choice.num_chunks = sel.num_chunks;
  choice.estimated_ms = sel.estimated_ms;
  choice.reason = "cost model";
  choice.by_cost_model = true;
  return choice;
}

}  // namespace wia::comm
