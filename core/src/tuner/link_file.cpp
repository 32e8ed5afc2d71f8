// SPDX-License-Identifier: Apache-2.0
// Measured links -> LinkModel (link_file.hpp).
#include "tuner/link_file.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <numeric>
#include <vector>

#include "common/error.hpp"
#include "topology/topology.hpp"

namespace wia::tuner {

LinkModel link_model_from_file(const std::string& path, std::span<const int> device_of_rank) {
  return link_model_from_topology(topo::load_yaml(path), device_of_rank, path);
}

LinkModel link_model_from_topology(const topo::Topology& t, std::span<const int> device_of_rank,
                                   const std::string& path) {
  const auto nranks = static_cast<std::int32_t>(device_of_rank.size());
  if (nranks < 1) throw Error(WIA_ERROR_INVALID_ARGUMENT, "link model for 0 ranks");
  for (std::int32_t r = 0; r < nranks; ++r) {
    const int d = device_of_rank[static_cast<std::size_t>(r)];
    if (d < 0 || d >= t.n)
      throw Error(WIA_ERROR_INVALID_ARGUMENT,
                  fmt::format("{}: rank {} runs on device {}, but the file has {} device(s)", path,
                              r, d, t.n));
  }
  const topo::LinkDefaults* same_device = topo::find_link_defaults("shared_memory");
  LinkModel m;
  m.nranks = nranks;
  const auto cells = static_cast<std::size_t>(nranks) * static_cast<std::size_t>(nranks);
  m.alpha_matrix_us.assign(cells, 0.0);
  m.gbps_matrix.assign(cells, 0.0);
  double min_gbps = 0.0, max_alpha = 0.0;
  for (std::int32_t s = 0; s < nranks; ++s)
    for (std::int32_t d = 0; d < nranks; ++d) {
      if (s == d) continue;
      const int ds = device_of_rank[static_cast<std::size_t>(s)];
      const int dd = device_of_rank[static_cast<std::size_t>(d)];
      double alpha = same_device->latency_us, gbps = same_device->bandwidth_gbps;
      if (ds != dd) {
        const auto k = t.at(ds, dd);
        alpha = t.latency[k];
        gbps = t.bandwidth[k];
        if (!(gbps > 0.0))
          throw Error(WIA_ERROR_INVALID_ARGUMENT,
                      fmt::format("{}: link {} -> {} has bandwidth {} GB/s; ranks {} and {} "
                                  "cannot use it",
                                  path, t.device_names[static_cast<std::size_t>(ds)],
                                  t.device_names[static_cast<std::size_t>(dd)], gbps, s, d));
      }
      const auto i = static_cast<std::size_t>(s) * static_cast<std::size_t>(nranks) +
                     static_cast<std::size_t>(d);
      m.alpha_matrix_us[i] = alpha;
      m.gbps_matrix[i] = gbps;
      min_gbps = min_gbps == 0.0 ? gbps : std::min(min_gbps, gbps);
      max_alpha = std::max(max_alpha, alpha);
    }
  // The scalar figures are what code reading only them sees: the slowest link.
  if (min_gbps > 0.0) m.gbps = min_gbps;
  m.alpha_us = max_alpha;
  m.validate();
  return m;
}

LinkModel with_measured_links(LinkModel base, const LinkModel& measured) {
  if (measured.nranks != base.nranks)
    throw Error(WIA_ERROR_INVALID_ARGUMENT, fmt::format("measured links for {} ranks, model of {}",
                                                        measured.nranks, base.nranks));
  if (base.copies == Copier::kReceiver && measured.nranks > 1) {
    // Threads copying through one memory: every pair is the same
    // hardware, and the file's pairs differ by what else ran while each
    // was measured (2 - 4x on the loaded reference VM), so the medians
    // stand for all of them instead of the slowest pair gating a ring.
    auto median = [&](const std::vector<double>& m) {
      std::vector<double> v;
      for (std::int32_t s = 0; s < measured.nranks; ++s)
        for (std::int32_t d = 0; d < measured.nranks; ++d)
          if (s != d) v.push_back(m[static_cast<std::size_t>(s * measured.nranks + d)]);
      std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2), v.end());
      return v[v.size() / 2];
    };
    // Only the bandwidth: the file's in-process latency is a peer copy's
    // stream round trip (10 us unloaded, milliseconds when a sample meets
    // a busy core), not the engine's hand-off, which base's alpha and
    // per-message overhead price.
    base.gbps = measured.gbps_matrix.empty() ? measured.gbps : median(measured.gbps_matrix);
    base.alpha_matrix_us.clear();
    base.gbps_matrix.clear();
  } else {
    base.alpha_us = measured.alpha_us;
    base.gbps = measured.gbps;
    base.alpha_matrix_us = measured.alpha_matrix_us;
    base.gbps_matrix = measured.gbps_matrix;
  }
  base.validate();
  return base;
}

LinkModel link_model_from_file(const std::string& path, std::int32_t nranks) {
  std::vector<int> device_of_rank(static_cast<std::size_t>(std::max(nranks, 0)));
  std::iota(device_of_rank.begin(), device_of_rank.end(), 0);
  return link_model_from_file(path, device_of_rank);
}

std::optional<LinkModel> link_model_from_config(const Config& config, std::int32_t nranks) {
  const std::string path = config.get_string("tuner.link_file");
  if (path.empty()) return std::nullopt;
  return link_model_from_file(path, nranks);
}

}  // namespace wia::tuner
