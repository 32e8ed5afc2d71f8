// SPDX-License-Identifier: Apache-2.0
#include "api/profile_suggestions.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <optional>
#include <utility>

#include "coll/schedule.hpp"
#include "comm/transport_choice.hpp"

namespace wia::api {
namespace {

using comm::CommProfiler;

std::string bytes_text(double b) {
  if (b >= 1 << 20) return fmt::format("{:.1f} MiB", b / (1 << 20));
  if (b >= 1 << 10) return fmt::format("{:.1f} KiB", b / (1 << 10));
  return fmt::format("{:.0f} B", b);
}

// The collective an entry of the profile is, or none (point to point).
std::optional<coll::Collective> collective_named(const char* name) {
  for (int i = 0; i < coll::kCollectiveCount; ++i) {
    const auto c = static_cast<coll::Collective>(i);
    if (c != coll::Collective::kSendRecv && std::strcmp(name, coll::collective_name(c)) == 0)
      return c;
  }
  return std::nullopt;
}

// The model's time for one call of `bytes` (float32 elements, one rank's
// input), with the algorithm the tuner picks for that size.
double model_us(tuner::Selector& model, coll::Collective c, std::uint64_t bytes) {
  const std::uint64_t count = std::max<std::uint64_t>(1, bytes / 4);
  return model.select(c, count, WIA_FLOAT32).estimated_ms * 1e3;
}

// Adds `name` to a '+'-joined list once.
void note_name(std::string& names, const char* name) {
  if (("+" + names + "+").find("+" + std::string(name) + "+") == std::string::npos)
    names += (names.empty() ? "" : "+") + std::string(name);
}

// ---- Chunking for overlap ------------------------------------------------

constexpr std::uint64_t kChunkCandidateBytes = 4u << 20;
constexpr std::uint64_t kMinChunkBytes = 64u << 10;
constexpr double kLowOverlap = 0.5;
constexpr std::uint32_t kChunkCounts[] = {2, 4, 8, 16, 32};

struct LargeCall {
  coll::Collective collective;
  std::uint64_t bytes;
  double seconds;  // measured
  double weight;   // calls it stands for (sampling)
};

// A two-stage pipeline of k equal chunks: compute of chunk i, then its
// transfer, which overlaps the compute of chunk i + 1.
double pipelined_s(double compute_s, double chunk_transfer_s, std::uint32_t k) {
  const double chunk_compute = compute_s / k;
  return chunk_compute + chunk_transfer_s + (k - 1) * std::max(chunk_compute, chunk_transfer_s);
}

}  // namespace

void suggest_chunking(const CommProfiler::Snapshot& s, const MeasuredWindow& w,
                      tuner::Selector& model, std::vector<std::string>& out) {
  if (!w.overlap_analysed || w.compute_s <= 0 || w.overlap >= kLowOverlap) return;
  std::vector<LargeCall> calls;
  std::string names;
  double n_calls = 0, comm_s = 0, bytes = 0;
  for (const CommProfiler::OpStats& o : s.ops) {
    const auto c = collective_named(o.name);
    if (!c) continue;
    for (std::size_t i = 0; i < o.call_bytes.size(); ++i) {
      if (o.call_bytes[i] < kChunkCandidateBytes) continue;
      const double w = o.weight_at(i);
      calls.push_back({*c, o.call_bytes[i], o.seconds[i], w});
      n_calls += w;
      comm_s += w * o.seconds[i];
      bytes += w * static_cast<double>(o.call_bytes[i]);
      note_name(names, o.name);
    }
  }
  if (calls.empty() || comm_s <= 0) return;
  // The window's compute, spread evenly over the large calls: each call's
  // data is what the compute before it produced.
  const double compute_per_call = w.compute_s / n_calls;
  const double now_s = w.compute_s + (1 - w.overlap) * comm_s;
  double best_s = 0, best_ratio = 0;
  std::uint32_t best_k = 0;
  for (const std::uint32_t k : kChunkCounts) {
    double chunked_s = 0, ratio_sum = 0;
    bool fits = true;
    for (const LargeCall& call : calls) {
      if (call.bytes / k < kMinChunkBytes) {
        fits = false;
        break;
      }
      // The model's share of a whole call one chunk takes (its latency
      // terms do not shrink with the bytes), applied to the measured time.
      const double ratio = model_us(model, call.collective, call.bytes / k) /
                           model_us(model, call.collective, call.bytes);
      chunked_s += call.weight * pipelined_s(compute_per_call, call.seconds * ratio, k);
      ratio_sum += call.weight * ratio;
    }
    if (!fits) break;
    if (best_k == 0 || chunked_s < best_s)
      best_s = chunked_s, best_k = k, best_ratio = ratio_sum / n_calls;
  }
  if (best_k == 0 || best_s <= 0 || now_s < kMinSuggestedSpeedup * best_s) return;
  out.push_back(fmt::format(
      "{}: {:.0f} calls of {} or more (average {}, {:.3f} ms measured in all) ran with "
      "{:.0f}% of their time under compute ({:.3f} ms of compute in the window): split each "
      "into {} chunks posted as the compute produces their data, so that a chunk's transfer "
      "overlaps the compute of the next: estimated {:.1f}x faster (compute and exposed "
      "communication {:.3f} ms -> {:.3f} ms; cost model: a chunk takes {:.3f} of its call's "
      "time)",
      names, n_calls, bytes_text(kChunkCandidateBytes), bytes_text(bytes / n_calls), comm_s * 1e3,
      w.overlap * 100, w.compute_s * 1e3, best_k, now_s / best_s, now_s * 1e3, best_s * 1e3,
      best_ratio));
}

// ---- Another transport than a forced one ----------------------------------

namespace {

// Whether `transport` ("tcp", "shm+tcp") names `name` among its parts.
bool uses(const std::string& transport, const std::string& name) {
  return ("+" + transport + "+").find("+" + name + "+") != std::string::npos;
}

void set_link(tuner::LinkModel& m, int a, int b, const comm::TransportFigures& f) {
  const auto p = static_cast<std::size_t>(m.nranks);
  if (m.alpha_matrix_us.empty()) m.alpha_matrix_us.assign(p * p, m.alpha_us);
  if (m.gbps_matrix.empty()) m.gbps_matrix.assign(p * p, m.gbps);
  m.alpha_matrix_us[static_cast<std::size_t>(a) * p + static_cast<std::size_t>(b)] = f.alpha_us;
  m.gbps_matrix[static_cast<std::size_t>(a) * p + static_cast<std::size_t>(b)] = f.gbps;
}

}  // namespace

void suggest_transport(const CommProfiler::Snapshot& s,
                       const std::vector<comm::ProcessCommunicator::ForcedTransport>& forced,
                       const tuner::LinkModel& links, std::vector<std::string>& out) {
  if (forced.empty() || links.nranks < 2) return;
  // Both sides from the transports' figures on the forced links, so that
  // like is compared with like (measured links, when tuner.link_file gives
  // them, were measured with the forced transport only).
  tuner::LinkModel forced_model = links, default_model = links;
  double forced_overhead = 0, default_overhead = 0;
  std::map<std::pair<std::string, std::string>, int> pairs;  // (forced, default) -> links
  std::string chosen_names;
  for (const auto& f : forced) {
    const comm::TransportFigures forced_fig = comm::transport_figures(f.chosen, f.same_node);
    const comm::TransportFigures default_fig = comm::transport_figures(f.by_default, f.same_node);
    set_link(forced_model, f.a, f.b, forced_fig);
    set_link(default_model, f.a, f.b, default_fig);
    forced_overhead = std::max(forced_overhead, forced_fig.message_overhead_us);
    default_overhead = std::max(default_overhead, default_fig.message_overhead_us);
    ++pairs[{f.chosen, f.by_default}];
    note_name(chosen_names, f.chosen.c_str());
  }
  // The per-message overhead is the largest of the links' (or more, on an
  // oversubscribed node): it falls only when every link was forced and
  // nothing else raised it.
  const auto p = static_cast<std::size_t>(links.nranks);
  const bool every_link = forced.size() == p * (p - 1);
  if (every_link && links.message_overhead_us <= forced_overhead)
    default_model.message_overhead_us = default_overhead;
  tuner::Selector forced_sel(forced_model), default_sel(default_model);

  double forced_us = 0, default_us = 0, calls = 0;
  std::string kinds;
  for (const CommProfiler::OpStats& o : s.ops) {
    const auto c = collective_named(o.name);
    double kind_calls = 0;
    for (std::size_t i = 0; i < o.call_bytes.size(); ++i) {
      const std::string via = o.call_transport[i];
      // The first forced link this call's transport is: its figures cost
      // a point-to-point message.
      const comm::ProcessCommunicator::ForcedTransport* link = nullptr;
      for (const auto& f : forced)
        if (!link && uses(via, f.chosen)) link = &f;
      if (!link) continue;  // the node-shared windows, another link
      const double w = o.weight_at(i);
      if (c) {
        forced_us += w * model_us(forced_sel, *c, o.call_bytes[i]);
        default_us += w * model_us(default_sel, *c, o.call_bytes[i]);
      } else {  // point to point: one message over a forced link
        const auto b = static_cast<double>(o.call_bytes[i]);
        const comm::TransportFigures forced_fig =
            comm::transport_figures(link->chosen, link->same_node);
        const comm::TransportFigures default_fig =
            comm::transport_figures(link->by_default, link->same_node);
        forced_us += w * (forced_fig.alpha_us + forced_model.message_overhead_us +
                          b / (forced_fig.gbps * 1e3));
        default_us += w * (default_fig.alpha_us + default_model.message_overhead_us +
                           b / (default_fig.gbps * 1e3));
      }
      kind_calls += w;
    }
    if (kind_calls > 0) {
      kinds += fmt::format("{}{} {:.0f}", kinds.empty() ? "" : ", ", o.name, kind_calls);
      calls += kind_calls;
    }
  }
  if (calls <= 0 || default_us <= 0 || forced_us < kMinSuggestedSpeedup * default_us) return;
  std::string swaps;
  for (const auto& [pair, n] : pairs)
    swaps += fmt::format("{}{} instead of {} on {} link{}", swaps.empty() ? "" : "; ", pair.first,
                         pair.second, n, n == 1 ? "" : "s");
  // The figures printed are those of the link the message names.
  const auto& first = forced.front();
  const comm::TransportFigures forced_fig = comm::transport_figures(first.chosen, first.same_node);
  const comm::TransportFigures default_fig =
      comm::transport_figures(first.by_default, first.same_node);
  out.push_back(fmt::format(
      "transport: {:.0f} calls ({}) used {}, which the configuration forced ({}: {}) where the "
      "built-in rules would choose {}: estimated {:.1f}x faster over {} (cost model with the "
      "transports' figures, {} {:.3g} us {:.3g} GB/s, {} {:.3g} us {:.3g} GB/s: {:.3f} ms -> "
      "{:.3f} ms): remove the forced transport",
      calls, kinds, chosen_names, first.rule, swaps, first.by_default, forced_us / default_us,
      first.by_default, first.chosen, forced_fig.alpha_us, forced_fig.gbps, first.by_default,
      default_fig.alpha_us, default_fig.gbps, forced_us / 1e3, default_us / 1e3));
}

}  // namespace wia::api
