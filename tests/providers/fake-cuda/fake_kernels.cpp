// SPDX-License-Identifier: Apache-2.0
// Modules and kernels: any image loads, only the provider's kernel names
// resolve, and a launch queues the CPU equivalent of the kernel on its
// stream (wia_cpu_kernels for reductions), after checking that every
// pointer it touches is memory a GPU kernel could reach.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>

#include "fake_cuda.hpp"
#include "kernels/cpu_reduce.hpp"
#include "kernels/element_access.hpp"
#include "kernels/device_kernel_params.h"

namespace wia::fake_cuda {
namespace {

// WIA_FAKE_CUDA_FAULT=stream_error: armed at the first launch only.
std::atomic<bool> g_first_launch_seen{false};

bool parse_dtype(const std::string& text, int* dtype) {
  for (int t = 0; t < WIA_DATATYPE_COUNT; ++t) {
    if (text == wia::kernels::dtype_name(static_cast<wia_datatype_t>(t))) {
      *dtype = t;
      return true;
    }
  }
  return false;
}

// "wia_reduce_<dtype>_<op>" (op: sum prod min max) or "wia_scale_<dtype>".
bool parse_kernel_name(const std::string& name, Function* fn) {
  static const std::string kReduce = "wia_reduce_", kScale = "wia_scale_";
  if (name == "wia_test_add_u32") {
    fn->kind = KernelKind::kTestAddU32;
    return true;
  }
  if (name.rfind(kScale, 0) == 0) {
    fn->kind = KernelKind::kScale;
    return parse_dtype(name.substr(kScale.size()), &fn->dtype);
  }
  if (name.rfind(kReduce, 0) != 0) return false;
  const std::string rest = name.substr(kReduce.size());
  const std::size_t last = rest.rfind('_');
  if (last == std::string::npos) return false;
  const std::string op = rest.substr(last + 1);
  fn->kind = KernelKind::kReduce;
  for (int o = WIA_REDUCE_SUM; o <= WIA_REDUCE_MAX; ++o) {
    if (op == wia::kernels::reduce_op_name(static_cast<wia_reduce_op_t>(o))) {
      fn->op = o;
      return parse_dtype(rest.substr(0, last), &fn->dtype);
    }
  }
  return false;
}

bool accessible(const Context& ctx, const void* p, std::uint64_t bytes, const char* what,
                const std::string& kernel) {
  if (bytes == 0) return true;
  std::lock_guard<std::mutex> lk(driver().mu);
  if (kernel_may_access(ctx, reinterpret_cast<std::uintptr_t>(p), bytes)) return true;
  diagnose(kernel + " on device " + std::to_string(ctx.device) + ": " + what +
           " is not memory this device can reach (pageable host memory, freed, too short, or "
           "another device's without cuCtxEnablePeerAccess): CUDA_ERROR_ILLEGAL_ADDRESS");
  return false;
}

CUresult run_reduce(const Context& ctx, const Function& fn, const wia_cuda_reduce_params_t& p) {
  const auto dtype = static_cast<wia_datatype_t>(fn.dtype);
  if (p.nsrcs < 1 || p.nsrcs > WIA_CUDA_REDUCE_MAX_SRCS) {
    diagnose(fn.name + ": nsrcs " + std::to_string(p.nsrcs) + " outside [1, 8]");
    return WIA_CUDA_ERROR_LAUNCH_FAILED;
  }
  const std::uint64_t bytes = p.count * wia::kernels::dtype_size(dtype);
  if (!accessible(ctx, p.dst, bytes, "dst", fn.name)) return WIA_CUDA_ERROR_ILLEGAL_ADDRESS;
  for (std::uint32_t i = 0; i < p.nsrcs; ++i)
    if (!accessible(ctx, p.srcs[i], bytes, ("srcs[" + std::to_string(i) + "]").c_str(), fn.name))
      return WIA_CUDA_ERROR_ILLEGAL_ADDRESS;
  wia_reduce_args_v1_t args{};
  args.struct_size = sizeof(args);
  args.dtype = dtype;
  args.op = static_cast<wia_reduce_op_t>(fn.op);
  args.nsrcs = p.nsrcs;
  args.count = p.count;
  args.divisor = p.divisor;
  args.dst = p.dst;
  args.srcs = p.srcs;
  if (const char* bad = wia::kernels::reduce_args_error(args)) {
    // A GPU would compute garbage here; the double names the mistake.
    diagnose(fn.name + ": " + bad);
    return WIA_CUDA_ERROR_LAUNCH_FAILED;
  }
  return wia::kernels::reduce(args) == WIA_SUCCESS ? WIA_CUDA_SUCCESS
                                                   : WIA_CUDA_ERROR_LAUNCH_FAILED;
}

CUresult run_scale(const Context& ctx, const Function& fn, const wia_cuda_scale_params_t& p) {
  const auto dtype = static_cast<wia_datatype_t>(fn.dtype);
  if (!accessible(ctx, p.buf, p.count * wia::kernels::dtype_size(dtype), "buf", fn.name))
    return WIA_CUDA_ERROR_ILLEGAL_ADDRESS;
  // The semantics of device_kernel_params.h, which are the core's host
  // path: float32 in float, every other type through double and the host
  // kernels' store_element.
  if (dtype == WIA_FLOAT32) {
    auto* v = static_cast<float*>(p.buf);
    const auto f = static_cast<float>(p.factor);
    for (std::uint64_t i = 0; i < p.count; ++i) v[i] *= f;
  } else if (wia::kernels::dtype_size(dtype) != 0) {
    for (std::uint64_t i = 0; i < p.count; ++i)
      wia::kernels::store_element(p.buf, i, dtype,
                                  wia::kernels::load_element(p.buf, i, dtype) * p.factor);
  } else {
    return WIA_CUDA_ERROR_LAUNCH_FAILED;
  }
  return WIA_CUDA_SUCCESS;
}

}  // namespace
}  // namespace wia::fake_cuda

using namespace wia::fake_cuda;

wia_CUresult fake_cuModuleLoadData(wia_CUmodule* module, const void* image) {
  if (module == nullptr || image == nullptr) return WIA_CUDA_ERROR_INVALID_VALUE;
  Driver& d = driver();
  std::lock_guard<std::mutex> lk(d.mu);
  Context* ctx = current_context();
  if (ctx == nullptr) return WIA_CUDA_ERROR_INVALID_CONTEXT;
  auto m = std::make_unique<Module>();
  m->ctx = ctx;
  m->image = image;  // not parsed: the GPU script (tests/gpu/run.sh) loads real images
  *module = reinterpret_cast<wia_CUmodule>(m.get());
  d.modules[m.get()] = std::move(m);
  return WIA_CUDA_SUCCESS;
}

wia_CUresult fake_cuModuleUnload(wia_CUmodule module) {
  Driver& d = driver();
  {
    std::lock_guard<std::mutex> lk(d.mu);
    auto it = d.modules.find(reinterpret_cast<Module*>(module));
    if (it == d.modules.end()) return WIA_CUDA_ERROR_INVALID_HANDLE;
  }
  // Launches already queued hold Function pointers into the module.
  wait_device_idle(-1);
  std::lock_guard<std::mutex> lk(d.mu);
  d.modules.erase(reinterpret_cast<Module*>(module));
  return WIA_CUDA_SUCCESS;
}

wia_CUresult fake_cuModuleGetFunction(wia_CUfunction* fn, wia_CUmodule module, const char* name) {
  if (fn == nullptr || name == nullptr) return WIA_CUDA_ERROR_INVALID_VALUE;
  Driver& d = driver();
  std::lock_guard<std::mutex> lk(d.mu);
  auto it = d.modules.find(reinterpret_cast<Module*>(module));
  if (it == d.modules.end()) return WIA_CUDA_ERROR_INVALID_HANDLE;
  Module& m = *it->second;
  auto& slot = m.functions[name];
  if (!slot) {
    auto f = std::make_unique<Function>();
    f->module = &m;
    f->name = name;
    if (!parse_kernel_name(f->name, f.get())) {
      m.functions.erase(name);
      return WIA_CUDA_ERROR_NOT_FOUND;
    }
    slot = std::move(f);
  }
  *fn = reinterpret_cast<wia_CUfunction>(slot.get());
  return WIA_CUDA_SUCCESS;
}

wia_CUresult fake_cuLaunchKernel(wia_CUfunction fn, unsigned int grid_x, unsigned int grid_y,
                                 unsigned int grid_z, unsigned int block_x, unsigned int block_y,
                                 unsigned int block_z, unsigned int shared_bytes,
                                 wia_CUstream stream, void** params, void** extra) {
  if (params == nullptr || params[0] == nullptr || extra != nullptr)
    return WIA_CUDA_ERROR_INVALID_VALUE;
  const unsigned long long threads = static_cast<unsigned long long>(block_x) * block_y * block_z;
  if (grid_x == 0 || grid_y == 0 || grid_z == 0 || threads == 0 || threads > 1024 ||
      shared_bytes > 227u * 1024u)
    return WIA_CUDA_ERROR_INVALID_VALUE;
  CUresult error = WIA_CUDA_SUCCESS;
  Stream* s = resolve_stream(stream, &error);
  if (s == nullptr) return error;
  Driver& d = driver();
  Function* f = nullptr;
  {
    std::lock_guard<std::mutex> lk(d.mu);
    auto* candidate = reinterpret_cast<Function*>(fn);
    for (auto& entry : d.modules)
      for (auto& named : entry.second->functions)
        if (named.second.get() == candidate) f = candidate;
    if (f == nullptr) return WIA_CUDA_ERROR_INVALID_HANDLE;
    if (f->module->ctx != s->context()) {
      diagnose("cuLaunchKernel(" + f->name + "): the stream belongs to another context");
      return WIA_CUDA_ERROR_INVALID_HANDLE;
    }
  }
  const bool inject = d.faults.stream_error && !g_first_launch_seen.exchange(true);
  Context* ctx = s->context();
  // Parameters are copied at launch, as the driver does: the caller's
  // block may be reused as soon as cuLaunchKernel returns.
  if (f->kind == KernelKind::kTestAddU32) {
    if (params[1] == nullptr || params[2] == nullptr) return WIA_CUDA_ERROR_INVALID_VALUE;
    std::uint32_t* data = nullptr;
    std::uint64_t count = 0;
    std::uint32_t value = 0;
    std::memcpy(&data, params[0], sizeof(data));
    std::memcpy(&count, params[1], sizeof(count));
    std::memcpy(&value, params[2], sizeof(value));
    // Threads beyond the grid do nothing, as in a bounds-checked kernel.
    const std::uint64_t threads_launched =
        static_cast<std::uint64_t>(grid_x) * grid_y * grid_z * threads;
    const std::uint64_t n = std::min(count, threads_launched);
    s->enqueue([ctx, f, data, n, value] {
      if (!accessible(*ctx, data, n * sizeof(std::uint32_t), "data", f->name))
        return WIA_CUDA_ERROR_ILLEGAL_ADDRESS;
      for (std::uint64_t i = 0; i < n; ++i) data[i] += value;
      return WIA_CUDA_SUCCESS;
    });
  } else if (f->kind == KernelKind::kReduce) {
    wia_cuda_reduce_params_t p;
    std::memcpy(&p, params[0], sizeof(p));
    s->enqueue([ctx, f, p, inject] {
      if (inject) {
        diagnose("stream_error: " + f->name + " fails with CUDA_ERROR_LAUNCH_FAILED");
        return WIA_CUDA_ERROR_LAUNCH_FAILED;
      }
      return run_reduce(*ctx, *f, p);
    });
  } else {
    wia_cuda_scale_params_t p;
    std::memcpy(&p, params[0], sizeof(p));
    s->enqueue([ctx, f, p, inject] {
      if (inject) {
        diagnose("stream_error: " + f->name + " fails with CUDA_ERROR_LAUNCH_FAILED");
        return WIA_CUDA_ERROR_LAUNCH_FAILED;
      }
      return run_scale(*ctx, *f, p);
    });
  }
  return WIA_CUDA_SUCCESS;
}
