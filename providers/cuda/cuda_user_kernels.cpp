// SPDX-License-Identifier: Apache-2.0
// The caller's device code (WIA_DEVICE_CAP_KERNEL, wia_launch_kernel):
// modules loaded with cuModuleLoadData into the device's primary context,
// functions found by name, launches with cuLaunchKernel. Modules and
// functions are kept in tables so a stale or foreign handle is
// INVALID_HANDLE, not a driver crash, and fini unloads what the caller left.
#include <cinttypes>
#include <cstring>
#include <iterator>
#include <vector>

#include "cuda_provider.hpp"

namespace wia::cuda {

wia_status_t module_load(void* ctx, std::int32_t dev, const void* image, std::uint64_t size,
                         wia_provider_module_t* module) noexcept {
  return guarded(ctx, "module_load", [&](Provider& p) -> wia_status_t {
    if (module == nullptr || image == nullptr || size == 0)
      return p.fail(WIA_ERROR_INVALID_ARGUMENT,
                    "module_load on CUDA device %d: module, image or size is NULL/0", dev);
    *module = nullptr;
    if (const wia_status_t st = p.use_device(dev, "module_load"); st != WIA_SUCCESS) return st;
    // cuModuleLoadData reads PTX up to its NUL and binaries by their own
    // headers: a copy with a NUL after `size` bytes serves both, and a PTX
    // text passed without its terminator is not read past its end.
    std::vector<char> copy(static_cast<std::size_t>(size) + 1, '\0');
    std::memcpy(copy.data(), image, static_cast<std::size_t>(size));
    wia_CUmodule m = nullptr;
    const wia_CUresult r = p.driver.cuModuleLoadData(&m, copy.data());
    if (r != WIA_CUDA_SUCCESS)
      return p.fail_cu(r, dev, "cuModuleLoadData(%" PRIu64 "-byte image)", size);
    {
      std::lock_guard<std::mutex> lk(p.user_code_mu);
      p.user_modules[m] = dev;
    }
    *module = reinterpret_cast<wia_provider_module_t>(m);
    return WIA_SUCCESS;
  });
}

wia_status_t module_unload(void* ctx, wia_provider_module_t module) noexcept {
  return guarded(ctx, "module_unload", [&](Provider& p) -> wia_status_t {
    auto m = reinterpret_cast<wia_CUmodule>(module);
    std::int32_t dev = 0;
    {
      std::lock_guard<std::mutex> lk(p.user_code_mu);
      const auto it = p.user_modules.find(m);
      if (it == p.user_modules.end())
        return p.fail(WIA_ERROR_INVALID_HANDLE, "module_unload: %p is not a loaded module",
                      static_cast<void*>(module));
      dev = it->second;
      p.user_modules.erase(it);
      // Its functions go with it (the driver invalidates them).
      for (auto f = p.user_functions.begin(); f != p.user_functions.end();)
        f = f->second.module == m ? p.user_functions.erase(f) : std::next(f);
    }
    if (const wia_status_t st = p.use_device(dev, "module_unload"); st != WIA_SUCCESS) return st;
    const wia_CUresult r = p.driver.cuModuleUnload(m);
    if (r != WIA_CUDA_SUCCESS) return p.fail_cu(r, dev, "cuModuleUnload");
    return WIA_SUCCESS;
  });
}

wia_status_t module_function(void* ctx, wia_provider_module_t module, const char* name,
                             wia_provider_function_t* function) noexcept {
  return guarded(ctx, "module_function", [&](Provider& p) -> wia_status_t {
    if (function == nullptr || name == nullptr)
      return p.fail(WIA_ERROR_INVALID_ARGUMENT, "module_function: name or function is NULL");
    *function = nullptr;
    auto m = reinterpret_cast<wia_CUmodule>(module);
    std::int32_t dev = 0;
    {
      std::lock_guard<std::mutex> lk(p.user_code_mu);
      const auto it = p.user_modules.find(m);
      if (it == p.user_modules.end())
        return p.fail(WIA_ERROR_INVALID_HANDLE, "module_function: %p is not a loaded module",
                      static_cast<void*>(module));
      dev = it->second;
    }
    if (const wia_status_t st = p.use_device(dev, "module_function"); st != WIA_SUCCESS)
      return st;
    wia_CUfunction f = nullptr;
    const wia_CUresult r = p.driver.cuModuleGetFunction(&f, m, name);
    if (r != WIA_CUDA_SUCCESS) return p.fail_cu(r, dev, "cuModuleGetFunction(\"%s\")", name);
    {
      std::lock_guard<std::mutex> lk(p.user_code_mu);
      p.user_functions[f] = Provider::UserFunction{m, dev};
    }
    *function = reinterpret_cast<wia_provider_function_t>(f);
    return WIA_SUCCESS;
  });
}

wia_status_t launch_kernel(void* ctx, wia_provider_stream_t stream,
                           wia_provider_function_t function,
                           const wia_kernel_launch_v1_t* launch) noexcept {
  return guarded(ctx, "launch_kernel", [&](Provider& p) -> wia_status_t {
    Stream* s = p.find_stream(stream, "launch_kernel");
    if (s == nullptr) return WIA_ERROR_INVALID_HANDLE;
    if (launch == nullptr ||
        !WIA_ABI_HAS_FIELD(wia_kernel_launch_v1_t, launch->struct_size, args) ||
        (launch->num_args != 0 && launch->args == nullptr))
      return p.fail(WIA_ERROR_INVALID_ARGUMENT,
                    "launch_kernel on CUDA device %d: launch is NULL, too short or has no args",
                    s->device);
    auto f = reinterpret_cast<wia_CUfunction>(function);
    {
      std::lock_guard<std::mutex> lk(p.user_code_mu);
      const auto it = p.user_functions.find(f);
      if (it == p.user_functions.end())
        return p.fail(WIA_ERROR_INVALID_HANDLE, "launch_kernel: %p is not a function of a module",
                      static_cast<void*>(function));
      // Logical devices of one GPU share its context: a function of one runs
      // on the streams of all.
      if (p.devices[static_cast<std::size_t>(it->second.device)]->cu !=
          p.devices[static_cast<std::size_t>(s->device)]->cu)
        return p.fail(WIA_ERROR_INVALID_ARGUMENT,
                      "launch_kernel: the function belongs to CUDA device %d, the stream to %d",
                      it->second.device, s->device);
    }
    if (const wia_status_t st = p.use_device(s->device, "launch_kernel"); st != WIA_SUCCESS)
      return st;
    const wia_CUresult r = p.driver.cuLaunchKernel(
        f, launch->grid[0], launch->grid[1], launch->grid[2], launch->block[0], launch->block[1],
        launch->block[2], launch->shared_bytes, s->cu, const_cast<void**>(launch->args), nullptr);
    if (r != WIA_CUDA_SUCCESS)
      return p.fail_cu(r, s->device, "cuLaunchKernel(grid %ux%ux%u, block %ux%ux%u, %u args)",
                       launch->grid[0], launch->grid[1], launch->grid[2], launch->block[0],
                       launch->block[1], launch->block[2], launch->num_args);
    return WIA_SUCCESS;
  });
}

void unload_user_modules(Provider& p) noexcept {
  std::lock_guard<std::mutex> lk(p.user_code_mu);
  for (const auto& [m, dev] : p.user_modules) {
    wia_CUcontext c = p.devices[static_cast<std::size_t>(dev)]->ctx.load();
    if (c != nullptr && p.driver.cuCtxSetCurrent(c) == WIA_CUDA_SUCCESS)
      p.driver.cuModuleUnload(m);
  }
  if (!p.user_modules.empty())
    p.log(WIA_LOG_WARN, "fini: unloaded %zu module(s) the caller never unloaded",
          p.user_modules.size());
  p.user_modules.clear();
  p.user_functions.clear();
}

}  // namespace wia::cuda
