// SPDX-License-Identifier: Apache-2.0
// Memory registration and everything the shm provider does with
// cross-memory attach (process_vm_readv/writev): pulling a matched large
// message in one copy, and put/get against a peer's rkey.
#include <poll.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <mutex>

#include "shm.hpp"

#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434  // the same number on every architecture
#endif

namespace wia::shm {

// ---------------------------------------------------------------------------
// Registration

wia_status_t reg_mr(void* ctx, int32_t endpoint, const wia_mr_desc_v1_t* desc, wia_mr_t* mr) {
  Provider* p = prov(ctx);
  if (desc == nullptr || mr == nullptr) return WIA_ERROR_INVALID_ARGUMENT;
  if (endpoint != 0)
    return p->fail(WIA_ERROR_INVALID_ARGUMENT, format("reg_mr: no endpoint %d", endpoint));
  if (desc->kind != WIA_MR_HOST || (WIA_ABI_HAS_FIELD(wia_mr_desc_v1_t, desc->struct_size, iface) &&
                                    desc->iface != WIA_MEM_IFACE_HOST))
    return p->fail(WIA_ERROR_NOT_SUPPORTED, "reg_mr: the shm transport moves host memory only");
  auto* m = new (std::nothrow) MemoryRegion{desc->ptr, desc->size};
  if (m == nullptr) return WIA_ERROR_OUT_OF_MEMORY;
  *mr = reinterpret_cast<wia_mr_t>(m);
  return WIA_SUCCESS;
}

wia_status_t dereg_mr(void*, wia_mr_t mr) {
  if (mr == nullptr) return WIA_ERROR_INVALID_HANDLE;
  delete reinterpret_cast<MemoryRegion*>(mr);
  return WIA_SUCCESS;
}

// ---------------------------------------------------------------------------
// Large messages pulled by CMA

bool peer_exited(const Conn* c) {
  if (c->peer_pidfd < 0) return false;
  pollfd pfd{c->peer_pidfd, POLLIN, 0};
  return poll(&pfd, 1, 0) > 0;  // a pidfd polls readable once the process has exited
}

int open_pidfd(int pid) { return static_cast<int>(syscall(SYS_pidfd_open, pid, 0)); }

bool run_cma(Conn* c) {
  if (c->cma_recvs.empty() || c->state != ConnState::kUp) return false;
  Request* r = c->cma_recvs.front();
  const std::uint64_t n = std::min(c->provider->cfg.cma_piece, r->msg_size - r->offset);
  iovec local{r->buf + r->offset, n};
  iovec remote{reinterpret_cast<void*>(r->peer_addr + r->offset), n};
  const ssize_t got = process_vm_readv(c->peer_pid, &local, 1, &remote, 1, 0);
  // If the peer died, its pid may already name another process, and the
  // bytes just read would be that process's: a pidfd that is still
  // "running" after the read proves the read hit our peer.
  if (got > 0 && peer_exited(c)) {
    fail_conn(c, format("peer pid %d exited during a cross-memory read", c->peer_pid));
    return true;
  }
  if (got > 0) {
    r->offset += static_cast<std::uint64_t>(got);
    if (r->offset == r->msg_size) {
      c->cma_recvs.pop_front();
      complete(r, r->msg_size);
      queue_control(c, wire::kFin, 0, r->tag, r->msg_size, r->peer_id, 0);
    }
    return true;
  }
  const int e = got < 0 ? errno : EIO;
  if (e == EPERM || e == ENOSYS) {
    // No ptrace permission after all (the peer became non-dumpable, a
    // capability was dropped, ...): stream this and later messages.
    c->provider->log(
        WIA_LOG_INFO,
        format("process_vm_readv from peer pid %d: %s; falling back to the staging ring",
               c->peer_pid, errno_text(e).c_str()));
    c->cma_readable = false;
    while (!c->cma_recvs.empty()) {
      Request* q = c->cma_recvs.pop_front();
      q->stage = Stage::kStaged;
      q->offset = 0;
      q->id = c->next_id++;
      c->recvs_staged.emplace(q->id, q);
      queue_control(c, wire::kCts, 0, q->tag, q->msg_size, q->peer_id, q->id);
    }
    return true;
  }
  if (e == ESRCH)
    fail_conn(
        c, format("peer pid %d exited (process_vm_readv: %s)", c->peer_pid, errno_text(e).c_str()));
  else
    fail_conn(c, format("process_vm_readv of %" PRIu64 " bytes at 0x%" PRIx64 " in peer pid %d: %s",
                        n, r->peer_addr + r->offset, c->peer_pid, errno_text(e).c_str()));
  return true;
}

// ---------------------------------------------------------------------------
// RMA: process_vm_writev / process_vm_readv against an rkey

wia_status_t mr_rkey(void* ctx, wia_mr_t mr, void* rkey) {
  Provider* p = prov(ctx);
  if (mr == nullptr) return WIA_ERROR_INVALID_HANDLE;
  if (rkey == nullptr) return WIA_ERROR_INVALID_ARGUMENT;
  if (p->cfg.cma == CmaMode::kOff)
    return p->fail(WIA_ERROR_NOT_SUPPORTED,
                   "mr_rkey: RMA needs cross-memory attach (shm.cma is off)");
  const auto* m = reinterpret_cast<const MemoryRegion*>(mr);
  wire::Rkey k{wire::kRkeyMagic, static_cast<std::uint32_t>(getpid()), 0,
               reinterpret_cast<std::uint64_t>(m->ptr), m->size};
  std::memset(rkey, 0, WIA_RKEY_SIZE);
  std::memcpy(rkey, &k, sizeof(k));
  return WIA_SUCCESS;
}

namespace {

// Both directions: the copy is done when the call returns (so a put is
// visible before any later message on the connection), and the request
// handed back is already complete.
wia_status_t rma(void* ctx, wia_conn_t conn, void* local, std::uint64_t size,
                 std::uint64_t remote_addr, const void* rkey, bool is_put, wia_request_t* request) {
  Provider* p = prov(ctx);
  const char* what = is_put ? "put" : "get";
  if (conn == nullptr || rkey == nullptr || request == nullptr || (local == nullptr && size > 0))
    return WIA_ERROR_INVALID_ARGUMENT;
  *request = nullptr;
  Conn* c = reinterpret_cast<Conn*>(conn);
  std::lock_guard<SpinLock> lock(c->mu);
  if (wia_status_t st = post_check(p, c, local, size, what); st != WIA_SUCCESS) return st;
  wire::Rkey k;
  std::memcpy(&k, rkey, sizeof(k));
  if (k.magic != wire::kRkeyMagic)
    return p->fail(WIA_ERROR_INVALID_HANDLE, format("%s: not an shm rkey", what));
  if (static_cast<int>(k.pid) != c->peer_pid)
    return p->fail(
        WIA_ERROR_INVALID_HANDLE,
        format("%s: rkey of pid %u used on the connection to pid %d", what, k.pid, c->peer_pid));
  if (remote_addr < k.base || size > k.len || remote_addr - k.base > k.len - size)
    return p->fail(WIA_ERROR_INVALID_ARGUMENT,
                   format("%s of %" PRIu64 " bytes at 0x%" PRIx64 " is outside the remote region "
                          "[0x%" PRIx64 ", +%" PRIu64 ")",
                          what, size, remote_addr, k.base, k.len));
  if (!c->cma_readable)
    return p->fail(
        WIA_ERROR_NOT_SUPPORTED,
        format("%s: cross-memory attach to peer pid %d is not permitted", what, c->peer_pid));
  std::uint64_t done = 0;
  while (done < size) {
    iovec l{static_cast<std::uint8_t*>(local) + done, size - done};
    iovec r{reinterpret_cast<void*>(remote_addr + done), size - done};
    const ssize_t n = is_put ? process_vm_writev(c->peer_pid, &l, 1, &r, 1, 0)
                             : process_vm_readv(c->peer_pid, &l, 1, &r, 1, 0);
    if (n > 0 && peer_exited(c))
      errno = ESRCH;
    else if (n > 0) {
      done += static_cast<std::uint64_t>(n);
      continue;
    }
    const int e = n == 0 ? EFAULT : errno;
    if (e == ESRCH) {
      fail_conn(c, format("peer pid %d exited (%s)", c->peer_pid, what));
      return p->fail(WIA_ERROR_REMOTE, c->failure);
    }
    return p->fail(e == EPERM ? WIA_ERROR_NOT_SUPPORTED : WIA_ERROR_REMOTE,
                   format("%s of %" PRIu64 " bytes at 0x%" PRIx64 " in peer pid %d: %s", what, size,
                          remote_addr + done, c->peer_pid, errno_text(e).c_str()));
  }
  Request* req = new_request(c, is_put, local, size, 0);
  if (req == nullptr) return WIA_SUCCESS;  // "retry": nothing was left half done that matters
  complete(req, size);
  *request = reinterpret_cast<wia_request_t>(req);
  return WIA_SUCCESS;
}

}  // namespace

wia_status_t put(void* ctx, wia_conn_t conn, const void* local, uint64_t size, wia_mr_t,
                 uint64_t remote_addr, const void* rkey, wia_request_t* request) {
  return guarded(ctx, [&] {
    return rma(ctx, conn, const_cast<void*>(local), size, remote_addr, rkey, true, request);
  });
}
wia_status_t get(void* ctx, wia_conn_t conn, void* local, uint64_t size, wia_mr_t,
                 uint64_t remote_addr, const void* rkey, wia_request_t* request) {
  return guarded(ctx,
                 [&] { return rma(ctx, conn, local, size, remote_addr, rkey, false, request); });
}

}  // namespace wia::shm
