// SPDX-License-Identifier: Apache-2.0
// The CUDA driver double's own test: libcuda.so.1 from this folder, opened
// with dlopen and used only through cuGetProcAddress_v2, the way the cuda
// provider uses a real driver. Scenarios that need a process of their own
// (a fault read at cuInit, an IPC importer) re-execute this binary with
// WIA_FAKE_CUDA_TEST_CHILD set; a static initialiser runs the scenario
// before doctest starts and exits with its verdict.
#include <dlfcn.h>
#include <doctest/doctest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "cuda_driver_api.h"
#include "kernels/cpu_reduce.hpp"
#include "kernels/device_kernel_params.h"

namespace {

struct Driver {
#define WIA_FAKE_TEST_MEMBER(name, params) wia_PFN_##name name = nullptr;
  WIA_CUDA_DRIVER_ENTRIES(WIA_FAKE_TEST_MEMBER)
#undef WIA_FAKE_TEST_MEMBER
  wia_PFN_cuGetProcAddress get_proc = nullptr;
};

// Never dlclosed: streams' workers belong to the library's code.
const Driver& cu() {
  static const Driver d = [] {
    Driver r;
    void* lib = dlopen(WIA_FAKE_CUDA_FILE, RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) std::abort();
    r.get_proc =
        reinterpret_cast<wia_PFN_cuGetProcAddress>(dlsym(lib, WIA_CUDA_GET_PROC_ADDRESS_SYMBOL));
    if (r.get_proc == nullptr) std::abort();
#define WIA_FAKE_TEST_LOAD(name, params)                                                \
  {                                                                                     \
    void* fn = nullptr;                                                                 \
    int status = -1;                                                                    \
    if (r.get_proc(#name, &fn, WIA_CUDA_API_VERSION, 0, &status) != WIA_CUDA_SUCCESS || \
        fn == nullptr || status != 0)                                                   \
      std::abort();                                                                     \
    r.name = reinterpret_cast<wia_PFN_##name>(fn);                                      \
  }
    WIA_CUDA_DRIVER_ENTRIES(WIA_FAKE_TEST_LOAD)
#undef WIA_FAKE_TEST_LOAD
    return r;
  }();
  return d;
}

// Initialises the driver and makes device `dev`'s primary context current.
wia_CUcontext use_device(int dev) {
  REQUIRE(cu().cuInit(0) == WIA_CUDA_SUCCESS);
  wia_CUcontext ctx = nullptr;
  REQUIRE(cu().cuDevicePrimaryCtxRetain(&ctx, dev) == WIA_CUDA_SUCCESS);
  REQUIRE(cu().cuCtxSetCurrent(ctx) == WIA_CUDA_SUCCESS);
  return ctx;
}

template <typename T>
T* dev_alloc(std::size_t count) {
  wia_CUdeviceptr p = 0;
  REQUIRE(cu().cuMemAlloc(&p, count * sizeof(T)) == WIA_CUDA_SUCCESS);
  return reinterpret_cast<T*>(p);
}
wia_CUdeviceptr dp(const void* p) { return reinterpret_cast<wia_CUdeviceptr>(p); }

// ---------------------------------------------------------------------------
// Child scenarios (a fresh process each)

constexpr std::size_t kIpcBytes = 3 * 4096 + 5;

int child_main(const std::string& mode) {
  const Driver& d = cu();
  if (mode == "uninit") {
    int n = 0;
    return d.cuDeviceGetCount(&n) == WIA_CUDA_ERROR_NOT_INITIALIZED ? 0 : 1;
  }
  if (mode == "no_device") return d.cuInit(0) == WIA_CUDA_ERROR_NO_DEVICE ? 0 : 1;
  if (mode == "devices3") {
    int n = 0;
    return d.cuInit(0) == 0 && d.cuDeviceGetCount(&n) == 0 && n == 3 ? 0 : 1;
  }
  wia_CUcontext ctx = nullptr;
  if (d.cuInit(0) != 0 || d.cuDevicePrimaryCtxRetain(&ctx, 1) != 0 || d.cuCtxSetCurrent(ctx) != 0)
    return 2;
  wia_CUdeviceptr p = 0;
  if (mode == "oom") return d.cuMemAlloc(&p, 64) == WIA_CUDA_ERROR_OUT_OF_MEMORY ? 0 : 1;
  if (mode == "device_lost") {
    // WIA_FAKE_CUDA_FAULT_AFTER=6: cuInit, retain, set-current and this
    // alloc are calls 1-4; the 7th call and every later one fail.
    if (d.cuMemAlloc(&p, 64) != 0) return 3;
    int n = 0;
    if (d.cuDeviceGetCount(&n) != 0 || d.cuDeviceGetCount(&n) != 0) return 4;
    if (d.cuMemFree(p) != WIA_CUDA_ERROR_ILLEGAL_ADDRESS) return 5;
    const char* name = nullptr;
    return d.cuDeviceGetCount(&n) == WIA_CUDA_ERROR_ILLEGAL_ADDRESS &&
                   d.cuGetErrorName(WIA_CUDA_ERROR_ILLEGAL_ADDRESS, &name) == 0 &&
                   std::strcmp(name, "CUDA_ERROR_ILLEGAL_ADDRESS") == 0
               ? 0
               : 1;
  }
  if (mode == "import") {
    // The handle's bytes arrive in hex; the exporter's pattern is i*7,
    // the reply written into the second half is 255 - i.
    const char* hex = std::getenv("WIA_FAKE_CUDA_TEST_HANDLE");
    wia_CUipcMemHandle h{};
    for (std::size_t i = 0; i < sizeof(h.reserved) && hex != nullptr; ++i)
      h.reserved[i] = static_cast<unsigned char>(
          std::strtoul(std::string(hex + 2 * i, 2).c_str(), nullptr, 16));
    if (d.cuIpcOpenMemHandle(&p, h, WIA_CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS) != 0) return 3;
    wia_CUdeviceptr again = 0;
    if (d.cuIpcOpenMemHandle(&again, h, WIA_CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS) != 0 || again != p)
      return 4;
    std::vector<unsigned char> host(kIpcBytes);
    if (d.cuMemcpy(dp(host.data()), p, kIpcBytes) != 0) return 5;
    for (std::size_t i = 0; i < kIpcBytes / 2; ++i)
      if (host[i] != static_cast<unsigned char>(i * 7)) return 6;
    for (std::size_t i = kIpcBytes / 2; i < kIpcBytes; ++i)
      host[i] = static_cast<unsigned char>(255 - i);
    if (d.cuMemcpy(p + kIpcBytes / 2, dp(host.data() + kIpcBytes / 2), kIpcBytes - kIpcBytes / 2))
      return 7;
    if (d.cuIpcCloseMemHandle(p) != 0 || d.cuIpcCloseMemHandle(again) != 0) return 8;
    return d.cuIpcCloseMemHandle(p) == WIA_CUDA_ERROR_INVALID_VALUE ? 0 : 9;
  }
  return 100;
}

[[maybe_unused]] const int kChildScenario = [] {
  if (const char* mode = std::getenv("WIA_FAKE_CUDA_TEST_CHILD")) std::_Exit(child_main(mode));
  return 0;
}();

// Runs this binary again as scenario `mode` with `env`; returns its exit status.
int run_child(const std::string& mode, std::vector<std::string> env) {
  const pid_t pid = fork();
  if (pid == 0) {
    setenv("WIA_FAKE_CUDA_TEST_CHILD", mode.c_str(), 1);
    for (const std::string& kv : env) putenv(const_cast<char*>(kv.c_str()));
    execl("/proc/self/exe", "test_fake_cuda", static_cast<char*>(nullptr));
    _exit(127);
  }
  int st = 0;
  waitpid(pid, &st, 0);
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

}  // namespace

TEST_CASE("cuGetProcAddress_v2 hands out every listed entry and nothing else") {
  void* fn = nullptr;
  int status = -1;
  CHECK(cu().get_proc("cuMemAlloc", &fn, 12000, 0, &status) == WIA_CUDA_SUCCESS);
  CHECK(fn == reinterpret_cast<void*>(cu().cuMemAlloc));
  CHECK(status == 0);
  CHECK(cu().get_proc("cuNoSuchEntry", &fn, 12000, 0, &status) == WIA_CUDA_ERROR_NOT_FOUND);
  CHECK(fn == nullptr);
  CHECK(status == 1);
  CHECK(cu().get_proc("cuMemAlloc", &fn, 11000, 0, &status) == WIA_CUDA_ERROR_NOT_FOUND);
  CHECK(status == 2);
  const char* name = nullptr;
  CHECK(cu().cuGetErrorName(WIA_CUDA_ERROR_LAUNCH_FAILED, &name) == WIA_CUDA_SUCCESS);
  CHECK(std::string(name) == "CUDA_ERROR_LAUNCH_FAILED");
  CHECK(cu().cuGetErrorString(12345, &name) == WIA_CUDA_ERROR_INVALID_VALUE);
  CHECK(name == nullptr);
}

TEST_CASE("faults and initialisation, each in a fresh process") {
  CHECK(run_child("uninit", {}) == 0);
  CHECK(run_child("no_device", {"WIA_FAKE_CUDA_FAULT=no_device"}) == 0);
  CHECK(run_child("devices3", {"WIA_FAKE_CUDA_DEVICES=3"}) == 0);
  CHECK(run_child("oom", {"WIA_FAKE_CUDA_FAULT=oom"}) == 0);
  CHECK(run_child("device_lost",
                  {"WIA_FAKE_CUDA_FAULT=device_lost", "WIA_FAKE_CUDA_FAULT_AFTER=6"}) == 0);
}

TEST_CASE("devices: names, PCI ids, memory, capability 9.0, peers") {
  REQUIRE(cu().cuInit(0) == WIA_CUDA_SUCCESS);
  int n = 0;
  REQUIRE(cu().cuDeviceGetCount(&n) == WIA_CUDA_SUCCESS);
  REQUIRE(n == 2);
  char text[64];
  REQUIRE(cu().cuDeviceGetName(text, sizeof(text), 1) == WIA_CUDA_SUCCESS);
  CHECK(std::string(text) == "Fake CUDA Device 1");
  REQUIRE(cu().cuDeviceGetPCIBusId(text, sizeof(text), 1) == WIA_CUDA_SUCCESS);
  CHECK(std::string(text) == "0000:01:00.0");
  std::size_t total = 0;
  CHECK(cu().cuDeviceTotalMem(&total, 0) == WIA_CUDA_SUCCESS);
  CHECK(total == (16ull << 30));
  int major = 0, can = -1;
  CHECK(cu().cuDeviceGetAttribute(&major, WIA_CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, 0) ==
        WIA_CUDA_SUCCESS);
  CHECK(major == 9);
  CHECK(cu().cuDeviceCanAccessPeer(&can, 0, 1) == WIA_CUDA_SUCCESS);
  CHECK(can == 1);
  wia_CUdevice dev = 0;
  CHECK(cu().cuDeviceGet(&dev, 2) == WIA_CUDA_ERROR_INVALID_DEVICE);
}

TEST_CASE("memory: registry, bad frees, pointer attributes, context required") {
  REQUIRE(cu().cuInit(0) == WIA_CUDA_SUCCESS);
  REQUIRE(cu().cuCtxSetCurrent(nullptr) == WIA_CUDA_SUCCESS);
  wia_CUdeviceptr p = 0;
  CHECK(cu().cuMemAlloc(&p, 64) == WIA_CUDA_ERROR_INVALID_CONTEXT);
  wia_CUcontext ctx = use_device(1);
  CHECK(cu().cuMemAlloc(&p, 0) == WIA_CUDA_ERROR_INVALID_VALUE);
  std::size_t free_before = 0, free_after = 0, total = 0;
  REQUIRE(cu().cuMemGetInfo(&free_before, &total) == WIA_CUDA_SUCCESS);
  auto* buf = dev_alloc<std::uint8_t>(1000);
  REQUIRE(cu().cuMemGetInfo(&free_after, &total) == WIA_CUDA_SUCCESS);
  CHECK(free_before - free_after == 1000);
  unsigned type = 0;
  int ordinal = -1;
  wia_CUdeviceptr start = 0;
  CHECK(cu().cuPointerGetAttribute(&type, WIA_CU_POINTER_ATTRIBUTE_MEMORY_TYPE, dp(buf + 10)) == 0);
  CHECK(type == WIA_CU_MEMORYTYPE_DEVICE);
  CHECK(cu().cuPointerGetAttribute(&ordinal, WIA_CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, dp(buf)) ==
        0);
  CHECK(ordinal == 1);
  CHECK(cu().cuPointerGetAttribute(&start, WIA_CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
                                   dp(buf + 999)) == 0);
  CHECK(start == dp(buf));
  int on_stack = 0;
  CHECK(cu().cuPointerGetAttribute(&type, WIA_CU_POINTER_ATTRIBUTE_MEMORY_TYPE, dp(&on_stack)) ==
        WIA_CUDA_ERROR_INVALID_VALUE);
  CHECK(cu().cuMemFree(dp(buf + 1)) == WIA_CUDA_ERROR_INVALID_VALUE);
  std::vector<std::uint8_t> host(1001, 7);
  CHECK(cu().cuMemcpy(dp(buf), dp(host.data()), 1001) == WIA_CUDA_ERROR_INVALID_VALUE);
  CHECK(cu().cuMemcpy(dp(buf), dp(host.data()), 1000) == WIA_CUDA_SUCCESS);
  CHECK(cu().cuMemsetD8(dp(buf), 3, 10) == WIA_CUDA_SUCCESS);
  CHECK(cu().cuMemcpy(dp(host.data()), dp(buf), 1000) == WIA_CUDA_SUCCESS);
  CHECK(host[9] == 3);
  CHECK(host[10] == 7);
  CHECK(cu().cuMemHostRegister(host.data(), host.size(), 0) == WIA_CUDA_SUCCESS);
  CHECK(cu().cuMemHostRegister(host.data() + 8, 8, 0) ==
        WIA_CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED);
  CHECK(cu().cuMemHostUnregister(host.data()) == WIA_CUDA_SUCCESS);
  int dmabuf = -1;
  CHECK(cu().cuMemGetHandleForAddressRange(&dmabuf, dp(buf), 4096,
                                           WIA_CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0) == 0);
  CHECK(dmabuf >= 0);
  CHECK(pread(dmabuf, &on_stack, 1, 9) == 1);
  CHECK((on_stack & 0xFF) == 3);
  close(dmabuf);
  CHECK(cu().cuMemFree(dp(buf)) == WIA_CUDA_SUCCESS);
  CHECK(cu().cuMemFree(dp(buf)) == WIA_CUDA_ERROR_INVALID_VALUE);
  (void)ctx;
  CHECK(cu().cuDevicePrimaryCtxRelease(1) == WIA_CUDA_SUCCESS);
}

namespace {
void sleep_40ms(void*) { std::this_thread::sleep_for(std::chrono::milliseconds(40)); }
wia_CUresult g_from_host_function = 0;
void call_driver(void*) {
  int n = 0;
  g_from_host_function = cu().cuDeviceGetCount(&n);
}
}  // namespace

TEST_CASE("streams: FIFO order, events join streams, elapsed time, host functions") {
  use_device(0);
  wia_CUstream a = nullptr, b = nullptr;
  REQUIRE(cu().cuStreamCreate(&a, 0) == WIA_CUDA_SUCCESS);
  REQUIRE(cu().cuStreamCreate(&b, WIA_CU_STREAM_NON_BLOCKING) == WIA_CUDA_SUCCESS);
  wia_CUevent start = nullptr, done = nullptr, unrecorded = nullptr;
  REQUIRE(cu().cuEventCreate(&start, WIA_CU_EVENT_DEFAULT) == 0);
  REQUIRE(cu().cuEventCreate(&done, WIA_CU_EVENT_DEFAULT) == 0);
  REQUIRE(cu().cuEventCreate(&unrecorded, WIA_CU_EVENT_DISABLE_TIMING) == 0);
  CHECK(cu().cuEventQuery(unrecorded) == WIA_CUDA_SUCCESS);
  CHECK(cu().cuStreamWaitEvent(b, unrecorded, 0) == WIA_CUDA_SUCCESS);  // a no-op
  auto* x = dev_alloc<std::uint8_t>(256);
  auto* y = dev_alloc<std::uint8_t>(256);
  // On a: start, 40 ms, x := 9, done. On b, after done: y := x. Without
  // the wait, b would copy x before the memset.
  CHECK(cu().cuMemsetD8(dp(x), 1, 256) == 0);
  CHECK(cu().cuEventRecord(start, a) == 0);
  CHECK(cu().cuLaunchHostFunc(a, sleep_40ms, nullptr) == 0);
  CHECK(cu().cuMemsetD8Async(dp(x), 9, 256, a) == 0);
  CHECK(cu().cuEventRecord(done, a) == 0);
  CHECK(cu().cuStreamQuery(a) == WIA_CUDA_ERROR_NOT_READY);
  CHECK(cu().cuEventQuery(done) == WIA_CUDA_ERROR_NOT_READY);
  float ms = 0;
  CHECK(cu().cuEventElapsedTime(&ms, start, done) == WIA_CUDA_ERROR_NOT_READY);
  CHECK(cu().cuStreamWaitEvent(b, done, 0) == 0);
  CHECK(cu().cuMemcpyAsync(dp(y), dp(x), 256, b) == 0);
  CHECK(cu().cuStreamSynchronize(b) == WIA_CUDA_SUCCESS);
  std::uint8_t host[256];
  CHECK(cu().cuMemcpy(dp(host), dp(y), 256) == 0);
  CHECK(host[0] == 9);
  CHECK(host[255] == 9);
  CHECK(cu().cuEventSynchronize(done) == 0);
  CHECK(cu().cuEventElapsedTime(&ms, start, done) == WIA_CUDA_SUCCESS);
  CHECK(ms >= 39.0f);
  CHECK(cu().cuEventElapsedTime(&ms, start, unrecorded) == WIA_CUDA_ERROR_INVALID_HANDLE);
  CHECK(cu().cuLaunchHostFunc(a, call_driver, nullptr) == 0);
  CHECK(cu().cuStreamSynchronize(a) == WIA_CUDA_SUCCESS);
  CHECK(g_from_host_function == 800);  // CUDA_ERROR_NOT_PERMITTED
  CHECK(cu().cuStreamDestroy(a) == 0);
  CHECK(cu().cuStreamSynchronize(a) == WIA_CUDA_ERROR_INVALID_HANDLE);
  CHECK(cu().cuStreamDestroy(b) == 0);
  CHECK(cu().cuEventDestroy(start) == 0);
  CHECK(cu().cuEventDestroy(done) == 0);
  CHECK(cu().cuEventDestroy(unrecorded) == 0);
  CHECK(cu().cuMemFree(dp(x)) == 0);
  CHECK(cu().cuMemFree(dp(y)) == 0);
  CHECK(cu().cuDevicePrimaryCtxRelease(0) == WIA_CUDA_SUCCESS);
}

TEST_CASE("kernels: the provider's names only, CPU results, address checks") {
  wia_CUcontext ctx0 = use_device(0);
  static const unsigned char kImage[] = "not parsed";
  wia_CUmodule mod = nullptr;
  REQUIRE(cu().cuModuleLoadData(&mod, kImage) == WIA_CUDA_SUCCESS);
  wia_CUfunction sum = nullptr, bmax = nullptr, scale = nullptr, bad = nullptr;
  REQUIRE(cu().cuModuleGetFunction(&sum, mod, "wia_reduce_float32_sum") == 0);
  REQUIRE(cu().cuModuleGetFunction(&bmax, mod, "wia_reduce_bfloat16_max") == 0);
  REQUIRE(cu().cuModuleGetFunction(&scale, mod, "wia_scale_int8") == 0);
  CHECK(cu().cuModuleGetFunction(&bad, mod, "wia_reduce_float32_avg") == WIA_CUDA_ERROR_NOT_FOUND);
  CHECK(cu().cuModuleGetFunction(&bad, mod, "my_kernel") == WIA_CUDA_ERROR_NOT_FOUND);
  wia_CUstream s = nullptr;
  REQUIRE(cu().cuStreamCreate(&s, 0) == 0);

  constexpr std::size_t n = 1000;
  std::vector<float> h0(n), h1(n), h2(n);
  for (std::size_t i = 0; i < n; ++i) {
    h0[i] = static_cast<float>(i) * 0.5f;
    h1[i] = 3.0f - static_cast<float>(i % 7);
    h2[i] = static_cast<float>(i % 13) * 0.25f;
  }
  float* d[3] = {dev_alloc<float>(n), dev_alloc<float>(n), dev_alloc<float>(n)};
  REQUIRE(cu().cuMemcpy(dp(d[0]), dp(h0.data()), n * 4) == 0);
  REQUIRE(cu().cuMemcpy(dp(d[1]), dp(h1.data()), n * 4) == 0);
  REQUIRE(cu().cuMemcpy(dp(d[2]), dp(h2.data()), n * 4) == 0);
  wia_cuda_reduce_params_t p{};
  p.dst = d[0];  // in place, divided by 3 (an average)
  p.srcs[0] = d[0];
  p.srcs[1] = d[1];
  p.srcs[2] = d[2];
  p.nsrcs = 3;
  p.count = n;
  p.divisor = 3;
  void* args[] = {&p};
  REQUIRE(cu().cuLaunchKernel(sum, 4, 1, 1, 256, 1, 1, 0, s, args, nullptr) == 0);
  p.nsrcs = 0;  // the block was copied at launch: this change must not matter
  REQUIRE(cu().cuStreamSynchronize(s) == WIA_CUDA_SUCCESS);
  std::vector<float> out(n);
  REQUIRE(cu().cuMemcpy(dp(out.data()), dp(d[0]), n * 4) == 0);
  for (std::size_t i = 0; i < n; ++i) {
    const double ref = (double(h0[i]) + double(h1[i]) + double(h2[i])) / 3.0;
    REQUIRE(std::fabs(out[i] - ref) <= 1e-5 * std::max(1.0, std::fabs(ref)));
  }

  // bfloat16 max of two, into a third buffer.
  std::vector<std::uint16_t> b0(n), b1(n), bout(n);
  for (std::size_t i = 0; i < n; ++i) {
    b0[i] = wia::kernels::float_to_bfloat16(static_cast<float>(i % 50) - 25.0f);
    b1[i] = wia::kernels::float_to_bfloat16(static_cast<float>(i % 31) - 15.0f);
  }
  auto* db = dev_alloc<std::uint16_t>(3 * n);
  REQUIRE(cu().cuMemcpy(dp(db), dp(b0.data()), n * 2) == 0);
  REQUIRE(cu().cuMemcpy(dp(db + n), dp(b1.data()), n * 2) == 0);
  wia_cuda_reduce_params_t pb{};
  pb.dst = db + 2 * n;
  pb.srcs[0] = db;
  pb.srcs[1] = db + n;
  pb.nsrcs = 2;
  pb.count = n;
  void* bargs[] = {&pb};
  REQUIRE(cu().cuLaunchKernel(bmax, 1, 1, 1, 32, 1, 1, 0, s, bargs, nullptr) == 0);
  REQUIRE(cu().cuStreamSynchronize(s) == WIA_CUDA_SUCCESS);
  REQUIRE(cu().cuMemcpy(dp(bout.data()), dp(db + 2 * n), n * 2) == 0);
  for (std::size_t i = 0; i < n; ++i)
    REQUIRE(wia::kernels::bfloat16_to_float(bout[i]) ==
            std::max(static_cast<float>(i % 50) - 25.0f, static_cast<float>(i % 31) - 15.0f));

  // int8 scale as the core's host path: truncated toward zero, wrapped.
  const std::int8_t v[4] = {100, -100, 5, -3};
  auto* di = dev_alloc<std::int8_t>(4);
  REQUIRE(cu().cuMemcpy(dp(di), dp(v), 4) == 0);
  wia_cuda_scale_params_t ps{di, 4, 1.5};
  void* sargs[] = {&ps};
  REQUIRE(cu().cuLaunchKernel(scale, 1, 1, 1, 32, 1, 1, 0, s, sargs, nullptr) == 0);
  REQUIRE(cu().cuStreamSynchronize(s) == WIA_CUDA_SUCCESS);
  std::int8_t got[4];
  REQUIRE(cu().cuMemcpy(dp(got), dp(di), 4) == 0);
  CHECK(got[0] == -106);  // 150 wraps to 150 - 256
  CHECK(got[1] == 106);   // -150 wraps to -150 + 256
  CHECK(got[2] == 7);     // 7.5 truncates
  CHECK(got[3] == -4);    // -4.5 truncates toward zero

  // A kernel cannot read pageable host memory: the stream reports an
  // illegal address at its next synchronize, once.
  pb.srcs[1] = b1.data();
  REQUIRE(cu().cuLaunchKernel(bmax, 1, 1, 1, 32, 1, 1, 0, s, bargs, nullptr) == 0);
  CHECK(cu().cuStreamSynchronize(s) == WIA_CUDA_ERROR_ILLEGAL_ADDRESS);
  CHECK(cu().cuStreamSynchronize(s) == WIA_CUDA_SUCCESS);

  // Device 1's memory needs peer access from device 0's context.
  wia_CUcontext ctx1 = use_device(1);
  auto* remote = dev_alloc<std::uint16_t>(n);
  REQUIRE(cu().cuCtxSetCurrent(ctx0) == 0);
  pb.srcs[1] = remote;
  REQUIRE(cu().cuLaunchKernel(bmax, 1, 1, 1, 32, 1, 1, 0, s, bargs, nullptr) == 0);
  CHECK(cu().cuStreamSynchronize(s) == WIA_CUDA_ERROR_ILLEGAL_ADDRESS);
  CHECK(cu().cuCtxEnablePeerAccess(ctx1, 0) == WIA_CUDA_SUCCESS);
  CHECK(cu().cuCtxEnablePeerAccess(ctx1, 0) == WIA_CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED);
  REQUIRE(cu().cuLaunchKernel(bmax, 1, 1, 1, 32, 1, 1, 0, s, bargs, nullptr) == 0);
  CHECK(cu().cuStreamSynchronize(s) == WIA_CUDA_SUCCESS);
  CHECK(cu().cuLaunchKernel(bmax, 1, 1, 1, 2048, 1, 1, 0, s, bargs, nullptr) ==
        WIA_CUDA_ERROR_INVALID_VALUE);

  CHECK(cu().cuStreamDestroy(s) == 0);
  CHECK(cu().cuModuleUnload(mod) == 0);
  CHECK(cu().cuDevicePrimaryCtxRelease(1) == 0);  // frees `remote` with the context
  CHECK(cu().cuDevicePrimaryCtxRelease(0) == 0);  // and the rest of device 0's
}

TEST_CASE("IPC: another process opens the handle, reads and writes the allocation") {
  use_device(0);
  auto* buf = dev_alloc<std::uint8_t>(kIpcBytes);
  std::vector<std::uint8_t> host(kIpcBytes, 0);
  for (std::size_t i = 0; i < kIpcBytes / 2; ++i) host[i] = static_cast<std::uint8_t>(i * 7);
  REQUIRE(cu().cuMemcpy(dp(buf), dp(host.data()), kIpcBytes) == 0);
  wia_CUipcMemHandle h{};
  REQUIRE(cu().cuIpcGetMemHandle(&h, dp(buf + 100)) == 0);  // the whole allocation
  wia_CUdeviceptr self = 0;
  CHECK(cu().cuIpcOpenMemHandle(&self, h, 0) == WIA_CUDA_ERROR_INVALID_CONTEXT);
  std::string hex = "WIA_FAKE_CUDA_TEST_HANDLE=";
  char byte[3];
  for (unsigned char c : h.reserved) {
    std::snprintf(byte, sizeof(byte), "%02x", c);
    hex += byte;
  }
  REQUIRE(run_child("import", {hex}) == 0);
  REQUIRE(cu().cuMemcpy(dp(host.data()), dp(buf), kIpcBytes) == 0);
  for (std::size_t i = kIpcBytes / 2; i < kIpcBytes; ++i)
    REQUIRE(host[i] == static_cast<std::uint8_t>(255 - i));
  CHECK(cu().cuMemFree(dp(buf)) == 0);
  CHECK(cu().cuDevicePrimaryCtxRelease(0) == 0);
}
