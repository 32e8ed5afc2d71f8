// SPDX-License-Identifier: Apache-2.0
// The `verbs` transport provider: tagged messages over libibverbs RC queue
// pairs (docs/transport-verbs.md).
//
//  - libibverbs.so.1 is opened with dlopen at init and its functions
//    resolved with dlvsym (verbs_setup.cpp), so the .so loads everywhere;
//    without an RDMA device init is WIA_ERROR_UNAVAILABLE "no RDMA device".
//  - One endpoint: the device and port chosen by verbs.device/verbs.port.
//    One PD, one CQ with a completion channel (the wait fd), one shared
//    receive queue of 8 KiB slots for every connection.
//  - A connection is an RC QP per peer, set up through a TCP handshake
//    whose address is in the connection handle (verbs_conn.cpp).
//  - Messages up to 8 KiB - 48 B go eagerly (inline when they fit the
//    QP's inline size) and are matched by tag on arrival; larger ones by
//    rendezvous: RTS, CTS with the receive buffer's rkey, one RDMA write
//    with immediate (verbs_data.cpp).
//  - Device memory (dma-buf registrations) is never touched by the CPU:
//    an eager message for a device receive is written in by the NIC on a
//    loopback QP (connected to itself), which also flushes every device
//    receive with a 1-byte RDMA read before it completes.
//  - No threads: progress is driven from isend/irecv/test/wait_fds.
#include <wia/provider.h>

#include <cinttypes>
#include <cstdarg>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <new>

#include "verbs.hpp"
#include "wia_common/host_messages.hpp"

#ifndef WIA_VERBS_VERSION
#define WIA_VERBS_VERSION "0.0.0"
#endif

namespace wia::verbs {

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
    std::lock_guard<std::mutex> lk(c->mu);
    return fn(*c);
  } catch (const std::bad_alloc&) {
    return c->fail(WIA_ERROR_OUT_OF_MEMORY, "verbs: %s: out of memory", what);
  } catch (const std::exception& e) {
    return c->fail(WIA_ERROR_INTERNAL, "verbs: %s: %s", what, e.what());
  } catch (...) {
    return c->fail(WIA_ERROR_INTERNAL, "verbs: %s: unknown exception", what);
  }
}

void free_ctx(Ctx* c) {
  c->close_device();
  // libibverbs stays loaded: its providers keep process-wide state that a
  // later init reuses (as libfabric's do for ofi).
  delete c;
}

bool parse_int(const char* text, long lo, long hi, long* out) {
  char* end = nullptr;
  errno = 0;
  const long v = std::strtol(text, &end, 10);
  if (errno != 0 || end == text || *end != '\0' || v < lo || v > hi) return false;
  *out = v;
  return true;
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
    p.device = param(host, "device", "");
    p.library = param(host, "library", "libibverbs.so.1");
    p.ifname = param(host, "ifname", "");
    const std::string dmabuf = param(host, "dmabuf", "true");
    if (dmabuf != "true" && dmabuf != "false" && dmabuf != "1" && dmabuf != "0")
      return ctx->fail(WIA_ERROR_CONFIG, "verbs: dmabuf '%s' is not true or false", dmabuf.c_str());
    p.claim_dmabuf = dmabuf == "true" || dmabuf == "1";
    const std::string gdr_flush = param(host, "gdr_flush", "true");
    if (gdr_flush != "true" && gdr_flush != "false" && gdr_flush != "1" && gdr_flush != "0")
      return ctx->fail(WIA_ERROR_CONFIG, "verbs: gdr_flush '%s' is not true or false",
                       gdr_flush.c_str());
    p.gdr_flush = gdr_flush == "true" || gdr_flush == "1";
    struct {
      const char* key;
      const char* fallback;
      long lo, hi;
      long* to;
    } ints[] = {{"port", "0", 0, 255, nullptr},
                {"gid_index", "-1", -1, 255, nullptr},
                {"connect_timeout_ms", "30000", 10, 3600000, nullptr}};
    long values[3] = {};
    for (int i = 0; i < 3; ++i) {
      const char* text = param(host, ints[i].key, ints[i].fallback);
      if (!parse_int(text, ints[i].lo, ints[i].hi, &values[i]))
        return ctx->fail(WIA_ERROR_CONFIG, "verbs: %s '%s' is not an integer in %ld..%ld",
                         ints[i].key, text, ints[i].lo, ints[i].hi);
    }
    p.port = static_cast<int>(values[0]);
    p.gid_index = static_cast<int>(values[1]);
    p.connect_timeout_ms = values[2];
    wia_status_t st = ctx->load_library();
    if (st == WIA_SUCCESS) st = ctx->open_device();
    if (st != WIA_SUCCESS) {
      free_ctx(ctx.release());
      return st;
    }
    raw = ctx.release();
  } catch (const std::bad_alloc&) {
    return WIA_ERROR_OUT_OF_MEMORY;
  }
  *out = raw;
  return WIA_SUCCESS;
}

wia_status_t fini(void* ctx) {
  if (ctx == nullptr) return WIA_ERROR_NOT_INITIALIZED;
  auto* c = static_cast<Ctx*>(ctx);
  while (!c->conns.empty()) c->close(*c->conns.begin());
  free_ctx(c);
  return WIA_SUCCESS;
}

// --- transport entries -----------------------------------------------------------------

wia_status_t endpoint_count(void* ctx, int32_t* count) {
  return guarded(ctx, "endpoint_count", [&](Ctx& c) -> wia_status_t {
    if (count == nullptr) return c.fail(WIA_ERROR_INVALID_ARGUMENT, "verbs: NULL count");
    *count = 1;
    return WIA_SUCCESS;
  });
}

wia_status_t check_endpoint(Ctx& c, int32_t endpoint, const char* what) {
  if (endpoint == 0) return WIA_SUCCESS;
  return c.fail(WIA_ERROR_INVALID_DEVICE, "verbs: %s: no endpoint %d (this provider has 1: %s:%u)",
                what, endpoint, c.dev_name.c_str(), c.port);
}

wia_status_t endpoint_props(void* ctx, int32_t endpoint, wia_transport_props_v1_t* props) {
  return guarded(ctx, "endpoint_props", [&](Ctx& c) -> wia_status_t {
    if (props == nullptr) return c.fail(WIA_ERROR_INVALID_ARGUMENT, "verbs: NULL props");
    const wia_status_t st = check_endpoint(c, endpoint, "endpoint_props");
    if (st != WIA_SUCCESS) return st;
    wia_transport_props_v1_t p{};
    p.struct_size = sizeof p;
    p.flags =
        WIA_TRANSPORT_FLAG_INTER_NODE | WIA_TRANSPORT_FLAG_INTRA_NODE | WIA_TRANSPORT_FLAG_RMA;
    std::snprintf(p.name, sizeof p.name, "%s:%u", c.dev_name.c_str(), c.port);
    // ibv_port_attr: active_width 1/2/4/8/16 = 1x/4x/8x/12x/2x lanes,
    // active_speed the per-lane rate (IBTA encoding).
    static const struct {
      int code;
      std::uint64_t mbps;
    } speeds[] = {{1, 2500},   {2, 5000},   {4, 10000},  {8, 10312},
                  {16, 14062}, {32, 25781}, {64, 53125}, {128, 106250}};
    static const struct {
      int code;
      std::uint64_t lanes;
    } widths[] = {{1, 1}, {2, 4}, {4, 8}, {8, 12}, {16, 2}};
    for (const auto& s : speeds)
      for (const auto& w : widths)
        if (s.code == c.port_attr.active_speed && w.code == c.port_attr.active_width)
          p.speed_mbps = s.mbps * w.lanes;
    p.latency_us = 2.0;
    p.max_message_size = c.port_attr.max_msg_sz;
    p.max_requests = 65536;
    p.numa_node = -1;
    p.tag_bits = 64;
    p.mem_ifaces = 1u << WIA_MEM_IFACE_HOST;
    // A dma-buf is vendor-neutral: with ibv_reg_dmabuf_mr any accelerator
    // that exports one can be registered. The core gives a transport that
    // claims FLAG_DMABUF device memory only with such a registration
    // (runtime/dmabuf_registrations.hpp); verbs.dmabuf: false turns the
    // claim off, and device buffers are then staged (docs/transport-verbs.md).
    if (c.lib.reg_dmabuf_mr != nullptr && c.params.claim_dmabuf) {
      p.flags |= WIA_TRANSPORT_FLAG_DEVICE_MEMORY | WIA_TRANSPORT_FLAG_DMABUF;
      p.mem_ifaces |=
          (1u << WIA_MEM_IFACE_CUDA) | (1u << WIA_MEM_IFACE_ROCM) | (1u << WIA_MEM_IFACE_ZE);
    }
    std::memcpy(props, &p, std::min<std::size_t>(props->struct_size, sizeof p));
    props->struct_size = std::min<std::uint32_t>(props->struct_size, sizeof p);
    return WIA_SUCCESS;
  });
}

wia_status_t listen_(void* ctx, int32_t endpoint, void* handle, wia_listener_t* listener) {
  return guarded(ctx, "listen", [&](Ctx& c) -> wia_status_t {
    if (handle == nullptr || listener == nullptr)
      return c.fail(WIA_ERROR_INVALID_ARGUMENT, "verbs: listen: NULL handle or listener");
    wia_status_t st = check_endpoint(c, endpoint, "listen");
    if (st != WIA_SUCCESS) return st;
    Listener* l = nullptr;
    st = c.listen(handle, &l);
    if (st == WIA_SUCCESS) *listener = reinterpret_cast<wia_listener_t>(l);
    return st;
  });
}

wia_status_t connect_(void* ctx, int32_t endpoint, const void* handle, uint64_t cookie,
                      wia_conn_t* conn) {
  return guarded(ctx, "connect", [&](Ctx& c) -> wia_status_t {
    if (handle == nullptr || conn == nullptr)
      return c.fail(WIA_ERROR_INVALID_ARGUMENT, "verbs: connect: NULL handle or connection");
    const wia_status_t st = check_endpoint(c, endpoint, "connect");
    if (st != WIA_SUCCESS) return st;
    Conn* cc = reinterpret_cast<Conn*>(*conn);
    const wia_status_t r = c.connect(handle, cookie, &cc);
    if (r < 0 && cc != nullptr) {  // a failed attempt leaves nothing behind
      c.close(cc);
      cc = nullptr;
    }
    *conn = reinterpret_cast<wia_conn_t>(cc);
    return r;
  });
}

wia_status_t accept_(void* ctx, wia_listener_t listener, uint64_t* cookie, wia_conn_t* conn) {
  return guarded(ctx, "accept", [&](Ctx& c) -> wia_status_t {
    if (listener == nullptr || cookie == nullptr || conn == nullptr)
      return c.fail(WIA_ERROR_INVALID_ARGUMENT, "verbs: accept: NULL listener, cookie or conn");
    Conn* cc = nullptr;
    const wia_status_t st = c.accept(reinterpret_cast<Listener*>(listener), cookie, &cc);
    *conn = reinterpret_cast<wia_conn_t>(cc);
    return st;
  });
}

wia_status_t close_listener(void* ctx, wia_listener_t listener) {
  return guarded(ctx, "close_listener", [&](Ctx& c) -> wia_status_t {
    if (listener == nullptr)
      return c.fail(WIA_ERROR_INVALID_HANDLE, "verbs: close_listener: NULL listener");
    c.close_listener(reinterpret_cast<Listener*>(listener));
    return WIA_SUCCESS;
  });
}

wia_status_t reg_mr(void* ctx, int32_t endpoint, const wia_mr_desc_v1_t* desc, wia_mr_t* mr) {
  return guarded(ctx, "reg_mr", [&](Ctx& c) -> wia_status_t {
    if (desc == nullptr || mr == nullptr)
      return c.fail(WIA_ERROR_INVALID_ARGUMENT, "verbs: reg_mr: NULL descriptor or region");
    wia_status_t st = check_endpoint(c, endpoint, "reg_mr");
    if (st != WIA_SUCCESS) return st;
    if (desc->kind == WIA_MR_DEVICE) {
      MrEntry* e = nullptr;
      st = c.reg_device(*desc, &e);
      if (st != WIA_SUCCESS) return st;
      *mr = reinterpret_cast<wia_mr_t>(new MrHandle{e});
      return WIA_SUCCESS;
    }
    if (desc->kind != WIA_MR_HOST)
      return c.fail(WIA_ERROR_INVALID_ARGUMENT, "verbs: reg_mr: unknown memory kind %u",
                    desc->kind);
    if (desc->ptr == nullptr && desc->size > 0)
      return c.fail(WIA_ERROR_INVALID_ARGUMENT, "verbs: reg_mr of %" PRIu64 " bytes at NULL",
                    desc->size);
    MrEntry* e = nullptr;
    // ibv_reg_mr refuses a zero length; an empty region is one byte of it.
    st = c.reg(desc->ptr, desc->size > 0 ? desc->size : 1, &e);
    if (st != WIA_SUCCESS) return st;
    *mr = reinterpret_cast<wia_mr_t>(new MrHandle{e});
    return WIA_SUCCESS;
  });
}

wia_status_t dereg_mr(void* ctx, wia_mr_t mr) {
  return guarded(ctx, "dereg_mr", [&](Ctx& c) -> wia_status_t {
    if (mr == nullptr) return c.fail(WIA_ERROR_INVALID_HANDLE, "verbs: dereg_mr: NULL region");
    auto* h = reinterpret_cast<MrHandle*>(mr);
    c.unreg(h->entry);
    delete h;
    return WIA_SUCCESS;
  });
}

wia_status_t isend(void* ctx, wia_conn_t conn, const void* buf, uint64_t size, uint64_t tag,
                   wia_mr_t mr, wia_request_t* request) {
  return guarded(ctx, "isend", [&](Ctx& c) -> wia_status_t {
    if (conn == nullptr || request == nullptr || (buf == nullptr && size > 0))
      return c.fail(WIA_ERROR_INVALID_ARGUMENT, "verbs: isend: NULL connection, buffer or request");
    return c.isend(reinterpret_cast<Conn*>(conn), static_cast<const char*>(buf), size, tag,
                   reinterpret_cast<MrHandle*>(mr), request);
  });
}

wia_status_t irecv(void* ctx, wia_conn_t conn, void* buf, uint64_t size, uint64_t tag, wia_mr_t mr,
                   wia_request_t* request) {
  return guarded(ctx, "irecv", [&](Ctx& c) -> wia_status_t {
    if (conn == nullptr || request == nullptr || (buf == nullptr && size > 0))
      return c.fail(WIA_ERROR_INVALID_ARGUMENT, "verbs: irecv: NULL connection, buffer or request");
    return c.irecv(reinterpret_cast<Conn*>(conn), static_cast<char*>(buf), size, tag,
                   reinterpret_cast<MrHandle*>(mr), request);
  });
}

wia_status_t test(void* ctx, wia_request_t request, int32_t* done, uint64_t* size) {
  return guarded(ctx, "test", [&](Ctx& c) -> wia_status_t {
    if (request == nullptr || done == nullptr)
      return c.fail(WIA_ERROR_INVALID_ARGUMENT, "verbs: test: NULL request or done");
    return c.test(reinterpret_cast<Request*>(request), done, size);
  });
}

wia_status_t wait_fds(void* ctx, wia_conn_t conn, pollfd* fds, std::uint32_t capacity,
                      std::uint32_t* count) {
  return guarded(ctx, "wait_fds", [&](Ctx& c) -> wia_status_t {
    if (conn == nullptr || count == nullptr || (fds == nullptr && capacity > 0))
      return c.fail(WIA_ERROR_INVALID_ARGUMENT, "verbs: wait_fds: NULL connection, fds or count");
    return c.wait_fds(reinterpret_cast<Conn*>(conn), fds, capacity, count);
  });
}

wia_status_t close_(void* ctx, wia_conn_t conn) {
  return guarded(ctx, "close", [&](Ctx& c) -> wia_status_t {
    if (conn == nullptr) return c.fail(WIA_ERROR_INVALID_HANDLE, "verbs: close: NULL connection");
    c.close(reinterpret_cast<Conn*>(conn));
    return WIA_SUCCESS;
  });
}

wia_status_t mr_rkey(void* ctx, wia_mr_t mr, void* rkey) {
  return guarded(ctx, "mr_rkey", [&](Ctx& c) -> wia_status_t {
    if (mr == nullptr || rkey == nullptr)
      return c.fail(WIA_ERROR_INVALID_ARGUMENT, "verbs: mr_rkey: NULL region or rkey");
    const MrEntry* e = reinterpret_cast<MrHandle*>(mr)->entry;
    WireRkey k{};
    k.magic = kRkeyMagic;
    k.rkey = e->mr->rkey;
    k.base = e->base;
    k.len = e->len;
    std::memcpy(rkey, &k, sizeof k);
    return WIA_SUCCESS;
  });
}

wia_status_t put(void* ctx, wia_conn_t conn, const void* local, uint64_t size, wia_mr_t mr,
                 uint64_t remote_addr, const void* rkey, wia_request_t* request) {
  return guarded(ctx, "put", [&](Ctx& c) -> wia_status_t {
    if (conn == nullptr || rkey == nullptr || request == nullptr || (local == nullptr && size > 0))
      return c.fail(WIA_ERROR_INVALID_ARGUMENT,
                    "verbs: put: NULL connection, buffer, rkey or request");
    return c.rma(reinterpret_cast<Conn*>(conn), true,
                 const_cast<char*>(static_cast<const char*>(local)), size,
                 reinterpret_cast<MrHandle*>(mr), remote_addr, rkey, request);
  });
}

wia_status_t get(void* ctx, wia_conn_t conn, void* local, uint64_t size, wia_mr_t mr,
                 uint64_t remote_addr, const void* rkey, wia_request_t* request) {
  return guarded(ctx, "get", [&](Ctx& c) -> wia_status_t {
    if (conn == nullptr || rkey == nullptr || request == nullptr || (local == nullptr && size > 0))
      return c.fail(WIA_ERROR_INVALID_ARGUMENT,
                    "verbs: get: NULL connection, buffer, rkey or request");
    return c.rma(reinterpret_cast<Conn*>(conn), false, static_cast<char*>(local), size,
                 reinterpret_cast<MrHandle*>(mr), remote_addr, rkey, request);
  });
}

// --- descriptor ------------------------------------------------------------------------

constexpr std::uint32_t kDeclSize = sizeof(wia_param_decl_v1_t);

const wia_param_decl_v1_t kParams[] = {
    {kDeclSize, WIA_PARAM_STRING, "device", "",
     "RDMA device to use (\"mlx5_0\"); empty: the first with an active port", 0, 0},
    {kDeclSize, WIA_PARAM_INT, "port", "0", "port of the device; 0: the first active one", 0, 255},
    {kDeclSize, WIA_PARAM_INT, "gid_index", "-1",
     "GID table index (RoCE: pick the RoCE v2 / IPv4 entry); -1: 0", -1, 255},
    {kDeclSize, WIA_PARAM_STRING, "library", "libibverbs.so.1", "libibverbs to dlopen", 0, 0},
    {kDeclSize, WIA_PARAM_INT, "connect_timeout_ms", "30000",
     "connect() gives up with WIA_ERROR_TIMEOUT after this long", 10, 3600000},
    {kDeclSize, WIA_PARAM_STRING, "ifname", "",
     "interface(s) of the connection handshake socket, name prefixes (\"ib0\", \"eth,en\"); "
     "empty: WIA_SOCKET_IFNAME, else the first non-loopback IPv4 interface",
     0, 0},
    {kDeclSize, WIA_PARAM_BOOL, "dmabuf", "true",
     "claim device memory (FLAG_DEVICE_MEMORY, FLAG_DMABUF) when libibverbs has "
     "ibv_reg_dmabuf_mr, so the core registers device buffers through their dma-buf (GPUDirect "
     "RDMA); false: device buffers are staged through host memory",
     0, 0},
    {kDeclSize, WIA_PARAM_BOOL, "gdr_flush", "true",
     "a receive into device memory completes only after a 1-byte RDMA read of it, so the NIC's "
     "writes have reached the GPU (NCCL's GDR flush); false where the platform orders them "
     "itself (as NCCL_GDR_FLUSH_DISABLE): one loopback read less per device receive",
     0, 0},
};

const wia_transport_ops_v1_t kTransportOps = {
    .struct_size = sizeof(wia_transport_ops_v1_t),
    .abi_version = WIA_PROVIDER_ABI_VERSION,
    .caps = WIA_TRANSPORT_CAP_WAIT_FD | WIA_TRANSPORT_CAP_RMA,
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
}  // namespace wia::verbs

extern "C" {
WIA_PROVIDER_EXPORT extern const wia_provider_v1_t wia_provider_v1;
const wia_provider_v1_t wia_provider_v1 = {
    .struct_size = sizeof(wia_provider_v1_t),
    .abi_version = WIA_PROVIDER_ABI_VERSION,
    .name = "verbs",
    .version = WIA_VERBS_VERSION,
    .caps = WIA_PROVIDER_CAP_TRANSPORT,
    .host_services_version = WIA_HOST_SERVICES_VERSION,
    .num_params = sizeof(wia::verbs::kParams) / sizeof(wia::verbs::kParams[0]),
    .params = wia::verbs::kParams,
    .init = wia::verbs::init,
    .fini = wia::verbs::fini,
    .device = nullptr,
    .transport = &wia::verbs::kTransportOps,
};
}
