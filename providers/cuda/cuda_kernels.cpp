// SPDX-License-Identifier: Apache-2.0
// The provider's own device kernels (kernels/*.cu): the embedded image,
// loading it into a device's primary context on first use, the kernel
// names, and launching reductions (reduce_async) and scaling (scale_async,
// ready for the ABI extension that will carry it).
#include <cinttypes>
#include <cstring>
#include <string>

#include "cuda_provider.hpp"
#include "kernels/cpu_reduce.hpp"
#include "kernels/device_kernel_params.h"

namespace wia::cuda {

// Defined in the .cpp generated from the kernels at build time
// (cmake/embed_kernel_image.cmake): a fatbin (cubins for sm_80 and sm_90
// plus compute_90 PTX) when nvcc was found, the committed PTX otherwise.
// Always NUL-terminated, so cuModuleLoadData can take the PTX as text.
extern const unsigned char kKernelImage[];
extern const std::size_t kKernelImageSize;
extern const char kKernelImageKind[];  // "fatbin" or "ptx"

namespace {

// The names the kernels are compiled under (extern "C" in kernels/*.cu)
// and the driver test double recognises: wia_reduce_<dtype>_<op>,
// wia_scale_<dtype>. Indexed by wia_datatype_t and by op (AVG is sum).
constexpr const char* kDtypeNames[WIA_DATATYPE_COUNT] = {"int8",    "uint8",  "int32",   "uint32",
                                                         "int64",   "uint64", "float16", "bfloat16",
                                                         "float32", "float64"};
constexpr const char* kOpNames[kReduceKernelOps] = {"sum", "prod", "min", "max"};

// Launch shape. 256 threads per block and up to 8 blocks per SM fill an
// SM's 2048 thread slots; the kernels loop over the rest (grid-stride), so
// a huge count never asks for more blocks than the device runs at once.
constexpr unsigned kThreadsPerBlock = 256;
constexpr unsigned kBlocksPerSm = 8;

unsigned grid_for(const Device& d, std::uint64_t count, std::size_t esize) {
  // One thread handles one 16-byte vector per iteration.
  const std::uint64_t per_vector = 16 / esize;
  const std::uint64_t vectors = (count + per_vector - 1) / per_vector;
  const std::uint64_t wanted = (vectors + kThreadsPerBlock - 1) / kThreadsPerBlock;
  const std::uint64_t cap = static_cast<std::uint64_t>(d.sm_count) * kBlocksPerSm;
  const std::uint64_t blocks = wanted < cap ? wanted : cap;
  return static_cast<unsigned>(blocks > 0 ? blocks : 1);
}

// The module of `d`, loaded on first use. The device's context is current.
wia_status_t ensure_module(Provider& p, Device& d, const char* call) {
  std::lock_guard<std::mutex> lk(d.mu);
  if (d.module != nullptr) return WIA_SUCCESS;
  const wia_CUresult r = p.driver.cuModuleLoadData(&d.module, kKernelImage);
  if (r == WIA_CUDA_SUCCESS) {
    p.log(WIA_LOG_DEBUG, "device %d: kernels loaded (%s, %zu bytes)", d.index, kKernelImageKind,
          kKernelImageSize);
    return WIA_SUCCESS;
  }
  d.module = nullptr;
  // The likely causes, so the message says what to do.
  const char* hint = "";
  if (r == WIA_CUDA_ERROR_NO_BINARY_FOR_GPU || r == WIA_CUDA_ERROR_INVALID_IMAGE ||
      r == WIA_CUDA_ERROR_UNSUPPORTED_PTX_VERSION)
    hint = std::strcmp(kKernelImageKind, "ptx") == 0
               ? " (the embedded PTX is compute_80, PTX ISA 9.0 from nvcc 13: it needs a CUDA 13 "
                 "driver (580 or newer); rebuild the provider with this machine's nvcc for "
                 "cubins)"
               : " (the embedded fatbin has cubins for sm_80/sm_90 and compute_90 PTX from nvcc "
                 "13; this driver (older than CUDA 13?) or GPU takes none of them)";
  return p.fail_cu(r, d.index, "%s: cuModuleLoadData(%s kernel image, %zu bytes)%s", call,
                   kKernelImageKind, kKernelImageSize, hint);
}

wia_status_t function(Provider& p, Device& d, std::atomic<wia_CUfunction>& slot,
                      const std::string& name, const char* call, wia_CUfunction* fn) {
  *fn = slot.load(std::memory_order_acquire);
  if (*fn != nullptr) return WIA_SUCCESS;
  if (const wia_status_t st = ensure_module(p, d, call); st != WIA_SUCCESS) return st;
  // Two threads may look the same name up at once; both get the same
  // handle, so the race is harmless.
  const wia_CUresult r = p.driver.cuModuleGetFunction(fn, d.module, name.c_str());
  if (r != WIA_CUDA_SUCCESS)
    return p.fail_cu(r, d.index, "%s: cuModuleGetFunction(\"%s\")", call, name.c_str());
  slot.store(*fn, std::memory_order_release);
  return WIA_SUCCESS;
}

}  // namespace

void unload_kernels(Provider& p, Device& d) noexcept {
  std::lock_guard<std::mutex> lk(d.mu);
  if (d.module == nullptr) return;
  const wia_CUresult r = p.driver.cuModuleUnload(d.module);
  if (r != WIA_CUDA_SUCCESS)
    p.log(WIA_LOG_WARN, "fini: cuModuleUnload on device %d: %s", d.index,
          error_name(p.driver, r).c_str());
  d.module = nullptr;
  for (auto& per_dtype : d.reduce_fns)
    for (auto& fn : per_dtype) fn.store(nullptr);
  for (auto& fn : d.scale_fns) fn.store(nullptr);
}

wia_status_t reduce_async(void* ctx, wia_provider_stream_t h,
                          const wia_reduce_args_v1_t* args) noexcept {
  return guarded(ctx, "reduce_async", [&](Provider& p) -> wia_status_t {
    Stream* s = p.find_stream(h, "reduce_async");
    if (s == nullptr) return WIA_ERROR_INVALID_HANDLE;
    if (args == nullptr)
      return p.fail(WIA_ERROR_INVALID_ARGUMENT, "reduce_async on CUDA device %d: args is NULL",
                    s->device);
    // The same checks as the CPU kernels: pointers are compared, never read.
    if (const char* why = kernels::reduce_args_error(*args))
      return p.fail(WIA_ERROR_INVALID_ARGUMENT,
                    "reduce_async(%s %s, %u sources, %" PRIu64 " elements) on CUDA device %d: %s",
                    kernels::dtype_name(args->dtype), kernels::reduce_op_name(args->op),
                    args->nsrcs, args->count, s->device, why);
    if (args->count == 0) return WIA_SUCCESS;
    if (const wia_status_t st = p.use_device(s->device, "reduce_async"); st != WIA_SUCCESS)
      return st;
    Device& d = *p.devices[static_cast<std::size_t>(s->device)];
    const int op = args->op == WIA_REDUCE_AVG ? static_cast<int>(WIA_REDUCE_SUM) : args->op;
    const std::string name =
        std::string("wia_reduce_") + kDtypeNames[args->dtype] + "_" + kOpNames[op];
    wia_CUfunction fn = nullptr;
    if (const wia_status_t st =
            function(p, d, d.reduce_fns[args->dtype][op], name, "reduce_async", &fn);
        st != WIA_SUCCESS)
      return st;
    std::uint64_t divisor = args->divisor;
    if (args->op == WIA_REDUCE_AVG && divisor == 0) divisor = args->nsrcs;
    const unsigned grid = grid_for(d, args->count, kernels::dtype_size(args->dtype));

    // More sources than one launch reads: a chain on the stream. The first
    // launch folds srcs[0..7] into dst, each next one dst and up to 7 more
    // sources; the divisor applies in the last. float16/bfloat16 then round
    // to their width between launches (once per 7 more sources).
    std::uint32_t next = 0;
    bool first = true;
    while (next < args->nsrcs) {
      wia_cuda_reduce_params_t block{};
      block.dst = args->dst;
      std::uint32_t k = 0;
      if (!first) block.srcs[k++] = args->dst;
      while (k < WIA_CUDA_REDUCE_MAX_SRCS && next < args->nsrcs)
        block.srcs[k++] = args->srcs[next++];
      block.nsrcs = k;
      block.count = args->count;
      block.divisor = next == args->nsrcs ? divisor : 0;
      void* params[] = {&block};
      const wia_CUresult r = p.driver.cuLaunchKernel(fn, grid, 1, 1, kThreadsPerBlock, 1, 1, 0,
                                                     s->cu, params, nullptr);
      if (r != WIA_CUDA_SUCCESS)
        return p.fail_cu(r, s->device,
                         "cuLaunchKernel(%s, %u sources, %" PRIu64 " elements, grid %u x %u)",
                         name.c_str(), k, args->count, grid, kThreadsPerBlock);
      first = false;
    }
    return WIA_SUCCESS;
  });
}

wia_status_t scale_async(void* ctx, wia_provider_stream_t h, void* buf, std::uint64_t count,
                         wia_datatype_t dtype, double factor) noexcept {
  return guarded(ctx, "scale_async", [&](Provider& p) -> wia_status_t {
    Stream* s = p.find_stream(h, "scale_async");
    if (s == nullptr) return WIA_ERROR_INVALID_HANDLE;
    const std::size_t esize = kernels::dtype_size(dtype);
    if (esize == 0)
      return p.fail(WIA_ERROR_INVALID_ARGUMENT, "scale_async on CUDA device %d: unknown datatype",
                    s->device);
    if (count == 0) return WIA_SUCCESS;
    if (buf == nullptr)
      return p.fail(WIA_ERROR_INVALID_ARGUMENT, "scale_async on CUDA device %d: buf is NULL",
                    s->device);
    if (const wia_status_t st = p.use_device(s->device, "scale_async"); st != WIA_SUCCESS)
      return st;
    Device& d = *p.devices[static_cast<std::size_t>(s->device)];
    const std::string name = std::string("wia_scale_") + kDtypeNames[dtype];
    wia_CUfunction fn = nullptr;
    if (const wia_status_t st = function(p, d, d.scale_fns[dtype], name, "scale_async", &fn);
        st != WIA_SUCCESS)
      return st;
    wia_cuda_scale_params_t block{buf, count, factor};
    void* params[] = {&block};
    const unsigned grid = grid_for(d, count, esize);
    const wia_CUresult r =
        p.driver.cuLaunchKernel(fn, grid, 1, 1, kThreadsPerBlock, 1, 1, 0, s->cu, params, nullptr);
    if (r != WIA_CUDA_SUCCESS)
      return p.fail_cu(r, s->device, "cuLaunchKernel(%s, %" PRIu64 " elements)", name.c_str(),
                       count);
    return WIA_SUCCESS;
  });
}

}  // namespace wia::cuda
