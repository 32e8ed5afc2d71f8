// SPDX-License-Identifier: Apache-2.0
// One-sided access (WIA_TRANSPORT_CAP_RMA) on fabrics that offered FI_RMA:
// the remote key of a registration, put (fi_writemsg) and get
// (fi_readmsg). A put reported done is visible at the target before any
// message sent after it (docs/provider-abi.md T13): writes ask for
// FI_DELIVERY_COMPLETE, and on a fabric that refuses that flag the
// endpoint falls back to the default completion, which the fabric's
// FI_ORDER_SAW ordering then has to cover (said in the log once).
#include <cinttypes>
#include <cstring>

#include "ofi.hpp"

namespace wia::ofi {

wia_status_t Endpoint::rkey(const MrHandle* mr, WireRkey* out) const {
  if (!info_->rma)
    return ctx_->fail(WIA_ERROR_NOT_SUPPORTED,
                      "ofi: %s/%s offers no FI_RMA: no remote keys (endpoint flag RMA is clear)",
                      info_->prov.c_str(), info_->domain.c_str());
  const std::uint64_t key = fi_mr_key(mr->entry->mr);
  if (key == FI_KEY_NOTAVAIL)
    return ctx_->fail(WIA_ERROR_NOT_SUPPORTED,
                      "ofi: %s/%s uses raw memory keys (FI_MR_RAW), which this provider does not "
                      "carry",
                      info_->prov.c_str(), info_->domain.c_str());
  *out = WireRkey{kRkeyMagic, mr_virt_addr ? 1u : 0u, key, mr->entry->base, mr->entry->len};
  return WIA_SUCCESS;
}

wia_status_t Endpoint::rma(Conn* c, bool write, void* local, std::uint64_t size, MrHandle* mr,
                           std::uint64_t remote_addr, const WireRkey& key, wia_request_t* out) {
  *out = nullptr;
  const char* op = write ? "put" : "get";
  if (!info_->rma)
    return ctx_->fail(WIA_ERROR_NOT_SUPPORTED, "ofi: %s on %s/%s, which offers no FI_RMA", op,
                      info_->prov.c_str(), info_->domain.c_str());
  if (c->failed) return ctx_->fail(WIA_ERROR_REMOTE, "%s", c->failure.c_str());
  if (!c->established)
    return ctx_->fail(WIA_ERROR_INVALID_HANDLE, "ofi: %s on a connection still being set up", op);
  if (key.magic != kRkeyMagic)
    return ctx_->fail(WIA_ERROR_INVALID_ARGUMENT,
                      "ofi: %s with a remote key that is not an ofi key (magic 0x%08x)", op,
                      key.magic);
  if (remote_addr < key.base || size > key.len || remote_addr - key.base > key.len - size)
    return ctx_->fail(WIA_ERROR_INVALID_ARGUMENT,
                      "ofi: %s of %s at 0x%" PRIx64 " falls outside the remote region [0x%" PRIx64
                      ", +%s) of %s",
                      op, size_text(size).c_str(), remote_addr, key.base,
                      size_text(key.len).c_str(), c->peer_text.c_str());
  if (size > info_->max_msg)
    return ctx_->fail(WIA_ERROR_INVALID_ARGUMENT,
                      "ofi: a %s of %s to %s exceeds the largest transfer of %s/%s, %s", op,
                      size_text(size).c_str(), c->peer_text.c_str(), info_->prov.c_str(),
                      info_->domain.c_str(), size_text(info_->max_msg).c_str());
  if (local == nullptr && size > 0)
    return ctx_->fail(WIA_ERROR_INVALID_ARGUMENT, "ofi: %s of %s at NULL", op,
                      size_text(size).c_str());
  MrEntry* auto_mr = nullptr;
  void* desc = nullptr;
  if (const wia_status_t st = local_desc(local, size, mr, &auto_mr, &desc); st != WIA_SUCCESS)
    return st;
  Request* r = new_request(Request::Kind::data, c);
  r->is_send = true;
  r->op = op;
  r->capacity = size;
  r->size = size;
  r->auto_mr = auto_mr;
  iovec iov{local, static_cast<std::size_t>(size)};
  fi_rma_iov remote{key.virt_addr != 0 ? remote_addr : remote_addr - key.base,
                    static_cast<std::size_t>(size), key.key};
  fi_msg_rma msg{};
  msg.msg_iov = &iov;
  msg.desc = &desc;
  msg.iov_count = 1;
  msg.addr = c->addr;
  msg.rma_iov = &remote;
  msg.rma_iov_count = 1;
  msg.context = &r->fctx;
  const std::uint64_t until = ctx_->now_ns() + 1000000000ull;
  ssize_t rc = 0;
  for (;;) {
    if (write) {
      rc = fi_writemsg(ep, &msg, FI_COMPLETION | (delivery_complete ? FI_DELIVERY_COMPLETE : 0));
      if ((rc == -FI_EBADFLAGS || rc == -FI_EINVAL) && delivery_complete) {
        delivery_complete = false;
        ctx_->log(WIA_LOG_INFO,
                  "ofi: %s/%s refuses FI_DELIVERY_COMPLETE writes (%s); puts complete at the "
                  "fabric's default and rely on its send-after-write ordering",
                  info_->prov.c_str(), info_->domain.c_str(),
                  ctx_->fi_error(static_cast<int>(rc)).c_str());
        continue;
      }
    } else {
      rc = fi_readmsg(ep, &msg, FI_COMPLETION);
    }
    // No resources now: completions free them; wait up to a second, as the
    // ABI's put/get have no "not taken" answer.
    if (rc == -FI_EAGAIN && ctx_->now_ns() < until) {
      progress();
      continue;
    }
    break;
  }
  if (rc != 0) {
    r->user_gone = true;
    finish(r);
    return ctx_->fail(WIA_ERROR_REMOTE, "ofi: %s of %s with %s: %s",
                      write ? "fi_writemsg" : "fi_readmsg", size_text(size).c_str(),
                      c->peer_text.c_str(), ctx_->fi_error(static_cast<int>(rc)).c_str());
  }
  r->in_fabric = true;
  c->add_pending(r);
  *out = reinterpret_cast<wia_request_t>(r);
  return WIA_SUCCESS;
}

}  // namespace wia::ofi
