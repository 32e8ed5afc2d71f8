// SPDX-License-Identifier: Apache-2.0
#pragma once

namespace wia {

// The CPUs this process may run on now (its affinity: taskset, a cgroup
// cpuset, a launcher's binding), at least 1; the online CPUs where the
// affinity cannot be read. What "ranks outnumber cores" is counted
// against: threads of this process cannot use the machine's other CPUs.
int usable_cpu_count() noexcept;

}  // namespace wia
