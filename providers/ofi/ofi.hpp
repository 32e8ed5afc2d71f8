// SPDX-License-Identifier: Apache-2.0
// Internal declarations of the ofi transport provider (libfabric RDM
// endpoints with tagged messages). See ofi_provider.cpp for the overview
// and docs/transport-ofi.md for the design and the measurements.
#pragma once

#include <poll.h>
#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_eq.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>
#include <rdma/fi_tagged.h>
#include <wia/provider.h>

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>

namespace wia::ofi {

// --- libfabric, resolved with dlopen at init --------------------------------
// Only these functions are exported by libfabric; everything else in its
// headers (fi_tsend, fi_cq_read, fi_mr_reg, ...) is an inline call through
// the ops tables of the objects these return, so the provider needs no
// link-time dependency and loads on machines without libfabric.
#define WIA_OFI_SYMBOLS(X)                                                                   \
  X(fi_getinfo, int,                                                                         \
    (uint32_t, const char*, const char*, uint64_t, const struct fi_info*, struct fi_info**)) \
  X(fi_freeinfo, void, (struct fi_info*))                                                    \
  X(fi_dupinfo, struct fi_info*, (const struct fi_info*))                                    \
  X(fi_fabric, int, (struct fi_fabric_attr*, struct fid_fabric**, void*))                    \
  X(fi_strerror, const char*, (int))                                                         \
  X(fi_version, uint32_t, (void))

struct Lib {
  void* handle = nullptr;
  std::string path;
#define WIA_OFI_DECLARE(name, ret, args) ret(*name) args = nullptr;
  WIA_OFI_SYMBOLS(WIA_OFI_DECLARE)
#undef WIA_OFI_DECLARE
};

// --- wire layout --------------------------------------------------------------
// A wire tag: bit 63 control; then for control messages bit 62 "to a
// listener", for data bit 62 "announce" and bit 61 "bulk" (see below);
// bits 40..60 the receiver's connection (or listener) id; bits 0..39 the
// user's tag.
//
// Messages up to kDirectMax are sent as they are; every receive is posted
// into a kDirectMax bounce buffer and a direct message is copied out, so
// the fabric never truncates (rxm in 1.17 stops delivering after it
// reports FI_ETRUNC for an eager message) and a header never lands in the
// caller's buffer.
// Larger ones are announced: a 16-byte header {size} on the user's tag,
// then the payload on the "bulk" variant of that tag, which the receiver
// posts once the header told it the size. The fabric providers' own
// rendezvous paths (rxm over tcp, shm's CMA) never complete a receive
// smaller than the message in libfabric 1.17; announced, a truncated
// message is detected before any of it is received, drained into scratch
// memory, and fails with WIA_ERROR_REMOTE as the ABI asks. A receive is
// posted with the announce bit ignored, so direct and announced messages
// of one tag keep their order.
// Rendezvous mode (ofi.rendezvous; on by default for shm) changes two
// things, both for libfabric 1.17's shm (docs/transport-ofi.md):
//  - every message is framed: a small one travels as {Announce with
//    kAnnounceInline, payload} in one message, so all messages carry the
//    announce bit and receives match it exactly. shm matches an unexpected
//    message against a new receive with the ignore mask of the freestack
//    entry the message was parked in (stale), not the receive's, so a
//    receive relying on "ignore the announce bit" misses headers that came
//    early, at random;
//  - the payload of a large message waits until the receiver, having
//    matched the header with a posted receive and posted the payload's,
//    answers CTS {send id}, so no large message is ever unexpected.
inline constexpr std::uint32_t kUserTagBits = 40;
inline constexpr std::uint64_t kUserTagMask = (1ull << kUserTagBits) - 1;
inline constexpr std::uint32_t kIdBits = 21;
inline constexpr std::uint64_t kMaxId = (1ull << kIdBits) - 1;
inline constexpr std::uint64_t kCtlBit = 1ull << 63;
inline constexpr std::uint64_t kListenBit = 1ull << 62;
inline constexpr std::uint64_t kAnnounceBit = 1ull << 62;
inline constexpr std::uint64_t kBulkBit = 1ull << 61;
inline constexpr std::uint64_t kDirectMax = 4096;
inline constexpr std::uint32_t kAnnounceMagic = 0x574f4648u;  // "WOFH"
inline constexpr std::uint32_t kAnnounceWantsCts = 1;         // Announce::flags
inline constexpr std::uint32_t kAnnounceInline = 2;           // the payload follows the header
struct Announce {
  std::uint32_t magic;
  std::uint32_t flags;
  std::uint64_t size;
  std::uint64_t send_id;  // kAnnounceWantsCts: what the CTS names
};
static_assert(sizeof(Announce) == 24);
// A bounce buffer holds a direct message or a framed one.
inline constexpr std::uint64_t kBounceSize = kDirectMax + sizeof(Announce);
// Scratch memory a truncated announced message may be drained into.
inline constexpr std::uint64_t kMaxDrain = 1ull << 30;
inline constexpr std::uint32_t kTagBitsNeeded = 64;  // of the fabric's mem_tag_format
constexpr std::uint64_t data_tag(std::uint64_t id, std::uint64_t user) {
  return (id << kUserTagBits) | user;
}
constexpr std::uint64_t ctl_tag(std::uint64_t id) { return kCtlBit | (id << kUserTagBits); }
// A send from an endpoint to itself that moves a message from a bounce
// buffer into device memory: connection id 0, which no connection or
// listener is ever given (Endpoint::new_id), with the bulk bit.
constexpr std::uint64_t loop_tag(std::uint64_t seq) { return kBulkBit | (seq & kUserTagMask); }
constexpr std::uint64_t listen_tag(std::uint64_t id) {
  return kCtlBit | kListenBit | (id << kUserTagBits);
}

inline constexpr std::uint32_t kHandleMagic = 0x574f4649u;  // "WOFI"
inline constexpr std::uint8_t kLayout = 1;
inline constexpr std::size_t kMaxAddr = 112;
struct WireHandle {
  std::uint32_t magic;
  std::uint8_t layout;
  std::uint8_t reserved;
  std::uint16_t addrlen;
  std::uint64_t listener_id;
  std::uint8_t addr[kMaxAddr];  // fi_getname of the listener's endpoint
};
static_assert(sizeof(WireHandle) == WIA_TRANSPORT_HANDLE_SIZE);

// The remote key mr_rkey serialises (WIA_RKEY_SIZE bytes): the fabric key
// and how the peer turns its virtual address into the fabric's (an offset
// from the region's start unless the fabric uses FI_MR_VIRT_ADDR).
inline constexpr std::uint32_t kRkeyMagic = 0x574f464bu;  // "WOFK"
struct WireRkey {
  std::uint32_t magic;
  std::uint32_t virt_addr;  // 1: remote addresses are virtual addresses
  std::uint64_t key;
  std::uint64_t base;  // the region's virtual start
  std::uint64_t len;
};
static_assert(sizeof(WireRkey) <= WIA_RKEY_SIZE);

inline constexpr std::uint32_t kCtlMagic = 0x574f4643u;  // "WOFC"
enum class CtlKind : std::uint8_t { connect = 1, ack = 2, close = 3, cts = 4 };
// Connection setup and teardown, on the control tags (T3 in
// docs/provider-abi.md). pid, start time and boot id let a peer on the same
// host notice that this process went away (see Conn::peer_alive).
struct CtlMsg {
  std::uint32_t magic;
  CtlKind kind;
  std::uint8_t reserved;
  std::uint16_t addrlen;
  std::uint64_t conn_id;  // the sender's connection id
  std::uint64_t cookie;   // connect: the core's cookie; cts: the send id
  std::uint64_t start_time;
  std::uint32_t pid;
  std::uint32_t reserved2;
  std::uint8_t boot_id[16];
  std::uint8_t addr[kMaxAddr];  // connect: the connector's fi_getname
};

// --- parameters and discovered fabric endpoints --------------------------------

struct Params {
  std::string enable = "auto";      // auto | on | off
  std::string provider;             // FI_PROVIDER-style; empty: FI_PROVIDER, else any
  std::string domain;               // fi_info domain name; empty: any
  std::string inter_node = "rdma";  // rdma | all
  std::string library = "libfabric.so.1";
  std::uint64_t max_message = 0;  // 0: the fabric's max_msg_size
  std::int64_t connect_timeout_ms = 30000;
  std::int64_t liveness_ms = 100;
  std::string rendezvous = "auto";  // clear-to-send before payloads: auto (shm) | on | off
  std::string hmem = "auto";        // device memory through FI_HMEM: auto | off
};

class Endpoint;

// One wia endpoint per (fabric provider, domain) that fi_getinfo offered.
struct EndpointInfo {
  fi_info* info = nullptr;  // owned (fi_dupinfo)
  std::string prov;         // "tcp;ofi_rxm"
  std::string domain;       // "eth0"
  std::string fabric;       // "192.0.2.0/24"
  bool sockets = false;     // tcp, sockets, udp, net, shm: no RDMA hardware under it
  bool shm = false;
  bool loopback = false;
  bool rma = false;  // the fabric offered FI_RMA: put/get (WIA_TRANSPORT_FLAG_RMA)
  // The fabric claimed FI_HMEM: device memory registered with its memory
  // interface (WIA_TRANSPORT_FLAG_DEVICE_MEMORY, ofi_mr.cpp).
  bool hmem = false;
  std::uint32_t flags = 0;  // WIA_TRANSPORT_FLAG_*
  std::uint64_t max_msg = 0;
  std::string pci_bus_id;
  std::uint64_t speed_mbps = 0;
  std::unique_ptr<Endpoint> open;  // fabric objects, made at first use
};

struct Ctx {
  const wia_host_services_v1_t* host = nullptr;
  Params params;
  Lib lib;
  std::string requested;  // the provider filter in effect, and where it came from
  std::vector<EndpointInfo> endpoints;
  std::vector<std::string> verdicts;  // each fi_getinfo result and why taken or not
  std::mutex open_mu;

  std::uint64_t now_ns() const { return host->clock_ns(host->host_ctx); }
  void log(wia_log_level_t level, const char* fmt, ...) const __attribute__((format(printf, 3, 4)));
  wia_status_t fail(wia_status_t status, const char* fmt, ...) const
      __attribute__((format(printf, 3, 4)));
  std::string fi_error(int rc) const;  // "-FI_EAGAIN (Resource temporarily unavailable)"
  // The endpoint's fabric objects, opened on first use.
  wia_status_t endpoint(int32_t index, Endpoint** out);
};

// --- requests, connections, listeners -------------------------------------------

class Conn;
struct Listener;
struct MrEntry;

inline constexpr std::uint32_t kNotPending = ~0u;

// Requests come from the endpoint's pool (new_request / finish) and are
// reset to this default state when they go back to it: a message costs no
// heap allocation once the pool has grown to the peak number in flight.
struct Request {
  fi_context2 fctx{};  // first: FI_CONTEXT / FI_CONTEXT2 modes
  enum class Kind : std::uint8_t { data, ctl_recv, ctl_send, listen_recv };
  enum class State : std::uint8_t { pending, done, failed };
  Kind kind = Kind::data;
  State state = State::pending;
  bool is_send = false;      // sends, puts and gets: not cancellable
  const char* op = nullptr;  // "put" / "get": what an error names
  bool in_fabric = false;    // libfabric holds the context until its completion
  bool user_gone = false;    // no longer reachable by the core (tested or orphaned)
  Conn* conn = nullptr;
  Listener* listener = nullptr;
  std::uint64_t size = 0;
  std::uint64_t capacity = 0;
  std::uint64_t tag = 0;
  wia_status_t status = WIA_SUCCESS;
  std::string error;
  MrEntry* auto_mr = nullptr;  // registration made for this request (FI_MR_LOCAL)
  // Control messages: the message, where it goes, and the connection it
  // serves (by id: the connection may be closed before libfabric is done).
  CtlMsg msg{};
  std::uint32_t ctl_len = sizeof(CtlMsg);
  fi_addr_t to = FI_ADDR_UNSPEC;
  // Receives: the user's buffer; the bounce buffer the first message part
  // lands in; the announced size; scratch to drain a message that does
  // not fit.
  char* buf = nullptr;
  void* desc = nullptr;
  bool announced = false;
  bool truncated = false;
  std::uint64_t announced_size = 0;
  std::unique_ptr<char[]> scratch;
  std::unique_ptr<char[]> bounce;  // kBounceSize bytes
  // Receives into device memory (a registration with a device interface):
  // the CPU never touches the buffer. A message that arrived in the bounce
  // buffer is moved in by the fabric, a send from the bounce to this
  // endpoint itself (loop_send, the helper request) received straight into
  // the buffer with the registration's descriptor (Endpoint::land_in_device).
  bool device = false;
  Request* loop_send = nullptr;    // the receive: its helper send, until it completes
  Request* loop_target = nullptr;  // the helper send: the receive it feeds
  std::uint64_t owner_id = 0;
  // Announced sends under clear-to-send: the id the receiver's CTS names.
  std::uint64_t send_id = 0;
  // Position in conn->pending (kNotPending: not there).
  std::uint32_t pending_index = kNotPending;
};

struct Peer {
  std::uint32_t pid = 0;
  std::uint64_t start_time = 0;
  bool same_host = false;
};

class Conn {
 public:
  Conn(Endpoint* ep, std::uint64_t id) : ep_(ep), id_(id) {}
  ~Conn() = default;
  Conn(const Conn&) = delete;
  Conn& operator=(const Conn&) = delete;

  std::uint64_t id() const { return id_; }
  Endpoint* ep() const { return ep_; }

  Endpoint* ep_;
  std::uint64_t id_;
  std::uint64_t peer_id = 0;
  bool established = false;
  bool failed = false;
  // The peer closed the connection (its CLOSE came, after everything it had
  // sent): receives may still be posted, and complete when a message sent
  // before the CLOSE is waiting for them (Endpoint::post).
  bool peer_closed = false;
  std::string failure;
  fi_addr_t addr = FI_ADDR_UNSPEC;
  std::string peer_text;  // "fi_sockaddr_in://127.0.0.1:4021 (pid 123)"
  Peer peer;
  std::uint64_t deadline_ns = 0;  // connect
  std::uint64_t next_check_ns = 0;
  Request* ctl_recv = nullptr;
  // The core's requests not yet reported done by test(); a flat vector
  // with each request's index in it, so adding and removing (once per
  // message) allocate nothing and cost O(1).
  std::vector<Request*> pending;
  void add_pending(Request* r) {
    r->pending_index = static_cast<std::uint32_t>(pending.size());
    pending.push_back(r);
  }
  void remove_pending(Request* r) {
    if (r->pending_index == kNotPending) return;
    Request* last = pending.back();
    pending[r->pending_index] = last;
    last->pending_index = r->pending_index;
    pending.pop_back();
    r->pending_index = kNotPending;
  }
  // Announced sends whose header is out and whose CTS has not come.
  std::unordered_map<std::uint64_t, Request*> awaiting_cts;
};

struct Listener {
  Endpoint* ep = nullptr;
  std::uint64_t id = 0;
  Request* recv = nullptr;
  std::vector<std::unique_ptr<Conn>> ready;  // accepted, not yet returned
  std::vector<std::uint64_t> cookies;
};

struct MrEntry {
  fid_mr* mr = nullptr;
  void* desc = nullptr;
  std::uintptr_t base = 0;
  std::uint64_t len = 0;
  std::uint32_t iface = 0;
  std::uint64_t device = 0;
  std::uint32_t refs = 0;
};

// What reg_mr returns: a reference to a cache entry.
struct MrHandle {
  Endpoint* ep = nullptr;
  MrEntry* entry = nullptr;
};

// The fabric objects of one wia endpoint, shared by all its connections
// and listeners: one RDM endpoint, its AV and CQ. Everything is serialised
// by `mu`: test() on two requests of one endpoint may run concurrently.
class Endpoint {
 public:
  Endpoint(Ctx* ctx, EndpointInfo* info) : ctx_(ctx), info_(info) {}
  ~Endpoint();
  Endpoint(const Endpoint&) = delete;
  Endpoint& operator=(const Endpoint&) = delete;

  wia_status_t open();  // ofi_setup.cpp
  wia_status_t open_objects(fi_info* info, const std::string& where);

  // ofi_conn.cpp; the caller holds mu.
  wia_status_t listen(void* handle, Listener** out);
  wia_status_t connect(const void* handle, std::uint64_t cookie, Conn** conn);
  wia_status_t continue_connect(Conn* c);
  wia_status_t accept(Listener* l, std::uint64_t* cookie, Conn** conn);
  void close_listener(Listener* l);
  void close(Conn* c);
  wia_status_t post(Conn* c, bool send, void* buf, std::uint64_t size, std::uint64_t tag,
                    MrHandle* mr, wia_request_t* out);
  wia_status_t rma(Conn* c, bool write, void* local, std::uint64_t size, MrHandle* mr,
                   std::uint64_t remote_addr, const WireRkey& key, wia_request_t* out);
  wia_status_t rkey(const MrHandle* mr, WireRkey* out) const;
  wia_status_t test(Request* r, int32_t* done, std::uint64_t* size);
  wia_status_t wait_fds(Conn* c, pollfd* fds, std::uint32_t capacity, std::uint32_t* count);
  void progress();

  // ofi_mr.cpp; the caller holds mu.
  wia_status_t reg(void* ptr, std::uint64_t size, std::uint32_t iface, std::uint64_t device,
                   MrEntry** out);
  void unreg(MrEntry* e);
  // The descriptor a transfer of [buf, +len) passes: the caller's
  // registration, or under FI_MR_LOCAL one made for it (*auto_mr, released
  // with the request), else none.
  wia_status_t local_desc(void* buf, std::uint64_t len, MrHandle* mr, MrEntry** auto_mr,
                          void** desc);

  Ctx* ctx() const { return ctx_; }
  const EndpointInfo& info() const { return *info_; }
  std::mutex mu;

  // Fabric objects (ofi_setup.cpp).
  fid_fabric* fabric = nullptr;
  fid_domain* domain = nullptr;
  fid_av* av = nullptr;
  fid_cq* cq = nullptr;
  fid_ep* ep = nullptr;
  int wait_fd = -1;
  std::uint8_t name[kMaxAddr]{};
  std::size_t namelen = 0;
  bool mr_local = false, mr_endpoint = false, mr_prov_key = false, mr_virt_addr = false;
  bool delivery_complete = true;  // cleared when the fabric refuses FI_DELIVERY_COMPLETE writes
  std::uint64_t next_key = 1;
  std::uint64_t mr_reg_calls = 0;
  bool rendezvous = false;  // framed messages; payloads wait for the receiver's CTS
  // The fabric's inject_size: a send whose wire message fits goes out with
  // fi_tinject (copied by the fabric, no completion to reap).
  std::uint64_t inject_size = 0;

 private:
  Request* new_request(Request::Kind kind, Conn* c);  // from the pool
  void finish(Request* r);  // back to the pool when both libfabric and the core are done with it
  void release_all_requests();  // ~Endpoint, after the fabric endpoint is closed
  wia_status_t post_inject(Conn* c, const void* buf, std::uint64_t size, std::uint64_t tag,
                           wia_request_t* out);
  std::unique_ptr<char[]> take_bounce();
  void give_bounce(Request* r);
  wia_status_t post_ctl(Request* r);  // a control send or receive, queued on -FI_EAGAIN
  wia_status_t send_ctl(Conn* c, fi_addr_t to, std::uint64_t tag, CtlKind kind,
                        std::uint64_t cookie);
  void fill_ctl(CtlMsg& m, CtlKind kind, std::uint64_t conn_id, std::uint64_t cookie) const;
  void on_completion(Request* r, const fi_cq_tagged_entry& e);
  void on_data_recv(Request* r, const fi_cq_tagged_entry& e);
  // A message of `len` bytes in r's bounce buffer at `from`, for a receive
  // into device memory: handed to the fabric (ofi_data.cpp).
  void land_in_device(Request* r, const char* from, std::uint64_t len);
  void post_loop(Request* h);  // posts what of h's loop is not posted yet
  void fail_loop(Request* h, const std::string& why);
  void on_error(Request* r, const fi_cq_err_entry& e);
  void on_ctl(Request* r);
  void on_connect_msg(Listener* l, const CtlMsg& m);
  void on_cts(Conn* c, std::uint64_t send_id);
  void send_released();           // payloads whose CTS came, in order
  void forget_released(Conn* c);  // c fails or closes: drop its queued payloads
  void fail_conn(Conn* c, const std::string& why);
  void check_liveness(Conn* c, std::uint64_t now);
  std::string addr_text(const void* raw) const;
  Conn* make_conn(const void* raw, std::uint64_t id, std::string* error);
  std::uint64_t new_id();

  Ctx* ctx_;
  EndpointInfo* info_;
  std::uint64_t next_id_ = 1;
  std::unordered_map<std::uint64_t, Conn*> conns_;
  std::unordered_map<std::uint64_t, Listener*> listeners_;
  // The request pool: slabs own every request ever made (live or free);
  // free_ lists those not in use.
  std::vector<std::unique_ptr<Request[]>> slabs_;
  std::vector<Request*> free_;
  std::uint64_t next_liveness_ns_ = 0;  // when progress next sweeps the connections
  // Who this process is, for every control message (fill_ctl), read once at
  // open: /proc reads cost ~15 us here, once per clear-to-send otherwise.
  std::uint32_t self_pid_ = 0;
  std::uint64_t self_start_time_ = 0;
  std::uint8_t self_boot_id_[16] = {};
  std::vector<Request*> retry_;         // control posts that met -FI_EAGAIN
  std::deque<Request*> released_;       // CTS came; fi_tsend of the payload met -FI_EAGAIN
  std::uint64_t next_send_id_ = 1;
  // This endpoint's own address in its AV (land_in_device), inserted at
  // first use, and the sequence of those sends' tags.
  fi_addr_t self_addr_ = FI_ADDR_UNSPEC;
  std::uint64_t next_loop_seq_ = 0;
  std::vector<Request*> loop_retry_;  // loop helpers whose posts met -FI_EAGAIN
  std::vector<std::unique_ptr<char[]>> bounce_pool_;
  std::map<std::tuple<std::uintptr_t, std::uint64_t, std::uint32_t, std::uint64_t>, MrEntry*>
      cache_;
  friend class Conn;
};

// Host facts used by the liveness check.
std::uint64_t process_start_time(std::uint32_t pid);  // 0 when gone or a zombie
void boot_id(std::uint8_t out[16]);

std::string size_text(std::uint64_t n);  // "1 MiB", "4097 B"
wia_status_t discover(Ctx& ctx);         // ofi_setup.cpp
wia_status_t load_library(Ctx& ctx);

}  // namespace wia::ofi
