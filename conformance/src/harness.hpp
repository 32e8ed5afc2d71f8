// SPDX-License-Identifier: Apache-2.0
// The conformance harness: a provider loaded by dlopen, a host-services
// table of our own (the suite must not depend on libwia's loader, so that a
// vendor can test a provider against the ABI alone), and the test registry.
//
// Every test runs in a forked child. The child initialises the provider
// itself (init in the parent would start provider threads, and a fork of a
// threaded process may inherit held locks), reports progress and the result
// through a pipe, and _exits. The parent only reads the descriptor.
#pragma once

#include <wia/provider.h>

#include <cstdint>
#include <functional>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

namespace wia::conformance {

// Options that tests can see.
struct Options {
  std::string provider_path;
  int max_level = 5;
  std::string filter = "*";
  int device = 0;
  int endpoint = 0;  // transport endpoint for L4 (--endpoint)
  double timeout_scale = 1.0;
  wia_log_level_t log_level = WIA_LOG_WARN;
  std::map<std::string, std::string> params;  // --param key=value
};

// A failed expectation inside a test; caught by the child runner.
struct Failure : std::runtime_error {
  using std::runtime_error::runtime_error;
};
// Thrown to end a test as skipped (a capability or device is missing).
struct Skip : std::runtime_error {
  using std::runtime_error::runtime_error;
};

class Context;

struct TestCase {
  std::string id;      // "L1.memcpy.d2h_pattern"
  int level = 0;       // 0..5
  int timeout_ms = 0;  // before --timeout-scale
  std::string what;    // one line for --list and docs/conformance.md
  std::function<void(Context&)> body;
  // Set for placeholders of what the suite cannot test yet: never run,
  // always reported as SKIP with this reason.
  std::string not_implemented;
};

std::vector<TestCase>& registry();
void register_l0_tests();
void register_l1_tests();
void register_l2_tests();
void register_l3_tests();
void register_l4_tests(const wia_provider_v1_t* desc);
void register_l5_tests(const wia_provider_v1_t* desc);

// Text of a status code: "WIA_ERROR_OUT_OF_MEMORY (-3)".
std::string status_text(wia_status_t st);
// "%zu"-free size text: "64 MiB", "4095 B".
std::string size_text(std::uint64_t bytes);

// What a test body sees. Lives in the child only.
class Context {
 public:
  Context(const Options& opts, const wia_provider_v1_t* desc, int result_fd);
  ~Context();
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

  const Options& options() const { return opts_; }
  const wia_provider_v1_t& desc() const { return *desc_; }
  const wia_device_ops_v1_t& dev_ops() const;  // Skip when the provider has no device table
  bool has_cap(std::uint64_t device_cap) const;
  void require_cap(std::uint64_t device_cap, const char* name) const;
  // Skip when the provider has no transport table.
  const wia_transport_ops_v1_t& tp_ops() const;

  // The host-services table handed to init; set_params_visible(false) makes
  // get_param answer NULL for everything (L0.unknown_param).
  const wia_host_services_v1_t* host() { return &host_; }
  void set_params_visible(bool visible) { params_visible_ = visible; }

  // init() with this context's host services; Skip when the provider says
  // WIA_ERROR_UNAVAILABLE (hardware absent is not a conformance failure).
  void* init();
  void fini();  // idempotent; the destructor calls it too
  // Releases what the helpers below created, then fini(): the end of a
  // passing test, where a failing fini is a failure of the test.
  void finish();
  void* ctx() const { return provider_ctx_; }

  // Device count and the --device index, Skip when it does not exist.
  int device_count();
  int device();
  // Skip unless the provider has at least n devices.
  void require_devices(int n);

  // Progress note sent to the parent, shown if the test crashes or hangs.
  void step(const std::string& text);

  // Fails unless st == WIA_SUCCESS, naming the call and the provider's
  // set_error message.
  void ok(wia_status_t st, const std::string& call);
  // Fails unless `cond`; expected/got go to the report.
  void expect(bool cond, const std::string& expected, const std::string& got);
  [[noreturn]] void fail(const std::string& message);

  // The set_error text the calling thread recorded since the last call.
  std::string take_error();

  // Device memory released by the destructor (after the provider's work is
  // synchronised by the test), so a failing test does not leak.
  void* alloc(std::uint64_t size, int dev = -1, std::uint32_t kind = WIA_MEM_DEVICE);
  void free(void* ptr, int dev = -1);
  void to_device(void* dst, const void* src, std::uint64_t size, int dev = -1);
  void to_host(void* dst, const void* src, std::uint64_t size, int dev = -1);

  // Streams and events destroyed by the destructor.
  wia_provider_stream_t stream(int dev = -1);
  wia_provider_event_t event(int dev = -1);
  void sync(wia_provider_stream_t s);

  // The timeout of the running test, scaled.
  int timeout_ms() const { return timeout_ms_; }
  void set_timeout_ms(int ms);
  // The same, with an explicit deadline (a peer process shares its test's).
  void set_timeout_ms(int ms, double deadline_ms);
  // Milliseconds left before the harness kills this test (monotonic clock,
  // counted from set_timeout_ms).
  double ms_left() const;

  // Writes the result record to the parent (child runner only); releases
  // nothing (see run_child).
  void report(char verdict, const std::string& message);

 private:
  static void log_cb(void* host_ctx, wia_log_level_t level, const char* message);
  static void set_error_cb(void* host_ctx, const char* message);
  static const char* get_param_cb(void* host_ctx, const char* key);
  static std::uint64_t clock_cb(void* host_ctx);
  void write_record(char tag, const std::string& text);
  bool send_record(const std::string& record, bool wait);
  void release_all() noexcept;

  const Options& opts_;
  const wia_provider_v1_t* desc_;
  int result_fd_;
  std::string pending_step_;  // a step that found the results pipe full
  wia_host_services_v1_t host_{};
  bool params_visible_ = true;
  std::map<std::string, std::string> param_values_;  // declared keys -> value
  void* provider_ctx_ = nullptr;
  bool initialised_ = false;
  int timeout_ms_ = 0;
  double deadline_ms_ = 0;  // CLOCK_MONOTONIC
  struct Owned {
    void* ptr;
    int dev;
  };
  std::vector<Owned> allocations_;
  std::vector<wia_provider_stream_t> streams_;
  std::vector<wia_provider_event_t> events_;
};

// Deterministic byte pattern for buffer checks: different for every seed
// and offset, never constant over a run of 256 bytes.
inline std::uint8_t pattern_byte(std::uint64_t i, std::uint32_t seed) {
  std::uint64_t x = (i + 1) * 0x9E3779B97F4A7C15ull ^ (static_cast<std::uint64_t>(seed) << 32);
  x ^= x >> 29;
  return static_cast<std::uint8_t>(x ^ (x >> 8));
}
void fill_pattern(std::uint8_t* p, std::uint64_t size, std::uint32_t seed, std::uint64_t from = 0);
// Empty when p[0, size) holds the pattern starting at index `from`; else a
// description of the first mismatch.
std::string check_pattern(const std::uint8_t* p, std::uint64_t size, std::uint32_t seed,
                          std::uint64_t from = 0);
std::string check_fill(const std::uint8_t* p, std::uint64_t size, std::uint8_t value);

// CLOCK_MONOTONIC in milliseconds.
double monotonic_ms();

}  // namespace wia::conformance
