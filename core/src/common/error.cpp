// SPDX-License-Identifier: Apache-2.0
#include "common/error.hpp"

namespace wia {

namespace {
struct StatusText {
  wia_status_t status;
  const char* name;
  const char* description;
};
constexpr StatusText kStatusTexts[] = {
    {WIA_SUCCESS, "WIA_SUCCESS", "success"},
    {WIA_IN_PROGRESS, "WIA_IN_PROGRESS", "operation in progress"},
    {WIA_ERROR_INVALID_ARGUMENT, "WIA_ERROR_INVALID_ARGUMENT", "invalid argument"},
    {WIA_ERROR_NOT_SUPPORTED, "WIA_ERROR_NOT_SUPPORTED", "operation not supported"},
    {WIA_ERROR_OUT_OF_MEMORY, "WIA_ERROR_OUT_OF_MEMORY", "out of memory"},
    {WIA_ERROR_INVALID_DEVICE, "WIA_ERROR_INVALID_DEVICE", "invalid device"},
    {WIA_ERROR_INVALID_HANDLE, "WIA_ERROR_INVALID_HANDLE", "invalid or destroyed handle"},
    {WIA_ERROR_NOT_INITIALIZED, "WIA_ERROR_NOT_INITIALIZED", "not initialized"},
    {WIA_ERROR_UNAVAILABLE, "WIA_ERROR_UNAVAILABLE", "hardware or driver unavailable"},
    {WIA_ERROR_ABI_MISMATCH, "WIA_ERROR_ABI_MISMATCH", "provider ABI version mismatch"},
    {WIA_ERROR_TIMEOUT, "WIA_ERROR_TIMEOUT", "timed out"},
    {WIA_ERROR_REMOTE, "WIA_ERROR_REMOTE", "remote peer failed or misbehaved"},
    {WIA_ERROR_MISMATCH, "WIA_ERROR_MISMATCH", "ranks called mismatched operations"},
    {WIA_ERROR_CONFIG, "WIA_ERROR_CONFIG", "invalid configuration"},
    {WIA_ERROR_IO, "WIA_ERROR_IO", "I/O error"},
    {WIA_ERROR_INTERNAL, "WIA_ERROR_INTERNAL", "internal error"},
    {WIA_ERROR_ABORTED, "WIA_ERROR_ABORTED", "aborted"},
    {WIA_ERROR_CORRUPT, "WIA_ERROR_CORRUPT", "stored data is damaged"},
};

const StatusText* find(wia_status_t status) {
  for (const auto& t : kStatusTexts)
    if (t.status == status) return &t;
  return nullptr;
}
}  // namespace

const char* status_name(wia_status_t status) noexcept {
  const StatusText* t = find(status);
  return t ? t->name : "WIA_ERROR_UNKNOWN";
}

const char* status_description(wia_status_t status) noexcept {
  const StatusText* t = find(status);
  return t ? t->description : "unknown status code";
}

}  // namespace wia
