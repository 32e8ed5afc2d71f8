// SPDX-License-Identifier: Apache-2.0
// Internal declarations of the verbs transport provider (libibverbs RC
// queue pairs). See verbs_provider.cpp for the overview and
// docs/transport-verbs.md for the design, the wire layout and the limits.
#pragma once

#include <infiniband/verbs.h>
#include <poll.h>
#include <wia/provider.h>

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

namespace wia::verbs {

// --- libibverbs, resolved with dlvsym at init -----------------------------------
// Only these are exported functions of libibverbs.so.1; ibv_post_send,
// ibv_post_srq_recv, ibv_poll_cq and ibv_req_notify_cq are inline calls
// through ibv_context::ops (verbs.h), so they need no symbol. Each is
// resolved at the version rdma-core's verbs.h binds it to (the default
// version, objdump -T): 1.0 ABI symbols of the same name take different
// structs. ibv_query_port is the exported compat entry the verbs.h macro
// falls back to; it fills the port attributes up to link_layer.
#define WIA_VERBS_SYMBOLS(X)                                                                     \
  X(get_device_list, "ibv_get_device_list", "IBVERBS_1.1", ibv_device**, (int*))                 \
  X(free_device_list, "ibv_free_device_list", "IBVERBS_1.1", void, (ibv_device**))               \
  X(get_device_name, "ibv_get_device_name", "IBVERBS_1.1", const char*, (ibv_device*))           \
  X(open_device, "ibv_open_device", "IBVERBS_1.1", ibv_context*, (ibv_device*))                  \
  X(close_device, "ibv_close_device", "IBVERBS_1.1", int, (ibv_context*))                        \
  X(query_port, "ibv_query_port", "IBVERBS_1.1", int, (ibv_context*, uint8_t, ibv_port_attr*))   \
  X(query_gid, "ibv_query_gid", "IBVERBS_1.1", int, (ibv_context*, uint8_t, int, ibv_gid*))      \
  X(alloc_pd, "ibv_alloc_pd", "IBVERBS_1.1", ibv_pd*, (ibv_context*))                            \
  X(dealloc_pd, "ibv_dealloc_pd", "IBVERBS_1.1", int, (ibv_pd*))                                 \
  X(reg_mr, "ibv_reg_mr", "IBVERBS_1.1", ibv_mr*, (ibv_pd*, void*, size_t, int))                 \
  X(dereg_mr, "ibv_dereg_mr", "IBVERBS_1.1", int, (ibv_mr*))                                     \
  X(create_comp_channel, "ibv_create_comp_channel", "IBVERBS_1.0", ibv_comp_channel*,            \
    (ibv_context*))                                                                              \
  X(destroy_comp_channel, "ibv_destroy_comp_channel", "IBVERBS_1.0", int, (ibv_comp_channel*))   \
  X(create_cq, "ibv_create_cq", "IBVERBS_1.1", ibv_cq*,                                          \
    (ibv_context*, int, void*, ibv_comp_channel*, int))                                          \
  X(destroy_cq, "ibv_destroy_cq", "IBVERBS_1.1", int, (ibv_cq*))                                 \
  X(get_cq_event, "ibv_get_cq_event", "IBVERBS_1.1", int, (ibv_comp_channel*, ibv_cq**, void**)) \
  X(ack_cq_events, "ibv_ack_cq_events", "IBVERBS_1.1", void, (ibv_cq*, unsigned int))            \
  X(create_srq, "ibv_create_srq", "IBVERBS_1.1", ibv_srq*, (ibv_pd*, ibv_srq_init_attr*))        \
  X(destroy_srq, "ibv_destroy_srq", "IBVERBS_1.1", int, (ibv_srq*))                              \
  X(create_qp, "ibv_create_qp", "IBVERBS_1.1", ibv_qp*, (ibv_pd*, ibv_qp_init_attr*))            \
  X(modify_qp, "ibv_modify_qp", "IBVERBS_1.1", int, (ibv_qp*, ibv_qp_attr*, int))                \
  X(destroy_qp, "ibv_destroy_qp", "IBVERBS_1.1", int, (ibv_qp*))                                 \
  X(wc_status_str, "ibv_wc_status_str", "IBVERBS_1.1", const char*, (ibv_wc_status))

struct Lib {
  void* handle = nullptr;
  std::string path;
#define WIA_VERBS_DECLARE(member, symbol, version, ret, args) ret(*member) args = nullptr;
  WIA_VERBS_SYMBOLS(WIA_VERBS_DECLARE)
#undef WIA_VERBS_DECLARE
  // Optional: ibv_reg_dmabuf_mr@IBVERBS_1.12 (rdma-core 34 and later). NULL
  // on an older library; device memory is then refused, naming the symbol.
  ibv_mr* (*reg_dmabuf_mr)(ibv_pd*, std::uint64_t offset, std::size_t length, std::uint64_t iova,
                           int fd, int access) = nullptr;
};
inline constexpr const char* kDmabufSymbol = "ibv_reg_dmabuf_mr";
inline constexpr const char* kDmabufVersion = "IBVERBS_1.12";

// --- wire layout ---------------------------------------------------------------------
// Connection handle (what listen() hands the core): the listener's TCP
// address for the connection handshake and the port's addressing facts.
inline constexpr std::uint32_t kHandleMagic = 0x57564231u;  // "WVB1"
struct WireHandle {
  std::uint32_t magic;
  std::uint8_t link_layer;  // IBV_LINK_LAYER_*
  std::uint8_t port;
  std::uint16_t lid;
  std::uint32_t ipv4;      // network order
  std::uint16_t tcp_port;  // network order
  std::uint8_t mtu;        // ibv_mtu
  std::uint8_t reserved;
  std::uint8_t gid[16];
  std::uint64_t listener_nonce;
  char device[32];
  std::uint8_t pad[128 - 72];
};
static_assert(sizeof(WireHandle) == WIA_TRANSPORT_HANDLE_SIZE);

// The handshake on the TCP socket: the connector sends a QpInfo (with the
// core's cookie), the listener creates its QP, moves it to RTS and answers
// with its own QpInfo; the connector then moves its QP to RTS. The socket
// stays open afterwards as the liveness channel: its EOF is how a peer
// that exits, is killed or closes is noticed while only receives are
// pending (RC reports a dead peer only to a sender, after the retries).
inline constexpr std::uint32_t kInfoMagic = 0x57564249u;  // "WVBI"
struct QpInfo {
  std::uint32_t magic;
  std::uint32_t qpn;
  std::uint32_t psn;
  std::uint32_t pid;
  std::uint16_t lid;
  std::uint8_t mtu;
  std::uint8_t link_layer;
  std::uint32_t reserved;
  std::uint64_t cookie;
  std::uint8_t gid[16];
  char host[64];
};
static_assert(sizeof(QpInfo) == 112);

// Every SEND starts with this header (in a registered slot of kSlotSize).
//  eager: {tag, size} then `size` payload bytes (size <= kEagerMax);
//  rts:   {tag, size, sender_id}: a large message waits for the receiver;
//  cts:   {sender_id, addr, rkey, recv_id}: write here, with recv_id as the
//         immediate; truncated: the receive is too small, nothing comes.
// The payload of a large message arrives as one RDMA write with immediate.
enum class Kind : std::uint8_t { eager = 1, rts = 2, cts = 3, cts_truncated = 4 };
inline constexpr std::uint16_t kMsgMagic = 0x5756;  // "WV"
struct MsgHeader {
  std::uint16_t magic;
  Kind kind;
  std::uint8_t reserved;
  std::uint32_t rkey;
  std::uint64_t tag;
  std::uint64_t size;
  std::uint64_t sender_id;
  std::uint64_t addr;
  std::uint32_t recv_id;
  std::uint32_t reserved2;
};
static_assert(sizeof(MsgHeader) == 48);

inline constexpr std::uint32_t kSlotSize = 8192;
inline constexpr std::uint64_t kEagerMax = kSlotSize - sizeof(MsgHeader);
inline constexpr std::uint32_t kRecvSlots = 512;   // posted to the SRQ
inline constexpr std::uint32_t kSendSlots = 1024;  // eager and control sends in flight
inline constexpr std::uint32_t kMaxSendWr = 128;   // per QP
inline constexpr std::uint32_t kCqSize = 65536;
// Every QP's send WRs and the SRQ's receives complete on the one CQ: more
// QPs than this could overrun it (a fatal async error on a NIC).
inline constexpr std::uint32_t kMaxQps = (kCqSize - kRecvSlots) / kMaxSendWr;
// How long sends still on a QP may complete after the peer closed (see
// Ctx::check_liveness).
inline constexpr std::uint64_t kPeerCloseGraceNs = 500ull * 1000 * 1000;
inline constexpr std::uint64_t kRecvBit = 1ull << 63;  // in a receive's wr_id
inline constexpr std::uint32_t kMaxInline = 220;       // asked of the QP; the device may give less

// --- parameters -----------------------------------------------------------------------

struct Params {
  std::string device;  // empty: the first device with an active port
  int port = 0;        // 0: the first active port
  int gid_index = -1;  // -1: 0 (the default GID)
  std::string library = "libibverbs.so.1";
  std::int64_t connect_timeout_ms = 30000;
  std::string ifname;  // handshake interface(s), name prefixes; empty: WIA_SOCKET_IFNAME, else any
  bool claim_dmabuf = true;  // endpoint_props claims DEVICE_MEMORY | DMABUF (with the symbol)
  bool gdr_flush = true;     // a device receive completes after a 1-byte read of it (land())
};

// --- requests, connections, listeners -----------------------------------------------

class Conn;
struct MrEntry;

struct Request {
  enum class State : std::uint8_t { pending, done, failed };
  State state = State::pending;
  bool is_send = false;
  bool user_gone = false;       // tested to the end, or released by close()
  std::uint32_t in_flight = 0;  // send WRs that still name this request
  Conn* conn = nullptr;
  char* buf = nullptr;
  std::uint64_t size = 0;      // send: message size; recv: bytes received
  std::uint64_t capacity = 0;  // recv
  std::uint64_t tag = 0;
  std::uint64_t id = 0;   // rendezvous: sender id
  MrEntry* mr = nullptr;  // rendezvous registration held by this request
  // A receive into device memory (the caller's dma-buf registration, held
  // by the request): never touched by the CPU, so only the NIC fills it (the
  // rendezvous write, or an eager payload's write on the loopback QP).
  MrEntry* device_mr = nullptr;
  // Its data has arrived and the loopback QP is landing it (the eager
  // payload's RDMA write, then the flush read): a failing connection no
  // longer fails it, the loopback's completions end it.
  bool landing = false;
  wia_status_t status = WIA_SUCCESS;
  std::string error;
};

// A send waiting for room in the QP (send WRs) or a send slot.
struct OutItem {
  MsgHeader hdr{};
  Request* req = nullptr;         // eager/rts: the send; rdma: the send, put or get
  const char* payload = nullptr;  // eager
  std::uint64_t remote_addr = 0;  // rdma
  std::uint32_t rkey = 0;
  std::uint32_t imm = 0;
  bool write = false;  // an RDMA operation on req's buffer (not a SEND)
  ibv_wr_opcode opcode = IBV_WR_RDMA_WRITE_WITH_IMM;  // rendezvous; put: WRITE; get: READ
};

// What mr_rkey serialises (WIA_RKEY_SIZE bytes): the region a peer may
// put to or get from.
inline constexpr std::uint32_t kRkeyMagic = 0x5756424bu;  // "WVBK"
struct WireRkey {
  std::uint32_t magic;
  std::uint32_t rkey;
  std::uint64_t base;
  std::uint64_t len;
  std::uint8_t pad[64 - 24];
};
static_assert(sizeof(WireRkey) == WIA_RKEY_SIZE);

// A message that arrived before its receive was posted.
struct Unexpected {
  std::uint64_t tag = 0;
  bool rts = false;
  std::uint64_t size = 0;
  std::uint64_t sender_id = 0;
  std::vector<char> data;  // eager
};

// One posted send WR: wr_id is its index in Ctx::ops_.
struct SendOp {
  Conn* conn = nullptr;
  Request* req = nullptr;
  int slot = -1;
  bool completes_req = false;  // eager send, rendezvous write, put or get; loopback: the flush
  const char* what = "send";   // for error messages (an error completion has no opcode)
  bool loopback = false;       // on Ctx::loop (conn is that QP's Conn)
  int recv_slot = -1;          // loopback write from an SRQ slot: repost it when done
};

// Work for the loopback QP (an RC QP of this endpoint connected to itself,
// as NCCL's flush QP): the NIC, not the CPU, moves bytes into a receive
// posted in device memory.
//  write: an eager payload, from registered host memory (its SRQ slot when
//         the receive was waiting; a send slot holding the copy of an
//         unexpected message's payload) to the receive's device
//         registration (its rkey, iova = the buffer);
//  flush: a 1-byte RDMA read of the received buffer into host memory,
//         posted after the write (or after a rendezvous write's immediate
//         arrived); a NIC answers it only once its earlier writes to that
//         memory are visible (PCIe reads do not pass posted writes), so the
//         receive completes on the read's completion.
struct LoopItem {
  Request* req = nullptr;
  bool flush = false;
  bool completes = false;     // its completion ends the receive (the flush, or the write without one)
  const char* src = nullptr;  // write: the payload in the SRQ slot (recv_slot >= 0)
  std::vector<char> data;     // write: the payload of an unexpected message (copied to a send slot)
  std::uint64_t len = 0;
  int recv_slot = -1;
};

class Conn {
 public:
  Conn() = default;
  Conn(const Conn&) = delete;
  Conn& operator=(const Conn&) = delete;

  ibv_qp* qp = nullptr;
  int fd = -1;  // TCP: handshake, then liveness
  bool established = false;
  bool failed = false;
  bool connector = false;
  std::string failure;
  std::string peer;  // "host node2 pid 4711 (QP 0x000123)"
  std::uint64_t cookie = 0;
  std::uint64_t deadline_ns = 0;
  QpInfo local{};
  std::vector<char> inbuf;  // handshake bytes received so far
  std::size_t sent = 0;     // handshake bytes sent so far

  std::uint32_t sq_used = 0;
  std::uint64_t peer_eof_ns = 0;  // when the handshake socket first read EOF (0: not yet)
  std::deque<OutItem> out;
  std::deque<Request*> posted;  // receives waiting for a message, in post order
  std::deque<Unexpected> unexpected;
  std::uint64_t next_send_id = 1;
  std::uint32_t next_recv_id = 1;
  std::unordered_map<std::uint64_t, Request*> rndv_sends;  // waiting for CTS
  std::unordered_map<std::uint32_t, Request*> rndv_recvs;  // waiting for the write
  std::unordered_set<Request*> requests;                   // the core's, still running
};

// An accepted TCP socket: reading the connector's QpInfo, then (QP at RTS,
// answer sent) waiting for the connector's one-byte "ready", so a
// connection is returned only once both QPs can receive and an abandoned
// connect never surfaces.
struct Pending {
  int fd = -1;
  std::vector<char> inbuf;
  std::unique_ptr<Conn> conn;  // set once the answer is sent
};

struct Listener {
  int fd = -1;
  std::vector<Pending> pending;
};

struct MrEntry {
  ibv_mr* mr = nullptr;
  std::uintptr_t base = 0;
  std::uint64_t len = 0;
  std::uint32_t refs = 0;
  // Device memory registered through its dma-buf (ibv_reg_dmabuf_mr, iova =
  // the device pointer). Not in the cache: only the caller's reg_mr makes
  // one, and the provider never reads or writes it with the CPU.
  bool device = false;
  // Does this region cover [p, p + n)?
  bool covers(const void* p, std::uint64_t n) const {
    const auto at = reinterpret_cast<std::uintptr_t>(p);
    return base <= at && n <= len && at - base <= len - n;
  }
};

struct MrHandle {
  MrEntry* entry = nullptr;
};

struct Ctx {
  const wia_host_services_v1_t* host = nullptr;
  Params params;
  Lib lib;
  std::mutex mu;  // everything below; every entry point takes it

  // The device and port (verbs_setup.cpp).
  std::string dev_name;
  ibv_context* dev = nullptr;
  ibv_pd* pd = nullptr;
  ibv_comp_channel* channel = nullptr;
  ibv_cq* cq = nullptr;
  ibv_srq* srq = nullptr;
  std::uint8_t port = 1;
  int gid_index = 0;
  ibv_port_attr port_attr{};
  ibv_gid gid{};
  std::uint32_t max_inline = 0;
  std::uint32_t oob_ipv4 = 0;  // network order
  std::string oob_text;
  std::unique_ptr<char[]> recv_slab, send_slab;
  ibv_mr* recv_mr = nullptr;
  ibv_mr* send_mr = nullptr;
  std::vector<int> free_send_slots;
  std::uint32_t unarmed_events = 0;

  std::unordered_map<std::uint32_t, Conn*> by_qpn;
  std::unordered_set<Conn*> conns;
  std::vector<SendOp> ops_;
  std::vector<std::uint32_t> free_ops_;
  std::map<std::pair<std::uintptr_t, std::uint64_t>, MrEntry*> cache;
  std::uint64_t reg_calls = 0;
  std::string reg_error;             // why the last failed registration failed
  std::vector<pollfd> liveness_fds;  // check_liveness's, kept to reuse their memory
  std::vector<Conn*> liveness_who;
  std::uint64_t next_psn = 0;

  // The loopback QP (verbs_data.cpp): made by the first irecv into device
  // memory; after an error completion it is remade once drained.
  std::unique_ptr<Conn> loop;
  std::deque<LoopItem> loop_out;  // waiting for room in its send queue or a send slot
  char flush_byte[64] = {};       // where flush reads land (registered: flush_mr)
  ibv_mr* flush_mr = nullptr;

  std::uint64_t now_ns() const { return host->clock_ns(host->host_ctx); }
  void log(wia_log_level_t level, const char* fmt, ...) const __attribute__((format(printf, 3, 4)));
  wia_status_t fail(wia_status_t status, const char* fmt, ...) const
      __attribute__((format(printf, 3, 4)));

  // verbs_setup.cpp
  wia_status_t load_library();
  wia_status_t open_device();
  void close_device();
  wia_status_t reg(void* ptr, std::uint64_t size, MrEntry** out);  // the registration cache
  // Device memory through its dma-buf (reg_mr of WIA_MR_DEVICE).
  wia_status_t reg_device(const wia_mr_desc_v1_t& desc, MrEntry** out);
  void unreg(MrEntry* e);

  // verbs_conn.cpp
  wia_status_t listen(void* handle, Listener** out);
  wia_status_t connect(const void* handle, std::uint64_t cookie, Conn** conn);
  wia_status_t accept(Listener* l, std::uint64_t* cookie, Conn** out);
  void close_listener(Listener* l);
  void close(Conn* c);
  wia_status_t qp_create(Conn* c);
  wia_status_t qp_connect(Conn* c, const QpInfo& remote);
  void check_liveness();

  // verbs_data.cpp
  wia_status_t isend(Conn* c, const char* buf, std::uint64_t size, std::uint64_t tag, MrHandle* mr,
                     wia_request_t* out);
  wia_status_t irecv(Conn* c, char* buf, std::uint64_t size, std::uint64_t tag, MrHandle* mr,
                     wia_request_t* out);
  wia_status_t test(Request* r, int32_t* done, std::uint64_t* size);
  wia_status_t rma(Conn* c, bool put, char* local, std::uint64_t size, MrHandle* mr,
                   std::uint64_t remote_addr, const void* rkey, wia_request_t* out);
  wia_status_t wait_fds(Conn* c, pollfd* fds, std::uint32_t capacity, std::uint32_t* count);
  bool progress();  // true when anything happened
  void fail_conn(Conn* c, const std::string& why);
  void release(Request* r);  // frees once both the core and the device are done
  void flush_out(Conn* c);
  std::uint32_t alloc_op();  // a free index of ops_ (a send WR's wr_id)
  wia_status_t post_recv_slot(std::uint32_t slot);
  void on_recv(const ibv_wc& wc);
  void on_send(const ibv_wc& wc);
  void on_loop_done(const SendOp& op, const ibv_wc& wc);
  bool on_message(Conn* c, const MsgHeader& h, const char* payload, std::uint32_t slot);
  wia_status_t open_loopback();
  void close_loopback();
  void land(Request* r, LoopItem item);  // write (if any) + flush on the loopback QP
  void flush_loop();
  void fail_loop_items(const std::string& why);
  void deliver(Request* r, Unexpected& u);
  void finish(Request* r, wia_status_t status, std::string error = {});
};

std::string size_text(std::uint64_t n);
std::string errno_text(int err);

}  // namespace wia::verbs
