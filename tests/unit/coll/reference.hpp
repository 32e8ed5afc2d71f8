// SPDX-License-Identifier: Apache-2.0
// Test support for collective schedules: input generation, an independent
// reference for every collective, and a runner that executes one case on
// the simulated network and checks every output element.
//
// Reference and tolerances:
//  - integers are exact, with wrap-around modulo 2^bits for SUM/PROD (and
//    for the sum that AVG divides: wrapped sum, then one truncating
//    division by nranks, as the kernels define it);
//  - floating point is accumulated in long double from the stored
//    (already rounded) inputs. A schedule rounds once per reduction step,
//    at most nranks - 1 times per element, so SUM is allowed
//    2 * p * u * sum|x_i| with u the unit roundoff of the type (2^-24
//    float32, 2^-53 float64, 2^-11 float16, 2^-8 bfloat16: the float32
//    bound is ~65000x tighter than bfloat16's), PROD 2 * p * u * |prod|,
//    AVG the SUM bound / p plus 2u|avg|, plus the smallest normal as
//    absolute slack. MIN/MAX and every pure data movement must be exact.
//  - outputs are poisoned before the run with the bitwise complement of
//    their expected value, so an element no step wrote always fails;
//    scratch starts as random bytes; send buffers and the parts of user
//    buffers that are not outputs must come back unchanged.
#pragma once

#include <wia/status.h>

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "coll/schedule.hpp"
#include "support/sim_executor.hpp"

namespace wia::coll::test {

bool is_float(wia_datatype_t t);
int bit_width(wia_datatype_t t);
std::uint64_t load_bits(wia_datatype_t t, const std::byte* base, std::uint64_t i);
void store_bits(wia_datatype_t t, std::byte* base, std::uint64_t i, std::uint64_t bits);
long double to_value(wia_datatype_t t, std::uint64_t bits);
std::uint64_t from_value(wia_datatype_t t, long double v);  // rounds to the type

struct Expect {
  std::uint64_t bits = 0;  // exact expectation (integers, data movement)
  long double value = 0;   // floats: exact reference value
  long double tol = 0;     // floats: allowed |got - value|
  bool exact = true;       // compare bits
};

// Reduction reference over the contributions (raw bits) of each rank.
Expect reduce_reference(wia_datatype_t t, wia_reduce_op_t op,
                        std::span<const std::uint64_t> contributions);
bool matches(wia_datatype_t t, const Expect& e, std::uint64_t got);

struct Case {
  Collective collective = Collective::kAllReduce;
  Algorithm algorithm = Algorithm::kRing;
  std::int32_t nranks = 1;
  std::uint64_t count = 0;
  wia_datatype_t dtype = WIA_FLOAT32;
  wia_reduce_op_t op = WIA_REDUCE_SUM;
  bool in_place = false;
  std::int32_t root = 0;
  std::uint32_t num_chunks = 0;
  std::int32_t peer_offset = 1;
  std::shared_ptr<const RankGroups> groups;  // Options::groups
  SimOptions sim;

  std::string describe() const;
};

// Builds, simulates and checks one case. Returns "" on success, otherwise
// what went wrong (first few bad elements).
std::string run_case(const Case& c);

}  // namespace wia::coll::test
