// SPDX-License-Identifier: Apache-2.0
// Fault tolerance on process communicators: revoke, agree and shrink
// (docs/fault-tolerance.md, "Revoke, agree, shrink").
//
// Revoke is the failure path of process_control.cpp started by the user:
// the communicator breaks here with WIA_ERROR_ABORTED and, through the
// abort message (marked as a revoke), on every peer.
//
// Agree and shrink cannot use the communicator's connections: a failure
// closes them, and a dead rank's transport state is gone with it. They use
// a recovery channel: every rank listens on a TCP socket from set-up on
// (loopback when the communicator is on one node), its address in its
// set-up record. An agreement is a star around a coordinator, the lowest
// rank this rank does not know to have failed:
//  - a participant connects to the coordinator and sends a hello (its flag
//    and the ranks it knows to have failed); when the coordinator is gone
//    (connection refused or closed) it counts it as failed and turns to the
//    next lowest rank, which has done or will do the same;
//  - the coordinator accepts hellos until every rank it does not know to
//    have failed has sent one. A rank named failed in any hello counts as
//    failed (failures are permanent); one whose listener refuses a probe
//    connection is dead; at collectives.timeout_ms the missing ones count
//    as failed;
//  - it sends every participant the decision: the AND of the flags and the
//    failed ranks.
// Decisions outlive their coordinator: a coordinator that dies after
// sending the decision to some participants and not others must not leave
// them with different answers. Every rank keeps the decisions it received
// or made (RecoveryDesk), and hands them out:
//  - its heartbeat thread answers, between agreements, any rank that asks
//    for one: a participant whose coordinator died turns to the next
//    lowest rank, which may have returned with the decision already;
//  - a rank that becomes coordinator asks every rank it waits for
//    (kQuery, where it used to only probe that the listener is alive) and
//    adopts a decision one of them holds, instead of deciding anew.
// A decision is made once per agreement: by the first coordinator, or by
// a later one when nobody alive holds the first's. (Without heartbeats
// nobody answers between agreements, and the old behaviour remains:
// docs/fault-tolerance.md.)
// A shrink keeps those connections for the new communicator's set-up
// exchange (each all-gather goes through the coordinator, the new rank 0),
// so it needs nothing of a dead rank: not its connections, not the
// bootstrap root. A failure during the shrink closes them, and every
// member's shrink fails at once instead of at the timeout.
#include <fmt/format.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <random>
#include <span>

#include "bootstrap/bootstrap.hpp"
#include "comm/process_internal.hpp"
#include "common/error.hpp"
#include "common/log.hpp"
#include "runtime/runtime.hpp"

namespace wia::comm {

namespace bs = wia::bootstrap;

namespace {

constexpr std::uint32_t kFrameMagic = 0x57494146;  // "WIAF"
enum FrameKind : std::uint32_t {
  kHello = 1,     // participant -> coordinator: flag, failed ranks it knows
  kDecision = 2,  // coordinator -> participant: AND of flags, failed ranks
  kRefuse = 3,    // coordinator -> participant: flag = status, payload = why
  kGather = 4,    // a shrink's set-up exchange: one member's blob
  kGathered = 5,  // every member's, in new-rank order
  kQuery = 6,     // a coordinator -> any rank: the decision of `epoch`, if it holds it
  kPending = 7,   // the answer to a query: none yet
};
enum RecoveryOp : std::uint32_t { kAgree = 1, kShrink = 2 };
const char* op_name(std::uint32_t op) {
  return op == kShrink ? "wia_comm_shrink" : "wia_comm_agree";
}
constexpr std::uint32_t kMaxPayload = 64u << 20;
constexpr std::size_t kKeptDecisions = 16;  // agreements a rank answers for
constexpr std::size_t kMaxEarlyHellos = 1024;
constexpr std::size_t kServedPerCall = 8;

struct Frame {
  std::uint32_t magic = kFrameMagic;
  std::uint32_t kind = 0;
  std::uint64_t token = 0;  // the channel's: frames of strangers are dropped
  std::uint64_t epoch = 0;  // the n-th agreement or shrink of the communicator
  std::int32_t rank = -1;   // the sender's
  std::int32_t flag = 0;
  std::uint32_t op = 0;
  std::uint32_t bytes = 0;  // payload after the frame
};

bs::IoResult send_frame(int fd, Frame f, std::span<const std::uint8_t> payload,
                        bs::Deadline deadline) {
  f.bytes = static_cast<std::uint32_t>(payload.size());
  std::vector<std::uint8_t> buf(sizeof f + payload.size());
  std::memcpy(buf.data(), &f, sizeof f);
  if (!payload.empty()) std::memcpy(buf.data() + sizeof f, payload.data(), payload.size());
  int err = 0;
  return bs::send_all(fd, buf, deadline, -1, &err);
}

bs::IoResult recv_frame(int fd, std::uint64_t token, Frame& f, std::vector<std::uint8_t>& payload,
                        bs::Deadline deadline) {
  int err = 0;
  bs::IoResult r =
      bs::recv_all(fd, {reinterpret_cast<std::uint8_t*>(&f), sizeof f}, deadline, -1, &err);
  if (r != bs::IoResult::kOk) return r;
  if (f.magic != kFrameMagic || f.token != token || f.bytes > kMaxPayload)
    return bs::IoResult::kError;
  payload.resize(f.bytes);
  if (f.bytes) r = bs::recv_all(fd, payload, deadline, -1, &err);
  return r;
}

std::vector<std::uint8_t> rank_list(const std::vector<char>& failed) {
  std::vector<std::uint8_t> out;
  for (std::int32_t r = 0; r < static_cast<std::int32_t>(failed.size()); ++r)
    if (failed[r]) {
      const auto* b = reinterpret_cast<const std::uint8_t*>(&r);
      out.insert(out.end(), b, b + 4);
    }
  return out;
}

std::vector<int> parse_ranks(const std::vector<std::uint8_t>& payload, int p) {
  std::vector<int> out;
  for (std::size_t at = 0; at + 4 <= payload.size(); at += 4) {
    std::int32_t r;
    std::memcpy(&r, payload.data() + at, 4);
    if (r >= 0 && r < p) out.push_back(r);
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

std::string join_ranks(const std::vector<int>& ranks) {
  std::string s;
  for (int r : ranks) s += (s.empty() ? "" : ", ") + std::to_string(r);
  return s.empty() ? "none" : s;
}

std::uint64_t mix(std::uint64_t x) {  // splitmix64's finaliser
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

const char* io_text(bs::IoResult r) {
  switch (r) {
    case bs::IoResult::kOk:
      return "ok";
    case bs::IoResult::kTimeout:
      return "timed out";
    case bs::IoResult::kClosed:
      return "connection closed";
    case bs::IoResult::kWoken:
      return "woken";
    case bs::IoResult::kError:
      break;
  }
  return "connection error or a malformed frame";
}

// Fault injection for tests (shrink_test.cpp, WIA_TEST_AGREE_EXIT_AFTER_SENDING_TO
// = "3" or "1,2"): the coordinator sends the decision to the listed ranks
// only and SIGKILLs itself, as one killed while telling the participants.
[[noreturn]] void exit_after_sending_to(const char* ranks, const std::vector<bs::Fd>& conn,
                                        const Frame& d, const std::vector<std::uint8_t>& list,
                                        bs::Deadline deadline) {
  for (const char* at = ranks; *at;) {
    char* end = nullptr;
    const long r = std::strtol(at, &end, 10);
    if (end == at) break;
    if (r >= 0 && static_cast<std::size_t>(r) < conn.size() && conn[r].valid())
      send_frame(conn[r].get(), d, list, deadline);
    at = *end == ',' ? end + 1 : end;
  }
  // SIGKILL, as a killed coordinator: nothing of this process runs after
  // it (no exit handlers, no sanitizer's report on threads not joined).
  ::kill(::getpid(), SIGKILL);
  ::_exit(137);  // not reached
}

}  // namespace

// The decisions a rank holds, and the answers it gives from them. Every
// function runs under Recovery::answer_mu.
class ProcessCommunicator::RecoveryDesk {
 public:
  using Decided = Recovery::Decided;

  static const Decided* find(const Recovery& rc, std::uint64_t epoch) {
    for (const Decided& d : rc.decided)
      if (d.epoch == epoch) return &d;
    return nullptr;
  }

  static void remember(Recovery& rc, Decided d) {
    if (find(rc, d.epoch)) return;
    rc.decided.push_back(std::move(d));
    if (rc.decided.size() > kKeptDecisions) rc.decided.erase(rc.decided.begin());
  }

  // Answers a query, or a hello of an agreement this rank holds the
  // decision of; false (nothing sent) for a hello it cannot answer yet.
  static bool answer(const Recovery& rc, int fd, std::int32_t me, std::uint32_t kind,
                     std::uint64_t epoch, std::uint32_t op, std::int32_t from) {
    const Decided* d = find(rc, epoch);
    if (!d && kind != kQuery) return false;
    Frame f;
    f.token = rc.token;
    f.epoch = epoch;
    f.rank = me;
    f.op = d ? d->op : op;
    const auto deadline = Clock::now() + std::chrono::milliseconds(200);
    std::string why;
    if (!d) {
      f.kind = kPending;
    } else if (d->op != op) {
      why = fmt::format("rank {} called {} (#{} on this communicator), which rank {} knows was "
                        "{}",
                        from, op_name(op), epoch, me, op_name(d->op));
      f.flag = WIA_ERROR_MISMATCH;
    } else if (kind == kHello && counts_failed(d->failed, from)) {
      why = fmt::format("rank {}: {}: the survivors count this rank as failed", from, op_name(op));
      f.flag = WIA_ERROR_REMOTE;
    } else {
      f.kind = kDecision;
      f.flag = d->flag;
      send_frame(fd, f, d->failed, deadline);
      return true;
    }
    if (!why.empty()) f.kind = kRefuse;
    send_frame(fd, f, std::span(reinterpret_cast<const std::uint8_t*>(why.data()), why.size()),
               deadline);
    return true;
  }

  // Between agreements (the heartbeat thread) and after one: accepts what
  // reached the listener, answers what the decisions held here answer, and
  // keeps the hellos of agreements not decided yet for the coordinator.
  static void serve(Recovery& rc, std::int32_t me) {
    const auto now = Clock::now();
    for (;;) {
      const int c = ::accept4(rc.listener.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (c < 0) break;
      rc.arrivals.push_back({bs::Fd(c), now});
    }
    // At most kServedPerCall frames read per call, and hellos no rank
    // waits for any more (older than collectives.timeout_ms) dropped: the
    // heartbeat thread must get back to its heartbeats.
    std::size_t served = 0;
    for (std::size_t i = rc.arrivals.size(); i-- > 0 && served < kServedPerCall;) {
      pollfd pf{rc.arrivals[i].fd.get(), POLLIN, 0};
      const bool ready = ::poll(&pf, 1, 0) > 0;
      if (!ready && now - rc.arrivals[i].since < std::chrono::seconds(2)) continue;
      bs::Fd fd = std::move(rc.arrivals[i].fd);
      rc.arrivals.erase(rc.arrivals.begin() + static_cast<std::ptrdiff_t>(i));
      if (!ready) continue;  // connected, never spoke
      ++served;
      Frame h;
      std::vector<std::uint8_t> payload;
      if (recv_frame(fd.get(), rc.token, h, payload, now + std::chrono::milliseconds(200)) !=
          bs::IoResult::kOk)
        continue;
      if (h.kind != kHello && h.kind != kQuery) continue;
      if (answer(rc, fd.get(), me, h.kind, h.epoch, h.op, h.rank)) continue;
      if (rc.early.size() >= kMaxEarlyHellos) rc.early.erase(rc.early.begin());
      rc.early.push_back(
          {std::move(fd), h.epoch, h.op, h.rank, h.flag, std::move(payload), now});
    }
    std::erase_if(rc.early, [&](const Recovery::EarlyHello& e) {
      return rc.hello_timeout.count() > 0 && now - e.since > rc.hello_timeout;
    });
    for (std::size_t i = rc.early.size(); i-- > 0;) {
      const Recovery::EarlyHello& e = rc.early[i];
      if (!find(rc, e.epoch)) continue;
      answer(rc, e.fd.get(), me, kHello, e.epoch, e.op, e.rank);
      rc.early.erase(rc.early.begin() + static_cast<std::ptrdiff_t>(i));
    }
  }

  static bool counts_failed(const std::vector<std::uint8_t>& failed, std::int32_t rank) {
    for (std::size_t at = 0; at + 4 <= failed.size(); at += 4) {
      std::int32_t r;
      std::memcpy(&r, failed.data() + at, 4);
      if (r == rank) return true;
    }
    return false;
  }
};

void ProcessCommunicator::answer_recovery() noexcept {
  if (!recovery_ || !recovery_->listener.valid()) return;
  Recovery& rc = *recovery_;
  std::unique_lock<std::mutex> lock(rc.answer_mu, std::try_to_lock);
  if (!lock.owns_lock() || rc.coordinating) return;
  try {
    RecoveryDesk::serve(rc, layout_.rank);
  } catch (const std::exception& e) {
    log::debug("comm", "rank {}: answering on the recovery channel: {}", layout_.rank, e.what());
  }
}

// A shrink's set-up exchange: every all-gather of the new communicator's
// set-up goes through the coordinator (the new rank 0) over the
// agreement's connections.
class ProcessCommunicator::RecoveryExchange final : public Exchange {
 public:
  std::vector<int> members;  // old ranks, ascending
  int me = 0;                // index of this rank in members
  // The coordinator: one connection per member (its own slot unused); a
  // participant: [0] to the coordinator.
  std::vector<bs::Fd> fds;
  std::uint64_t token = 0, epoch = 0;
  std::chrono::milliseconds timeout{0};

  std::vector<std::uint8_t> all_gather(const std::vector<std::uint8_t>& mine) override {
    const auto deadline = Clock::now() + timeout;
    const std::size_t n = members.size(), b = mine.size();
    Frame f;
    f.token = token;
    f.epoch = epoch;
    f.rank = members[me];
    std::vector<std::uint8_t> all(n * b);
    if (me != 0) {
      f.kind = kGather;
      bs::IoResult r = send_frame(fds[0].get(), f, mine, deadline);
      Frame g;
      if (r == bs::IoResult::kOk) r = recv_frame(fds[0].get(), token, g, all, deadline);
      if (r != bs::IoResult::kOk || g.kind != kGathered || all.size() != n * b)
        throw Error(r == bs::IoResult::kTimeout ? WIA_ERROR_TIMEOUT : WIA_ERROR_REMOTE,
                    fmt::format("rank {}: wia_comm_shrink: the set-up exchange through rank {} "
                                "failed ({}): it or another survivor failed during the shrink",
                                members[me], members[0], io_text(r)));
      return all;
    }
    std::copy(mine.begin(), mine.end(), all.begin());
    std::vector<std::uint8_t> blob;
    for (std::size_t i = 1; i < n; ++i) {
      Frame g;
      const bs::IoResult r = recv_frame(fds[i].get(), token, g, blob, deadline);
      if (r != bs::IoResult::kOk || g.kind != kGather || blob.size() != b)
        throw Error(r == bs::IoResult::kTimeout ? WIA_ERROR_TIMEOUT : WIA_ERROR_REMOTE,
                    fmt::format("rank {}: wia_comm_shrink: rank {} left the set-up exchange ({}): "
                                "it failed during the shrink",
                                members[me], members[i], io_text(r)));
      std::copy(blob.begin(), blob.end(), all.begin() + static_cast<std::ptrdiff_t>(i * b));
    }
    // A member that died since it sent its part is not an error here: the
    // others may already have the records, and throwing would let their
    // shrink succeed while this one's fails. It fails their next step (a
    // connection, a heartbeat) like any death.
    f.kind = kGathered;
    for (std::size_t i = 1; i < n; ++i) {
      const bs::IoResult r = send_frame(fds[i].get(), f, all, deadline);
      if (r != bs::IoResult::kOk)
        log::warn("comm", "rank {}: wia_comm_shrink: sending the set-up records to rank {} "
                  "failed ({})",
                  members[me], members[i], io_text(r));
    }
    return all;
  }

  // Between rounds nothing is read from these connections, so a closed
  // one (EOF or an error; data is the next round, early) means its member
  // gave up the set-up.
  std::string abandoned() override {
    for (std::size_t i = 0; i < fds.size(); ++i) {
      if (!fds[i].valid()) continue;
      char b;
      const ssize_t n = ::recv(fds[i].get(), &b, 1, MSG_PEEK | MSG_DONTWAIT);
      if (n > 0 || (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)))
        continue;
      const int who = me == 0 ? members[i] : members[0];
      return fmt::format("rank {} left the shrink's set-up ({})", who,
                         n == 0 ? "connection closed" : std::strerror(errno));
    }
    return {};
  }
};

void ProcessCommunicator::open_recovery_listener(MeshSetup& s) {
  recovery_ = std::make_unique<Recovery>();
  recovery_->hello_timeout = std::chrono::milliseconds(default_timeout_ms_);
  std::random_device rd;
  s.mine.recovery_nonce =
      (std::uint64_t(rd()) << 32) ^ rd() ^ std::uint64_t(Clock::now().time_since_epoch().count());
  try {
    bs::SocketAddress at;
    if (layout_.nnodes == 1) {
      at = bs::loopback_address(AF_INET, 0);
    } else {
      const auto options = bs::Options::from_config(Runtime::get().config());
      const auto interfaces = bs::list_interfaces();
      const auto chosen = bs::choose_interface(interfaces, options.ifname, options.family);
      if (!chosen)
        throw Error(WIA_ERROR_CONFIG, fmt::format("no usable interface address; interfaces: {}",
                                                  bs::describe_interfaces(interfaces)));
      at = chosen->address;
    }
    recovery_->listener = bs::listen_on(at, 256);
    const bs::SocketAddress local = bs::local_address(recovery_->listener.get());
    if (local.length > sizeof(s.mine.recovery_addr))
      throw Error(WIA_ERROR_INTERNAL, "the recovery address does not fit the record");
    std::memcpy(s.mine.recovery_addr, &local.storage, local.length);
    s.mine.recovery_len = local.length;
  } catch (const std::exception& e) {
    recovery_->listener.reset();
    log::warn("comm",
              "rank {}: no recovery channel (wia_comm_agree and wia_comm_shrink will fail): {}",
              layout_.rank, e.what());
  }
}

void ProcessCommunicator::adopt_recovery_addresses(const MeshSetup& s) {
  const int p = layout_.size;
  recovery_->address.assign(p, {});
  std::uint64_t token = 0x57494146u;
  for (int r = 0; r < p; ++r) {
    const RankRecord& rec = s.records[r];
    token = mix(token ^ rec.recovery_nonce);
    if (rec.recovery_len == 0 || rec.recovery_len > sizeof(rec.recovery_addr)) continue;
    bs::SocketAddress& a = recovery_->address[r];
    std::memcpy(&a.storage, rec.recovery_addr, rec.recovery_len);
    a.length = rec.recovery_len;
  }
  recovery_->token = token;
}

void ProcessCommunicator::revoke() {
  if (broken_.load()) return;  // every operation fails already, and the peers were told
  revoked_.store(true);
  revoke_requested_.store(true);
  order_signal_.notify();
  // Break it between two operations, so that the peers hear at once and
  // every later post fails. An operation that runs or is queued meets the
  // request at its next look at the control channel (Control::poll) and
  // breaks it itself; one that completes without looking lets this thread
  // take the next turn. Bounded: at worst the operations find it later.
  const auto until = Clock::now() + std::chrono::milliseconds(default_timeout_ms_);
  while (!broken_.load() && Clock::now() < until) {
    std::uint64_t seq = executed_.load(std::memory_order_acquire);
    if (next_seq_.compare_exchange_strong(seq, seq + 1)) {
      break_communicator(WIA_ERROR_ABORTED,
                         fmt::format("wia_comm_revoke was called on rank {}", layout_.rank));
      executed_.store(seq + 1, std::memory_order_release);
      order_signal_.notify();
      return;
    }
    sleep_us(500);
  }
}

ProcessCommunicator::Agreement ProcessCommunicator::agree(std::int32_t flag) {
  return run_agreement(kAgree, flag, nullptr);
}

ProcessCommunicator::Agreement ProcessCommunicator::run_agreement(
    std::uint32_t op, std::int32_t flag, std::unique_ptr<RecoveryExchange>* session) {
  const int p = layout_.size, me = layout_.rank;
  if (!recovery_ || !recovery_->listener.valid())
    throw Error(WIA_ERROR_UNAVAILABLE,
                fmt::format("rank {}: {}: this rank has no recovery channel (its listener could "
                            "not be opened at set-up; the log said why)",
                            me, op_name(op)));
  Recovery& rc = *recovery_;
  std::lock_guard<std::mutex> lock(rc.mu);
  const std::uint64_t epoch = ++rc.epoch;
  const auto timeout = std::chrono::milliseconds(default_timeout_ms_);
  const auto deadline = Clock::now() + timeout;
  std::vector<char> failed(static_cast<std::size_t>(p), 0);
  for (int r : failed_ranks()) failed[r] = 1;
  Frame base;
  base.token = rc.token;
  base.epoch = epoch;
  base.rank = me;
  base.op = op;

  auto finish = [&](Agreement a, std::vector<bs::Fd> fds) {
    {
      // Kept, for the ranks that ask when a coordinator died before
      // telling them; hellos that waited for it are answered now.
      std::lock_guard<std::mutex> g(rc.answer_mu);
      std::vector<std::uint8_t> list;
      for (const std::int32_t r : a.failed) {
        const auto* b = reinterpret_cast<const std::uint8_t*>(&r);
        list.insert(list.end(), b, b + 4);
      }
      RecoveryDesk::remember(rc, {epoch, op, a.flag, std::move(list)});
      RecoveryDesk::serve(rc, me);
    }
    for (int r : a.failed) note_failed(r);
    if (session) {
      auto ex = std::make_unique<RecoveryExchange>();
      for (int r = 0; r < p; ++r)
        if (!std::binary_search(a.failed.begin(), a.failed.end(), r)) {
          if (r == me) ex->me = static_cast<int>(ex->members.size());
          ex->members.push_back(r);
        }
      ex->fds = std::move(fds);
      ex->token = rc.token;
      ex->epoch = epoch;
      ex->timeout = timeout;
      *session = std::move(ex);
    }
    return a;
  };

  for (;;) {
    int coord = 0;
    while (coord < me && failed[coord]) ++coord;
    if (coord != me) {
      // A participant.
      int err = 0;
      bs::Fd fd = bs::connect_before(rc.address[coord], deadline, &err);
      if (!fd.valid()) {
        if (err == ETIMEDOUT)
          throw Error(WIA_ERROR_TIMEOUT,
                      fmt::format("rank {}: {}: connecting to the coordinator, rank {}, timed out "
                                  "after {} ms (collectives.timeout_ms)",
                                  me, op_name(op), coord, timeout.count()));
        log::info("comm", "rank {}: {}: coordinator rank {} is gone ({}); trying the next", me,
                  op_name(op), coord, std::strerror(err));
        failed[coord] = 1;
        continue;
      }
      Frame h = base;
      h.kind = kHello;
      h.flag = flag;
      bs::IoResult r = send_frame(fd.get(), h, rank_list(failed), deadline);
      Frame d;
      std::vector<std::uint8_t> payload;
      if (r == bs::IoResult::kOk) r = recv_frame(fd.get(), rc.token, d, payload, deadline);
      if (r == bs::IoResult::kTimeout)
        throw Error(WIA_ERROR_TIMEOUT,
                    fmt::format("rank {}: {}: the coordinator, rank {}, did not decide within {} "
                                "ms (collectives.timeout_ms): it has not called {}, or hangs",
                                me, op_name(op), coord, timeout.count(), op_name(op)));
      if (r != bs::IoResult::kOk) {
        log::info("comm", "rank {}: {}: coordinator rank {} failed ({}); trying the next", me,
                  op_name(op), coord, io_text(r));
        failed[coord] = 1;
        continue;
      }
      if (d.kind == kRefuse)
        throw Error(d.flag < 0 ? d.flag : WIA_ERROR_REMOTE,
                    std::string(payload.begin(), payload.end()));
      if (d.kind != kDecision || d.epoch != epoch)
        throw Error(WIA_ERROR_REMOTE, fmt::format("rank {}: {}: rank {} answered out of turn", me,
                                                  op_name(op), coord));
      Agreement a;
      a.flag = d.flag;
      a.failed = parse_ranks(payload, p);
      std::vector<bs::Fd> fds;
      fds.push_back(std::move(fd));
      return finish(std::move(a), std::move(fds));
    }

    // The coordinator.
    std::vector<bs::Fd> conn(static_cast<std::size_t>(p));
    std::vector<char> heard(static_cast<std::size_t>(p), 0);
    std::vector<std::int32_t> flags(static_cast<std::size_t>(p), 0);
    struct Pending {
      bs::Fd fd;
      Clock::time_point since;
    };
    struct Query {  // a kQuery sent to a rank this coordinator waits for
      bs::Fd fd;
      int rank;
      Clock::time_point since;
    };
    std::vector<Pending> pending;
    std::vector<Query> queries;
    std::optional<RecoveryDesk::Decided> adopted;
    auto refuse = [&](bs::Fd& fd, wia_status_t st, const std::string& why) {
      Frame f = base;
      f.kind = kRefuse;
      f.flag = st;
      send_frame(fd.get(), f,
                 std::span(reinterpret_cast<const std::uint8_t*>(why.data()), why.size()),
                 std::min(deadline, Clock::now() + std::chrono::milliseconds(200)));
      fd.reset();
    };
    // Counted failed while heard: refused with the decision, unless an
    // adopted decision says otherwise.
    auto count_failed = [&](int r, const std::string& why) {
      if (failed[r]) return;
      failed[r] = 1;
      log::info("comm", "rank {}: {}: rank {} counted as failed: {}", me, op_name(op), r, why);
    };
    auto take_hello = [&](bs::Fd fd, int from, std::uint32_t from_op, std::int32_t from_flag,
                          const std::vector<std::uint8_t>& payload) {
      if (from < 0 || from >= p || from == me || heard[from]) return;
      if (from_op != op) {
        refuse(fd, WIA_ERROR_MISMATCH,
               fmt::format("rank {} called {} (#{} on this communicator) but the coordinator, "
                           "rank {}, {} (#{})",
                           from, op_name(from_op), epoch, me, op_name(op), epoch));
        return;
      }
      if (failed[from]) {
        refuse(fd, WIA_ERROR_REMOTE,
               fmt::format("rank {}: {}: the survivors count this rank as failed (it was "
                           "reported failed, or joined too late)",
                           from, op_name(op)));
        return;
      }
      heard[from] = 1;
      flags[from] = from_flag;
      conn[from] = std::move(fd);
      for (int f : parse_ranks(payload, p))
        if (f != me) count_failed(f, fmt::format("rank {} knows it failed", from));
    };
    struct Released {  // the listener goes back to the heartbeat thread, whatever happens
      Recovery& rc;
      ~Released() {
        std::lock_guard<std::mutex> g(rc.answer_mu);
        rc.coordinating = false;
      }
    } released{rc};
    {
      // From here the listener is this thread's: what the heartbeat thread
      // accepted or read before comes along.
      std::lock_guard<std::mutex> g(rc.answer_mu);
      rc.coordinating = true;
      for (Recovery::Arrival& a : rc.arrivals) pending.push_back({std::move(a.fd), a.since});
      rc.arrivals.clear();
      for (std::size_t i = 0; i < rc.early.size();) {
        Recovery::EarlyHello& e = rc.early[i];
        if (e.epoch != epoch) {
          ++i;
          continue;
        }
        take_hello(std::move(e.fd), e.rank, e.op, e.flag, e.payload);
        rc.early.erase(rc.early.begin() + static_cast<std::ptrdiff_t>(i));
      }
    }
    auto next_probe = Clock::now() + std::chrono::milliseconds(100);
    for (;;) {
      std::vector<int> awaited;
      for (int r = 0; r < p; ++r)
        if (r != me && !failed[r] && !heard[r]) awaited.push_back(r);
      if (awaited.empty()) break;
      const auto now = Clock::now();
      if (now >= deadline) {
        for (int r : awaited)
          count_failed(r, fmt::format("it did not join within {} ms (collectives.timeout_ms)",
                                      timeout.count()));
        break;
      }
      std::vector<pollfd> pfds;
      pfds.push_back({rc.listener.get(), POLLIN, 0});
      for (const Pending& q : pending) pfds.push_back({q.fd.get(), POLLIN, 0});
      for (const Query& q : queries) pfds.push_back({q.fd.get(), POLLIN, 0});
      ::poll(pfds.data(), pfds.size(), std::min(50, bs::ms_until(deadline)));
      const std::size_t before = pending.size();
      // A rank asked holds the decision: a coordinator before this one
      // decided and died before telling everyone. Its decision stands.
      for (std::size_t i = queries.size(); i-- > 0;) {
        const bool ready = pfds[1 + before + i].revents != 0;
        if (!ready && Clock::now() - queries[i].since < std::chrono::seconds(1)) continue;
        Query q = std::move(queries[i]);
        queries.erase(queries.begin() + static_cast<std::ptrdiff_t>(i));
        if (!ready) continue;
        Frame d;
        std::vector<std::uint8_t> payload;
        if (recv_frame(q.fd.get(), rc.token, d, payload,
                       std::min(deadline, Clock::now() + std::chrono::milliseconds(200))) !=
                bs::IoResult::kOk ||
            d.kind != kDecision || d.epoch != epoch || d.op != op || adopted)
          continue;
        adopted = RecoveryDesk::Decided{epoch, op, d.flag, std::move(payload)};
        log::info("comm",
                  "rank {}: {} #{}: rank {} holds the decision of an earlier coordinator; it "
                  "stands",
                  me, op_name(op), epoch, q.rank);
      }
      if (adopted) {
        // Connections accepted and not read yet are hellos of this
        // agreement (or queries): finish() answers them from the decision,
        // rather than closing them on ranks that would count this one
        // failed.
        std::lock_guard<std::mutex> g(rc.answer_mu);
        for (Pending& q : pending) rc.arrivals.push_back({std::move(q.fd), q.since});
        break;
      }
      for (;;) {
        const int c = ::accept4(rc.listener.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (c < 0) break;
        pending.push_back({bs::Fd(c), Clock::now()});
      }
      for (std::size_t i = before; i-- > 0;) {
        Pending& q = pending[i];
        const bool ready = pfds[i + 1].revents != 0;
        if (!ready && Clock::now() - q.since < std::chrono::seconds(2)) continue;
        bs::Fd fd = std::move(q.fd);
        pending.erase(pending.begin() + static_cast<std::ptrdiff_t>(i));
        if (!ready) continue;  // connected, never spoke: not a participant
        Frame h;
        std::vector<std::uint8_t> payload;
        const bs::IoResult r =
            recv_frame(fd.get(), rc.token, h, payload,
                       std::min(deadline, Clock::now() + std::chrono::milliseconds(1000)));
        if (r != bs::IoResult::kOk || (h.kind != kHello && h.kind != kQuery)) continue;
        if (h.kind == kQuery || h.epoch < epoch) {
          // Another coordinator asks (none decided here yet), or a late
          // participant of an earlier agreement.
          std::lock_guard<std::mutex> g(rc.answer_mu);
          if (!RecoveryDesk::answer(rc, fd.get(), me, h.kind, h.epoch, h.op, h.rank))
            refuse(fd, WIA_ERROR_MISMATCH,
                   fmt::format("rank {} called {} (#{} on this communicator) but the "
                               "coordinator, rank {}, {} (#{})",
                               h.rank, op_name(h.op), h.epoch, me, op_name(op), epoch));
          continue;
        }
        if (h.epoch > epoch) {
          // A rank already in the next agreement (this one's decision
          // reached it from the coordinator that died): kept for this
          // rank's next call.
          std::lock_guard<std::mutex> g(rc.answer_mu);
          if (rc.early.size() >= kMaxEarlyHellos) rc.early.erase(rc.early.begin());
          rc.early.push_back(
              {std::move(fd), h.epoch, h.op, h.rank, h.flag, std::move(payload), Clock::now()});
          continue;
        }
        take_hello(std::move(fd), h.rank, h.op, h.flag, payload);
      }
      // Ask the ranks still awaited: one whose listener refuses is dead
      // (no need to wait the timeout for it; a cut-off host still costs
      // it), one that holds this agreement's decision gives it.
      if (Clock::now() >= next_probe) {
        for (int r : awaited) {
          if (failed[r] || heard[r]) continue;
          if (std::any_of(queries.begin(), queries.end(),
                          [r](const Query& q) { return q.rank == r; }))
            continue;
          int err = 0;
          bs::Fd probe = bs::connect_before(
              rc.address[r], std::min(deadline, Clock::now() + std::chrono::milliseconds(100)),
              &err);
          if (!probe.valid()) {
            if (err == ECONNREFUSED)
              count_failed(r, "its recovery listener refuses connections: the process is gone");
            continue;
          }
          Frame q = base;
          q.kind = kQuery;
          if (send_frame(probe.get(), q, {}, Clock::now() + std::chrono::milliseconds(100)) ==
              bs::IoResult::kOk)
            queries.push_back({std::move(probe), r, Clock::now()});
        }
        next_probe = Clock::now() + std::chrono::milliseconds(250);
      }
    }
    Agreement a;
    std::vector<std::uint8_t> list;
    if (adopted) {
      a.flag = adopted->flag;
      list = adopted->failed;
      a.failed = parse_ranks(list, p);
    } else {
      a.flag = flag;
      for (int r = 0; r < p; ++r) {
        if (heard[r] && !failed[r]) a.flag &= flags[r];
        if (failed[r]) a.failed.push_back(r);
      }
      list = rank_list(failed);
    }
    auto in_decision = [&](int r) {
      return std::binary_search(a.failed.begin(), a.failed.end(), r);
    };
    Frame d = base;
    d.kind = kDecision;
    d.flag = a.flag;
    if (const char* only = std::getenv("WIA_TEST_AGREE_EXIT_AFTER_SENDING_TO"))
      exit_after_sending_to(only, conn, d, list, deadline);
    for (int r = 0; r < p; ++r) {
      if (!heard[r]) continue;
      if (in_decision(r)) {
        refuse(conn[r], WIA_ERROR_REMOTE,
               fmt::format("rank {}: {}: the survivors count this rank as failed", r,
                           op_name(op)));
        continue;
      }
      if (send_frame(conn[r].get(), d, list, deadline) != bs::IoResult::kOk)
        log::warn("comm", "rank {}: {}: could not send the decision to rank {}", me, op_name(op),
                  r);
    }
    std::vector<bs::Fd> fds;
    if (session)
      for (int r = 0; r < p; ++r)
        if (!in_decision(r)) fds.push_back(std::move(conn[r]));  // by new rank; this rank's unused
    log::info("comm", "rank {}: {} #{}: failed ranks {}, flag {:#x}", me, op_name(op), epoch,
              join_ranks(a.failed), static_cast<std::uint32_t>(a.flag));
    return finish(std::move(a), std::move(fds));
  }
}

// A survivor that dies during the shrink makes every other's set-up fail:
// a set-up exchange goes through the coordinator, which gives nobody the
// records of a round it could not complete. So all of them agree again,
// which counts the newly dead, and build again: the application sees one
// shrink. Bounded: each retry after the first needs a newly failed rank.
// (The first attempt may fail with nobody new counted: a coordinator that
// died while telling the decision, which named it alive.)
std::unique_ptr<ProcessCommunicator> ProcessCommunicator::shrink(std::vector<int>* failed) {
  std::optional<std::vector<int>> known;
  for (;;) {
    std::unique_ptr<RecoveryExchange> ex;
    Agreement a = run_agreement(kShrink, 1, &ex);
    if (failed) *failed = a.failed;
    try {
      return shrink_to(*ex);
    } catch (const Error& e) {
      const bool a_death = e.status() == WIA_ERROR_REMOTE || e.status() == WIA_ERROR_TIMEOUT;
      if (!a_death || (known && a.failed == *known)) throw;
      known = a.failed;
      log::warn("comm", "rank {}: wia_comm_shrink: the new communicator's set-up failed ({}); "
                "agreeing on the survivors again",
                layout_.rank, e.what());
    }
  }
}

std::unique_ptr<ProcessCommunicator> ProcessCommunicator::shrink_to(RecoveryExchange& ex) {
  // Survivors in old-rank order; nodes numbered by first appearance, local
  // ranks recounted (as split does).
  ProcessLayout l;
  l.size = static_cast<int>(ex.members.size());
  l.rank = ex.me;
  std::vector<int> node_index(static_cast<std::size_t>(layout_.nnodes), -1);
  std::vector<int> next_local(static_cast<std::size_t>(layout_.nnodes), 0);
  int nodes = 0;
  for (int r : ex.members) {
    const int node = layout_.node_of_rank[r];
    if (node_index[node] < 0) node_index[node] = nodes++;
    l.node_of_rank.push_back(node_index[node]);
    l.local_rank_of_rank.push_back(next_local[node]++);
    if (!layout_.host_of_rank.empty()) l.host_of_rank.push_back(layout_.host_of_rank[r]);
    l.origin_of_rank.push_back(origin_rank(r));
  }
  l.nnodes = nodes;
  l.origin_size = origin_size();
  const auto t0 = Clock::now();
  auto child = std::make_unique<ProcessCommunicator>(
      l, ex, device_, std::chrono::milliseconds(default_timeout_ms_), std::string());
  log::info("comm",
            "rank {}: wia_comm_shrink: rank {} of {} in the new communicator ({} ms of "
            "set-up)",
            layout_.rank, l.rank, l.size,
            std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0).count());
  return child;
}

}  // namespace wia::comm
