// SPDX-License-Identifier: Apache-2.0
// Memory of the `cuda` provider: mem_alloc/mem_free of device and pinned
// host memory, the synchronous memset/memcpy, and IPC handles (a small
// validated header around the driver's 64-byte cuIpcMemHandle: the one of
// wia_common/ipc_header.hpp, shared with hip and ze).
#include <cinttypes>
#include <cstring>

#include "cuda_provider.hpp"
#include "wia_common/ipc_header.hpp"

namespace wia::cuda {

namespace {

wia_CUdeviceptr dptr_of(const void* p) {
  return static_cast<wia_CUdeviceptr>(reinterpret_cast<std::uintptr_t>(p));
}
void* ptr_of(wia_CUdeviceptr d) { return reinterpret_cast<void*>(static_cast<std::uintptr_t>(d)); }

const char* kind_name(std::uint32_t kind) {
  return kind == WIA_MEM_HOST_PINNED ? "pinned host" : "device";
}

// The work of the synchronous entries runs on the legacy default stream;
// waiting for it makes them complete on return whatever the driver's own
// rules for that copy direction are (device-to-device cuMemcpy and most
// cuMemsetD8 calls return before the device is done). Our streams are
// non-blocking, so this waits for nothing the caller enqueued.
constexpr wia_CUstream kLegacyStream = nullptr;

// --------------------------------------------------------------------------
// IPC: wia_common's header (magic "WIAC"), then the driver's 64-byte
// CUipcMemHandle; validated by ipc_open_handle, so a handle from another
// provider or a torn copy fails with a message instead of inside the driver.
constexpr std::uint32_t kIpcMagic = 0x43414957u;  // "WIAC"
static_assert(sizeof(wia_CUipcMemHandle) <= common::kIpcVendorMax,
              "IPC handle outgrew the ABI handle");

}  // namespace

// --------------------------------------------------------------------------
// Allocation

wia_status_t mem_alloc(void* ctx, std::int32_t dev, std::uint64_t size, std::uint32_t kind,
                       void** ptr) noexcept {
  return guarded(ctx, "mem_alloc", [&](Provider& p) -> wia_status_t {
    if (ptr == nullptr) return p.fail(WIA_ERROR_INVALID_ARGUMENT, "mem_alloc: ptr is NULL");
    *ptr = nullptr;
    if (kind != WIA_MEM_DEVICE && kind != WIA_MEM_HOST_PINNED)
      return p.fail(WIA_ERROR_INVALID_ARGUMENT, "mem_alloc on CUDA device %d: unknown kind %u", dev,
                    kind);
    if (const wia_status_t st = p.use_device(dev, "mem_alloc"); st != WIA_SUCCESS) return st;
    // Size 0 still gets its own address (the ABI wants a unique pointer
    // mem_free accepts); the driver refuses 0-byte allocations.
    const std::size_t bytes = size == 0 ? 1 : static_cast<std::size_t>(size);
    void* out = nullptr;
    if (kind == WIA_MEM_DEVICE) {
      wia_CUdeviceptr d = 0;
      const wia_CUresult r = p.driver.cuMemAlloc(&d, bytes);
      if (r != WIA_CUDA_SUCCESS) return p.fail_cu(r, dev, "cuMemAlloc(%" PRIu64 " bytes)", size);
      out = ptr_of(d);
    } else {
      // PORTABLE: pinned for every context, so a buffer allocated through
      // device 0 serves copies on device 1 at full speed too.
      const wia_CUresult r = p.driver.cuMemHostAlloc(&out, bytes, WIA_CU_MEMHOSTALLOC_PORTABLE);
      if (r != WIA_CUDA_SUCCESS)
        return p.fail_cu(r, dev, "cuMemHostAlloc(%" PRIu64 " bytes, PORTABLE)", size);
    }
    try {
      p.memory.add(out, Allocation{dev, kind, size});
    } catch (...) {
      if (kind == WIA_MEM_DEVICE)
        p.driver.cuMemFree(dptr_of(out));
      else
        p.driver.cuMemFreeHost(out);
      throw;
    }
    *ptr = out;
    return WIA_SUCCESS;
  });
}

wia_status_t mem_free(void* ctx, std::int32_t dev, void* ptr) noexcept {
  return guarded(ctx, "mem_free", [&](Provider& p) -> wia_status_t {
    if (const wia_status_t st = p.check_device(dev, "mem_free"); st != WIA_SUCCESS) return st;
    Allocation a;
    if (const std::string why = p.memory.take(ptr, dev, &a); !why.empty())
      return p.fail(WIA_ERROR_INVALID_ARGUMENT, "mem_free on CUDA device %d: %s", dev, why.c_str());
    if (const wia_status_t st = p.use_device(dev, "mem_free"); st != WIA_SUCCESS) return st;
    const wia_CUresult r =
        a.kind == WIA_MEM_DEVICE ? p.driver.cuMemFree(dptr_of(ptr)) : p.driver.cuMemFreeHost(ptr);
    if (r != WIA_CUDA_SUCCESS)
      return p.fail_cu(r, dev, "%s(%p, %s memory of %" PRIu64 " bytes)",
                       a.kind == WIA_MEM_DEVICE ? "cuMemFree" : "cuMemFreeHost", ptr,
                       kind_name(a.kind), a.size);
    return WIA_SUCCESS;
  });
}

void release_all_memory(Provider& p) noexcept {
  const std::size_t leaked = p.memory.release_all(
      [&](std::uintptr_t addr, const Allocation& a) {
        wia_CUcontext c = p.devices[static_cast<std::size_t>(a.device)]->ctx.load();
        if (c == nullptr || p.driver.cuCtxSetCurrent(c) != WIA_CUDA_SUCCESS) return;
        if (a.kind == WIA_MEM_DEVICE)
          p.driver.cuMemFree(static_cast<wia_CUdeviceptr>(addr));
        else
          p.driver.cuMemFreeHost(reinterpret_cast<void*>(addr));
      },
      [&](std::uintptr_t addr, std::int32_t device, std::uint32_t opens) {
        wia_CUcontext c = p.devices[static_cast<std::size_t>(device)]->ctx.load();
        if (c != nullptr && p.driver.cuCtxSetCurrent(c) == WIA_CUDA_SUCCESS)
          for (std::uint32_t i = 0; i < opens; ++i)
            p.driver.cuIpcCloseMemHandle(static_cast<wia_CUdeviceptr>(addr));
      });
  if (leaked != 0) p.log(WIA_LOG_WARN, "fini: freeing %zu allocation(s) never freed", leaked);
}

// --------------------------------------------------------------------------
// Synchronous memset / memcpy

wia_status_t memset_sync(void* ctx, std::int32_t dev, void* ptr, std::int32_t value,
                         std::uint64_t size) noexcept {
  return guarded(ctx, "memset", [&](Provider& p) -> wia_status_t {
    if (size == 0) return p.check_device(dev, "memset");
    if (ptr == nullptr)
      return p.fail(WIA_ERROR_INVALID_ARGUMENT, "memset on CUDA device %d: ptr is NULL", dev);
    if (const wia_status_t st = p.use_device(dev, "memset"); st != WIA_SUCCESS) return st;
    const auto byte = static_cast<unsigned char>(value);
    wia_CUresult r = p.driver.cuMemsetD8(dptr_of(ptr), byte, static_cast<std::size_t>(size));
    if (r != WIA_CUDA_SUCCESS)
      return p.fail_cu(r, dev, "cuMemsetD8(%p, 0x%02x, %" PRIu64 " bytes)", ptr, byte, size);
    r = p.driver.cuStreamSynchronize(kLegacyStream);
    if (r != WIA_CUDA_SUCCESS)
      return p.fail_cu(r, dev, "memset(%p, %" PRIu64 " bytes): cuStreamSynchronize", ptr, size);
    return WIA_SUCCESS;
  });
}

wia_status_t memcpy_sync(void* ctx, std::int32_t dev, void* dst, const void* src,
                         std::uint64_t size) noexcept {
  return guarded(ctx, "memcpy", [&](Provider& p) -> wia_status_t {
    if (size == 0) return p.check_device(dev, "memcpy");
    if (dst == nullptr || src == nullptr)
      return p.fail(WIA_ERROR_INVALID_ARGUMENT, "memcpy on CUDA device %d: %s is NULL", dev,
                    dst == nullptr ? "dst" : "src");
    if (const wia_status_t st = p.use_device(dev, "memcpy"); st != WIA_SUCCESS) return st;
    // Unified addressing: the driver tells host from device pointers.
    wia_CUresult r = p.driver.cuMemcpy(dptr_of(dst), dptr_of(src), static_cast<std::size_t>(size));
    if (r != WIA_CUDA_SUCCESS)
      return p.fail_cu(r, dev, "cuMemcpy(%p <- %p, %" PRIu64 " bytes)", dst, src, size);
    r = p.driver.cuStreamSynchronize(kLegacyStream);
    if (r != WIA_CUDA_SUCCESS)
      return p.fail_cu(r, dev, "memcpy(%p <- %p, %" PRIu64 " bytes): cuStreamSynchronize", dst, src,
                       size);
    return WIA_SUCCESS;
  });
}

// --------------------------------------------------------------------------
// dma-buf export, for a NIC to reach device memory (GPUDirect RDMA through
// ibv_reg_dmabuf_mr or FI_HMEM, without nvidia-peermem). The driver exports
// page-aligned ranges only, so the dma-buf covers the whole allocation
// (cuMemAlloc's granularity is 2 MiB: rounding its size up to a page stays
// inside what it mapped) and *offset says where ptr lies in it.

wia_status_t mem_export_dmabuf(void* ctx, std::int32_t dev, void* ptr, std::uint64_t size,
                               std::int32_t* fd, std::uint64_t* offset) noexcept {
  return guarded(ctx, "mem_export_dmabuf", [&](Provider& p) -> wia_status_t {
    if (const char* null = common::reset_dmabuf_out(fd, offset))
      return p.fail(WIA_ERROR_INVALID_ARGUMENT, "mem_export_dmabuf on CUDA device %d: %s is NULL",
                    dev, null);
    if (const wia_status_t st = p.check_device(dev, "mem_export_dmabuf"); st != WIA_SUCCESS)
      return st;
    if (p.driver.cuMemGetHandleForAddressRange == nullptr)
      return p.fail(WIA_ERROR_NOT_SUPPORTED,
                    "mem_export_dmabuf on CUDA device %d: the driver has no "
                    "cuMemGetHandleForAddressRange (CUDA 11.7 or later exports dma-bufs)",
                    dev);
    common::DmabufRange range;
    if (const std::string why = p.memory.find_dmabuf_range(ptr, size, dev, &range); !why.empty())
      return p.fail(WIA_ERROR_INVALID_ARGUMENT, "mem_export_dmabuf on CUDA device %d: %s", dev,
                    why.c_str());
    int supported = 0;
    if (p.driver.cuDeviceGetAttribute(&supported, WIA_CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED,
                                      p.devices[static_cast<std::size_t>(dev)]->cu) !=
            WIA_CUDA_SUCCESS ||
        supported == 0)
      return p.fail(WIA_ERROR_NOT_SUPPORTED,
                    "mem_export_dmabuf on CUDA device %d (%s): the device or its driver does "
                    "not export dma-bufs (CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED is 0; it needs "
                    "the open kernel modules and a 5.12 or later kernel); stage through host "
                    "memory",
                    dev, p.devices[static_cast<std::size_t>(dev)]->name.c_str());
    if (const wia_status_t st = p.use_device(dev, "mem_export_dmabuf"); st != WIA_SUCCESS)
      return st;
    int out = -1;
    const wia_CUresult r = p.driver.cuMemGetHandleForAddressRange(
        &out, static_cast<wia_CUdeviceptr>(range.base), static_cast<std::size_t>(range.span),
        WIA_CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0);
    if (r != WIA_CUDA_SUCCESS)
      return p.fail_cu(r, dev, "cuMemGetHandleForAddressRange(%p, %" PRIu64 " bytes, DMA_BUF_FD)",
                       reinterpret_cast<void*>(range.base), range.span);
    *fd = out;
    *offset = range.offset;
    return WIA_SUCCESS;
  });
}

// --------------------------------------------------------------------------
// IPC

wia_status_t ipc_get_handle(void* ctx, std::int32_t dev, void* ptr,
                            wia_ipc_handle_t* handle) noexcept {
  return guarded(ctx, "ipc_get_handle", [&](Provider& p) -> wia_status_t {
    if (handle == nullptr)
      return p.fail(WIA_ERROR_INVALID_ARGUMENT, "ipc_get_handle on CUDA device %d: handle is NULL",
                    dev);
    if (const wia_status_t st = p.check_device(dev, "ipc_get_handle"); st != WIA_SUCCESS) return st;
    Allocation a;
    if (const std::string why = p.memory.find_device_start(ptr, dev, &a); !why.empty())
      return p.fail(WIA_ERROR_INVALID_ARGUMENT, "ipc_get_handle on CUDA device %d: %s", dev,
                    why.c_str());
    if (const wia_status_t st = p.use_device(dev, "ipc_get_handle"); st != WIA_SUCCESS) return st;
    wia_CUipcMemHandle cuda_handle{};
    const wia_CUresult r = p.driver.cuIpcGetMemHandle(&cuda_handle, dptr_of(ptr));
    if (r != WIA_CUDA_SUCCESS)
      return p.fail_cu(r, dev, "cuIpcGetMemHandle(%p, %" PRIu64 " bytes)", ptr, a.size);
    common::ipc_pack(handle, kIpcMagic, dev, a.size, &cuda_handle, sizeof(cuda_handle));
    return WIA_SUCCESS;
  });
}

wia_status_t ipc_open_handle(void* ctx, std::int32_t dev, const wia_ipc_handle_t* handle,
                             void** ptr) noexcept {
  return guarded(ctx, "ipc_open_handle", [&](Provider& p) -> wia_status_t {
    if (handle == nullptr || ptr == nullptr)
      return p.fail(WIA_ERROR_INVALID_ARGUMENT, "ipc_open_handle on CUDA device %d: %s is NULL",
                    dev, handle == nullptr ? "handle" : "ptr");
    *ptr = nullptr;
    if (const wia_status_t st = p.check_device(dev, "ipc_open_handle"); st != WIA_SUCCESS)
      return st;
    common::IpcHeader h{};
    wia_CUipcMemHandle cuda_handle{};
    if (const std::string why =
            common::ipc_unpack(*handle, kIpcMagic, "cuda", &h, &cuda_handle, sizeof(cuda_handle));
        !why.empty())
      return p.fail(WIA_ERROR_INVALID_ARGUMENT, "ipc_open_handle on CUDA device %d: %s", dev,
                    why.c_str());
    if (const wia_status_t st = p.use_device(dev, "ipc_open_handle"); st != WIA_SUCCESS) return st;
    wia_CUdeviceptr d = 0;
    // LAZY_ENABLE_PEER_ACCESS: the exporter's GPU may differ from ours.
    const wia_CUresult r =
        p.driver.cuIpcOpenMemHandle(&d, cuda_handle, WIA_CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
    if (r != WIA_CUDA_SUCCESS)
      return p.fail_cu(r, dev,
                       "cuIpcOpenMemHandle(%" PRIu64
                       " bytes exported by pid %u from its device "
                       "%d)",
                       h.size, h.exporter_pid, h.exporter_device);
    try {
      p.memory.add_import(ptr_of(d), dev);
    } catch (...) {
      p.driver.cuIpcCloseMemHandle(d);
      throw;
    }
    *ptr = ptr_of(d);
    return WIA_SUCCESS;
  });
}

wia_status_t ipc_close_handle(void* ctx, std::int32_t dev, void* ptr) noexcept {
  return guarded(ctx, "ipc_close_handle", [&](Provider& p) -> wia_status_t {
    if (const wia_status_t st = p.check_device(dev, "ipc_close_handle"); st != WIA_SUCCESS)
      return st;
    if (const std::string why = p.memory.release_import(ptr, dev); !why.empty())
      return p.fail(WIA_ERROR_INVALID_ARGUMENT, "ipc_close_handle on CUDA device %d: %s", dev,
                    why.c_str());
    if (const wia_status_t st = p.use_device(dev, "ipc_close_handle"); st != WIA_SUCCESS) return st;
    const wia_CUresult r = p.driver.cuIpcCloseMemHandle(dptr_of(ptr));
    if (r != WIA_CUDA_SUCCESS) return p.fail_cu(r, dev, "cuIpcCloseMemHandle(%p)", ptr);
    return WIA_SUCCESS;
  });
}

}  // namespace wia::cuda
