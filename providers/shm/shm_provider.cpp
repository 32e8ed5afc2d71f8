// SPDX-License-Identifier: Apache-2.0
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
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <exception>
#include <iterator>
#include <limits>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <unordered_map>
#include <vector>

#include "shm_queues.hpp"
#include "shm_wire.hpp"
#include "wia_common/text.hpp"

#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434  // the same number on every architecture
#endif

#ifndef WIA_SHM_VERSION
#define WIA_SHM_VERSION "0.0.0"
#endif

namespace wia::shm {
namespace {

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
volatile std::uint64_t g_cma_probe_word = 0;

std::uint64_t monotonic_ns() {
  return static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                        std::chrono::steady_clock::now().time_since_epoch())
                                        .count());
}

using common::errno_text;

std::string format(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
std::string format(const char* fmt, ...) {
  char buf[512];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(buf, sizeof(buf), fmt, ap);
  va_end(ap);
  return buf;
}

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

// ---------------------------------------------------------------------------
// Connection engine (called with conn->mu held)

void complete(Request* r, std::uint64_t size) {
  r->stage = Stage::kDone;
  r->msg_size = size;
  r->status = WIA_SUCCESS;
}

void fail_request(Request* r, std::string why) {
  r->stage = Stage::kDone;
  r->status = WIA_ERROR_REMOTE;
  r->error = std::move(why);
}

// Fails the connection and every request still pending on it; the peer
// learns through the closed socket.
void fail_conn(Conn* c, const std::string& why) {
  if (c->state == ConnState::kFailed) return;
  c->state = ConnState::kFailed;
  c->failure = why;
  if (c->sock >= 0) shutdown(c->sock, SHUT_RDWR);
  std::size_t pending = 0;
  for (Request* r = c->live; r != nullptr; r = r->live_next)
    if (r->stage != Stage::kDone) {
      fail_request(r, why);
      ++pending;
    }
  c->out_sends.clear();
  c->out_control.clear();
  c->streaming.clear();
  c->sends_waiting.clear();
  c->recvs_staged.clear();
  c->cma_recvs.clear();
  c->posted.clear();
  c->provider->log(WIA_LOG_WARN,
                   format("connection to pid %d failed (%zu pending requests failed): %s",
                          c->peer_pid, pending, why.c_str()));
}

void queue_control(Conn* c, std::uint16_t type, std::uint16_t flags, std::uint64_t tag,
                   std::uint64_t msg_size, std::uint64_t id, std::uint64_t addr) {
  c->out_control.push_back(Control{RecordHeader{type, flags, 0, tag, 0, msg_size, id, addr}});
}

std::string too_small(const Conn* c, std::uint64_t msg, std::uint64_t cap, std::uint64_t tag) {
  return format("message of %" PRIu64 " bytes with tag %" PRIu64
                " from peer pid %d does not fit "
                "the receive buffer of %" PRIu64 " bytes",
                msg, tag, c->peer_pid, cap);
}

// A matched large message: pull it by CMA or ask the sender to stream it.
void start_large_recv(Conn* c, Request* r, std::uint64_t msg_size, std::uint64_t send_id,
                      std::uint64_t addr, std::uint16_t flags) {
  r->msg_size = msg_size;
  r->peer_id = send_id;
  r->offset = 0;
  if (msg_size > r->capacity) {
    fail_request(r, too_small(c, msg_size, r->capacity, r->tag));
    queue_control(c, wire::kFin, wire::kFinError, r->tag, msg_size, send_id, 0);
    return;
  }
  if ((flags & wire::kRtsCmaOk) != 0 && c->cma_readable &&
      msg_size >= c->provider->cfg.cma_threshold) {
    r->stage = Stage::kCma;
    r->peer_addr = addr;
    c->cma_recvs.push_back(r);
    return;
  }
  r->stage = Stage::kStaged;
  r->id = c->next_id++;
  c->recvs_staged.emplace(r->id, r);
  queue_control(c, wire::kCts, 0, r->tag, msg_size, send_id, r->id);
}

Request* pop_posted(Conn* c, std::uint64_t tag) { return c->posted.pop(tag); }

Unexpected* new_unexpected(Conn* c) {
  if (Unexpected* u = c->free_unexpected) {
    c->free_unexpected = u->qnext;
    --c->free_unexpected_count;
    u->qnext = nullptr;
    return u;
  }
  return new (std::nothrow) Unexpected;
}

// A consumed unexpected message: its heap buffer goes to the spares, the
// node to the free list.
void release_unexpected(Conn* c, Unexpected* u) {
  if (u->data && c->spare_buffers.size() < 32)
    c->spare_buffers.emplace_back(std::move(u->data), u->capacity);
  u->data.reset();
  u->capacity = 0;
  if (c->free_unexpected_count >= kMaxFreeUnexpected) {
    delete u;
    return;
  }
  u->qnext = c->free_unexpected;
  c->free_unexpected = u;
  ++c->free_unexpected_count;
}

void take_buffer(Conn* c, std::uint64_t len, Unexpected* u) {
  for (auto it = c->spare_buffers.rbegin(); it != c->spare_buffers.rend(); ++it)
    if (it->second >= len) {
      u->data = std::move(it->first);
      u->capacity = it->second;
      c->spare_buffers.erase(std::next(it).base());
      return;
    }
  std::uint64_t cap = 256;  // powers of two, so that buffers fit later messages
  while (cap < len) cap <<= 1;
  u->data.reset(new (std::nothrow) std::uint8_t[cap]);
  u->capacity = u->data ? cap : 0;
}

// Handles one validated record. Returns false when the record must stay in
// the ring for now (unexpected-message budget spent) or the connection failed.
bool handle_record(Conn* c, const RecordHeader& h, const std::uint8_t* payload) {
  const Settings& cfg = c->provider->cfg;
  switch (h.type) {
    case wire::kPad:
      return true;
    case wire::kEager: {
      if (h.msg_size != h.len) {
        fail_conn(
            c, format("corrupt EAGER record from peer pid %d: size %" PRIu64 " != length %" PRIu64,
                      c->peer_pid, h.msg_size, h.len));
        return false;
      }
      if (Request* r = pop_posted(c, h.tag)) {
        if (h.len > r->capacity) {
          fail_request(r, too_small(c, h.len, r->capacity, h.tag));
        } else {
          if (h.len > 0) std::memcpy(r->buf, payload, h.len);
          complete(r, h.len);
        }
        return true;
      }
      if (c->sink.armed && c->sink.tag == h.tag) {
        c->sink.armed = false;
        c->sink.filled = true;
        c->sink.size = h.len;
        if (h.len > 0 && h.len <= c->sink.capacity) std::memcpy(c->sink.buf, payload, h.len);
        return true;
      }
      // Flow control: unexpected payload is copied out of the ring up to
      // unexpected_limit; past it the record stays in the ring, which
      // stalls the sender (back-pressure) until receives are posted.
      if (c->unexpected_bytes > 0 && c->unexpected_bytes + h.len > cfg.unexpected_limit) {
        if (!c->warned_unexpected_limit) {
          c->warned_unexpected_limit = true;
          c->provider->log(WIA_LOG_WARN,
                           format("peer pid %d: %" PRIu64 " bytes of unexpected messages buffered "
                                  "(shm.unexpected_limit); holding back the sender until "
                                  "receives are posted",
                                  c->peer_pid, c->unexpected_bytes));
        }
        return false;
      }
      Unexpected* u = new_unexpected(c);
      if (u == nullptr) {
        fail_conn(c, "out of memory buffering an unexpected message");
        return false;
      }
      u->type = wire::kEager;
      u->flags = 0;
      u->msg_size = h.len;
      if (h.len > kInlineUnexpected) {
        take_buffer(c, h.len, u);
        if (!u->data) {
          release_unexpected(c, u);
          fail_conn(c, format("out of memory buffering an unexpected message of %" PRIu64 " bytes",
                              h.len));
          return false;
        }
        std::memcpy(u->data.get(), payload, h.len);
      } else if (h.len > 0) {
        std::memcpy(u->inline_data, payload, h.len);
      }
      if (!c->unexpected.push(h.tag, u)) {
        release_unexpected(c, u);
        fail_conn(c, "out of memory queueing an unexpected message");
        return false;
      }
      c->unexpected_bytes += h.len;
      return true;
    }
    case wire::kRts: {
      if (h.len != 0 || h.msg_size == 0) {
        fail_conn(
            c, format("corrupt RTS record from peer pid %d (length %" PRIu64 ", size %" PRIu64 ")",
                      c->peer_pid, h.len, h.msg_size));
        return false;
      }
      if (Request* r = pop_posted(c, h.tag)) {
        start_large_recv(c, r, h.msg_size, h.id, h.addr, h.flags);
        return true;
      }
      Unexpected* u = new_unexpected(c);
      if (u == nullptr || !c->unexpected.push(h.tag, u)) {
        if (u != nullptr) release_unexpected(c, u);
        fail_conn(c, "out of memory queueing an unexpected RTS");
        return false;
      }
      u->type = wire::kRts;
      u->flags = h.flags;
      u->msg_size = h.msg_size;
      u->send_id = h.id;
      u->addr = h.addr;
      return true;
    }
    case wire::kCts: {
      auto it = c->sends_waiting.find(h.id);
      if (it == c->sends_waiting.end()) {
        fail_conn(c, format("corrupt CTS record from peer pid %d: unknown send id %" PRIu64,
                            c->peer_pid, h.id));
        return false;
      }
      Request* s = it->second;
      c->sends_waiting.erase(it);
      s->stage = Stage::kStreaming;
      s->peer_id = h.addr;
      s->offset = 0;
      c->streaming.push_back(s);
      return true;
    }
    case wire::kData: {
      auto it = c->recvs_staged.find(h.id);
      if (it == c->recvs_staged.end() || h.addr != it->second->offset ||
          h.len > it->second->msg_size - it->second->offset || h.len == 0) {
        fail_conn(c, format("corrupt DATA record from peer pid %d: recv id %" PRIu64
                            ", offset %" PRIu64 ", length %" PRIu64,
                            c->peer_pid, h.id, h.addr, h.len));
        return false;
      }
      Request* r = it->second;
      std::memcpy(r->buf + r->offset, payload, h.len);
      r->offset += h.len;
      if (r->offset == r->msg_size) {
        c->recvs_staged.erase(it);
        complete(r, r->msg_size);
      }
      return true;
    }
    case wire::kFin: {
      auto it = c->sends_waiting.find(h.id);
      if (it == c->sends_waiting.end()) {
        fail_conn(c, format("corrupt FIN record from peer pid %d: unknown send id %" PRIu64,
                            c->peer_pid, h.id));
        return false;
      }
      Request* s = it->second;
      c->sends_waiting.erase(it);
      if ((h.flags & wire::kFinError) != 0)
        fail_request(s, format("peer pid %d refused the message of %" PRIu64
                               " bytes with tag %" PRIu64 ": its receive buffer is smaller",
                               c->peer_pid, s->capacity, s->tag));
      else
        complete(s, s->capacity);
      return true;
    }
    default:
      return false;
  }
}

bool drain_rx(Conn* c) {
  bool work = false;
  std::string why;  // set only when a record is corrupt
  // Bounded so that one test() call stays short even under a flood.
  for (int budget = 0; budget < 512 && c->state == ConnState::kUp; ++budget) {
    RecordHeader h;
    const std::uint8_t* payload = nullptr;
    switch (c->rx.next(&h, &payload, &why)) {
      case RxRing::Peek::kEmpty:
        return work;
      case RxRing::Peek::kCorrupt:
        fail_conn(c, format("corrupt shared ring from peer pid %d: %s", c->peer_pid, why.c_str()));
        return true;
      case RxRing::Peek::kRecord:
        break;
    }
    if (!handle_record(c, h, payload)) return work;
    c->rx.consume(h);
    work = true;
  }
  return work;
}

bool peer_exited(const Conn* c) {
  if (c->peer_pidfd < 0) return false;
  pollfd pfd{c->peer_pidfd, POLLIN, 0};
  return poll(&pfd, 1, 0) > 0;  // a pidfd polls readable once the process has exited
}

int open_pidfd(int pid) {
  return static_cast<int>(syscall(SYS_pidfd_open, pid, 0));  // -1 on kernels before 5.3
}

// One process_vm_readv of at most cma_piece bytes for the oldest CMA receive.
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

bool flush_tx(Conn* c) {
  bool work = false;
  while (!c->out_control.empty() && c->state == ConnState::kUp) {
    RecordHeader* h = c->tx.reserve(wire::record_span(0));
    if (h == nullptr) return work;
    RecordHeader rec = c->out_control.front().header;
    rec.seq = c->tx.seq++;
    *h = rec;
    c->tx.commit(wire::record_span(0));
    c->out_control.pop_front();
    work = true;
  }
  while (!c->out_sends.empty() && c->state == ConnState::kUp) {
    Request* s = c->out_sends.front();
    const bool eager = s->capacity <= c->eager_size;
    const std::uint64_t len = eager ? s->capacity : 0;
    RecordHeader* h = c->tx.reserve(wire::record_span(len));
    if (h == nullptr) return work;
    if (eager) {
      *h = RecordHeader{wire::kEager, 0, c->tx.seq++, s->tag, len, len, 0, 0};
      if (len > 0)
        std::memcpy(reinterpret_cast<std::uint8_t*>(h) + sizeof(RecordHeader), s->buf, len);
      complete(s, len);
    } else {
      s->id = c->next_id++;
      const std::uint16_t flags = c->peer_may_read ? wire::kRtsCmaOk : 0;
      *h = RecordHeader{
          wire::kRts, flags,       c->tx.seq++, s->tag,
          0,          s->capacity, s->id,       reinterpret_cast<std::uint64_t>(s->buf)};
      s->stage = Stage::kWaitPeer;
      c->sends_waiting.emplace(s->id, s);
    }
    c->tx.commit(wire::record_span(len));
    c->out_sends.pop_front();
    work = true;
  }
  while (!c->streaming.empty() && c->state == ConnState::kUp) {
    Request* s = c->streaming.front();
    const std::uint64_t len = std::min(c->chunk_size, s->capacity - s->offset);
    RecordHeader* h = c->tx.reserve(wire::record_span(len));
    if (h == nullptr) return work;
    *h = RecordHeader{wire::kData, 0, c->tx.seq++, s->tag, len, s->capacity, s->peer_id, s->offset};
    std::memcpy(reinterpret_cast<std::uint8_t*>(h) + sizeof(RecordHeader), s->buf + s->offset, len);
    c->tx.commit(wire::record_span(len));
    s->offset += len;
    if (s->offset == s->capacity) {
      c->streaming.pop_front();
      complete(s, s->capacity);
    }
    work = true;
  }
  return work;
}

// Peeks the control socket: EOF or an error means the peer is gone.
void check_liveness(Conn* c) {
  char scratch[64];
  ssize_t n;
  // Nothing is sent after the handshake; anything that is gets discarded
  // so that it cannot hide the EOF behind it.
  do {
    n = recv(c->sock, scratch, sizeof(scratch), MSG_DONTWAIT);
  } while (n > 0);
  if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
  const std::string how = n == 0 ? std::string("closed its end of the connection")
                                 : "control socket error: " + errno_text(errno);
  // Deliver what the peer wrote before it went away, then fail the rest.
  while (drain_rx(c)) {
  }
  std::size_t still_pending = 0;
  for (Request* r = c->live; r != nullptr; r = r->live_next)
    still_pending += r->stage != Stage::kDone ? 1 : 0;
  if (still_pending > 0 || c->state == ConnState::kUp)
    fail_conn(c, format("peer pid %d %s (exited or was killed)", c->peer_pid, how.c_str()));
}

// One bounded progress step. `sending`: called by isend, which writes its
// record before looking at what came in (the peer is waiting for it).
void progress(Conn* c, bool sending = false) {
  if (c->state != ConnState::kUp) return;
  bool work = sending && flush_tx(c);
  bool got = drain_rx(c);
  if (!c->cma_recvs.empty()) got |= run_cma(c);
  // Records drained may have queued CTS/FIN or cleared sends to stream.
  if (got || !sending) work |= flush_tx(c);
  work |= got;
  if (c->state != ConnState::kUp) return;
  if (work) {
    c->idle_steps = 0;
  } else if (++c->idle_steps >= kIdleStepsPerClockRead) {
    c->idle_steps = 0;
    const std::uint64_t now = monotonic_ns();
    if (now - c->last_liveness_ns >= c->provider->cfg.liveness_interval_ns) {
      c->last_liveness_ns = now;
      check_liveness(c);
    }
  }
}

// ---------------------------------------------------------------------------
// Segment set-up

void attach_rings(Conn* c, bool is_connector, std::uint64_t ring_size) {
  auto* base = static_cast<std::uint8_t*>(c->segment);
  auto* hdr = reinterpret_cast<wire::SegmentHeader*>(base);
  const int out_dir = is_connector ? 0 : 1;
  const int in_dir = 1 - out_dir;
  c->tx.ctl = &hdr->ring[out_dir];
  c->tx.data = base + wire::ring_data_offset(out_dir, ring_size);
  c->tx.size = ring_size;
  c->rx.ctl = &hdr->ring[in_dir];
  c->rx.data = base + wire::ring_data_offset(in_dir, ring_size);
  c->rx.size = ring_size;
  const std::uint64_t max_record = ring_size / 4 - sizeof(RecordHeader);
  c->eager_size = std::min(c->provider->cfg.eager_size, max_record);
  c->chunk_size = std::min(c->provider->cfg.chunk_size, max_record);
}

// Reads the peer's probe word with CMA: says whether large messages from
// this peer can be pulled in one copy.
bool probe_cma(const Provider* p, int pid, std::uint64_t addr, std::uint64_t expected) {
  if (p->cfg.cma == CmaMode::kOff || addr == 0) return false;
  std::uint64_t value = 0;
  iovec local{&value, sizeof(value)};
  iovec remote{reinterpret_cast<void*>(addr), sizeof(value)};
  const ssize_t n = process_vm_readv(pid, &local, 1, &remote, 1, 0);
  const bool ok = n == static_cast<ssize_t>(sizeof(value)) && value == expected;
  if (!ok)
    p->log(p->cfg.cma == CmaMode::kOn ? WIA_LOG_WARN : WIA_LOG_INFO,
           format("cross-memory attach to peer pid %d unavailable (%s); large messages use the "
                  "staging ring",
                  pid, n < 0 ? errno_text(errno).c_str() : "probe value differs"));
  return ok;
}

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

bool random_bytes(void* out, std::size_t n) {
  auto* p = static_cast<std::uint8_t*>(out);
  while (n > 0) {
    const ssize_t got = getrandom(p, n, 0);
    if (got < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    p += got;
    n -= static_cast<std::size_t>(got);
  }
  return true;
}

bool secrets_equal(const std::uint8_t* a, const std::uint8_t* b) {
  std::uint8_t diff = 0;  // constant time: no early exit on the first difference
  for (std::size_t i = 0; i < wire::kSecretSize; ++i) diff |= a[i] ^ b[i];
  return diff == 0;
}

sockaddr_un abstract_address(const char* name, socklen_t* len) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  const std::size_t n = strnlen(name, wire::kSocketNameSize);
  std::memcpy(addr.sun_path + 1, name, n);  // sun_path[0] == 0: abstract namespace
  *len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + n);
  return addr;
}

int peer_pid_of(int fd) {
  ucred cred{};
  socklen_t len = sizeof(cred);
  if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) return 0;
  return cred.pid;
}

// ---------------------------------------------------------------------------
// Entry points

Provider* prov(void* ctx) { return static_cast<Provider*>(ctx); }

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

wia_status_t listen_ep_impl(void* ctx, int32_t endpoint, void* handle, wia_listener_t* listener) {
  Provider* p = prov(ctx);
  if (handle == nullptr || listener == nullptr) return WIA_ERROR_INVALID_ARGUMENT;
  if (endpoint != 0)
    return p->fail(WIA_ERROR_INVALID_ARGUMENT, format("listen: no endpoint %d", endpoint));
  auto l = std::make_unique<Listener>();
  l->provider = p;
  wire::Handle& h = l->handle;
  h.magic = wire::kHandleMagic;
  h.version = wire::kProtocolVersion;
  h.listener_pid = static_cast<std::uint32_t>(getpid());
  std::memcpy(h.boot_id, p->boot_id, sizeof(h.boot_id));
  std::uint8_t nonce[8];
  if (!random_bytes(h.secret, sizeof(h.secret)) || !random_bytes(nonce, sizeof(nonce)))
    return p->fail(WIA_ERROR_IO, "getrandom: " + errno_text(errno));
  std::snprintf(h.socket_name, sizeof(h.socket_name), "wia-shm-%d-%02x%02x%02x%02x%02x%02x%02x%02x",
                static_cast<int>(getpid()), nonce[0], nonce[1], nonce[2], nonce[3], nonce[4],
                nonce[5], nonce[6], nonce[7]);
  l->fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (l->fd < 0) return p->fail(WIA_ERROR_IO, "listen: socket(AF_UNIX): " + errno_text(errno));
  socklen_t len = 0;
  const sockaddr_un addr = abstract_address(h.socket_name, &len);
  if (bind(l->fd, reinterpret_cast<const sockaddr*>(&addr), len) != 0 ||
      ::listen(l->fd, 128) != 0) {
    const int e = errno;
    ::close(l->fd);
    return p->fail(WIA_ERROR_IO,
                   format("listen: bind/listen @%s: %s", h.socket_name, errno_text(e).c_str()));
  }
  std::memset(handle, 0, WIA_TRANSPORT_HANDLE_SIZE);
  std::memcpy(handle, &h, sizeof(h));
  *listener = reinterpret_cast<wia_listener_t>(l.release());
  return WIA_SUCCESS;
}

wia_status_t connect_ep_impl(void* ctx, int32_t endpoint, const void* handle, uint64_t cookie,
                             wia_conn_t* conn_out) {
  Provider* p = prov(ctx);
  if (handle == nullptr || conn_out == nullptr) return WIA_ERROR_INVALID_ARGUMENT;
  if (endpoint != 0)
    return p->fail(WIA_ERROR_INVALID_ARGUMENT, format("connect: no endpoint %d", endpoint));
  wire::Handle h;
  std::memcpy(&h, handle, sizeof(h));
  if (*conn_out == nullptr) {
    if (h.magic != wire::kHandleMagic || h.version != wire::kProtocolVersion)
      return p->fail(WIA_ERROR_INVALID_HANDLE,
                     "connect: not an shm handle (bad magic or layout version)");
    if (std::memcmp(h.boot_id, p->boot_id, sizeof(h.boot_id)) != 0)
      return p->fail(
          WIA_ERROR_UNAVAILABLE,
          format("connect: handle of listener pid %u is from another host (boot_id differs)",
                 h.listener_pid));
    h.socket_name[wire::kSocketNameSize - 1] = '\0';
    auto c = std::make_unique<Conn>();
    c->provider = p;
    c->started_ns = p->now_ns();
    c->peer_pid = static_cast<int>(h.listener_pid);
    c->sock = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (c->sock < 0) return p->fail(WIA_ERROR_IO, "connect: socket(AF_UNIX): " + errno_text(errno));
    socklen_t len = 0;
    const sockaddr_un addr = abstract_address(h.socket_name, &len);
    if (::connect(c->sock, reinterpret_cast<const sockaddr*>(&addr), len) != 0)
      return p->fail(errno == ECONNREFUSED || errno == ENOENT ? WIA_ERROR_REMOTE : WIA_ERROR_IO,
                     format("connect to listener @%s of pid %u: %s", h.socket_name, h.listener_pid,
                            errno_text(errno).c_str()));
    // The segment: an anonymous memfd, never visible in /dev/shm.
    const std::uint64_t ring = p->cfg.ring_size;
    c->segment_len = wire::segment_size(ring);
    const int mfd = memfd_create("wia-shm-conn", MFD_CLOEXEC);
    if (mfd < 0) return p->fail(WIA_ERROR_IO, "connect: memfd_create: " + errno_text(errno));
    if (ftruncate(mfd, static_cast<off_t>(c->segment_len)) != 0) {
      const int e = errno;
      ::close(mfd);
      return p->fail(WIA_ERROR_OUT_OF_MEMORY, format("connect: ftruncate(memfd, %zu): %s",
                                                     c->segment_len, errno_text(e).c_str()));
    }
    c->segment =
        mmap(nullptr, c->segment_len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, mfd, 0);
    if (c->segment == MAP_FAILED) {
      const int e = errno;
      ::close(mfd);
      return p->fail(WIA_ERROR_OUT_OF_MEMORY, format("connect: mmap of %zu bytes: %s",
                                                     c->segment_len, errno_text(e).c_str()));
    }
    auto* seg = new (c->segment) wire::SegmentHeader{};
    seg->magic = wire::kSegmentMagic;
    seg->ring_size = ring;
    attach_rings(c.get(), true, ring);

    wire::Hello hello{};
    hello.magic = wire::kHelloMagic;
    hello.version = wire::kProtocolVersion;
    std::memcpy(hello.secret, h.secret, sizeof(hello.secret));
    hello.cookie = cookie;
    hello.ring_size = ring;
    hello.probe_addr = reinterpret_cast<std::uint64_t>(&g_cma_probe_word);
    hello.probe_value = g_cma_probe_word;
    hello.pid = static_cast<std::uint32_t>(getpid());
    hello.flags = p->cfg.cma != CmaMode::kOff ? wire::kCmaAllowed : 0;
    iovec iov{&hello, sizeof(hello)};
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof(control);
    cmsghdr* cm = CMSG_FIRSTHDR(&msg);
    cm->cmsg_level = SOL_SOCKET;
    cm->cmsg_type = SCM_RIGHTS;
    cm->cmsg_len = CMSG_LEN(sizeof(int));
    std::memcpy(CMSG_DATA(cm), &mfd, sizeof(int));
    // A fresh SEQPACKET socket has room for one small message: no EAGAIN.
    const ssize_t sent = sendmsg(c->sock, &msg, MSG_NOSIGNAL);
    const int e = errno;
    ::close(mfd);  // our mapping keeps the segment alive
    if (sent != static_cast<ssize_t>(sizeof(hello)))
      return p->fail(WIA_ERROR_REMOTE,
                     format("connect: sending the hello to listener pid %u: %s", h.listener_pid,
                            sent < 0 ? errno_text(e).c_str() : "short write"));
    *conn_out = reinterpret_cast<wia_conn_t>(c.release());
    return WIA_IN_PROGRESS;
  }

  Conn* c = reinterpret_cast<Conn*>(*conn_out);
  if (c->state == ConnState::kUp) return WIA_SUCCESS;
  // A failed attempt is released here (the ABI: an error ends the attempt).
  auto give_up = [&](wia_status_t st, const std::string& why) {
    delete c;
    *conn_out = nullptr;
    return p->fail(st, why);
  };
  wire::Welcome w{};
  const ssize_t n = recv(c->sock, &w, sizeof(w), MSG_DONTWAIT);
  if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
    if (p->now_ns() - c->started_ns > p->cfg.handshake_timeout_ns)
      return give_up(
          WIA_ERROR_TIMEOUT,
          format("connect: listener pid %d did not answer the hello within %" PRIu64 " s",
                 c->peer_pid, p->cfg.handshake_timeout_ns / std::uint64_t{1'000'000'000}));
    return WIA_IN_PROGRESS;
  }
  if (n != static_cast<ssize_t>(sizeof(w)) || w.magic != wire::kWelcomeMagic ||
      w.version != wire::kProtocolVersion)
    return give_up(WIA_ERROR_REMOTE,
                   format("connect: listener pid %d refused the connection (%s)", c->peer_pid,
                          n == 0  ? "closed: wrong secret or incompatible peer"
                          : n < 0 ? errno_text(errno).c_str()
                                  : "malformed welcome"));
  const int cred_pid = peer_pid_of(c->sock);
  c->peer_pid = cred_pid > 0 ? cred_pid : static_cast<int>(w.pid);
  c->cma_readable = probe_cma(p, c->peer_pid, w.probe_addr, w.probe_value);
  if (c->cma_readable) c->peer_pidfd = open_pidfd(c->peer_pid);
  c->peer_may_read = p->cfg.cma != CmaMode::kOff && (w.flags & wire::kCmaAllowed) != 0;
  c->state = ConnState::kUp;
  c->last_liveness_ns = monotonic_ns();
  return WIA_SUCCESS;
}

// Reads and checks one pending hello; returns an established connection,
// nullptr when the hello has not arrived, or rejects (closes) the socket.
enum class HelloResult { kWaiting, kRejected, kAccepted };

HelloResult serve_hello(Listener* l, PendingAccept& pa, std::uint64_t* cookie, Conn** out) {
  Provider* p = l->provider;
  wire::Hello hello{};
  iovec iov{&hello, sizeof(hello)};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * 4)] = {};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  const ssize_t n = recvmsg(pa.fd, &msg, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
  if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
    if (p->now_ns() - pa.started_ns > p->cfg.handshake_timeout_ns) {
      p->log(WIA_LOG_WARN,
             format("listener @%s: dropped a connection from pid %d that sent no hello",
                    l->handle.socket_name, pa.peer_pid));
      return HelloResult::kRejected;
    }
    return HelloResult::kWaiting;
  }
  int mfd = -1;
  for (cmsghdr* cm = CMSG_FIRSTHDR(&msg); cm != nullptr; cm = CMSG_NXTHDR(&msg, cm)) {
    if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS) continue;
    const std::size_t nfds = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (std::size_t i = 0; i < nfds; ++i) {
      int fd;
      std::memcpy(&fd, CMSG_DATA(cm) + i * sizeof(int), sizeof(int));
      if (mfd < 0)
        mfd = fd;
      else
        ::close(fd);  // a well-behaved peer sends one
    }
  }
  auto reject = [&](const std::string& why) {
    if (mfd >= 0) ::close(mfd);
    p->log(WIA_LOG_WARN, format("listener @%s: rejected connection from pid %d: %s",
                                l->handle.socket_name, pa.peer_pid, why.c_str()));
    return HelloResult::kRejected;
  };
  if (n <= 0) return reject(n == 0 ? "closed before the hello" : "recvmsg: " + errno_text(errno));
  if ((msg.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) != 0 || n != static_cast<ssize_t>(sizeof(hello)))
    return reject(format("hello of %zd bytes, expected %zu", n, sizeof(hello)));
  if (hello.magic != wire::kHelloMagic || hello.version != wire::kProtocolVersion)
    return reject("not an shm hello (bad magic or protocol version)");
  if (!secrets_equal(hello.secret, l->handle.secret)) return reject("wrong secret");
  if (mfd < 0) return reject("no shared segment attached to the hello");
  if (hello.ring_size < (64u << 10) || hello.ring_size > (1ull << 32) ||
      hello.ring_size % wire::kRecordAlign != 0)
    return reject(format("ring size %" PRIu64 " out of range", hello.ring_size));
  const std::size_t seg_len = wire::segment_size(hello.ring_size);
  struct stat st {};
  if (fstat(mfd, &st) != 0 || static_cast<std::uint64_t>(st.st_size) < seg_len)
    return reject(format("segment smaller than its %zu-byte layout", seg_len));
  auto c = std::make_unique<Conn>();
  c->provider = p;
  c->segment_len = seg_len;
  c->segment = mmap(nullptr, seg_len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, mfd, 0);
  if (c->segment == MAP_FAILED) return reject("mmap of the segment: " + errno_text(errno));
  ::close(mfd);
  mfd = -1;
  const auto* seg = static_cast<const wire::SegmentHeader*>(c->segment);
  if (seg->magic != wire::kSegmentMagic || seg->ring_size != hello.ring_size ||
      seg->ring[0].head.load() != 0 || seg->ring[1].head.load() != 0)
    return reject("segment header does not match the hello");
  attach_rings(c.get(), false, hello.ring_size);
  c->peer_pid = pa.peer_pid > 0 ? pa.peer_pid : static_cast<int>(hello.pid);

  wire::Welcome w{};
  w.magic = wire::kWelcomeMagic;
  w.version = wire::kProtocolVersion;
  w.probe_addr = reinterpret_cast<std::uint64_t>(&g_cma_probe_word);
  w.probe_value = g_cma_probe_word;
  w.pid = static_cast<std::uint32_t>(getpid());
  w.flags = p->cfg.cma != CmaMode::kOff ? wire::kCmaAllowed : 0;
  if (send(pa.fd, &w, sizeof(w), MSG_NOSIGNAL | MSG_DONTWAIT) != static_cast<ssize_t>(sizeof(w))) {
    // A valid hello whose sender has already gone (an abandoned connect)
    // is not an attack: say so quietly.
    const int e = errno;
    if (mfd >= 0) ::close(mfd);
    p->log(e == EPIPE || e == ECONNRESET ? WIA_LOG_INFO : WIA_LOG_WARN,
           format("listener @%s: connector pid %d went away before the welcome (%s)",
                  l->handle.socket_name, pa.peer_pid, errno_text(e).c_str()));
    return HelloResult::kRejected;
  }
  c->sock = pa.fd;
  pa.fd = -1;
  c->cma_readable = probe_cma(p, c->peer_pid, hello.probe_addr, hello.probe_value);
  if (c->cma_readable) c->peer_pidfd = open_pidfd(c->peer_pid);
  c->peer_may_read = p->cfg.cma != CmaMode::kOff && (hello.flags & wire::kCmaAllowed) != 0;
  c->state = ConnState::kUp;
  c->last_liveness_ns = monotonic_ns();
  *cookie = hello.cookie;
  *out = c.release();
  return HelloResult::kAccepted;
}

wia_status_t accept_ep_impl(void* ctx, wia_listener_t listener, uint64_t* cookie,
                            wia_conn_t* conn) {
  Provider* p = prov(ctx);
  if (listener == nullptr || cookie == nullptr || conn == nullptr)
    return WIA_ERROR_INVALID_ARGUMENT;
  auto* l = reinterpret_cast<Listener*>(listener);
  *conn = nullptr;
  for (;;) {
    const int fd = accept4(l->fd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR || errno == ECONNABORTED) break;
      return p->fail(WIA_ERROR_IO,
                     format("accept on @%s: %s", l->handle.socket_name, errno_text(errno).c_str()));
    }
    l->pending.push_back(PendingAccept{fd, peer_pid_of(fd), p->now_ns()});
  }
  for (std::size_t i = 0; i < l->pending.size();) {
    Conn* c = nullptr;
    const HelloResult r = serve_hello(l, l->pending[i], cookie, &c);
    if (r == HelloResult::kWaiting) {
      ++i;
      continue;
    }
    if (l->pending[i].fd >= 0) ::close(l->pending[i].fd);
    l->pending.erase(l->pending.begin() + static_cast<std::ptrdiff_t>(i));
    if (r == HelloResult::kAccepted) {
      *conn = reinterpret_cast<wia_conn_t>(c);
      return WIA_SUCCESS;
    }
  }
  return WIA_IN_PROGRESS;
}

wia_status_t close_listener(void*, wia_listener_t listener) {
  if (listener == nullptr) return WIA_ERROR_INVALID_HANDLE;
  auto* l = reinterpret_cast<Listener*>(listener);
  for (PendingAccept& pa : l->pending) ::close(pa.fd);
  ::close(l->fd);
  delete l;
  return WIA_SUCCESS;
}

// Registration needs no OS work: CMA and the rings read any address.
struct MemoryRegion {
  void* ptr;
  std::uint64_t size;
};

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

// A request from the connection's free list (or the heap), linked into
// `live` until test() releases it.
Request* new_request(Conn* c, bool is_send, const void* buf, std::uint64_t size,
                     std::uint64_t tag) {
  if (c->live_count >= (1u << 16)) return nullptr;  // max_requests: the caller retries
  Request* r = c->free_requests;
  if (r != nullptr) {
    c->free_requests = r->qnext;
    --c->free_request_count;
  } else {
    r = new (std::nothrow) Request;
    if (r == nullptr) return nullptr;
  }
  r->conn = c;
  r->qnext = nullptr;
  r->is_send = is_send;
  r->stage = Stage::kQueued;
  r->buf = static_cast<std::uint8_t*>(const_cast<void*>(buf));
  r->capacity = size;
  r->tag = tag;
  r->id = 0;
  r->msg_size = 0;
  r->offset = 0;
  r->peer_id = 0;
  r->peer_addr = 0;
  r->status = WIA_SUCCESS;
  r->error.clear();
  r->live_prev = nullptr;
  r->live_next = c->live;
  if (c->live != nullptr) c->live->live_prev = r;
  c->live = r;
  ++c->live_count;
  return r;
}

// Unlinks a request from `live` and keeps it for reuse (or frees it).
void release_request(Conn* c, Request* r) {
  if (r->live_prev != nullptr)
    r->live_prev->live_next = r->live_next;
  else
    c->live = r->live_next;
  if (r->live_next != nullptr) r->live_next->live_prev = r->live_prev;
  --c->live_count;
  if (c->free_request_count >= kMaxFreeRequests) {
    delete r;
    return;
  }
  r->stage = Stage::kDone;
  r->qnext = c->free_requests;
  c->free_requests = r;
  ++c->free_request_count;
}

wia_status_t post_check(Provider* p, Conn* c, const void* buf, std::uint64_t size,
                        const char* what) {
  if (c->state == ConnState::kConnecting)
    return p->fail(WIA_ERROR_INVALID_HANDLE,
                   format("%s on a connection that is not established yet", what));
  if (c->state == ConnState::kFailed) return p->fail(WIA_ERROR_REMOTE, c->failure);
  if (buf == nullptr && size > 0)
    return p->fail(WIA_ERROR_INVALID_ARGUMENT, format("%s: NULL buffer", what));
  return WIA_SUCCESS;
}

wia_status_t isend_impl(void* ctx, wia_conn_t conn, const void* buf, uint64_t size, uint64_t tag,
                        wia_mr_t, wia_request_t* request) {
  Provider* p = prov(ctx);
  if (conn == nullptr || request == nullptr) return WIA_ERROR_INVALID_ARGUMENT;
  Conn* c = reinterpret_cast<Conn*>(conn);
  std::lock_guard<SpinLock> lock(c->mu);
  *request = nullptr;
  if (wia_status_t st = post_check(p, c, buf, size, "isend"); st != WIA_SUCCESS) return st;
  Request* r = new_request(c, true, buf, size, tag);
  if (r == nullptr) return WIA_SUCCESS;  // no resources now: retry
  c->out_sends.push_back(r);
  progress(c, /*sending=*/true);
  *request = reinterpret_cast<wia_request_t>(r);
  return WIA_SUCCESS;
}

wia_status_t irecv_impl(void* ctx, wia_conn_t conn, void* buf, uint64_t size, uint64_t tag,
                        wia_mr_t, wia_request_t* request) {
  Provider* p = prov(ctx);
  if (conn == nullptr || request == nullptr) return WIA_ERROR_INVALID_ARGUMENT;
  Conn* c = reinterpret_cast<Conn*>(conn);
  std::lock_guard<SpinLock> lock(c->mu);
  *request = nullptr;
  // A message that arrived before the peer went away is still delivered.
  Unexpected* u = c->unexpected.front(tag);
  const bool buffered = u != nullptr && u->type == wire::kEager;
  if (!(buffered && c->state == ConnState::kFailed))
    if (wia_status_t st = post_check(p, c, buf, size, "irecv"); st != WIA_SUCCESS) return st;
  Request* r = new_request(c, false, buf, size, tag);
  if (r == nullptr) return WIA_SUCCESS;
  r->stage = Stage::kPosted;
  if (u != nullptr) {
    c->unexpected.pop(tag);
    if (u->type == wire::kEager) {
      c->unexpected_bytes -= u->msg_size;
      if (u->msg_size > size) {
        fail_request(r, too_small(c, u->msg_size, size, tag));
      } else {
        if (u->msg_size > 0) std::memcpy(buf, u->payload(), u->msg_size);
        complete(r, u->msg_size);
      }
    } else {
      start_large_recv(c, r, u->msg_size, u->send_id, u->addr, u->flags);
    }
    release_unexpected(c, u);
  } else if (!c->posted.push(tag, r)) {
    release_request(c, r);
    return p->fail(WIA_ERROR_OUT_OF_MEMORY, "irecv: out of memory queueing the receive");
  }
  progress(c);
  *request = reinterpret_cast<wia_request_t>(r);
  return WIA_SUCCESS;
}

wia_status_t test_impl(void* ctx, wia_request_t request, int32_t* done, uint64_t* size) {
  Provider* p = prov(ctx);
  if (request == nullptr || done == nullptr) return WIA_ERROR_INVALID_ARGUMENT;
  auto* r = reinterpret_cast<Request*>(request);
  Conn* c = r->conn;
  wia_status_t status;
  std::string error;
  {
    std::lock_guard<SpinLock> lock(c->mu);
    if (r->stage != Stage::kDone) progress(c);
    if (r->stage != Stage::kDone) {
      *done = 0;
      return WIA_SUCCESS;
    }
    status = r->status;
    if (size != nullptr) *size = status == WIA_SUCCESS ? r->msg_size : 0;
    if (status != WIA_SUCCESS) error.swap(r->error);
    release_request(c, r);
  }
  *done = 1;
  if (status != WIA_SUCCESS) return p->fail(status, error);
  return WIA_SUCCESS;
}

// The eager record of isend, written at once and with no request (see
// provider.h, WIA_TRANSPORT_CAP_INLINE).
wia_status_t send_inline_impl(void* ctx, wia_conn_t conn, const void* buf, uint64_t size,
                              uint64_t tag) {
  Provider* p = prov(ctx);
  if (conn == nullptr) return WIA_ERROR_INVALID_ARGUMENT;
  Conn* c = reinterpret_cast<Conn*>(conn);
  std::lock_guard<SpinLock> lock(c->mu);
  if (wia_status_t st = post_check(p, c, buf, size, "send_inline"); st != WIA_SUCCESS) return st;
  // Declined when the message would not be an EAGER record, or when
  // earlier isends still wait for ring space (it must not overtake them).
  if (size > c->eager_size || !c->out_sends.empty()) return WIA_IN_PROGRESS;
  const std::uint64_t span = wire::record_span(size);
  RecordHeader* h = c->tx.reserve(span);
  if (h == nullptr) return WIA_IN_PROGRESS;
  *h = RecordHeader{wire::kEager, 0, c->tx.seq++, tag, size, size, 0, 0};
  if (size > 0) std::memcpy(reinterpret_cast<std::uint8_t*>(h) + sizeof(RecordHeader), buf, size);
  c->tx.commit(span);
  return WIA_SUCCESS;
}

// The next message of `tag` if it is here: from the unexpected queue, or
// straight out of the ring through the connection's sink.
wia_status_t recv_inline_impl(void* ctx, wia_conn_t conn, void* buf, uint64_t capacity,
                              uint64_t tag, int32_t* done, uint64_t* size) {
  Provider* p = prov(ctx);
  if (conn == nullptr || done == nullptr) return WIA_ERROR_INVALID_ARGUMENT;
  *done = 0;
  if (buf == nullptr && capacity > 0)
    return p->fail(WIA_ERROR_INVALID_ARGUMENT, "recv_inline: NULL buffer");
  Conn* c = reinterpret_cast<Conn*>(conn);
  std::lock_guard<SpinLock> lock(c->mu);
  if (c->state == ConnState::kConnecting)
    return p->fail(WIA_ERROR_INVALID_HANDLE,
                   "recv_inline on a connection that is not established yet");
  // Matching order: an irecv of this tag posted earlier gets the next one.
  if (c->posted.front(tag) != nullptr)
    return p->fail(WIA_ERROR_NOT_SUPPORTED,
                   format("recv_inline: an irecv of tag %" PRIu64 " is pending; use irecv", tag));
  std::uint64_t got = 0;
  Unexpected* u = c->unexpected.front(tag);
  if (u == nullptr && c->state == ConnState::kUp) {
    c->sink = Conn::InlineSink{true, false, tag, static_cast<std::uint8_t*>(buf), capacity, 0};
    progress(c);
    c->sink.armed = false;
    if (c->sink.filled) {
      c->sink.filled = false;
      got = c->sink.size;
      if (got > capacity) return p->fail(WIA_ERROR_REMOTE, too_small(c, got, capacity, tag));
      if (size != nullptr) *size = got;
      *done = 1;
      return WIA_SUCCESS;
    }
    u = c->unexpected.front(tag);
  }
  if (u == nullptr) {
    // A message that arrived before the peer went away was delivered above.
    if (c->state == ConnState::kFailed) return p->fail(WIA_ERROR_REMOTE, c->failure);
    return WIA_SUCCESS;
  }
  if (u->type != wire::kEager)
    return p->fail(WIA_ERROR_NOT_SUPPORTED, format("recv_inline: the next message of tag %" PRIu64
                                                   " is a large one (%" PRIu64 " bytes); use irecv",
                                                   tag, u->msg_size));
  c->unexpected.pop(tag);
  c->unexpected_bytes -= u->msg_size;
  got = u->msg_size;
  const bool fits = got <= capacity;
  if (fits && got > 0) std::memcpy(buf, u->payload(), got);
  release_unexpected(c, u);
  if (!fits) return p->fail(WIA_ERROR_REMOTE, too_small(c, got, capacity, tag));
  if (size != nullptr) *size = got;
  *done = 1;
  return WIA_SUCCESS;
}

wia_status_t close_conn(void*, wia_conn_t conn) {
  if (conn == nullptr) return WIA_ERROR_INVALID_HANDLE;
  Conn* c = reinterpret_cast<Conn*>(conn);
  {
    std::lock_guard<SpinLock> lock(c->mu);  // waits out a test() still running on it
  }
  // Frees every request it still holds, unmaps the segment and closes the
  // socket: the peer sees EOF.
  delete c;
  return WIA_SUCCESS;
}

// Every entry that allocates runs inside this guard: nothing may unwind
// through the C ABI.
template <class F>
wia_status_t guarded(void* ctx, F&& body) noexcept {
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

wia_status_t listen_ep(void* ctx, int32_t endpoint, void* handle, wia_listener_t* listener) {
  return guarded(ctx, [&] { return listen_ep_impl(ctx, endpoint, handle, listener); });
}
wia_status_t connect_ep(void* ctx, int32_t endpoint, const void* handle, uint64_t cookie,
                        wia_conn_t* conn) {
  return guarded(ctx, [&] { return connect_ep_impl(ctx, endpoint, handle, cookie, conn); });
}
wia_status_t accept_ep(void* ctx, wia_listener_t listener, uint64_t* cookie, wia_conn_t* conn) {
  return guarded(ctx, [&] { return accept_ep_impl(ctx, listener, cookie, conn); });
}
wia_status_t isend(void* ctx, wia_conn_t conn, const void* buf, uint64_t size, uint64_t tag,
                   wia_mr_t mr, wia_request_t* request) {
  return guarded(ctx, [&] { return isend_impl(ctx, conn, buf, size, tag, mr, request); });
}
wia_status_t irecv(void* ctx, wia_conn_t conn, void* buf, uint64_t size, uint64_t tag, wia_mr_t mr,
                   wia_request_t* request) {
  return guarded(ctx, [&] { return irecv_impl(ctx, conn, buf, size, tag, mr, request); });
}
wia_status_t test(void* ctx, wia_request_t request, int32_t* done, uint64_t* size) {
  return guarded(ctx, [&] { return test_impl(ctx, request, done, size); });
}
wia_status_t send_inline(void* ctx, wia_conn_t conn, const void* buf, uint64_t size, uint64_t tag) {
  return guarded(ctx, [&] { return send_inline_impl(ctx, conn, buf, size, tag); });
}
wia_status_t recv_inline(void* ctx, wia_conn_t conn, void* buf, uint64_t capacity, uint64_t tag,
                         int32_t* done, uint64_t* size) {
  return guarded(ctx, [&] { return recv_inline_impl(ctx, conn, buf, capacity, tag, done, size); });
}

// --- RMA: process_vm_writev / process_vm_readv against an rkey ------------

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
