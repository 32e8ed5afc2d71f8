// SPDX-License-Identifier: Apache-2.0
#include "bootstrap/root.hpp"

#include <fmt/core.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <deque>
#include <map>
#include <optional>
#include <vector>

#include "bootstrap/wire.hpp"
#include "common/error.hpp"
#include "common/log.hpp"

namespace wia::bootstrap {

namespace {

constexpr std::string_view kTag = "bootstrap";
// Unauthenticated connections held at once; more are closed on accept, so a
// connection flood cannot exhaust the root's descriptors.
constexpr std::size_t kMaxPendingConnections = 256;
// How long the root keeps trying to deliver a failure to ranks after the
// job's bootstrap has failed.
constexpr auto kLinger = std::chrono::seconds(2);
// Extra time the root gives the rendezvous beyond its timeout, so ranks
// (whose own timeout starts a little later) report first and get the
// precise message.
constexpr auto kRootGrace = std::chrono::seconds(2);
constexpr std::size_t kReadChunk = 64 * 1024;

enum class Stage { kAuth, kHello, kMember, kClosing };

using Buffer = std::shared_ptr<const std::vector<std::uint8_t>>;

struct Conn {
  Fd fd;
  std::string peer;  // "127.0.0.1:45678"
  Stage stage = Stage::kAuth;
  Deadline handshake_deadline{};
  std::array<std::uint8_t, wire::kNonceBytes> server_nonce{};
  std::vector<std::uint8_t> in;
  std::deque<Buffer> out;
  std::size_t out_offset = 0;  // into out.front()
  int rank = -1;
  bool said_bye = false;
  bool close_after_flush = false;
  bool dead = false;
};

struct Member {
  Conn* conn = nullptr;
  std::uint32_t pid = 0;
  std::string host_id;
  std::string host_name;
  std::string peer;
  std::uint64_t next_seq = 0;
};

struct GatherOp {
  wire::GatherKind kind{};
  std::uint32_t blob_bytes = 0;
  int first_rank = -1;
  std::vector<std::optional<std::vector<std::uint8_t>>> parts;
  std::uint32_t count = 0;
};

std::string rank_list(const std::vector<int>& ranks) {
  std::string out = ranks.size() == 1 ? "rank " : "ranks ";
  for (std::size_t i = 0; i < ranks.size(); ++i) {
    if (i != 0) out += ", ";
    if (i == 16 && ranks.size() > 17) {
      out += fmt::format("... ({} more)", ranks.size() - 16);
      break;
    }
    out += std::to_string(ranks[i]);
  }
  return out;
}

}  // namespace

// The state of the serving thread; lives on its stack.
struct RootServer::Loop {
  RootServer& server;
  const Settings& settings;
  std::string name;  // for log lines
  std::vector<std::unique_ptr<Conn>> conns;
  std::uint32_t size = 0;
  int size_from_rank = -1;
  std::uint32_t size_from_pid = 0;
  std::vector<Member> members;  // by rank; conn == nullptr until joined
  std::uint32_t joined = 0;
  bool rendezvous_done = false;
  std::optional<Deadline> first_arrival;
  Deadline rendezvous_deadline{};
  std::optional<std::pair<wia_status_t, std::string>> failure;
  Deadline linger_deadline{};
  std::map<std::uint64_t, GatherOp> gathers;
  std::map<std::string, std::vector<std::uint8_t>, std::less<>> store;
  std::map<std::string, std::vector<std::pair<int, std::uint64_t>>, std::less<>> waiting_gets;

  Loop(RootServer& s, std::string n) : server(s), settings(s.settings_), name(std::move(n)) {}

  std::string who(int rank) const {
    const Member& m = members[static_cast<std::size_t>(rank)];
    return fmt::format("rank {} (pid {} on {})", rank, m.pid, m.host_name);
  }

  void queue(Conn& c, Buffer frame) {
    if (c.dead) return;
    c.out.push_back(std::move(frame));
  }
  void queue(Conn& c, std::vector<std::uint8_t> frame) {
    queue(c, std::make_shared<const std::vector<std::uint8_t>>(std::move(frame)));
  }

  // Why a connection was refused. The log budget is kept per reason, so a
  // flood of one kind (1,000 connections at once) cannot use it up and hide
  // a later garbage or wrong-key client.
  enum class Refusal { kFlood, kMalformed, kAuthentication, kSlow, kCount };
  std::array<std::uint64_t, static_cast<std::size_t>(Refusal::kCount)> refusals{};

  void reject(Conn& c, Refusal kind, std::string_view why) {
    ++server.rejected_;
    const auto n = ++refusals[static_cast<std::size_t>(kind)];
    // A flood of bad clients must not flood the log either.
    if (n <= 20 || n % 1000 == 0) {
      log::warn(kTag, "root {}: rejected connection from {}: {}{}", name, c.peer, why,
                n == 20 ? " (further rejections of this kind are logged every 1000th)" : "");
    }
    c.dead = true;
  }

  Buffer error_frame() const {
    return std::make_shared<const std::vector<std::uint8_t>>(
        wire::Writer(wire::FrameType::kError)
            .i32(failure->first)
            .text(failure->second.substr(0, wire::kMaxTextBytes))
            .finish());
  }

  // The job's bootstrap has failed: every rank that is or will be connected
  // gets the same error.
  void fail(wia_status_t status, std::string message) {
    if (failure) return;
    log::warn(kTag, "root {}: {}", name, message);
    failure.emplace(status, std::move(message));
    const Buffer frame = error_frame();
    for (auto& c : conns) {
      // (Not to a client refused at authentication: it is closing too.)
      if (c->stage == Stage::kMember || (c->stage == Stage::kClosing && c->rank >= 0)) {
        queue(*c, frame);
        c->close_after_flush = true;
      }
    }
    linger_deadline = Clock::now() + kLinger;
  }

  void accept_all() {
    for (;;) {
      sockaddr_storage ss{};
      socklen_t len = sizeof ss;
      const int fd = ::accept4(server.listener_.get(), reinterpret_cast<sockaddr*>(&ss), &len,
                               SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) return;  // EAGAIN, or a transient error: poll again
      auto c = std::make_unique<Conn>();
      c->fd.reset(fd);
      c->peer = SocketAddress::from(reinterpret_cast<sockaddr*>(&ss), len).to_string();
      const auto pending = std::count_if(conns.begin(), conns.end(), [](const auto& x) {
        return !x->dead && (x->stage == Stage::kAuth || x->stage == Stage::kHello);
      });
      if (static_cast<std::size_t>(pending) >= kMaxPendingConnections) {
        // The table is full. Refusing the newcomer (as this once did) let
        // 256 silent connections lock every real rank out until their
        // handshake deadline, and the ranks, taking the close for a refusal,
        // failed the job. The oldest connection that has not authenticated
        // makes room instead: a flood evicts itself, while a rank, which
        // answers its challenge within a round trip, is through before 256
        // newer connections arrive (and retries if it was not: join.cpp).
        // Connections that proved the secret (saying hello) are never evicted.
        const auto oldest = std::find_if(conns.begin(), conns.end(), [](const auto& x) {
          return !x->dead && x->stage == Stage::kAuth;
        });
        if (oldest == conns.end()) {
          reject(*c, Refusal::kFlood, "too many connections are still authenticating");
          continue;
        }
        reject(**oldest, Refusal::kFlood,
               fmt::format("evicted before authenticating: {} connections were waiting "
                           "(a connection flood?)",
                           kMaxPendingConnections));
      }
      set_nodelay(fd);
      c->handshake_deadline = Clock::now() + settings.handshake_timeout;
      random_bytes(c->server_nonce);
      queue(*c, wire::Writer(wire::FrameType::kChallenge).bytes(c->server_nonce).finish());
      conns.push_back(std::move(c));
    }
  }

  // Bound on a frame's payload from `c` at its stage, checked from the
  // header alone so an oversized length is refused before it is buffered.
  static std::size_t payload_bound(const Conn& c, wire::FrameType type) {
    switch (c.stage) {
      case Stage::kAuth:
        return type == wire::FrameType::kAuth ? wire::kNonceBytes + wire::kMacBytes : 0;
      case Stage::kHello:
        return type == wire::FrameType::kHello ? 12 + 2 * (4 + wire::kMaxTextBytes) : 0;
      case Stage::kMember:
        return wire::kMaxRequestBytes;
      case Stage::kClosing:
        return 0;
    }
    return 0;
  }

  void read_from(Conn& c) {
    for (;;) {
      const std::size_t old = c.in.size();
      c.in.resize(old + kReadChunk);
      const ssize_t n = ::recv(c.fd.get(), c.in.data() + old, kReadChunk, 0);
      c.in.resize(old + static_cast<std::size_t>(std::max<ssize_t>(n, 0)));
      if (n > 0) {
        if (!parse_frames(c)) return;
        continue;
      }
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
      if (n < 0 && errno == EINTR) continue;
      disconnected(c, n == 0 ? "closed the connection" : std::strerror(errno));
      return;
    }
  }

  // Handles every complete frame in c.in; false when c was dropped.
  bool parse_frames(Conn& c) {
    std::size_t pos = 0;
    while (!c.dead && c.in.size() - pos >= wire::kHeaderBytes) {
      wire::Header h;
      try {
        h = wire::decode_header(c.in.data() + pos);
        const std::size_t bound = payload_bound(c, h.type);
        if (bound == 0) {
          throw wire::ProtocolError(fmt::format("unexpected '{}' frame {}",
                                                wire::frame_type_name(h.type),
                                                c.stage == Stage::kAuth    ? "before authentication"
                                                : c.stage == Stage::kHello ? "before hello"
                                                                           : "after bye"));
        }
        if (h.length > bound) {
          throw wire::ProtocolError(fmt::format("'{}' frame of {} bytes exceeds the bound of {}",
                                                wire::frame_type_name(h.type), h.length, bound));
        }
        if (c.in.size() - pos - wire::kHeaderBytes < h.length) break;
        const std::span<const std::uint8_t> payload(c.in.data() + pos + wire::kHeaderBytes,
                                                    h.length);
        pos += wire::kHeaderBytes + h.length;
        handle(c, h.type, payload);
      } catch (const wire::ProtocolError& e) {
        protocol_error(c, e.what());
        return false;
      }
    }
    c.in.erase(c.in.begin(),
               c.in.begin() + static_cast<std::ptrdiff_t>(std::min(pos, c.in.size())));
    return !c.dead;
  }

  void protocol_error(Conn& c, std::string_view what) {
    // Refused at hello (rank -1: the job has failed) and waiting for its error
    // frame to flush: it is no member, so it must not index `members`
    // (found by fuzz_bootstrap: a hello refused and a bad frame in one read
    // wrote members[-1]).
    if (c.stage == Stage::kMember && c.rank < 0) {
      reject(c, Refusal::kMalformed, what);
      return;
    }
    if (c.stage == Stage::kMember) {
      // A rank of the job sent garbage: its state is unknown, so is the job's.
      const int rank = c.rank;
      fail(WIA_ERROR_REMOTE,
           fmt::format("bootstrap: {} sent a malformed frame: {}", who(rank), what));
      c.dead = true;
      members[static_cast<std::size_t>(rank)].conn = nullptr;
      return;
    }
    reject(c, Refusal::kMalformed, what);
  }

  void handle(Conn& c, wire::FrameType type, std::span<const std::uint8_t> payload) {
    wire::Reader r(payload);
    switch (c.stage) {
      case Stage::kAuth:
        return handle_auth(c, r);
      case Stage::kHello:
        return handle_hello(c, r);
      case Stage::kMember:
        return handle_member(c, type, r);
      case Stage::kClosing:
        return;
    }
  }

  void handle_auth(Conn& c, wire::Reader& r) {
    const auto client_nonce = r.bytes(wire::kNonceBytes);
    const auto mac = r.bytes(wire::kMacBytes);
    r.expect_end();
    std::vector<std::uint8_t> message(wire::kClientRole.begin(), wire::kClientRole.end());
    message.insert(message.end(), c.server_nonce.begin(), c.server_nonce.end());
    message.insert(message.end(), client_nonce.begin(), client_nonce.end());
    const std::uint64_t expected = siphash24(settings.secret, message);
    std::array<std::uint8_t, 8> expected_bytes{};
    for (int i = 0; i < 8; ++i) expected_bytes[i] = static_cast<std::uint8_t>(expected >> (8 * i));
    if (!constant_time_equal(expected_bytes, mac)) {
      reject(c, Refusal::kAuthentication,
             "wrong authentication (not a rank of this job, or a different secret / "
             "WIA_AUTH_KEY)");
      // Said explicitly (an error frame, then the close) so that a rank can
      // tell this refusal, final, from a connection dropped under load
      // (evicted above), which it retries. All of its input has been read,
      // so the close is an orderly one and the frame arrives.
      c.dead = false;
      c.stage = Stage::kClosing;
      c.close_after_flush = true;
      queue(c, wire::Writer(wire::FrameType::kError)
                   .i32(WIA_ERROR_REMOTE)
                   .text("bootstrap: authentication refused: the secrets differ")
                   .finish());
      return;
    }
    std::vector<std::uint8_t> answer(wire::kServerRole.begin(), wire::kServerRole.end());
    answer.insert(answer.end(), client_nonce.begin(), client_nonce.end());
    answer.insert(answer.end(), c.server_nonce.begin(), c.server_nonce.end());
    wire::Writer w(wire::FrameType::kAuthOk);
    w.u64(siphash24(settings.secret, answer));
    queue(c, std::move(w).finish());
    c.stage = Stage::kHello;
  }

  void handle_hello(Conn& c, wire::Reader& r) {
    const std::uint32_t rank = r.u32();
    const std::uint32_t job_size = r.u32();
    const std::uint32_t pid = r.u32();
    std::string host_id = r.text(wire::kMaxTextBytes);
    std::string host_name = r.text(wire::kMaxTextBytes);
    r.expect_end();
    c.stage = Stage::kMember;  // authenticated: it gets errors from now on
    c.rank = -1;
    if (!first_arrival) {
      first_arrival = Clock::now();
      rendezvous_deadline = *first_arrival + settings.timeout + kRootGrace;
    }
    if (failure) {
      queue(c, error_frame());
      c.close_after_flush = true;
      return;
    }
    const std::string who_text = fmt::format("pid {} on {} ({})", pid, host_name, c.peer);
    if (job_size == 0 || job_size > wire::kMaxRanks) {
      fail(WIA_ERROR_INVALID_ARGUMENT,
           fmt::format("bootstrap: rank {} ({}) asked for a job of {} ranks (valid: 1..{})", rank,
                       who_text, job_size, wire::kMaxRanks));
      queue(c, error_frame());
      c.close_after_flush = true;
      return;
    }
    if (size == 0) {
      size = job_size;
      size_from_rank = static_cast<int>(rank);
      size_from_pid = pid;
      members.resize(size);
    } else if (job_size != size) {
      fail(WIA_ERROR_INVALID_ARGUMENT,
           fmt::format("bootstrap: ranks disagree on the job size: rank {} (pid {}) says {}, "
                       "rank {} ({}) says {}",
                       size_from_rank, size_from_pid, size, rank, who_text, job_size));
      queue(c, error_frame());
      c.close_after_flush = true;
      return;
    }
    if (rank >= size) {
      fail(WIA_ERROR_INVALID_ARGUMENT,
           fmt::format("bootstrap: rank {} ({}) is out of range for a job of {} ranks (valid: "
                       "0..{})",
                       rank, who_text, size, size - 1));
      queue(c, error_frame());
      c.close_after_flush = true;
      return;
    }
    Member& m = members[rank];
    if (m.conn != nullptr) {
      fail(WIA_ERROR_INVALID_ARGUMENT,
           fmt::format("bootstrap: rank {} joined twice: pid {} on {} ({}) and {}", rank, m.pid,
                       m.host_name, m.peer, who_text));
      queue(c, error_frame());
      c.close_after_flush = true;
      return;
    }
    c.rank = static_cast<int>(rank);
    m = Member{&c, pid, std::move(host_id), std::move(host_name), c.peer, 0};
    ++joined;
    log::debug(kTag, "root {}: rank {} joined ({}/{})", name, rank, joined, size);
    if (joined == size) {
      rendezvous_done = true;
      wire::Writer w(wire::FrameType::kWelcome);
      w.u32(size);
      for (const Member& each : members) w.text(each.host_id);
      const auto frame = std::make_shared<const std::vector<std::uint8_t>>(std::move(w).finish());
      for (const Member& each : members) queue(*each.conn, frame);
      log::debug(kTag, "root {}: rendezvous of {} ranks complete", name, size);
    }
  }

  void handle_member(Conn& c, wire::FrameType type, wire::Reader& r) {
    const int rank = c.rank;
    if (rank < 0) return;  // refused at hello; waiting to be closed
    switch (type) {
      case wire::FrameType::kGather:
        return handle_gather(rank, r);
      case wire::FrameType::kSend: {
        const std::uint32_t dst = r.u32();
        const std::uint64_t tag = r.u64();
        const auto data = r.blob(wire::kMaxBlobBytes);
        r.expect_end();
        if (!rendezvous_done || dst >= size) {
          throw wire::ProtocolError(fmt::format("send to rank {} in a job of {} ranks", dst, size));
        }
        Conn* to = members[dst].conn;
        if (to == nullptr || to->stage != Stage::kMember) {
          log::debug(kTag, "root {}: dropped a message from rank {} to rank {}, which has closed",
                     name, rank, dst);
          return;
        }
        queue(*to, wire::Writer(wire::FrameType::kDeliver)
                       .u32(static_cast<std::uint32_t>(rank))
                       .u64(tag)
                       .blob(data)
                       .finish());
        return;
      }
      case wire::FrameType::kPut: {
        std::string key = r.text(wire::kMaxKeyBytes);
        const auto value = r.blob(wire::kMaxBlobBytes);
        r.expect_end();
        auto& stored = store[key];
        stored.assign(value.begin(), value.end());
        if (auto it = waiting_gets.find(key); it != waiting_gets.end()) {
          for (const auto& [who_rank, request] : it->second) send_value(who_rank, request, stored);
          waiting_gets.erase(it);
        }
        return;
      }
      case wire::FrameType::kGet: {
        const std::uint64_t request = r.u64();
        std::string key = r.text(wire::kMaxKeyBytes);
        r.expect_end();
        if (auto it = store.find(key); it != store.end()) {
          send_value(rank, request, it->second);
        } else {
          waiting_gets[key].emplace_back(rank, request);
        }
        return;
      }
      case wire::FrameType::kAbort: {
        const std::string reason = r.text(wire::kMaxTextBytes);
        fail(WIA_ERROR_ABORTED,
             fmt::format("bootstrap: {} aborted the job: {}", who(rank), reason));
        return;
      }
      case wire::FrameType::kTimeoutReport:
        return handle_timeout_report(rank, r);
      case wire::FrameType::kBye:
        r.expect_end();
        c.said_bye = true;
        c.stage = Stage::kClosing;
        c.close_after_flush = true;
        return;
      default:
        throw wire::ProtocolError(
            fmt::format("'{}' is not a request", wire::frame_type_name(type)));
    }
  }

  void send_value(int rank, std::uint64_t request, const std::vector<std::uint8_t>& value) {
    Conn* to = members[static_cast<std::size_t>(rank)].conn;
    if (to == nullptr) return;
    queue(*to, wire::Writer(wire::FrameType::kValue).u64(request).blob(value).finish());
  }

  void handle_gather(int rank, wire::Reader& r) {
    const std::uint64_t seq = r.u64();
    const auto kind = static_cast<wire::GatherKind>(r.u8());
    const auto blob = r.blob(wire::kMaxBlobBytes);
    r.expect_end();
    Member& m = members[static_cast<std::size_t>(rank)];
    if (!rendezvous_done || seq != m.next_seq) {
      throw wire::ProtocolError(
          fmt::format("collective #{} out of order (expected #{})", seq, m.next_seq));
    }
    if (kind != wire::GatherKind::kAllGather && kind != wire::GatherKind::kBarrier) {
      throw wire::ProtocolError(fmt::format("unknown collective kind {}", static_cast<int>(kind)));
    }
    ++m.next_seq;
    auto [it, fresh] = gathers.try_emplace(seq);
    GatherOp& op = it->second;
    if (fresh) {
      op.kind = kind;
      op.blob_bytes = static_cast<std::uint32_t>(blob.size());
      op.first_rank = rank;
      op.parts.resize(size);
    } else if (op.kind != kind || op.blob_bytes != blob.size()) {
      fail(WIA_ERROR_MISMATCH,
           fmt::format("bootstrap: ranks called different collectives as bootstrap collective "
                       "#{}: rank {} called {} with {} bytes, rank {} called {} with {} bytes",
                       seq, op.first_rank, wire::gather_kind_name(op.kind), op.blob_bytes, rank,
                       wire::gather_kind_name(kind), blob.size()));
      return;
    }
    op.parts[static_cast<std::size_t>(rank)].emplace(blob.begin(), blob.end());
    if (++op.count < size) return;
    wire::Writer w(wire::FrameType::kGatherResult);
    w.u64(seq).u32(op.blob_bytes);
    for (const auto& part : op.parts) w.bytes(*part);
    const auto frame = std::make_shared<const std::vector<std::uint8_t>>(std::move(w).finish());
    for (Member& each : members) {
      if (each.conn != nullptr && each.conn->stage == Stage::kMember) queue(*each.conn, frame);
    }
    gathers.erase(it);
  }

  void handle_timeout_report(int rank, wire::Reader& r) {
    const auto what = static_cast<wire::WaitKind>(r.u8());
    const std::uint64_t seq = r.u64();
    const std::uint32_t waited_ms = r.u32();
    r.expect_end();
    std::vector<int> missing;
    std::string where;
    if (what == wire::WaitKind::kRendezvous) {
      if (rendezvous_done) return;  // the welcome is on its way
      for (std::uint32_t i = 0; i < size; ++i) {
        if (members[i].conn == nullptr) missing.push_back(static_cast<int>(i));
      }
      where = "";
    } else {
      auto it = gathers.find(seq);
      if (it == gathers.end()) return;  // completed; the result is on its way
      for (std::uint32_t i = 0; i < size; ++i) {
        if (!it->second.parts[i]) missing.push_back(static_cast<int>(i));
      }
      where = fmt::format(" at {} #{}", wire::gather_kind_name(it->second.kind), seq);
    }
    if (missing.empty()) return;
    fail(WIA_ERROR_TIMEOUT,
         fmt::format("bootstrap: {} of {} ranks did not arrive{} within {} ms: {} (reported by "
                     "rank {})",
                     missing.size(), size, where, waited_ms, rank_list(missing), rank));
  }

  void disconnected(Conn& c, std::string_view how) {
    c.dead = true;
    if (c.rank < 0) {
      if (c.stage == Stage::kAuth || c.stage == Stage::kHello) {
        log::debug(kTag, "root {}: connection from {} {} during the handshake", name, c.peer, how);
      }
      return;
    }
    Member& m = members[static_cast<std::size_t>(c.rank)];
    const std::string text = who(c.rank);
    m.conn = nullptr;
    if (c.said_bye) return;
    if (!rendezvous_done) {
      // It may come back (a restarted process); until then it counts as missing.
      --joined;
      log::warn(kTag, "root {}: {} {} before the rendezvous completed", name, text, how);
      return;
    }
    fail(WIA_ERROR_REMOTE, fmt::format("bootstrap: {} {} without closing its bootstrap (did the "
                                       "process die?)",
                                       text, how));
  }

  void write_to(Conn& c) {
    while (!c.out.empty()) {
      const auto& front = *c.out.front();
      const ssize_t n = ::send(c.fd.get(), front.data() + c.out_offset, front.size() - c.out_offset,
                               MSG_NOSIGNAL);
      if (n < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK) return;
        if (errno == EINTR) continue;
        disconnected(c, std::strerror(errno));
        return;
      }
      c.out_offset += static_cast<std::size_t>(n);
      if (c.out_offset == front.size()) {
        c.out.pop_front();
        c.out_offset = 0;
      }
    }
  }

  bool all_members_gone() const {
    return std::none_of(members.begin(), members.end(),
                        [](const Member& m) { return m.conn != nullptr; });
  }

  // Whether the serving thread is done.
  bool should_exit(Deadline now) {
    if (server.stop_requested_.load()) return true;
    if (failure) {
      const bool flushed = std::all_of(conns.begin(), conns.end(), [](const auto& c) {
        return c->out.empty() || c->stage != Stage::kMember;
      });
      if (rendezvous_done || server.drain_requested_.load()) {
        return flushed || now >= linger_deadline;
      }
      // Before the rendezvous, late ranks still deserve the error: serve it
      // until the rendezvous deadline.
      return now >= rendezvous_deadline && (flushed || now >= linger_deadline);
    }
    if (rendezvous_done) return all_members_gone();
    if (now >= rendezvous_deadline) {
      std::vector<int> missing;
      for (std::uint32_t i = 0; i < size; ++i) {
        if (members[i].conn == nullptr) missing.push_back(static_cast<int>(i));
      }
      if (size == 0) {
        log::warn(kTag, "root {}: no rank arrived within {} ms; closing", name,
                  settings.timeout.count());
        return true;
      }
      fail(WIA_ERROR_TIMEOUT,
           fmt::format("bootstrap: {} of {} ranks did not arrive within {} ms: {}", missing.size(),
                       size, settings.timeout.count(), rank_list(missing)));
      rendezvous_deadline = Clock::now() + kLinger;
    }
    return false;
  }

  // The serving thread is ending: connections still in their handshake
  // end with it, each logged like any other refusal (a silent client is
  // named whether the job outlived its handshake deadline or not).
  void close_pending() {
    const Deadline now = Clock::now();
    const auto logged_before = refusals[static_cast<std::size_t>(Refusal::kSlow)];
    std::uint64_t closed = 0;
    for (auto& c : conns) {
      if (c->dead || (c->stage != Stage::kAuth && c->stage != Stage::kHello)) continue;
      const auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(
          now - (c->handshake_deadline - settings.handshake_timeout));
      reject(*c, Refusal::kSlow,
             fmt::format("the job's bootstrap ended before it authenticated ({} ms after "
                         "connecting)",
                         waited.count()));
      ++closed;
    }
    // Those past the log budget still count, in one line.
    if (logged_before + closed > 20) {
      log::warn(kTag, "root {}: closed {} connection(s) still authenticating at its end", name,
                closed);
    }
  }

  void run() {
    rendezvous_deadline = Clock::now() + settings.timeout + kRootGrace;
    std::vector<pollfd> fds;
    for (;;) {
      const Deadline now = Clock::now();
      // Handshake deadlines: slow or silent clients (slowloris) are cut off.
      for (auto& c : conns) {
        if ((c->stage == Stage::kAuth || c->stage == Stage::kHello) && !c->dead &&
            now >= c->handshake_deadline) {
          reject(*c, Refusal::kSlow,
                 fmt::format("no complete handshake within {} ms",
                             settings.handshake_timeout.count()));
        }
        if (c->close_after_flush && c->out.empty()) {
          if (c->rank >= 0 && members[static_cast<std::size_t>(c->rank)].conn == c.get()) {
            members[static_cast<std::size_t>(c->rank)].conn = nullptr;
          }
          c->dead = true;
        }
      }
      std::erase_if(conns, [](const auto& c) { return c->dead; });
      if (should_exit(now)) return;

      Deadline wake_at = failure           ? std::min(linger_deadline, rendezvous_deadline)
                         : rendezvous_done ? Deadline::max()
                                           : rendezvous_deadline;
      if (failure && rendezvous_done) wake_at = linger_deadline;
      fds.clear();
      fds.push_back({server.wake_.get(), POLLIN, 0});
      fds.push_back({server.listener_.get(), POLLIN, 0});
      for (auto& c : conns) {
        short events = POLLIN;
        if (!c->out.empty()) events |= POLLOUT;
        fds.push_back({c->fd.get(), events, 0});
        if (c->stage == Stage::kAuth || c->stage == Stage::kHello) {
          wake_at = std::min(wake_at, c->handshake_deadline);
        }
      }
      const int timeout_ms = wake_at == Deadline::max() ? -1 : ms_until(wake_at);
      const int ready = ::poll(fds.data(), fds.size(), timeout_ms);
      if (ready < 0 && errno != EINTR) {
        log::error(kTag, "root {}: poll failed: {}", name, std::strerror(errno));
        return;
      }
      if (ready <= 0) continue;
      if (fds[0].revents != 0) {
        if (server.stop_requested_.load()) return;
        std::uint64_t count = 0;  // drain_and_stop(): re-evaluate should_exit()
        [[maybe_unused]] const ssize_t n = ::read(server.wake_.get(), &count, sizeof count);
      }
      // conns may grow during accept_all; index only the ones polled.
      const std::size_t polled = fds.size() - 2;
      for (std::size_t i = 0; i < polled; ++i) {
        Conn& c = *conns[i];
        const short revents = fds[i + 2].revents;
        if (c.dead || revents == 0) continue;
        if ((revents & (POLLIN | POLLHUP | POLLERR)) != 0) read_from(c);
        if (!c.dead && (revents & POLLOUT) != 0) write_to(c);
      }
      if (fds[1].revents != 0) accept_all();
      // Frames queued while handling input go out without waiting a round.
      for (auto& c : conns) {
        if (!c->dead && !c->out.empty()) write_to(*c);
      }
    }
  }
};

std::vector<RootServer::FeedResult> RootServer::feed_for_testing(
    Settings settings, std::span<const FeedChunk> chunks) {
  RootServer server(std::move(settings), NoThread{});
  Loop loop(server, "feed");
  std::map<std::uint8_t, Conn*> by_id;
  for (const FeedChunk& chunk : chunks) {
    auto [it, fresh] = by_id.try_emplace(chunk.conn, nullptr);
    if (fresh) {
      auto c = std::make_unique<Conn>();
      c->peer = fmt::format("feed:{}", chunk.conn);
      c->handshake_deadline = Deadline::max();
      c->server_nonce.fill(chunk.conn);
      loop.queue(*c, wire::Writer(wire::FrameType::kChallenge).bytes(c->server_nonce).finish());
      it->second = c.get();
      loop.conns.push_back(std::move(c));
    }
    Conn& c = *it->second;
    if (c.dead) continue;
    c.in.insert(c.in.end(), chunk.bytes.begin(), chunk.bytes.end());
    loop.parse_frames(c);
  }
  std::vector<FeedResult> out;
  for (const auto& c : loop.conns) {
    FeedResult r;
    for (const Buffer& frame : c->out) r.sent.insert(r.sent.end(), frame->begin(), frame->end());
    r.dropped = c->dead;
    out.push_back(std::move(r));
  }
  return out;
}

RootServer::RootServer(Fd listener, Settings settings)
    : settings_(std::move(settings)), listener_(std::move(listener)) {
  wake_.reset(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!wake_.valid()) {
    throw Error(WIA_ERROR_IO,
                fmt::format("bootstrap: cannot create an eventfd: {}", std::strerror(errno)));
  }
  address_ = local_address(listener_.get());
  thread_ = std::thread([this] { run(); });
}

RootServer::~RootServer() {
  stop();
  if (thread_.joinable()) thread_.join();
}

void RootServer::stop() noexcept {
  stop_requested_.store(true);
  const std::uint64_t one = 1;
  [[maybe_unused]] const ssize_t n = ::write(wake_.get(), &one, sizeof one);
}

void RootServer::drain_and_stop() noexcept {
  drain_requested_.store(true);
  const std::uint64_t one = 1;
  [[maybe_unused]] const ssize_t n = ::write(wake_.get(), &one, sizeof one);
}

bool RootServer::wait_finished(Deadline deadline) const {
  while (!finished_.load()) {
    if (Clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return true;
}

void RootServer::run() noexcept {
  try {
    Loop loop(*this, address_.to_string());
    loop.run();
    loop.close_pending();
  } catch (const std::exception& e) {
    log::error(kTag, "root {}: stopped by an internal error: {}", address_.to_string(), e.what());
  }
  listener_.reset();  // late clients are refused rather than left hanging
  finished_.store(true);
}

}  // namespace wia::bootstrap
