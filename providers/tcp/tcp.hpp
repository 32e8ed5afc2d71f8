// SPDX-License-Identifier: Apache-2.0
// Internal declarations of the tcp transport provider (see tcp_provider.cpp
// for the design notes and docs/transport-tcp.md for the measurements).
#pragma once

#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <wia/provider.h>

#include <cstdarg>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "tcp_wire.hpp"
#include "wia_common/text.hpp"

namespace wia::tcp {

// Messages up to this size travel inline on the control socket (one copy
// through the receive staging buffer); larger ones use RTS/CTS and go
// straight into the posted buffer over the data sockets. Fixed, not a
// parameter, because both peers must agree on it.
inline constexpr std::uint64_t kEagerMax = 64 * 1024;
// Outstanding requests per connection before isend/irecv say "retry".
inline constexpr std::uint32_t kMaxRequests = 1u << 16;

struct Params {
  std::string ifname;  // NCCL_SOCKET_IFNAME syntax; empty = all usable
  std::string family;  // auto | ipv4 | ipv6
  int streams = 2;     // data sockets per connection (connector decides)
  std::uint64_t min_stripe = 1 << 20;
  std::uint64_t unexpected_max = 64ull << 20;
  std::uint64_t max_message = 1ull << 40;
  std::int64_t hello_timeout_ms = 10000;
  std::int64_t connect_timeout_ms = 30000;
  std::string congestion;    // TCP_CONGESTION; empty = system default
  std::uint64_t sndbuf = 0;  // 0 = kernel autotuning
  std::uint64_t rcvbuf = 0;
  std::int64_t user_timeout_ms = 0;  // TCP_USER_TIMEOUT; 0 = kernel default
};

struct Endpoint {
  std::string name;  // interface name
  sockaddr_storage addr{};
  socklen_t addrlen = 0;
  std::string addr_text;
  bool loopback = false;
  std::uint64_t speed_mbps = 0;
  std::string pci_bus_id;
  int numa_node = -1;
};

struct Ctx {
  const wia_host_services_v1_t* host = nullptr;
  Params params;
  std::vector<Endpoint> endpoints;

  std::uint64_t now_ns() const { return host->clock_ns(host->host_ctx); }
  void log(wia_log_level_t level, const char* fmt, ...) const __attribute__((format(printf, 3, 4)));
  // set_error(message) and return `status`.
  wia_status_t fail(wia_status_t status, const char* fmt, ...) const
      __attribute__((format(printf, 3, 4)));
  wia_status_t fail_text(wia_status_t status, const std::string& message) const;
  // Applies the socket options every connection socket gets.
  void tune_socket(int fd) const;
};

std::string sockaddr_text(const sockaddr* sa);
using common::errno_text;

// ---------------------------------------------------------------------------
// Requests and connections

class Conn;

struct Request {
  enum class State { pending, done, failed };
  Conn* conn = nullptr;
  bool is_send = false;
  State state = State::pending;
  wia_status_t status = WIA_SUCCESS;
  std::string error;
  char* buf = nullptr;
  std::uint64_t capacity = 0;  // receive: buffer size; send: message size
  std::uint64_t size = 0;      // bytes of the message
  std::uint64_t tag = 0;
  std::uint32_t slices_left = 0;
  std::size_t live_index = 0;  // where Conn::live_ holds it
};

// One slice of a large message on one data socket.
struct Slice {
  char* ptr = nullptr;
  std::uint64_t len = 0;
  std::uint64_t done = 0;
  Request* req = nullptr;
};

struct DataStream {
  int fd = -1;
  std::deque<Slice> tx;
  std::deque<Slice> rx;
};

// A control message waiting to be written: header, then optional payload.
struct TxItem {
  WireMsg hdr{};
  const char* payload = nullptr;
  std::uint64_t done = 0;  // bytes of header + payload already written
  Request* req = nullptr;  // eager send completed once written
};

// A message that arrived before its receive was posted.
struct Unexpected {
  bool is_rts = false;
  std::uint32_t seq = 0;
  std::uint64_t size = 0;
  std::vector<char> data;  // eager payload
};

// Outgoing connection setup, while connect() returns IN_PROGRESS.
struct Dialer {
  sockaddr_storage addr{};
  socklen_t addrlen = 0;
  std::vector<int> fds;  // control, then data sockets
  std::vector<bool> connected;
  std::vector<std::size_t> hello_sent;
  std::vector<WireHello> hellos;
  std::uint64_t deadline_ns = 0;
  Dialer() = default;
  Dialer(const Dialer&) = delete;
  Dialer& operator=(const Dialer&) = delete;
  ~Dialer();
};

class Conn {
 public:
  // Established from connected sockets (fds[0] is the control socket).
  Conn(Ctx* ctx, std::vector<int> fds, std::string peer);
  // Pending outgoing connection.
  Conn(Ctx* ctx, std::unique_ptr<Dialer> dialer, std::string peer);
  ~Conn();
  Conn(const Conn&) = delete;
  Conn& operator=(const Conn&) = delete;

  wia_status_t continue_connect();  // lock held by caller
  bool connecting() const { return dialer_ != nullptr; }

  wia_status_t isend(const void* buf, std::uint64_t size, std::uint64_t tag, wia_request_t* out);
  wia_status_t irecv(void* buf, std::uint64_t size, std::uint64_t tag, wia_request_t* out);
  wia_status_t test(Request* req, int32_t* done, std::uint64_t* size);
  // What to poll(2) for until test() may make progress (wait_fds in
  // provider.h); WIA_IN_PROGRESS: do not wait.
  wia_status_t wait_fds(pollfd* fds, std::uint32_t capacity, std::uint32_t* count);

  std::mutex mu;

 private:
  void adopt_sockets(std::vector<int> fds);
  void progress();
  // Each returns false once the connection has failed.
  bool flush_control();
  bool read_control();
  bool parse_control();
  bool progress_data();
  void on_message(const WireMsg& m, const char* payload);
  void deliver_eager(Request* r, const char* payload, std::uint64_t size);
  void answer_rts(Request* r, std::uint32_t seq, std::uint64_t size);
  void schedule_slices(Request* r, char* base, std::uint64_t size, std::uint32_t nslices,
                       bool outgoing);
  void complete(Request* r, std::uint64_t size);
  void fail_request(Request* r, const std::string& why);
  void fail_conn(const std::string& why);
  // Before a failure: delivers the complete messages the peer sent on the
  // control socket that are still unread (see fail_conn).
  void salvage_control();
  void drop_unexpected_rts();
  void drain();
  // The peer closed (or reset) the control socket: fail what can no longer
  // complete, keep receiving payload already on its way (see peer_closed_).
  void control_lost(const std::string& why);
  bool rx_slices_pending() const;
  // Reads and drops what the peer sent that nobody will read, so that our
  // close() sends a FIN after our queued data instead of a reset that
  // would discard it.
  void discard_unread();
  void protocol_error(const char* fmt, ...) __attribute__((format(printf, 2, 3)));
  void io_error(const char* what, int err);
  void close_sockets();
  Request* new_request(bool is_send, char* buf, std::uint64_t cap, std::uint64_t tag);
  void release(Request* r);

  Ctx* ctx_;
  std::string peer_;  // "127.0.0.1:40211"
  std::unique_ptr<Dialer> dialer_;
  int ctrl_fd_ = -1;
  std::vector<DataStream> streams_;
  bool failed_ = false;
  bool salvaging_ = false;  // inside salvage_control: a failure there waits for the outer one
  std::string failure_;
  // Set when the control socket reached EOF or was reset while payload of
  // matched receives was still due on data sockets: those keep being read
  // until they complete or their socket ends; everything else has failed
  // with failure_. Then the connection fails as a whole.
  bool peer_closed_ = false;
  std::string peer_closed_why_;
  std::uint64_t drain_progress_ns_ = 0;  // last time a data socket delivered, while draining
  std::uint64_t rx_data_bytes_ = 0;      // payload bytes received on data sockets, ever

  // Control transmit queue.
  std::deque<TxItem> tx_;
  std::uint32_t tx_seq_ = 0;
  std::unordered_map<std::uint32_t, Request*> awaiting_cts_;
  std::uint32_t tx_stripe_ = 0;

  // Control receive staging buffer and matching state.
  std::vector<char> rx_buf_;
  std::size_t rx_begin_ = 0, rx_end_ = 0;
  std::uint32_t rx_seq_ = 0;
  std::uint32_t rx_stripe_ = 0;
  bool rx_paused_ = false;  // unexpected bytes over the bound
  std::uint64_t unexpected_bytes_ = 0;
  std::unordered_map<std::uint64_t, std::deque<Request*>> posted_;
  std::unordered_map<std::uint64_t, std::deque<Unexpected>> unexpected_;
  // Payload buffers of delivered unexpected messages, kept for the next
  // ones: a fresh heap block per message faulted its pages in every time
  // (glibc trims the heap top when the block is freed), about 500 faults
  // per 1 MiB all-reduce with 4 processes, whose pieces arrive early.
  std::vector<std::vector<char>> spare_payloads_;

  // Every request not yet released, in no particular order (a vector, not
  // a set of pointers: nothing here may depend on where the heap put a
  // request, or the fuzzer's coverage of one input would depend on the
  // inputs before it, fuzz_tcp_frames).
  std::vector<Request*> live_;
};

// ---------------------------------------------------------------------------
// Listener

struct Incoming {
  int fd = -1;
  std::string peer;
  WireHello hello{};
  std::size_t got = 0;
  std::uint64_t deadline_ns = 0;
};

struct Group {
  std::uint64_t cookie = 0;
  std::uint16_t nstreams = 0;
  std::vector<int> fds;  // by stream index, -1 until it arrives
  std::size_t arrived = 0;
  std::string peer;
  std::uint64_t deadline_ns = 0;
};

struct Listener {
  Ctx* ctx = nullptr;
  int fd = -1;
  std::string addr_text;
  std::uint8_t secret[kSecretSize]{};
  std::vector<Incoming> incoming;
  std::unordered_map<std::uint64_t, Group> groups;
  std::mutex mu;
  ~Listener();
};

wia_status_t discover_endpoints(Ctx& ctx);
wia_status_t do_listen(Ctx& ctx, int32_t endpoint, void* handle, Listener** out);
wia_status_t do_connect(Ctx& ctx, int32_t endpoint, const void* handle, std::uint64_t cookie,
                        Conn** conn);
wia_status_t do_accept(Ctx& ctx, Listener& l, std::uint64_t* cookie, Conn** conn);

// Interface-name filter with NCCL_SOCKET_IFNAME semantics.
bool ifname_matches(const std::string& filter, const std::string& name);

}  // namespace wia::tcp
