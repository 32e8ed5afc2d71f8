// SPDX-License-Identifier: Apache-2.0
// usable_cpu_count: what "ranks outnumber cores" is counted against.
#include "common/cpus.hpp"

#include <doctest/doctest.h>
#include <sched.h>

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

}  // namespace wia
