// SPDX-License-Identifier: Apache-2.0
#include "tuner/window_cost.hpp"

#include <fmt/format.h>

#include "common/error.hpp"

namespace wia::tuner {

namespace {

// A byte another core wrote since this one last read it, in copies' worth
// of the model's copy rate, cached or not: the direct schedule's copy of
// the peers' reduced slices. 2 processes on the EPYC host of MACHINE-FACTS
// (2026-12-06, wia-bench --algo direct against one_shot, which reads only
// inputs nobody rewrote): 64 KiB 11 - 13 against 2.4 - 2.9 us, 1 MiB 115 -
// 119 against 42 - 44 us.
constexpr double kFreshReadCopies = 2.0;

}  // namespace

double window_allreduce_us(const WindowAllReduce& call, const LinkModel& m) {
  if (call.nranks < 2 || call.chunk_bytes == 0)
    throw Error(WIA_ERROR_INVALID_ARGUMENT,
                fmt::format("window all-reduce cost: {} rank(s), chunks of {} bytes (needs 2 or "
                            "more ranks and chunks of 1 byte or more)",
                            call.nranks, call.chunk_bytes));
  const double p = call.nranks;
  const double n = static_cast<double>(call.bytes);
  const double chunks =
      call.bytes <= call.chunk_bytes
          ? 1.0
          : static_cast<double>((call.bytes + call.chunk_bytes - 1) / call.chunk_bytes);
  // A fold of p inputs into one output, in copies of its output's bytes.
  const double fold = kFusedPass + (p - 2) * kChainedInput;
  // In place, the one-shot schedule copies the input aside whatever it is
  // (its result overwrites what peers still read).
  const bool copy_in = !call.inputs_read_in_place || (call.in_place && call.one_shot);
  double copies = copy_in ? n : 0.0;
  double waits = chunks;  // every input published, each chunk
  if (call.one_shot) {
    copies += n * fold;        // every rank folds the whole chunk
    if (!copy_in) waits += 1;  // the peers say they finished reading
  } else {
    copies += n / p * fold + n / p;  // its slice from every input, then its own slice out
    waits += chunks;                 // every reduced slice published, each chunk
  }
  // Every rank's input and output, read or written once per call.
  const double footprint = p * n * (call.in_place ? 1.0 : 2.0);
  // The peers' reduced slices were written by their cores an instant
  // before: read from those cores' caches, line by line, whatever fits
  // here (kFreshReadCopies).
  const double fresh = call.one_shot ? 0.0 : n * (p - 1) / p * kFreshReadCopies;
  const double us_per_copied_byte = 1.0 / (m.copy_gbps * 1e3) / m.cpu_share;
  const double cpu_us = (copies * m.cache_time_factor(footprint) + fresh) * us_per_copied_byte;
  return cpu_us + waits * (m.alpha_us + m.message_overhead_us);
}

}  // namespace wia::tuner
