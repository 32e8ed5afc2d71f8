// SPDX-License-Identifier: Apache-2.0
// The `ofi` transport provider: tagged messages over libfabric RDM
// endpoints (docs/transport-ofi.md).
//
//  - libfabric is opened with dlopen at init (ofi_setup.cpp), so the .so
//    loads on machines without it and is then recorded as absent.
//  - Endpoints are the (fabric provider, domain) pairs fi_getinfo offers
//    with FI_EP_RDM, FI_TAGGED and FI_ORDER_SAS, filtered by ofi.provider
//    (or FI_PROVIDER) and ofi.domain; every result gets a verdict in the
//    log (taken, or why not).
//  - One RDM endpoint, AV and CQ per wia endpoint; a wia connection is a
//    pair of connection ids carried in the wire tag (ofi_conn.cpp).
//  - No threads: progress is driven from connect/accept/isend/irecv/test.
//  - Device memory where the fabric claims FI_HMEM: registered with its
//    interface and device, moved by the fabric only (ofi_mr.cpp,
//    ofi_data.cpp; docs/transport-ofi.md, "Device memory").
//  - By default (ofi.enable: auto) the provider is absent unless the
//    machine has an RDMA device or a fabric provider is named: on a
//    machine without one, tcp and shm are the transports and fi_getinfo
//    (about 0.4 s here) is not paid by every process.
#include <dirent.h>
#include <wia/provider.h>

#include <algorithm>
#include <cinttypes>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <new>

#include "ofi.hpp"
#include "wia_common/host_messages.hpp"
#include "wia_common/text.hpp"

#ifndef WIA_OFI_VERSION
#define WIA_OFI_VERSION "0.0.0"
#endif

namespace wia::ofi {

void Ctx::log(wia_log_level_t level, const char* fmt, ...) const {
  va_list ap;
  va_start(ap, fmt);
  common::host_vlog(host, level, fmt, ap);
  va_end(ap);
}

wia_status_t Ctx::fail(wia_status_t status, const char* fmt, ...) const {
  va_list ap;
  va_start(ap, fmt);
  common::host_verror(host, fmt, ap);
  va_end(ap);
  return status;
}

std::string Ctx::fi_error(int rc) const {
  const int err = rc < 0 ? -rc : rc;
  const char* text = lib.fi_strerror != nullptr ? lib.fi_strerror(err) : nullptr;
  return std::string(text != nullptr ? text : "unknown error") + " (-" + std::to_string(err) + ")";
}

namespace {

const char* param(const wia_host_services_v1_t* host, const char* key, const char* fallback) {
  const char* v = host->get_param != nullptr ? host->get_param(host->host_ctx, key) : nullptr;
  return v != nullptr ? v : fallback;
}

template <typename Fn>
wia_status_t guarded(void* ctx, const char* what, Fn&& fn) noexcept {
  auto* c = static_cast<Ctx*>(ctx);
  if (c == nullptr) return WIA_ERROR_NOT_INITIALIZED;
  try {
    return fn(*c);
  } catch (const std::bad_alloc&) {
    return c->fail(WIA_ERROR_OUT_OF_MEMORY, "ofi: %s: out of memory", what);
  } catch (const std::exception& e) {
    return c->fail(WIA_ERROR_INTERNAL, "ofi: %s: %s", what, e.what());
  } catch (...) {
    return c->fail(WIA_ERROR_INTERNAL, "ofi: %s: unknown exception", what);
  }
}

// An RDMA device the fabric providers may drive (verbs, efa, opa, ...:
// /sys/class/infiniband; HPE Slingshot: /sys/class/cxi).
bool rdma_device_present() {
  for (const char* dir : {"/sys/class/infiniband", "/sys/class/cxi"}) {
    DIR* d = ::opendir(dir);
    if (d == nullptr) continue;
    bool any = false;
    while (dirent* e = ::readdir(d))
      if (e->d_name[0] != '.') any = true;
    ::closedir(d);
    if (any) return true;
  }
  return false;
}

void free_ctx(Ctx* ctx) {
  for (EndpointInfo& e : ctx->endpoints) {
    e.open.reset();
    if (e.info != nullptr && ctx->lib.fi_freeinfo != nullptr) ctx->lib.fi_freeinfo(e.info);
  }
  // libfabric stays loaded: its providers keep process-wide state that a
  // later init (L0.init_again, a second wia_init) reuses.
  delete ctx;
}

wia_status_t init(const wia_host_services_v1_t* host, void** out) {
  if (host == nullptr || out == nullptr) return WIA_ERROR_INVALID_ARGUMENT;
  if (host->abi_version < WIA_HOST_SERVICES_VERSION ||
      !WIA_ABI_HAS_FIELD(wia_host_services_v1_t, host->struct_size, clock_ns))
    return WIA_ERROR_ABI_MISMATCH;
  Ctx* raw = nullptr;
  try {
    auto ctx = std::make_unique<Ctx>();
    ctx->host = host;
    Params& p = ctx->params;
    p.enable = param(host, "enable", "auto");
    p.provider = param(host, "provider", "");
    p.domain = param(host, "domain", "");
    p.inter_node = param(host, "inter_node", "rdma");
    p.library = param(host, "library", "libfabric.so.1");
    common::parse_size(param(host, "max_message", "0"), &p.max_message);
    p.connect_timeout_ms = std::atoll(param(host, "connect_timeout_ms", "30000"));
    p.liveness_ms = std::atoll(param(host, "liveness_ms", "100"));
    p.rendezvous = param(host, "rendezvous", "auto");
    p.hmem = param(host, "hmem", "auto");
    if (p.enable != "auto" && p.enable != "on" && p.enable != "off")
      return ctx->fail(WIA_ERROR_CONFIG, "ofi.enable is '%s'; expected auto, on or off",
                       p.enable.c_str());
    if (p.inter_node != "rdma" && p.inter_node != "all")
      return ctx->fail(WIA_ERROR_CONFIG, "ofi.inter_node is '%s'; expected rdma or all",
                       p.inter_node.c_str());
    if (p.rendezvous != "auto" && p.rendezvous != "on" && p.rendezvous != "off")
      return ctx->fail(WIA_ERROR_CONFIG, "ofi.rendezvous is '%s'; expected auto, on or off",
                       p.rendezvous.c_str());
    if (p.hmem != "auto" && p.hmem != "on" && p.hmem != "off")
      return ctx->fail(WIA_ERROR_CONFIG, "ofi.hmem is '%s'; expected auto, on or off",
                       p.hmem.c_str());
    if (p.enable == "off")
      return ctx->fail(WIA_ERROR_UNAVAILABLE, "ofi: disabled by ofi.enable: off");
    const char* env = std::getenv("FI_PROVIDER");
    const bool named = !p.provider.empty() || !p.domain.empty() || (env != nullptr && *env);
    if (p.enable == "auto" && !named && !rdma_device_present())
      return ctx->fail(WIA_ERROR_UNAVAILABLE,
                       "ofi: no RDMA device (/sys/class/infiniband and /sys/class/cxi are empty) "
                       "and no fabric provider named: set ofi.provider (WIA_OFI_PROVIDER), e.g. "
                       "\"tcp;ofi_rxm\" or \"shm\", or ofi.enable: on");
    wia_status_t st = load_library(*ctx);
    if (st == WIA_SUCCESS) st = discover(*ctx);
    raw = ctx.release();
    if (st != WIA_SUCCESS) {
      free_ctx(raw);
      return st;
    }
    *out = raw;
    return WIA_SUCCESS;
  } catch (const std::bad_alloc&) {
    if (raw != nullptr) free_ctx(raw);
    return WIA_ERROR_OUT_OF_MEMORY;
  } catch (...) {
    if (raw != nullptr) free_ctx(raw);
    return WIA_ERROR_INTERNAL;
  }
}

wia_status_t fini(void* ctx) {
  free_ctx(static_cast<Ctx*>(ctx));
  return WIA_SUCCESS;
}

// --- transport entries ------------------------------------------------------------

wia_status_t endpoint_count(void* ctx, int32_t* count) {
  return guarded(ctx, "endpoint_count", [&](Ctx& c) -> wia_status_t {
    if (count == nullptr) return c.fail(WIA_ERROR_INVALID_ARGUMENT, "ofi: endpoint_count: NULL");
    *count = static_cast<int32_t>(c.endpoints.size());
    return WIA_SUCCESS;
  });
}

wia_status_t endpoint_props(void* ctx, int32_t endpoint, wia_transport_props_v1_t* props) {
  return guarded(ctx, "endpoint_props", [&](Ctx& c) -> wia_status_t {
    if (props == nullptr) return c.fail(WIA_ERROR_INVALID_ARGUMENT, "ofi: endpoint_props: NULL");
    if (endpoint < 0 || static_cast<std::size_t>(endpoint) >= c.endpoints.size())
      return c.fail(WIA_ERROR_INVALID_ARGUMENT, "ofi: endpoint %d does not exist (%zu endpoints)",
                    endpoint, c.endpoints.size());
    const EndpointInfo& e = c.endpoints[static_cast<std::size_t>(endpoint)];
    wia_transport_props_v1_t full{};
    full.struct_size = props->struct_size;
    full.flags = e.flags;
    // "<fabric provider>/<domain>": what wia-info and the logs show.
    std::snprintf(full.name, sizeof(full.name), "%s/%s", e.prov.c_str(), e.domain.c_str());
    std::snprintf(full.pci_bus_id, sizeof(full.pci_bus_id), "%s", e.pci_bus_id.c_str());
    full.speed_mbps = e.speed_mbps;
    full.latency_us = e.shm ? 1.0 : e.sockets ? 20.0 : 2.0;
    full.max_message_size = e.max_msg;
    const fi_info* i = e.info;
    full.max_requests = static_cast<std::uint32_t>(
        std::min<std::size_t>({i->tx_attr->size, i->rx_attr->size, std::size_t{1} << 20}));
    full.numa_node = -1;
    full.tag_bits = kUserTagBits;
    full.mem_ifaces = 1u << WIA_MEM_IFACE_HOST;
    // FI_HMEM names no interface: which of CUDA, ROCr and Level Zero the
    // library was built with shows only when a registration is refused,
    // which reg_mr reports as WIA_ERROR_NOT_SUPPORTED (the core then stages).
    if (e.hmem)
      full.mem_ifaces |=
          (1u << WIA_MEM_IFACE_CUDA) | (1u << WIA_MEM_IFACE_ROCM) | (1u << WIA_MEM_IFACE_ZE);
    std::memcpy(props, &full, std::min<std::size_t>(props->struct_size, sizeof(full)));
    return WIA_SUCCESS;
  });
}

wia_status_t listen_(void* ctx, int32_t endpoint, void* handle, wia_listener_t* listener) {
  return guarded(ctx, "listen", [&](Ctx& c) -> wia_status_t {
    if (handle == nullptr || listener == nullptr)
      return c.fail(WIA_ERROR_INVALID_ARGUMENT, "ofi: listen: NULL handle or listener");
    Endpoint* ep = nullptr;
    wia_status_t st = c.endpoint(endpoint, &ep);
    if (st != WIA_SUCCESS) return st;
    std::lock_guard<std::mutex> lk(ep->mu);
    Listener* l = nullptr;
    st = ep->listen(handle, &l);
    if (st == WIA_SUCCESS) *listener = reinterpret_cast<wia_listener_t>(l);
    return st;
  });
}

wia_status_t connect_(void* ctx, int32_t endpoint, const void* handle, uint64_t cookie,
                      wia_conn_t* conn) {
  return guarded(ctx, "connect", [&](Ctx& c) -> wia_status_t {
    if (handle == nullptr || conn == nullptr)
      return c.fail(WIA_ERROR_INVALID_ARGUMENT, "ofi: connect: NULL handle or conn");
    if (*conn != nullptr) {
      Conn* cc = reinterpret_cast<Conn*>(*conn);
      Endpoint* ep = cc->ep();
      std::lock_guard<std::mutex> lk(ep->mu);
      const wia_status_t st = ep->continue_connect(cc);
      if (st < 0) {
        ep->close(cc);
        *conn = nullptr;
      }
      return st;
    }
    Endpoint* ep = nullptr;
    wia_status_t st = c.endpoint(endpoint, &ep);
    if (st != WIA_SUCCESS) return st;
    std::lock_guard<std::mutex> lk(ep->mu);
    Conn* cc = nullptr;
    st = ep->connect(handle, cookie, &cc);
    if (st < 0 && cc != nullptr) {
      ep->close(cc);
      cc = nullptr;
    }
    *conn = reinterpret_cast<wia_conn_t>(cc);
    return st;
  });
}

wia_status_t accept_(void* ctx, wia_listener_t listener, uint64_t* cookie, wia_conn_t* conn) {
  return guarded(ctx, "accept", [&](Ctx& c) -> wia_status_t {
    if (listener == nullptr || cookie == nullptr || conn == nullptr)
      return c.fail(WIA_ERROR_INVALID_ARGUMENT, "ofi: accept: NULL argument");
    auto* l = reinterpret_cast<Listener*>(listener);
    std::lock_guard<std::mutex> lk(l->ep->mu);
    Conn* cc = nullptr;
    const wia_status_t st = l->ep->accept(l, cookie, &cc);
    *conn = reinterpret_cast<wia_conn_t>(cc);
    return st;
  });
}

wia_status_t close_listener(void* ctx, wia_listener_t listener) {
  return guarded(ctx, "close_listener", [&](Ctx& c) -> wia_status_t {
    if (listener == nullptr)
      return c.fail(WIA_ERROR_INVALID_HANDLE, "ofi: close_listener: NULL listener");
    auto* l = reinterpret_cast<Listener*>(listener);
    Endpoint* ep = l->ep;
    std::lock_guard<std::mutex> lk(ep->mu);
    ep->close_listener(l);
    return WIA_SUCCESS;
  });
}

wia_status_t reg_mr(void* ctx, int32_t endpoint, const wia_mr_desc_v1_t* desc, wia_mr_t* mr) {
  return guarded(ctx, "reg_mr", [&](Ctx& c) -> wia_status_t {
    if (desc == nullptr || mr == nullptr)
      return c.fail(WIA_ERROR_INVALID_ARGUMENT, "ofi: reg_mr: NULL argument");
    if (!WIA_ABI_HAS_FIELD(wia_mr_desc_v1_t, desc->struct_size, size))
      return c.fail(WIA_ERROR_INVALID_ARGUMENT, "ofi: reg_mr: descriptor of %u bytes is too short",
                    desc->struct_size);
    const std::uint32_t iface = WIA_ABI_HAS_FIELD(wia_mr_desc_v1_t, desc->struct_size, iface)
                                    ? desc->iface
                                    : WIA_MEM_IFACE_HOST;
    if (desc->kind != WIA_MR_HOST && desc->kind != WIA_MR_DEVICE)
      return c.fail(WIA_ERROR_INVALID_ARGUMENT, "ofi: reg_mr: unknown memory kind %u", desc->kind);
    Endpoint* ep = nullptr;
    wia_status_t st = c.endpoint(endpoint, &ep);
    if (st != WIA_SUCCESS) return st;
    // Device memory needs a fabric that claimed FI_HMEM (fi_mr_regattr
    // with the device's interface, ofi_mr.cpp).
    // WIA_MR_DEVICE with WIA_MEM_IFACE_HOST is memory of a host-accessible
    // device: host memory to the fabric.
    const bool device = iface != WIA_MEM_IFACE_HOST;
    if (device && !ep->info().hmem)
      return c.fail(WIA_ERROR_NOT_SUPPORTED,
                    "ofi: cannot register device memory (memory interface %u) on %s/%s: the "
                    "fabric does not claim FI_HMEM%s; stage through a host buffer",
                    iface, ep->info().prov.c_str(), ep->info().domain.c_str(),
                    c.params.hmem == "off" ? " (ofi.hmem: off)" : "");
    if (device && iface != WIA_MEM_IFACE_CUDA && iface != WIA_MEM_IFACE_ROCM &&
        iface != WIA_MEM_IFACE_ZE)
      return c.fail(WIA_ERROR_INVALID_ARGUMENT,
                    "ofi: reg_mr of device memory with memory interface %u (expected CUDA %u, "
                    "ROCm %u or Level Zero %u)",
                    iface, WIA_MEM_IFACE_CUDA, WIA_MEM_IFACE_ROCM, WIA_MEM_IFACE_ZE);
    const std::uint64_t device_id =
        device && WIA_ABI_HAS_FIELD(wia_mr_desc_v1_t, desc->struct_size, device_id)
            ? desc->device_id
            : 0;
    if (desc->ptr == nullptr && desc->size > 0)
      return c.fail(WIA_ERROR_INVALID_ARGUMENT, "ofi: reg_mr of %" PRIu64 " bytes at NULL",
                    desc->size);
    std::lock_guard<std::mutex> lk(ep->mu);
    MrEntry* e = nullptr;
    st = ep->reg(desc->ptr, desc->size, iface, device_id, &e);
    if (st != WIA_SUCCESS) return st;
    *mr = reinterpret_cast<wia_mr_t>(new MrHandle{ep, e});
    return WIA_SUCCESS;
  });
}

wia_status_t dereg_mr(void* ctx, wia_mr_t mr) {
  return guarded(ctx, "dereg_mr", [&](Ctx& c) -> wia_status_t {
    if (mr == nullptr) return c.fail(WIA_ERROR_INVALID_HANDLE, "ofi: dereg_mr: NULL region");
    auto* h = reinterpret_cast<MrHandle*>(mr);
    {
      std::lock_guard<std::mutex> lk(h->ep->mu);
      h->ep->unreg(h->entry);
    }
    delete h;
    return WIA_SUCCESS;
  });
}

wia_status_t post(void* ctx, const char* what, bool send, wia_conn_t conn, void* buf, uint64_t size,
                  uint64_t tag, wia_mr_t mr, wia_request_t* request) {
  return guarded(ctx, what, [&](Ctx& c) -> wia_status_t {
    if (conn == nullptr || request == nullptr)
      return c.fail(WIA_ERROR_INVALID_ARGUMENT, "ofi: %s: NULL connection or request", what);
    auto* cc = reinterpret_cast<Conn*>(conn);
    std::lock_guard<std::mutex> lk(cc->ep()->mu);
    return cc->ep()->post(cc, send, buf, size, tag, reinterpret_cast<MrHandle*>(mr), request);
  });
}

wia_status_t isend(void* ctx, wia_conn_t conn, const void* buf, uint64_t size, uint64_t tag,
                   wia_mr_t mr, wia_request_t* request) {
  return post(ctx, "isend", true, conn, const_cast<void*>(buf), size, tag, mr, request);
}

wia_status_t irecv(void* ctx, wia_conn_t conn, void* buf, uint64_t size, uint64_t tag, wia_mr_t mr,
                   wia_request_t* request) {
  return post(ctx, "irecv", false, conn, buf, size, tag, mr, request);
}

wia_status_t mr_rkey(void* ctx, wia_mr_t mr, void* rkey) {
  return guarded(ctx, "mr_rkey", [&](Ctx& c) -> wia_status_t {
    if (mr == nullptr || rkey == nullptr)
      return c.fail(WIA_ERROR_INVALID_ARGUMENT, "ofi: mr_rkey: NULL region or key");
    auto* h = reinterpret_cast<MrHandle*>(mr);
    WireRkey k{};
    std::lock_guard<std::mutex> lk(h->ep->mu);
    const wia_status_t st = h->ep->rkey(h, &k);
    if (st != WIA_SUCCESS) return st;
    std::memset(rkey, 0, WIA_RKEY_SIZE);
    std::memcpy(rkey, &k, sizeof(k));
    return WIA_SUCCESS;
  });
}

wia_status_t rma(void* ctx, const char* what, bool write, wia_conn_t conn, void* local,
                 uint64_t size, wia_mr_t mr, uint64_t remote_addr, const void* rkey,
                 wia_request_t* request) {
  return guarded(ctx, what, [&](Ctx& c) -> wia_status_t {
    if (conn == nullptr || rkey == nullptr || request == nullptr)
      return c.fail(WIA_ERROR_INVALID_ARGUMENT, "ofi: %s: NULL connection, key or request", what);
    WireRkey k;
    std::memcpy(&k, rkey, sizeof(k));
    auto* cc = reinterpret_cast<Conn*>(conn);
    std::lock_guard<std::mutex> lk(cc->ep()->mu);
    return cc->ep()->rma(cc, write, local, size, reinterpret_cast<MrHandle*>(mr), remote_addr, k,
                         request);
  });
}

wia_status_t put(void* ctx, wia_conn_t conn, const void* local, uint64_t size, wia_mr_t mr,
                 uint64_t remote_addr, const void* rkey, wia_request_t* request) {
  return rma(ctx, "put", true, conn, const_cast<void*>(local), size, mr, remote_addr, rkey,
             request);
}

wia_status_t get(void* ctx, wia_conn_t conn, void* local, uint64_t size, wia_mr_t mr,
                 uint64_t remote_addr, const void* rkey, wia_request_t* request) {
  return rma(ctx, "get", false, conn, local, size, mr, remote_addr, rkey, request);
}

wia_status_t test(void* ctx, wia_request_t request, int32_t* done, uint64_t* size) {
  return guarded(ctx, "test", [&](Ctx& c) -> wia_status_t {
    if (request == nullptr || done == nullptr)
      return c.fail(WIA_ERROR_INVALID_ARGUMENT, "ofi: test: NULL request or done");
    auto* r = reinterpret_cast<Request*>(request);
    if (r->conn == nullptr)
      return c.fail(WIA_ERROR_INVALID_HANDLE, "ofi: test of a request of a closed connection");
    Endpoint* ep = r->conn->ep();
    std::lock_guard<std::mutex> lk(ep->mu);
    return ep->test(r, done, size);
  });
}

wia_status_t wait_fds(void* ctx, wia_conn_t conn, pollfd* fds, std::uint32_t capacity,
                      std::uint32_t* count) {
  return guarded(ctx, "wait_fds", [&](Ctx& c) -> wia_status_t {
    if (conn == nullptr || count == nullptr || (fds == nullptr && capacity > 0))
      return c.fail(WIA_ERROR_INVALID_ARGUMENT, "ofi: wait_fds: NULL connection, fds or count");
    auto* cc = reinterpret_cast<Conn*>(conn);
    std::lock_guard<std::mutex> lk(cc->ep()->mu);
    return cc->ep()->wait_fds(cc, fds, capacity, count);
  });
}

wia_status_t close_(void* ctx, wia_conn_t conn) {
  return guarded(ctx, "close", [&](Ctx& c) -> wia_status_t {
    if (conn == nullptr) return c.fail(WIA_ERROR_INVALID_HANDLE, "ofi: close: NULL connection");
    auto* cc = reinterpret_cast<Conn*>(conn);
    Endpoint* ep = cc->ep();
    std::lock_guard<std::mutex> lk(ep->mu);
    ep->close(cc);
    return WIA_SUCCESS;
  });
}

// --- descriptor ----------------------------------------------------------------------

constexpr std::uint32_t kDeclSize = sizeof(wia_param_decl_v1_t);

const wia_param_decl_v1_t kParams[] = {
    {kDeclSize, WIA_PARAM_STRING, "enable", "auto",
     "auto: load when an RDMA device is present or a fabric provider is named; on; off", 0, 0},
    {kDeclSize, WIA_PARAM_STRING, "provider", "",
     "fabric providers to use, FI_PROVIDER syntax (\"tcp;ofi_rxm\", \"shm\", \"verbs;ofi_rxm\"); "
     "empty: FI_PROVIDER, else every one fi_getinfo offers",
     0, 0},
    {kDeclSize, WIA_PARAM_STRING, "domain", "",
     "fabric domain to use (\"mlx5_0\", \"eth0\"); empty: all", 0, 0},
    {kDeclSize, WIA_PARAM_STRING, "inter_node", "rdma",
     "rdma: only RDMA fabrics claim to reach other nodes (the default rules then keep tcp on "
     "Ethernet); all: sockets fabrics (tcp;ofi_rxm, udp) too",
     0, 0},
    {kDeclSize, WIA_PARAM_STRING, "library", "libfabric.so.1", "libfabric to dlopen", 0, 0},
    {kDeclSize, WIA_PARAM_SIZE, "max_message", "0",
     "largest message sent; 0: the fabric's max_msg_size", 0, 1ll << 50},
    {kDeclSize, WIA_PARAM_INT, "connect_timeout_ms", "30000",
     "connect() gives up with WIA_ERROR_TIMEOUT after this long", 10, 3600000},
    {kDeclSize, WIA_PARAM_INT, "liveness_ms", "100",
     "how often a connection with pending requests checks that a peer on this host still runs", 1,
     60000},
    {kDeclSize, WIA_PARAM_STRING, "rendezvous", "auto",
     "payloads above 4 KiB wait for the receiver's clear-to-send: auto (shm fabrics, whose 1.17 "
     "command queue stalls on an unexpected large message), on, off",
     0, 0},
    {kDeclSize, WIA_PARAM_STRING, "hmem", "auto",
     "auto: ask fi_getinfo for FI_HMEM and take device memory (CUDA, ROCm, Level Zero) on "
     "fabrics that claim it, shm excepted (FI_HMEM turns off its single-copy path); on: shm "
     "too; off: never (device buffers are staged through host memory)",
     0, 0},
};

const wia_transport_ops_v1_t kTransportOps = {
    .struct_size = sizeof(wia_transport_ops_v1_t),
    .abi_version = WIA_PROVIDER_ABI_VERSION,
    .caps = WIA_TRANSPORT_CAP_RMA | WIA_TRANSPORT_CAP_WAIT_FD,
    .must_understand = 0,
    .endpoint_count = endpoint_count,
    .endpoint_props = endpoint_props,
    .listen = listen_,
    .connect = connect_,
    .accept = accept_,
    .close_listener = close_listener,
    .reg_mr = reg_mr,
    .dereg_mr = dereg_mr,
    .isend = isend,
    .irecv = irecv,
    .test = test,
    .close = close_,
    .mr_rkey = mr_rkey,
    .put = put,
    .get = get,
    .send_inline = nullptr,
    .recv_inline = nullptr,
    .wait_fds = wait_fds,
};

}  // namespace
}  // namespace wia::ofi

extern "C" {
WIA_PROVIDER_EXPORT extern const wia_provider_v1_t wia_provider_v1;
const wia_provider_v1_t wia_provider_v1 = {
    .struct_size = sizeof(wia_provider_v1_t),
    .abi_version = WIA_PROVIDER_ABI_VERSION,
    .name = "ofi",
    .version = WIA_OFI_VERSION,
    .caps = WIA_PROVIDER_CAP_TRANSPORT,
    .host_services_version = WIA_HOST_SERVICES_VERSION,
    .num_params = sizeof(wia::ofi::kParams) / sizeof(wia::ofi::kParams[0]),
    .params = wia::ofi::kParams,
    .init = wia::ofi::init,
    .fini = wia::ofi::fini,
    .device = nullptr,
    .transport = &wia::ofi::kTransportOps,
};
}
