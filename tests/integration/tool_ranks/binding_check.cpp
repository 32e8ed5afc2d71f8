// SPDX-License-Identifier: Apache-2.0
// Checks where spawn_local_ranks (wia-bench --procs, wia-bw --procs) binds
// its ranks (tests.cmake runs it):
//
//   tool_ranks_binding_check --procs N [--on-first-cpu]
//       spawns N ranks (from a spawner restricted to the first CPU it may
//       use, with --on-first-cpu); each reads its own CPU affinity and the ranks
//       all-gather them over a process communicator. Rank 0 checks them
//       against what it works out from sysfs (not hwloc, which the spawner
//       uses): when the spawner's CPUs span at least N cores and
//       WIA_BIND_TO is not "none", each rank runs on exactly the spawner's
//       CPUs of one core, no two ranks on the same core; otherwise every
//       rank runs on all of the spawner's CPUs. Exits with 77 (skipped)
//       where sysfs does not describe the cores.
#include <sched.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "tool_ranks.hpp"

namespace {

constexpr int kWords = 16;  // CPUs 0 .. 1023
using Mask = std::vector<std::uint64_t>;
constexpr const char* kParentVar = "BINDING_CHECK_SPAWNER_CPUS";

Mask own_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  Mask m(kWords, 0);
  if (sched_getaffinity(0, sizeof set, &set) != 0) return m;
  for (int c = 0; c < kWords * 64 && c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &set)) m[c / 64] |= 1ull << (c % 64);
  return m;
}

std::string to_hex(const Mask& m) {
  std::string s;
  char w[17];
  for (std::uint64_t v : m)
    std::snprintf(w, sizeof w, "%016llx", static_cast<unsigned long long>(v)), s += w;
  return s;
}

Mask from_hex(const std::string& s) {
  Mask m(kWords, 0);
  for (int i = 0; i < kWords && (i + 1) * 16 <= static_cast<int>(s.size()); ++i)
    m[i] = std::strtoull(s.substr(i * 16, 16).c_str(), nullptr, 16);
  return m;
}

std::string describe(const Mask& m) {
  std::string s;
  for (int c = 0; c < kWords * 64; ++c)
    if (m[c / 64] >> (c % 64) & 1) s += (s.empty() ? "" : ",") + std::to_string(c);
  return "{" + s + "}";
}

constexpr int kSkipped = 77;  // ctest SKIP_RETURN_CODE

bool read_int(const std::string& path, int* v) {
  std::ifstream f(path);
  return static_cast<bool>(f >> *v);
}

// The spawner's CPUs grouped by core (package id, core id from sysfs);
// false when sysfs does not say.
bool cores_of(const Mask& spawner, std::vector<Mask>* out) {
  std::map<std::pair<int, int>, Mask> cores;
  for (int c = 0; c < kWords * 64; ++c) {
    if (!(spawner[c / 64] >> (c % 64) & 1)) continue;
    const std::string dir = "/sys/devices/system/cpu/cpu" + std::to_string(c) + "/topology/";
    std::pair<int, int> key;
    if (!read_int(dir + "physical_package_id", &key.first) ||
        !read_int(dir + "core_id", &key.second))
      return false;
    auto [it, fresh] = cores.try_emplace(key, Mask(kWords, 0));
    it->second[c / 64] |= 1ull << (c % 64);
  }
  for (auto& [key, m] : cores) out->push_back(m);
  return true;
}

int run_rank() {
  wia_communicator_t comm = nullptr;
  if (wia::tools::join_job("tool_ranks_binding_check", &comm) != WIA_SUCCESS) {
    std::fprintf(stderr, "FAILED: join: %s\n", wia_get_last_error());
    return 1;
  }
  const int rank = wia_comm_rank(comm), n = wia_comm_size(comm);
  const Mask mine = own_cpus();
  std::vector<std::uint64_t> all(static_cast<std::size_t>(n) * kWords);
  if (wia_all_gather(comm, mine.data(), all.data(), kWords, WIA_UINT64, nullptr) != WIA_SUCCESS ||
      wia_stream_synchronize(nullptr) != WIA_SUCCESS) {
    std::fprintf(stderr, "FAILED: all-gather: %s\n", wia_get_last_error());
    return 1;
  }
  int failures = 0;
  if (rank == 0) {
    const char* hex = std::getenv(kParentVar);
    const Mask spawner = from_hex(hex ? hex : "");
    std::vector<Mask> cores;
    if (!cores_of(spawner, &cores)) {
      std::printf("skipped: /sys/devices/system/cpu/cpu*/topology does not name the cores\n");
      failures = -1;
    }
    const char* policy = std::getenv("WIA_BIND_TO");
    const bool bound =
        !(policy && !std::strcmp(policy, "none")) && static_cast<int>(cores.size()) >= n;
    std::printf("%d ranks, spawner CPUs %s on %zu core(s): expect %s\n", n,
                describe(spawner).c_str(), cores.size(), bound ? "one core each" : "unbound");
    std::set<Mask> seen;
    for (int r = 0; r < n && failures >= 0; ++r) {
      const Mask m(all.begin() + r * kWords, all.begin() + (r + 1) * kWords);
      std::printf("  rank %d runs on %s\n", r, describe(m).c_str());
      bool ok;
      if (bound) {
        ok = seen.insert(m).second;
        bool one_core = false;
        for (const Mask& c : cores) one_core |= c == m;
        ok = ok && one_core;
      } else {
        ok = m == spawner;
      }
      if (!ok) {
        std::fprintf(stderr, "FAILED: rank %d runs on %s\n", r, describe(m).c_str());
        ++failures;
      }
    }
  }
  wia_destroy_communicator(comm);
  wia_finalize();
  return failures < 0 ? kSkipped : failures ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  if ((argc == 3 || (argc == 4 && !std::strcmp(argv[3], "--on-first-cpu"))) &&
      !std::strcmp(argv[1], "--procs")) {
    if (argc == 4) {
      cpu_set_t set;
      CPU_ZERO(&set);
      if (sched_getaffinity(0, sizeof set, &set) == 0) {
        int first = 0;
        while (first < CPU_SETSIZE && !CPU_ISSET(first, &set)) ++first;
        CPU_ZERO(&set);
        CPU_SET(first, &set);
        if (sched_setaffinity(0, sizeof set, &set) != 0) {
          std::perror("sched_setaffinity");
          return 1;
        }
      }
    }
    setenv(kParentVar, to_hex(own_cpus()).c_str(), 1);
    return wia::tools::spawn_local_ranks("tool_ranks_binding_check", std::atoi(argv[2]), argc,
                                         argv);
  }
  if (argc >= 2 && !std::strcmp(argv[argc - 1], "--procs-from-env")) return run_rank();
  std::fprintf(stderr, "usage: tool_ranks_binding_check --procs N [--on-first-cpu]\n");
  return 2;
}
