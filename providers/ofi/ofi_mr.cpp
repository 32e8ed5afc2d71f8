// SPDX-License-Identifier: Apache-2.0
// Memory registration and its cache. Registration is per domain (one per
// wia endpoint here), so a region registered once serves every connection
// of the endpoint. The cache is keyed by the exact range, memory interface
// and device: the same buffer registered twice costs one fi_mr_reg, and the
// fabric registration lives until its last reference is dropped, so an
// entry never outlives the memory the caller registered (no stale entries
// after free, which an address-range cache without memory hooks would
// risk). Modes the fabric demands are honoured:
//  - FI_MR_LOCAL: every send and receive passes a descriptor; buffers the
//    core did not register are registered for the request (through the
//    cache) and released when the fabric is done with them;
//  - FI_MR_ENDPOINT: the region is bound to the endpoint and enabled;
//  - FI_MR_PROV_KEY: the fabric picks the key, otherwise we hand out
//    unique requested keys;
//  - FI_MR_VIRT_ADDR: the remote key says whether the peer addresses the
//    region by virtual address or by offset (ofi_rma.cpp);
//  - FI_MR_ALLOCATED: registrations always name allocated memory;
//  - FI_MR_HMEM (with FI_HMEM): device memory is registered with its
//    interface (FI_HMEM_CUDA, _ROCR, _ZE) and device, and every transfer
//    from or into it passes the registration's descriptor (ofi_data.cpp).
//    The core registers device buffers once per allocation (reg_mr of
//    WIA_MR_DEVICE, with a dma-buf fd that libfabric 1.17 cannot take:
//    registration is by address) and passes the registration with every
//    isend/irecv on it.
#include <cinttypes>

#include "ofi.hpp"

namespace wia::ofi {

namespace {

fi_hmem_iface hmem_iface(std::uint32_t iface) {
  switch (iface) {
    case WIA_MEM_IFACE_CUDA:
      return FI_HMEM_CUDA;
    case WIA_MEM_IFACE_ROCM:
      return FI_HMEM_ROCR;
    case WIA_MEM_IFACE_ZE:
      return FI_HMEM_ZE;
    default:
      return FI_HMEM_SYSTEM;
  }
}

const char* iface_name(std::uint32_t iface) {
  switch (iface) {
    case WIA_MEM_IFACE_CUDA:
      return "FI_HMEM_CUDA";
    case WIA_MEM_IFACE_ROCM:
      return "FI_HMEM_ROCR";
    case WIA_MEM_IFACE_ZE:
      return "FI_HMEM_ZE";
    default:
      return "FI_HMEM_SYSTEM";
  }
}

}  // namespace

wia_status_t Endpoint::reg(void* ptr, std::uint64_t size, std::uint32_t iface, std::uint64_t device,
                           MrEntry** out) {
  const auto base = reinterpret_cast<std::uintptr_t>(ptr);
  const auto key = std::make_tuple(base, size, iface, device);
  if (auto it = cache_.find(key); it != cache_.end()) {
    ++it->second->refs;
    *out = it->second;
    return WIA_SUCCESS;
  }
  auto e = std::make_unique<MrEntry>();
  e->base = base;
  e->len = size;
  e->iface = iface;
  e->device = device;
  e->refs = 1;
  fi_mr_attr attr{};
  iovec iov{ptr, static_cast<std::size_t>(size)};
  attr.mr_iov = &iov;
  attr.iov_count = 1;
  attr.access = FI_SEND | FI_RECV;
  if (info_->rma) attr.access |= FI_READ | FI_WRITE | FI_REMOTE_READ | FI_REMOTE_WRITE;
  attr.requested_key = mr_prov_key ? 0 : next_key++;
  attr.iface = hmem_iface(iface);
  switch (attr.iface) {
    case FI_HMEM_CUDA:
      attr.device.cuda = static_cast<int>(device);
      break;
    case FI_HMEM_ZE:
      // fi_hmem_ze_device(driver 0, device) of newer headers.
      attr.device.ze = static_cast<int>(device & 0xffff);
      break;
    default:  // ROCr names no device: the address identifies it
      break;
  }
  ++mr_reg_calls;
  ctx_->log(WIA_LOG_DEBUG,
            "ofi: fi_mr_reg(%p, %" PRIu64 " B, %s, device %" PRIu64
            ") on %s/%s, registration #%" PRIu64,
            ptr, size, iface_name(iface), device, info_->prov.c_str(), info_->domain.c_str(),
            mr_reg_calls);
  int rc = fi_mr_regattr(domain, &attr, 0, &e->mr);
  if (rc == 0 && mr_endpoint) {
    rc = fi_mr_bind(e->mr, &ep->fid, 0);
    if (rc == 0) rc = fi_mr_enable(e->mr);
  }
  if (rc != 0) {
    if (e->mr != nullptr) fi_close(&e->mr->fid);
    // FI_HMEM names no interface: a library built without this one refuses
    // the registration. NOT_SUPPORTED lets the core stage the buffer.
    const bool refused_iface = attr.iface != FI_HMEM_SYSTEM &&
                               (rc == -FI_ENOSYS || rc == -FI_EOPNOTSUPP || rc == -FI_ENODATA);
    return ctx_->fail(rc == -FI_ENOMEM ? WIA_ERROR_OUT_OF_MEMORY
                      : refused_iface  ? WIA_ERROR_NOT_SUPPORTED
                                       : WIA_ERROR_IO,
                      "ofi: fi_mr_reg(%p, %" PRIu64 " B, %s, device %" PRIu64 ") on %s/%s: %s%s",
                      ptr, size, iface_name(iface), device, info_->prov.c_str(),
                      info_->domain.c_str(), ctx_->fi_error(rc).c_str(),
                      refused_iface ? " (libfabric was built without this memory interface)" : "");
  }
  e->desc = fi_mr_desc(e->mr);
  MrEntry* raw = e.release();
  cache_[key] = raw;
  *out = raw;
  return WIA_SUCCESS;
}

void Endpoint::unreg(MrEntry* e) {
  if (--e->refs > 0) return;
  cache_.erase(std::make_tuple(e->base, e->len, e->iface, e->device));
  if (e->mr != nullptr) fi_close(&e->mr->fid);
  delete e;
}

}  // namespace wia::ofi
