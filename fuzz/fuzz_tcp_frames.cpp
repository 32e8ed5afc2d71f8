// SPDX-License-Identifier: Apache-2.0
// fuzz_tcp_frames: the tcp provider's control messages (WireMsg headers and
// eager payloads, providers/tcp/tcp_wire.hpp) and data-socket bytes as a
// peer sends them, read by the provider's own connection (tcp::Conn, built
// from connected sockets as accept() builds it; here Unix socket pairs
// stand in for TCP) while the receiver has receives posted and sends
// waiting for a CTS.
//
// Input: [u8 receives][u8 sends] then per receive [u8 tag][u24 capacity],
// per send [u8 tag][u24 size], then [u16 control length][control bytes]
// [data-socket bytes]. The peer then closes both sockets.
//
// Invariants beyond "no crash":
//  - a receive completes with at most its capacity (the buffers are exactly
//    that size: ASan catches a write past them);
//  - every request ends (the peer's close fails what is left) and a failed
//    one says why;
//  - the connection never sends a malformed header: everything it writes on
//    the control socket is a sequence of valid WireMsg headers and payloads.
#include <sys/socket.h>

#include <memory>
#include <vector>

#include "fuzz_common.hpp"
#include "provider/host_services.hpp"
#include "tcp.hpp"

namespace {

namespace tcp = wia::tcp;
using wia::fuzz::check;

tcp::Ctx& context() {
  static wia::provider_host::HostContext host{"tcp", nullptr};
  static const wia_host_services_v1_t services = wia::provider_host::make_host_services(&host);
  static tcp::Ctx ctx = [] {
    tcp::Ctx c;
    c.host = &services;
    c.params.max_message = 1 << 20;
    c.params.unexpected_max = 256 * 1024;
    return c;
  }();
  return ctx;
}

struct Pending {
  tcp::Request* request;
  std::unique_ptr<char[]> buffer;
  std::uint64_t capacity;
  bool is_send;
};

void write_all(int fd, std::span<const std::uint8_t> bytes) {
  std::size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::send(fd, bytes.data() + done, bytes.size() - done, MSG_NOSIGNAL);
    if (n <= 0) return;  // the provider closed: it refused the stream
    done += static_cast<std::size_t>(n);
  }
}

// What the connection wrote on its control socket must be valid messages.
void check_sent(int fd) {
  std::vector<std::uint8_t> out;
  std::uint8_t buf[4096];
  for (;;) {
    const ssize_t n = ::recv(fd, buf, sizeof buf, MSG_DONTWAIT);
    if (n <= 0) break;
    out.insert(out.end(), buf, buf + n);
  }
  std::size_t pos = 0;
  while (out.size() - pos >= sizeof(tcp::WireMsg)) {
    tcp::WireMsg m;
    std::memcpy(&m, out.data() + pos, sizeof m);
    check(m.magic == tcp::kMsgMagic && m.check == tcp::msg_check(m), "provider sent a bad header");
    pos += sizeof m + (m.type == static_cast<std::uint8_t>(tcp::MsgType::eager) ? m.size : 0);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  wia::fuzz::quiet_logs();
  if (size > 256 * 1024) return 0;  // more than the socket buffers hold unread
  wia::fuzz::Bytes in(data, size);
  int ctrl[2], dat[2];
  check(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, ctrl) == 0, "socketpair");
  check(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, dat) == 0, "socketpair");
  tcp::Ctx& ctx = context();
  std::vector<Pending> pending;
  {
    auto conn = std::make_unique<tcp::Conn>(&ctx, std::vector<int>{ctrl[0], dat[0]}, "fuzz-peer");
    const int receives = in.u8() % 4;
    const int sends = in.u8() % 3;
    for (int i = 0; i < receives + sends; ++i) {
      const std::uint64_t tag = in.u8() % 4;
      const std::uint64_t bytes = (in.u16() | (std::uint64_t{in.u8()} << 16)) % (256 * 1024);
      Pending p{nullptr, std::make_unique<char[]>(bytes ? bytes : 1), bytes, i >= receives};
      wia_request_t r = nullptr;
      const wia_status_t st = p.is_send ? conn->isend(p.buffer.get(), bytes, tag, &r)
                                        : conn->irecv(p.buffer.get(), bytes, tag, &r);
      if (st == WIA_SUCCESS && r != nullptr) {
        p.request = reinterpret_cast<tcp::Request*>(r);
        pending.push_back(std::move(p));
      }
    }
    const auto control = in.take(in.u16());
    write_all(ctrl[1], control);
    write_all(dat[1], in.rest());
    ::shutdown(ctrl[1], SHUT_WR);
    ::shutdown(dat[1], SHUT_WR);

    // The peer has closed: every request must end, each within a few calls
    // (nothing more can arrive). Bounded so a stuck request is reported.
    for (int round = 0; round < 2000 && !pending.empty(); ++round) {
      for (std::size_t i = 0; i < pending.size();) {
        std::int32_t done = 0;
        std::uint64_t got = 0;
        const wia_status_t st = conn->test(pending[i].request, &done, &got);
        if (!done) {
          ++i;
          continue;
        }
        if (st == WIA_SUCCESS) {
          check(got <= pending[i].capacity, "receive completed with more than its capacity");
        } else {
          check(!wia::provider_host::take_error().empty(), "a request failed without a reason");
        }
        pending.erase(pending.begin() + static_cast<std::ptrdiff_t>(i));
      }
    }
    check(pending.empty(),
          std::to_string(pending.size()) + " request(s) still pending after the peer closed");
    check_sent(ctrl[1]);
  }  // the connection closes its sockets
  ::close(ctrl[1]);
  ::close(dat[1]);
  return 0;
}
