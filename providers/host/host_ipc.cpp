// SPDX-License-Identifier: Apache-2.0
// Inter-process memory of the `host` provider: the IPC handle that exports
// a device allocation (its arena memfd, offset and identity), and opening
// it in another process through pidfd_getfd or /proc/<pid>/fd.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <string>

#include "host_provider.hpp"
#include "wia_common/text.hpp"

// Not every libc names these yet; the numbers are the same on every
// architecture since Linux 5.x unified the syscall table.
#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434
#endif
#ifndef SYS_pidfd_getfd
#define SYS_pidfd_getfd 438
#endif

namespace wia::host {

using common::errno_text;

namespace {

// IPC handle layout (inside the opaque 128 bytes). Only ever read by the
// same provider build on the same node, so native byte order is fine.

constexpr std::uint64_t kIpcMagic = 0x3143504954534f48ull;  // "HOSTIPC1"

struct IpcWire {
  std::uint64_t magic;
  std::uint32_t version;
  std::int32_t pid;       // exporting process
  std::int32_t fd;        // its arena memfd
  std::int32_t device;    // exporting device (diagnostics only)
  std::uint64_t inode;    // st_ino/st_dev of the arena: detects a recycled
  std::uint64_t fs_dev;   // pid or fd number (stale handle) after getfd
  std::uint64_t offset;   // of the allocation in the arena
  std::uint64_t size;     // bytes the exporter allocated
  std::uint64_t map_len;  // bytes to map (page multiple)
};
static_assert(sizeof(IpcWire) <= WIA_IPC_HANDLE_SIZE, "IPC handle payload too large");

}  // namespace

wia_status_t ipc_get_handle(void* ctx, std::int32_t dev, void* ptr,
                            wia_ipc_handle_t* handle) noexcept {
  return guarded(ctx, "ipc_get_handle", [&](Provider& p) -> wia_status_t {
    if (handle == nullptr || ptr == nullptr)
      return p.fail(WIA_ERROR_INVALID_ARGUMENT, "ipc_get_handle on host device %d: %s is NULL", dev,
                    handle == nullptr ? "handle" : "ptr");
    if (!p.valid_device(dev))
      return p.fail(WIA_ERROR_INVALID_DEVICE, "ipc_get_handle: no host device %d (have %zu)", dev,
                    p.devices.size());
    Device& d = *p.devices[static_cast<std::size_t>(dev)];
    IpcWire w{};
    {
      std::lock_guard<std::mutex> lk(d.mu);
      auto it = d.allocs.find(ptr);
      if (it != d.allocs.end()) {
        const Allocation& a = it->second;
        if (a.kind != WIA_MEM_DEVICE)
          return p.fail(WIA_ERROR_INVALID_ARGUMENT,
                        "ipc_get_handle on host device %d: %p is pinned host memory; only device "
                        "memory can be exported",
                        dev, ptr);
        if (a.backing != Backing::kArena)
          return p.fail(WIA_ERROR_NOT_SUPPORTED,
                        "ipc_get_handle on host device %d: memfd_create is unavailable here, so "
                        "device memory is not shareable",
                        dev);
        struct stat st {};
        if (fstat(d.arena_fd, &st) != 0) {
          const int e = errno;
          return p.fail(WIA_ERROR_IO, "ipc_get_handle on host device %d: fstat: %s", dev,
                        errno_text(e).c_str());
        }
        w.magic = kIpcMagic;
        w.version = 1;
        w.pid = static_cast<std::int32_t>(getpid());
        w.fd = d.arena_fd;
        w.device = dev;
        w.inode = static_cast<std::uint64_t>(st.st_ino);
        w.fs_dev = static_cast<std::uint64_t>(st.st_dev);
        w.offset = a.offset;
        w.size = a.size;
        w.map_len = a.map_len;
      }
    }
    if (w.magic != kIpcMagic) return explain_unknown_pointer(p, "ipc_get_handle", dev, ptr);
    std::memset(handle->bytes, 0, sizeof(handle->bytes));
    std::memcpy(handle->bytes, &w, sizeof(w));
    return WIA_SUCCESS;
  });
}

wia_status_t ipc_open_handle(void* ctx, std::int32_t dev, const wia_ipc_handle_t* handle,
                             void** ptr) noexcept {
  return guarded(ctx, "ipc_open_handle", [&](Provider& p) -> wia_status_t {
    if (handle == nullptr || ptr == nullptr)
      return p.fail(WIA_ERROR_INVALID_ARGUMENT, "ipc_open_handle on host device %d: %s is NULL",
                    dev, handle == nullptr ? "handle" : "ptr");
    *ptr = nullptr;
    if (!p.valid_device(dev))
      return p.fail(WIA_ERROR_INVALID_DEVICE, "ipc_open_handle: no host device %d (have %zu)", dev,
                    p.devices.size());
    IpcWire w;
    std::memcpy(&w, handle->bytes, sizeof(w));
    if (w.magic != kIpcMagic || w.version != 1 || w.pid <= 0 || w.fd < 0 || w.map_len == 0 ||
        w.map_len % page_size() != 0 || w.offset % page_size() != 0 || w.size > w.map_len)
      return p.fail(WIA_ERROR_INVALID_HANDLE,
                    "ipc_open_handle on host device %d: not an IPC handle of the host provider",
                    dev);
    // Take a duplicate of the exporter's arena descriptor: pidfd_getfd,
    // which pins the exporter's identity but needs ptrace-attach rights
    // (same user and Yama ptrace_scope 0, or CAP_SYS_PTRACE); where those
    // are refused or the call is missing (Yama's default 1 on Ubuntu,
    // kernels before 5.6, valgrind), reopen /proc/<pid>/fd/<fd>, which
    // needs only ptrace-read rights. Either way the inode check below makes
    // sure it is the exported memory (a reused pid cannot pass it).
    int fd = -1, getfd_errno = 0, proc_errno = 0;
    const char* pidfd_call = "pidfd_getfd";
    if (p.ipc_open != Provider::IpcOpen::kProc) {
      const int pidfd = static_cast<int>(syscall(SYS_pidfd_open, w.pid, 0));
      if (pidfd >= 0) {
        fd = static_cast<int>(syscall(SYS_pidfd_getfd, pidfd, w.fd, 0));
        getfd_errno = fd < 0 ? errno : 0;
        close(pidfd);
      } else {
        getfd_errno = errno;
        pidfd_call = "pidfd_open";
      }
    }
    char path[64];
    std::snprintf(path, sizeof(path), "/proc/%d/fd/%d", w.pid, w.fd);
    if (fd < 0 && p.ipc_open != Provider::IpcOpen::kPidfd && getfd_errno != ESRCH &&
        getfd_errno != EBADF) {
      fd = open(path, O_RDWR | O_CLOEXEC);
      proc_errno = fd < 0 ? errno : 0;
      // No /proc/<pid> at all: the exporter is gone, not the handle bad.
      char dir[32];
      std::snprintf(dir, sizeof(dir), "/proc/%d", w.pid);
      if (proc_errno == ENOENT && access(dir, F_OK) != 0) proc_errno = ESRCH;
    }
    if (fd < 0) {
      const int e = proc_errno ? proc_errno : getfd_errno;
      const wia_status_t st = e == EPERM || e == EACCES   ? WIA_ERROR_UNAVAILABLE
                              : e == EBADF || e == ENOENT ? WIA_ERROR_INVALID_HANDLE
                              : e == ESRCH                ? WIA_ERROR_REMOTE
                              : e == ENOSYS               ? WIA_ERROR_NOT_SUPPORTED
                                                          : WIA_ERROR_IO;
      const std::string via_pidfd = p.ipc_open == Provider::IpcOpen::kProc
                                        ? std::string()
                                        : std::string(pidfd_call) + ": " + errno_text(getfd_errno);
      const std::string via_proc =
          proc_errno ? std::string("open(") + path + "): " + errno_text(proc_errno) : std::string();
      return p.fail(
          st, "ipc_open_handle on host device %d: memory of pid %d (fd %d): %s%s%s%s", dev, w.pid,
          w.fd, via_pidfd.c_str(), !via_pidfd.empty() && !via_proc.empty() ? "; " : "",
          via_proc.c_str(),
          st == WIA_ERROR_UNAVAILABLE ? " (needs ptrace access to the exporting process)" : "");
    }
    struct stat st {};
    if (fstat(fd, &st) != 0 || static_cast<std::uint64_t>(st.st_ino) != w.inode ||
        static_cast<std::uint64_t>(st.st_dev) != w.fs_dev ||
        static_cast<std::uint64_t>(st.st_size) < w.offset + w.map_len) {
      close(fd);
      return p.fail(WIA_ERROR_INVALID_HANDLE,
                    "ipc_open_handle on host device %d: stale handle (pid %d fd %d is no longer "
                    "the exported memory)",
                    dev, w.pid, w.fd);
    }
    void* base = mmap(nullptr, w.map_len, PROT_READ | PROT_WRITE, MAP_SHARED, fd,
                      static_cast<off_t>(w.offset));
    const int map_errno = errno;
    close(fd);  // the mapping keeps the memory alive
    if (base == MAP_FAILED)
      return p.fail(WIA_ERROR_OUT_OF_MEMORY,
                    "ipc_open_handle(%" PRIu64 " B) on host device %d: mmap: %s", w.map_len, dev,
                    errno_text(map_errno).c_str());
    madvise(base, w.map_len, MADV_DONTFORK);
    Device& d = *p.devices[static_cast<std::size_t>(dev)];
    try {
      std::lock_guard<std::mutex> lk(d.mu);
      d.imports.emplace(base, w.map_len);
    } catch (...) {
      munmap(base, w.map_len);
      throw;
    }
    *ptr = base;
    return WIA_SUCCESS;
  });
}

wia_status_t ipc_close_handle(void* ctx, std::int32_t dev, void* ptr) noexcept {
  return guarded(ctx, "ipc_close_handle", [&](Provider& p) -> wia_status_t {
    if (!p.valid_device(dev))
      return p.fail(WIA_ERROR_INVALID_DEVICE, "ipc_close_handle: no host device %d (have %zu)", dev,
                    p.devices.size());
    if (ptr == nullptr)
      return p.fail(WIA_ERROR_INVALID_ARGUMENT, "ipc_close_handle on host device %d: ptr is NULL",
                    dev);
    Device& d = *p.devices[static_cast<std::size_t>(dev)];
    std::lock_guard<std::mutex> lk(d.mu);
    auto it = d.imports.find(ptr);
    if (it == d.imports.end())
      return p.fail(WIA_ERROR_INVALID_ARGUMENT,
                    "ipc_close_handle on host device %d: %p was not returned by ipc_open_handle on "
                    "this device",
                    dev, ptr);
    munmap(ptr, it->second);
    d.imports.erase(it);
    return WIA_SUCCESS;
  });
}

}  // namespace wia::host
