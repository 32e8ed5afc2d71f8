// SPDX-License-Identifier: Apache-2.0
// The one guard every exported C function runs its body in: exceptions
// become a status plus the calling thread's last-error message, so nothing
// escapes the C boundary and every failure explains itself.
#pragma once

#include <wia/wia.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <utility>

#include "common/error.hpp"

namespace wia::api {

// Records "function: message" as this thread's last error and returns status.
wia_status_t fail(const char* function, wia_status_t status, const std::string& message) noexcept;
// This thread's last error text ("" when none).
const char* t_last_error_cstr() noexcept;
// Converts the active exception into a status (call inside catch(...)).
wia_status_t fail_current_exception(const char* function) noexcept;

template <typename Body>
wia_status_t guard(const char* function, Body&& body) noexcept {
  try {
    if constexpr (std::is_void_v<std::invoke_result_t<Body>>) {
      std::forward<Body>(body)();
      return WIA_SUCCESS;
    } else {
      return std::forward<Body>(body)();
    }
  } catch (...) {
    return fail_current_exception(function);
  }
}

// An enum argument as its integer value. Reading a C enum object that
// holds an out-of-range value is undefined in C++, and callers in C can
// pass anything, so arguments are copied out as integers first.
template <typename E>
std::int32_t raw_enum(const E& e) noexcept {
  static_assert(sizeof(E) == sizeof(std::int32_t), "C enums are int-sized here");
  std::int32_t v;
  std::memcpy(&v, &e, sizeof v);
  return v;
}
// The enum value when it lies in [0, count); INVALID_ARGUMENT naming
// `what` otherwise.
template <typename E>
E checked_enum(const E& e, std::int32_t count, const char* what) {
  const std::int32_t v = raw_enum(e);
  if (v < 0 || v >= count)
    throw Error(WIA_ERROR_INVALID_ARGUMENT, std::string(what) + " " + std::to_string(v) +
                                                " is out of range [0, " + std::to_string(count) +
                                                ")");
  return static_cast<E>(v);
}

// Communicators (api_coll.cpp): destroy one after draining it, and destroy
// every live one (wia_finalize, before devices go away).
void destroy_communicator(struct wia_communicator_s* comm);
void destroy_all_communicators() noexcept;
// Profiling (api_profiling.cpp): while a communicator profiles, wraps a host
// function so its run is timed as compute (true when it did), on the
// timeline's track of `stream` (wia_stream_s::track()); the wrapper's
// state when posting it failed.
bool profile_host_fn(wia_device_t device, std::uint32_t stream, void (**fn)(void*),
                     void** user_data);
void discard_profiled_host_fn(void* user_data) noexcept;
// While a communicator analyses overlap, work the API puts on a stream
// (kernels, asynchronous copies and sets) is compute too: two host
// functions on the stream bracket it and record when it ran. Construct
// before posting the work, call posted() once it is on the stream; a
// bracket whose work failed to post records nothing. Nothing at all when
// no communicator profiles or the stream's device runs no host functions.
// `what` is the timeline's name (static storage, or interned).
class ComputeBracket {
 public:
  ComputeBracket(wia_stream_t stream, const char* what);
  ~ComputeBracket();
  ComputeBracket(const ComputeBracket&) = delete;
  ComputeBracket& operator=(const ComputeBracket&) = delete;
  void posted() noexcept { posted_ = true; }

 private:
  ::wia_stream_s* stream_ = nullptr;
  void* run_ = nullptr;  // the marks' shared record, owned by the end mark
  bool posted_ = false;
};
// The name `kernel <name>` in storage that lives as long as the process.
const char* kernel_compute_name(const std::string& kernel);
// A communicator going away stops counting in that switch.
}  // namespace wia::api
namespace wia::comm {
class CommunicatorBase;
}
namespace wia::api {
void forget_profiling(comm::CommunicatorBase& c) noexcept;
// WIA_TRACE: writes the timeline of a communicator being destroyed, once its
// operations have drained; a failure is logged, not returned.
void write_trace_at_destroy(comm::CommunicatorBase& c) noexcept;
// Waits for checkpoint saves still being written (api_checkpoint.cpp).
void wait_for_pending_checkpoints() noexcept;
// Drops the compression residuals and errors of a communicator (api_compress.cpp).
void forget_compression_state(const void* comm) noexcept;

// Throws INVALID_ARGUMENT "<what> is NULL" when p is null.
inline void require_non_null(const void* p, const char* what) {
  if (p == nullptr) throw Error(WIA_ERROR_INVALID_ARGUMENT, std::string(what) + " is NULL");
}

}  // namespace wia::api
