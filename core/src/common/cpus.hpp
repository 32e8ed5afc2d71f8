// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>
#include <string>

namespace wia {

// The CPUs this process may run on now (its affinity: taskset, a cgroup
// cpuset, a launcher's binding), at least 1; the online CPUs where the
// affinity cannot be read. What "ranks outnumber cores" is counted
// against: threads of this process cannot use the machine's other CPUs.
int usable_cpu_count() noexcept;

// The size in bytes of the data (or unified) cache of `level` of the first
// CPU this process may run on, as the kernel lists it in sysfs (what
// lscpu and hwloc report); 0 when unknown. Not sysconf: glibc's
// _SC_LEVEL3_CACHE_SIZE comes from CPUID, which in this project's VM on an
// AMD EPYC host said 320 MiB where the guest's L3 is 32 MiB (sysfs, lscpu,
// hwloc), so every threshold built on it was 10x off. sysconf only where
// sysfs has no cache list.
std::uint64_t cpu_cache_bytes(int level) noexcept;
// The last level: the highest level sysfs lists, else sysconf's L3, else 0.
std::uint64_t last_level_cache_bytes() noexcept;
// The same, read from `cache_dir` (a sysfs cpuN/cache directory: index*/
// level, type, size as "32768K"); `level` 0 asks for the highest.
std::uint64_t cache_bytes_in(const std::string& cache_dir, int level) noexcept;

}  // namespace wia
