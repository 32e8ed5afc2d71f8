// SPDX-License-Identifier: Apache-2.0
// Running a tool as the ranks of one job, as wia-bench and wia-bw do:
//  - `--procs N`: spawn_local_ranks forks and execs this program N times on
//    this machine, with WIA_RANK, WIA_WORLD_SIZE, WIA_LOCAL_RANK,
//    WIA_LOCAL_SIZE and a unique id (wia_get_unique_id, hex in
//    WIA_TOOL_UNIQUE_ID) that leads to the rendezvous root this process
//    runs; the children get the same arguments with `--procs N` replaced by
//    `--procs-from-env`;
//  - `--procs-from-env`: join_job makes this process one rank: from that
//    unique id when set, else from the launcher's variables (mpirun, srun,
//    torchrun, or WIA_RANK/WIA_WORLD_SIZE/WIA_ROOT_ADDR; docs/processes.md).
#pragma once

#include <wia/wia.h>

namespace wia::tools {

// Across processes each rank drives one host device, unless the user
// configured devices (WIA_HOST_DEVICES or WIA_CONFIG set).
void default_one_device_per_process();

// True when a launcher's variables mark this process as one rank of a job
// (OMPI_COMM_WORLD_SIZE, PMI_SIZE or WIA_WORLD_SIZE).
bool launched_by_launcher();

// Forks and execs this program `nprocs` times as the ranks of one job,
// waits for them, and returns the first non-zero exit status in rank order
// (0 when all succeeded; 2 for a bad WIA_BIND_TO). Ranks are bound as
// `mpirun --bind-to core` binds them: rank r to the r-th core (the CPUs of
// it this process may use, hwloc order) when there are at least as many
// cores as ranks; unbound when the ranks outnumber them (as mpirun when
// oversubscribed) or WIA_BIND_TO=none. Unbound, two spinning ranks could
// share one core for a whole short benchmark before the scheduler moves
// one (docs/decisions.md). The binding is printed at WIA_LOG_LEVEL info or
// more. Once a rank has failed, the others have 10 s to
// report the broken communicator themselves, then are killed; a rank also
// dies with this process. `tool` prefixes messages.
int spawn_local_ranks(const char* tool, int nprocs, int argc, char** argv);

// In a rank spawn_local_ranks started: how the ranks are bound ("bound one
// per core ...", or "unbound: why"), for the tool's report; null otherwise.
const char* spawned_binding();

// Creates this rank's process communicator (collective over the job).
// WIA_ERROR_INVALID_ARGUMENT for a malformed WIA_TOOL_UNIQUE_ID (message on
// stderr); otherwise the status of the create call.
wia_status_t join_job(const char* tool, wia_communicator_t* comm);

}  // namespace wia::tools
