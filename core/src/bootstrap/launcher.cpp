// SPDX-License-Identifier: Apache-2.0
#include "bootstrap/launcher.hpp"

#include <fmt/core.h>

#include <charconv>

#include "bootstrap/socket.hpp"
#include "common/error.hpp"

extern char** environ;

namespace wia::bootstrap {

namespace {

const std::string* find(const EnvMap& env, std::string_view name) {
  auto it = env.find(name);
  return it == env.end() ? nullptr : &it->second;
}

[[noreturn]] void config_error(std::string message) {
  throw Error(WIA_ERROR_CONFIG, "bootstrap: " + std::move(message));
}

int parse_int(const EnvMap& env, std::string_view name, int min_value) {
  const std::string& text = *find(env, name);
  int value = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size() || text.empty()) {
    config_error(fmt::format("{}='{}' is not an integer", name, text));
  }
  if (value < min_value)
    config_error(fmt::format("{}={} must be at least {}", name, value, min_value));
  return value;
}

int optional_int(const EnvMap& env, std::string_view name, int min_value) {
  return find(env, name) != nullptr ? parse_int(env, name, min_value) : -1;
}

struct LauncherVars {
  Launcher launcher;
  std::string_view rank, size, local_rank, local_size;
};

constexpr LauncherVars kLaunchers[] = {
    {Launcher::kWia, "WIA_RANK", "WIA_WORLD_SIZE", "WIA_LOCAL_RANK", "WIA_LOCAL_SIZE"},
    {Launcher::kTorchrun, "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"},
    {Launcher::kOpenMpi, "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
     "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"},
    {Launcher::kMpich, "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"},
    {Launcher::kSlurm, "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", ""},
};

// Keeps a job id usable in a file name.
std::string sanitize(std::string_view text) {
  std::string out;
  for (char c : text) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '.' || c == '-' || c == '_';
    out.push_back(ok ? c : '_');
  }
  return out.substr(0, 128);
}

// The launcher's id for this job (and step), for the rendezvous file name.
std::string job_id(const EnvMap& env, Launcher launcher) {
  auto get = [&](std::string_view name) -> std::string {
    const std::string* v = find(env, name);
    return v != nullptr ? *v : std::string();
  };
  if (auto id = get("WIA_JOB_ID"); !id.empty()) return id;
  switch (launcher) {
    case Launcher::kOpenMpi:
      if (auto id = get("OMPI_MCA_ess_base_jobid"); !id.empty()) return "ompi-" + id;
      if (auto id = get("PMIX_NAMESPACE"); !id.empty()) return "pmix-" + id;
      break;
    case Launcher::kMpich:
      if (auto id = get("PMIX_NAMESPACE"); !id.empty()) return "pmix-" + id;
      if (auto id = get("PMI_KVSNAME"); !id.empty()) return "pmi-" + id;
      break;
    case Launcher::kSlurm:
      if (auto id = get("SLURM_JOB_ID"); !id.empty()) {
        auto step = get("SLURM_STEP_ID");
        return "slurm-" + id + "." + (step.empty() ? std::string("0") : step);
      }
      break;
    default:
      break;
  }
  return {};
}

// Whether the launcher says the job spans nodes; nullopt when it cannot tell.
std::optional<bool> spans_nodes(const EnvMap& env, const LaunchInfo& info) {
  if (info.launcher == Launcher::kSlurm) {
    for (std::string_view name : {"SLURM_STEP_NUM_NODES", "SLURM_NNODES"}) {
      if (find(env, name) != nullptr) return parse_int(env, name, 1) > 1;
    }
    return std::nullopt;
  }
  if (info.local_size > 0) return info.local_size < info.size;
  return std::nullopt;
}

}  // namespace

const char* launcher_name(Launcher launcher) {
  switch (launcher) {
    case Launcher::kNone:
      return "none";
    case Launcher::kWia:
      return "libwia (WIA_RANK)";
    case Launcher::kTorchrun:
      return "torchrun";
    case Launcher::kOpenMpi:
      return "Open MPI";
    case Launcher::kMpich:
      return "MPICH/Hydra";
    case Launcher::kSlurm:
      return "Slurm";
  }
  return "unknown";
}

LaunchInfo detect_launcher(const EnvMap& env, int root_port, unsigned uid) {
  LaunchInfo info;
  const LauncherVars* vars = nullptr;
  for (const auto& candidate : kLaunchers) {
    const bool has_rank = find(env, candidate.rank) != nullptr;
    const bool has_size = find(env, candidate.size) != nullptr;
    if (has_rank != has_size && candidate.launcher == Launcher::kWia) {
      config_error(fmt::format("{} is set but {} is not",
                               has_rank ? candidate.rank : candidate.size,
                               has_rank ? candidate.size : candidate.rank));
    }
    if (has_rank && has_size) {
      vars = &candidate;
      break;
    }
  }
  if (vars == nullptr) return info;
  info.launcher = vars->launcher;
  info.size = parse_int(env, vars->size, 1);
  info.rank = parse_int(env, vars->rank, 0);
  if (info.rank >= info.size) {
    config_error(
        fmt::format("{}={} is not below {}={}", vars->rank, info.rank, vars->size, info.size));
  }
  info.local_rank = optional_int(env, vars->local_rank, 0);
  if (!vars->local_size.empty()) info.local_size = optional_int(env, vars->local_size, 1);

  const std::string* root = find(env, "WIA_ROOT_ADDR");
  std::string derivation;  // facts the derived secret is made of
  if (root != nullptr && !root->empty()) {
    info.root_address = *root;
    derivation = "WIA_ROOT_ADDR=" + *root;
  } else if (info.launcher == Launcher::kTorchrun) {
    const std::string* addr = find(env, "MASTER_ADDR");
    const std::string* port_text = find(env, "MASTER_PORT");
    if (addr == nullptr || port_text == nullptr) {
      config_error(
          "torchrun-style RANK and WORLD_SIZE are set but MASTER_ADDR or MASTER_PORT is "
          "not (or set WIA_ROOT_ADDR)");
    }
    int port = root_port;
    if (port == 0) {
      const int master_port = parse_int(env, "MASTER_PORT", 1);
      if (master_port >= 65535) {
        config_error(
            fmt::format("MASTER_PORT={} leaves no MASTER_PORT + 1 for the bootstrap; set "
                        "WIA_BOOTSTRAP_PORT",
                        master_port));
      }
      port = master_port + 1;
    }
    const bool v6 = addr->find(':') != std::string::npos && addr->front() != '[';
    info.root_address =
        v6 ? fmt::format("[{}]:{}", *addr, port) : fmt::format("{}:{}", *addr, port);
    derivation = "torchrun " + info.root_address;
    if (const std::string* run_id = find(env, "TORCHELASTIC_RUN_ID")) derivation += " " + *run_id;
  } else if (info.launcher == Launcher::kWia && find(env, "WIA_JOB_ID") == nullptr) {
    config_error(
        "WIA_RANK and WIA_WORLD_SIZE are set but WIA_ROOT_ADDR is not (set it to "
        "host:port of a free port on rank 0's node, or set WIA_JOB_ID for a one-node "
        "file rendezvous)");
  }
  if (!info.root_address.empty()) {
    std::string why;
    if (!parse_host_port(info.root_address, &why)) {
      config_error(fmt::format("root address '{}' is invalid: {}", info.root_address, why));
    }
  } else {
    if (spans_nodes(env, info).value_or(false)) {
      config_error(fmt::format(
          "this {} job spans several nodes ({} ranks, {} on this node) and WIA_ROOT_ADDR is not "
          "set; set WIA_ROOT_ADDR=host:port to a free port on the node of rank 0",
          launcher_name(info.launcher), info.size,
          info.local_size > 0 ? std::to_string(info.local_size) : std::string("some")));
    }
    const std::string id = job_id(env, info.launcher);
    if (id.empty()) {
      config_error(
          fmt::format("{} gives no job id to key a one-node file rendezvous by; set "
                      "WIA_ROOT_ADDR=host:port (or WIA_JOB_ID)",
                      launcher_name(info.launcher)));
    }
    const std::string* tmp = find(env, "TMPDIR");
    const std::string dir = tmp != nullptr && !tmp->empty() ? *tmp : std::string("/tmp");
    info.rendezvous_file = fmt::format("{}/wia-bootstrap-{}-{}", dir, uid, sanitize(id));
  }

  if (const std::string* key = find(env, "WIA_AUTH_KEY"); key != nullptr && !key->empty()) {
    info.secret = secret_from_text(*key);
  } else if (!info.root_address.empty()) {
    for (std::string_view name : {"TORCHELASTIC_RUN_ID", "SLURM_JOB_ID", "SLURM_STEP_ID",
                                  "PMIX_NAMESPACE", "OMPI_MCA_ess_base_jobid", "WIA_JOB_ID"}) {
      if (const std::string* v = find(env, name)) derivation += fmt::format(" {}={}", name, *v);
    }
    info.secret = secret_from_text(fmt::format(
        "wia-derived-secret {} size={} {}", launcher_name(info.launcher), info.size, derivation));
    info.secret_derived = true;
  }
  info.summary =
      fmt::format("{} rank {} of {}", launcher_name(info.launcher), info.rank, info.size);
  if (info.local_rank >= 0) {
    info.summary += info.local_size > 0
                        ? fmt::format(" (local {} of {})", info.local_rank, info.local_size)
                        : fmt::format(" (local {})", info.local_rank);
  }
  info.summary += info.root_address.empty() ? ", file rendezvous " + info.rendezvous_file
                                            : ", root " + info.root_address;
  return info;
}

EnvMap process_environment() {
  EnvMap env;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    std::string_view entry(*e);
    const auto eq = entry.find('=');
    if (eq == std::string_view::npos) continue;
    env.emplace(std::string(entry.substr(0, eq)), std::string(entry.substr(eq + 1)));
  }
  return env;
}

}  // namespace wia::bootstrap
