// SPDX-License-Identifier: Apache-2.0
// Which launcher started this process, and what it tells us: rank, size,
// local rank, where rank 0's bootstrap root listens, and the secret. A pure
// function of an environment map, so every launcher is unit-tested without
// running it; detect_launcher_from_environment() is the real-env wrapper.
//
// Order (the first whose rank and size variables are present wins):
//   1. libwia      WIA_RANK, WIA_WORLD_SIZE [, WIA_LOCAL_RANK]; WIA_ROOT_ADDR
//   2. torchrun    RANK, WORLD_SIZE [, LOCAL_RANK, LOCAL_WORLD_SIZE];
//                  MASTER_ADDR, MASTER_PORT (root port: see below)
//   3. Open MPI    OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE
//                  [, OMPI_COMM_WORLD_LOCAL_RANK, OMPI_COMM_WORLD_LOCAL_SIZE]
//   4. MPICH/Hydra PMI_RANK, PMI_SIZE [, MPI_LOCALRANKID, MPI_LOCALNRANKS]
//   5. Slurm       SLURM_PROCID, SLURM_NTASKS [, SLURM_LOCALID]
// torchrun precedes the MPI launchers and Slurm because torchrun is often
// started by srun or mpirun, and its variables are the innermost. Open MPI
// precedes Slurm for the same reason (mpirun inside an sbatch script).
//
// Root address: WIA_ROOT_ADDR ("host:port", "[v6]:port") for every
// launcher. Without it, torchrun uses MASTER_ADDR and port `root_port` if
// non-zero (bootstrap.port / WIA_BOOTSTRAP_PORT), else MASTER_PORT + 1:
// MASTER_PORT itself is held by torchrun's own TCPStore. The MPI launchers
// and Slurm without WIA_ROOT_ADDR use a file rendezvous on one node (rank 0
// writes its address and a fresh secret to a 0600 file keyed by the job
// id); a job known to span several nodes without WIA_ROOT_ADDR is an error.
//
// Secret: WIA_AUTH_KEY when set (any text, ideally 32 random hex digits);
// else the file rendezvous makes a random one; else (root address, no key)
// one is derived from facts every rank of the job shares (launcher, root
// address, size, job ids). A derived secret keeps stray clients (another
// job's ranks, port scanners) out, not an attacker who can read the job's
// environment.
#pragma once

#include <functional>
#include <map>
#include <optional>
#include <string>

#include "bootstrap/siphash.hpp"

namespace wia::bootstrap {

enum class Launcher { kNone, kWia, kTorchrun, kOpenMpi, kMpich, kSlurm };
const char* launcher_name(Launcher launcher);  // "libwia (WIA_RANK)", "torchrun", ...

using EnvMap = std::map<std::string, std::string, std::less<>>;

struct LaunchInfo {
  Launcher launcher = Launcher::kNone;
  int rank = -1;
  int size = 0;
  int local_rank = -1;  // as the launcher says; -1 unknown
  int local_size = -1;  // as the launcher says; -1 unknown
  // "host:port" where rank 0 runs the root. Empty: file rendezvous.
  std::string root_address;
  // File rendezvous only: the file rank 0 writes ("$TMPDIR/wia-bootstrap-
  // <uid>-<job>"), keyed by the launcher's job id.
  std::string rendezvous_file;
  std::optional<Secret> secret;  // nullopt: the file rendezvous makes one
  bool secret_derived = false;   // see the header comment
  std::string summary;           // "Open MPI rank 1 of 4 (local 1 of 4)"
};

// Throws wia::Error(WIA_ERROR_CONFIG) naming the variable for a partial or
// invalid set ("WIA_RANK is set but WIA_WORLD_SIZE is not", "RANK='x' is
// not an integer", "rank 4 >= WORLD_SIZE 4"), and for a multi-node MPI or
// Slurm job without WIA_ROOT_ADDR. Returns launcher kNone when no
// launcher's variables are present. `uid` keys the rendezvous file so two
// users' jobs never share one.
LaunchInfo detect_launcher(const EnvMap& env, int root_port = 0, unsigned uid = 0);

// The process environment as an EnvMap.
EnvMap process_environment();

}  // namespace wia::bootstrap
