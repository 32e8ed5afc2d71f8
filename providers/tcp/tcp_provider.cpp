// SPDX-License-Identifier: Apache-2.0
// The `tcp` transport provider: tagged messages over TCP sockets.
//
// Built against the provider ABI alone (wia/provider.h); see
// docs/transport-tcp.md for the design and the measurements behind the
// defaults. In short:
//  - Endpoints are the usable network interfaces (getifaddrs), filtered by
//    tcp.ifname (NCCL_SOCKET_IFNAME syntax; WIA_SOCKET_IFNAME when the
//    parameter is empty), real interfaces first and loopback last.
//  - A connection is one control socket plus tcp.streams data sockets;
//    messages up to 64 KiB travel inline on the control socket, larger ones
//    are striped over the data sockets after an RTS/CTS exchange, straight
//    into the receiver's buffer.
//  - No threads: progress happens inside isend/irecv/test.
//  - Every byte from the network is validated (tcp_wire.hpp); a bad peer
//    fails its own connection with WIA_ERROR_REMOTE and a message naming
//    it, never the process.
#include <wia/provider.h>

#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <new>

#include "wia_common/host_messages.hpp"
#include "tcp.hpp"

#ifndef WIA_TCP_VERSION
#define WIA_TCP_VERSION "0.0.0"
#endif

namespace wia::tcp {

// ---------------------------------------------------------------------------
// Ctx helpers

void Ctx::log(wia_log_level_t level, const char* fmt, ...) const {
  va_list ap;
  va_start(ap, fmt);
  common::host_vlog(host, level, fmt, ap);
  va_end(ap);
}

wia_status_t Ctx::fail(wia_status_t status, const char* fmt, ...) const {
  char buf[512];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(buf, sizeof(buf), fmt, ap);
  va_end(ap);
  return fail_text(status, buf);
}

wia_status_t Ctx::fail_text(wia_status_t status, const std::string& message) const {
  if (host != nullptr && host->set_error != nullptr)
    host->set_error(host->host_ctx, message.c_str());
  return status;
}

namespace {

struct Mr {
  void* ptr = nullptr;
  std::uint64_t size = 0;
};

// The core has validated the text already; this only converts it, and text
// it cannot convert (a hand-written host) leaves the default in place.
void size_param(const char* text, std::uint64_t* out) { common::parse_size(text, out); }

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
    return c->fail(WIA_ERROR_OUT_OF_MEMORY, "tcp: %s: out of memory", what);
  } catch (const std::exception& e) {
    return c->fail(WIA_ERROR_INTERNAL, "tcp: %s: %s", what, e.what());
  } catch (...) {
    return c->fail(WIA_ERROR_INTERNAL, "tcp: %s: unknown exception", what);
  }
}

// ---------------------------------------------------------------------------
// init / fini

wia_status_t init(const wia_host_services_v1_t* host, void** out) {
  if (host == nullptr || out == nullptr) return WIA_ERROR_INVALID_ARGUMENT;
  if (host->abi_version < WIA_HOST_SERVICES_VERSION ||
      !WIA_ABI_HAS_FIELD(wia_host_services_v1_t, host->struct_size, clock_ns))
    return WIA_ERROR_ABI_MISMATCH;
  try {
    auto ctx = std::make_unique<Ctx>();
    ctx->host = host;
    Params& p = ctx->params;
    p.ifname = param(host, "ifname", "");
    p.family = param(host, "family", "auto");
    p.congestion = param(host, "congestion", "");
    p.streams = std::atoi(param(host, "streams", "2"));
    p.hello_timeout_ms = std::atoll(param(host, "hello_timeout_ms", "10000"));
    p.connect_timeout_ms = std::atoll(param(host, "connect_timeout_ms", "30000"));
    p.user_timeout_ms = std::atoll(param(host, "user_timeout_ms", "0"));
    size_param(param(host, "min_stripe", "1048576"), &p.min_stripe);
    size_param(param(host, "unexpected_max", "67108864"), &p.unexpected_max);
    size_param(param(host, "max_message", "1099511627776"), &p.max_message);
    size_param(param(host, "sndbuf", "0"), &p.sndbuf);
    size_param(param(host, "rcvbuf", "0"), &p.rcvbuf);
    if (p.family != "auto" && p.family != "ipv4" && p.family != "ipv6")
      return ctx->fail(WIA_ERROR_CONFIG, "tcp.family is '%s'; expected auto, ipv4 or ipv6",
                       p.family.c_str());
    if (p.streams < 1 || p.streams > kMaxDataStreams)
      return ctx->fail(WIA_ERROR_CONFIG, "tcp.streams is %d; expected 1..%u", p.streams,
                       kMaxDataStreams);
    const wia_status_t st = discover_endpoints(*ctx);
    if (st != WIA_SUCCESS) return st;
    *out = ctx.release();
    return WIA_SUCCESS;
  } catch (const std::bad_alloc&) {
    return WIA_ERROR_OUT_OF_MEMORY;
  } catch (...) {
    return WIA_ERROR_INTERNAL;
  }
}

wia_status_t fini(void* ctx) {
  delete static_cast<Ctx*>(ctx);
  return WIA_SUCCESS;
}

// ---------------------------------------------------------------------------
// Transport entries

wia_status_t endpoint_count(void* ctx, int32_t* count) {
  return guarded(ctx, "endpoint_count", [&](Ctx& c) -> wia_status_t {
    if (count == nullptr) return c.fail(WIA_ERROR_INVALID_ARGUMENT, "tcp: endpoint_count: NULL");
    *count = static_cast<int32_t>(c.endpoints.size());
    return WIA_SUCCESS;
  });
}

wia_status_t endpoint_props(void* ctx, int32_t endpoint, wia_transport_props_v1_t* props) {
  return guarded(ctx, "endpoint_props", [&](Ctx& c) -> wia_status_t {
    if (props == nullptr) return c.fail(WIA_ERROR_INVALID_ARGUMENT, "tcp: endpoint_props: NULL");
    if (endpoint < 0 || static_cast<std::size_t>(endpoint) >= c.endpoints.size())
      return c.fail(WIA_ERROR_INVALID_ARGUMENT, "tcp: endpoint %d does not exist (%zu endpoints)",
                    endpoint, c.endpoints.size());
    const Endpoint& e = c.endpoints[static_cast<std::size_t>(endpoint)];
    wia_transport_props_v1_t full{};
    full.struct_size = props->struct_size;
    full.flags = WIA_TRANSPORT_FLAG_INTRA_NODE | (e.loopback ? 0u : WIA_TRANSPORT_FLAG_INTER_NODE);
    std::snprintf(full.name, sizeof(full.name), "%s", e.name.c_str());
    std::snprintf(full.pci_bus_id, sizeof(full.pci_bus_id), "%s", e.pci_bus_id.c_str());
    full.speed_mbps = e.speed_mbps;
    // Measured one-way 8-byte latency on loopback (docs/transport-tcp.md);
    // a real NIC adds its wire and interrupt time.
    full.latency_us = e.loopback ? 12.0 : 25.0;
    full.max_message_size = c.params.max_message;
    full.max_requests = kMaxRequests;
    full.numa_node = e.numa_node;
    full.tag_bits = 64;
    full.mem_ifaces = 1u << WIA_MEM_IFACE_HOST;
    const std::size_t n = std::min<std::size_t>(props->struct_size, sizeof(full));
    std::memcpy(props, &full, n);
    return WIA_SUCCESS;
  });
}

wia_status_t listen_(void* ctx, int32_t endpoint, void* handle, wia_listener_t* listener) {
  return guarded(ctx, "listen", [&](Ctx& c) -> wia_status_t {
    if (handle == nullptr || listener == nullptr)
      return c.fail(WIA_ERROR_INVALID_ARGUMENT, "tcp: listen: NULL handle or listener");
    Listener* l = nullptr;
    const wia_status_t st = do_listen(c, endpoint, handle, &l);
    if (st == WIA_SUCCESS) *listener = reinterpret_cast<wia_listener_t>(l);
    return st;
  });
}

wia_status_t connect_(void* ctx, int32_t endpoint, const void* handle, uint64_t cookie,
                      wia_conn_t* conn) {
  return guarded(ctx, "connect", [&](Ctx& c) -> wia_status_t {
    if (handle == nullptr || conn == nullptr)
      return c.fail(WIA_ERROR_INVALID_ARGUMENT, "tcp: connect: NULL handle or conn");
    Conn* cc = reinterpret_cast<Conn*>(*conn);
    const wia_status_t st = do_connect(c, endpoint, handle, cookie, &cc);
    *conn = reinterpret_cast<wia_conn_t>(cc);
    return st;
  });
}

wia_status_t accept_(void* ctx, wia_listener_t listener, uint64_t* cookie, wia_conn_t* conn) {
  return guarded(ctx, "accept", [&](Ctx& c) -> wia_status_t {
    if (listener == nullptr || cookie == nullptr || conn == nullptr)
      return c.fail(WIA_ERROR_INVALID_ARGUMENT, "tcp: accept: NULL argument");
    Conn* cc = nullptr;
    const wia_status_t st = do_accept(c, *reinterpret_cast<Listener*>(listener), cookie, &cc);
    *conn = reinterpret_cast<wia_conn_t>(cc);
    return st;
  });
}

wia_status_t close_listener(void* ctx, wia_listener_t listener) {
  return guarded(ctx, "close_listener", [&](Ctx& c) -> wia_status_t {
    if (listener == nullptr)
      return c.fail(WIA_ERROR_INVALID_HANDLE, "tcp: close_listener: NULL listener");
    delete reinterpret_cast<Listener*>(listener);
    return WIA_SUCCESS;
  });
}

wia_status_t reg_mr(void* ctx, int32_t endpoint, const wia_mr_desc_v1_t* desc, wia_mr_t* mr) {
  return guarded(ctx, "reg_mr", [&](Ctx& c) -> wia_status_t {
    if (desc == nullptr || mr == nullptr)
      return c.fail(WIA_ERROR_INVALID_ARGUMENT, "tcp: reg_mr: NULL argument");
    if (endpoint < 0 || static_cast<std::size_t>(endpoint) >= c.endpoints.size())
      return c.fail(WIA_ERROR_INVALID_ARGUMENT,
                    "tcp: reg_mr on endpoint %d: there are %zu "
                    "endpoints",
                    endpoint, c.endpoints.size());
    if (!WIA_ABI_HAS_FIELD(wia_mr_desc_v1_t, desc->struct_size, size))
      return c.fail(WIA_ERROR_INVALID_ARGUMENT, "tcp: reg_mr: descriptor of %u bytes is too short",
                    desc->struct_size);
    const std::uint32_t iface = WIA_ABI_HAS_FIELD(wia_mr_desc_v1_t, desc->struct_size, iface)
                                    ? desc->iface
                                    : WIA_MEM_IFACE_HOST;
    // Sockets read and write through the CPU: device memory works only when
    // it is ordinary host memory (the host provider's "devices").
    if (desc->kind != WIA_MR_HOST && iface != WIA_MEM_IFACE_HOST)
      return c.fail(WIA_ERROR_NOT_SUPPORTED,
                    "tcp: cannot register device memory (memory interface %u) on %s: sockets "
                    "need host-accessible memory; stage through a host buffer",
                    iface, c.endpoints[static_cast<std::size_t>(endpoint)].name.c_str());
    if (desc->kind != WIA_MR_HOST && desc->kind != WIA_MR_DEVICE)
      return c.fail(WIA_ERROR_INVALID_ARGUMENT, "tcp: reg_mr: unknown memory kind %u", desc->kind);
    if (desc->ptr == nullptr && desc->size > 0)
      return c.fail(WIA_ERROR_INVALID_ARGUMENT, "tcp: reg_mr of %" PRIu64 " bytes at NULL",
                    desc->size);
    auto* m = new Mr{desc->ptr, desc->size};
    *mr = reinterpret_cast<wia_mr_t>(m);
    return WIA_SUCCESS;
  });
}

wia_status_t dereg_mr(void* ctx, wia_mr_t mr) {
  return guarded(ctx, "dereg_mr", [&](Ctx& c) -> wia_status_t {
    if (mr == nullptr) return c.fail(WIA_ERROR_INVALID_HANDLE, "tcp: dereg_mr: NULL region");
    delete reinterpret_cast<Mr*>(mr);
    return WIA_SUCCESS;
  });
}

wia_status_t isend(void* ctx, wia_conn_t conn, const void* buf, uint64_t size, uint64_t tag,
                   wia_mr_t mr, wia_request_t* request) {
  (void)mr;  // registration is not needed: the kernel copies
  return guarded(ctx, "isend", [&](Ctx& c) -> wia_status_t {
    if (conn == nullptr || request == nullptr)
      return c.fail(WIA_ERROR_INVALID_ARGUMENT, "tcp: isend: NULL connection or request");
    return reinterpret_cast<Conn*>(conn)->isend(buf, size, tag, request);
  });
}

wia_status_t irecv(void* ctx, wia_conn_t conn, void* buf, uint64_t size, uint64_t tag, wia_mr_t mr,
                   wia_request_t* request) {
  (void)mr;
  return guarded(ctx, "irecv", [&](Ctx& c) -> wia_status_t {
    if (conn == nullptr || request == nullptr)
      return c.fail(WIA_ERROR_INVALID_ARGUMENT, "tcp: irecv: NULL connection or request");
    return reinterpret_cast<Conn*>(conn)->irecv(buf, size, tag, request);
  });
}

wia_status_t test(void* ctx, wia_request_t request, int32_t* done, uint64_t* size) {
  return guarded(ctx, "test", [&](Ctx& c) -> wia_status_t {
    if (request == nullptr || done == nullptr)
      return c.fail(WIA_ERROR_INVALID_ARGUMENT, "tcp: test: NULL request or done");
    auto* r = reinterpret_cast<Request*>(request);
    return r->conn->test(r, done, size);
  });
}

wia_status_t wait_fds(void* ctx, wia_conn_t conn, pollfd* fds, std::uint32_t capacity,
                      std::uint32_t* count) {
  return guarded(ctx, "wait_fds", [&](Ctx& c) -> wia_status_t {
    if (conn == nullptr || count == nullptr || (fds == nullptr && capacity > 0))
      return c.fail(WIA_ERROR_INVALID_ARGUMENT, "tcp: wait_fds: NULL connection, fds or count");
    return reinterpret_cast<Conn*>(conn)->wait_fds(fds, capacity, count);
  });
}

wia_status_t close_(void* ctx, wia_conn_t conn) {
  return guarded(ctx, "close", [&](Ctx& c) -> wia_status_t {
    if (conn == nullptr) return c.fail(WIA_ERROR_INVALID_HANDLE, "tcp: close: NULL connection");
    delete reinterpret_cast<Conn*>(conn);
    return WIA_SUCCESS;
  });
}

// ---------------------------------------------------------------------------
// Descriptor

constexpr std::uint32_t kDeclSize = sizeof(wia_param_decl_v1_t);

const wia_param_decl_v1_t kParams[] = {
    {kDeclSize, WIA_PARAM_STRING, "ifname", "",
     "interfaces to use, NCCL_SOCKET_IFNAME syntax (eth,ib / =eth0 / ^docker); empty: all, or "
     "WIA_SOCKET_IFNAME",
     0, 0},
    {kDeclSize, WIA_PARAM_STRING, "family", "auto",
     "address family of each endpoint: auto (IPv4 when the interface has one), ipv4, ipv6", 0, 0},
    {kDeclSize, WIA_PARAM_INT, "streams", "2",
     "data sockets per connection that large messages are striped over (the connector decides)", 1,
     kMaxDataStreams},
    {kDeclSize, WIA_PARAM_SIZE, "min_stripe", "1M",
     "smallest slice of a large message on one data socket", 4096, 1ll << 30},
    {kDeclSize, WIA_PARAM_SIZE, "unexpected_max", "64M",
     "bytes of unmatched messages buffered per connection before reading pauses", 1ll << 16,
     1ll << 40},
    {kDeclSize, WIA_PARAM_SIZE, "max_message", "1T", "largest message accepted or sent", 1,
     1ll << 50},
    {kDeclSize, WIA_PARAM_INT, "hello_timeout_ms", "10000",
     "a connecting socket must send its hello within this time or is rejected", 10, 3600000},
    {kDeclSize, WIA_PARAM_INT, "connect_timeout_ms", "30000",
     "connect() gives up with WIA_ERROR_TIMEOUT after this long", 10, 3600000},
    {kDeclSize, WIA_PARAM_STRING, "congestion", "",
     "TCP_CONGESTION for every socket (e.g. cubic); empty: the system default", 0, 0},
    {kDeclSize, WIA_PARAM_SIZE, "sndbuf", "0", "SO_SNDBUF per socket; 0: kernel autotuning", 0,
     1ll << 30},
    {kDeclSize, WIA_PARAM_SIZE, "rcvbuf", "0", "SO_RCVBUF per socket; 0: kernel autotuning", 0,
     1ll << 30},
    {kDeclSize, WIA_PARAM_INT, "user_timeout_ms", "0",
     "TCP_USER_TIMEOUT: fail a connection whose sent data stays unacknowledged this long; 0: "
     "kernel default",
     0, 3600000},
};

const wia_transport_ops_v1_t kTransportOps = {
    .struct_size = sizeof(wia_transport_ops_v1_t),
    .abi_version = WIA_PROVIDER_ABI_VERSION,
    .caps = WIA_TRANSPORT_CAP_WAIT_FD,
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
    .mr_rkey = nullptr,
    .put = nullptr,
    .get = nullptr,
    .send_inline = nullptr,
    .recv_inline = nullptr,
    .wait_fds = wait_fds,
};

}  // namespace
}  // namespace wia::tcp

extern "C" {
WIA_PROVIDER_EXPORT extern const wia_provider_v1_t wia_provider_v1;
const wia_provider_v1_t wia_provider_v1 = {
    .struct_size = sizeof(wia_provider_v1_t),
    .abi_version = WIA_PROVIDER_ABI_VERSION,
    .name = "tcp",
    .version = WIA_TCP_VERSION,
    .caps = WIA_PROVIDER_CAP_TRANSPORT,
    .host_services_version = WIA_HOST_SERVICES_VERSION,
    .num_params = sizeof(wia::tcp::kParams) / sizeof(wia::tcp::kParams[0]),
    .params = wia::tcp::kParams,
    .init = wia::tcp::init,
    .fini = wia::tcp::fini,
    .device = nullptr,
    .transport = &wia::tcp::kTransportOps,
};
}
