// SPDX-License-Identifier: Apache-2.0
// The shm provider's tables and lifetime: its parameters, init/fini, the
// endpoint it offers, and the descriptor the core loads. The other files:
// shm.hpp (shared declarations), shm_setup.cpp (segment, listen, connect,
// accept), shm_conn.cpp (the engine and send/recv/test), shm_rma.cpp
// (registration, CMA, put/get).
//
// The `shm` transport provider: tagged point-to-point messages between
// processes of one node (docs/transport-shm.md has the design and numbers).
//
//  - Rendezvous: listen() binds an abstract-namespace Unix SEQPACKET socket
//    with a random name; the handle carries that name, a random 16-byte
//    secret and this node's boot_id. connect() sends a hello {secret,
//    cookie, ...} with the connection's memfd attached (SCM_RIGHTS). No
//    file ever appears in /dev/shm, so nothing can be left there by a
//    crash, and the segment dies with the last process mapping it.
//  - Data: per direction one single-producer/single-consumer byte ring of
//    64-byte aligned records in the segment. Messages up to `eager_size`
//    travel inline (two copies). Larger ones send an RTS; the receiver,
//    once matched, either pulls the data with process_vm_readv (one copy,
//    "CMA") from `cma_threshold` bytes on, or answers CTS and the sender
//    streams `chunk_size` DATA records through the ring (two pipelined
//    copies). A denied CMA (EPERM) falls back to the ring for good.
//  - Progress only inside isend/irecv/test: no provider thread.
//  - Peer death: the control socket stays open for the connection's life;
//    when progress finds nothing to do it peeks the socket (at most every
//    `liveness_interval_us`), and EOF fails every pending request with
//    WIA_ERROR_REMOTE naming the peer pid. Everything the peer wrote into
//    the ring before dying is still delivered first.
//  - Everything read from the shared segment is validated (type, sequence,
//    length, ids); a bad record fails the connection, never overflows.
#include <sys/prctl.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>

#include "shm.hpp"

#ifndef WIA_SHM_VERSION
#define WIA_SHM_VERSION "0.0.0"
#endif

namespace wia::shm {

volatile std::uint64_t g_cma_probe_word = 0;

namespace {

bool read_boot_id(std::uint8_t out[16]) {
  FILE* f = std::fopen("/proc/sys/kernel/random/boot_id", "r");
  if (f == nullptr) return false;
  char text[64] = {};
  const bool got = std::fgets(text, sizeof(text), f) != nullptr;
  std::fclose(f);
  if (!got) return false;
  int n = 0;
  for (const char* s = text; *s != '\0' && n < 32; ++s) {
    int v;
    if (*s >= '0' && *s <= '9')
      v = *s - '0';
    else if (*s >= 'a' && *s <= 'f')
      v = *s - 'a' + 10;
    else
      continue;
    out[n / 2] = static_cast<std::uint8_t>(n % 2 == 0 ? v << 4 : out[n / 2] | v);
    ++n;
  }
  return n == 32;
}

// ---------------------------------------------------------------------------
// Entry points

wia_status_t init(const wia_host_services_v1_t* host, void** ctx) {
  if (host == nullptr || ctx == nullptr) return WIA_ERROR_INVALID_ARGUMENT;
  if (host->abi_version < 1 ||
      !WIA_ABI_HAS_FIELD(wia_host_services_v1_t, host->struct_size, clock_ns))
    return WIA_ERROR_ABI_MISMATCH;
  auto p = std::unique_ptr<Provider>(new (std::nothrow) Provider);
  if (!p) return WIA_ERROR_OUT_OF_MEMORY;
  p->host = host;
  Settings& s = p->cfg;
  auto size_param = [&](const char* key, std::uint64_t* out) {
    const char* v = host->get_param ? host->get_param(host->host_ctx, key) : nullptr;
    std::uint64_t parsed = 0;
    // Sizes come as plain byte counts from the core; a hand-written host
    // (tests, tools) may pass "4M". Text that is no size keeps the default.
    if (v != nullptr && common::parse_size(v, &parsed)) *out = parsed;
  };
  size_param("ring_size", &s.ring_size);
  size_param("eager_size", &s.eager_size);
  size_param("chunk_size", &s.chunk_size);
  size_param("cma_threshold", &s.cma_threshold);
  size_param("unexpected_limit", &s.unexpected_limit);
  std::uint64_t us = s.liveness_interval_ns / 1000;
  size_param("liveness_interval_us", &us);
  s.liveness_interval_ns = us * 1000;
  if (const char* v = host->get_param ? host->get_param(host->host_ctx, "cma") : nullptr) {
    if (std::strcmp(v, "off") == 0)
      s.cma = CmaMode::kOff;
    else if (std::strcmp(v, "on") == 0)
      s.cma = CmaMode::kOn;
    else if (std::strcmp(v, "auto") == 0)
      s.cma = CmaMode::kAuto;
    else
      return p->fail(WIA_ERROR_CONFIG, format("shm.cma must be auto, on or off, not \"%s\"", v));
  }
  if (const char* v = host->get_param ? host->get_param(host->host_ctx, "set_ptracer") : nullptr)
    s.set_ptracer = std::strcmp(v, "true") == 0 || std::strcmp(v, "1") == 0;
  if (s.set_ptracer && s.cma != CmaMode::kOff) {
    // Yama ptrace_scope 1 only lets ancestors attach; peers are siblings.
    // This lets any process of this user attach (a deliberate opt-in).
    if (prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0) != 0)
      p->log(WIA_LOG_DEBUG, "prctl(PR_SET_PTRACER_ANY): " + errno_text(errno) + " (no Yama here?)");
  }
  // Keep every record at most a quarter of the ring so that several are
  // in flight (pipelining) and any one fits an empty ring after padding.
  s.ring_size = std::max<std::uint64_t>(s.ring_size & ~(wire::kRecordAlign - 1), 64u << 10);
  const std::uint64_t max_record = s.ring_size / 4 - sizeof(RecordHeader);
  s.eager_size = std::min(s.eager_size, max_record);
  s.chunk_size = std::max<std::uint64_t>(std::min(s.chunk_size, max_record), 4096);
  if (!read_boot_id(p->boot_id))
    return p->fail(WIA_ERROR_UNAVAILABLE, "cannot read /proc/sys/kernel/random/boot_id");
  if (g_cma_probe_word == 0) {
    std::uint64_t v = 0;
    if (!random_bytes(&v, sizeof(v))) v = monotonic_ns();
    g_cma_probe_word = v | 1;
  }
  *ctx = p.release();
  return WIA_SUCCESS;
}

wia_status_t fini(void* ctx) {
  delete prov(ctx);
  return WIA_SUCCESS;
}

wia_status_t endpoint_count(void*, int32_t* count) {
  if (count == nullptr) return WIA_ERROR_INVALID_ARGUMENT;
  *count = 1;
  return WIA_SUCCESS;
}

wia_status_t endpoint_props(void* ctx, int32_t endpoint, wia_transport_props_v1_t* props) {
  if (props == nullptr || props->struct_size < offsetof(wia_transport_props_v1_t, name))
    return WIA_ERROR_INVALID_ARGUMENT;
  if (endpoint != 0)
    return prov(ctx)->fail(
        WIA_ERROR_INVALID_ARGUMENT,
        format("endpoint %d does not exist (the shm provider has endpoint 0)", endpoint));
  wia_transport_props_v1_t out{};
  out.struct_size = props->struct_size;
  // RMA is CMA: offered unless configured off; a connection whose CMA
  // probe failed answers put/get with NOT_SUPPORTED.
  out.flags = WIA_TRANSPORT_FLAG_INTRA_NODE |
              (prov(ctx)->cfg.cma != CmaMode::kOff ? WIA_TRANSPORT_FLAG_RMA : 0u);
  std::snprintf(out.name, sizeof(out.name), "shm");
  out.speed_mbps = 0;
  out.latency_us = 0.5;
  out.max_message_size = std::numeric_limits<std::int64_t>::max();
  out.max_requests = 1u << 16;
  out.numa_node = -1;
  out.tag_bits = 64;
  out.mem_ifaces = 1u << WIA_MEM_IFACE_HOST;
  std::memcpy(props, &out, std::min<std::size_t>(props->struct_size, sizeof(out)));
  return WIA_SUCCESS;
}

const wia_param_decl_v1_t kParams[] = {
    {sizeof(wia_param_decl_v1_t), WIA_PARAM_SIZE, "ring_size", "4194304",
     "bytes of each direction's shared ring per connection (two per connection)", 65536, 1ll << 32},
    {sizeof(wia_param_decl_v1_t), WIA_PARAM_SIZE, "eager_size", "16384",
     "messages up to this size travel inline through the ring (capped at ring_size/4)", 0,
     1ll << 30},
    {sizeof(wia_param_decl_v1_t), WIA_PARAM_SIZE, "chunk_size", "262144",
     "chunk of a large message streamed through the ring when CMA is not used", 4096, 1ll << 30},
    {sizeof(wia_param_decl_v1_t), WIA_PARAM_STRING, "cma", "auto",
     "cross-memory attach (process_vm_readv) for large messages: auto, on, off", 0, 0},
    {sizeof(wia_param_decl_v1_t), WIA_PARAM_BOOL, "set_ptracer", "false",
     "under Yama ptrace_scope 1, let processes of this user attach (PR_SET_PTRACER_ANY) so peers "
     "can use CMA",
     0, 1},
    {sizeof(wia_param_decl_v1_t), WIA_PARAM_SIZE, "cma_threshold", "67108864",
     "messages from this size on are pulled with CMA when permitted; smaller ones are streamed", 0,
     std::numeric_limits<std::int64_t>::max()},
    {sizeof(wia_param_decl_v1_t), WIA_PARAM_SIZE, "unexpected_limit", "67108864",
     "bytes of unexpected small messages buffered per connection before the sender is held back", 0,
     std::numeric_limits<std::int64_t>::max()},
    {sizeof(wia_param_decl_v1_t), WIA_PARAM_INT, "liveness_interval_us", "1000",
     "how often an idle connection checks that its peer process is still there", 10, 10'000'000},
};

const wia_transport_ops_v1_t kTransportOps = {
    .struct_size = sizeof(wia_transport_ops_v1_t),
    .abi_version = WIA_PROVIDER_ABI_VERSION,
    .caps = WIA_TRANSPORT_CAP_RMA | WIA_TRANSPORT_CAP_INLINE,
    .must_understand = 0,
    .endpoint_count = endpoint_count,
    .endpoint_props = endpoint_props,
    .listen = listen_ep,
    .connect = connect_ep,
    .accept = accept_ep,
    .close_listener = close_listener,
    .reg_mr = reg_mr,
    .dereg_mr = dereg_mr,
    .isend = isend,
    .irecv = irecv,
    .test = test,
    .close = close_conn,
    .mr_rkey = mr_rkey,
    .put = put,
    .get = get,
    .send_inline = send_inline,
    .recv_inline = recv_inline,
    .wait_fds = nullptr,
};

}  // namespace
}  // namespace wia::shm

extern "C" {
WIA_PROVIDER_EXPORT extern const wia_provider_v1_t wia_provider_v1;
const wia_provider_v1_t wia_provider_v1 = {
    .struct_size = sizeof(wia_provider_v1_t),
    .abi_version = WIA_PROVIDER_ABI_VERSION,
    .name = "shm",
    .version = WIA_SHM_VERSION,
    .caps = WIA_PROVIDER_CAP_TRANSPORT,
    .host_services_version = WIA_HOST_SERVICES_VERSION,
    .num_params = sizeof(wia::shm::kParams) / sizeof(wia::shm::kParams[0]),
    .params = wia::shm::kParams,
    .init = wia::shm::init,
    .fini = wia::shm::fini,
    .device = nullptr,
    .transport = &wia::shm::kTransportOps,
};
}
