// SPDX-License-Identifier: Apache-2.0
#include "harness.hpp"

#include <poll.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>

namespace wia::conformance {
namespace {

// set_error is per calling thread (provider.h); a provider's worker threads
// may call it too, harmlessly, into their own slot.
thread_local std::string t_last_error;

const char* const kLevelNames[] = {"trace", "debug", "info", "warn", "error"};

}  // namespace

std::vector<TestCase>& registry() {
  static std::vector<TestCase> tests;
  return tests;
}

std::string status_text(wia_status_t st) {
  static const char* const kNames[] = {"WIA_SUCCESS",
                                       "WIA_ERROR_INVALID_ARGUMENT",
                                       "WIA_ERROR_NOT_SUPPORTED",
                                       "WIA_ERROR_OUT_OF_MEMORY",
                                       "WIA_ERROR_INVALID_DEVICE",
                                       "WIA_ERROR_INVALID_HANDLE",
                                       "WIA_ERROR_NOT_INITIALIZED",
                                       "WIA_ERROR_UNAVAILABLE",
                                       "WIA_ERROR_ABI_MISMATCH",
                                       "WIA_ERROR_TIMEOUT",
                                       "WIA_ERROR_REMOTE",
                                       "WIA_ERROR_MISMATCH",
                                       "WIA_ERROR_CONFIG",
                                       "WIA_ERROR_IO",
                                       "WIA_ERROR_INTERNAL",
                                       "WIA_ERROR_ABORTED",
                                       "WIA_ERROR_CORRUPT"};
  const char* name = "unknown status";
  if (st == WIA_IN_PROGRESS)
    name = "WIA_IN_PROGRESS";
  else if (st <= 0 && st >= -16)
    name = kNames[-st];
  return std::string(name) + " (" + std::to_string(st) + ")";
}

std::string size_text(std::uint64_t bytes) {
  char buf[64];
  if (bytes >= (1ull << 30) && bytes % (1ull << 30) == 0)
    std::snprintf(buf, sizeof(buf), "%" PRIu64 " GiB", bytes >> 30);
  else if (bytes >= (1ull << 20) && bytes % (1ull << 20) == 0)
    std::snprintf(buf, sizeof(buf), "%" PRIu64 " MiB", bytes >> 20);
  else if (bytes >= (1ull << 10) && bytes % (1ull << 10) == 0)
    std::snprintf(buf, sizeof(buf), "%" PRIu64 " KiB", bytes >> 10);
  else
    std::snprintf(buf, sizeof(buf), "%" PRIu64 " B", bytes);
  return buf;
}

void fill_pattern(std::uint8_t* p, std::uint64_t size, std::uint32_t seed, std::uint64_t from) {
  for (std::uint64_t i = 0; i < size; ++i) p[i] = pattern_byte(from + i, seed);
}

std::string check_pattern(const std::uint8_t* p, std::uint64_t size, std::uint32_t seed,
                          std::uint64_t from) {
  for (std::uint64_t i = 0; i < size; ++i) {
    const std::uint8_t want = pattern_byte(from + i, seed);
    if (p[i] != want) {
      std::uint64_t bad = 0;
      for (std::uint64_t j = i; j < size; ++j) bad += p[j] != pattern_byte(from + j, seed);
      char buf[160];
      std::snprintf(buf, sizeof(buf),
                    "byte %" PRIu64 " of %" PRIu64 " is 0x%02x, expected 0x%02x (%" PRIu64
                    " wrong bytes from there)",
                    i, size, p[i], want, bad);
      return buf;
    }
  }
  return {};
}

std::string check_fill(const std::uint8_t* p, std::uint64_t size, std::uint8_t value) {
  for (std::uint64_t i = 0; i < size; ++i) {
    if (p[i] != value) {
      char buf[128];
      std::snprintf(buf, sizeof(buf), "byte %" PRIu64 " of %" PRIu64 " is 0x%02x, expected 0x%02x",
                    i, size, p[i], value);
      return buf;
    }
  }
  return {};
}

Context::Context(const Options& opts, const wia_provider_v1_t* desc, int result_fd)
    : opts_(opts), desc_(desc), result_fd_(result_fd) {
  host_.struct_size = sizeof(host_);
  host_.abi_version = WIA_HOST_SERVICES_VERSION;
  host_.host_ctx = this;
  host_.log = log_cb;
  host_.set_error = set_error_cb;
  host_.get_param = get_param_cb;
  host_.clock_ns = clock_cb;
  // Declared parameters answer with --param or their declared default, as
  // the core would after validating its YAML; undeclared keys answer NULL.
  if (desc_->params != nullptr && desc_->num_params > 0 && desc_->params[0].struct_size > 0) {
    const auto* base = reinterpret_cast<const unsigned char*>(desc_->params);
    const std::size_t stride = desc_->params[0].struct_size;
    for (std::uint32_t i = 0; i < desc_->num_params; ++i) {
      const auto* decl = reinterpret_cast<const wia_param_decl_v1_t*>(base + i * stride);
      if (decl->key == nullptr) continue;
      const auto given = opts_.params.find(decl->key);
      param_values_[decl->key] = given != opts_.params.end()      ? given->second
                                 : decl->default_value != nullptr ? decl->default_value
                                                                  : "";
    }
  }
}

Context::~Context() {
  release_all();
  try {
    fini();
  } catch (...) {
    // A failing fini during unwinding is already past the verdict.
  }
}

void Context::finish() {
  release_all();
  fini();
}

void Context::log_cb(void* host_ctx, wia_log_level_t level, const char* message) {
  auto* self = static_cast<Context*>(host_ctx);
  if (level < self->opts_.log_level || message == nullptr) return;
  const int idx = level >= WIA_LOG_TRACE && level <= WIA_LOG_ERROR ? level : WIA_LOG_ERROR;
  std::fprintf(stderr, "[%s %s] %s\n", self->desc_->name != nullptr ? self->desc_->name : "?",
               kLevelNames[idx], message);
}

void Context::set_error_cb(void*, const char* message) {
  t_last_error = message != nullptr ? message : "";
}

const char* Context::get_param_cb(void* host_ctx, const char* key) {
  auto* self = static_cast<Context*>(host_ctx);
  if (!self->params_visible_ || key == nullptr) return nullptr;
  const auto it = self->param_values_.find(key);
  return it != self->param_values_.end() ? it->second.c_str() : nullptr;
}

std::uint64_t Context::clock_cb(void*) {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<std::uint64_t>(ts.tv_sec) * 1000000000ull +
         static_cast<std::uint64_t>(ts.tv_nsec);
}

double monotonic_ms() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<double>(ts.tv_sec) * 1e3 + static_cast<double>(ts.tv_nsec) / 1e6;
}

void Context::set_timeout_ms(int ms) {
  timeout_ms_ = ms;
  deadline_ms_ = monotonic_ms() + ms;
}

void Context::set_timeout_ms(int ms, double deadline_ms) {
  timeout_ms_ = ms;
  deadline_ms_ = deadline_ms;
}

double Context::ms_left() const { return deadline_ms_ - monotonic_ms(); }

const wia_transport_ops_v1_t& Context::tp_ops() const {
  if ((desc_->caps & WIA_PROVIDER_CAP_TRANSPORT) == 0 || desc_->transport == nullptr)
    throw Skip("the provider has no transport interface");
  return *desc_->transport;
}

const wia_device_ops_v1_t& Context::dev_ops() const {
  if ((desc_->caps & WIA_PROVIDER_CAP_DEVICE) == 0 || desc_->device == nullptr)
    throw Skip("the provider has no device interface");
  return *desc_->device;
}

bool Context::has_cap(std::uint64_t device_cap) const { return (dev_ops().caps & device_cap) != 0; }

void Context::require_cap(std::uint64_t device_cap, const char* name) const {
  if (!has_cap(device_cap)) throw Skip(std::string("provider does not claim ") + name);
}

void* Context::init() {
  if (initialised_) return provider_ctx_;
  // A descriptor without init (L0.required_entries fails for it) would
  // only crash every later test; say so once per test instead.
  if (desc_->init == nullptr || desc_->fini == nullptr)
    fail("the descriptor has no init or fini entry: the provider cannot be initialised");
  step("init");
  take_error();
  const wia_status_t st = desc_->init(&host_, &provider_ctx_);
  if (st == WIA_ERROR_UNAVAILABLE) throw Skip("init: provider unavailable here: " + take_error());
  ok(st, "init");
  initialised_ = true;
  return provider_ctx_;
}

void Context::fini() {
  if (!initialised_) return;
  initialised_ = false;
  step("fini");
  const wia_status_t st = desc_->fini(provider_ctx_);
  provider_ctx_ = nullptr;
  ok(st, "fini");
}

int Context::device_count() {
  init();
  std::int32_t n = -1;
  ok(dev_ops().device_count(provider_ctx_, &n), "device_count");
  return n;
}

int Context::device() {
  const int n = device_count();
  if (opts_.device < 0 || opts_.device >= n)
    throw Skip("no device " + std::to_string(opts_.device) + " (the provider has " +
               std::to_string(n) + ")");
  return opts_.device;
}

void Context::require_devices(int n) {
  const int have = device_count();
  if (have < n)
    throw Skip("needs " + std::to_string(n) + " devices, the provider has " + std::to_string(have));
}

void Context::step(const std::string& text) { write_record('P', text); }

std::string Context::take_error() {
  std::string e;
  e.swap(t_last_error);
  return e;
}

void Context::ok(wia_status_t st, const std::string& call) {
  if (st == WIA_SUCCESS) {
    take_error();
    return;
  }
  std::string msg = call + " returned " + status_text(st);
  const std::string err = take_error();
  if (!err.empty()) msg += ": " + err;
  throw Failure("expected: WIA_SUCCESS from " + call + "\n     got: " + msg);
}

void Context::expect(bool cond, const std::string& expected, const std::string& got) {
  if (!cond) throw Failure("expected: " + expected + "\n     got: " + got);
}

void Context::fail(const std::string& message) { throw Failure(message); }

void* Context::alloc(std::uint64_t size, int dev, std::uint32_t kind) {
  if (dev < 0) dev = device();
  void* p = nullptr;
  step("mem_alloc(" + size_text(size) + ") on device " + std::to_string(dev));
  ok(dev_ops().mem_alloc(provider_ctx_, dev, size, kind, &p),
     "mem_alloc(" + size_text(size) + ", device " + std::to_string(dev) + ")");
  expect(p != nullptr, "a non-NULL pointer from mem_alloc(" + size_text(size) + ")", "NULL");
  allocations_.push_back({p, dev});
  return p;
}

void Context::free(void* ptr, int dev) {
  if (dev < 0) dev = device();
  for (auto it = allocations_.begin(); it != allocations_.end(); ++it) {
    if (it->ptr == ptr) {
      allocations_.erase(it);
      break;
    }
  }
  step("mem_free on device " + std::to_string(dev));
  ok(dev_ops().mem_free(provider_ctx_, dev, ptr), "mem_free(device " + std::to_string(dev) + ")");
}

void Context::to_device(void* dst, const void* src, std::uint64_t size, int dev) {
  if (dev < 0) dev = device();
  step("memcpy host->device " + size_text(size));
  ok(dev_ops().memcpy(provider_ctx_, dev, dst, src, size),
     "memcpy(host -> device " + std::to_string(dev) + ", " + size_text(size) + ")");
}

void Context::to_host(void* dst, const void* src, std::uint64_t size, int dev) {
  if (dev < 0) dev = device();
  step("memcpy device->host " + size_text(size));
  ok(dev_ops().memcpy(provider_ctx_, dev, dst, src, size),
     "memcpy(device " + std::to_string(dev) + " -> host, " + size_text(size) + ")");
}

wia_provider_stream_t Context::stream(int dev) {
  if (dev < 0) dev = device();
  wia_provider_stream_t s = nullptr;
  step("stream_create on device " + std::to_string(dev));
  ok(dev_ops().stream_create(provider_ctx_, dev, &s),
     "stream_create(device " + std::to_string(dev) + ")");
  expect(s != nullptr, "a stream handle from stream_create", "NULL");
  streams_.push_back(s);
  return s;
}

wia_provider_event_t Context::event(int dev) {
  if (dev < 0) dev = device();
  wia_provider_event_t e = nullptr;
  step("event_create on device " + std::to_string(dev));
  ok(dev_ops().event_create(provider_ctx_, dev, &e),
     "event_create(device " + std::to_string(dev) + ")");
  expect(e != nullptr, "an event handle from event_create", "NULL");
  events_.push_back(e);
  return e;
}

void Context::sync(wia_provider_stream_t s) {
  step("stream_synchronize");
  ok(dev_ops().stream_synchronize(provider_ctx_, s), "stream_synchronize");
}

void Context::release_all() noexcept {
  if (!initialised_ || desc_->device == nullptr) return;
  const wia_device_ops_v1_t& ops = *desc_->device;
  // Streams first: stream_destroy waits for enqueued work that may still
  // use the events and buffers below.
  for (auto s : streams_) ops.stream_destroy(provider_ctx_, s);
  for (auto e : events_) ops.event_destroy(provider_ctx_, e);
  for (auto& a : allocations_) ops.mem_free(provider_ctx_, a.dev, a.ptr);
  streams_.clear();
  events_.clear();
  allocations_.clear();
}

void Context::report(char verdict, const std::string& message) { write_record(verdict, message); }

void Context::write_record(char tag, const std::string& text) {
  if (result_fd_ < 0) return;
  // Records are "<tag><length>:<text>" so messages may hold newlines. The
  // parent reassembles records from the byte stream, so a record split
  // across writes is fine.
  std::string rec(1, tag);
  rec += std::to_string(text.size());
  rec += ':';
  rec += text;
  if (tag == 'P') {
    // A step is a breadcrumb: only the last one is ever shown (where a
    // test hung or crashed). A pair's peer writes into a pipe that its
    // parent reads only after its own side of the test (run_pair), so
    // there the pipe can fill; blocking on it would stop the peer driving
    // its transfers, and the pair would hang. A step that finds no room
    // waits here instead, replaced by any newer one.
    if (send_record(rec, false))
      pending_step_.clear();
    else
      pending_step_ = std::move(rec);
    return;
  }
  if (!pending_step_.empty()) send_record(pending_step_, true);
  pending_step_.clear();
  send_record(rec, true);
}

// False only when !wait and the pipe had no room for any of it.
bool Context::send_record(const std::string& record, bool wait) {
  const char* p = record.data();
  std::size_t left = record.size();
  while (left > 0) {
    const ssize_t n = ::write(result_fd_, p, left);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      if (!wait && left == record.size()) return false;
      // Part of it is out (the rest must follow: the reader parses a
      // stream), or a verdict, which the parent reads before it gives up.
      pollfd pfd{result_fd_, POLLOUT, 0};
      ::poll(&pfd, 1, 100);
      continue;
    }
    if (n <= 0) return true;  // the reader is gone: nobody to tell
    p += n;
    left -= static_cast<std::size_t>(n);
  }
  return true;
}

}  // namespace wia::conformance
