// SPDX-License-Identifier: Apache-2.0
// Running a two-process transport test (transport_pair.hpp: run_pair): the
// fork of the peer, the body run on both sides, and the peer's report (its
// verdict, its last step, or how it crashed or hung) merged into the
// test's result. The sides' own tools are in transport_pair.cpp.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "transport_pair.hpp"

namespace wia::conformance {

namespace {

// The peer's record stream: the same "<tag><len>:<text>" records the
// harness reads from a test (P = step, S/F/K = verdict).
struct PeerReport {
  char verdict = 0;
  std::string message, last_step;
  bool reaped = false;
  bool stopped = false;  // killed by the test process, not by its own fault
  int wstatus = 0;

  void parse(std::string* buf) {
    for (;;) {
      const auto colon = buf->find(':');
      if (buf->empty() || colon == std::string::npos) return;
      const std::size_t len = std::strtoull(buf->c_str() + 1, nullptr, 10);
      if (buf->size() < colon + 1 + len) return;
      const char tag = (*buf)[0];
      std::string text = buf->substr(colon + 1, len);
      buf->erase(0, colon + 1 + len);
      if (tag == 'P')
        last_step = std::move(text);
      else {
        verdict = tag;
        message = std::move(text);
      }
    }
  }

  // Reads until the peer's pipe closes and the peer is reaped, or `ms`.
  void collect(int fd, pid_t pid, double ms) {
    const double deadline = monotonic_ms() + ms;
    std::string buf;
    bool eof = false;
    while (!reaped) {
      if (!eof) {
        pollfd pfd{fd, POLLIN, 0};
        const double left = deadline - monotonic_ms();
        if (poll(&pfd, 1, static_cast<int>(std::clamp(left, 0.0, 20.0))) > 0) {
          char chunk[4096];
          const ssize_t n = ::read(fd, chunk, sizeof(chunk));
          if (n > 0)
            buf.append(chunk, static_cast<std::size_t>(n));
          else if (n == 0 || errno != EINTR)
            eof = true;
          parse(&buf);
        }
      }
      if (waitpid(pid, &wstatus, WNOHANG) == pid) reaped = true;
      if (reaped || monotonic_ms() > deadline) break;
      if (eof) usleep(1000);
    }
    // What the peer wrote just before it ended.
    for (;;) {
      pollfd pfd{fd, POLLIN, 0};
      if (eof || poll(&pfd, 1, 0) <= 0) break;
      char chunk[4096];
      const ssize_t n = ::read(fd, chunk, sizeof(chunk));
      if (n <= 0) break;
      buf.append(chunk, static_cast<std::size_t>(n));
    }
    parse(&buf);
  }

  std::string where() const { return last_step.empty() ? "" : " (last step: " + last_step + ")"; }

  // Empty when the peer passed; else what to say about it.
  std::string problem() const {
    if (verdict == 'S') return {};
    if (verdict == 'F') return "in the peer process (connector): " + message;
    if (verdict == 'K') return "the peer process (connector) skipped: " + message;
    if (stopped) return {};
    if (reaped && WIFSIGNALED(wstatus)) {
      const char* abbrev = sigabbrev_np(WTERMSIG(wstatus));
      return std::string("the peer process (connector) crashed: SIG") +
             (abbrev != nullptr ? abbrev : "?") + where();
    }
    if (reaped)
      return "the peer process (connector) exited with status " +
             std::to_string(WEXITSTATUS(wstatus)) + " without a verdict" + where();
    return "the peer process (connector) did not finish in time" + where();
  }
};

}  // namespace

void run_pair(Context& c, const std::function<void(Side&)>& body, PeerEnd end) {
  c.tp_ops();  // skip before forking when there is no transport at all
  int a2b[2], b2a[2], rep[2];
  if (pipe(a2b) != 0 || pipe(b2a) != 0 || pipe(rep) != 0)
    c.fail(std::string("harness: pipe: ") + std::strerror(errno));
  std::fflush(nullptr);
  const pid_t pid = fork();
  if (pid < 0) c.fail(std::string("harness: fork: ") + std::strerror(errno));
  if (pid == 0) {
    close(a2b[1]);
    close(b2a[0]);
    close(rep[0]);
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    // The parent reads this pipe only after its side of the test: a full
    // pipe must not block this process's steps (Context::write_record).
    fcntl(rep[1], F_SETFL, fcntl(rep[1], F_GETFL) | O_NONBLOCK);
    // Never destroyed, as in the harness's own child: the process ends
    // right after the report.
    auto* pc = new Context(c.options(), &c.desc(), rep[1]);
    // Same deadline as the test process: the harness kills both at once.
    pc->set_timeout_ms(c.timeout_ms(), monotonic_ms() + c.ms_left());
    char verdict = 'F';
    std::string message;
    try {
      Side s(*pc, 1, a2b[0], b2a[1], 0);
      body(s);
      // Neither side closes before both are done: a close right after the
      // last send is what L4.close.delivers checks, and only there.
      s.barrier("end of test");
      s.cleanup();
      pc->finish();
      verdict = 'S';
    } catch (const Skip& e) {
      verdict = 'K';
      message = e.what();
    } catch (const Failure& e) {
      message = e.what();
    } catch (const std::exception& e) {
      message = std::string("the test threw: ") + e.what();
    }
    pc->report(verdict, message);
    std::fflush(nullptr);
    _exit(0);
  }
  close(a2b[0]);
  close(b2a[1]);
  close(rep[1]);
  // Cross-memory attach (process_vm_readv/writev) and pidfd_getfd from the
  // peer into this process need ptrace rights, which Yama's scope 1 gives
  // only to ancestors unless allowed explicitly. Harmless without Yama.
  prctl(PR_SET_PTRACER, pid, 0, 0, 0);

  PeerReport peer;
  auto stop_peer = [&] {
    if (!peer.reaped) {
      kill(pid, SIGKILL);
      waitpid(pid, &peer.wstatus, 0);
      peer.reaped = true;
      peer.stopped = true;
    }
  };
  try {
    Side s(c, 0, b2a[0], a2b[1], pid);
    body(s);
    if (end == PeerEnd::kReports) s.barrier("end of test");
    s.cleanup();
  } catch (const Failure& f) {
    // The peer's own failure is often the cause (this side then waited in
    // vain): give it a moment to report, and show both. A peer still
    // waiting for this side is simply stopped.
    peer.collect(rep[0], pid, std::min(300.0, std::max(0.0, c.ms_left() - 200)));
    stop_peer();
    std::string msg = f.what();
    if (end == PeerEnd::kReports && !peer.problem().empty() && peer.verdict != 'K')
      msg += "\n     " + peer.problem();
    throw Failure(msg);
  } catch (...) {
    stop_peer();
    throw;
  }
  if (end == PeerEnd::kDies) {
    stop_peer();
    return;
  }
  c.step("waiting for the peer process's verdict");
  peer.collect(rep[0], pid, std::max(0.0, c.ms_left() - 200));
  const std::string problem = peer.problem();
  stop_peer();
  close(rep[0]);
  close(a2b[1]);
  close(b2a[0]);
  if (!problem.empty()) c.fail(problem);
}

}  // namespace wia::conformance
