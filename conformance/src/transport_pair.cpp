// SPDX-License-Identifier: Apache-2.0
// One side of a two-process transport test (transport_pair.hpp: Side): its
// control channel to the other side, connections, buffers and requests,
// and the progress loop that drives them. Running the two processes is in
// transport_pair_run.cpp.
#include "transport_pair.hpp"

#include <poll.h>
#include <sched.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>

namespace wia::conformance {
namespace {

std::string hex64(std::uint64_t v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "0x%" PRIx64, v);
  return buf;
}

std::string describe(const char* op, std::uint64_t tag, std::uint64_t size) {
  return std::string(op) + "(tag " + hex64(tag) + ", " + size_text(size) + ")";
}

// Progress loop pacing: spin while work moves, yield when it does not, and
// sleep a little only after a long quiet spell, so that two busy processes
// on a small machine still leave the provider's own threads some CPU.
class Pacer {
 public:
  void moved() { quiet_since_ = -1; }
  void idle() {
    const double now = monotonic_ms();
    if (quiet_since_ < 0) quiet_since_ = now;
    if (now - quiet_since_ > 200)
      usleep(200);
    else
      sched_yield();
  }

 private:
  double quiet_since_ = -1;
};

}  // namespace

Side::Side(Context& ctx, int r, int ctl_in, int ctl_out, pid_t peer)
    : c(ctx), ops(ctx.tp_ops()), role(r), peer_pid(peer), ctl_in_(ctl_in), ctl_out_(ctl_out) {
  c.init();
  std::int32_t n = -1;
  c.step("endpoint_count");
  c.ok(ops.endpoint_count(c.ctx(), &n), "endpoint_count");
  if (n <= 0)
    throw Skip("the transport has no endpoint here (endpoint_count " + std::to_string(n) + ")");
  endpoint = c.options().endpoint;
  if (endpoint >= n)
    throw Skip("no endpoint " + std::to_string(endpoint) + " (the transport has " +
               std::to_string(n) + ")");
  props.struct_size = sizeof(props);
  c.step("endpoint_props(" + std::to_string(endpoint) + ")");
  c.ok(ops.endpoint_props(c.ctx(), endpoint, &props),
       "endpoint_props(" + std::to_string(endpoint) + ")");
  reg_required = (props.flags & WIA_TRANSPORT_FLAG_REG_REQUIRED) != 0;
  ordered_recv = (ops.must_understand & WIA_TRANSPORT_REQ_ORDERED_RECV) != 0;
}

void Side::fail(const std::string& message) { c.fail(message); }

double Side::wait_budget_ms() const {
  // Keep a tenth of the test (at least 0.5 s) to report; the peer keeps
  // twice that so its verdict reaches the test process before it gives up.
  const double margin = std::max(500.0, c.timeout_ms() * 0.1) * (role == 1 ? 0.5 : 1.0);
  return c.ms_left() - margin;
}

// --- control channel ---------------------------------------------------------

void Side::send_ctl(const void* data, std::size_t size) {
  const auto* p = static_cast<const char*>(data);
  while (size > 0) {
    const ssize_t n = ::write(ctl_out_, p, size);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0)
      fail(std::string(name()) +
           ": the other process went away (control pipe: " + std::strerror(errno) + ")");
    p += n;
    size -= static_cast<std::size_t>(n);
  }
}

void Side::recv_ctl(void* data, std::size_t size, const std::string& waiting_for) {
  auto* p = static_cast<char*>(data);
  while (size > 0) {
    const double left = wait_budget_ms();
    if (left <= 0)
      fail(std::string(name()) + ": still waiting for " + waiting_for +
           " from the other process at the end of the test's time");
    pollfd pfd{ctl_in_, POLLIN, 0};
    const int r = poll(&pfd, 1, static_cast<int>(std::min(left, 100.0)) + 1);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) continue;
    const ssize_t n = ::read(ctl_in_, p, size);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0)
      fail(std::string(name()) + ": the other process ended while this one waited for " +
           waiting_for);
    p += n;
    size -= static_cast<std::size_t>(n);
  }
}

void Side::barrier(const std::string& what) {
  c.step(std::string(name()) + ": barrier '" + what + "'");
  const char mark = 'B';
  send_ctl(&mark, 1);
  char got = 0;
  recv_ctl(&got, 1, "barrier '" + what + "'");
  if (got != mark) fail("control channel out of step at barrier '" + what + "'");
}

// --- connections --------------------------------------------------------------

void Side::listen_and_share() {
  if (listener_ == nullptr) {
    std::uint8_t handle[WIA_TRANSPORT_HANDLE_SIZE] = {};
    c.step("listen(endpoint " + std::to_string(endpoint) + ")");
    c.ok(ops.listen(c.ctx(), endpoint, handle, &listener_),
         "listen(endpoint " + std::to_string(endpoint) + ")");
    c.expect(listener_ != nullptr, "a listener handle from listen", "NULL");
    handle_.assign(handle, handle + sizeof(handle));
  }
  send_ctl(handle_.data(), handle_.size());
}

std::vector<std::uint8_t> Side::take_handle() {
  std::vector<std::uint8_t> h(WIA_TRANSPORT_HANDLE_SIZE);
  recv_ctl(h.data(), h.size(), "the listener's connection handle");
  return h;
}

wia_conn_t Side::accept_any(std::uint64_t* cookie) {
  Pacer pace;
  const double deadline = monotonic_ms() + wait_budget_ms();
  for (;;) {
    std::uint64_t got = 0;
    wia_conn_t conn = nullptr;
    const wia_status_t st = ops.accept(c.ctx(), listener_, &got, &conn);
    if (st == WIA_SUCCESS) {
      c.take_error();
      c.expect(conn != nullptr, "accept returning WIA_SUCCESS to set *conn", "NULL");
      conns_.push_back(conn);
      *cookie = got;
      return conn;
    }
    if (st != WIA_IN_PROGRESS) c.ok(st, "accept");
    c.expect(conn == nullptr, "accept returning WIA_IN_PROGRESS to leave *conn NULL",
             "a non-NULL connection");
    if (monotonic_ms() > deadline)
      fail(
          "accept: no connection arrived before the end of the test's time (the connector is "
          "connect()ing)");
    pace.idle();
  }
}

wia_conn_t Side::accept_cookie(std::uint64_t cookie) {
  c.step("accept (waiting for cookie " + hex64(cookie) + ")");
  for (;;) {
    std::uint64_t got = 0;
    wia_conn_t conn = accept_any(&got);
    if (got == cookie) return conn;
    // An abandoned attempt the listener had already taken in: close it.
    c.step("accept: closing the connection with cookie " + hex64(got));
    close_conn(conn);
  }
}

void Side::close_listener() {
  if (listener_ == nullptr) return;
  c.step("close_listener");
  wia_listener_t l = listener_;
  listener_ = nullptr;
  handle_.clear();
  c.ok(ops.close_listener(c.ctx(), l), "close_listener");
}

wia_conn_t Side::connect_handle(const std::vector<std::uint8_t>& handle, std::uint64_t cookie) {
  Pacer pace;
  const double deadline = monotonic_ms() + wait_budget_ms();
  wia_conn_t conn = nullptr;
  const std::string call = "connect(cookie " + hex64(cookie) + ")";
  c.step(call);
  for (;;) {
    const wia_status_t st = ops.connect(c.ctx(), endpoint, handle.data(), cookie, &conn);
    if (st == WIA_SUCCESS) {
      c.take_error();
      c.expect(conn != nullptr, call + " returning WIA_SUCCESS to set *conn", "NULL");
      conns_.push_back(conn);
      return conn;
    }
    if (st != WIA_IN_PROGRESS) c.ok(st, call);
    if (monotonic_ms() > deadline) {
      if (conn != nullptr) ops.close(c.ctx(), conn);
      fail(call +
           " still WIA_IN_PROGRESS at the end of the test's time (the listener is "
           "accept()ing)");
    }
    pace.idle();
  }
}

wia_conn_t Side::connect_pair(std::uint64_t cookie) {
  if (role == 0) {
    listen_and_share();
    return accept_cookie(cookie);
  }
  return connect_handle(take_handle(), cookie);
}

void Side::close_conn(wia_conn_t conn, bool require_ok) {
  const auto it = std::find(conns_.begin(), conns_.end(), conn);
  if (it != conns_.end()) conns_.erase(it);
  c.step(std::string(name()) + ": close");
  const wia_status_t st = ops.close(c.ctx(), conn);
  if (require_ok) c.ok(st, "close");
  c.take_error();
  for (auto& r : requests_)
    if (r.conn == conn && !r.finished) {
      r.finished = true;
      r.released = true;
    }
}

// --- memory -------------------------------------------------------------------

Buffer& Side::buffer(std::uint64_t size, bool register_it) {
  const std::uint64_t page = static_cast<std::uint64_t>(sysconf(_SC_PAGESIZE));
  Buffer b;
  b.size = size;
  b.mapped = std::max<std::uint64_t>(page, (size + page - 1) / page * page);
  void* p = mmap(nullptr, b.mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) fail("mmap(" + size_text(b.mapped) + "): " + std::strerror(errno));
  b.data = static_cast<std::uint8_t*>(p);
  buffers_.push_back(b);
  Buffer& kept = buffers_.back();
  if (register_it || reg_required) {
    wia_mr_desc_v1_t desc{};
    desc.struct_size = sizeof(desc);
    desc.kind = WIA_MR_HOST;
    desc.ptr = kept.data;
    desc.size = kept.mapped;
    desc.iface = WIA_MEM_IFACE_HOST;
    desc.dmabuf_fd = -1;
    const std::string call = "reg_mr(host, " + size_text(kept.mapped) + ")";
    c.step(call);
    c.ok(ops.reg_mr(c.ctx(), endpoint, &desc, &kept.mr), call);
    c.expect(kept.mr != nullptr, "a registration handle from " + call, "NULL");
  }
  return kept;
}

void Side::unmap(Buffer& b) {
  if (b.unmapped) return;
  if (b.mr != nullptr) {
    c.step("dereg_mr");
    wia_mr_t mr = b.mr;
    b.mr = nullptr;
    c.ok(ops.dereg_mr(c.ctx(), mr), "dereg_mr");
  }
  munmap(b.data, b.mapped);
  b.unmapped = true;
}

// --- requests -------------------------------------------------------------------

Request* Side::add_request(wia_request_t h, wia_conn_t conn, std::string what) {
  Request r;
  r.handle = h;
  r.conn = conn;
  r.what = std::move(what);
  requests_.push_back(std::move(r));
  track_peak();
  return &requests_.back();
}

void Side::track_peak() { peak_outstanding = std::max(peak_outstanding, outstanding()); }

std::size_t Side::outstanding() const {
  std::size_t n = 0;
  for (const auto& r : requests_) n += !r.finished;
  return n;
}

Request* Side::post(bool send, wia_conn_t conn, Buffer& b, std::uint64_t offset, std::uint64_t size,
                    std::uint64_t tag, wia_status_t* status) {
  const std::string what = describe(send ? "isend" : "irecv", tag, size);
  Pacer pace;
  const double deadline = monotonic_ms() + wait_budget_ms();
  bool counted_null = false;
  // One step per post, not per retry: a transport short of resources may
  // answer "retry" thousands of times.
  c.step(std::string(name()) + ": " + what);
  for (;;) {
    wia_request_t h = nullptr;
    const wia_status_t st = send ? ops.isend(c.ctx(), conn, b.data + offset, size, tag, b.mr, &h)
                                 : ops.irecv(c.ctx(), conn, b.data + offset, size, tag, b.mr, &h);
    if (st < 0) {
      if (status != nullptr) {
        *status = st;
        c.take_error();
        return nullptr;
      }
      c.ok(st, what);
    }
    if (st == WIA_SUCCESS && h != nullptr) {
      c.take_error();
      if (status != nullptr) *status = st;
      return add_request(h, conn, what);
    }
    if (st != WIA_SUCCESS)
      fail(what + " returned " + status_text(st) +
           ": a post answers WIA_SUCCESS (with a request, or NULL for \"retry\") or an error");
    // No resources now: drive what is outstanding, then retry.
    if (!counted_null) {
      ++null_posts;
      counted_null = true;
    }
    if (progress() > 0)
      pace.moved();
    else
      pace.idle();
    if (monotonic_ms() > deadline)
      fail(what +
           " kept answering \"no resources, retry\" (NULL request) until the end of the "
           "test's time, with " +
           std::to_string(outstanding()) + " requests outstanding");
  }
}

Request* Side::isend(wia_conn_t conn, Buffer& b, std::uint64_t offset, std::uint64_t size,
                     std::uint64_t tag, wia_status_t* status) {
  return post(true, conn, b, offset, size, tag, status);
}

Request* Side::irecv(wia_conn_t conn, Buffer& b, std::uint64_t offset, std::uint64_t size,
                     std::uint64_t tag, wia_status_t* status) {
  return post(false, conn, b, offset, size, tag, status);
}

Request* Side::put(wia_conn_t conn, Buffer& local, std::uint64_t offset, std::uint64_t size,
                   std::uint64_t remote_addr, const std::uint8_t* rkey) {
  const std::string what = "put(" + size_text(size) + " to " + hex64(remote_addr) + ")";
  wia_request_t h = nullptr;
  c.step(std::string(name()) + ": " + what);
  c.ok(ops.put(c.ctx(), conn, local.data + offset, size, local.mr, remote_addr, rkey, &h), what);
  c.expect(h != nullptr, what + " to return a request", "NULL");
  return add_request(h, conn, what);
}

Request* Side::get(wia_conn_t conn, Buffer& local, std::uint64_t offset, std::uint64_t size,
                   std::uint64_t remote_addr, const std::uint8_t* rkey) {
  const std::string what = "get(" + size_text(size) + " from " + hex64(remote_addr) + ")";
  wia_request_t h = nullptr;
  c.step(std::string(name()) + ": " + what);
  c.ok(ops.get(c.ctx(), conn, local.data + offset, size, local.mr, remote_addr, rkey, &h), what);
  c.expect(h != nullptr, what + " to return a request", "NULL");
  return add_request(h, conn, what);
}

int Side::progress() {
  int finished = 0;
  for (auto& r : requests_) {
    if (r.finished) continue;
    std::int32_t done = 0;
    std::uint64_t size = 0;
    const wia_status_t st = ops.test(c.ctx(), r.handle, &done, &size);
    if (st < 0) {
      r.finished = true;
      r.status = st;
      const std::string err = c.take_error();
      r.what += err.empty() ? "" : " [" + err + "]";
      ++finished;
    } else if (done == 1) {
      if (st != WIA_SUCCESS)
        fail("test(" + r.what + ") said done with status " + status_text(st) +
             "; done requests return WIA_SUCCESS");
      r.finished = true;
      r.status = WIA_SUCCESS;
      r.size = size;
      ++finished;
    } else if (done != 0) {
      fail("test(" + r.what + ") set *done to " + std::to_string(done) + "; expected 0 or 1");
    }
  }
  return finished;
}

wia_status_t Side::wait(Request* r, double ms) {
  Pacer pace;
  const double deadline = monotonic_ms() + std::min(ms, wait_budget_ms());
  while (!r->finished) {
    if (progress() > 0)
      pace.moved();
    else if (!r->finished)
      pace.idle();
    if (!r->finished && monotonic_ms() > deadline) return WIA_IN_PROGRESS;
  }
  return r->status;
}

void Side::wait_ok(Request* r) {
  c.step(std::string(name()) + ": waiting for " + r->what);
  const wia_status_t st = wait(r);
  if (st == WIA_IN_PROGRESS)
    fail(std::string(name()) + ": " + r->what + " still not done at the end of the test's time (" +
         std::to_string(outstanding()) + " requests outstanding)");
  if (st != WIA_SUCCESS)
    fail(std::string(name()) + ": expected " + r->what +
         " to succeed\n     got: " + status_text(st));
}

void Side::wait_all_ok(const std::vector<Request*>& rs) {
  for (Request* r : rs) wait_ok(r);
}

void Side::cleanup() {
  while (!conns_.empty()) close_conn(conns_.back());
  close_listener();
  for (auto& b : buffers_) unmap(b);
}

}  // namespace wia::conformance
