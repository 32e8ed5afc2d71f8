// SPDX-License-Identifier: Apache-2.0
// Memory of the `ze` provider: mem_alloc/mem_free of USM device and host
// memory, the synchronous memset/memcpy (on a synchronous immediate command
// list per device), the dma-buf export of device allocations, and IPC
// handles (a small validated header around Level Zero's 64-byte
// ze_ipc_mem_handle_t). What was handed out is kept in
// wia_common/memory_registry.hpp, shared with cuda and hip.
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cinttypes>
#include <cstring>

#include "wia_common/ipc_header.hpp"
#include "ze_provider.hpp"

namespace wia::ze {

namespace {

constexpr std::size_t kAlignment = 256;

const char* kind_name(std::uint32_t kind) {
  return kind == WIA_MEM_HOST_PINNED ? "USM host" : "USM device";
}

// --------------------------------------------------------------------------
// IPC handle layout (WIA_IPC_HANDLE_SIZE bytes, little-endian as the node
// is): validated by ipc_open_handle, so a handle from another provider or a
// torn copy fails with a message instead of inside the driver.
//
// On Linux a ze_ipc_mem_handle_t carries a dma-buf file descriptor of the
// exporting process in its first 4 bytes (Intel's driver; Level Zero 1.4 has
// no call to get it, zeMemGetFileDescriptorFromIpcHandleExp came later). The
// number means nothing elsewhere, and the ABI hands the 128 bytes over
// without an fd channel: the importer fetches the descriptor itself with
// pidfd_getfd and patches its own number into a copy of the handle
// (docs/provider-abi.md D19).
constexpr std::uint32_t kIpcMagic = 0x5A414957u;  // "WIAZ"

// The vendor part after wia_common's IPC header.
struct ZeIpcPart {
  std::int32_t exporter_fd;  // the handle's dma-buf fd, in the exporter
  std::uint32_t reserved;
  wia_ze_ipc_mem_handle_t ze_handle;  // zeMemGetIpcHandle's bytes
};
static_assert(sizeof(ZeIpcPart) <= common::kIpcVendorMax, "IPC handle outgrew the ABI handle");

// The device's synchronous immediate list, made on first use. Called with
// d.sync_mu held.
wia_status_t sync_list(Provider& p, Device& d, const char* call) {
  if (d.sync_list != nullptr) return WIA_SUCCESS;
  // SYNCHRONOUS: every append has completed when it returns, which is
  // what the ABI's blocking memset/memcpy promise.
  const wia_ze_command_queue_desc_t desc{WIA_ZE_STRUCTURE_TYPE_COMMAND_QUEUE_DESC,
                                         nullptr,
                                         0,
                                         0,
                                         0,
                                         WIA_ZE_COMMAND_QUEUE_MODE_SYNCHRONOUS,
                                         WIA_ZE_COMMAND_QUEUE_PRIORITY_NORMAL};
  const wia_ze_result_t r =
      p.rt.zeCommandListCreateImmediate(d.driver->context, d.h, &desc, &d.sync_list);
  if (r != WIA_ZE_RESULT_SUCCESS)
    return p.fail_ze(r, d.index, "%s: zeCommandListCreateImmediate(synchronous)", call);
  return WIA_SUCCESS;
}

}  // namespace

// --------------------------------------------------------------------------
// Allocation

wia_status_t mem_alloc(void* ctx, std::int32_t dev, std::uint64_t size, std::uint32_t kind,
                       void** ptr) noexcept {
  return guarded(ctx, "mem_alloc", [&](Provider& p) -> wia_status_t {
    if (ptr == nullptr) return p.fail(WIA_ERROR_INVALID_ARGUMENT, "mem_alloc: ptr is NULL");
    *ptr = nullptr;
    if (kind != WIA_MEM_DEVICE && kind != WIA_MEM_HOST_PINNED)
      return p.fail(WIA_ERROR_INVALID_ARGUMENT,
                    "mem_alloc on Level Zero device %d: unknown kind %u", dev, kind);
    if (const wia_status_t st = p.check_device(dev, "mem_alloc"); st != WIA_SUCCESS) return st;
    Device& d = p.device(dev);
    // Size 0 still gets its own address (the ABI wants a unique pointer
    // mem_free accepts); Level Zero refuses size 0.
    const std::size_t bytes = size == 0 ? 1 : static_cast<std::size_t>(size);
    void* out = nullptr;
    if (kind == WIA_MEM_DEVICE) {
      // Level Zero exports only what was allocated exportable: every device
      // allocation is, where the device can export dma-bufs at all, since
      // mem_export_dmabuf is asked later, of memory already allocated.
      const wia_ze_external_memory_export_desc_t exportable{
          WIA_ZE_STRUCTURE_TYPE_EXTERNAL_MEMORY_EXPORT_DESC, nullptr,
          WIA_ZE_EXTERNAL_MEMORY_TYPE_FLAG_DMA_BUF};
      const wia_ze_device_mem_alloc_desc_t desc{WIA_ZE_STRUCTURE_TYPE_DEVICE_MEM_ALLOC_DESC,
                                                d.dmabuf_export ? &exportable : nullptr, 0, 0};
      const wia_ze_result_t r =
          p.rt.zeMemAllocDevice(d.driver->context, &desc, bytes, kAlignment, d.h, &out);
      if (r != WIA_ZE_RESULT_SUCCESS)
        return p.fail_ze(r, dev, "zeMemAllocDevice(%" PRIu64 " bytes)", size);
    } else {
      // USM host memory of the context: every device of the driver copies
      // to and from it directly.
      const wia_ze_host_mem_alloc_desc_t desc{WIA_ZE_STRUCTURE_TYPE_HOST_MEM_ALLOC_DESC, nullptr,
                                              0};
      const wia_ze_result_t r =
          p.rt.zeMemAllocHost(d.driver->context, &desc, bytes, kAlignment, &out);
      if (r != WIA_ZE_RESULT_SUCCESS)
        return p.fail_ze(r, dev, "zeMemAllocHost(%" PRIu64 " bytes)", size);
    }
    if (out == nullptr)
      return p.fail(WIA_ERROR_INTERNAL,
                    "mem_alloc on Level Zero device %d: the driver returned NULL for %zu bytes",
                    dev, bytes);
    try {
      p.memory.add(out, Allocation{dev, kind, size});
    } catch (...) {
      p.rt.zeMemFree(d.driver->context, out);
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
      return p.fail(WIA_ERROR_INVALID_ARGUMENT, "mem_free on Level Zero device %d: %s", dev,
                    why.c_str());
    const wia_ze_result_t r = p.rt.zeMemFree(p.device(dev).driver->context, ptr);
    if (r != WIA_ZE_RESULT_SUCCESS)
      return p.fail_ze(r, dev, "zeMemFree(%p, %s memory of %" PRIu64 " bytes)", ptr,
                       kind_name(a.kind), a.size);
    return WIA_SUCCESS;
  });
}

void release_all_memory(Provider& p) noexcept {
  const std::size_t leaked = p.memory.release_all(
      [&](std::uintptr_t addr, const Allocation& a) {
        p.rt.zeMemFree(p.device(a.device).driver->context, reinterpret_cast<void*>(addr));
      },
      [&](std::uintptr_t addr, std::int32_t device, std::uint32_t opens) {
        for (std::uint32_t i = 0; i < opens; ++i)
          p.rt.zeMemCloseIpcHandle(p.device(device).driver->context, reinterpret_cast<void*>(addr));
      });
  if (leaked != 0) p.log(WIA_LOG_WARN, "fini: freeing %zu allocation(s) never freed", leaked);
}

// --------------------------------------------------------------------------
// Synchronous memset / memcpy

wia_status_t memset_sync(void* ctx, std::int32_t dev, void* ptr, std::int32_t value,
                         std::uint64_t size) noexcept {
  return guarded(ctx, "memset", [&](Provider& p) -> wia_status_t {
    if (const wia_status_t st = p.check_device(dev, "memset"); st != WIA_SUCCESS) return st;
    if (size == 0) return WIA_SUCCESS;
    if (ptr == nullptr)
      return p.fail(WIA_ERROR_INVALID_ARGUMENT, "memset on Level Zero device %d: ptr is NULL", dev);
    Device& d = p.device(dev);
    std::lock_guard<std::mutex> lk(d.sync_mu);
    if (const wia_status_t st = sync_list(p, d, "memset"); st != WIA_SUCCESS) return st;
    const auto byte = static_cast<unsigned char>(value);
    const wia_ze_result_t r = p.rt.zeCommandListAppendMemoryFill(
        d.sync_list, ptr, &byte, 1, static_cast<std::size_t>(size), nullptr, 0, nullptr);
    if (r != WIA_ZE_RESULT_SUCCESS)
      return p.fail_ze(r, dev, "zeCommandListAppendMemoryFill(%p, 0x%02x, %" PRIu64 " bytes)", ptr,
                       byte, size);
    return WIA_SUCCESS;
  });
}

wia_status_t memcpy_sync(void* ctx, std::int32_t dev, void* dst, const void* src,
                         std::uint64_t size) noexcept {
  return guarded(ctx, "memcpy", [&](Provider& p) -> wia_status_t {
    if (const wia_status_t st = p.check_device(dev, "memcpy"); st != WIA_SUCCESS) return st;
    if (size == 0) return WIA_SUCCESS;
    if (dst == nullptr || src == nullptr)
      return p.fail(WIA_ERROR_INVALID_ARGUMENT, "memcpy on Level Zero device %d: %s is NULL", dev,
                    dst == nullptr ? "dst" : "src");
    Device& d = p.device(dev);
    std::lock_guard<std::mutex> lk(d.sync_mu);
    if (const wia_status_t st = sync_list(p, d, "memcpy"); st != WIA_SUCCESS) return st;
    // USM pointers carry their kind: one call serves every direction.
    const wia_ze_result_t r = p.rt.zeCommandListAppendMemoryCopy(
        d.sync_list, dst, src, static_cast<std::size_t>(size), nullptr, 0, nullptr);
    if (r != WIA_ZE_RESULT_SUCCESS)
      return p.fail_ze(r, dev, "zeCommandListAppendMemoryCopy(%p <- %p, %" PRIu64 " bytes)", dst,
                       src, size);
    return WIA_SUCCESS;
  });
}

// --------------------------------------------------------------------------
// dma-buf export, for a NIC to reach device memory (ibv_reg_dmabuf_mr).
// Level Zero exports whole allocations: zeMemGetAllocProperties of the
// allocation's start with a chained ze_external_memory_export_fd_t gives a
// new descriptor of it, and *offset says where ptr lies in it. The
// allocation's start comes from our own table (it also refuses memory that
// is not a device allocation of this device, as cuda and hip do).

wia_status_t mem_export_dmabuf(void* ctx, std::int32_t dev, void* ptr, std::uint64_t size,
                               std::int32_t* fd, std::uint64_t* offset) noexcept {
  return guarded(ctx, "mem_export_dmabuf", [&](Provider& p) -> wia_status_t {
    if (const char* null = common::reset_dmabuf_out(fd, offset))
      return p.fail(WIA_ERROR_INVALID_ARGUMENT,
                    "mem_export_dmabuf on Level Zero device %d: %s is NULL", dev, null);
    if (const wia_status_t st = p.check_device(dev, "mem_export_dmabuf"); st != WIA_SUCCESS)
      return st;
    common::DmabufRange range;
    if (const std::string why = p.memory.find_dmabuf_range(ptr, size, dev, &range); !why.empty())
      return p.fail(WIA_ERROR_INVALID_ARGUMENT, "mem_export_dmabuf on Level Zero device %d: %s",
                    dev, why.c_str());
    Device& d = p.device(dev);
    if (!d.dmabuf_export)
      return p.fail(WIA_ERROR_NOT_SUPPORTED,
                    "mem_export_dmabuf on Level Zero device %d (%s): the device does not export "
                    "dma-bufs (zeDeviceGetExternalMemoryProperties: memoryAllocationExportTypes "
                    "lacks ZE_EXTERNAL_MEMORY_TYPE_FLAG_DMA_BUF); stage through host memory",
                    dev, d.name.c_str());
    wia_ze_external_memory_export_fd_t export_fd{WIA_ZE_STRUCTURE_TYPE_EXTERNAL_MEMORY_EXPORT_FD,
                                                 nullptr, WIA_ZE_EXTERNAL_MEMORY_TYPE_FLAG_DMA_BUF,
                                                 -1};
    wia_ze_memory_allocation_properties_t props{WIA_ZE_STRUCTURE_TYPE_MEMORY_ALLOCATION_PROPERTIES,
                                                &export_fd, 0, 0, 0};
    void* base = reinterpret_cast<void*>(range.base);
    const wia_ze_result_t r =
        p.rt.zeMemGetAllocProperties(d.driver->context, base, &props, nullptr);
    if (r != WIA_ZE_RESULT_SUCCESS)
      return p.fail_ze(r, dev, "zeMemGetAllocProperties(%p, %" PRIu64 " bytes, export fd DMA_BUF)",
                       base, range.allocation.size);
    if (export_fd.fd < 0 || props.type != WIA_ZE_MEMORY_TYPE_DEVICE) {
      if (export_fd.fd >= 0) ::close(export_fd.fd);
      return p.fail(WIA_ERROR_INTERNAL,
                    "mem_export_dmabuf on Level Zero device %d: zeMemGetAllocProperties(%p) "
                    "returned %s",
                    dev, base,
                    export_fd.fd < 0 ? "no descriptor" : "memory that is not device memory");
    }
    *fd = export_fd.fd;
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
      return p.fail(WIA_ERROR_INVALID_ARGUMENT,
                    "ipc_get_handle on Level Zero device %d: handle is NULL", dev);
    if (const wia_status_t st = p.check_device(dev, "ipc_get_handle"); st != WIA_SUCCESS) return st;
    Allocation a;
    if (const std::string why = p.memory.find_device_start(ptr, dev, &a); !why.empty())
      return p.fail(WIA_ERROR_INVALID_ARGUMENT, "ipc_get_handle on Level Zero device %d: %s", dev,
                    why.c_str());
    ZeIpcPart part{};
    const wia_ze_result_t r =
        p.rt.zeMemGetIpcHandle(p.device(dev).driver->context, ptr, &part.ze_handle);
    if (r != WIA_ZE_RESULT_SUCCESS)
      return p.fail_ze(r, dev, "zeMemGetIpcHandle(%p, %" PRIu64 " bytes)", ptr, a.size);
    std::memcpy(&part.exporter_fd, part.ze_handle.data, sizeof(part.exporter_fd));
    common::ipc_pack(handle, kIpcMagic, dev, a.size, &part, sizeof(part));
    return WIA_SUCCESS;
  });
}

wia_status_t ipc_open_handle(void* ctx, std::int32_t dev, const wia_ipc_handle_t* handle,
                             void** ptr) noexcept {
  return guarded(ctx, "ipc_open_handle", [&](Provider& p) -> wia_status_t {
    if (handle == nullptr || ptr == nullptr)
      return p.fail(WIA_ERROR_INVALID_ARGUMENT,
                    "ipc_open_handle on Level Zero device %d: %s is NULL", dev,
                    handle == nullptr ? "handle" : "ptr");
    *ptr = nullptr;
    if (const wia_status_t st = p.check_device(dev, "ipc_open_handle"); st != WIA_SUCCESS)
      return st;
    common::IpcHeader h{};
    ZeIpcPart part{};
    if (const std::string why =
            common::ipc_unpack(*handle, kIpcMagic, "ze", &h, &part, sizeof(part));
        !why.empty())
      return p.fail(WIA_ERROR_INVALID_ARGUMENT, "ipc_open_handle on Level Zero device %d: %s", dev,
                    why.c_str());
    Device& d = p.device(dev);
    // The exporter's descriptor, duplicated into this process.
    const int pidfd = static_cast<int>(::syscall(SYS_pidfd_open, h.exporter_pid, 0));
    if (pidfd < 0)
      return p.fail(WIA_ERROR_UNAVAILABLE,
                    "ipc_open_handle on Level Zero device %d: pidfd_open(exporter pid %u): %s "
                    "(the exporter has exited, or is in another PID namespace)",
                    dev, h.exporter_pid, std::strerror(errno));
    const int local = static_cast<int>(::syscall(SYS_pidfd_getfd, pidfd, part.exporter_fd, 0));
    const int getfd_errno = errno;
    ::close(pidfd);
    if (local < 0)
      return p.fail(getfd_errno == EPERM ? WIA_ERROR_NOT_SUPPORTED : WIA_ERROR_UNAVAILABLE,
                    "ipc_open_handle on Level Zero device %d: pidfd_getfd(fd %d of pid %u): %s "
                    "(Level Zero IPC needs the exporter's dma-buf descriptor; ptrace permission "
                    "over the exporter, which Yama ptrace_scope >= 2 or a seccomp filter deny)",
                    dev, part.exporter_fd, h.exporter_pid, std::strerror(getfd_errno));
    wia_ze_ipc_mem_handle_t local_handle = part.ze_handle;
    std::memcpy(local_handle.data, &local, sizeof(local));
    void* out = nullptr;
    const wia_ze_result_t r =
        p.rt.zeMemOpenIpcHandle(d.driver->context, d.h, local_handle, 0, &out);
    // The driver has imported the buffer (or failed): our duplicate is done.
    ::close(local);
    if (r != WIA_ZE_RESULT_SUCCESS)
      return p.fail_ze(
          r, dev, "zeMemOpenIpcHandle(%" PRIu64 " bytes exported by pid %u from its device %d)",
          h.size, h.exporter_pid, h.exporter_device);
    try {
      p.memory.add_import(out, dev);
    } catch (...) {
      p.rt.zeMemCloseIpcHandle(d.driver->context, out);
      throw;
    }
    *ptr = out;
    return WIA_SUCCESS;
  });
}

wia_status_t ipc_close_handle(void* ctx, std::int32_t dev, void* ptr) noexcept {
  return guarded(ctx, "ipc_close_handle", [&](Provider& p) -> wia_status_t {
    if (const wia_status_t st = p.check_device(dev, "ipc_close_handle"); st != WIA_SUCCESS)
      return st;
    if (const std::string why = p.memory.release_import(ptr, dev); !why.empty())
      return p.fail(WIA_ERROR_INVALID_ARGUMENT, "ipc_close_handle on Level Zero device %d: %s", dev,
                    why.c_str());
    const wia_ze_result_t r = p.rt.zeMemCloseIpcHandle(p.device(dev).driver->context, ptr);
    if (r != WIA_ZE_RESULT_SUCCESS) return p.fail_ze(r, dev, "zeMemCloseIpcHandle(%p)", ptr);
    return WIA_SUCCESS;
  });
}

}  // namespace wia::ze
