// SPDX-License-Identifier: Apache-2.0
// Memory of the `hip` provider: mem_alloc/mem_free of device and pinned
// host memory, the synchronous memset/memcpy, the dma-buf export, and IPC
// handles (a small validated header around the runtime's 64-byte
// hipIpcMemHandle_t). The IPC header is wia_common/ipc_header.hpp and the
// table of what was handed out wia_common/memory_registry.hpp, both shared
// with cuda and ze.

#include <cinttypes>
#include <cstring>

#include "hip_provider.hpp"
#include "wia_common/ipc_header.hpp"

namespace wia::hip {

namespace {

const char* kind_name(std::uint32_t kind) {
  return kind == WIA_MEM_HOST_PINNED ? "pinned host" : "device";
}

// The work of the synchronous entries runs on the null stream and is
// waited for: HIP's hipMemset/hipMemcpy may return before a device-side
// operation is done. Our streams are non-blocking, so this waits for
// nothing the caller enqueued.
constexpr wia_hipStream_t kNullStream = nullptr;

// IPC: wia_common's header (magic "WIAH"), then the runtime's 64-byte
// hipIpcMemHandle_t; validated by ipc_open_handle, so a handle from another
// provider or a torn copy fails with a message instead of inside the runtime.
constexpr std::uint32_t kIpcMagic = 0x48414957u;  // "WIAH"
static_assert(sizeof(wia_hipIpcMemHandle_t) <= common::kIpcVendorMax,
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
      return p.fail(WIA_ERROR_INVALID_ARGUMENT, "mem_alloc on HIP device %d: unknown kind %u", dev,
                    kind);
    if (const wia_status_t st = p.use_device(dev, "mem_alloc"); st != WIA_SUCCESS) return st;
    // Size 0 still gets its own address (the ABI wants a unique pointer
    // mem_free accepts); hipMalloc(0) returns NULL.
    const std::size_t bytes = size == 0 ? 1 : static_cast<std::size_t>(size);
    void* out = nullptr;
    if (kind == WIA_MEM_DEVICE) {
      const wia_hipError_t r = p.rt.hipMalloc(&out, bytes);
      if (r != WIA_hipSuccess) return p.fail_hip(r, dev, "hipMalloc(%" PRIu64 " bytes)", size);
    } else {
      // Portable: pinned for every device, so a buffer allocated through
      // device 0 serves copies on device 1 at full speed too.
      const wia_hipError_t r = p.rt.hipHostMalloc(&out, bytes, WIA_hipHostMallocPortable);
      if (r != WIA_hipSuccess)
        return p.fail_hip(r, dev, "hipHostMalloc(%" PRIu64 " bytes, Portable)", size);
    }
    if (out == nullptr)
      return p.fail(WIA_ERROR_INTERNAL,
                    "mem_alloc on HIP device %d: the runtime returned NULL for %zu bytes", dev,
                    bytes);
    try {
      p.memory.add(out, Allocation{dev, kind, size});
    } catch (...) {
      if (kind == WIA_MEM_DEVICE)
        p.rt.hipFree(out);
      else
        p.rt.hipHostFree(out);
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
      return p.fail(WIA_ERROR_INVALID_ARGUMENT, "mem_free on HIP device %d: %s", dev, why.c_str());
    if (const wia_status_t st = p.use_device(dev, "mem_free"); st != WIA_SUCCESS) return st;
    const wia_hipError_t r = a.kind == WIA_MEM_DEVICE ? p.rt.hipFree(ptr) : p.rt.hipHostFree(ptr);
    if (r != WIA_hipSuccess)
      return p.fail_hip(r, dev, "%s(%p, %s memory of %" PRIu64 " bytes)",
                        a.kind == WIA_MEM_DEVICE ? "hipFree" : "hipHostFree", ptr,
                        kind_name(a.kind), a.size);
    return WIA_SUCCESS;
  });
}

void release_all_memory(Provider& p) noexcept {
  const std::size_t leaked = p.memory.release_all(
      [&](std::uintptr_t addr, const Allocation& a) {
        if (p.rt.hipSetDevice(a.device) != WIA_hipSuccess) return;
        if (a.kind == WIA_MEM_DEVICE)
          p.rt.hipFree(reinterpret_cast<void*>(addr));
        else
          p.rt.hipHostFree(reinterpret_cast<void*>(addr));
      },
      [&](std::uintptr_t addr, std::int32_t device, std::uint32_t opens) {
        if (p.rt.hipSetDevice(device) == WIA_hipSuccess)
          for (std::uint32_t i = 0; i < opens; ++i)
            p.rt.hipIpcCloseMemHandle(reinterpret_cast<void*>(addr));
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
      return p.fail(WIA_ERROR_INVALID_ARGUMENT, "memset on HIP device %d: ptr is NULL", dev);
    if (const wia_status_t st = p.use_device(dev, "memset"); st != WIA_SUCCESS) return st;
    const auto byte = static_cast<unsigned char>(value);
    wia_hipError_t r = p.rt.hipMemsetAsync(ptr, byte, static_cast<std::size_t>(size), kNullStream);
    if (r != WIA_hipSuccess)
      return p.fail_hip(r, dev, "hipMemsetAsync(%p, 0x%02x, %" PRIu64 " bytes)", ptr, byte, size);
    r = p.rt.hipStreamSynchronize(kNullStream);
    if (r != WIA_hipSuccess)
      return p.fail_hip(r, dev, "memset(%p, %" PRIu64 " bytes): hipStreamSynchronize", ptr, size);
    return WIA_SUCCESS;
  });
}

wia_status_t memcpy_sync(void* ctx, std::int32_t dev, void* dst, const void* src,
                         std::uint64_t size) noexcept {
  return guarded(ctx, "memcpy", [&](Provider& p) -> wia_status_t {
    if (size == 0) return p.check_device(dev, "memcpy");
    if (dst == nullptr || src == nullptr)
      return p.fail(WIA_ERROR_INVALID_ARGUMENT, "memcpy on HIP device %d: %s is NULL", dev,
                    dst == nullptr ? "dst" : "src");
    if (const wia_status_t st = p.use_device(dev, "memcpy"); st != WIA_SUCCESS) return st;
    // Unified addressing: hipMemcpyDefault lets the runtime tell host from
    // device pointers.
    wia_hipError_t r = p.rt.hipMemcpyAsync(dst, src, static_cast<std::size_t>(size),
                                           WIA_hipMemcpyDefault, kNullStream);
    if (r != WIA_hipSuccess)
      return p.fail_hip(r, dev, "hipMemcpyAsync(%p <- %p, %" PRIu64 " bytes)", dst, src, size);
    r = p.rt.hipStreamSynchronize(kNullStream);
    if (r != WIA_hipSuccess)
      return p.fail_hip(r, dev, "memcpy(%p <- %p, %" PRIu64 " bytes): hipStreamSynchronize", dst,
                        src, size);
    return WIA_SUCCESS;
  });
}

// --------------------------------------------------------------------------
// dma-buf export, for a NIC to reach device memory (ibv_reg_dmabuf_mr
// without a peer-memory kernel module). As cuda: the runtime exports
// page-aligned ranges, so the dma-buf covers the allocation holding ptr,
// from its start (hipMalloc hands out page-aligned memory) rounded up to a
// page, and *offset says where ptr lies in it.

wia_status_t mem_export_dmabuf(void* ctx, std::int32_t dev, void* ptr, std::uint64_t size,
                               std::int32_t* fd, std::uint64_t* offset) noexcept {
  return guarded(ctx, "mem_export_dmabuf", [&](Provider& p) -> wia_status_t {
    if (const char* null = common::reset_dmabuf_out(fd, offset))
      return p.fail(WIA_ERROR_INVALID_ARGUMENT, "mem_export_dmabuf on HIP device %d: %s is NULL",
                    dev, null);
    if (const wia_status_t st = p.check_device(dev, "mem_export_dmabuf"); st != WIA_SUCCESS)
      return st;
    if (p.rt.hipMemGetHandleForAddressRange == nullptr)
      return p.fail(
          WIA_ERROR_NOT_SUPPORTED,
          "mem_export_dmabuf on HIP device %d: the HIP runtime (%s) has no "
          "hipMemGetHandleForAddressRange (ROCm 5.2 has none: newer runtimes export dma-bufs); "
          "stage through host memory",
          dev, p.rt.path.c_str());
    common::DmabufRange range;
    if (const std::string why = p.memory.find_dmabuf_range(ptr, size, dev, &range); !why.empty())
      return p.fail(WIA_ERROR_INVALID_ARGUMENT, "mem_export_dmabuf on HIP device %d: %s", dev,
                    why.c_str());
    if (const wia_status_t st = p.use_device(dev, "mem_export_dmabuf"); st != WIA_SUCCESS)
      return st;
    int out = -1;
    const wia_hipError_t r = p.rt.hipMemGetHandleForAddressRange(
        &out, reinterpret_cast<void*>(range.base), static_cast<std::size_t>(range.span),
        WIA_hipMemRangeHandleTypeDmaBufFd, 0);
    if (r != WIA_hipSuccess)
      return p.fail_hip(r, dev, "hipMemGetHandleForAddressRange(%p, %" PRIu64 " bytes, DmaBufFd)",
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
      return p.fail(WIA_ERROR_INVALID_ARGUMENT, "ipc_get_handle on HIP device %d: handle is NULL",
                    dev);
    if (const wia_status_t st = p.check_device(dev, "ipc_get_handle"); st != WIA_SUCCESS) return st;
    Allocation a;
    if (const std::string why = p.memory.find_device_start(ptr, dev, &a); !why.empty())
      return p.fail(WIA_ERROR_INVALID_ARGUMENT, "ipc_get_handle on HIP device %d: %s", dev,
                    why.c_str());
    if (const wia_status_t st = p.use_device(dev, "ipc_get_handle"); st != WIA_SUCCESS) return st;
    wia_hipIpcMemHandle_t hip_handle{};
    const wia_hipError_t r = p.rt.hipIpcGetMemHandle(&hip_handle, ptr);
    if (r != WIA_hipSuccess)
      return p.fail_hip(r, dev, "hipIpcGetMemHandle(%p, %" PRIu64 " bytes)", ptr, a.size);
    common::ipc_pack(handle, kIpcMagic, dev, a.size, &hip_handle, sizeof(hip_handle));
    return WIA_SUCCESS;
  });
}

wia_status_t ipc_open_handle(void* ctx, std::int32_t dev, const wia_ipc_handle_t* handle,
                             void** ptr) noexcept {
  return guarded(ctx, "ipc_open_handle", [&](Provider& p) -> wia_status_t {
    if (handle == nullptr || ptr == nullptr)
      return p.fail(WIA_ERROR_INVALID_ARGUMENT, "ipc_open_handle on HIP device %d: %s is NULL", dev,
                    handle == nullptr ? "handle" : "ptr");
    *ptr = nullptr;
    if (const wia_status_t st = p.check_device(dev, "ipc_open_handle"); st != WIA_SUCCESS)
      return st;
    common::IpcHeader h{};
    wia_hipIpcMemHandle_t hip_handle{};
    if (const std::string why =
            common::ipc_unpack(*handle, kIpcMagic, "hip", &h, &hip_handle, sizeof(hip_handle));
        !why.empty())
      return p.fail(WIA_ERROR_INVALID_ARGUMENT, "ipc_open_handle on HIP device %d: %s", dev,
                    why.c_str());
    if (const wia_status_t st = p.use_device(dev, "ipc_open_handle"); st != WIA_SUCCESS) return st;
    void* d = nullptr;
    // LazyEnablePeerAccess: the exporter's GPU may differ from ours.
    const wia_hipError_t r =
        p.rt.hipIpcOpenMemHandle(&d, hip_handle, wia_hip_ipc_lazy_flag(p.rt.version));
    if (r != WIA_hipSuccess)
      return p.fail_hip(r, dev,
                        "hipIpcOpenMemHandle(%" PRIu64
                        " bytes exported by pid %u from its device "
                        "%d)",
                        h.size, h.exporter_pid, h.exporter_device);
    try {
      p.memory.add_import(d, dev);
    } catch (...) {
      p.rt.hipIpcCloseMemHandle(d);
      throw;
    }
    *ptr = d;
    return WIA_SUCCESS;
  });
}

wia_status_t ipc_close_handle(void* ctx, std::int32_t dev, void* ptr) noexcept {
  return guarded(ctx, "ipc_close_handle", [&](Provider& p) -> wia_status_t {
    if (const wia_status_t st = p.check_device(dev, "ipc_close_handle"); st != WIA_SUCCESS)
      return st;
    if (const std::string why = p.memory.release_import(ptr, dev); !why.empty())
      return p.fail(WIA_ERROR_INVALID_ARGUMENT, "ipc_close_handle on HIP device %d: %s", dev,
                    why.c_str());
    if (const wia_status_t st = p.use_device(dev, "ipc_close_handle"); st != WIA_SUCCESS) return st;
    const wia_hipError_t r = p.rt.hipIpcCloseMemHandle(ptr);
    if (r != WIA_hipSuccess) return p.fail_hip(r, dev, "hipIpcCloseMemHandle(%p)", ptr);
    return WIA_SUCCESS;
  });
}

}  // namespace wia::hip
