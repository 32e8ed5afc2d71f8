// SPDX-License-Identifier: Apache-2.0
// The process communicator's control channel (messages outside any
// collective: abort, "where are you?", its reply, goodbye) and its
// failure path: breaking the communicator tells every peer why.
#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <utility>

#include "comm/process_internal.hpp"
#include "common/error.hpp"
#include "common/log.hpp"
#include "provider/registry.hpp"
#include "provider/transport_call.hpp"

namespace wia::comm {

// The control channel: one receive always posted per peer, for messages
// that are not part of any collective.
//   abort  a peer failed; its reason follows the header
//   query  "where are you?" from a peer whose collective timed out
//   reply  the answer: the collective being run, and how many completed
//   bye    the peer destroyed the communicator after finishing its work:
//          its connection closing next is not a failure
//   heartbeat  nothing but "I am alive" (collectives.heartbeat_ms)
namespace {
constexpr std::uint32_t kControlMagic = 0x57494158;  // "WIAX"
enum ControlType : std::uint32_t { kAbort = 1, kQuery = 2, kReply = 3, kBye = 4, kHeartbeat = 5 };
// Control messages taken from one peer per poll (poll_once).
constexpr int kMessagesPerPoll = 64;
// A reply's `running` when the rank runs no operation at all.
constexpr std::int64_t kIdle = -2;
// An abort message's `running` when it comes from wia_comm_revoke (on the
// sender or, before it, on a peer of the sender).
constexpr std::int64_t kRevoked = -3;

// A process that calls exit() with communicators alive runs the static
// destructors (the transport providers' among them) while heartbeat
// threads still tick: from exit on, ticks do nothing, and exit waits
// (bounded) for the ones under way.
std::atomic<bool> g_exiting{false};
std::atomic<int> g_ticking{0};
void stop_ticks_at_exit() {
  g_exiting.store(true);
  for (int i = 0; i < 1000 && g_ticking.load() > 0; ++i) sleep_us(1000);
}
}  // namespace

std::string ProcessCommunicator::Control::poll() {
  if (c_.abort_requested_.load(std::memory_order_relaxed))
    return fmt::format("wia_comm_abort was called on rank {}", c_.layout_.rank);
  if (c_.revoke_requested_.load(std::memory_order_relaxed))
    return fmt::format("wia_comm_revoke was called on rank {}", c_.layout_.rank);
  // A failure is reported to every poll after the one that found it: the
  // heartbeat thread may have read a peer's abort message that the next
  // operation must fail with.
  if (!c_.control_failure_.empty()) return c_.control_failure_;
  std::string reason = poll_once();
  if (reason.empty() && c_.heartbeat_ms_) reason = heartbeat();
  if (!reason.empty()) c_.control_failure_ = reason;
  return reason;
}

std::string ProcessCommunicator::Control::heartbeat() {
  // Each rank sends heartbeats to its two ring neighbours and watches
  // them: 2 messages per rank and period whatever the size (all-to-all
  // would be p - 1), and every rank is watched by two others. The rank
  // that notices a silent neighbour breaks the communicator, which tells
  // every other rank at once (the abort message names the failed rank).
  const int p = c_.layout_.size, me = c_.layout_.rank;
  if (p < 2) return {};
  const auto now = Clock::now();
  const auto period = std::chrono::milliseconds(c_.heartbeat_ms_);
  const auto limit = std::chrono::milliseconds(c_.heartbeat_timeout_ms_);
  for (const int q : {(me + p - 1) % p, (me + 1) % p}) {
    Peer& peer = c_.peers_[static_cast<std::size_t>(q)];
    // A peer that said goodbye is gone on purpose.
    if (!peer.link.conn || peer.said_bye) continue;
    if (!peer.watched) {
      peer.watched = true;
      peer.last_heard = now;
    }
    if (now - peer.last_beat >= period) {
      ControlHeader h;
      h.type = kHeartbeat;
      send(peer, h);  // skipped while the last message is in flight: that one says as much
      peer.last_beat = now;
    }
    const auto silent =
        std::chrono::duration_cast<std::chrono::milliseconds>(now - peer.last_heard);
    if (silent > limit) {
      c_.note_failed(q);
      return fmt::format(
          "rank {} failed: no heartbeat for {} ms (collectives.heartbeat_timeout_ms {}, link "
          "over {}): it died, hangs, or is unreachable",
          q, silent.count(), c_.heartbeat_timeout_ms_, peer.transport);
    }
  }
  return {};
}

std::string ProcessCommunicator::Control::poll_once() {
  for (std::size_t q = 0; q < c_.peers_.size(); ++q) {
    Peer& p = c_.peers_[q];
    progress_send(p);
    // Every message of the peer that has arrived, not only the first: a
    // peer that fails sends its abort right behind whatever control
    // message it sent last (a heartbeat, say) and closes. The transport
    // keeps the abort as unexpected until this receive is posted again,
    // and fails everything else at the close; a caller that polls once
    // after its own request met that close (with_peer_reason) must find
    // the abort in that poll, or it reports the closed connection instead
    // of the peer's reason (p2p_send's "mismatched sizes" over tcp, seen
    // on a loaded machine). Bounded: a chatty peer cannot hold us here.
    for (int taken = 0; p.control_req && taken < kMessagesPerPoll; ++taken) {
      std::int32_t done = 0;
      std::uint64_t size = 0;
      try {
        transport_call(*p.link.provider, "test(control)",
                       [&](const wia_transport_ops_v1_t& t, void* ctx) {
                         return t.test(ctx, p.control_req, &done, &size);
                       });
      } catch (const Error& e) {
        p.control_req = nullptr;
        if (p.said_bye) break;  // it left cleanly; its data was delivered before
        c_.note_failed(static_cast<int>(q));
        return fmt::format("lost the connection to rank {} ({}): {}", q, p.transport, e.what());
      }
      if (!done) break;
      p.control_req = nullptr;
      if (c_.heartbeat_ms_) p.last_heard = Clock::now();  // any message says it is alive
      ControlHeader h;
      if (size < sizeof(h))
        return fmt::format("rank {} sent a truncated control message ({} B)", q, size);
      std::memcpy(&h, p.control_buf.data(), sizeof(h));
      if (h.magic != kControlMagic) return fmt::format("rank {} sent a corrupt control message", q);
      if (h.type == kAbort) {
        // The header's `seq` carries how many failed ranks the aborting
        // peer knew of; they follow it, then its reason.
        std::size_t at = sizeof(h);
        for (std::uint64_t i = 0; i < h.seq && at + 4 <= size; ++i, at += 4) {
          std::int32_t r;
          std::memcpy(&r, p.control_buf.data() + at, 4);
          c_.note_failed(r);
        }
        c_.control_failure_told_ = true;
        if (h.running == kRevoked) c_.revoked_.store(true);
        p.said_abort = true;
        return fmt::format("rank {} aborted the communicator: {}", q,
                           std::string(p.control_buf.data() + at, size - at));
      }
      if (h.type == kBye) {
        p.said_bye = true;  // no receive is posted again
        break;
      }
      if (h.type == kQuery) {
        ControlHeader r;
        r.type = kReply;
        r.seq = h.seq;
        r.completed = c_.collectives_done_.load();
        r.running = c_.running_.load();
        // Answered by the heartbeat thread with no operation running or
        // pending (a send or receive handed to a stream is not idle): this
        // rank is not inside any operation (what no answer meant before
        // there were heartbeats).
        if (idle_ && r.running < 0 && c_.next_seq_.load() == c_.executed_.load())
          r.running = kIdle;
        send(p, r);
      } else if (h.type == kReply) {
        p.reply = h;
        p.has_reply = true;
      }
      try {
        c_.post_control_recv(p);
      } catch (const Error& e) {  // the connection failed under it
        c_.note_failed(static_cast<int>(q));
        return fmt::format("lost the connection to rank {} ({}): {}", q, p.transport, e.what());
      }
    }
  }
  return {};
}

void ProcessCommunicator::Control::goodbye(std::chrono::milliseconds bound) {
  ControlHeader h;
  h.type = kBye;
  for (Peer& p : c_.peers_)
    if (p.link.conn) send(p, h);
  const auto until = Clock::now() + bound;
  for (;;) {
    poll_once();  // failures no longer matter here
    bool all = true;
    for (const Peer& p : c_.peers_) all &= !p.link.conn || p.said_bye || !p.control_req;
    for (Peer& p : c_.peers_) progress_send(p);
    bool sent = true;
    for (const Peer& p : c_.peers_) sent &= !p.send_req;
    if ((all && sent) || Clock::now() > until) return;
    sleep_us(200);
  }
}

std::string ProcessCommunicator::Control::diagnose(std::uint64_t seq) {
  for (Peer& p : c_.peers_) {
    if (!p.link.conn) continue;
    p.has_reply = false;
    ControlHeader q;
    q.type = kQuery;
    q.seq = seq;
    send(p, q);
  }
  // Peers inside a collective answer within their next poll, idle ones
  // from their heartbeat thread (kIdle) within a tick; without heartbeats
  // the others (stuck elsewhere, or busy before calling) do not answer.
  const auto until = Clock::now() + std::chrono::milliseconds(300);
  // A peer's abort (it timed out too, and told us first) does not end the
  // wait for the others' answers, and that peer is alive: not absent.
  while (Clock::now() < until) {
    const std::string reason = poll_once();
    if (!reason.empty() && c_.control_failure_.empty()) c_.control_failure_ = reason;
    bool all = true;
    for (const Peer& p : c_.peers_)
      all &= !p.link.conn || p.has_reply || p.said_abort || !p.control_req;
    if (all) break;
    sleep_us(200);
  }
  std::string absent, idle, behind, inside;
  auto add = [](std::string& list, const std::string& item) {
    list += (list.empty() ? "" : ", ") + item;
  };
  for (std::size_t q = 0; q < c_.peers_.size(); ++q) {
    const Peer& p = c_.peers_[q];
    if (!p.link.conn) continue;
    if (p.said_abort) continue;  // alive; its reason is the communicator's error
    if (!p.has_reply) {
      add(absent, std::to_string(q));
      c_.note_failed(static_cast<int>(q));  // no answer within the timeout
    } else if (p.reply.running == kIdle && p.reply.completed <= seq) {
      add(idle, std::to_string(q));
      c_.note_failed(static_cast<int>(q));  // alive, but elsewhere
    } else if (p.reply.running == static_cast<std::int64_t>(seq))
      add(inside, std::to_string(q));
    else if (p.reply.completed <= seq)
      add(behind, fmt::format("{} (completed {} collective(s){})", q, p.reply.completed,
                              p.reply.running >= 0 ? fmt::format(", running #{}", p.reply.running)
                                                   : std::string()));
  }
  std::string out;
  // A rank behind a cut link (or a dead host) does not answer either: the
  // message must not send the reader looking only for a stuck process.
  if (!absent.empty())
    out += fmt::format(
        "rank(s) {} have not reached collective #{} (no answer within 300 ms: not inside any "
        "collective of this communicator, or unreachable)",
        absent, seq);
  if (!idle.empty())
    out += fmt::format(
        "{}rank(s) {} have not reached collective #{} (their heartbeat thread answered: alive, "
        "but not inside any operation of this communicator)",
        out.empty() ? "" : "; ", idle, seq);
  if (!behind.empty())
    out += fmt::format("{}rank(s) {} have not reached it", out.empty() ? "" : "; ", behind);
  if (!inside.empty())
    out += fmt::format("{}rank(s) {} are inside it", out.empty() ? "" : "; ", inside);
  return out;
}

// At most one control message in flight per peer; a newer one waits for
// the previous (they are tiny, so this rarely happens).
void ProcessCommunicator::Control::progress_send(Peer& p) {
  if (!p.send_req || !p.link.conn) return;
  std::int32_t done = 0;
  std::uint64_t size = 0;
  const auto* t = p.link.provider->transport();
  if (t->test(p.link.provider->ctx(), p.send_req, &done, &size) < 0 || done) p.send_req = nullptr;
}

void ProcessCommunicator::Control::send(Peer& p, const ControlHeader& h) {
  progress_send(p);
  // A query, reply or goodbye must not be lost behind a heartbeat still in
  // flight: give that one up to 10 ms.
  for (int i = 0; h.type != kHeartbeat && p.send_req && i < 100; ++i) {
    sleep_us(100);
    progress_send(p);
  }
  if (p.send_req || !p.link.conn) return;
  p.send_buf.assign(reinterpret_cast<const char*>(&h),
                    reinterpret_cast<const char*>(&h) + sizeof(h));
  const auto* t = p.link.provider->transport();
  if (t->isend(p.link.provider->ctx(), p.link.conn, p.send_buf.data(), p.send_buf.size(),
               engine::kControlTag, nullptr, &p.send_req) != WIA_SUCCESS)
    p.send_req = nullptr;
}

void ProcessCommunicator::post_control_recv(Peer& peer) {
  peer.control_buf.assign(1024, 0);
  transport_call(
      *peer.link.provider, "irecv(control)", [&](const wia_transport_ops_v1_t& t, void* ctx) {
        return t.irecv(ctx, peer.link.conn, peer.control_buf.data(), peer.control_buf.size(),
                       engine::kControlTag, nullptr, &peer.control_req);
      });
}

void ProcessCommunicator::break_communicator(wia_status_t status, const std::string& reason) {
  status = unless_aborted(status);
  const auto wire = wire_lock();  // closes the connections the heartbeat thread polls
  {
    std::lock_guard<std::mutex> lock(err_mu_);
    // error_message_ is set only here: not empty = breaking or broken.
    if (broken_.load() || !error_message_.empty()) return;
    error_message_ = reason.empty() ? std::string("unknown failure") : reason;
  }
  log::error("comm", "rank {}: {}", layout_.rank, reason);
  if (flight_.on() && !flight_dir_.empty()) {
    FlightRecorder::Context ctx;
    ctx.comm_index = comm_index_;
    ctx.rank = layout_.rank;
    ctx.nranks = layout_.size;
    ctx.host = layout_.host_of_rank.empty() ? "" : layout_.host_of_rank[layout_.rank];
    ctx.status = status;
    ctx.reason = reason;
    ctx.posted = next_seq_.load();
    ctx.completed = executed_.load();
    ctx.collectives_posted = collectives_posted_.load();
    const std::string path = flight_.dump(flight_dir_, ctx);
    if (!path.empty()) log::error("comm", "rank {}: flight recorder written to {}", layout_.rank, path);
  }
  // Tell every peer why, briefly: a peer that is gone must not delay us.
  std::vector<int> failed = failed_ranks();
  // The message fits one control buffer (1024 B): the first ranks, then the reason.
  failed.resize(std::min<std::size_t>(failed.size(), (1024 - sizeof(ControlHeader)) / 8));
  ControlHeader h;
  h.type = kAbort;
  h.seq = failed.size();
  if (revoked_.load()) h.running = kRevoked;
  std::string text(reinterpret_cast<const char*>(&h), sizeof(h));
  for (int r : failed) text.append(reinterpret_cast<const char*>(&r), 4);
  text += fmt::format("rank {}: {}", layout_.rank, reason).substr(0, 1024 - text.size());
  std::vector<std::pair<Peer*, wia_request_t>> sent;
  // Fault injection for tests (p2p_send_test.cpp): N heartbeats right
  // before the abort, so that the abort reaches every peer behind other
  // control messages, as it does when this rank's last poll sent one.
  ControlHeader beat;
  beat.type = kHeartbeat;
  const char* beats_env = std::getenv("WIA_TEST_HEARTBEATS_BEFORE_ABORT");
  const int beats = beats_env ? std::clamp(std::atoi(beats_env), 0, 16) : 0;
  for (Peer& peer : peers_) {
    if (!peer.link.conn) continue;
    wia_request_t r = nullptr;
    const auto* t = peer.link.provider->transport();
    for (int i = 0; i < beats; ++i) {
      if (t->isend(peer.link.provider->ctx(), peer.link.conn, &beat, sizeof(beat),
                   engine::kControlTag, nullptr, &r) == WIA_SUCCESS &&
          r)
        sent.emplace_back(&peer, r);
      r = nullptr;
    }
    if (t->isend(peer.link.provider->ctx(), peer.link.conn, text.data(), text.size(),
                 engine::kControlTag, nullptr, &r) == WIA_SUCCESS &&
        r)
      sent.emplace_back(&peer, r);
  }
  const auto until = Clock::now() + std::chrono::milliseconds(200);
  while (!sent.empty() && Clock::now() < until) {
    for (auto it = sent.begin(); it != sent.end();) {
      std::int32_t done = 0;
      std::uint64_t size = 0;
      const auto* t = it->first->link.provider->transport();
      const wia_status_t st = t->test(it->first->link.provider->ctx(), it->second, &done, &size);
      if (st < 0 || done)
        it = sent.erase(it);
      else
        ++it;
    }
    if (!sent.empty()) sleep_us(100);
  }
  close_all();
  // Published only now that the connections are closed: a caller told the
  // communicator is broken (a failed post, wia_comm_get_async_error) may
  // exit() at once, and exit's static destructors fini the transport
  // providers. Published before close_all, a wia-bench rank that died on a
  // failed post after a cut link crashed in libfabric (ofi's fini closing
  // the endpoint while this thread was still in fi_cancel of its close).
  std::lock_guard<std::mutex> lock(err_mu_);
  error_ = status;
  broken_.store(true);
}

void ProcessCommunicator::start_heartbeat() {
  if (heartbeat_ms_ == 0) return;
  static std::once_flag at_exit;
  std::call_once(at_exit, [] { std::atexit(stop_ticks_at_exit); });
  heartbeat_ = std::make_unique<Heartbeat>();
  // Ticks of a fifth of the period (5..100 ms): a heartbeat goes out
  // within a tick of being due, and a silent peer is named within a tick
  // of heartbeat_timeout_ms.
  const auto tick = std::chrono::milliseconds(std::clamp<std::uint32_t>(heartbeat_ms_ / 5, 5, 100));
  Heartbeat& hb = *heartbeat_;
  hb.thread = std::thread([this, &hb, tick] {
    std::unique_lock<std::mutex> lock(hb.mu);
    while (!hb.cv.wait_for(lock, tick, [&] { return hb.stop; })) {
      lock.unlock();
      heartbeat_tick();
      lock.lock();
    }
  });
}

void ProcessCommunicator::stop_heartbeat() noexcept {
  if (!heartbeat_) return;
  {
    std::lock_guard<std::mutex> lock(heartbeat_->mu);
    heartbeat_->stop = true;
  }
  heartbeat_->cv.notify_all();
  if (heartbeat_->thread.joinable()) heartbeat_->thread.join();
  heartbeat_.reset();
}

void ProcessCommunicator::heartbeat_tick() {
  g_ticking.fetch_add(1);
  struct Ticked {
    ~Ticked() { g_ticking.fetch_sub(1); }
  } ticked;
  if (g_exiting.load()) return;
  // Broken or not: agreements run on broken communicators.
  answer_recovery();
  if (broken_.load() || abort_requested_.load()) return;  // the failure path has it
  std::unique_lock<std::recursive_mutex> wire(wire_mu_, std::try_to_lock);
  // An operation uses the connections: its own polls send the heartbeats
  // and watch the neighbours meanwhile.
  if (!wire.owns_lock() || broken_.load()) return;
  std::string reason;
  try {
    Control control(*this);
    control.idle_ = true;
    reason = control.poll();
  } catch (const std::exception& e) {  // re-posting a control receive failed
    reason = fmt::format("the control channel failed: {}", e.what());
    control_failure_ = reason;
  }
  // A peer's abort message: that peer told every rank, and the failed
  // ranks it named are listed. The communicator breaks at this rank's
  // next operation, as without heartbeats (its flight recorder dump then
  // shows that operation).
  // A peer's revoke breaks it now: wia_detect_device_failure and
  // wia_comm_get_async_error say so on an idle rank too.
  if (reason.empty() || (control_failure_told_ && !revoked_.load())) return;
  // Found here (a silent neighbour, a lost connection): break the
  // communicator now, so that every other rank hears of it, if no
  // operation of this rank is pending: claim the next turn as a posting
  // thread does. Otherwise the pending operation meets the failure at its
  // next poll and breaks it.
  std::uint64_t seq = executed_.load(std::memory_order_acquire);
  if (!next_seq_.compare_exchange_strong(seq, seq + 1)) return;
  break_communicator(WIA_ERROR_REMOTE, reason);
  executed_.store(seq + 1, std::memory_order_release);
  order_signal_.notify();
}

}  // namespace wia::comm
