// SPDX-License-Identifier: Apache-2.0
// The host provider, driven only through the raw v1 ABI: the test dlopens
// libwia-provider-host.so like the core does and hands it a host-services
// table implemented here, whose parameters come from a std::map so each
// test can choose devices, memory_limit and peer_access.
#include <dirent.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <doctest/doctest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "kernels/cpu_reduce.hpp"

namespace {

// ---------------------------------------------------------------------------
// Loading and host services

const wia_provider_v1_t* provider() {
  static const wia_provider_v1_t* desc = [] {
    const std::string path = std::string(WIA_TEST_PROVIDER_DIR) + "/libwia-provider-host.so";
    void* dl = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (dl == nullptr) FAIL("dlopen " << path << ": " << dlerror());
    // Never dlclosed: a provider's worker threads and ifunc-resolved
    // kernels must not outlive their code, and the process ends soon.
    auto* d = static_cast<const wia_provider_v1_t*>(dlsym(dl, WIA_PROVIDER_SYMBOL_V1));
    if (d == nullptr) FAIL("dlsym " << WIA_PROVIDER_SYMBOL_V1 << ": " << dlerror());
    return d;
  }();
  return desc;
}

thread_local std::string t_last_error;

using Params = std::map<std::string, std::string>;

// The core's side of the ABI, reduced to what a provider can observe.
class TestHost {
 public:
  explicit TestHost(Params params) : params_(std::move(params)) {
    table_.struct_size = sizeof(table_);
    table_.abi_version = WIA_HOST_SERVICES_VERSION;
    table_.host_ctx = this;
    table_.log = [](void* ctx, wia_log_level_t level, const char* message) {
      auto* self = static_cast<TestHost*>(ctx);
      std::lock_guard<std::mutex> lk(self->mu_);
      self->logs_.push_back(std::to_string(level) + ": " + message);
    };
    table_.set_error = [](void*, const char* message) { t_last_error = message; };
    table_.get_param = [](void* ctx, const char* key) -> const char* {
      auto* self = static_cast<TestHost*>(ctx);
      auto it = self->params_.find(key);
      if (it != self->params_.end()) return it->second.c_str();
      // The declared default, as the core answers.
      const wia_provider_v1_t* d = provider();
      for (std::uint32_t i = 0; i < d->num_params; ++i)
        if (std::strcmp(d->params[i].key, key) == 0) return d->params[i].default_value;
      return nullptr;
    };
    table_.clock_ns = [](void*) -> std::uint64_t {
      return static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                            std::chrono::steady_clock::now().time_since_epoch())
                                            .count());
    };
  }
  const wia_host_services_v1_t* table() const { return &table_; }
  wia_host_services_v1_t* mutable_table() { return &table_; }
  std::vector<std::string> logs() {
    std::lock_guard<std::mutex> lk(mu_);
    return logs_;
  }

 private:
  std::map<std::string, std::string> params_;
  wia_host_services_v1_t table_{};
  std::mutex mu_;
  std::vector<std::string> logs_;
};

// One initialised provider instance; fini on destruction.
class Instance {
 public:
  explicit Instance(Params params = {}) : host_(std::move(params)) {
    const wia_status_t st = provider()->init(host_.table(), &ctx_);
    REQUIRE_MESSAGE(st == WIA_SUCCESS, "init: " << t_last_error);
    ops = provider()->device;
  }
  ~Instance() {
    if (ctx_ != nullptr) CHECK(provider()->fini(ctx_) == WIA_SUCCESS);
  }
  Instance(const Instance&) = delete;
  Instance& operator=(const Instance&) = delete;

  void* ctx() const { return ctx_; }
  TestHost& host() { return host_; }
  const wia_device_ops_v1_t* ops = nullptr;

  void* alloc(std::int32_t dev, std::uint64_t size, std::uint32_t kind = WIA_MEM_DEVICE) {
    void* p = nullptr;
    REQUIRE_MESSAGE(ops->mem_alloc(ctx_, dev, size, kind, &p) == WIA_SUCCESS, t_last_error);
    return p;
  }
  wia_provider_stream_t stream(std::int32_t dev) {
    wia_provider_stream_t s = nullptr;
    REQUIRE_MESSAGE(ops->stream_create(ctx_, dev, &s) == WIA_SUCCESS, t_last_error);
    return s;
  }
  wia_provider_event_t event(std::int32_t dev) {
    wia_provider_event_t e = nullptr;
    REQUIRE_MESSAGE(ops->event_create(ctx_, dev, &e) == WIA_SUCCESS, t_last_error);
    return e;
  }

 private:
  TestHost host_;
  void* ctx_ = nullptr;
};

bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

int numa_nodes_in_sys() {
  int n = 0;
  if (DIR* d = opendir("/sys/devices/system/node")) {
    while (const dirent* e = readdir(d)) {
      int id;
      char tail;
      if (std::sscanf(e->d_name, "node%d%c", &id, &tail) == 1) ++n;
    }
    closedir(d);
  }
  return n;
}

// Host functions used as stream work.
void sleep_ms_fn(void* arg) {
  std::this_thread::sleep_for(std::chrono::milliseconds(*static_cast<int*>(arg)));
}

struct Gate {
  std::atomic<bool> open{false};
  static void wait(void* arg) {
    auto* g = static_cast<Gate*>(arg);
    while (!g->open.load()) std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
};

}  // namespace

// ---------------------------------------------------------------------------

TEST_CASE("descriptor: v1 symbol, device interface only, declared parameters") {
  const wia_provider_v1_t* d = provider();
  REQUIRE(d != nullptr);
  CHECK(d->struct_size == sizeof(wia_provider_v1_t));
  CHECK(d->abi_version == WIA_PROVIDER_ABI_VERSION);
  CHECK(std::string(d->name) == "host");
  CHECK(d->caps == WIA_PROVIDER_CAP_DEVICE);
  CHECK(d->transport == nullptr);
  REQUIRE(d->device != nullptr);
  CHECK(d->host_services_version == WIA_HOST_SERVICES_VERSION);

  std::map<std::string, const wia_param_decl_v1_t*> params;
  for (std::uint32_t i = 0; i < d->num_params; ++i) params[d->params[i].key] = &d->params[i];
  REQUIRE(params.count("devices") == 1);
  CHECK(params["devices"]->type == WIA_PARAM_INT);
  CHECK(std::string(params["devices"]->default_value) == "0");
  CHECK(params["devices"]->max_value == 64);
  REQUIRE(params.count("memory_limit") == 1);
  CHECK(params["memory_limit"]->type == WIA_PARAM_SIZE);
  REQUIRE(params.count("peer_access") == 1);
  CHECK(params["peer_access"]->type == WIA_PARAM_BOOL);
  CHECK(std::string(params["peer_access"]->default_value) == "true");

  const wia_device_ops_v1_t* ops = d->device;
  CHECK(ops->struct_size == sizeof(wia_device_ops_v1_t));
  const std::uint64_t all = WIA_DEVICE_CAP_HOST_FUNC | WIA_DEVICE_CAP_EVENT_TIMING |
                            WIA_DEVICE_CAP_PEER | WIA_DEVICE_CAP_IPC | WIA_DEVICE_CAP_REDUCE |
                            WIA_DEVICE_CAP_PINNED_HOST;
  CHECK(ops->caps == all);
  // Every entry of the first v1 table is set (all its optional capabilities
  // are announced); the appended ones are not: the core scales host memory
  // in place itself, and host devices run no device code.
  const auto* entries = reinterpret_cast<void* const*>(&ops->device_count);
  const std::size_t n = (offsetof(wia_device_ops_v1_t, reduce_async) + sizeof(void*) -
                         offsetof(wia_device_ops_v1_t, device_count)) /
                        sizeof(void*);
  for (std::size_t i = 0; i < n; ++i) CHECK_MESSAGE(entries[i] != nullptr, "entry " << i);
  CHECK(reinterpret_cast<void*>(ops->scale_async) == nullptr);
  CHECK(reinterpret_cast<void*>(ops->launch_kernel) == nullptr);
  CHECK((ops->caps & (WIA_DEVICE_CAP_SCALE | WIA_DEVICE_CAP_KERNEL)) == 0);
}

TEST_CASE("init: device count defaults to the NUMA nodes and follows host.devices") {
  {
    Instance inst;
    std::int32_t count = -1;
    REQUIRE(inst.ops->device_count(inst.ctx(), &count) == WIA_SUCCESS);
    CHECK(count == std::max(1, numa_nodes_in_sys()));
  }
  {
    Instance inst(Params{{"devices", "3"}});
    std::int32_t count = -1;
    REQUIRE(inst.ops->device_count(inst.ctx(), &count) == WIA_SUCCESS);
    CHECK(count == 3);
    CHECK(inst.ops->device_count(inst.ctx(), nullptr) == WIA_ERROR_INVALID_ARGUMENT);
  }
}

TEST_CASE("init: garbage parameters fail with WIA_ERROR_CONFIG and say which key") {
  const std::pair<const char*, const char*> bad[] = {
      {"devices", "three"},     {"devices", "65"},       {"devices", "-1"},
      {"memory_limit", "lots"}, {"memory_limit", "12Q"}, {"peer_access", "maybe"},
      {"ipc_open", "ptrace"}};
  for (const auto& [key, value] : bad) {
    TestHost host(Params{{key, value}});
    void* ctx = reinterpret_cast<void*>(1);
    t_last_error.clear();
    CHECK(provider()->init(host.table(), &ctx) == WIA_ERROR_CONFIG);
    CHECK(ctx == nullptr);
    CHECK_MESSAGE(contains(t_last_error, key), t_last_error);
  }
  // Sizes take binary suffixes.
  Instance inst(Params{{"memory_limit", "64K"}});
  void* p = nullptr;
  CHECK(inst.ops->mem_alloc(inst.ctx(), 0, 65536, WIA_MEM_DEVICE, &p) == WIA_SUCCESS);
  void* q = nullptr;
  CHECK(inst.ops->mem_alloc(inst.ctx(), 0, 1, WIA_MEM_DEVICE, &q) == WIA_ERROR_OUT_OF_MEMORY);
  CHECK(inst.ops->mem_free(inst.ctx(), 0, p) == WIA_SUCCESS);
}

TEST_CASE("init: an older host-services table is refused, not called") {
  TestHost host(Params{});
  host.mutable_table()->abi_version = 0;
  void* ctx = nullptr;
  CHECK(provider()->init(host.table(), &ctx) == WIA_ERROR_ABI_MISMATCH);
  host.mutable_table()->abi_version = WIA_HOST_SERVICES_VERSION;
  host.mutable_table()->struct_size = offsetof(wia_host_services_v1_t, clock_ns);
  CHECK(provider()->init(host.table(), &ctx) == WIA_ERROR_ABI_MISMATCH);
  CHECK(provider()->init(nullptr, &ctx) == WIA_ERROR_INVALID_ARGUMENT);
}

TEST_CASE("device_props: CPU device, memory, flags, and short structs") {
  Instance inst(Params{{"devices", "2"}, {"memory_limit", "1M"}});
  wia_device_props_v1_t props{};
  props.struct_size = sizeof(props);
  REQUIRE(inst.ops->device_props(inst.ctx(), 1, &props) == WIA_SUCCESS);
  CHECK(props.struct_size == sizeof(props));
  CHECK(props.type == WIA_DEVICE_CPU);
  CHECK(contains(props.name, "Host CPU"));
  CHECK(props.pci_bus_id[0] == '\0');
  CHECK(props.total_memory == (1u << 20));  // capped by memory_limit
  CHECK(props.free_memory <= props.total_memory);
  CHECK(props.flags == (WIA_DEVICE_FLAG_HOST_ACCESSIBLE | WIA_DEVICE_FLAG_UNIFIED_ADDRESS |
                        WIA_DEVICE_FLAG_WAITING_HOST_FUNC));
  CHECK(props.alignment == 64);
  if (numa_nodes_in_sys() > 0) CHECK(props.numa_node >= 0);

  // free_memory follows allocations against the limit.
  void* p = inst.alloc(1, 256 * 1024);
  REQUIRE(inst.ops->device_props(inst.ctx(), 1, &props) == WIA_SUCCESS);
  CHECK(props.free_memory <= (1u << 20) - 256 * 1024);
  CHECK(inst.ops->mem_free(inst.ctx(), 1, p) == WIA_SUCCESS);

  // An older caller with a shorter struct gets only what it has room for.
  wia_device_props_v1_t small;
  std::memset(&small, 0xab, sizeof(small));
  small.struct_size = offsetof(wia_device_props_v1_t, total_memory);
  REQUIRE(inst.ops->device_props(inst.ctx(), 0, &small) == WIA_SUCCESS);
  CHECK(small.type == WIA_DEVICE_CPU);
  CHECK(small.total_memory == 0xababababababababull);

  CHECK(inst.ops->device_props(inst.ctx(), 2, &props) == WIA_ERROR_INVALID_DEVICE);
  CHECK(contains(t_last_error, "2"));
  CHECK(inst.ops->device_props(inst.ctx(), -1, &props) == WIA_ERROR_INVALID_DEVICE);
  CHECK(inst.ops->device_props(inst.ctx(), 0, nullptr) == WIA_ERROR_INVALID_ARGUMENT);
  small.struct_size = 4;
  CHECK(inst.ops->device_props(inst.ctx(), 0, &small) == WIA_ERROR_INVALID_ARGUMENT);
}

TEST_CASE("memory: sizes, zero size, alignment, both kinds") {
  Instance inst;
  for (const std::uint32_t kind : {WIA_MEM_DEVICE, WIA_MEM_HOST_PINNED}) {
    std::vector<void*> ptrs;
    for (const std::uint64_t size :
         {1ull, 3ull, 64ull, 4095ull, 4096ull, 100000ull, 300000ull, 3ull << 20}) {
      void* p = inst.alloc(0, size, kind);
      CHECK(reinterpret_cast<std::uintptr_t>(p) % 64 == 0);
      std::memset(p, 0x5a, size);  // the whole range is usable
      CHECK(static_cast<unsigned char*>(p)[size - 1] == 0x5a);
      ptrs.push_back(p);
    }
    // Size 0: unique, non-NULL, freeable.
    void* z1 = inst.alloc(0, 0, kind);
    void* z2 = inst.alloc(0, 0, kind);
    CHECK(z1 != nullptr);
    CHECK(z2 != nullptr);
    CHECK(z1 != z2);
    ptrs.push_back(z1);
    ptrs.push_back(z2);
    for (void* p : ptrs) CHECK(inst.ops->mem_free(inst.ctx(), 0, p) == WIA_SUCCESS);
  }
}

TEST_CASE("memory: memory_limit turns into WIA_ERROR_OUT_OF_MEMORY, per device") {
  Instance inst(Params{{"devices", "2"}, {"memory_limit", "1048576"}});
  void* a = inst.alloc(0, 512 * 1024);
  void* b = nullptr;
  t_last_error.clear();
  CHECK(inst.ops->mem_alloc(inst.ctx(), 0, 600 * 1024, WIA_MEM_DEVICE, &b) ==
        WIA_ERROR_OUT_OF_MEMORY);
  CHECK(b == nullptr);
  CHECK(contains(t_last_error, "memory_limit"));
  CHECK(contains(t_last_error, "device 0"));
  // The limit is per device, and pinned host memory does not count.
  void* c = inst.alloc(1, 600 * 1024);
  void* pinned = inst.alloc(0, 2 << 20, WIA_MEM_HOST_PINNED);
  // Freeing makes room again.
  CHECK(inst.ops->mem_free(inst.ctx(), 0, a) == WIA_SUCCESS);
  b = inst.alloc(0, 600 * 1024);
  for (auto [dev, p] : {std::pair{0, b}, std::pair{1, c}, std::pair{0, pinned}})
    CHECK(inst.ops->mem_free(inst.ctx(), dev, p) == WIA_SUCCESS);
  // Larger than the machine: a status, not an abort or a lazy failure.
  Instance unlimited;
  void* huge = nullptr;
  CHECK(unlimited.ops->mem_alloc(unlimited.ctx(), 0, 1ull << 62, WIA_MEM_DEVICE, &huge) ==
        WIA_ERROR_OUT_OF_MEMORY);
  CHECK(unlimited.ops->mem_alloc(unlimited.ctx(), 0, 1ull << 62, WIA_MEM_HOST_PINNED, &huge) ==
        WIA_ERROR_OUT_OF_MEMORY);
}

TEST_CASE("memory: double free, foreign and other-device pointers are rejected") {
  Instance inst(Params{{"devices", "2"}});
  void* p = inst.alloc(0, 1000);
  CHECK(inst.ops->mem_free(inst.ctx(), 0, p) == WIA_SUCCESS);
  t_last_error.clear();
  CHECK(inst.ops->mem_free(inst.ctx(), 0, p) == WIA_ERROR_INVALID_ARGUMENT);  // double free
  CHECK(contains(t_last_error, "mem_free"));

  int on_stack = 0;
  CHECK(inst.ops->mem_free(inst.ctx(), 0, &on_stack) == WIA_ERROR_INVALID_ARGUMENT);
  CHECK(inst.ops->mem_free(inst.ctx(), 0, nullptr) == WIA_ERROR_INVALID_ARGUMENT);

  void* q = inst.alloc(1, 1000);
  t_last_error.clear();
  CHECK(inst.ops->mem_free(inst.ctx(), 0, q) == WIA_ERROR_INVALID_ARGUMENT);
  CHECK_MESSAGE(contains(t_last_error, "device 1"), t_last_error);
  CHECK(inst.ops->mem_free(inst.ctx(), 1, static_cast<char*>(q) + 8) == WIA_ERROR_INVALID_ARGUMENT);
  CHECK_MESSAGE(contains(t_last_error, "inside"), t_last_error);
  CHECK(inst.ops->mem_free(inst.ctx(), 1, q) == WIA_SUCCESS);

  void* r = nullptr;
  CHECK(inst.ops->mem_alloc(inst.ctx(), 2, 8, WIA_MEM_DEVICE, &r) == WIA_ERROR_INVALID_DEVICE);
  CHECK(inst.ops->mem_alloc(inst.ctx(), 0, 8, 7, &r) == WIA_ERROR_INVALID_ARGUMENT);
  CHECK(inst.ops->mem_alloc(inst.ctx(), 0, 8, WIA_MEM_DEVICE, nullptr) ==
        WIA_ERROR_INVALID_ARGUMENT);
  // A foreign ctx is refused without touching it.
  int not_a_ctx[64] = {};
  CHECK(inst.ops->mem_alloc(not_a_ctx, 0, 8, WIA_MEM_DEVICE, &r) == WIA_ERROR_INVALID_ARGUMENT);
}

TEST_CASE("memset and memcpy (synchronous)") {
  Instance inst;
  auto* a = static_cast<unsigned char*>(inst.alloc(0, 10000));
  auto* b = static_cast<unsigned char*>(inst.alloc(0, 10000));
  REQUIRE(inst.ops->memset(inst.ctx(), 0, a, 0x11, 10000) == WIA_SUCCESS);
  CHECK(a[0] == 0x11);
  CHECK(a[9999] == 0x11);
  REQUIRE(inst.ops->memcpy(inst.ctx(), 0, b, a, 10000) == WIA_SUCCESS);
  CHECK(std::memcmp(a, b, 10000) == 0);
  CHECK(inst.ops->memset(inst.ctx(), 0, nullptr, 0, 0) == WIA_SUCCESS);
  CHECK(inst.ops->memset(inst.ctx(), 0, nullptr, 0, 8) == WIA_ERROR_INVALID_ARGUMENT);
  CHECK(inst.ops->memcpy(inst.ctx(), 0, b, nullptr, 8) == WIA_ERROR_INVALID_ARGUMENT);
  CHECK(inst.ops->memcpy(inst.ctx(), 5, b, a, 8) == WIA_ERROR_INVALID_DEVICE);
  CHECK(inst.ops->mem_free(inst.ctx(), 0, a) == WIA_SUCCESS);
  CHECK(inst.ops->mem_free(inst.ctx(), 0, b) == WIA_SUCCESS);
}

namespace {

struct Observation {
  const std::uint8_t* x;
  std::vector<std::uint8_t>* seen;
  static void fn(void* arg) {
    auto* o = static_cast<Observation*>(arg);
    o->seen->push_back(o->x[0]);
  }
};

}  // namespace

TEST_CASE("stream: a long chain of dependent async steps runs in enqueue order") {
  Instance inst;
  auto s = inst.stream(0);
  // x <- 2x + k (mod 256) at step k, written as: memset z = k; copy y <- x;
  // x <- x + y + z. A step reordered anywhere changes the final value; a
  // host function every 10 steps records x[0] to check the order of host
  // functions relative to the rest.
  constexpr std::size_t kN = 3 * 4096 + 5;  // several kernel blocks
  constexpr int kSteps = 300;
  auto* x = static_cast<std::uint8_t*>(inst.alloc(0, kN));
  auto* y = static_cast<std::uint8_t*>(inst.alloc(0, kN));
  auto* z = static_cast<std::uint8_t*>(inst.alloc(0, kN));
  std::vector<std::uint8_t> seen;
  std::vector<Observation> observations(kSteps / 10, Observation{x, &seen});
  REQUIRE(inst.ops->memset_async(inst.ctx(), s, x, 1, kN) == WIA_SUCCESS);
  std::vector<std::uint8_t> expect_seen;
  std::uint8_t expect = 1;
  for (int k = 0; k < kSteps; ++k) {
    REQUIRE(inst.ops->memset_async(inst.ctx(), s, z, k, kN) == WIA_SUCCESS);
    REQUIRE(inst.ops->memset_async(inst.ctx(), s, y, 0xee, kN) == WIA_SUCCESS);  // poison
    REQUIRE(inst.ops->memcpy_async(inst.ctx(), s, y, x, kN) == WIA_SUCCESS);
    const void* srcs[] = {x, y, z};
    wia_reduce_args_v1_t args{sizeof(args), WIA_UINT8, WIA_REDUCE_SUM, 3, kN, 0, x, srcs};
    REQUIRE(inst.ops->reduce_async(inst.ctx(), s, &args) == WIA_SUCCESS);
    expect = static_cast<std::uint8_t>(2 * expect + k);
    if (k % 10 == 9) {
      REQUIRE(inst.ops->launch_host_func(inst.ctx(), s, Observation::fn,
                                         &observations[static_cast<std::size_t>(k / 10)]) ==
              WIA_SUCCESS);
      expect_seen.push_back(expect);
    }
  }
  REQUIRE(inst.ops->stream_synchronize(inst.ctx(), s) == WIA_SUCCESS);
  CHECK(inst.ops->stream_query(inst.ctx(), s) == WIA_SUCCESS);
  CHECK(x[0] == expect);
  CHECK(x[kN - 1] == expect);
  CHECK(seen == expect_seen);
  CHECK(inst.ops->stream_destroy(inst.ctx(), s) == WIA_SUCCESS);
  for (void* p : {static_cast<void*>(x), static_cast<void*>(y), static_cast<void*>(z)})
    CHECK(inst.ops->mem_free(inst.ctx(), 0, p) == WIA_SUCCESS);
}

TEST_CASE("stream: query, destroy drains, errors on bad handles") {
  Instance inst;
  auto s = inst.stream(0);
  Gate gate;
  auto* buf = static_cast<std::uint8_t*>(inst.alloc(0, 64));
  std::memset(buf, 0, 64);
  REQUIRE(inst.ops->launch_host_func(inst.ctx(), s, Gate::wait, &gate) == WIA_SUCCESS);
  REQUIRE(inst.ops->memset_async(inst.ctx(), s, buf, 9, 64) == WIA_SUCCESS);
  CHECK(inst.ops->stream_query(inst.ctx(), s) == WIA_IN_PROGRESS);
  CHECK(buf[0] == 0);
  gate.open = true;
  // Destroy waits for the queued memset.
  CHECK(inst.ops->stream_destroy(inst.ctx(), s) == WIA_SUCCESS);
  CHECK(buf[63] == 9);
  // The handle is dead now.
  t_last_error.clear();
  CHECK(inst.ops->stream_synchronize(inst.ctx(), s) == WIA_ERROR_INVALID_HANDLE);
  CHECK(contains(t_last_error, "stream_synchronize"));
  CHECK(inst.ops->stream_destroy(inst.ctx(), s) == WIA_ERROR_INVALID_HANDLE);
  CHECK(inst.ops->memset_async(inst.ctx(), nullptr, buf, 0, 1) == WIA_ERROR_INVALID_HANDLE);
  CHECK(inst.ops->stream_query(inst.ctx(), nullptr) == WIA_ERROR_INVALID_HANDLE);
  wia_provider_stream_t out = nullptr;
  CHECK(inst.ops->stream_create(inst.ctx(), 1, &out) == WIA_ERROR_INVALID_DEVICE);
  CHECK(inst.ops->stream_create(inst.ctx(), 0, nullptr) == WIA_ERROR_INVALID_ARGUMENT);
  // Invalid async arguments are reported when enqueued.
  auto s2 = inst.stream(0);
  CHECK(inst.ops->memcpy_async(inst.ctx(), s2, buf, nullptr, 8) == WIA_ERROR_INVALID_ARGUMENT);
  CHECK(inst.ops->launch_host_func(inst.ctx(), s2, nullptr, nullptr) == WIA_ERROR_INVALID_ARGUMENT);
  CHECK(inst.ops->reduce_async(inst.ctx(), s2, nullptr) == WIA_ERROR_INVALID_ARGUMENT);
  const void* srcs[] = {buf + 8, buf};
  wia_reduce_args_v1_t overlap{sizeof(overlap), WIA_UINT8, WIA_REDUCE_SUM, 2, 16, 0, buf, srcs};
  t_last_error.clear();
  CHECK(inst.ops->reduce_async(inst.ctx(), s2, &overlap) == WIA_ERROR_INVALID_ARGUMENT);
  CHECK_MESSAGE(contains(t_last_error, "overlap"), t_last_error);
  CHECK(inst.ops->stream_synchronize(inst.ctx(), s2) == WIA_SUCCESS);
  CHECK(inst.ops->stream_destroy(inst.ctx(), s2) == WIA_SUCCESS);
  CHECK(inst.ops->mem_free(inst.ctx(), 0, buf) == WIA_SUCCESS);
}

namespace {

struct SlowWriter {
  int* target;
  int value;
  static void fn(void* arg) {
    auto* w = static_cast<SlowWriter*>(arg);
    std::this_thread::sleep_for(std::chrono::milliseconds(40));
    *w->target = w->value;
  }
};

}  // namespace

TEST_CASE("stream_wait_event: the waiting stream never sees stale data, across devices") {
  Instance inst(Params{{"devices", "2"}});
  auto a = inst.stream(0);
  auto b = inst.stream(1);
  auto e = inst.event(0);
  auto* src = static_cast<int*>(inst.alloc(0, sizeof(int) * 1024));
  auto* dst = static_cast<int*>(inst.alloc(1, sizeof(int) * 1024));
  std::memset(src, 0, sizeof(int) * 1024);
  int flag = 0;
  SlowWriter writer{&flag, 42};
  // A: sleep, then publish; then fill src; record e.
  REQUIRE(inst.ops->launch_host_func(inst.ctx(), a, SlowWriter::fn, &writer) == WIA_SUCCESS);
  REQUIRE(inst.ops->memset_async(inst.ctx(), a, src, 7, sizeof(int) * 1024) == WIA_SUCCESS);
  REQUIRE(inst.ops->event_record(inst.ctx(), e, a) == WIA_SUCCESS);
  // B: wait for e, then copy src (on device 0) to dst (device 1).
  REQUIRE(inst.ops->stream_wait_event(inst.ctx(), b, e) == WIA_SUCCESS);
  REQUIRE(inst.ops->memcpy_peer_async(inst.ctx(), b, dst, 1, src, 0, sizeof(int) * 1024) ==
          WIA_SUCCESS);
  // Re-recording e now must not affect what B already waits for.
  REQUIRE(inst.ops->event_record(inst.ctx(), e, a) == WIA_SUCCESS);
  REQUIRE(inst.ops->stream_synchronize(inst.ctx(), b) == WIA_SUCCESS);
  CHECK(flag == 42);  // A's host function finished before B went on
  for (int i = 0; i < 1024; i += 97) CHECK(dst[i] == 0x07070707);
  CHECK(dst[1023] == 0x07070707);
  CHECK(inst.ops->stream_synchronize(inst.ctx(), a) == WIA_SUCCESS);

  // Waiting for a never-recorded event is a no-op.
  auto fresh = inst.event(1);
  CHECK(inst.ops->stream_wait_event(inst.ctx(), b, fresh) == WIA_SUCCESS);
  CHECK(inst.ops->stream_synchronize(inst.ctx(), b) == WIA_SUCCESS);

  CHECK(inst.ops->event_destroy(inst.ctx(), e) == WIA_SUCCESS);
  CHECK(inst.ops->event_destroy(inst.ctx(), fresh) == WIA_SUCCESS);
  CHECK(inst.ops->event_destroy(inst.ctx(), fresh) == WIA_ERROR_INVALID_HANDLE);
  CHECK(inst.ops->stream_destroy(inst.ctx(), a) == WIA_SUCCESS);
  CHECK(inst.ops->stream_destroy(inst.ctx(), b) == WIA_SUCCESS);
  CHECK(inst.ops->mem_free(inst.ctx(), 0, src) == WIA_SUCCESS);
  CHECK(inst.ops->mem_free(inst.ctx(), 1, dst) == WIA_SUCCESS);
}

TEST_CASE("events: query, synchronize, re-record, elapsed time") {
  Instance inst(Params{{"devices", "2"}});
  auto s = inst.stream(0);
  auto idle = inst.stream(0);
  auto start = inst.event(0);
  auto end = inst.event(0);

  CHECK(inst.ops->event_query(inst.ctx(), start) == WIA_SUCCESS);  // never recorded
  CHECK(inst.ops->event_synchronize(inst.ctx(), start) == WIA_SUCCESS);
  float ms = -1;
  CHECK(inst.ops->event_elapsed_ms(inst.ctx(), start, end, &ms) == WIA_ERROR_INVALID_ARGUMENT);

  int sleep_ms = 30;
  REQUIRE(inst.ops->event_record(inst.ctx(), start, s) == WIA_SUCCESS);
  REQUIRE(inst.ops->launch_host_func(inst.ctx(), s, sleep_ms_fn, &sleep_ms) == WIA_SUCCESS);
  REQUIRE(inst.ops->event_record(inst.ctx(), end, s) == WIA_SUCCESS);
  CHECK(inst.ops->event_query(inst.ctx(), end) == WIA_IN_PROGRESS);
  CHECK(inst.ops->event_elapsed_ms(inst.ctx(), start, end, &ms) == WIA_IN_PROGRESS);
  REQUIRE(inst.ops->event_synchronize(inst.ctx(), end) == WIA_SUCCESS);
  CHECK(inst.ops->event_query(inst.ctx(), end) == WIA_SUCCESS);
  REQUIRE(inst.ops->event_elapsed_ms(inst.ctx(), start, end, &ms) == WIA_SUCCESS);
  CHECK(ms >= 29.9f);  // the markers bracket the sleep
  CHECK(ms < 5000.0f);

  // Re-recording replaces the capture: recorded on a blocked stream, then
  // again on an idle one, the event is complete as soon as the idle one is.
  Gate gate;
  REQUIRE(inst.ops->launch_host_func(inst.ctx(), s, Gate::wait, &gate) == WIA_SUCCESS);
  REQUIRE(inst.ops->event_record(inst.ctx(), end, s) == WIA_SUCCESS);
  CHECK(inst.ops->event_query(inst.ctx(), end) == WIA_IN_PROGRESS);
  REQUIRE(inst.ops->event_record(inst.ctx(), end, idle) == WIA_SUCCESS);
  REQUIRE(inst.ops->event_synchronize(inst.ctx(), end) == WIA_SUCCESS);
  CHECK(inst.ops->event_query(inst.ctx(), end) == WIA_SUCCESS);
  CHECK(inst.ops->stream_query(inst.ctx(), s) == WIA_IN_PROGRESS);
  gate.open = true;
  CHECK(inst.ops->stream_synchronize(inst.ctx(), s) == WIA_SUCCESS);

  // An event belongs to its device.
  auto other = inst.event(1);
  t_last_error.clear();
  CHECK(inst.ops->event_record(inst.ctx(), other, s) == WIA_ERROR_INVALID_HANDLE);
  CHECK(contains(t_last_error, "device"));
  CHECK(inst.ops->event_elapsed_ms(inst.ctx(), start, end, nullptr) == WIA_ERROR_INVALID_ARGUMENT);
  CHECK(inst.ops->event_query(inst.ctx(), nullptr) == WIA_ERROR_INVALID_HANDLE);

  for (auto e : {start, end, other}) CHECK(inst.ops->event_destroy(inst.ctx(), e) == WIA_SUCCESS);
  CHECK(inst.ops->stream_destroy(inst.ctx(), s) == WIA_SUCCESS);
  CHECK(inst.ops->stream_destroy(inst.ctx(), idle) == WIA_SUCCESS);
}

namespace {

struct SelfSync {
  const wia_device_ops_v1_t* ops;
  void* ctx;
  wia_provider_stream_t stream;
  wia_status_t result = WIA_SUCCESS;
  static void fn(void* arg) {
    auto* s = static_cast<SelfSync*>(arg);
    s->result = s->ops->stream_synchronize(s->ctx, s->stream);
  }
};

}  // namespace

TEST_CASE("a host function that synchronizes its own stream gets an error, not a deadlock") {
  Instance inst;
  auto s = inst.stream(0);
  SelfSync self{inst.ops, inst.ctx(), s};
  REQUIRE(inst.ops->launch_host_func(inst.ctx(), s, SelfSync::fn, &self) == WIA_SUCCESS);
  REQUIRE(inst.ops->stream_synchronize(inst.ctx(), s) == WIA_SUCCESS);
  CHECK(self.result == WIA_ERROR_INVALID_ARGUMENT);
  CHECK(inst.ops->stream_destroy(inst.ctx(), s) == WIA_SUCCESS);
}

TEST_CASE("synchronize from two threads at different points: each returns once its work ran") {
  // Both waiters sleep (each step outlasts the spin phase). The worker
  // wakes sleepers only when the earliest target completes; the one whose
  // work is still queued must register again and still be woken (a lost
  // wake-up would leave it asleep: bounded here, not a hang).
  Instance inst;
  auto s = inst.stream(0);
  struct Step {
    std::atomic<int> done{0};
    static void fn(void* p) {
      std::this_thread::sleep_for(std::chrono::milliseconds(30));
      static_cast<Step*>(p)->done.store(1);
    }
  };
  struct Waiter {
    std::atomic<bool> returned{false};
    std::atomic<int> saw{-1};  // the watched step's state when synchronize returned
  };
  // Shared with threads that may outlive the test if a wake-up is lost.
  auto steps = std::make_shared<std::array<Step, 3>>();
  auto early = std::make_shared<Waiter>(), late = std::make_shared<Waiter>();
  auto wait_in_thread = [&](std::shared_ptr<Waiter> w, int watched) {
    std::thread([ops = inst.ops, ctx = inst.ctx(), s, steps, w, watched] {
      if (ops->stream_synchronize(ctx, s) == WIA_SUCCESS) w->saw = (*steps)[watched].done.load();
      w->returned = true;
    }).detach();
  };
  REQUIRE(inst.ops->launch_host_func(inst.ctx(), s, Step::fn, &(*steps)[0]) == WIA_SUCCESS);
  wait_in_thread(early, 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(5));
  REQUIRE(inst.ops->launch_host_func(inst.ctx(), s, Step::fn, &(*steps)[1]) == WIA_SUCCESS);
  REQUIRE(inst.ops->launch_host_func(inst.ctx(), s, Step::fn, &(*steps)[2]) == WIA_SUCCESS);
  wait_in_thread(late, 2);
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while ((!early->returned || !late->returned) && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  REQUIRE(early->returned);
  REQUIRE(late->returned);
  CHECK(early->saw == 1);
  CHECK(late->saw == 1);
  CHECK(inst.ops->stream_destroy(inst.ctx(), s) == WIA_SUCCESS);
}

TEST_CASE("an asynchronous failure is reported by the next synchronize, then cleared") {
  // The only way to make host-provider work fail after it was accepted is a
  // host function that throws; it must not take the worker down.
  Instance inst;
  auto s = inst.stream(0);
  auto before = inst.event(0);
  auto after = inst.event(0);
  REQUIRE(inst.ops->event_record(inst.ctx(), before, s) == WIA_SUCCESS);
  REQUIRE(inst.ops->launch_host_func(
              inst.ctx(), s, [](void*) { throw std::runtime_error("boom"); }, nullptr) ==
          WIA_SUCCESS);
  REQUIRE(inst.ops->event_record(inst.ctx(), after, s) == WIA_SUCCESS);
  int flag = 0;
  REQUIRE(inst.ops->launch_host_func(
              inst.ctx(), s, [](void* f) { *static_cast<int*>(f) = 1; }, &flag) == WIA_SUCCESS);
  // An event captured before the failure is clean; one after reports it.
  CHECK(inst.ops->event_synchronize(inst.ctx(), before) == WIA_SUCCESS);
  t_last_error.clear();
  CHECK(inst.ops->event_synchronize(inst.ctx(), after) == WIA_ERROR_INTERNAL);
  CHECK(contains(t_last_error, "host function"));
  t_last_error.clear();
  CHECK(inst.ops->stream_synchronize(inst.ctx(), s) == WIA_ERROR_INTERNAL);
  CHECK(contains(t_last_error, "device 0"));
  CHECK(flag == 1);                                                   // later work still ran
  CHECK(inst.ops->stream_synchronize(inst.ctx(), s) == WIA_SUCCESS);  // reported once
  for (auto e : {before, after}) CHECK(inst.ops->event_destroy(inst.ctx(), e) == WIA_SUCCESS);
  CHECK(inst.ops->stream_destroy(inst.ctx(), s) == WIA_SUCCESS);
}

TEST_CASE("peer access: all host devices are peers; copies on either device's stream") {
  Instance inst(Params{{"devices", "3"}});
  std::int32_t can = -1;
  REQUIRE(inst.ops->can_access_peer(inst.ctx(), 0, 2, &can) == WIA_SUCCESS);
  CHECK(can == 1);
  REQUIRE(inst.ops->can_access_peer(inst.ctx(), 1, 1, &can) == WIA_SUCCESS);
  CHECK(can == 0);  // a device is not its own peer
  CHECK(inst.ops->can_access_peer(inst.ctx(), 0, 3, &can) == WIA_ERROR_INVALID_DEVICE);
  CHECK(inst.ops->enable_peer_access(inst.ctx(), 0, 2) == WIA_SUCCESS);
  CHECK(inst.ops->enable_peer_access(inst.ctx(), 0, 2) == WIA_SUCCESS);  // idempotent

  auto* a = static_cast<std::uint8_t*>(inst.alloc(0, 1 << 20));
  auto* b = static_cast<std::uint8_t*>(inst.alloc(2, 1 << 20));
  std::memset(a, 0x3c, 1 << 20);
  auto s0 = inst.stream(0);
  auto s2 = inst.stream(2);
  auto s1 = inst.stream(1);
  REQUIRE(inst.ops->memcpy_peer_async(inst.ctx(), s0, b, 2, a, 0, 1 << 20) == WIA_SUCCESS);
  REQUIRE(inst.ops->stream_synchronize(inst.ctx(), s0) == WIA_SUCCESS);
  CHECK(std::memcmp(a, b, 1 << 20) == 0);
  REQUIRE(inst.ops->memset_async(inst.ctx(), s2, b, 0x11, 1 << 20) == WIA_SUCCESS);
  REQUIRE(inst.ops->memcpy_peer_async(inst.ctx(), s2, a, 0, b, 2, 1 << 20) == WIA_SUCCESS);
  REQUIRE(inst.ops->stream_synchronize(inst.ctx(), s2) == WIA_SUCCESS);
  CHECK(a[(1 << 20) - 1] == 0x11);
  // The stream must belong to one of the two devices.
  CHECK(inst.ops->memcpy_peer_async(inst.ctx(), s1, a, 0, b, 2, 16) == WIA_ERROR_INVALID_HANDLE);
  for (auto s : {s0, s1, s2}) CHECK(inst.ops->stream_destroy(inst.ctx(), s) == WIA_SUCCESS);
  CHECK(inst.ops->mem_free(inst.ctx(), 0, a) == WIA_SUCCESS);
  CHECK(inst.ops->mem_free(inst.ctx(), 2, b) == WIA_SUCCESS);
}

TEST_CASE("peer_access=false: no peers, peer entries say NOT_SUPPORTED with a reason") {
  Instance inst(Params{{"devices", "2"}, {"peer_access", "false"}});
  std::int32_t can = -1;
  REQUIRE(inst.ops->can_access_peer(inst.ctx(), 0, 1, &can) == WIA_SUCCESS);
  CHECK(can == 0);
  t_last_error.clear();
  CHECK(inst.ops->enable_peer_access(inst.ctx(), 0, 1) == WIA_ERROR_NOT_SUPPORTED);
  CHECK(contains(t_last_error, "peer_access"));
  auto s = inst.stream(0);
  auto* a = inst.alloc(0, 64);
  auto* b = inst.alloc(1, 64);
  t_last_error.clear();
  CHECK(inst.ops->memcpy_peer_async(inst.ctx(), s, b, 1, a, 0, 64) == WIA_ERROR_NOT_SUPPORTED);
  CHECK(contains(t_last_error, "peer_access"));
  // The host-staged fallback the core uses instead still works.
  REQUIRE(inst.ops->memcpy_async(inst.ctx(), s, b, a, 64) == WIA_SUCCESS);
  CHECK(inst.ops->stream_synchronize(inst.ctx(), s) == WIA_SUCCESS);
  CHECK(inst.ops->stream_destroy(inst.ctx(), s) == WIA_SUCCESS);
  CHECK(inst.ops->mem_free(inst.ctx(), 0, a) == WIA_SUCCESS);
  CHECK(inst.ops->mem_free(inst.ctx(), 1, b) == WIA_SUCCESS);
}

TEST_CASE("reduce_async: every dtype and op matches the kernel; args are copied at enqueue") {
  Instance inst;
  auto s = inst.stream(0);
  constexpr std::uint64_t kCount = 5003;
  for (int dt = 0; dt < WIA_DATATYPE_COUNT; ++dt) {
    const auto dtype = static_cast<wia_datatype_t>(dt);
    const std::size_t es = wia::kernels::dtype_size(dtype);
    for (int o = 0; o < WIA_REDUCE_OP_COUNT; ++o) {
      const auto op = static_cast<wia_reduce_op_t>(o);
      std::vector<void*> bufs;
      for (int k = 0; k < 4; ++k) {
        auto* p = static_cast<std::uint8_t*>(inst.alloc(0, kCount * es));
        for (std::size_t i = 0; i < kCount * es; ++i)
          p[i] = static_cast<std::uint8_t>((i * 7 + static_cast<std::size_t>(k) * 13) % 61);
        bufs.push_back(p);
      }
      std::vector<std::uint8_t> want(kCount * es);
      {
        const void* srcs[] = {bufs[0], bufs[1], bufs[2]};
        wia_reduce_args_v1_t args{sizeof(args), dtype, op, 3, kCount, 0, want.data(), srcs};
        REQUIRE(wia::kernels::reduce(args) == WIA_SUCCESS);
      }
      const void* srcs[] = {bufs[0], bufs[1], bufs[2]};
      wia_reduce_args_v1_t args{sizeof(args), dtype, op, 3, kCount, 0, bufs[3], srcs};
      REQUIRE(inst.ops->reduce_async(inst.ctx(), s, &args) == WIA_SUCCESS);
      // The caller may reuse both the struct and the srcs array at once.
      srcs[0] = srcs[1] = srcs[2] = nullptr;
      args.dtype = static_cast<wia_datatype_t>(99);
      REQUIRE(inst.ops->stream_synchronize(inst.ctx(), s) == WIA_SUCCESS);
      CHECK_MESSAGE(std::memcmp(bufs[3], want.data(), kCount * es) == 0,
                    wia::kernels::dtype_name(dtype) << " " << wia::kernels::reduce_op_name(op));
      for (void* p : bufs) CHECK(inst.ops->mem_free(inst.ctx(), 0, p) == WIA_SUCCESS);
    }
  }
  CHECK(inst.ops->stream_destroy(inst.ctx(), s) == WIA_SUCCESS);
}

TEST_CASE("many streams on few CPUs: oversubscribed work completes promptly") {
  // More busy streams than CPUs, each synchronized from its own thread:
  // bounded spinning must not starve the workers.
  Instance inst;
  constexpr int kStreams = 8;
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  const auto t0 = std::chrono::steady_clock::now();
  for (int t = 0; t < kStreams; ++t) {
    threads.emplace_back([&] {
      wia_provider_stream_t s = nullptr;
      if (inst.ops->stream_create(inst.ctx(), 0, &s) != WIA_SUCCESS) {
        ++failures;
        return;
      }
      std::vector<std::uint8_t> a(4096, 1), b(4096, 0);
      for (int i = 0; i < 200; ++i) {
        if (inst.ops->memcpy_async(inst.ctx(), s, b.data(), a.data(), a.size()) != WIA_SUCCESS ||
            inst.ops->stream_synchronize(inst.ctx(), s) != WIA_SUCCESS)
          ++failures;
      }
      if (inst.ops->stream_destroy(inst.ctx(), s) != WIA_SUCCESS) ++failures;
    });
  }
  for (auto& t : threads) t.join();
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  CHECK(failures == 0);
  CHECK(secs < 10.0);  // 1600 round trips; unbounded spinning would take minutes
}

namespace {

struct PingPong {
  int value = 0;
  std::atomic<int> errors{0};
  struct Step {
    PingPong* game;
    int expect;
    static void fn(void* arg) {
      auto* st = static_cast<Step*>(arg);
      if (st->game->value != st->expect) ++st->game->errors;
      st->game->value = st->expect + 1;
    }
  };
};

}  // namespace

TEST_CASE("two streams hand work back and forth through re-recorded events, in order") {
  Instance inst(Params{{"devices", "2"}});
  auto a = inst.stream(0);
  auto b = inst.stream(1);
  auto ea = inst.event(0);
  auto eb = inst.event(1);
  constexpr int kRounds = 2000;
  PingPong game;
  std::vector<PingPong::Step> steps;
  steps.reserve(2 * kRounds);
  for (int k = 0; k < kRounds; ++k) {
    steps.push_back({&game, 2 * k});
    REQUIRE(inst.ops->launch_host_func(inst.ctx(), a, PingPong::Step::fn, &steps.back()) ==
            WIA_SUCCESS);
    REQUIRE(inst.ops->event_record(inst.ctx(), ea, a) == WIA_SUCCESS);
    REQUIRE(inst.ops->stream_wait_event(inst.ctx(), b, ea) == WIA_SUCCESS);
    steps.push_back({&game, 2 * k + 1});
    REQUIRE(inst.ops->launch_host_func(inst.ctx(), b, PingPong::Step::fn, &steps.back()) ==
            WIA_SUCCESS);
    REQUIRE(inst.ops->event_record(inst.ctx(), eb, b) == WIA_SUCCESS);
    REQUIRE(inst.ops->stream_wait_event(inst.ctx(), a, eb) == WIA_SUCCESS);
  }
  REQUIRE(inst.ops->stream_synchronize(inst.ctx(), a) == WIA_SUCCESS);
  REQUIRE(inst.ops->stream_synchronize(inst.ctx(), b) == WIA_SUCCESS);
  CHECK(game.errors == 0);
  CHECK(game.value == 2 * kRounds);
  for (auto e : {ea, eb}) CHECK(inst.ops->event_destroy(inst.ctx(), e) == WIA_SUCCESS);
  for (auto s : {a, b}) CHECK(inst.ops->stream_destroy(inst.ctx(), s) == WIA_SUCCESS);
}

TEST_CASE("concurrent enqueues on one stream (a core bug) still lose nothing") {
  // The ABI serialises calls on one handle; the provider survives callers
  // that do not, instead of corrupting its queue.
  Instance inst;
  auto s = inst.stream(0);
  std::atomic<int> count{0};
  constexpr int kThreads = 4;
  constexpr int kEach = 2000;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < kEach; ++i)
        inst.ops->launch_host_func(
            inst.ctx(), s, [](void* c) { ++*static_cast<std::atomic<int>*>(c); }, &count);
    });
  }
  for (auto& t : threads) t.join();
  REQUIRE(inst.ops->stream_synchronize(inst.ctx(), s) == WIA_SUCCESS);
  CHECK(count == kThreads * kEach);
  CHECK(inst.ops->stream_query(inst.ctx(), s) == WIA_SUCCESS);
  CHECK(inst.ops->stream_destroy(inst.ctx(), s) == WIA_SUCCESS);
}

// Through /proc/<pid>/fd, the fallback where ptrace-attach rights are
// refused (Yama ptrace_scope 1), forced here: the same pages, and a
// stale handle is still told apart from the exported memory.
TEST_CASE("ipc: host.ipc_open=proc maps the exported memory through /proc/<pid>/fd") {
  Instance inst(Params{{"devices", "2"}, {"ipc_open", "proc"}});
  auto* mem = static_cast<std::uint32_t*>(inst.alloc(0, 1 << 16));
  for (std::uint32_t i = 0; i < (1 << 14); ++i) mem[i] = 3 * i;
  wia_ipc_handle_t h;
  REQUIRE(inst.ops->ipc_get_handle(inst.ctx(), 0, mem, &h) == WIA_SUCCESS);
  void* opened = nullptr;
  REQUIRE_MESSAGE(inst.ops->ipc_open_handle(inst.ctx(), 1, &h, &opened) == WIA_SUCCESS,
                  t_last_error);
  auto* view = static_cast<std::uint32_t*>(opened);
  CHECK(view[4321] == 3 * 4321u);
  view[9] = 0xfeedu;
  CHECK(mem[9] == 0xfeedu);
  CHECK(inst.ops->ipc_close_handle(inst.ctx(), 1, opened) == WIA_SUCCESS);
  // The handle's descriptor number now names another file: refused.
  wia_ipc_handle_t stale = h;
  const int other = open("/dev/null", O_RDONLY | O_CLOEXEC);
  REQUIRE(other >= 0);
  // The wire format: u64 magic, u32 version, i32 pid, i32 fd, ...
  // (host_ipc.cpp, IpcWire).
  std::memcpy(stale.bytes + 16, &other, sizeof(other));
  t_last_error.clear();
  CHECK(inst.ops->ipc_open_handle(inst.ctx(), 1, &stale, &opened) == WIA_ERROR_INVALID_HANDLE);
  CHECK_MESSAGE(contains(t_last_error, "stale"), t_last_error);
  close(other);
}

TEST_CASE("ipc: export device memory, open it at another address, write through it") {
  Instance inst(Params{{"devices", "2"}});
  auto* mem = static_cast<std::uint32_t*>(inst.alloc(0, 1 << 20));
  for (std::uint32_t i = 0; i < (1 << 18); ++i) mem[i] = i;
  wia_ipc_handle_t h;
  REQUIRE(inst.ops->ipc_get_handle(inst.ctx(), 0, mem, &h) == WIA_SUCCESS);

  void* opened = nullptr;
  REQUIRE_MESSAGE(inst.ops->ipc_open_handle(inst.ctx(), 1, &h, &opened) == WIA_SUCCESS,
                  t_last_error);
  REQUIRE(opened != nullptr);
  CHECK(opened != static_cast<void*>(mem));
  auto* view = static_cast<std::uint32_t*>(opened);
  CHECK(view[12345] == 12345u);
  view[7] = 0xdeadbeef;
  CHECK(mem[7] == 0xdeadbeefu);  // the same pages

  // Imported memory is released with ipc_close_handle, not mem_free.
  t_last_error.clear();
  CHECK(inst.ops->mem_free(inst.ctx(), 1, opened) == WIA_ERROR_INVALID_ARGUMENT);
  CHECK(contains(t_last_error, "ipc_close_handle"));
  CHECK(inst.ops->ipc_close_handle(inst.ctx(), 0, opened) == WIA_ERROR_INVALID_ARGUMENT);
  CHECK(inst.ops->ipc_close_handle(inst.ctx(), 1, opened) == WIA_SUCCESS);
  CHECK(inst.ops->ipc_close_handle(inst.ctx(), 1, opened) == WIA_ERROR_INVALID_ARGUMENT);

  // What cannot be exported or opened.
  void* pinned = inst.alloc(0, 4096, WIA_MEM_HOST_PINNED);
  CHECK(inst.ops->ipc_get_handle(inst.ctx(), 0, pinned, &h) == WIA_ERROR_INVALID_ARGUMENT);
  CHECK(inst.ops->ipc_get_handle(inst.ctx(), 0, mem + 1, &h) == WIA_ERROR_INVALID_ARGUMENT);
  CHECK(inst.ops->ipc_get_handle(inst.ctx(), 1, mem, &h) == WIA_ERROR_INVALID_ARGUMENT);
  wia_ipc_handle_t garbage;
  std::memset(&garbage, 0x42, sizeof(garbage));
  CHECK(inst.ops->ipc_open_handle(inst.ctx(), 0, &garbage, &opened) == WIA_ERROR_INVALID_HANDLE);
  CHECK(inst.ops->mem_free(inst.ctx(), 0, pinned) == WIA_SUCCESS);
  CHECK(inst.ops->mem_free(inst.ctx(), 0, mem) == WIA_SUCCESS);
}

TEST_CASE("ipc: a child process opens the handle and its writes reach the parent") {
  Instance inst;  // no streams: the child must not depend on worker threads
  auto* mem = static_cast<std::uint64_t*>(inst.alloc(0, 3 << 20));
  for (std::size_t i = 0; i < (3u << 20) / 8; ++i) mem[i] = i * 3;
  wia_ipc_handle_t h;
  REQUIRE(inst.ops->ipc_get_handle(inst.ctx(), 0, mem, &h) == WIA_SUCCESS);
  const pid_t child = fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    // Device memory is not inherited (MADV_DONTFORK), so the only way in
    // is the handle. Exit codes say what failed; no doctest in the child.
    void* p = nullptr;
    if (inst.ops->ipc_open_handle(inst.ctx(), 0, &h, &p) != WIA_SUCCESS) _exit(2);
    auto* v = static_cast<std::uint64_t*>(p);
    for (std::size_t i = 0; i < (3u << 20) / 8; i += 4099)
      if (v[i] != i * 3) _exit(3);
    v[1] = 0x1234567890abcdefull;
    if (inst.ops->ipc_close_handle(inst.ctx(), 0, p) != WIA_SUCCESS) _exit(4);
    _exit(0);
  }
  int status = 0;
  REQUIRE(waitpid(child, &status, 0) == child);
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
  CHECK(mem[1] == 0x1234567890abcdefull);
  CHECK(mem[2] == 6u);
  CHECK(inst.ops->mem_free(inst.ctx(), 0, mem) == WIA_SUCCESS);
}

TEST_CASE("fini releases what the caller leaked, and logs it") {
  TestHost host(Params{{"devices", "1"}});
  void* ctx = nullptr;
  REQUIRE(provider()->init(host.table(), &ctx) == WIA_SUCCESS);
  const wia_device_ops_v1_t* ops = provider()->device;
  void* p = nullptr;
  REQUIRE(ops->mem_alloc(ctx, 0, 1 << 20, WIA_MEM_DEVICE, &p) == WIA_SUCCESS);
  wia_provider_stream_t s = nullptr;
  REQUIRE(ops->stream_create(ctx, 0, &s) == WIA_SUCCESS);
  int sleep_ms = 5;
  REQUIRE(ops->launch_host_func(ctx, s, sleep_ms_fn, &sleep_ms) == WIA_SUCCESS);
  CHECK(provider()->fini(ctx) == WIA_SUCCESS);
  bool leak_logged = false;
  for (const auto& line : host.logs()) leak_logged |= contains(line, "never freed");
  CHECK(leak_logged);
}
