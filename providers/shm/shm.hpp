// SPDX-License-Identifier: Apache-2.0
// Internal declarations of the shm transport provider, shared by its files:
// settings and the provider context, the per-connection spin lock, the two
// rings, the objects behind the opaque handles, and what each file offers
// the others. shm_provider.cpp has the design notes; shm_wire.hpp is what
// the two processes share.
#pragma once

#include <sched.h>
#include <sys/mman.h>
#include <time.h>
#include <wia/provider.h>

#include <atomic>
#include <chrono>
#include <cinttypes>
#include <cstdint>
#include <cstring>
#include <deque>
#include <exception>
#include <memory>
#include <new>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "shm_queues.hpp"
#include "shm_wire.hpp"
#include "wia_common/text.hpp"

namespace wia::shm {

using wire::RecordHeader;

// ---------------------------------------------------------------------------
// Provider context, configuration, messages

enum class CmaMode { kAuto, kOn, kOff };

struct Settings {
  std::uint64_t ring_size = 4u << 20;
  std::uint64_t eager_size = 16u << 10;
  std::uint64_t chunk_size = 256u << 10;
  std::uint64_t cma_threshold = 64u << 20;  // docs/transport-shm.md: why so high
  std::uint64_t cma_piece = 512u << 10;
  std::uint64_t unexpected_limit = 64u << 20;
  std::uint64_t liveness_interval_ns = 1'000'000;
  std::uint64_t handshake_timeout_ns = 30'000'000'000ull;
  CmaMode cma = CmaMode::kAuto;
  bool set_ptracer = false;
};

// A word a peer reads at connection set-up to learn whether CMA works
// (ptrace permission, Yama, capabilities) before the first large message.
// Defined in shm_provider.cpp, set once by init().
extern volatile std::uint64_t g_cma_probe_word;

inline std::uint64_t monotonic_ns() {
  return static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                        std::chrono::steady_clock::now().time_since_epoch())
                                        .count());
}

using common::errno_text;

using common::format;  // printf into a std::string

struct Provider {
  const wia_host_services_v1_t* host = nullptr;
  Settings cfg;
  std::uint8_t boot_id[16] = {};

  wia_status_t fail(wia_status_t st, const std::string& message) const noexcept {
    if (host != nullptr && host->set_error != nullptr)
      host->set_error(host->host_ctx, ("shm: " + message).c_str());
    return st;
  }
  void log(wia_log_level_t level, const std::string& message) const noexcept {
    if (host != nullptr && host->log != nullptr) host->log(host->host_ctx, level, message.c_str());
  }
  std::uint64_t now_ns() const noexcept {
    // The core's time base when offered, so timeouts line up with its own.
    if (host != nullptr && host->clock_ns != nullptr) return host->clock_ns(host->host_ctx);
    return monotonic_ns();
  }
};

// ---------------------------------------------------------------------------
// Per-connection lock

// Serialises the calls on one connection. Held for one bounded progress
// step, and nearly always uncontended (the ABI allows concurrent test()
// calls, the core rarely makes them), where pthread_mutex_lock/unlock
// cost as much as the rest of a small send. Waiters spin briefly, then
// yield, then sleep: an oversubscribed machine does not burn the holder's
// core, and a holder of lower real-time priority still gets to run.
class SpinLock {
 public:
  void lock() noexcept {
    for (unsigned spins = 0; locked_.exchange(true, std::memory_order_acquire);) {
      while (locked_.load(std::memory_order_relaxed)) {
        if (++spins < 128) {
          cpu_relax();
        } else if (spins < 256) {
          sched_yield();
        } else {
          const timespec pause{0, 20'000};
          nanosleep(&pause, nullptr);
        }
      }
    }
  }
  void unlock() noexcept { locked_.store(false, std::memory_order_release); }

 private:
  static void cpu_relax() noexcept {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    asm volatile("yield" ::: "memory");
#endif
  }
  std::atomic<bool> locked_{false};
};

// ---------------------------------------------------------------------------
// Rings

struct TxRing {
  wire::RingControl* ctl = nullptr;
  std::uint8_t* data = nullptr;
  std::uint64_t size = 0;
  std::uint64_t head = 0;         // our own head (the shared one lags until commit)
  std::uint64_t pos = 0;          // head % size, kept so the hot path needs no division
  std::uint64_t cached_tail = 0;  // last tail read from the consumer
  std::uint32_t seq = 0;

  // Space for one record of `span` bytes, writing a PAD first when the
  // record would cross the end of the ring. Returns the record's header
  // or nullptr when the ring is too full now. Writes stay inside the ring
  // whatever the (untrusted) consumer tail says.
  RecordHeader* reserve(std::uint64_t span) {
    const std::uint64_t contig = size - pos;
    const std::uint64_t need = span <= contig ? span : contig + span;
    if (need > size - (head - cached_tail)) {
      cached_tail = ctl->tail.load(std::memory_order_acquire);
      if (head - cached_tail > size || need > size - (head - cached_tail)) return nullptr;
    }
    if (span > contig) {
      auto* pad = reinterpret_cast<RecordHeader*>(data + pos);
      *pad = RecordHeader{wire::kPad, 0, seq++, 0, contig - sizeof(RecordHeader), 0, 0, 0};
      head += contig;
      pos = 0;
    }
    return reinterpret_cast<RecordHeader*>(data + pos);
  }
  void commit(std::uint64_t span) {
    head += span;
    pos += span;  // span <= size - pos: reserve() made room before the end
    if (pos == size) pos = 0;
    ctl->head.store(head, std::memory_order_release);
  }
};

struct RxRing {
  wire::RingControl* ctl = nullptr;
  const std::uint8_t* data = nullptr;
  std::uint64_t size = 0;
  std::uint64_t tail = 0;
  std::uint64_t pos = 0;  // tail % size, kept so the hot path needs no division
  std::uint64_t cached_head = 0;
  std::uint32_t seq = 0;

  enum class Peek { kEmpty, kRecord, kCorrupt };

  // Copies the next record's header into *h (the peer could rewrite the
  // shared one while we look) and validates everything that decides where
  // we read. *payload points at the record's payload in the ring.
  Peek next(RecordHeader* h, const std::uint8_t** payload, std::string* why) {
    if (tail == cached_head) {
      cached_head = ctl->head.load(std::memory_order_acquire);
      if (tail == cached_head) return Peek::kEmpty;
    }
    const std::uint64_t avail = cached_head - tail;
    if (avail > size || avail % wire::kRecordAlign != 0) {
      *why =
          format("ring head %" PRIu64 " is impossible for tail %" PRIu64 " and ring size %" PRIu64,
                 cached_head, tail, size);
      return Peek::kCorrupt;
    }
    const std::uint64_t contig = size - pos;
    std::memcpy(h, data + pos, sizeof(*h));
    if (h->seq != seq) {
      *why = format("record sequence %" PRIu32 " where %" PRIu32 " was due", h->seq, seq);
      return Peek::kCorrupt;
    }
    if (h->type < wire::kPad || h->type > wire::kFin) {
      *why = format("unknown record type %u (sequence %" PRIu32 ")", h->type, h->seq);
      return Peek::kCorrupt;
    }
    if (h->len > contig - sizeof(RecordHeader) || wire::record_span(h->len) > avail) {
      *why = format("record length %" PRIu64 " overruns the ring (%" PRIu64 " bytes readable)",
                    h->len, std::min(avail, contig) - sizeof(RecordHeader));
      return Peek::kCorrupt;
    }
    if (h->type == wire::kPad && wire::record_span(h->len) != contig) {
      *why = format("padding of %" PRIu64 " bytes does not reach the end of the ring", h->len);
      return Peek::kCorrupt;
    }
    *payload = data + pos + sizeof(RecordHeader);
    return Peek::kRecord;
  }
  void consume(const RecordHeader& h) {
    const std::uint64_t span = wire::record_span(h.len);
    tail += span;
    pos += span;  // next() checked that the record ends inside the ring
    if (pos == size) pos = 0;
    ++seq;
    ctl->tail.store(tail, std::memory_order_release);
  }
};

// ---------------------------------------------------------------------------
// Objects behind the opaque handles

struct Conn;

enum class Stage : std::uint8_t {
  kQueued,     // send: waiting for ring space for its EAGER/RTS record
  kWaitPeer,   // send: RTS written, waiting for CTS or FIN
  kStreaming,  // send: CTS received, DATA records being written
  kPosted,     // recv: waiting for a matching message
  kCma,        // recv: pulling with process_vm_readv
  kStaged,     // recv: CTS sent (or queued), waiting for DATA
  kDone,
};

struct Request {
  Conn* conn = nullptr;
  Request* qnext = nullptr;  // the one queue it waits in (out_sends, streaming, cma_recvs, posted)
  Request* live_prev = nullptr;  // Conn::live: every request not yet released by test()
  Request* live_next = nullptr;
  bool is_send = false;
  Stage stage = Stage::kQueued;
  std::uint8_t* buf = nullptr;  // const for sends; never written then
  std::uint64_t capacity = 0;   // bytes posted
  std::uint64_t tag = 0;
  std::uint64_t id = 0;         // send id (in RTS) or recv id (in CTS)
  std::uint64_t msg_size = 0;   // bytes of the matched message
  std::uint64_t offset = 0;     // bytes moved so far (staged / CMA)
  std::uint64_t peer_id = 0;    // send: the peer's recv id; recv: the peer's send id
  std::uint64_t peer_addr = 0;  // recv by CMA: the sender's buffer
  wia_status_t status = WIA_SUCCESS;
  std::string error;
};

// A message that arrived before its receive was posted. Small eager
// payloads stay inside the node (nodes are recycled), larger ones get a
// heap buffer.
constexpr std::uint64_t kInlineUnexpected = 256;
struct Unexpected {
  Unexpected* qnext = nullptr;
  std::uint16_t type = 0;  // kEager or kRts
  std::uint16_t flags = 0;
  std::uint64_t msg_size = 0;
  std::uint64_t send_id = 0;
  std::uint64_t addr = 0;
  std::unique_ptr<std::uint8_t[]> data;  // eager payload above kInlineUnexpected bytes
  std::uint64_t capacity = 0;            // bytes allocated at data
  alignas(16) std::uint8_t inline_data[kInlineUnexpected];

  const std::uint8_t* payload() const { return data ? data.get() : inline_data; }
};

// Objects kept for reuse per connection, beyond which released ones are
// freed: enough for every request of a collective step, and bounded so a
// burst does not pin memory for the connection's life.
constexpr std::size_t kMaxFreeRequests = 1024;
constexpr std::size_t kMaxFreeUnexpected = 256;
// An idle progress step reads the clock only every this many calls (the
// clock read was the largest single cost of a polling test()); the peer
// check still runs at most every liveness_interval_us.
constexpr std::uint32_t kIdleStepsPerClockRead = 64;

// A record to write that is not a message of ours (CTS, FIN).
struct Control {
  RecordHeader header;
};

enum class ConnState { kConnecting, kUp, kFailed };

struct Conn {
  Provider* provider = nullptr;
  SpinLock mu;  // test() of two requests of one connection may run concurrently
  ConnState state = ConnState::kConnecting;
  int sock = -1;
  int peer_pid = 0;
  int peer_pidfd = -1;  // pins the peer's identity for CMA (pids are reused)
  void* segment = MAP_FAILED;
  std::size_t segment_len = 0;
  TxRing tx;
  RxRing rx;
  std::uint64_t started_ns = 0;
  std::uint64_t last_liveness_ns = 0;

  bool cma_readable = false;   // we may pull the peer's buffers (probe passed, CMA allowed)
  bool peer_may_read = false;  // the peer may pull ours (we allow, it said nothing against)
  std::uint64_t next_id = 1;
  // This process's limits, clamped to the connection's ring (the
  // connector chose its size) so that every record fits.
  std::uint64_t eager_size = 0;
  std::uint64_t chunk_size = 0;

  Fifo<Request> out_sends;          // in isend order: EAGER/RTS records not yet written
  std::deque<Control> out_control;  // CTS/FIN records not yet written
  Fifo<Request> streaming;          // sends cleared by CTS, in CTS order
  std::unordered_map<std::uint64_t, Request*> sends_waiting;  // by send id (large messages only)
  std::unordered_map<std::uint64_t, Request*> recvs_staged;   // by recv id (large messages only)
  Fifo<Request> cma_recvs;
  TagQueues<Request> posted;         // by tag, in post order
  TagQueues<Unexpected> unexpected;  // by tag, in arrival order
  std::uint64_t unexpected_bytes = 0;
  // Buffers of consumed unexpected messages, kept for the next ones: a
  // fresh heap block per message costs page faults (glibc trims and
  // re-grows the heap), which made unexpected 64 KiB messages 3x slower.
  std::vector<std::pair<std::unique_ptr<std::uint8_t[]>, std::uint64_t>> spare_buffers;
  bool warned_unexpected_limit = false;
  Request* live = nullptr;  // every request not yet released by test(), via live_next
  std::size_t live_count = 0;
  Request* free_requests = nullptr;  // released requests for reuse, via qnext
  std::size_t free_request_count = 0;
  Unexpected* free_unexpected = nullptr;  // consumed nodes for reuse, via qnext
  std::size_t free_unexpected_count = 0;
  std::uint32_t idle_steps = 0;  // idle progress steps since the last clock read
  std::string failure;
  // recv_inline's buffer while it drives progress: the next EAGER record
  // of `tag` that no irecv is waiting for lands here directly, instead of
  // being buffered as unexpected and copied a second time.
  struct InlineSink {
    bool armed = false;   // takes the next matching record
    bool filled = false;  // took one: `size` bytes (copied unless > capacity)
    std::uint64_t tag = 0;
    std::uint8_t* buf = nullptr;
    std::uint64_t capacity = 0;
    std::uint64_t size = 0;
  } sink;

  ~Conn() {
    for (Request* r = live; r != nullptr;) {
      Request* next = r->live_next;
      delete r;
      r = next;
    }
    for (Request* r = free_requests; r != nullptr;) {
      Request* next = r->qnext;
      delete r;
      r = next;
    }
    unexpected.drain([](Unexpected* u) { delete u; });
    for (Unexpected* u = free_unexpected; u != nullptr;) {
      Unexpected* next = u->qnext;
      delete u;
      u = next;
    }
    if (segment != MAP_FAILED) munmap(segment, segment_len);
    if (sock >= 0) ::close(sock);
    if (peer_pidfd >= 0) ::close(peer_pidfd);
  }
};

struct PendingAccept {
  int fd = -1;
  int peer_pid = 0;
  std::uint64_t started_ns = 0;
};

struct Listener {
  Provider* provider = nullptr;
  int fd = -1;
  wire::Handle handle{};
  std::vector<PendingAccept> pending;
};

// Registration needs no OS work: CMA and the rings read any address.
struct MemoryRegion {
  void* ptr;
  std::uint64_t size;
};

inline Provider* prov(void* ctx) { return static_cast<Provider*>(ctx); }

// Every entry that allocates runs inside this guard: nothing may unwind
// through the C ABI.
template <class F>
inline wia_status_t guarded(void* ctx, F&& body) noexcept {
  try {
    return body();
  } catch (const std::bad_alloc&) {
    return prov(ctx)->fail(WIA_ERROR_OUT_OF_MEMORY, "out of memory");
  } catch (const std::exception& e) {
    return prov(ctx)->fail(WIA_ERROR_INTERNAL, std::string("internal error: ") + e.what());
  } catch (...) {
    return prov(ctx)->fail(WIA_ERROR_INTERNAL, "internal error: unknown exception");
  }
}

// ---------------------------------------------------------------------------
// shm_conn.cpp: the connection engine and the message entry points. The
// engine functions are called with conn->mu held.

void complete(Request* r, std::uint64_t size);
void fail_request(Request* r, std::string why);
// Fails the connection and every request still pending on it; the peer
// learns through the closed socket.
void fail_conn(Conn* c, const std::string& why);
void queue_control(Conn* c, std::uint16_t type, std::uint16_t flags, std::uint64_t tag,
                   std::uint64_t msg_size, std::uint64_t id, std::uint64_t addr);
// A request from the connection's free list (or the heap), linked into
// `live` until test() releases it; nullptr when max_requests are live.
Request* new_request(Conn* c, bool is_send, const void* buf, std::uint64_t size, std::uint64_t tag);
// Why a message cannot be posted on `c` now (WIA_SUCCESS when it can).
wia_status_t post_check(Provider* p, Conn* c, const void* buf, std::uint64_t size,
                        const char* what);

wia_status_t isend(void* ctx, wia_conn_t conn, const void* buf, uint64_t size, uint64_t tag,
                   wia_mr_t mr, wia_request_t* request);
wia_status_t irecv(void* ctx, wia_conn_t conn, void* buf, uint64_t size, uint64_t tag, wia_mr_t mr,
                   wia_request_t* request);
wia_status_t test(void* ctx, wia_request_t request, int32_t* done, uint64_t* size);
wia_status_t send_inline(void* ctx, wia_conn_t conn, const void* buf, uint64_t size, uint64_t tag);
wia_status_t recv_inline(void* ctx, wia_conn_t conn, void* buf, uint64_t capacity, uint64_t tag,
                         int32_t* done, uint64_t* size);

// ---------------------------------------------------------------------------
// shm_setup.cpp: segment set-up, listen, connect, accept, close.

bool random_bytes(void* out, std::size_t n);

wia_status_t listen_ep(void* ctx, int32_t endpoint, void* handle, wia_listener_t* listener);
wia_status_t connect_ep(void* ctx, int32_t endpoint, const void* handle, uint64_t cookie,
                        wia_conn_t* conn);
wia_status_t accept_ep(void* ctx, wia_listener_t listener, uint64_t* cookie, wia_conn_t* conn);
wia_status_t close_listener(void* ctx, wia_listener_t listener);
wia_status_t close_conn(void* ctx, wia_conn_t conn);

// ---------------------------------------------------------------------------
// shm_rma.cpp: memory registration and cross-memory attach (CMA pulls of
// large messages, put and get).

// Whether the peer process has exited (its pidfd polls readable); false
// without a pidfd.
bool peer_exited(const Conn* c);
// A pidfd for `pid`, -1 on kernels before 5.3.
int open_pidfd(int pid);
// One process_vm_readv of at most cma_piece bytes for the oldest CMA
// receive (conn->mu held). Returns whether it made progress.
bool run_cma(Conn* c);

wia_status_t reg_mr(void* ctx, int32_t endpoint, const wia_mr_desc_v1_t* desc, wia_mr_t* mr);
wia_status_t dereg_mr(void* ctx, wia_mr_t mr);
wia_status_t mr_rkey(void* ctx, wia_mr_t mr, void* rkey);
wia_status_t put(void* ctx, wia_conn_t conn, const void* local, uint64_t size, wia_mr_t mr,
                 uint64_t remote_addr, const void* rkey, wia_request_t* request);
wia_status_t get(void* ctx, wia_conn_t conn, void* local, uint64_t size, wia_mr_t mr,
                 uint64_t remote_addr, const void* rkey, wia_request_t* request);

}  // namespace wia::shm
