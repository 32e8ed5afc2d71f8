// SPDX-License-Identifier: Apache-2.0
// Two of communication profiling's suggestions (docs/profiling.md,
// "Suggestions"), each with an estimated speedup computed by the
// communicator's cost model: chunking large collectives so that they
// overlap with compute, and the transport the built-in selector rules
// would choose instead of one the configuration forced. The others
// (fusion, algorithm, compression) are in api_profiling.cpp.
#pragma once

#include <string>
#include <vector>

#include "comm/comm_profiler.hpp"
#include "comm/process_communicator.hpp"
#include "tuner/cost_model.hpp"

namespace wia::api {

// A suggestion is made when the model expects this speedup or more.
inline constexpr double kMinSuggestedSpeedup = 1.2;

// What the report measured over the window, beside the snapshot.
struct MeasuredWindow {
  bool overlap_analysed = false;  // enable_overlap_analysis: the two below are known
  double compute_s = 0;           // total_compute_time
  double overlap = 0;             // overlap_efficiency
};

// Collectives of kChunkCandidateBytes or more whose time was mostly not
// under compute (overlap_efficiency below kLowOverlap) while there was
// compute: each call's measured time is scaled by the model's ratio of a
// chunk's time to the whole call's, and the window's compute and
// communication are replayed as a two-stage pipeline (compute of one
// chunk's data, then its transfer while the next is computed); the best
// chunk count's estimate against the measured compute plus exposed
// communication.
void suggest_chunking(const comm::CommProfiler::Snapshot& s, const MeasuredWindow& w,
                      tuner::Selector& model, std::vector<std::string>& out);

// Links whose transport the configuration forced away from the built-in
// rules' choice (ProcessCommunicator::forced_transports): every timed
// call that used them is costed by the model with both transports'
// figures on those links (comm::transport_figures) and no other change.
void suggest_transport(const comm::CommProfiler::Snapshot& s,
                       const std::vector<comm::ProcessCommunicator::ForcedTransport>& forced,
                       const tuner::LinkModel& links, std::vector<std::string>& out);

}  // namespace wia::api
