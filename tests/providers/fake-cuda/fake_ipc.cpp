// SPDX-License-Identifier: Apache-2.0
// IPC between processes and dma-buf export. A handle names the exporter's
// memfd as /proc/<pid>/fd/<n>; the importer reopens that path (same user,
// no ptrace attach needed) and maps it shared, so both processes see the
// same bytes, as two processes mapping one GPU allocation do.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "fake_cuda.hpp"

namespace wia::fake_cuda {
namespace {

constexpr char kMagic[8] = {'F', 'A', 'K', 'E', 'C', 'U', 'I', 'P'};

// The 64 bytes of a CUipcMemHandle, as the double fills them. The inode
// tells a reused descriptor number from the allocation that was exported.
struct IpcPayload {
  char magic[8];
  std::int32_t pid;
  std::int32_t fd;
  std::uint64_t size;    // the allocation's size in bytes
  std::uint64_t mapped;  // its memfd's size
  std::uint64_t inode;
  std::int32_t device;  // exporter's device, for diagnostics
  std::uint8_t unused[20];
};
static_assert(sizeof(IpcPayload) == WIA_CU_IPC_HANDLE_SIZE, "fills the handle exactly");

}  // namespace
}  // namespace wia::fake_cuda

using namespace wia::fake_cuda;

wia_CUresult fake_cuIpcGetMemHandle(wia_CUipcMemHandle* handle, wia_CUdeviceptr dptr) {
  if (handle == nullptr) return WIA_CUDA_ERROR_INVALID_VALUE;
  Driver& d = driver();
  std::lock_guard<std::mutex> lk(d.mu);
  if (current_context() == nullptr) return WIA_CUDA_ERROR_INVALID_CONTEXT;
  const Allocation* a = find_allocation(static_cast<std::uintptr_t>(dptr));
  if (a == nullptr || a->kind != MemKind::kDevice) return WIA_CUDA_ERROR_INVALID_VALUE;
  // Like the driver, the handle is to the whole allocation holding dptr:
  // the importer gets its base and must add the offset itself.
  IpcPayload p{};
  std::memcpy(p.magic, kMagic, sizeof(kMagic));
  p.pid = static_cast<std::int32_t>(getpid());
  p.fd = a->memfd;
  p.size = a->size;
  p.mapped = a->mapped;
  p.inode = a->inode;
  p.device = a->device;
  std::memcpy(handle->reserved, &p, sizeof(p));
  return WIA_CUDA_SUCCESS;
}

wia_CUresult fake_cuIpcOpenMemHandle(wia_CUdeviceptr* dptr, wia_CUipcMemHandle handle,
                                     unsigned int flags) {
  if (dptr == nullptr || (flags & ~WIA_CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS) != 0)
    return WIA_CUDA_ERROR_INVALID_VALUE;
  IpcPayload p;
  std::memcpy(&p, handle.reserved, sizeof(p));
  if (std::memcmp(p.magic, kMagic, sizeof(kMagic)) != 0) return WIA_CUDA_ERROR_INVALID_VALUE;
  Driver& d = driver();
  std::lock_guard<std::mutex> lk(d.mu);
  Context* ctx = current_context();
  if (ctx == nullptr) return WIA_CUDA_ERROR_INVALID_CONTEXT;
  // The real driver refuses a handle exported by the calling process
  // (CUDA_ERROR_INVALID_CONTEXT in practice); so does the double, so that
  // a provider that shortcuts same-process IPC does it before the driver.
  if (p.pid == static_cast<std::int32_t>(getpid())) {
    diagnose("cuIpcOpenMemHandle: the handle was exported by this process");
    return WIA_CUDA_ERROR_INVALID_CONTEXT;
  }
  // Opened before in this process: the same pointer, one more reference
  // (what the driver documents for a handle opened twice).
  for (auto& entry : d.allocations) {
    Allocation& a = entry.second;
    if (a.kind == MemKind::kIpcMapped && a.inode == p.inode && a.device == ctx->device) {
      ++a.ipc_opens;
      *dptr = a.base;
      return WIA_CUDA_SUCCESS;
    }
  }
  const std::string path = "/proc/" + std::to_string(p.pid) + "/fd/" + std::to_string(p.fd);
  const int fd = open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) {
    diagnose("cuIpcOpenMemHandle: " + path + ": " + std::strerror(errno) +
             " (the exporting process ended or freed the memory)");
    return WIA_CUDA_ERROR_INVALID_HANDLE;
  }
  struct stat st {};
  if (fstat(fd, &st) != 0 || static_cast<std::uint64_t>(st.st_ino) != p.inode ||
      static_cast<std::uint64_t>(st.st_size) < p.mapped) {
    diagnose("cuIpcOpenMemHandle: " + path + " is no longer the exported allocation");
    close(fd);
    return WIA_CUDA_ERROR_INVALID_HANDLE;
  }
  void* base = mmap(nullptr, p.mapped, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);  // the mapping keeps the memory
  if (base == MAP_FAILED) return WIA_CUDA_ERROR_OUT_OF_MEMORY;
  Allocation a;
  a.kind = MemKind::kIpcMapped;
  a.device = ctx->device;
  a.base = reinterpret_cast<std::uintptr_t>(base);
  a.size = p.size;
  a.mapped = p.mapped;
  a.inode = p.inode;
  a.ipc_opens = 1;
  d.allocations[a.base] = a;
  *dptr = a.base;
  return WIA_CUDA_SUCCESS;
}

wia_CUresult fake_cuIpcCloseMemHandle(wia_CUdeviceptr dptr) {
  Driver& d = driver();
  int device = -1;
  {
    std::lock_guard<std::mutex> lk(d.mu);
    if (current_context() == nullptr) return WIA_CUDA_ERROR_INVALID_CONTEXT;
    auto it = d.allocations.find(static_cast<std::uintptr_t>(dptr));
    if (it == d.allocations.end() || it->second.kind != MemKind::kIpcMapped)
      return WIA_CUDA_ERROR_INVALID_VALUE;
    if (--it->second.ipc_opens > 0) return WIA_CUDA_SUCCESS;
    device = it->second.device;
  }
  wait_device_idle(device);  // queued work may still read the mapping
  std::lock_guard<std::mutex> lk(d.mu);
  auto it = d.allocations.find(static_cast<std::uintptr_t>(dptr));
  if (it == d.allocations.end()) return WIA_CUDA_ERROR_INVALID_VALUE;
  release_allocation(it->second);
  d.allocations.erase(it);
  return WIA_CUDA_SUCCESS;
}

wia_CUresult fake_cuMemGetHandleForAddressRange(void* handle, wia_CUdeviceptr dptr, size_t size,
                                                int handle_type, unsigned long long flags) {
  if (handle == nullptr || size == 0 || flags != 0 ||
      handle_type != WIA_CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD)
    return WIA_CUDA_ERROR_INVALID_VALUE;
  Driver& d = driver();
  std::lock_guard<std::mutex> lk(d.mu);
  if (current_context() == nullptr) return WIA_CUDA_ERROR_INVALID_CONTEXT;
  const auto page = static_cast<std::uintptr_t>(sysconf(_SC_PAGESIZE));
  const auto start = static_cast<std::uintptr_t>(dptr);
  if (start % page != 0 || size % page != 0) return WIA_CUDA_ERROR_INVALID_VALUE;  // documented
  const Allocation* a = find_allocation(start);
  if (a == nullptr || a->kind != MemKind::kDevice || size > a->mapped - (start - a->base))
    return WIA_CUDA_ERROR_INVALID_VALUE;
  // A memfd cannot stand for part of itself: ranges that do not start at
  // the allocation are refused (the real driver exports any aligned range).
  if (start != a->base) {
    diagnose("cuMemGetHandleForAddressRange: the double exports whole allocations only");
    return WIA_CUDA_ERROR_NOT_SUPPORTED;
  }
  const int fd = fcntl(a->memfd, F_DUPFD_CLOEXEC, 0);
  if (fd < 0) return WIA_CUDA_ERROR_OUT_OF_MEMORY;
  std::memcpy(handle, &fd, sizeof(fd));
  return WIA_CUDA_SUCCESS;
}
