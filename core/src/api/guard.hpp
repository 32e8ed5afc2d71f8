// SPDX-License-Identifier: Apache-2.0
// The one guard every exported C function runs its body in: exceptions
// become a status plus the calling thread's last-error message, so nothing
// escapes the C boundary and every failure explains itself.
#pragma once

#include <wia/status.h>

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

// Throws INVALID_ARGUMENT "<what> is NULL" when p is null.
inline void require_non_null(const void* p, const char* what) {
  if (p == nullptr) throw Error(WIA_ERROR_INVALID_ARGUMENT, std::string(what) + " is NULL");
}

}  // namespace wia::api
