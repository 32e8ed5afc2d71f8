// SPDX-License-Identifier: Apache-2.0
// The shared-memory bound for an all-reduce across NP processes of one
// node: each process streams the bytes a bandwidth-optimal all-reduce of N
// bytes must exchange, 2(NP-1)/NP * N, to the next process through a
// shared segment, while taking as much from the previous one: one memcpy
// from private memory into its slot ring, one memcpy out of the previous
// process's ring into private memory, with one thread per process (what
// libwia uses) and nothing else to do (no reduction, no protocol beyond a
// sequence number per slot). It is the shm counterpart of
// tcp_ring_bound.cpp; tools/bench-peers.sh prints libwia's shm results
// against it from 1 MiB.
//
// An all-reduce may move fewer bytes than this (libwia reads wia_malloc
// inputs in place from the windows, so it skips the copy in), so a ratio
// above 1 is possible and means exactly that; the copies are what any
// all-reduce between processes with private buffers pays.
//
//   shm_ring_bound NP BYTES...   (forks the NP processes itself)
// Prints, per size, "<bytes> <time_us> <busbw GB/s> 0" like the other
// bench-peers programs: time = one all-reduce's worth of streaming, the
// median of 3 repetitions, each timed between barriers (so it is the
// slowest process's). Process r runs on CPU r while there are CPUs enough,
// as wia-bench --procs binds its ranks. SHM_BOUND_CHUNK (bytes, default
// 256 KiB) and SHM_BOUND_SLOTS (default 4) size each ring.
#include <sched.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "ring_bound.hpp"

namespace {

constexpr const char* kProgram = "shm_ring_bound";

std::size_t env_size(const char* name, std::size_t fallback) {
  const char* v = std::getenv(name);
  return (v && *v) ? std::strtoull(v, nullptr, 10) : fallback;
}

constexpr std::size_t kLine = 64;

// One process's outgoing ring: `written` counts chunks it has copied in,
// `taken` counts chunks the next process has copied out. Each counter sits
// on its own cache line so the producer and the consumer do not share one.
struct alignas(kLine) Counter {
  std::atomic<std::uint64_t> value{0};
  char pad[kLine - sizeof(std::atomic<std::uint64_t>)];
};

struct RingHeader {
  Counter written;
  Counter taken;
};

struct Barrier {
  Counter arrived;
  Counter generation;
};

// Spins while the cores suffice; with more processes than CPUs a spinner
// would keep the process it waits for off the CPU, so it yields.
template <typename Ready>
void wait_until(Ready ready, bool oversubscribed) {
  for (unsigned spins = 0; !ready(); ++spins) {
    if (oversubscribed || spins > 4096) std::this_thread::yield();
#if defined(__x86_64__)
    else __builtin_ia32_pause();
#endif
  }
}

void barrier(Barrier& b, int np, bool oversubscribed) {
  const std::uint64_t gen = b.generation.value.load(std::memory_order_acquire);
  if (b.arrived.value.fetch_add(1, std::memory_order_acq_rel) + 1 == static_cast<std::uint64_t>(np)) {
    b.arrived.value.store(0, std::memory_order_relaxed);
    b.generation.value.store(gen + 1, std::memory_order_release);
    return;
  }
  wait_until([&] { return b.generation.value.load(std::memory_order_acquire) != gen; }, oversubscribed);
}

struct Layout {
  int np;
  std::size_t chunk, slots;
  char* base;
  Barrier* barrier() const { return reinterpret_cast<Barrier*>(base); }
  RingHeader* header(int r) const {
    return reinterpret_cast<RingHeader*>(base + sizeof(Barrier) + r * sizeof(RingHeader));
  }
  char* slot(int r, std::uint64_t k) const {
    const std::size_t data = (sizeof(Barrier) + np * sizeof(RingHeader) + 4095) / 4096 * 4096;
    return base + data + (r * slots + k % slots) * chunk;
  }
  std::size_t bytes() const {
    return (sizeof(Barrier) + np * sizeof(RingHeader) + 4095) / 4096 * 4096 + np * slots * chunk;
  }
};

int iterations(std::size_t bytes) {
  return static_cast<int>(std::clamp<std::size_t>((512u << 20) / std::max<std::size_t>(bytes, 1), 5, 1000));
}

void run_rank(int rank, const Layout& shm, const std::vector<std::size_t>& sizes, bool oversubscribed) {
  const int np = shm.np, prev = (rank + np - 1) % np;
  RingHeader& mine = *shm.header(rank);
  RingHeader& theirs = *shm.header(prev);
  std::uint64_t sent = 0, received = 0;  // chunks over the whole run
  for (const std::size_t bytes : sizes) {
    const std::size_t per_iter = std::max<std::size_t>(bytes / np * 2 * (np - 1), 1);
    std::vector<char> out(per_iter, static_cast<char>(rank + 1)), in(per_iter, 0);  // faulted in now
    // One all-reduce's worth: every chunk of `out` into my ring while every
    // chunk of the previous process's stream goes into `in`, interleaved
    // so both rings keep moving with one thread.
    auto stream = [&](int n) {
      for (int i = 0; i < n; ++i) {
        std::size_t put = 0, got = 0;
        while (put < per_iter || got < per_iter) {
          if (put < per_iter &&
              mine.taken.value.load(std::memory_order_acquire) + shm.slots > sent) {
            const std::size_t len = std::min(shm.chunk, per_iter - put);
            std::memcpy(shm.slot(rank, sent), out.data() + put, len);
            mine.written.value.store(++sent, std::memory_order_release);
            put += len;
            continue;
          }
          if (got < per_iter && theirs.written.value.load(std::memory_order_acquire) > received) {
            const std::size_t len = std::min(shm.chunk, per_iter - got);
            std::memcpy(in.data() + got, shm.slot(prev, received), len);
            theirs.taken.value.store(++received, std::memory_order_release);
            got += len;
            continue;
          }
          wait_until(
              [&] {
                return (put < per_iter &&
                        mine.taken.value.load(std::memory_order_acquire) + shm.slots > sent) ||
                       (got < per_iter && theirs.written.value.load(std::memory_order_acquire) > received);
              },
              oversubscribed);
        }
      }
    };
    stream(2);  // warm-up: the rings' pages and the buffers in their final state
    const int iters = iterations(bytes);
    std::vector<double> samples;
    for (int rep = 0; rep < 3; ++rep) {
      barrier(*shm.barrier(), np, oversubscribed);
      const auto t0 = std::chrono::steady_clock::now();
      stream(iters);
      barrier(*shm.barrier(), np, oversubscribed);
      samples.push_back(
          std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() /
          iters);
    }
    ring_bound::print_row(rank, np, bytes, samples);
  }
}

}  // namespace

int main(int argc, char** argv) {
  const ring_bound::Args args = ring_bound::parse(kProgram, argc, argv);
  const int np = args.np;
  Layout shm{np, env_size("SHM_BOUND_CHUNK", 256 << 10), env_size("SHM_BOUND_SLOTS", 4), nullptr};
  if (shm.chunk == 0 || shm.slots < 2) {
    std::fprintf(stderr, "shm_ring_bound: SHM_BOUND_CHUNK must be > 0 and SHM_BOUND_SLOTS >= 2\n");
    return 2;
  }
  // Mapped before the fork, so every process sees the same pages.
  void* p = mmap(nullptr, shm.bytes(), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) ring_bound::die(kProgram, "mmap");
  std::memset(p, 0, shm.bytes());
  shm.base = static_cast<char*>(p);
  const int cpus = static_cast<int>(std::max(1L, sysconf(_SC_NPROCESSORS_ONLN)));
  const bool oversubscribed = np > cpus;
  return ring_bound::fork_ranks(kProgram, np, [&](int r) {
    if (!oversubscribed) {
      cpu_set_t set;
      CPU_ZERO(&set);
      CPU_SET(r, &set);
      sched_setaffinity(0, sizeof(set), &set);  // best effort, as wia-bench's binding
    }
    run_rank(r, shm, args.sizes, oversubscribed);
  });
}
