// SPDX-License-Identifier: Apache-2.0
// wia-cuda-bench: the cuda provider against the CUDA driver called
// directly, in one run, as ratios (issue 22's benchmarks):
//
//   copy     D2D, H2D and D2H (pinned) through libwia's wia_memcpy_async
//            against cuMemcpyAsync on a stream of our own, same sizes,
//            rounds alternating, best of each; target >= 0.9x.
//   reduce   the provider's reduce kernel (reduce_async through the
//            provider ABI, 2 sources in place: 3 bytes moved per byte of
//            data) against the device's memory bandwidth, measured here as
//            the D2D copy's (2 bytes moved per byte); target >= 0.8x.
//   kernel   a caller's PTX kernel through wia_module_load/wia_launch_kernel,
//            data checked.
//   allreduce a communicator over every cuda device libwia shows (on one
//            GPU: its logical devices, cuda.logical_devices_per_gpu), data
//            checked against a reference computed on the host in double;
//            busbw beside the D2D copy bound.
//
//   wia-cuda-bench [--size 64M] [--iters 20] [--rounds 5] [--ranks 4]
//
// Exit status: 0 when every data check passed (ratios are printed, never
// judged: timings belong to benchmarks, not tests), 1 on a wrong result,
// 2 on bad usage, 3 when there is no cuda device.
#include <dlfcn.h>
#include <wia/provider.h>
#include <wia/wia.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "../../providers/cuda/cuda_driver_api.h"
#include "wia_common/text.hpp"

namespace {

[[noreturn]] void die(int code, const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  std::fprintf(stderr, "wia-cuda-bench: ");
  std::vfprintf(stderr, fmt, ap);
  std::fprintf(stderr, "\n");
  va_end(ap);
  std::exit(code);
}

#define CHECK_WIA(call)                                                                   \
  do {                                                                                    \
    const wia_status_t st_ = (call);                                                      \
    if (st_ != WIA_SUCCESS)                                                               \
      die(1, "%s:%d: %s: %s: %s", __FILE__, __LINE__, #call, wia_status_string(st_),       \
          wia_get_last_error());                                                          \
  } while (0)

struct Options {
  std::uint64_t size = 64ull << 20;
  int iters = 20;
  int rounds = 5;
  int ranks = 4;
};

// --- the driver, called directly ------------------------------------------------

struct Driver {
#define WIA_DECLARE_MEMBER(name, params) wia_PFN_##name name = nullptr;
  WIA_CUDA_DRIVER_ENTRIES(WIA_DECLARE_MEMBER)
#undef WIA_DECLARE_MEMBER
  void* lib = nullptr;

  void open() {
    const char* env = std::getenv("WIA_CUDA_LIBRARY");
    const char* path = env && *env ? env : "libcuda.so.1";
    lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) die(3, "%s: %s", path, dlerror());
    auto get_proc = reinterpret_cast<wia_PFN_cuGetProcAddress>(
        dlsym(lib, WIA_CUDA_GET_PROC_ADDRESS_SYMBOL));
    if (get_proc == nullptr) die(3, "%s has no %s", path, WIA_CUDA_GET_PROC_ADDRESS_SYMBOL);
#define WIA_RESOLVE(name, params)                                                        \
  {                                                                                      \
    void* fn = nullptr;                                                                  \
    int found = 0;                                                                       \
    if (get_proc(#name, &fn, WIA_CUDA_API_VERSION, 0, &found) == WIA_CUDA_SUCCESS && fn) \
      name = reinterpret_cast<wia_PFN_##name>(fn);                                       \
  }
    WIA_CUDA_DRIVER_ENTRIES(WIA_RESOLVE)
#undef WIA_RESOLVE
    check(cuInit(0), "cuInit");
  }

  void check(wia_CUresult r, const char* what) const {
    if (r == WIA_CUDA_SUCCESS) return;
    const char* name = "?";
    if (cuGetErrorName) cuGetErrorName(r, &name);
    die(1, "%s: %s", what, name);
  }
};

// Milliseconds of `fn` run `iters` times between two events on `stream`.
double time_driver(const Driver& drv, wia_CUstream stream, int iters,
                   const std::function<void()>& fn) {
  wia_CUevent a = nullptr, b = nullptr;
  drv.check(drv.cuEventCreate(&a, WIA_CU_EVENT_DEFAULT), "cuEventCreate");
  drv.check(drv.cuEventCreate(&b, WIA_CU_EVENT_DEFAULT), "cuEventCreate");
  fn();  // warm-up
  drv.check(drv.cuEventRecord(a, stream), "cuEventRecord");
  for (int i = 0; i < iters; ++i) fn();
  drv.check(drv.cuEventRecord(b, stream), "cuEventRecord");
  drv.check(drv.cuEventSynchronize(b), "cuEventSynchronize");
  float ms = 0;
  drv.check(drv.cuEventElapsedTime(&ms, a, b), "cuEventElapsedTime");
  drv.cuEventDestroy(a);
  drv.cuEventDestroy(b);
  return ms / iters;
}

double time_wia(wia_stream_t stream, int iters, const std::function<void()>& fn) {
  wia_event_t a = nullptr, b = nullptr;
  CHECK_WIA(wia_create_event(&a));
  CHECK_WIA(wia_create_event(&b));
  fn();
  CHECK_WIA(wia_event_record(a, stream));
  for (int i = 0; i < iters; ++i) fn();
  CHECK_WIA(wia_event_record(b, stream));
  CHECK_WIA(wia_event_synchronize(b));
  float ms = 0;
  CHECK_WIA(wia_event_elapsed_time(&ms, a, b));
  wia_destroy_event(a);
  wia_destroy_event(b);
  return ms / iters;
}

double gbps(std::uint64_t bytes, double ms) { return ms > 0 ? bytes / ms / 1e6 : 0; }

// --- the provider, through its ABI (the reduce kernel on its own) -----------------

struct ProviderHost {
  const wia_provider_v1_t* desc = nullptr;
  std::string last_error;

  static ProviderHost& self() {
    static ProviderHost h;
    return h;
  }
  static void log(void*, wia_log_level_t level, const char* msg) {
    if (level >= WIA_LOG_WARN) std::fprintf(stderr, "cuda provider: %s\n", msg);
  }
  static void set_error(void*, const char* msg) { self().last_error = msg; }
  // A declared parameter's value: WIA_CUDA_<KEY> or its declared default.
  static const char* get_param(void*, const char* key) {
    const wia_provider_v1_t* d = self().desc;
    const auto* p = reinterpret_cast<const unsigned char*>(d->params);
    for (std::uint32_t i = 0; i < d->num_params; ++i) {
      const auto* decl =
          reinterpret_cast<const wia_param_decl_v1_t*>(p + i * d->params[0].struct_size);
      if (std::strcmp(decl->key, key) != 0) continue;
      std::string env = "WIA_CUDA_" + std::string(key);
      for (char& c : env) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
      const char* v = std::getenv(env.c_str());
      return v != nullptr ? v : decl->default_value;
    }
    return nullptr;
  }
  static std::uint64_t clock_ns(void*) {
    return static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                          std::chrono::steady_clock::now().time_since_epoch())
                                          .count());
  }
};

// GB/s of the provider's reduce_async, 2 float32 sources in place, counted as
// 3 bytes moved per byte of data; -1 when the provider cannot be opened here.
double reduce_kernel_gbps(const std::string& provider_file, const Options& o) {
  void* so = dlopen(provider_file.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (so == nullptr) return -1;
  auto* desc = static_cast<const wia_provider_v1_t*>(dlsym(so, WIA_PROVIDER_SYMBOL_V1));
  if (desc == nullptr || desc->device == nullptr) return -1;
  ProviderHost::self().desc = desc;
  wia_host_services_v1_t host{};
  host.struct_size = sizeof(host);
  host.abi_version = WIA_HOST_SERVICES_VERSION;
  host.log = ProviderHost::log;
  host.set_error = ProviderHost::set_error;
  host.get_param = ProviderHost::get_param;
  host.clock_ns = ProviderHost::clock_ns;
  void* ctx = nullptr;
  if (desc->init(&host, &ctx) != WIA_SUCCESS)
    die(1, "cuda provider init: %s", ProviderHost::self().last_error.c_str());
  const wia_device_ops_v1_t* ops = desc->device;
  void *a = nullptr, *b = nullptr;
  wia_provider_stream_t s = nullptr;
  wia_provider_event_t e0 = nullptr, e1 = nullptr;
  auto ok = [&](wia_status_t st, const char* what) {
    if (st != WIA_SUCCESS) die(1, "%s: %s", what, ProviderHost::self().last_error.c_str());
  };
  ok(ops->mem_alloc(ctx, 0, o.size, WIA_MEM_DEVICE, &a), "mem_alloc");
  ok(ops->mem_alloc(ctx, 0, o.size, WIA_MEM_DEVICE, &b), "mem_alloc");
  ok(ops->memset(ctx, 0, a, 0, o.size), "memset");
  ok(ops->memset(ctx, 0, b, 0, o.size), "memset");
  ok(ops->stream_create(ctx, 0, &s), "stream_create");
  ok(ops->event_create(ctx, 0, &e0), "event_create");
  ok(ops->event_create(ctx, 0, &e1), "event_create");
  const void* srcs[2] = {a, b};
  wia_reduce_args_v1_t args{};
  args.struct_size = sizeof(args);
  args.dtype = WIA_FLOAT32;
  args.op = WIA_REDUCE_SUM;
  args.nsrcs = 2;
  args.count = o.size / 4;
  args.dst = a;
  args.srcs = srcs;
  double best = 0;
  for (int round = 0; round < o.rounds; ++round) {
    ok(ops->reduce_async(ctx, s, &args), "reduce_async");
    ok(ops->event_record(ctx, e0, s), "event_record");
    for (int i = 0; i < o.iters; ++i) ok(ops->reduce_async(ctx, s, &args), "reduce_async");
    ok(ops->event_record(ctx, e1, s), "event_record");
    ok(ops->event_synchronize(ctx, e1), "event_synchronize");
    float ms = 0;
    ok(ops->event_elapsed_ms(ctx, e0, e1, &ms), "event_elapsed_ms");
    best = std::max(best, gbps(3 * o.size, ms / o.iters));
  }
  ops->event_destroy(ctx, e0);
  ops->event_destroy(ctx, e1);
  ops->stream_destroy(ctx, s);
  ops->mem_free(ctx, 0, a);
  ops->mem_free(ctx, 0, b);
  desc->fini(ctx);
  dlclose(so);
  return best;
}

// --- a caller's kernel through wia_launch_kernel ---------------------------------------

// extern "C" __global__ void wia_test_add_u32(unsigned* data, unsigned long long
// count, unsigned value) { i = blockIdx.x * blockDim.x + threadIdx.x; if (i <
// count) data[i] += value; }, as nvcc 13 -ptx -arch=compute_80 writes it. The
// driver double knows the same kernel by name (tests/providers/fake-cuda).
const char kAddKernelPtx[] = R"PTX(
.version 9.0
.target sm_80
.address_size 64
	// .globl	wia_test_add_u32
.visible .entry wia_test_add_u32(
	.param .u64 wia_test_add_u32_param_0,
	.param .u64 wia_test_add_u32_param_1,
	.param .u32 wia_test_add_u32_param_2
)
{
	.reg .pred 	%p<2>;
	.reg .b32 	%r<7>;
	.reg .b64 	%rd<9>;
	ld.param.u64 	%rd2, [wia_test_add_u32_param_0];
	ld.param.u64 	%rd3, [wia_test_add_u32_param_1];
	ld.param.u32 	%r1, [wia_test_add_u32_param_2];
	mov.u32 	%r2, %ctaid.x;
	mov.u32 	%r3, %ntid.x;
	mul.wide.u32 	%rd4, %r2, %r3;
	mov.u32 	%r4, %tid.x;
	cvt.u64.u32 	%rd5, %r4;
	add.s64 	%rd1, %rd4, %rd5;
	setp.ge.u64 	%p1, %rd1, %rd3;
	@%p1 bra 	$L__BB0_2;
	cvta.to.global.u64 	%rd6, %rd2;
	shl.b64 	%rd7, %rd1, 2;
	add.s64 	%rd8, %rd6, %rd7;
	ld.global.u32 	%r5, [%rd8];
	add.s32 	%r6, %r5, %r1;
	st.global.u32 	[%rd8], %r6;
$L__BB0_2:
	ret;
}
)PTX";

// Loads the PTX as a module, launches it twice (+ 2 * value) and checks every
// element. Returns the number of wrong elements.
std::uint64_t launch_kernel_check(wia_device_t device) {
  constexpr std::uint64_t n = 1 << 20;
  constexpr std::uint32_t value = 5;
  std::vector<std::uint32_t> host(n);
  for (std::uint64_t i = 0; i < n; ++i) host[i] = static_cast<std::uint32_t>(i);
  void* data = nullptr;
  wia_stream_t stream = nullptr;
  wia_module_t module = nullptr;
  wia_kernel_t kernel = nullptr;
  CHECK_WIA(wia_malloc_on(device, &data, n * 4));
  CHECK_WIA(wia_memcpy(data, host.data(), n * 4));
  CHECK_WIA(wia_create_stream_on(device, &stream));
  CHECK_WIA(wia_module_load(device, kAddKernelPtx, sizeof(kAddKernelPtx), &module));
  CHECK_WIA(wia_kernel_create(module, "wia_test_add_u32", &kernel));
  const std::uint32_t grid[3] = {static_cast<std::uint32_t>(n / 256), 1, 1};
  const std::uint32_t block[3] = {256, 1, 1};
  const unsigned long long count = n;
  CHECK_WIA(wia_kernel_set_launch(kernel, grid, block, 0));
  CHECK_WIA(wia_kernel_set_arg(kernel, 0, &data, sizeof(data)));
  CHECK_WIA(wia_kernel_set_arg(kernel, 1, &count, sizeof(count)));
  CHECK_WIA(wia_kernel_set_arg(kernel, 2, &value, sizeof(value)));
  CHECK_WIA(wia_launch_kernel(kernel, stream));
  CHECK_WIA(wia_launch_kernel(kernel, stream));
  CHECK_WIA(wia_stream_synchronize(stream));
  CHECK_WIA(wia_memcpy(host.data(), data, n * 4));
  std::uint64_t wrong = 0;
  for (std::uint64_t i = 0; i < n; ++i) wrong += host[i] != static_cast<std::uint32_t>(i + 2 * value);
  std::printf("%-34s %llu elements, #wrong %llu\n", "wia_launch_kernel (caller's PTX)",
              static_cast<unsigned long long>(n), static_cast<unsigned long long>(wrong));
  CHECK_WIA(wia_kernel_destroy(kernel));
  CHECK_WIA(wia_module_unload(module));
  CHECK_WIA(wia_destroy_stream(stream));
  CHECK_WIA(wia_free(data));
  return wrong;
}

// --- the runs ----------------------------------------------------------------------

struct CopyResult {
  double wia = 0, direct = 0;
};

CopyResult bench_copy(const Driver& drv, wia_CUstream cs, wia_stream_t ws, void* dst,
                      const void* src, const Options& o, std::uint64_t bytes_moved) {
  CopyResult r;
  for (int round = 0; round < o.rounds; ++round) {
    const double d = time_driver(drv, cs, o.iters, [&] {
      drv.check(drv.cuMemcpyAsync(reinterpret_cast<wia_CUdeviceptr>(dst),
                                  reinterpret_cast<wia_CUdeviceptr>(src), o.size, cs),
                "cuMemcpyAsync");
    });
    const double w = time_wia(ws, o.iters, [&] { CHECK_WIA(wia_memcpy_async(dst, src, o.size, ws)); });
    r.direct = std::max(r.direct, gbps(bytes_moved, d));
    r.wia = std::max(r.wia, gbps(bytes_moved, w));
  }
  return r;
}

void print_ratio(const char* what, double ours, double ref, const char* ref_name, double target) {
  std::printf("%-34s %10.1f GB/s   %-22s %10.1f GB/s   ratio %.3f (target >= %.2f)\n", what, ours,
              ref_name, ref, ref > 0 ? ours / ref : 0.0, target);
}

// All-reduce (float32 sum) over `devs`, checked element by element against
// the sum in double of the known inputs. Returns the number of wrong values.
std::uint64_t allreduce_check(const std::vector<wia_device_t>& devs, const Options& o,
                              double copy_bound_gbps) {
  const int n = static_cast<int>(devs.size());
  const std::uint64_t count = o.size / sizeof(float);
  wia_communicator_t comm = nullptr;
  CHECK_WIA(wia_create_communicator(devs.data(), n, &comm));
  std::vector<void*> send(n), recv(n);
  std::vector<wia_stream_t> streams(n);
  std::vector<float> host(count);
  for (int r = 0; r < n; ++r) {
    CHECK_WIA(wia_malloc_on(devs[r], &send[r], o.size));
    CHECK_WIA(wia_malloc_on(devs[r], &recv[r], o.size));
    CHECK_WIA(wia_create_stream_on(devs[r], &streams[r]));
    for (std::uint64_t i = 0; i < count; ++i)
      host[i] = static_cast<float>(static_cast<int>((i * 7 + static_cast<std::uint64_t>(r) * 13) % 23) - 11);
    CHECK_WIA(wia_memcpy(send[r], host.data(), o.size));
    CHECK_WIA(wia_memset(recv[r], 0xCD, o.size));
  }
  wia_collective_config_t cfg{};
  cfg.operation = WIA_COLLECTIVE_ALLREDUCE;
  cfg.reduction_op = WIA_REDUCE_SUM;
  cfg.datatype = WIA_FLOAT32;
  auto post = [&] {
    CHECK_WIA(wia_group_start());
    for (int r = 0; r < n; ++r)
      CHECK_WIA(wia_all_reduce(comm, send[r], recv[r], count, &cfg, streams[r]));
    CHECK_WIA(wia_group_end());
  };
  auto sync_all = [&] {
    for (int r = 0; r < n; ++r) CHECK_WIA(wia_stream_synchronize(streams[r]));
  };
  post();
  sync_all();
  std::uint64_t wrong = 0;
  for (int r = 0; r < n; ++r) {
    CHECK_WIA(wia_memcpy(host.data(), recv[r], o.size));
    for (std::uint64_t i = 0; i < count; ++i) {
      double want = 0;
      for (int q = 0; q < n; ++q)
        want += static_cast<double>(static_cast<int>((i * 7 + static_cast<std::uint64_t>(q) * 13) % 23) - 11);
      if (static_cast<double>(host[i]) != want) ++wrong;
    }
  }
  double best_ms = 1e300;
  for (int round = 0; round < o.rounds; ++round) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < o.iters; ++i) post();
    sync_all();
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() /
        o.iters;
    best_ms = std::min(best_ms, ms);
  }
  const double algbw = gbps(o.size, best_ms);
  const double busbw = algbw * 2.0 * (n - 1) / n;
  std::printf("%-34s %10.1f GB/s busbw (%d ranks, %.3f ms, #wrong %llu)   copy bound %.1f GB/s   "
              "ratio %.3f\n",
              "all-reduce float32 sum", busbw, n, best_ms, static_cast<unsigned long long>(wrong),
              copy_bound_gbps, copy_bound_gbps > 0 ? busbw / copy_bound_gbps : 0.0);
  for (int r = 0; r < n; ++r) {
    wia_free(send[r]);
    wia_free(recv[r]);
    wia_destroy_stream(streams[r]);
  }
  CHECK_WIA(wia_destroy_communicator(comm));
  return wrong;
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) die(2, "%s needs a value", a.c_str());
      return argv[++i];
    };
    if (a == "--size") {
      const std::string v = next();
      if (!wia::common::parse_size(v, &o.size) || o.size < 1024 || o.size % 1024 != 0)
        die(2, "--size %s: a size of at least 1K, a multiple of 1K (64M, 1G)", v.c_str());
    } else if (a == "--iters") {
      o.iters = std::atoi(next().c_str());
    } else if (a == "--rounds") {
      o.rounds = std::atoi(next().c_str());
    } else if (a == "--ranks") {
      o.ranks = std::atoi(next().c_str());
    } else if (a == "-h" || a == "--help") {
      std::printf("usage: wia-cuda-bench [--size 64M] [--iters 20] [--rounds 5] [--ranks 4]\n");
      std::exit(0);
    } else {
      die(2, "unknown option %s (see --help)", a.c_str());
    }
  }
  if (o.iters < 1 || o.rounds < 1 || o.ranks < 1 || o.ranks > 64)
    die(2, "--iters, --rounds >= 1 and --ranks in 1..64");
  return o;
}

}  // namespace

int main(int argc, char** argv) {
  // Line by line, so a run cut off by a time limit still shows what it measured.
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  const Options o = parse(argc, argv);
  // The reduce kernel first, through the provider ABI, before libwia loads
  // the same file (one init of the provider at a time). The provider file
  // is the one libwia would find: next to libwia (build or install tree).
  Dl_info info{};
  std::string provider_file;
  if (dladdr(reinterpret_cast<void*>(&wia_init), &info) != 0 && info.dli_fname) {
    std::string lib = info.dli_fname;
    provider_file = lib.substr(0, lib.rfind('/')) + "/wia/providers/libwia-provider-cuda.so";
  }
  if (const char* f = std::getenv("WIA_CUDA_BENCH_PROVIDER")) provider_file = f;
  const double reduce = reduce_kernel_gbps(provider_file, o);
  CHECK_WIA(wia_init());
  int ndev = 0;
  CHECK_WIA(wia_get_device_count(&ndev));
  std::vector<wia_device_t> cuda;
  for (int d = 0; d < ndev; ++d) {
    wia_device_properties_t p{};
    CHECK_WIA(wia_get_device_properties(d, &p));
    if (std::string(p.provider) == "cuda") {
      if (cuda.empty()) std::printf("# device %d: %s (%s)\n", d, p.name, p.pci_bus_id);
      cuda.push_back(d);
    }
  }
  if (cuda.empty()) die(3, "no cuda device (wia-info lists the providers and why one is absent)");
  std::printf("# %zu cuda device(s); size %llu bytes, %d iterations, best of %d rounds\n",
              cuda.size(), static_cast<unsigned long long>(o.size), o.iters, o.rounds);

  Driver drv;
  drv.open();
  wia_CUdevice cu_dev = 0;
  wia_CUcontext cu_ctx = nullptr;
  drv.check(drv.cuDeviceGet(&cu_dev, 0), "cuDeviceGet");
  drv.check(drv.cuDevicePrimaryCtxRetain(&cu_ctx, cu_dev), "cuDevicePrimaryCtxRetain");
  drv.check(drv.cuCtxSetCurrent(cu_ctx), "cuCtxSetCurrent");
  wia_CUstream cs = nullptr;
  drv.check(drv.cuStreamCreate(&cs, WIA_CU_STREAM_NON_BLOCKING), "cuStreamCreate");

  CHECK_WIA(wia_set_device(cuda[0]));
  wia_stream_t ws = nullptr;
  CHECK_WIA(wia_create_stream_on(cuda[0], &ws));
  void *d0 = nullptr, *d1 = nullptr, *pinned = nullptr;
  CHECK_WIA(wia_malloc_on(cuda[0], &d0, o.size));
  CHECK_WIA(wia_malloc_on(cuda[0], &d1, o.size));
  CHECK_WIA(wia_malloc_host(&pinned, o.size));
  std::memset(pinned, 1, o.size);
  CHECK_WIA(wia_memset(d0, 2, o.size));

  const CopyResult d2d = bench_copy(drv, cs, ws, d1, d0, o, 2 * o.size);
  print_ratio("D2D copy (read+write bytes)", d2d.wia, d2d.direct, "cuMemcpyAsync", 0.9);
  const CopyResult h2d = bench_copy(drv, cs, ws, d0, pinned, o, o.size);
  print_ratio("H2D copy, pinned", h2d.wia, h2d.direct, "cuMemcpyAsync", 0.9);
  const CopyResult d2h = bench_copy(drv, cs, ws, pinned, d0, o, o.size);
  print_ratio("D2H copy, pinned", d2h.wia, d2h.direct, "cuMemcpyAsync", 0.9);
  // The data check of the copies: d1 holds d0's 2s (D2D, before the H2D
  // overwrote d0), and pinned holds its own 1s back (H2D then D2H).
  std::uint64_t wrong = 0;
  std::vector<unsigned char> back(o.size);
  CHECK_WIA(wia_memcpy(back.data(), d1, o.size));
  for (std::uint64_t i = 0; i < o.size; ++i)
    wrong += (back[i] != 2) + (static_cast<unsigned char*>(pinned)[i] != 1);
  if (wrong) std::printf("copy check: %llu wrong bytes\n", static_cast<unsigned long long>(wrong));
  wia_free(d0);
  wia_free(d1);
  wia_free(pinned);
  wia_destroy_stream(ws);
  drv.cuStreamDestroy(cs);

  if (reduce < 0)
    std::printf("reduce kernel: %s could not be opened (set WIA_CUDA_BENCH_PROVIDER)\n",
                provider_file.c_str());
  else
    print_ratio("reduce kernel f32 sum (3 B/elem B)", reduce, d2d.direct, "memory bw (D2D copy)",
                0.8);

  wrong += launch_kernel_check(cuda[0]);
  const std::vector<wia_device_t> ranks(cuda.begin(),
                                        cuda.begin() + std::min<std::size_t>(cuda.size(), o.ranks));
  if (ranks.size() >= 2) wrong += allreduce_check(ranks, o, d2d.direct);
  else std::printf("all-reduce: one cuda device only (set WIA_CUDA_LOGICAL_DEVICES_PER_GPU=4)\n");
  drv.cuDevicePrimaryCtxRelease(cu_dev);
  CHECK_WIA(wia_finalize());
  std::printf("%s\n", wrong == 0 ? "all data checks passed" : "DATA CHECK FAILED");
  return wrong == 0 ? 0 : 1;
}
