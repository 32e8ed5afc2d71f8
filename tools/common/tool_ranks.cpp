// SPDX-License-Identifier: Apache-2.0
#include "tool_ranks.hpp"

#include <hwloc.h>
#include <hwloc/glibc-sched.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

extern char** environ;  // the children's environment is built from ours

namespace wia::tools {

namespace {

using Clock = std::chrono::steady_clock;

constexpr const char* kIdVariable = "WIA_TOOL_UNIQUE_ID";
constexpr const char* kBindingVariable = "WIA_TOOL_BINDING";

int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::atoi(v) : fallback;
}

// Where spawn_local_ranks binds its ranks (see tool_ranks.hpp).
struct RankBinding {
  std::vector<cpu_set_t> cpus;  // one per rank, or empty: unbound
  std::string why;              // why unbound
  std::string error;            // WIA_BIND_TO is neither "core" nor "none"
};

RankBinding plan_rank_binding(int nprocs) {
  RankBinding plan;
  const char* policy = std::getenv("WIA_BIND_TO");
  if (policy && *policy && std::strcmp(policy, "core") && std::strcmp(policy, "none")) {
    plan.error = std::string("WIA_BIND_TO='") + policy + "': expected 'core' or 'none'";
    return plan;
  }
  if (policy && !std::strcmp(policy, "none")) {
    plan.why = "WIA_BIND_TO=none";
    return plan;
  }
  struct TopologyDeleter {
    void operator()(hwloc_topology* t) const { hwloc_topology_destroy(t); }
  };
  struct BitmapDeleter {
    void operator()(hwloc_bitmap_s* b) const { hwloc_bitmap_free(b); }
  };
  hwloc_topology_t raw = nullptr;
  if (hwloc_topology_init(&raw) != 0) {
    plan.why = "hwloc could not read this machine's cores";
    return plan;
  }
  const std::unique_ptr<hwloc_topology, TopologyDeleter> topo(raw);
  const std::unique_ptr<hwloc_bitmap_s, BitmapDeleter> allowed(hwloc_bitmap_alloc());
  const std::unique_ptr<hwloc_bitmap_s, BitmapDeleter> usable(hwloc_bitmap_alloc());
  if (hwloc_topology_load(topo.get()) != 0 || !allowed || !usable) {
    plan.why = "hwloc could not read this machine's cores";
    return plan;
  }
  // The cores this process may run on (taskset, cgroups), each with the
  // CPUs of it it may use.
  if (hwloc_get_cpubind(topo.get(), allowed.get(), HWLOC_CPUBIND_PROCESS) != 0)
    hwloc_bitmap_copy(allowed.get(), hwloc_topology_get_allowed_cpuset(topo.get()));
  const hwloc_obj_type_t unit =
      hwloc_get_nbobjs_by_type(topo.get(), HWLOC_OBJ_CORE) > 0 ? HWLOC_OBJ_CORE : HWLOC_OBJ_PU;
  std::vector<cpu_set_t> cores;
  for (hwloc_obj_t o = hwloc_get_next_obj_by_type(topo.get(), unit, nullptr); o;
       o = hwloc_get_next_obj_by_type(topo.get(), unit, o)) {
    hwloc_bitmap_and(usable.get(), o->cpuset, allowed.get());
    cpu_set_t set;
    // (A core past cpu_set_t's CPU_SETSIZE CPUs comes out empty: skipped.)
    if (hwloc_cpuset_to_glibc_sched_affinity(topo.get(), usable.get(), &set, sizeof set) == 0 &&
        CPU_COUNT(&set) > 0)
      cores.push_back(set);
  }
  if (static_cast<int>(cores.size()) < nprocs) {
    // As mpirun when oversubscribed: the scheduler shares the cores out.
    plan.why = std::to_string(nprocs) + " ranks outnumber the " + std::to_string(cores.size()) +
               " core(s) this process may use";
    return plan;
  }
  cores.resize(static_cast<std::size_t>(nprocs));
  plan.cpus = std::move(cores);
  return plan;
}

// "0-3,8": the CPUs of `set`, for the binding report.
std::string cpu_list(const cpu_set_t& set) {
  std::string out;
  for (int c = 0; c < CPU_SETSIZE; ++c) {
    if (!CPU_ISSET(c, &set) || (c > 0 && CPU_ISSET(c - 1, &set))) continue;
    int last = c;
    while (last + 1 < CPU_SETSIZE && CPU_ISSET(last + 1, &set)) ++last;
    out += (out.empty() ? "" : ",") + std::to_string(c) +
           (last > c ? "-" + std::to_string(last) : std::string());
  }
  return out;
}

// The binding, on stderr, at WIA_LOG_LEVEL info or more (as mpirun's
// --report-bindings).
void report_binding(const char* tool, const RankBinding& binding) {
  const char* level = std::getenv("WIA_LOG_LEVEL");
  if (!level ||
      (std::strcmp(level, "info") && std::strcmp(level, "debug") && std::strcmp(level, "trace")))
    return;
  if (binding.cpus.empty()) {
    std::fprintf(stderr, "%s: ranks not bound: %s\n", tool, binding.why.c_str());
    return;
  }
  for (std::size_t r = 0; r < binding.cpus.size(); ++r)
    std::fprintf(stderr, "%s: rank %zu bound to CPU(s) %s\n", tool, r,
                 cpu_list(binding.cpus[r]).c_str());
}

}  // namespace

void default_one_device_per_process() {
  if (!std::getenv("WIA_HOST_DEVICES") && !std::getenv("WIA_CONFIG"))
    setenv("WIA_HOST_DEVICES", "1", 1);
}

bool launched_by_launcher() {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "WIA_WORLD_SIZE"})
    if (std::getenv(v)) return true;
  return false;
}

const char* spawned_binding() { return std::getenv(kBindingVariable); }

wia_status_t join_job(const char* tool, wia_communicator_t* comm) {
  const char* hex = std::getenv(kIdVariable);
  if (!hex) return wia_create_distributed_communicator(nullptr, comm);
  wia_unique_id_t id{};
  if (std::strlen(hex) != 2 * WIA_UNIQUE_ID_BYTES) {
    std::fprintf(stderr, "%s: %s has %zu hex digits, expected %d\n", tool, kIdVariable,
                 std::strlen(hex), 2 * WIA_UNIQUE_ID_BYTES);
    return WIA_ERROR_INVALID_ARGUMENT;
  }
  for (int i = 0; i < WIA_UNIQUE_ID_BYTES; ++i) {
    unsigned v = 0;
    if (std::sscanf(hex + 2 * i, "%2x", &v) != 1) {
      std::fprintf(stderr, "%s: %s: '%.2s' at digit %d is not hex\n", tool, kIdVariable,
                   hex + 2 * i, 2 * i);
      return WIA_ERROR_INVALID_ARGUMENT;
    }
    id.internal[i] = static_cast<char>(v);
  }
  const int rank = env_int("WIA_RANK", -1), size = env_int("WIA_WORLD_SIZE", -1);
  return wia_create_communicator_from_id(&id, size, rank, comm);
}

int spawn_local_ranks(const char* tool, int nprocs, int argc, char** argv) {
  default_one_device_per_process();
  const RankBinding binding = plan_rank_binding(nprocs);
  if (!binding.error.empty()) {
    std::fprintf(stderr, "%s: %s\n", tool, binding.error.c_str());
    return 2;
  }
  report_binding(tool, binding);
  wia_unique_id_t id{};
  // Runs the rendezvous root in this process.
  if (const wia_status_t st = wia_get_unique_id(&id); st != WIA_SUCCESS) {
    std::fprintf(stderr, "%s: wia_get_unique_id: %s\n  %s\n", tool, wia_status_string(st),
                 wia_get_last_error());
    return 1;
  }
  std::string hex;
  for (int i = 0; i < WIA_UNIQUE_ID_BYTES; ++i) {
    char h[3];
    std::snprintf(h, sizeof h, "%02x", static_cast<unsigned char>(id.internal[i]));
    hex += h;
  }
  char self[4096];
  const ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
  if (len <= 0) {
    std::fprintf(stderr, "%s: readlink /proc/self/exe: %s\n", tool, std::strerror(errno));
    return 1;
  }
  self[len] = '\0';
  // The children's arguments: ours, with --procs N replaced by --procs-from-env.
  std::vector<std::string> args{argv[0]};
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--procs")) {
      ++i;
      continue;
    }
    args.emplace_back(argv[i]);
  }
  args.emplace_back("--procs-from-env");
  // Everything is built before fork: the child only calls execve.
  std::vector<std::string> base_env;
  const std::string id_prefix = std::string(kIdVariable) + "=";
  const std::string binding_prefix = std::string(kBindingVariable) + "=";
  const char* const ours[] = {"WIA_RANK=",       "WIA_WORLD_SIZE=", "WIA_LOCAL_RANK=",
                              "WIA_LOCAL_SIZE=", id_prefix.c_str(), binding_prefix.c_str()};
  const std::string binding_summary =
      binding_prefix + (binding.cpus.empty()
                            ? "unbound: " + binding.why
                            : std::string("bound one per core (WIA_BIND_TO=none: unbound)"));
  for (char** e = environ; *e; ++e) {
    bool mine = false;
    for (const char* k : ours) mine |= !std::strncmp(*e, k, std::strlen(k));
    if (!mine) base_env.emplace_back(*e);
  }
  const int n = nprocs;
  std::vector<std::vector<std::string>> envs(n, base_env);
  std::vector<std::vector<char*>> envps(n);
  std::vector<char*> argp;
  for (auto& a : args) argp.push_back(a.data());
  argp.push_back(nullptr);
  for (int r = 0; r < n; ++r) {
    for (const auto& kv :
         {std::string("WIA_RANK=") + std::to_string(r),
          std::string("WIA_WORLD_SIZE=") + std::to_string(n),
          std::string("WIA_LOCAL_RANK=") + std::to_string(r),
          std::string("WIA_LOCAL_SIZE=") + std::to_string(n), id_prefix + hex, binding_summary})
      envs[r].push_back(kv);
    for (auto& e : envs[r]) envps[r].push_back(e.data());
    envps[r].push_back(nullptr);
  }
  std::fflush(stdout);
  std::fflush(stderr);
  std::vector<pid_t> pids(n, -1);
  for (int r = 0; r < n; ++r) {
    const pid_t pid = fork();
    if (pid == 0) {
      // A rank outliving its spawner (killed, timed out) would hold its
      // peers in collectives until their timeout: it dies with the spawner.
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      // Only a system call between fork and exec (the rendezvous root's
      // thread runs in the parent). A binding refused is a slower run,
      // not a failed one.
      if (!binding.cpus.empty()) sched_setaffinity(0, sizeof(cpu_set_t), &binding.cpus[r]);
      execve(self, argp.data(), envps[r].data());
      _exit(127);
    }
    if (pid < 0) {
      std::fprintf(stderr, "%s: fork: %s\n", tool, std::strerror(errno));
      for (int q = 0; q < r; ++q) kill(pids[q], SIGKILL), waitpid(pids[q], nullptr, 0);
      return 1;
    }
    pids[r] = pid;
  }
  // Wait; once a rank has failed, the others get a grace period to report
  // the broken communicator themselves, then are killed.
  constexpr int kRunning = -999;
  std::vector<int> status(n, kRunning);
  int left = n;
  Clock::time_point give_up = Clock::time_point::max();
  while (left > 0) {
    bool any = false;
    for (int r = 0; r < n; ++r) {
      if (status[r] != kRunning) continue;
      int st = 0;
      if (waitpid(pids[r], &st, WNOHANG) != pids[r]) continue;
      any = true;
      --left;
      status[r] = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
      if (status[r] != 0) {
        std::fprintf(stderr, "%s: rank %d (pid %d) %s %d\n", tool, r, static_cast<int>(pids[r]),
                     WIFEXITED(st) ? "exited with status" : "was killed by signal",
                     WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st));
        if (give_up == Clock::time_point::max()) give_up = Clock::now() + std::chrono::seconds(10);
      }
    }
    if (left > 0 && Clock::now() > give_up) {
      for (int r = 0; r < n; ++r)
        if (status[r] == kRunning) {
          std::fprintf(stderr,
                       "%s: killing rank %d (pid %d), still running 10 s after another rank "
                       "failed\n",
                       tool, r, static_cast<int>(pids[r]));
          kill(pids[r], SIGKILL);
          waitpid(pids[r], nullptr, 0);
          status[r] = 128 + SIGKILL;
          --left;
        }
    }
    if (!any && left > 0) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  for (int r = 0; r < n; ++r)
    if (status[r] != 0) return status[r];
  return 0;
}

}  // namespace wia::tools
