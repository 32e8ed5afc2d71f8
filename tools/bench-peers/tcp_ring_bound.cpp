// SPDX-License-Identifier: Apache-2.0
// The loopback TCP bound for an all-reduce across NP processes: each of NP
// processes streams the bytes a bandwidth-optimal all-reduce of N bytes
// must send, 2(NP-1)/NP * N, to the next process over one plain blocking
// TCP socket while receiving as much from the previous one, with nothing
// else to do (no reduction, no protocol, no polling). For large messages,
// where the kernel's copies are the cost, no all-reduce over these sockets
// is faster, so tools/bench-peers.sh prints libwia's tcp results against
// it from 16 MiB (below, each blocking wake-up costs more than polling
// and libwia beats it). The ring pattern, one stream per direction, was
// measured faster here than a full mesh of the same bytes (0.80 - 1.05
// against 0.66 - 0.87 GB/s at 4 processes, 64 MiB), so it is the tighter
// bound; a single thread polling non-blocking sockets moved it at 0.57 -
// 0.63 with sched_yield between polls and 0.69 - 0.79 sleeping in poll(2).
//
//   tcp_ring_bound NP BYTES...   (forks the NP processes itself)
// Prints, per size, "<bytes> <time_us> <busbw GB/s> 0" like the other
// bench-peers programs: time = one all-reduce's worth of streaming, the
// median of 3 repetitions, each timed between ring barriers (so it is the
// slowest process's).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "ring_bound.hpp"

namespace {

constexpr const char* kProgram = "tcp_ring_bound";
[[noreturn]] void die(const char* what) { ring_bound::die(kProgram, what); }

void send_all(int fd, const char* p, std::size_t n) {
  while (n > 0) {
    const ssize_t k = send(fd, p, n, 0);
    if (k <= 0) die("send");
    p += k;
    n -= static_cast<std::size_t>(k);
  }
}

void recv_all(int fd, char* p, std::size_t n) {
  while (n > 0) {
    const ssize_t k = recv(fd, p, n, 0);
    if (k <= 0) die(k == 0 ? "recv: the previous process closed" : "recv");
    p += k;
    n -= static_cast<std::size_t>(k);
  }
}

int iterations(std::size_t bytes) {
  return static_cast<int>(std::clamp<std::size_t>((256u << 20) / std::max<std::size_t>(bytes, 1), 5, 1000));
}

// Two laps of a token: when rank 0 has it back the second time, every
// process has entered the barrier and left the first lap.
void ring_barrier(int rank, int to_next, int from_prev) {
  char token = 0;
  for (int lap = 0; lap < 2; ++lap) {
    if (rank == 0) {
      send_all(to_next, &token, 1);
      recv_all(from_prev, &token, 1);
    } else {
      recv_all(from_prev, &token, 1);
      send_all(to_next, &token, 1);
    }
  }
}

void run_rank(int rank, int np, const std::vector<int>& listeners, const std::vector<int>& ports,
              const std::vector<std::size_t>& sizes) {
  for (int r = 0; r < np; ++r)
    if (r != rank) close(listeners[r]);
  const int next = (rank + 1) % np;
  const int to_next = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<std::uint16_t>(ports[next]));
  if (connect(to_next, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) die("connect");
  const int from_prev = accept(listeners[rank], nullptr, nullptr);
  if (from_prev < 0) die("accept");
  const int one = 1;
  setsockopt(to_next, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  setsockopt(from_prev, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));

  for (const std::size_t bytes : sizes) {
    const std::size_t per_iter = std::max<std::size_t>(bytes / np * 2 * (np - 1), 1);
    std::vector<char> out(per_iter, 1), in(per_iter);
    const int iters = iterations(bytes);
    auto stream = [&](int n) {
      std::thread sender([&] {
        for (int i = 0; i < n; ++i) send_all(to_next, out.data(), per_iter);
      });
      for (int i = 0; i < n; ++i) recv_all(from_prev, in.data(), per_iter);
      sender.join();
    };
    stream(3);  // warm-up: socket buffers grown, pages faulted in
    std::vector<double> samples;
    for (int rep = 0; rep < 3; ++rep) {
      ring_barrier(rank, to_next, from_prev);
      const auto t0 = std::chrono::steady_clock::now();
      stream(iters);
      ring_barrier(rank, to_next, from_prev);
      samples.push_back(
          std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() /
          iters);
    }
    ring_bound::print_row(rank, np, bytes, samples);
  }
  close(to_next);
  close(from_prev);
}

}  // namespace

int main(int argc, char** argv) {
  const ring_bound::Args args = ring_bound::parse(kProgram, argc, argv);
  const int np = args.np;
  // Listening sockets before the fork, so no process connects too early.
  std::vector<int> listeners(np), ports(np);
  for (int r = 0; r < np; ++r) {
    listeners[r] = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(a);
    if (bind(listeners[r], reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 ||
        listen(listeners[r], 1) != 0 ||
        getsockname(listeners[r], reinterpret_cast<sockaddr*>(&a), &len) != 0)
      die("listen");
    ports[r] = ntohs(a.sin_port);
  }
  return ring_bound::fork_ranks(kProgram, np,
                                [&](int r) { run_rank(r, np, listeners, ports, args.sizes); });
}
