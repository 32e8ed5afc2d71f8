// SPDX-License-Identifier: Apache-2.0
// usable_cpu_count: what "ranks outnumber cores" is counted against; the
// cache sizes the engine's and the tuner's thresholds are built on.
#include "common/cpus.hpp"

#include <doctest/doctest.h>
#include <hwloc.h>
#include <sched.h>
#include <stdlib.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <thread>

namespace wia {

TEST_CASE("usable_cpu_count is the CPUs the caller may run on, not the machine's") {
  cpu_set_t mine;
  CPU_ZERO(&mine);
  REQUIRE(sched_getaffinity(0, sizeof mine, &mine) == 0);
  CHECK(usable_cpu_count() == CPU_COUNT(&mine));
  // A thread confined to one CPU (as a process under taskset -c N) counts 1
  // even where the machine has more.
  int first = 0;
  while (!CPU_ISSET(first, &mine)) ++first;
  int confined = 0;
  std::thread t([&] {
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(first, &one);
    if (sched_setaffinity(0, sizeof one, &one) == 0) confined = usable_cpu_count();
  });
  t.join();
  CHECK(confined == 1);
}

namespace {

// A sysfs cpuN/cache directory: (level, type, size) per index.
struct FakeCache {
  int level;
  const char* type;
  const char* size;
};
std::string fake_cache_dir(std::initializer_list<FakeCache> entries) {
  char tmpl[] = "/tmp/wia-cache-XXXXXX";
  REQUIRE(mkdtemp(tmpl) != nullptr);
  int i = 0;
  for (const FakeCache& e : entries) {
    const std::string dir = std::string(tmpl) + "/index" + std::to_string(i++);
    std::filesystem::create_directories(dir);
    std::ofstream(dir + "/level") << e.level << "\n";
    std::ofstream(dir + "/type") << e.type << "\n";
    std::ofstream(dir + "/size") << e.size << "\n";
  }
  return tmpl;
}

}  // namespace

TEST_CASE("cache sizes come from the kernel's list: levels, types and units") {
  // This VM's list (lscpu: L1d 32K, L1i 32K, L2 1 MiB, L3 32 MiB), where
  // glibc's sysconf said 320 MiB of L3.
  const std::string vm = fake_cache_dir({{1, "Data", "32K"},
                                         {1, "Instruction", "64K"},
                                         {2, "Unified", "1024K"},
                                         {3, "Unified", "32768K"}});
  CHECK(cache_bytes_in(vm, 1) == 32u << 10);  // the data cache, not the instruction one
  CHECK(cache_bytes_in(vm, 2) == 1u << 20);
  CHECK(cache_bytes_in(vm, 3) == 32u << 20);
  CHECK(cache_bytes_in(vm, 0) == 32u << 20);  // the last level
  CHECK(cache_bytes_in(vm, 4) == 0);
  // No L3 (some ARM cores): the last level is L2; sizes in M are read too.
  const std::string two = fake_cache_dir({{1, "Data", "64K"}, {2, "Unified", "2M"}});
  CHECK(cache_bytes_in(two, 0) == 2u << 20);
  CHECK(cache_bytes_in(two, 3) == 0);
  CHECK(cache_bytes_in("/nonexistent/cache", 0) == 0);
  std::filesystem::remove_all(vm);
  std::filesystem::remove_all(two);
}

TEST_CASE("the last-level cache is what hwloc finds on this machine") {
  // hwloc (Debian's library, its own parser) reads the same machine: the
  // two must agree wherever hwloc sees a cache above L1 (its first one of
  // the highest level: hwloc leaves out CPUs this process may not use).
  hwloc_topology_t topo;
  REQUIRE(hwloc_topology_init(&topo) == 0);
  REQUIRE(hwloc_topology_load(topo) == 0);
  std::uint64_t hwloc_llc = 0;
  for (const hwloc_obj_type_t t :
       {HWLOC_OBJ_L5CACHE, HWLOC_OBJ_L4CACHE, HWLOC_OBJ_L3CACHE, HWLOC_OBJ_L2CACHE}) {
    if (hwloc_obj_t o = hwloc_get_obj_by_type(topo, t, 0); o && o->attr) {
      hwloc_llc = o->attr->cache.size;
      break;
    }
  }
  hwloc_topology_destroy(topo);
  if (hwloc_llc == 0) {
    MESSAGE("hwloc finds no L2 or L3 cache here: nothing to compare");
    return;
  }
  CHECK(last_level_cache_bytes() == hwloc_llc);
}

}  // namespace wia
