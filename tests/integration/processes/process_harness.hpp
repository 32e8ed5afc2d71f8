// SPDX-License-Identifier: Apache-2.0
// The harness of the process tests: fork N ranks that each initialise the
// library and join one job (a unique id handed over in a file, or the
// launcher variables), run a body, and exit with a status the parent
// asserts. The parent never starts the library, so forking stays safe.
#pragma once

#include <dirent.h>
#include <doctest/doctest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>
#include <wia/wia.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace wia::test::processes {

// Exit statuses of a rank.
constexpr int kOk = 0;
constexpr int kWrong = 10;     // a result differed from the reference
constexpr int kApiError = 11;  // an unexpected error
constexpr int kSawError = 12;  // an expected error was reported
constexpr int kNoError = 13;   // an expected error was not reported

using RankBody = std::function<int(int rank, int nranks)>;

inline std::string write_config(const std::string& text) {
  char path[] = "/tmp/wia-proc-test-XXXXXX.yaml";
  const int fd = mkstemps(path, 5);
  if (fd < 0) return {};
  if (write(fd, text.data(), text.size()) != static_cast<ssize_t>(text.size())) return {};
  close(fd);
  return path;
}

// Forks `nranks` processes running `body` after initialising the library
// with `yaml`; returns their exit statuses (-signal when killed). `during`
// runs in the parent while they run (it may kill one).
inline std::vector<int> run_ranks(int nranks, const std::string& yaml, const RankBody& body,
                                  const std::vector<std::pair<std::string, std::string>>& env = {},
                                  const std::function<void(std::vector<pid_t>&)>& during = {},
                                  int limit_s = 120,
                                  const std::function<void(int rank)>& before_init = {}) {
  const std::string cfg = write_config(yaml);
  std::vector<pid_t> pids;
  for (int r = 0; r < nranks; ++r) {
    const pid_t pid = fork();
    if (pid == 0) {
      for (auto& [k, v] : env) setenv(k.c_str(), v.c_str(), 1);
      if (before_init) before_init(r);
      if (wia_init_with_config(cfg.c_str()) != WIA_SUCCESS) {
        std::fprintf(stderr, "rank %d: init: %s\n", r, wia_get_last_error());
        _exit(kApiError);
      }
      const int rc = body(r, nranks);
      wia_finalize();
      _exit(rc);
    }
    pids.push_back(pid);
  }
  if (during) during(pids);
  std::vector<int> status(nranks, -999);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(limit_s);
  int left = nranks;
  while (left > 0) {
    for (int r = 0; r < nranks; ++r) {
      if (status[r] != -999) continue;
      int st = 0;
      if (waitpid(pids[r], &st, WNOHANG) == pids[r]) {
        status[r] = WIFEXITED(st) ? WEXITSTATUS(st) : -WTERMSIG(st);
        --left;
      }
    }
    if (left == 0) break;
    if (std::chrono::steady_clock::now() > deadline) {
      for (int r = 0; r < nranks; ++r)
        if (status[r] == -999)
          kill(pids[r], SIGKILL), waitpid(pids[r], nullptr, 0), status[r] = -1000;
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  std::remove(cfg.c_str());
  for (auto& [k, v] : env)
    if (k == "TEST_WIA_ID") std::remove(v.c_str());
  return status;
}

// The unique id is made by rank 0 (wia_get_unique_id) and handed to the
// others through a file, as an application would through MPI or a store:
// the test process itself starts no thread, so forking stays safe (a
// sanitizer's allocator is not fork-safe with threads running).
inline std::string unique_id_env() {
  char path[] = "/tmp/wia-proc-id-XXXXXX";
  const int fd = mkstemp(path);
  if (fd >= 0) close(fd);
  std::remove(path);
  return path;
}

inline std::string to_hex(const wia_unique_id_t& id) {
  std::string hex;
  for (int i = 0; i < WIA_UNIQUE_ID_BYTES; ++i) {
    char h[3];
    std::snprintf(h, sizeof(h), "%02x", static_cast<unsigned char>(id.internal[i]));
    hex += h;
  }
  return hex;
}

inline wia_unique_id_t parse_id(const std::string& hex) {
  wia_unique_id_t id{};
  for (int i = 0; i < WIA_UNIQUE_ID_BYTES; ++i) {
    unsigned v = 0;
    std::sscanf(hex.c_str() + 2 * i, "%2x", &v);
    id.internal[i] = static_cast<char>(v);
  }
  return id;
}

// Rank 0 publishes the id; the others wait for the file (bounded).
inline bool exchange_id(int rank, const std::string& path, wia_unique_id_t* id) {
  if (rank == 0) {
    if (wia_get_unique_id(id) != WIA_SUCCESS) return false;
    const std::string tmp = path + ".tmp";
    FILE* f = std::fopen(tmp.c_str(), "w");
    if (!f) return false;
    std::fputs(to_hex(*id).c_str(), f);
    std::fclose(f);
    return std::rename(tmp.c_str(), path.c_str()) == 0;
  }
  for (int i = 0; i < 6000; ++i) {
    if (FILE* f = std::fopen(path.c_str(), "r")) {
      char buf[2 * WIA_UNIQUE_ID_BYTES + 1] = {};
      const std::size_t n = std::fread(buf, 1, sizeof(buf) - 1, f);
      std::fclose(f);
      if (n == 2 * WIA_UNIQUE_ID_BYTES) {
        *id = parse_id(buf);
        return true;
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return false;
}

// Joins the job: through the unique id in TEST_WIA_ID when set, else the
// launcher variables.
inline wia_communicator_t join(int rank, int nranks) {
  wia_communicator_t comm = nullptr;
  wia_status_t st;
  if (const char* path = std::getenv("TEST_WIA_ID")) {
    wia_unique_id_t id;
    if (!exchange_id(rank, path, &id)) {
      std::fprintf(stderr, "rank %d: no unique id in %s\n", rank, path);
      return nullptr;
    }
    st = wia_create_communicator_from_id(&id, nranks, rank, &comm);
  } else {
    st = wia_create_distributed_communicator(nullptr, &comm);
  }
  if (st != WIA_SUCCESS) {
    std::fprintf(stderr, "rank %d: create: %s\n", rank, wia_get_last_error());
    return nullptr;
  }
  return comm;
}

inline std::string base_yaml(int timeout_ms = 20000) {
  return "host:\n  devices: 1\ncollectives:\n  timeout_ms: " + std::to_string(timeout_ms) + "\n";
}

inline void check_all(const std::vector<int>& st, int want = kOk) {
  for (std::size_t r = 0; r < st.size(); ++r) {
    INFO("rank " << r);
    CHECK(st[r] == want);
  }
}

// What a shell command printed on stdout (a tool the test runs).
inline std::string run_command(const std::string& cmd) {
  std::string out;
  FILE* p = popen(cmd.c_str(), "r");
  REQUIRE(p != nullptr);
  char buf[4096];
  while (std::size_t n = std::fread(buf, 1, sizeof buf, p)) out.append(buf, n);
  pclose(p);
  return out;
}

// Element i of rank's input: small integers, so float sums are exact.
inline double input(int rank, std::uint64_t i) {
  return static_cast<double>((i * 7 + rank * 13) % 23) - 11;
}

// An in-place all-reduce and a synchronize: their status and the last
// error message.
struct Outcome {
  wia_status_t status;
  std::string message;
};
inline Outcome all_reduce_in_place(wia_communicator_t comm, void* buf, std::size_t count,
                                   const wia_collective_config_t& cfg) {
  wia_all_reduce(comm, buf, buf, count, &cfg, nullptr);
  const wia_status_t s = wia_stream_synchronize(nullptr);
  return {s, wia_get_last_error()};
}

// For a rank whose call had to fail: kNoError if it succeeded, kSawError
// if the error names one of `needles`, kWrong otherwise (what it saw is
// printed either way).
inline int error_naming(int rank, wia_status_t status, const std::string& msg,
                        std::initializer_list<const char*> needles) {
  std::fprintf(stderr, "rank %d saw: %s\n", rank, msg.c_str());
  if (status == WIA_SUCCESS) return kNoError;
  for (const char* n : needles)
    if (msg.find(n) != std::string::npos) return kSawError;
  return kWrong;
}

inline std::vector<std::string> shm_entries() {
  std::vector<std::string> names;
  if (DIR* d = opendir("/dev/shm")) {
    while (dirent* e = readdir(d))
      if (std::strncmp(e->d_name, "wia", 3) == 0) names.push_back(e->d_name);
    closedir(d);
  }
  return names;
}

}  // namespace wia::test::processes
