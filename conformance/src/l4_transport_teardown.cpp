// SPDX-License-Identifier: Apache-2.0
// Level 4, endings: close() with requests pending and with sends just done
// (L4.close.*), and a peer that exits or is killed (L4.peer.*).
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <vector>

#include "l4_transport.hpp"

namespace wia::conformance::l4 {

// --- L4.close.pending -------------------------------------------------------------------------

void close_pending(Context& c) {
  run_pair(c, [](Side& s) {
    wia_conn_t conn = s.connect_pair(1);
    if (s.role == 0) {
      std::vector<Buffer*> bufs;
      for (int t = 1; t <= 4; ++t) {
        Buffer& in = s.buffer(1ull << 20);
        bufs.push_back(&in);
        s.irecv(conn, in, 0, in.size, t);
      }
      Buffer& big = s.buffer(16ull << 20);
      fill_pattern(big.data, big.size, 5);
      bufs.push_back(&big);
      s.isend(conn, big, 0, big.size, 50);  // never received
      s.barrier("posted");
      s.close_conn(conn);
      // After close the provider must not touch those buffers: unmapped,
      // any access is a crash.
      for (Buffer* b : bufs) s.unmap(*b);
      s.barrier("closed");
    } else {
      Buffer& in = s.buffer(1ull << 20);
      Request* r = s.irecv(conn, in, 0, in.size, 9);
      Buffer& out = s.buffer(4ull << 20);
      Request* w = s.isend(conn, out, 0, out.size, 11);
      s.barrier("posted");
      s.barrier("closed");
      s.c.step("connector: waiting for the pending irecv to fail after the listener's close");
      const wia_status_t st = s.wait(r);
      s.c.expect(
          st < 0,
          "a receive pending when the other side closed the connection to fail "
          "(WIA_ERROR_REMOTE)",
          st == WIA_IN_PROGRESS ? "still pending at the end of the test's time" : status_text(st));
      s.c.step("connector: waiting for the pending isend to end");
      s.c.expect(s.wait(w) != WIA_IN_PROGRESS,
                 "a send pending when the other side closed to end (done or failed)",
                 "still pending at the end of the test's time");
      s.close_conn(conn, false);
    }
    // The provider is still usable: a fresh connection carries a message.
    wia_conn_t again = s.connect_pair(2);
    Buffer& in = s.buffer(4096);
    std::memset(in.data, kUntouched, in.size);
    Buffer& out = s.buffer(4000);
    fill_pattern(out.data, 4000, 90 + s.role);
    Request* r = s.irecv(again, in, 0, 4096, 5);
    Request* w = s.isend(again, out, 0, 4000, 5);
    s.wait_all_ok({w, r});
    check_message(s, r, in, 0, 4000, 4096, 90 + (1 - s.role));
    s.barrier("done");
  });
}

// --- L4.close.delivers ------------------------------------------------------------------

// A connection is reliable: a send reported done is delivered even when
// its side closes the connection right after.
void close_delivers(Context& c) {
  const std::uint64_t sizes[] = {100, 64 * 1024, 4ull << 20};
  run_pair(c, [&](Side& s) {
    wia_conn_t conn = s.connect_pair(0xc105e);
    if (s.role == 1) {
      s.barrier("receives posted");
      std::vector<Request*> sends;
      for (std::size_t i = 0; i < 3; ++i) {
        Buffer& out = s.buffer(sizes[i]);
        fill_pattern(out.data, sizes[i], 300 + static_cast<std::uint32_t>(i));
        sends.push_back(s.isend(conn, out, 0, sizes[i], 20 + i));
      }
      s.wait_all_ok(sends);
      s.close_conn(conn);
      return;
    }
    std::vector<Request*> recvs;
    std::vector<Buffer*> bufs;
    for (std::size_t i = 0; i < 3; ++i) {
      Buffer& in = s.buffer(sizes[i]);
      std::memset(in.data, kUntouched, in.size);
      bufs.push_back(&in);
      recvs.push_back(s.irecv(conn, in, 0, sizes[i], 20 + i));
    }
    s.barrier("receives posted");
    // Not waiting for the close: the sends may need this side's progress.
    for (std::size_t i = 0; i < 3; ++i) {
      s.c.step("listener: waiting for " + recvs[i]->what);
      const wia_status_t st = s.wait(recvs[i]);
      s.c.expect(
          st == WIA_SUCCESS,
          recvs[i]->what +
              " of a message whose send was done before the sender closed "
              "the connection to succeed",
          st == WIA_IN_PROGRESS ? "still pending at the end of the test's time" : status_text(st));
      check_message(s, recvs[i], *bufs[i], 0, sizes[i], sizes[i],
                    300 + static_cast<std::uint32_t>(i));
    }
    s.close_conn(conn, false);
  });
}

namespace {

// --- L4.peer.exit / L4.peer.killed ------------------------------------------------------------

enum class Death { kExit, kKilled };

void peer_gone(Context& c, Death how) {
  run_pair(
      c,
      [how](Side& s) {
        wia_conn_t conn = s.connect_pair(0xdead);
        if (s.role == 1) {
          Buffer& in = s.buffer(4096);
          s.irecv(conn, in, 0, in.size, 1);
          s.barrier("posted");
          if (how == Death::kExit) _exit(0);  // no close, no fini
          // Busy inside the provider until the listener kills us.
          for (;;) {
            s.progress();
            usleep(100);
          }
        }
        Buffer& r1 = s.buffer(1ull << 20);
        Buffer& r2 = s.buffer(16);
        Buffer& big = s.buffer(16ull << 20);
        fill_pattern(big.data, big.size, 3);
        std::vector<Request*> recvs = {s.irecv(conn, r1, 0, r1.size, 1),
                                       s.irecv(conn, r2, 0, r2.size, 2)};
        Request* send = s.isend(conn, big, 0, big.size, 3);
        s.barrier("posted");
        const char* gone = how == Death::kExit ? "exited" : "was killed (SIGKILL)";
        if (how == Death::kKilled) {
          usleep(50 * 1000);
          s.c.step("listener: kill(peer, SIGKILL)");
          kill(s.peer_pid, SIGKILL);
        }
        for (Request* r : recvs) {
          s.c.step("listener: waiting for " + r->what + " to fail");
          const wia_status_t st = s.wait(r);
          s.c.expect(st == WIA_ERROR_REMOTE,
                     r->what + " pending when the peer " + gone + " to fail with " +
                         status_text(WIA_ERROR_REMOTE),
                     st == WIA_IN_PROGRESS ? "still pending at the end of the test's time"
                                           : status_text(st));
        }
        s.c.step("listener: waiting for " + send->what + " to end");
        const wia_status_t st = s.wait(send);
        s.c.expect(
            st == WIA_SUCCESS || st == WIA_ERROR_REMOTE,
            send->what + " to the peer that " + gone + " to end (done before, or WIA_ERROR_REMOTE)",
            st == WIA_IN_PROGRESS ? "still pending at the end of the test's time"
                                  : status_text(st));
        // Posting on a connection known to be broken fails too.
        wia_status_t post = WIA_SUCCESS;
        Request* late = s.irecv(conn, r2, 0, r2.size, 4, &post);
        if (late != nullptr) {
          s.c.step("listener: waiting for a receive posted after the peer died");
          post = s.wait(late);
        }
        s.c.expect(post < 0, "a receive posted after the peer " + std::string(gone) + " to fail",
                   post == WIA_IN_PROGRESS ? "still pending at the end of the test's time"
                                           : status_text(post));
        s.close_conn(conn, false);
      },
      PeerEnd::kDies);
}

}  // namespace

void peer_exit(Context& c) { peer_gone(c, Death::kExit); }
void peer_killed(Context& c) { peer_gone(c, Death::kKilled); }

}  // namespace wia::conformance::l4
