// SPDX-License-Identifier: Apache-2.0
// The ze provider on the Level Zero loader double (libze_loader.so.1 of this
// folder), through the public C API only: its devices, an all-reduce of a
// communicator over the two fake GPUs (the device engine, because their
// memory is not host-accessible, and the provider's host-staged
// reduce_async, whose host functions run on the provider's own threads),
// and the clean absence when there is no loader.
#include <dlfcn.h>
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

namespace {
void count_call(void* n) { ++*static_cast<int*>(n); }
}  // namespace

TEST_CASE("re-recorded events between two streams keep their order and are recycled") {
  // Every record takes a fresh Level Zero event; the old one may be reused
  // only once the other stream's wait on it has passed. Without recycling
  // the double would hold thousands of events; with recycling too eager,
  // a wait would see a reset event and the copies would go out of order.
  select_ze_provider(WIA_FAKE_ZE_FILE);
  REQUIRE_MESSAGE(wia_init() == WIA_SUCCESS, wia_get_last_error());
  void* lib = dlopen(WIA_FAKE_ZE_FILE, RTLD_NOW | RTLD_NOLOAD);
  REQUIRE(lib != nullptr);
  using LiveEvents = int (*)();
  void* sym = dlsym(lib, "wia_fake_ze_live_events");
  REQUIRE(sym != nullptr);
  auto live_events = reinterpret_cast<LiveEvents>(sym);
  wia_stream_t a = nullptr, b = nullptr;
  REQUIRE(wia_create_stream_on(0, &a) == WIA_SUCCESS);
  REQUIRE(wia_create_stream_on(0, &b) == WIA_SUCCESS);
  wia_event_t done_a = nullptr, done_b = nullptr;
  REQUIRE(wia_create_event(&done_a) == WIA_SUCCESS);
  REQUIRE(wia_create_event(&done_b) == WIA_SUCCESS);
  constexpr std::size_t n = 4096;
  void* x = nullptr;
  void* y = nullptr;
  REQUIRE(wia_malloc_on(0, &x, n) == WIA_SUCCESS);
  REQUIRE(wia_malloc_on(0, &y, n) == WIA_SUCCESS);
  int host_calls = 0;
  int live_after[2] = {};
  // Round 0 keeps up to 250 iterations in flight; round 1 waits for each.
  for (int round = 0; round < 2; ++round) {
    const int every = round == 0 ? 250 : 1;
    for (int i = 0; i < 2000; ++i) {
      // A writes x, B copies it to y, A waits for that before the next write.
      REQUIRE(wia_memset_async(x, i & 0xff, n, a) == WIA_SUCCESS);
      REQUIRE(wia_event_record(done_a, a) == WIA_SUCCESS);
      REQUIRE(wia_stream_wait_event(b, done_a) == WIA_SUCCESS);
      REQUIRE(wia_memcpy_async(y, x, n, b) == WIA_SUCCESS);
      if (i % 100 == 0) REQUIRE(wia_launch_host_func(b, count_call, &host_calls) == WIA_SUCCESS);
      REQUIRE(wia_event_record(done_b, b) == WIA_SUCCESS);
      REQUIRE(wia_stream_wait_event(a, done_b) == WIA_SUCCESS);
      if (i % every == every - 1) {
        REQUIRE(wia_stream_synchronize(b) == WIA_SUCCESS);
        std::vector<unsigned char> got(n);
        REQUIRE(wia_memcpy(got.data(), y, n) == WIA_SUCCESS);
        INFO("round " << round << ", after iteration " << i);
        CHECK(std::count(got.begin(), got.end(), static_cast<unsigned char>(i & 0xff)) ==
              static_cast<std::ptrdiff_t>(n));
      }
    }
    REQUIRE(wia_stream_synchronize(a) == WIA_SUCCESS);
    REQUIRE(wia_stream_synchronize(b) == WIA_SUCCESS);
    live_after[round] = live_events();
  }
  CHECK(host_calls == 40);
  // Each round records 4000 times and runs 20 host functions (two events
  // each). Work in flight needs events of its own (round 0 leaves up to 500
  // records in flight), but far from one per record; round 1, with little
  // in flight, must only reuse what round 0 left: no new pool.
  INFO("live Level Zero events after round 0: " << live_after[0] << ", round 1: " << live_after[1]);
  CHECK(live_after[0] < 1000);
  CHECK(live_after[1] == live_after[0]);
  CHECK(wia_free(x) == WIA_SUCCESS);
  CHECK(wia_free(y) == WIA_SUCCESS);
  CHECK(wia_destroy_event(done_a) == WIA_SUCCESS);
  CHECK(wia_destroy_event(done_b) == WIA_SUCCESS);
  CHECK(wia_destroy_stream(a) == WIA_SUCCESS);
  CHECK(wia_destroy_stream(b) == WIA_SUCCESS);
  CHECK(wia_finalize() == WIA_SUCCESS);
  CHECK(live_events() == 0);  // fini destroyed every event and pool
  dlclose(lib);
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
