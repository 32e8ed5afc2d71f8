// SPDX-License-Identifier: Apache-2.0
// Two-process transport tests (L4). A test body runs in two processes: the
// test's own child ("listener", role 0) and a peer it forks before either
// initialises the provider ("connector", role 1), so no provider thread or
// lock is inherited across the fork. Each side has its own init, a control
// channel of pipes (connection handle, rkeys, barriers) and bookkeeping of
// its requests; every wait is bounded by the test's deadline so a request
// that never completes is reported as such, before the harness's own
// timeout would only say "timed out".
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <deque>
#include <functional>
#include <string>
#include <vector>

#include "harness.hpp"

namespace wia::conformance {

// Memory for messages: a private mapping per buffer, so that a test can
// unmap it and turn any later access by the provider into a crash (the
// close tests), registered when the transport requires registration or the
// test asks for it.
struct Buffer {
  std::uint8_t* data = nullptr;
  std::uint64_t size = 0;    // usable bytes
  std::uint64_t mapped = 0;  // bytes of the mapping (page multiple, >= 1 page)
  wia_mr_t mr = nullptr;
  bool unmapped = false;
};

// A posted isend/irecv/put/get and what became of it.
struct Request {
  wia_request_t handle = nullptr;
  std::string what;  // "isend(tag 3, 1 MiB)"
  wia_conn_t conn = nullptr;
  bool finished = false;  // test() said done or failed: the handle is released
  bool released = false;  // released by close() without a verdict
  wia_status_t status = WIA_IN_PROGRESS;
  std::uint64_t size = 0;  // bytes reported by test()
};

// What the peer process is expected to do at the end of a test.
enum class PeerEnd {
  kReports,  // finishes the body and reports a verdict, checked by the test
  kDies      // exits or is killed inside the body; no verdict expected
};

class Side {
 public:
  Side(Context& c, int role, int ctl_in, int ctl_out, pid_t peer_pid);
  Side(const Side&) = delete;
  Side& operator=(const Side&) = delete;

  Context& c;
  const wia_transport_ops_v1_t& ops;
  const int role;        // 0: the test process, 1: the forked peer
  const pid_t peer_pid;  // role 0 only: the peer process
  int endpoint = 0;
  wia_transport_props_v1_t props{};
  bool reg_required = false;  // WIA_TRANSPORT_FLAG_REG_REQUIRED
  bool ordered_recv = false;  // WIA_TRANSPORT_REQ_ORDERED_RECV
  std::size_t peak_outstanding = 0;
  std::size_t null_posts = 0;  // isend/irecv answering "no resources, retry"

  const char* name() const { return role == 0 ? "listener" : "connector"; }
  [[noreturn]] void fail(const std::string& message);

  // --- control channel (bounded by the test deadline) --------------------
  void send_ctl(const void* data, std::size_t size);
  void recv_ctl(void* data, std::size_t size, const std::string& waiting_for);
  // Both sides call it with the same name; returns when both arrived.
  void barrier(const std::string& name);

  // --- connections --------------------------------------------------------
  // role 0: listen, hand the handle to the peer, accept until the
  // connection with `cookie` arrives (closing others). role 1: take the
  // handle, connect with `cookie`. Both keep the connection open.
  wia_conn_t connect_pair(std::uint64_t cookie);
  // role 0: listen (once; the listener is kept) and send the handle.
  void listen_and_share();
  // role 0: accept until `cookie`; others (abandoned attempts) are closed.
  wia_conn_t accept_cookie(std::uint64_t cookie);
  // role 0: the next established connection and its cookie.
  wia_conn_t accept_any(std::uint64_t* cookie);
  // role 0: close_listener() (accepted connections must stay open).
  void close_listener();
  // role 1: the handle sent by listen_and_share.
  std::vector<std::uint8_t> take_handle();
  // role 1: connect() until established.
  wia_conn_t connect_handle(const std::vector<std::uint8_t>& handle, std::uint64_t cookie);
  // close(); the requests still pending on it are released. A close that
  // fails fails the test when `require_ok`.
  void close_conn(wia_conn_t conn, bool require_ok = true);

  // --- memory ------------------------------------------------------------
  // Registered when the transport requires it or `register_it`.
  Buffer& buffer(std::uint64_t size, bool register_it = false);
  // Deregisters (if registered) and unmaps.
  void unmap(Buffer& b);

  // --- requests ----------------------------------------------------------
  // Post; a NULL request with WIA_SUCCESS ("no resources now") is retried
  // after driving the other requests. A negative status fails the test
  // unless `status` is given, which then receives it (and NULL returns).
  Request* isend(wia_conn_t conn, Buffer& b, std::uint64_t offset, std::uint64_t size,
                 std::uint64_t tag, wia_status_t* status = nullptr);
  Request* irecv(wia_conn_t conn, Buffer& b, std::uint64_t offset, std::uint64_t size,
                 std::uint64_t tag, wia_status_t* status = nullptr);
  Request* put(wia_conn_t conn, Buffer& local, std::uint64_t offset, std::uint64_t size,
               std::uint64_t remote_addr, const std::uint8_t* rkey);
  Request* get(wia_conn_t conn, Buffer& local, std::uint64_t offset, std::uint64_t size,
               std::uint64_t remote_addr, const std::uint8_t* rkey);

  // One test() on every unfinished request; returns how many finished.
  int progress();
  // Drives every request until `r` finishes or `ms` pass (capped by the
  // test deadline); returns its status, WIA_IN_PROGRESS if it did not end.
  wia_status_t wait(Request* r, double ms = 1e12);
  // wait() and fail unless it succeeded.
  void wait_ok(Request* r);
  void wait_all_ok(const std::vector<Request*>& rs);
  std::size_t outstanding() const;

  // Releases what this side made, in an order the ABI allows: connections
  // (which release their requests), the listener, registrations, mappings.
  void cleanup();

  // Milliseconds a wait may still take: the test's time left minus a
  // margin for reporting (and for the peer's own report).
  double wait_budget_ms() const;

 private:
  Request* post(bool send, wia_conn_t conn, Buffer& b, std::uint64_t offset, std::uint64_t size,
                std::uint64_t tag, wia_status_t* status);
  Request* add_request(wia_request_t h, wia_conn_t conn, std::string what);
  void track_peak();

  int ctl_in_, ctl_out_;
  wia_listener_t listener_ = nullptr;
  std::vector<std::uint8_t> handle_;  // what listen() wrote
  std::vector<wia_conn_t> conns_;
  std::deque<Buffer> buffers_;
  std::deque<Request> requests_;
};

// Runs `body` in the test process (role 0) and in a forked peer (role 1).
// The peer's failure, crash or hang fails the test with its message.
void run_pair(Context& c, const std::function<void(Side&)>& body, PeerEnd end = PeerEnd::kReports);

}  // namespace wia::conformance
