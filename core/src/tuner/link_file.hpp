// SPDX-License-Identifier: Apache-2.0
// Measured links for the cost model: a topology file (as wia-bw --output
// writes, or any file of docs/topology.md's schema) read into a LinkModel,
// in place of the default alpha/beta figures. Config key: tuner.link_file.
//
// Rank r runs on device device_of_rank[r] of the file; a link's alpha is
// the file's latency_us and its bandwidth the file's bandwidth_gbps. Two
// ranks on one device use that device's copy figure (the "shared_memory"
// default: 20 GB/s, 0.5 us), as the file has no link for them.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>

#include "config/config.hpp"
#include "topology/topology.hpp"
#include "tuner/cost_model.hpp"

namespace wia::tuner {

// Throws wia::Error(WIA_ERROR_CONFIG) with file:line:col for a bad file,
// WIA_ERROR_INVALID_ARGUMENT for a rank whose device is not in the file or
// a used link without bandwidth.
LinkModel link_model_from_file(const std::string& path, std::span<const int> device_of_rank);
// The same from a topology already loaded from `path` (named in errors).
LinkModel link_model_from_topology(const topo::Topology& t, std::span<const int> device_of_rank,
                                   const std::string& path);
// `base` with the links of `measured` (a model of the same ranks, as the
// functions above return): its alpha and bandwidth matrices and scalars,
// or for threads copying through one memory (Copier::kReceiver) the
// median of its links' bandwidths as a uniform figure (base's alpha);
// base's ports, per-message overhead, local rates, copier and CPU share
// stay (what the file cannot know: how the ranks run).
LinkModel with_measured_links(LinkModel base, const LinkModel& measured);
// Rank r on device r (nranks <= devices in the file).
LinkModel link_model_from_file(const std::string& path, std::int32_t nranks);
// The model from config key tuner.link_file, nullopt when the key is empty
// (the caller keeps its defaults). Rank r on device r.
std::optional<LinkModel> link_model_from_config(const Config& config, std::int32_t nranks);

}  // namespace wia::tuner
