// SPDX-License-Identifier: Apache-2.0
// Run under a real launcher (ctest runs it as `mpirun -np 4`): joins with
// Bootstrap::from_environment() and checks what the launcher said against
// what the bootstrap learned. Uses nothing of MPI itself. Exit 0 = pass.
#include <fmt/core.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <vector>

#include "bootstrap/bootstrap.hpp"
#include "common/error.hpp"
#include "config/config.hpp"

namespace wb = wia::bootstrap;

namespace {

int env_int(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr ? std::atoi(v) : -1;
}

void expect(bool ok, const std::string& what) {
  if (!ok) throw std::runtime_error(what);
}

}  // namespace

int main() {
  int rank = -1;
  try {
    const auto launch = wb::detect_launcher(wb::process_environment(), 0, geteuid());
    rank = launch.rank;
    const auto options = wb::Options::from_config(wia::Config::load_from_env());
    auto b = wb::Bootstrap::from_launch_info(launch, options);
    expect(b->rank() == env_int("OMPI_COMM_WORLD_RANK"), "rank differs from Open MPI's");
    expect(b->size() == env_int("OMPI_COMM_WORLD_SIZE"), "size differs from Open MPI's");
    expect(b->nnodes() == 1, fmt::format("{} nodes on one machine", b->nnodes()));
    expect(b->local_rank() == env_int("OMPI_COMM_WORLD_LOCAL_RANK"), "local rank differs");
    if (b->rank() == 0) {
      struct stat st {};
      expect(stat(launch.rendezvous_file.c_str(), &st) != 0,
             "rendezvous file " + launch.rendezvous_file + " left behind");
    }
    const int n = b->size();
    std::vector<std::uint8_t> mine(128);
    for (std::size_t i = 0; i < mine.size(); ++i) {
      mine[i] = static_cast<std::uint8_t>(b->rank() * 3 + static_cast<int>(i));
    }
    const auto all = b->all_gather(mine);
    for (int r = 0; r < n; ++r) {
      expect(all[static_cast<std::size_t>(r) * 128 + 5] == static_cast<std::uint8_t>(r * 3 + 5),
             fmt::format("all_gather slot of rank {}", r));
    }
    const std::string hello = fmt::format("hello from {}", b->rank());
    b->send((b->rank() + 1) % n, 1,
            {reinterpret_cast<const std::uint8_t*>(hello.data()), hello.size()});
    const auto got = b->recv((b->rank() + n - 1) % n, 1);
    expect(std::string(got.begin(), got.end()) ==
               fmt::format("hello from {}", (b->rank() + n - 1) % n),
           "ring message");
    b->barrier();
    std::printf("bootstrap_mpi_probe: rank %d of %d ok (%s)\n", b->rank(), n,
                launch.summary.c_str());
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bootstrap_mpi_probe: rank %d FAILED: %s\n", rank, e.what());
    return 1;
  }
}
