// SPDX-License-Identifier: Apache-2.0
#include "common/cpus.hpp"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <thread>

namespace wia {

int usable_cpu_count() noexcept {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0) return CPU_COUNT(&set);
  return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

namespace {

std::string first_line(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

// "32768K", "1024K", "32M", "512" (bytes): sysfs cache sizes.
std::uint64_t parse_size(const std::string& text) {
  char* end = nullptr;
  const unsigned long long n = std::strtoull(text.c_str(), &end, 10);
  if (end == text.c_str()) return 0;
  switch (*end) {
    case 'K': return n << 10;
    case 'M': return n << 20;
    case 'G': return n << 30;
    default: return n;
  }
}

}  // namespace

std::uint64_t cache_bytes_in(const std::string& cache_dir, int level) noexcept {
  try {
    int best_level = 0;
    std::uint64_t best = 0;
    for (int i = 0; i < 16; ++i) {
      const std::string dir = cache_dir + "/index" + std::to_string(i);
      const std::string lv = first_line(dir + "/level");
      if (lv.empty()) break;
      if (first_line(dir + "/type") == "Instruction") continue;
      const int l = std::atoi(lv.c_str());
      const std::uint64_t size = parse_size(first_line(dir + "/size"));
      if (size == 0) continue;
      if (level > 0 ? l == level : l > best_level) {
        best_level = l;
        best = size;
        if (level > 0) break;
      }
    }
    return best;
  } catch (...) {
    return 0;  // out of memory reading a few short files: unknown
  }
}

namespace {

std::string first_cpu_cache_dir() {
  cpu_set_t set;
  CPU_ZERO(&set);
  int cpu = 0;
  if (sched_getaffinity(0, sizeof set, &set) == 0)
    while (cpu < CPU_SETSIZE - 1 && !CPU_ISSET(cpu, &set)) ++cpu;
  return "/sys/devices/system/cpu/cpu" + std::to_string(cpu) + "/cache";
}

std::uint64_t sysconf_bytes(int name) {
  const long v = sysconf(name);
  return v > 0 ? static_cast<std::uint64_t>(v) : 0;
}

}  // namespace

std::uint64_t cpu_cache_bytes(int level) noexcept {
  try {
    if (const std::uint64_t b = cache_bytes_in(first_cpu_cache_dir(), level)) return b;
  } catch (...) {
  }
  switch (level) {
    case 1: return sysconf_bytes(_SC_LEVEL1_DCACHE_SIZE);
    case 2: return sysconf_bytes(_SC_LEVEL2_CACHE_SIZE);
    case 3: return sysconf_bytes(_SC_LEVEL3_CACHE_SIZE);
    default: return 0;
  }
}

std::uint64_t last_level_cache_bytes() noexcept {
  try {
    if (const std::uint64_t b = cache_bytes_in(first_cpu_cache_dir(), 0)) return b;
  } catch (...) {
  }
  return sysconf_bytes(_SC_LEVEL3_CACHE_SIZE);
}

}  // namespace wia
