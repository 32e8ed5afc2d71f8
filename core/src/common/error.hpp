// SPDX-License-Identifier: Apache-2.0
// Errors inside the core: thrown as wia::Error, turned into a status plus a
// per-thread message at the C boundary by api_guard() (api/guard.hpp).
#pragma once

#include <wia/status.h>

#include <stdexcept>
#include <string>

namespace wia {

class Error : public std::runtime_error {
 public:
  Error(wia_status_t status, std::string message)
      : std::runtime_error(std::move(message)), status_(status) {}
  wia_status_t status() const noexcept { return status_; }

 private:
  wia_status_t status_;
};

// Short name of a status ("WIA_ERROR_TIMEOUT") and its meaning.
const char* status_name(wia_status_t status) noexcept;
const char* status_description(wia_status_t status) noexcept;

}  // namespace wia
