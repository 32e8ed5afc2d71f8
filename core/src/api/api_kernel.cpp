// SPDX-License-Identifier: Apache-2.0
// The caller's device code (spec 6.3's wia_launch_kernel): modules loaded
// for one device, kernels with their launch geometry and arguments bound,
// launched on a stream through the provider's WIA_DEVICE_CAP_KERNEL
// entries. The core only keeps the handles and copies of the arguments;
// what a module image is belongs to the provider (cuda: PTX/cubin/fatbin).
#include <fmt/format.h>
#include <wia/wia.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "api/guard.hpp"
#include "runtime/device_call.hpp"
#include "runtime/objects.hpp"

struct wia_module_s {
  wia_device_t device = -1;
  wia_provider_module_t pm = nullptr;
  std::atomic<int> kernels{0};  // live kernels of this module
};

struct wia_kernel_s {
  wia_module_s* module = nullptr;
  std::string name;
  wia_provider_function_t fn = nullptr;
  std::uint32_t grid[3] = {1, 1, 1};
  std::uint32_t block[3] = {1, 1, 1};
  std::uint32_t shared_bytes = 0;
  std::vector<std::vector<unsigned char>> args;  // index -> bytes; empty = not set
  std::vector<bool> arg_set;
};

using namespace wia;

namespace {

// Live handles: a destroyed or foreign one is INVALID_HANDLE, never a crash.
HandleSet<wia_module_s>& modules() {
  static HandleSet<wia_module_s> set;
  return set;
}
HandleSet<wia_kernel_s>& kernels() {
  static HandleSet<wia_kernel_s> set;
  return set;
}

template <typename T>
T* live(HandleSet<T>& set, T* h, const char* what) {
  api::require_non_null(h, what);
  if (!set.contains(h))
    throw Error(WIA_ERROR_INVALID_HANDLE,
                fmt::format("{} {} is not a live libwia {} (destroyed, or never created)", what,
                            static_cast<const void*>(h), what));
  return h;
}

const Device& kernel_device(wia_device_t device) {
  const Device& d = Runtime::get().device(device);
  if (!(ops_of(d).caps & WIA_DEVICE_CAP_KERNEL))
    throw Error(WIA_ERROR_NOT_SUPPORTED,
                fmt::format("device {} ({}) runs no device code of the caller "
                            "(WIA_DEVICE_CAP_KERNEL); on host devices use wia_launch_host_func",
                            device, d.provider->name()));
  return d;
}

}  // namespace

extern "C" {

WIA_API wia_status_t wia_module_load(wia_device_t device, const void* image, size_t size,
                                     wia_module_t* module) {
  return api::guard(__func__, [&] {
    api::require_non_null(module, "module");
    *module = nullptr;
    api::require_non_null(image, "image");
    if (size == 0) throw Error(WIA_ERROR_INVALID_ARGUMENT, "image: size is 0");
    const Device& d = kernel_device(device);
    auto m = std::make_unique<wia_module_s>();
    m->device = device;
    device_call(d, "module_load", [&](const wia_device_ops_v1_t& o, void* ctx) {
      return o.module_load(ctx, d.local_index, image, size, &m->pm);
    });
    modules().add(m.get());
    *module = m.release();
  });
}

WIA_API wia_status_t wia_module_unload(wia_module_t module) {
  return api::guard(__func__, [&] {
    wia_module_s* m = live(modules(), module, "module");
    if (const int n = m->kernels.load(); n != 0)
      throw Error(WIA_ERROR_INVALID_ARGUMENT,
                  fmt::format("module {} still has {} kernel(s): wia_kernel_destroy them first",
                              static_cast<const void*>(m), n));
    modules().remove(m);
    std::unique_ptr<wia_module_s> owned(m);
    const Device& d = Runtime::get().device(m->device);
    device_call(d, "module_unload", [&](const wia_device_ops_v1_t& o, void* ctx) {
      return o.module_unload(ctx, m->pm);
    });
  });
}

WIA_API wia_status_t wia_kernel_create(wia_module_t module, const char* name,
                                       wia_kernel_t* kernel) {
  return api::guard(__func__, [&] {
    api::require_non_null(kernel, "kernel");
    *kernel = nullptr;
    wia_module_s* m = live(modules(), module, "module");
    api::require_non_null(name, "name");
    const Device& d = Runtime::get().device(m->device);
    auto k = std::make_unique<wia_kernel_s>();
    k->module = m;
    k->name = name;
    device_call(d, "module_function", [&](const wia_device_ops_v1_t& o, void* ctx) {
      return o.module_function(ctx, m->pm, name, &k->fn);
    });
    ++m->kernels;
    kernels().add(k.get());
    *kernel = k.release();
  });
}

WIA_API wia_status_t wia_kernel_set_launch(wia_kernel_t kernel, const uint32_t grid[3],
                                           const uint32_t block[3], uint32_t shared_bytes) {
  return api::guard(__func__, [&] {
    wia_kernel_s* k = live(kernels(), kernel, "kernel");
    api::require_non_null(grid, "grid");
    api::require_non_null(block, "block");
    for (int i = 0; i < 3; ++i)
      if (grid[i] == 0 || block[i] == 0)
        throw Error(WIA_ERROR_INVALID_ARGUMENT,
                    fmt::format("kernel '{}': grid {}x{}x{} and block {}x{}x{} must be at least 1 "
                                "in every dimension",
                                k->name, grid[0], grid[1], grid[2], block[0], block[1], block[2]));
    std::copy(grid, grid + 3, k->grid);
    std::copy(block, block + 3, k->block);
    k->shared_bytes = shared_bytes;
  });
}

WIA_API wia_status_t wia_kernel_set_arg(wia_kernel_t kernel, uint32_t index, const void* value,
                                        size_t size) {
  return api::guard(__func__, [&] {
    wia_kernel_s* k = live(kernels(), kernel, "kernel");
    api::require_non_null(value, "value");
    constexpr std::uint32_t kMaxArgs = 256;
    if (index >= kMaxArgs || size == 0 || size > 4096)
      throw Error(WIA_ERROR_INVALID_ARGUMENT,
                  fmt::format("kernel '{}': argument {} of {} bytes (index below {}, 1 to 4096 "
                              "bytes)",
                              k->name, index, size, kMaxArgs));
    if (k->args.size() <= index) {
      k->args.resize(index + 1);
      k->arg_set.resize(index + 1, false);
    }
    const auto* bytes = static_cast<const unsigned char*>(value);
    k->args[index].assign(bytes, bytes + size);
    k->arg_set[index] = true;
  });
}

WIA_API wia_status_t wia_launch_kernel(wia_kernel_t kernel, wia_stream_t stream) {
  return api::guard(__func__, [&] {
    wia_kernel_s* k = live(kernels(), kernel, "kernel");
    wia_stream_s* s = resolve_stream(stream);
    if (s->device != k->module->device)
      throw Error(WIA_ERROR_INVALID_ARGUMENT,
                  fmt::format("kernel '{}' belongs to device {}; the stream is on device {}",
                              k->name, k->module->device, s->device));
    std::vector<void*> args(k->args.size());
    for (std::size_t i = 0; i < args.size(); ++i) {
      if (!k->arg_set[i])
        throw Error(WIA_ERROR_INVALID_ARGUMENT,
                    fmt::format("kernel '{}': argument {} was never set (arguments 0..{} are "
                                "used)",
                                k->name, i, args.size() - 1));
      args[i] = k->args[i].data();
    }
    wia_kernel_launch_v1_t launch{};
    launch.struct_size = sizeof(launch);
    std::copy(k->grid, k->grid + 3, launch.grid);
    std::copy(k->block, k->block + 3, launch.block);
    launch.shared_bytes = k->shared_bytes;
    launch.num_args = static_cast<std::uint32_t>(args.size());
    launch.args = args.data();
    const Device& d = Runtime::get().device(s->device);
    api::ComputeBracket compute(stream, api::kernel_compute_name(k->name));
    device_call(d, "launch_kernel", [&](const wia_device_ops_v1_t& o, void* ctx) {
      return o.launch_kernel(ctx, s->ps, k->fn, &launch);
    });
    compute.posted();
  });
}

WIA_API wia_status_t wia_kernel_destroy(wia_kernel_t kernel) {
  return api::guard(__func__, [&] {
    wia_kernel_s* k = live(kernels(), kernel, "kernel");
    kernels().remove(k);
    --k->module->kernels;
    delete k;
  });
}

}  // extern "C"
