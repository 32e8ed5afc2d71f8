// SPDX-License-Identifier: Apache-2.0
// Shared by the shm transport tests and the shm benchmark: loads
// libwia-provider-shm.so through the raw v1 ABI (dlopen + wia_provider_v1,
// as the core does), with a host-services table whose parameters come from
// a map, and small blocking helpers with deadlines over the non-blocking
// entries. Usable in forked children: nothing here talks to doctest.
#pragma once

#include <dlfcn.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>
#include <wia/provider.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace shmtest {

using Params = std::map<std::string, std::string>;
using Clock = std::chrono::steady_clock;

inline const wia_provider_v1_t* descriptor(const std::string& dir) {
  static const wia_provider_v1_t* desc = [&]() -> const wia_provider_v1_t* {
    const std::string path = dir + "/libwia-provider-shm.so";
    void* dl = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (dl == nullptr) {
      std::fprintf(stderr, "dlopen %s: %s\n", path.c_str(), dlerror());
      return nullptr;
    }
    return static_cast<const wia_provider_v1_t*>(dlsym(dl, WIA_PROVIDER_SYMBOL_V1));
  }();
  return desc;
}

inline thread_local std::string t_last_error;

// One initialised provider instance (one per process in the tests).
class Transport {
 public:
  Transport(const wia_provider_v1_t* desc, Params params)
      : desc_(desc), params_(std::move(params)) {
    host_.struct_size = sizeof(host_);
    host_.abi_version = WIA_HOST_SERVICES_VERSION;
    host_.host_ctx = this;
    host_.log = [](void* ctx, wia_log_level_t level, const char* message) {
      auto* self = static_cast<Transport*>(ctx);
      std::lock_guard<std::mutex> lk(self->mu_);
      self->logs_.push_back(std::to_string(level) + ": " + message);
    };
    host_.set_error = [](void*, const char* message) { t_last_error = message; };
    host_.get_param = [](void* ctx, const char* key) -> const char* {
      auto* self = static_cast<Transport*>(ctx);
      auto it = self->params_.find(key);
      if (it != self->params_.end()) return it->second.c_str();
      for (std::uint32_t i = 0; i < self->desc_->num_params; ++i)
        if (std::strcmp(self->desc_->params[i].key, key) == 0)
          return self->desc_->params[i].default_value;
      return nullptr;
    };
    host_.clock_ns = [](void*) -> std::uint64_t {
      return static_cast<std::uint64_t>(
          std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch())
              .count());
    };
    init_status_ = desc_->init(&host_, &ctx_);
    ops_ = desc_->transport;
  }
  ~Transport() {
    if (init_status_ == WIA_SUCCESS) desc_->fini(ctx_);
  }
  Transport(const Transport&) = delete;
  Transport& operator=(const Transport&) = delete;

  wia_status_t init_status() const { return init_status_; }
  void* ctx() const { return ctx_; }
  const wia_transport_ops_v1_t* ops() const { return ops_; }
  std::vector<std::string> logs() {
    std::lock_guard<std::mutex> lk(mu_);
    return logs_;
  }
  // wait() polls this many times between sched_yield()s: tests yield
  // often (they share 2 cores with other jobs), the benchmark rarely.
  std::uint64_t spins_per_yield = 256;
  bool logged(const std::string& needle) {
    for (const auto& l : logs())
      if (l.find(needle) != std::string::npos) return true;
    return false;
  }

  wia_status_t listen(std::uint8_t handle[WIA_TRANSPORT_HANDLE_SIZE], wia_listener_t* l) {
    return ops_->listen(ctx_, 0, handle, l);
  }
  // Drives connect to completion or until the deadline.
  wia_status_t connect(const void* handle, std::uint64_t cookie, wia_conn_t* conn,
                       double seconds = 20) {
    *conn = nullptr;
    const auto deadline = Clock::now() + std::chrono::duration<double>(seconds);
    for (;;) {
      const wia_status_t st = ops_->connect(ctx_, 0, handle, cookie, conn);
      if (st != WIA_IN_PROGRESS) return st;
      if (Clock::now() > deadline) {
        ops_->close(ctx_, *conn);
        *conn = nullptr;
        return WIA_ERROR_TIMEOUT;
      }
      std::this_thread::yield();
    }
  }
  wia_status_t accept(wia_listener_t l, std::uint64_t* cookie, wia_conn_t* conn,
                      double seconds = 20) {
    const auto deadline = Clock::now() + std::chrono::duration<double>(seconds);
    for (;;) {
      const wia_status_t st = ops_->accept(ctx_, l, cookie, conn);
      if (st != WIA_IN_PROGRESS) return st;
      if (Clock::now() > deadline) return WIA_ERROR_TIMEOUT;
      std::this_thread::yield();
    }
  }
  wia_request_t isend(wia_conn_t c, const void* buf, std::uint64_t n, std::uint64_t tag,
                      wia_status_t* st) {
    wia_request_t r = nullptr;
    *st = ops_->isend(ctx_, c, buf, n, tag, nullptr, &r);
    return r;
  }
  wia_request_t irecv(wia_conn_t c, void* buf, std::uint64_t n, std::uint64_t tag,
                      wia_status_t* st) {
    wia_request_t r = nullptr;
    *st = ops_->irecv(ctx_, c, buf, n, tag, nullptr, &r);
    return r;
  }
  // Tests until done; WIA_ERROR_TIMEOUT when the deadline passes first
  // (the request is then still pending).
  wia_status_t wait(wia_request_t r, std::uint64_t* size = nullptr, double seconds = 30) {
    const auto deadline = Clock::now() + std::chrono::duration<double>(seconds);
    std::uint64_t spins = 0;
    for (;;) {
      int32_t done = 0;
      std::uint64_t n = 0;
      const wia_status_t st = ops_->test(ctx_, r, &done, &n);
      if (st < 0 || done) {
        if (size != nullptr) *size = n;
        return st;
      }
      if (++spins % spins_per_yield == 0) {
        if (Clock::now() > deadline) return WIA_ERROR_TIMEOUT;
        std::this_thread::yield();  // 2 cores shared with the peer and other jobs
      }
    }
  }
  wia_status_t send(wia_conn_t c, const void* buf, std::uint64_t n, std::uint64_t tag,
                    double seconds = 30) {
    wia_status_t st;
    wia_request_t r = isend(c, buf, n, tag, &st);
    if (st != WIA_SUCCESS || r == nullptr) return st != WIA_SUCCESS ? st : WIA_ERROR_INTERNAL;
    return wait(r, nullptr, seconds);
  }
  wia_status_t recv(wia_conn_t c, void* buf, std::uint64_t n, std::uint64_t tag,
                    std::uint64_t* got = nullptr, double seconds = 30) {
    wia_status_t st;
    wia_request_t r = irecv(c, buf, n, tag, &st);
    if (st != WIA_SUCCESS || r == nullptr) return st != WIA_SUCCESS ? st : WIA_ERROR_INTERNAL;
    return wait(r, got, seconds);
  }

 private:
  const wia_provider_v1_t* desc_;
  Params params_;
  wia_host_services_v1_t host_{};
  void* ctx_ = nullptr;
  const wia_transport_ops_v1_t* ops_ = nullptr;
  wia_status_t init_status_ = WIA_ERROR_NOT_INITIALIZED;
  std::mutex mu_;
  std::vector<std::string> logs_;
};

// fork() a child that runs `body` and exits with its return value. The
// child is killed by SIGALRM if it runs longer than `seconds`.
inline pid_t spawn(const std::function<int()>& body, unsigned seconds = 120) {
  std::fflush(nullptr);
  const pid_t pid = fork();
  if (pid == 0) {
    alarm(seconds);
    int rc = 99;
    try {
      rc = body();
    } catch (...) {
      rc = 98;
    }
    std::fflush(nullptr);
    _exit(rc);
  }
  return pid;
}

// The child's exit code; -1 if it had to be killed after `seconds`, -2 if
// it died of a signal.
inline int reap(pid_t pid, double seconds = 120) {
  const auto deadline = Clock::now() + std::chrono::duration<double>(seconds);
  for (;;) {
    int status = 0;
    const pid_t got = waitpid(pid, &status, WNOHANG);
    if (got == pid) return WIFEXITED(status) ? WEXITSTATUS(status) : -2;
    if (got < 0) return -3;
    if (Clock::now() > deadline) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      return -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
}

inline bool write_all(int fd, const void* p, std::size_t n) {
  auto* b = static_cast<const char*>(p);
  while (n > 0) {
    const ssize_t w = ::write(fd, b, n);
    if (w <= 0) return false;
    b += w;
    n -= static_cast<std::size_t>(w);
  }
  return true;
}
inline bool read_all(int fd, void* p, std::size_t n) {
  auto* b = static_cast<char*>(p);
  while (n > 0) {
    const ssize_t r = ::read(fd, b, n);
    if (r <= 0) return false;
    b += r;
    n -= static_cast<std::size_t>(r);
  }
  return true;
}

inline std::uint8_t pattern(std::uint64_t i, std::uint64_t seed) {
  return static_cast<std::uint8_t>((i * 131 + seed * 7 + (i >> 12)) & 0xff);
}
inline void fill(std::uint8_t* p, std::uint64_t n, std::uint64_t seed) {
  for (std::uint64_t i = 0; i < n; ++i) p[i] = pattern(i, seed);
}
// Index of the first wrong byte, or n when all are right.
inline std::uint64_t first_mismatch(const std::uint8_t* p, std::uint64_t n, std::uint64_t seed) {
  for (std::uint64_t i = 0; i < n; ++i)
    if (p[i] != pattern(i, seed)) return i;
  return n;
}

}  // namespace shmtest
