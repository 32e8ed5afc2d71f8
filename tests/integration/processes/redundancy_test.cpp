// SPDX-License-Identifier: Apache-2.0
// Spec 6.9.1 with 4 real processes: ranks r and r+2 compute the same
// gradient each step and cross-check it (the full exchange with a
// tolerance, and the 8-byte checksum mode). Rank 3 flips one bit of one
// element at step 2: exactly the pair (1, 3) reports it, at that step, and
// afterwards those two see each other as failed while ranks 0 and 2 see
// nothing wrong.
#include <doctest/doctest.h>
#include <wia/wia.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

#include "process_harness.hpp"

namespace {
using namespace wia::test::processes;

constexpr std::size_t kCount = 10000;
constexpr int kBadStep = 2;

float gradient(int step, std::size_t i) {
  return std::sin(0.001f * static_cast<float>(i) + static_cast<float>(step)) * 0.01f;
}

// Pure checks of wia_gradients_match's tolerance rule.
bool match_rule_holds() {
  const float a[3] = {1.0f, 100.0f, NAN};
  float b[3] = {1.0f, 100.0f, NAN};
  if (!wia_gradients_match(a, b, 3, WIA_FLOAT32, 0.0)) return false;
  b[1] = 100.5f;  // 0.5 off a value of ~100: within 1e-2 relative, not 1e-3
  if (!wia_gradients_match(a, b, 3, WIA_FLOAT32, 1e-2)) return false;
  if (wia_gradients_match(a, b, 3, WIA_FLOAT32, 1e-3)) return false;
  b[1] = 100.0f;
  b[2] = 0.0f;  // NaN against a number
  if (wia_gradients_match(a, b, 3, WIA_FLOAT32, 1.0)) return false;
  return !wia_gradients_match(a, b, 3, WIA_FLOAT32, -1.0);  // a bad tolerance is an error
}

int cross_check(int rank, int nranks) {
  if (!match_rule_holds()) return kWrong;
  wia_communicator_t comm = join(rank, nranks);
  if (!comm) return kApiError;
  wia_redundancy_config_t redundancy = {.redundancy_factor = 2,
                                        .failure_recovery = WIA_RECOVERY_CHECKPOINT};
  (void)redundancy;
  const int partner_device = (rank + nranks / 2) % nranks;
  std::vector<float> gradients(kCount), partner_gradients(kCount);
  if (wia_set_gradient_exchange(comm, kCount, WIA_FLOAT32, nullptr) != WIA_SUCCESS)
    return kApiError;
  int mismatch_step = -1, checksum_step = -1;
  for (int step = 0; step < 4; ++step) {
    for (std::size_t i = 0; i < kCount; ++i) gradients[i] = gradient(step, i);
    if (rank == 3 && step == kBadStep) {
      std::uint32_t bits;
      std::memcpy(&bits, &gradients[1234], 4);
      bits ^= 1u << 3;  // a low mantissa bit: a tiny error
      std::memcpy(&gradients[1234], &bits, 4);
    }
    if (wia_send_receive_gradients(partner_device, gradients.data(), partner_gradients.data()) !=
        WIA_SUCCESS) {
      std::fprintf(stderr, "rank %d: %s\n", rank, wia_get_last_error());
      return kApiError;
    }
    bool same_checksum = false;
    if (wia_gradients_checksum_match(comm, partner_device, gradients.data(), kCount, WIA_FLOAT32,
                                     nullptr, &same_checksum) != WIA_SUCCESS)
      return kApiError;
    if (!wia_gradients_match(gradients.data(), partner_gradients.data(), kCount, WIA_FLOAT32,
                             0.0)) {
      if (mismatch_step < 0) mismatch_step = step;
      wia_report_failure(comm, rank, partner_device);
    }
    if (!same_checksum && checksum_step < 0) checksum_step = step;
    // A tolerance above the flipped bit's size accepts it.
    if (!wia_gradients_match(gradients.data(), partner_gradients.data(), kCount, WIA_FLOAT32, 1e-5))
      return kWrong;
  }
  int failed[4] = {-1, -1, -1, -1};
  int n = -1;
  const bool detected = wia_detect_device_failure(comm);
  if (wia_comm_get_failed(comm, failed, 4, &n) != WIA_SUCCESS) return kApiError;
  wia_destroy_communicator(comm);
  std::fprintf(stderr, "rank %d: mismatch at %d, checksum at %d, detected %d, failed %d (%d)\n",
               rank, mismatch_step, checksum_step, detected, n, failed[0]);
  if (rank == 1 || rank == 3) {
    const bool ok = mismatch_step == kBadStep && checksum_step == kBadStep && detected && n == 1 &&
                    failed[0] == partner_device;
    return ok ? kSawError : kWrong;
  }
  return mismatch_step < 0 && checksum_step < 0 && !detected && n == 0 ? kOk : kWrong;
}

}  // namespace

TEST_CASE("redundant gradients: a flipped bit on one rank is reported by exactly its pair") {
  const auto st = run_ranks(4, base_yaml(), cross_check, {{"TEST_WIA_ID", unique_id_env()}});
  REQUIRE(st.size() == 4);
  CHECK(st[0] == kOk);
  CHECK(st[1] == kSawError);
  CHECK(st[2] == kOk);
  CHECK(st[3] == kSawError);
}
