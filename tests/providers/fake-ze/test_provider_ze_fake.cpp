// SPDX-License-Identifier: Apache-2.0
// The ze provider on the Level Zero loader double (libze_loader.so.1 of this
// folder), through the public C API only: its devices, an all-reduce of a
// communicator over the two fake GPUs (the device engine, because their
// memory is not host-accessible, and the provider's host-staged
// reduce_async, whose host functions run on the provider's own threads),
// and the clean absence when there is no loader.
#include <doctest/doctest.h>
#include <wia/wia.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

namespace {

constexpr int kRanks = 2;

void select_ze_provider(const char* library) {
  setenv("WIA_PROVIDER_PATH", WIA_ZE_PROVIDER_FILE, 1);
  setenv("WIA_PROVIDERS_ENABLE", "ze", 1);
  setenv("WIA_ZE_LIBRARY", library, 1);
}

float input(int r, std::size_t i) {
  return static_cast<float>((i * 37 + static_cast<std::size_t>(r) * 11) % 101) * 0.125f - 4.0f +
         static_cast<float>(r);
}

}  // namespace

TEST_CASE("the double's GPUs appear as the ze provider's devices") {
  select_ze_provider(WIA_FAKE_ZE_FILE);
  REQUIRE_MESSAGE(wia_init() == WIA_SUCCESS, wia_get_last_error());
  int count = 0;
  REQUIRE(wia_get_device_count(&count) == WIA_SUCCESS);
  REQUIRE(count == 2);
  for (int d = 0; d < count; ++d) {
    wia_device_properties_t props{};
    REQUIRE(wia_get_device_properties(d, &props) == WIA_SUCCESS);
    CHECK(props.kind == WIA_DEVICE_KIND_GPU);
    CHECK(std::string(props.provider) == "ze");
    CHECK(std::string(props.name) == "Fake ZE Device " + std::to_string(d));
    // No PCI address: it needs a Level Zero extension the provider does not use.
    CHECK(std::string(props.pci_bus_id).empty());
    CHECK(props.total_memory == (16ull << 30));
  }
  CHECK(wia_can_access_peer(0, 1));
  CHECK(wia_finalize() == WIA_SUCCESS);
}

TEST_CASE("all-reduce over the two ze devices: float32 sum, reduced through host staging") {
  select_ze_provider(WIA_FAKE_ZE_FILE);
  REQUIRE_MESSAGE(wia_init() == WIA_SUCCESS, wia_get_last_error());
  const wia_device_t devices[kRanks] = {0, 1};
  wia_stream_t stream[kRanks] = {};
  for (int r = 0; r < kRanks; ++r)
    REQUIRE_MESSAGE(wia_create_stream_on(r, &stream[r]) == WIA_SUCCESS, wia_get_last_error());
  wia_communicator_t comm = nullptr;
  REQUIRE_MESSAGE(wia_create_communicator(devices, kRanks, &comm) == WIA_SUCCESS,
                  wia_get_last_error());
  constexpr std::size_t n = 4099;
  void* buf[kRanks] = {};
  for (int r = 0; r < kRanks; ++r) {
    REQUIRE(wia_malloc_on(r, &buf[r], n * sizeof(float)) == WIA_SUCCESS);
    std::vector<float> v(n);
    for (std::size_t i = 0; i < n; ++i) v[i] = input(r, i);
    REQUIRE(wia_memcpy(buf[r], v.data(), n * sizeof(float)) == WIA_SUCCESS);
  }
  const wia_collective_config_t cfg{
      WIA_COLLECTIVE_ALLREDUCE, WIA_REDUCE_SUM, WIA_FLOAT32, WIA_ALGORITHM_AUTO, 0, 0};
  REQUIRE(wia_group_start() == WIA_SUCCESS);  // one thread, two GPUs
  for (int r = 0; r < kRanks; ++r)
    REQUIRE_MESSAGE(wia_all_reduce(comm, buf[r], buf[r], n, &cfg, stream[r]) == WIA_SUCCESS,
                    wia_get_last_error());
  REQUIRE(wia_group_end() == WIA_SUCCESS);
  for (int r = 0; r < kRanks; ++r)
    REQUIRE_MESSAGE(wia_stream_synchronize(stream[r]) == WIA_SUCCESS, wia_get_last_error());
  for (int r = 0; r < kRanks; ++r) {
    std::vector<float> got(n);
    REQUIRE(wia_memcpy(got.data(), buf[r], n * sizeof(float)) == WIA_SUCCESS);
    for (std::size_t i = 0; i < n; ++i) {
      const double ref = static_cast<double>(input(0, i)) + static_cast<double>(input(1, i));
      INFO("rank " << r << " element " << i << ": got " << got[i] << ", reference " << ref);
      REQUIRE(std::fabs(got[i] - ref) <= 1e-6 * std::max(1.0, std::fabs(ref)));
    }
  }
  CHECK(wia_destroy_communicator(comm) == WIA_SUCCESS);
  for (int r = 0; r < kRanks; ++r) {
    CHECK(wia_free(buf[r]) == WIA_SUCCESS);
    CHECK(wia_destroy_stream(stream[r]) == WIA_SUCCESS);
  }
  CHECK(wia_finalize() == WIA_SUCCESS);
}

TEST_CASE("no Level Zero loader: the provider is absent with the dlopen cause, not an error") {
  // providers.enable=ze turns "absent" into an init error that quotes the
  // provider's state and reason, as wia-info shows them.
  select_ze_provider("/nonexistent/libze_loader.so.1");
  const wia_status_t st = wia_init();
  const std::string error = st == WIA_SUCCESS ? "" : wia_get_last_error();
  INFO("init: " << wia_status_string(st) << ": " << error);
  CHECK(st != WIA_SUCCESS);
  CHECK(error.find("absent") != std::string::npos);
  CHECK(error.find("Level Zero loader not found") != std::string::npos);
  if (st == WIA_SUCCESS) CHECK(wia_finalize() == WIA_SUCCESS);
}
