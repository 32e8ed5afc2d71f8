// SPDX-License-Identifier: Apache-2.0
// Runs a test body as N real processes (fork) and collects what each one
// reports. Children get their input (e.g. a unique id) through a pipe
// after the fork, so the parent can start a root thread only once no more
// forks follow (fork with running threads is best avoided).
#pragma once

#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <exception>
#include <functional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "bootstrap/hosted_roots.hpp"
#include "bootstrap/socket.hpp"
#include "common/error.hpp"

namespace wia::bootstrap::test {

using Bytes = std::vector<std::uint8_t>;

// Throws in a child when an expectation fails; the text reaches the parent.
inline void expect(bool ok, const std::string& what) {
  if (!ok) throw std::runtime_error("expectation failed: " + what);
}

inline bool contains(std::string_view text, std::string_view part) {
  return text.find(part) != std::string_view::npos;
}

inline std::string error_text(const Error& e) {
  return std::string("ERROR ") + status_name(e.status()) + ": " + e.what();
}

// Body: runs in the child as `rank`, with the parent's input; returns what
// the parent sees ("ok" by convention). A wia::Error becomes
// "ERROR <STATUS>: <message>", any other exception "EXCEPTION: ...".
using RankBody = std::function<std::string(int rank, const Bytes& input)>;

struct RankRun {
  std::vector<std::string> outputs;  // per rank; "KILLED" when it overran
};

inline void write_all_fd(int fd, const void* data, std::size_t n) {
  const auto* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w <= 0) return;
    p += w;
    n -= static_cast<std::size_t>(w);
  }
}

inline bool read_all_fd(int fd, void* data, std::size_t n) {
  auto* p = static_cast<char*>(data);
  while (n > 0) {
    const ssize_t r = ::read(fd, p, n);
    if (r <= 0) return false;
    p += r;
    n -= static_cast<std::size_t>(r);
  }
  return true;
}

// Forks `n` ranks, then calls make_input() (in the parent, after every
// fork) and hands its bytes to each child. Waits up to `limit` for all.
inline RankRun run_ranks(int n, const RankBody& body, const std::function<Bytes()>& make_input = {},
                         std::chrono::seconds limit = std::chrono::seconds(120)) {
  // Roots earlier tests left running in this process would be copied
  // mid-call into the children (a lock held in the allocator or the logger
  // hung a child under the sanitizers): stop them before forking.
  stop_hosted_roots();
  std::vector<pid_t> pids;
  std::vector<int> to_child, from_child;
  for (int rank = 0; rank < n; ++rank) {
    int in[2], out[2];
    if (::pipe2(in, O_CLOEXEC) != 0 || ::pipe2(out, O_CLOEXEC) != 0)
      throw std::runtime_error("pipe");
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::close(in[1]);
      ::close(out[0]);
      std::string result;
      try {
        std::uint32_t len = 0;
        Bytes input;
        if (read_all_fd(in[0], &len, sizeof len)) {
          input.resize(len);
          read_all_fd(in[0], input.data(), len);
        }
        result = body(rank, input);
      } catch (const Error& e) {
        result = error_text(e);
      } catch (const std::exception& e) {
        result = std::string("EXCEPTION: ") + e.what();
      }
      write_all_fd(out[1], result.data(), result.size());
      ::_exit(0);
    }
    ::close(in[0]);
    ::close(out[1]);
    pids.push_back(pid);
    to_child.push_back(in[1]);
    from_child.push_back(out[0]);
  }
  const Bytes input = make_input ? make_input() : Bytes{};
  for (int fd : to_child) {
    const auto len = static_cast<std::uint32_t>(input.size());
    write_all_fd(fd, &len, sizeof len);
    write_all_fd(fd, input.data(), input.size());
    ::close(fd);
  }
  RankRun run;
  run.outputs.resize(static_cast<std::size_t>(n));
  std::vector<bool> done(static_cast<std::size_t>(n), false);
  const auto deadline = std::chrono::steady_clock::now() + limit;
  int remaining = n;
  // Drain outputs while waiting, so no child blocks on a full pipe.
  while (remaining > 0) {
    for (int r = 0; r < n; ++r) {
      char buf[4096];
      pollfd p{from_child[static_cast<std::size_t>(r)], POLLIN, 0};
      while (::poll(&p, 1, 0) > 0) {
        const ssize_t got = ::read(p.fd, buf, sizeof buf);
        if (got <= 0) break;
        run.outputs[static_cast<std::size_t>(r)].append(buf, static_cast<std::size_t>(got));
      }
      if (done[static_cast<std::size_t>(r)]) continue;
      int status = 0;
      if (::waitpid(pids[static_cast<std::size_t>(r)], &status, WNOHANG) ==
          pids[static_cast<std::size_t>(r)]) {
        done[static_cast<std::size_t>(r)] = true;
        --remaining;
      }
    }
    if (remaining == 0) break;
    if (std::chrono::steady_clock::now() > deadline) {
      for (int r = 0; r < n; ++r) {
        if (done[static_cast<std::size_t>(r)]) continue;
        ::kill(pids[static_cast<std::size_t>(r)], SIGKILL);  // a child this function started
        ::waitpid(pids[static_cast<std::size_t>(r)], nullptr, 0);
        run.outputs[static_cast<std::size_t>(r)] += " KILLED (overran the test limit)";
      }
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  for (int r = 0; r < n; ++r) {
    char buf[4096];
    ssize_t got;
    while ((got = ::read(from_child[static_cast<std::size_t>(r)], buf, sizeof buf)) > 0) {
      run.outputs[static_cast<std::size_t>(r)].append(buf, static_cast<std::size_t>(got));
    }
    ::close(from_child[static_cast<std::size_t>(r)]);
  }
  return run;
}

// A TCP port that was free a moment ago (bind port 0 on loopback).
inline std::uint16_t free_port(int family = AF_INET) {
  SocketAddress any = wildcard_address(family, 0);
  Fd fd = listen_on(any, 1);
  return local_address(fd.get()).port();
}

// Two consecutive free ports p, p+1 (torchrun: MASTER_PORT and the root).
inline std::uint16_t free_port_pair() {
  for (int attempt = 0; attempt < 50; ++attempt) {
    const std::uint16_t p = free_port();
    if (p >= 65535) continue;
    try {
      Fd a = listen_on(wildcard_address(AF_INET, p), 1);
      Fd b = listen_on(wildcard_address(AF_INET, static_cast<std::uint16_t>(p + 1)), 1);
      return p;
    } catch (const Error&) {
    }
  }
  throw std::runtime_error("no free port pair");
}

}  // namespace wia::bootstrap::test
