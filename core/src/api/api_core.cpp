// SPDX-License-Identifier: Apache-2.0
// Library lifetime, errors and devices.
#include <wia/wia.h>

#include <cstring>
#include <new>
#include <string>

#include <fmt/format.h>

#include "api/guard.hpp"
#include "bootstrap/hosted_roots.hpp"
#include "common/error.hpp"
#include "common/log.hpp"
#include "runtime/objects.hpp"
#include "runtime/runtime.hpp"

namespace wia::api {

namespace {
thread_local std::string t_last_error;
}

const char* t_last_error_cstr() noexcept { return t_last_error.c_str(); }

wia_status_t fail(const char* function, wia_status_t status, const std::string& message) noexcept {
  try {
    t_last_error = std::string(function) + ": " + message;
    log::debug("api", "{} -> {}", t_last_error, status_name(status));
  } catch (...) {
  }
  return status;
}

wia_status_t fail_current_exception(const char* function) noexcept {
  try {
    throw;
  } catch (const Error& e) {
    return fail(function, e.status(), e.what());
  } catch (const std::bad_alloc&) {
    return fail(function, WIA_ERROR_OUT_OF_MEMORY, "host memory exhausted");
  } catch (const std::exception& e) {
    return fail(function, WIA_ERROR_INTERNAL, std::string("internal error: ") + e.what());
  } catch (...) {
    return fail(function, WIA_ERROR_INTERNAL, "internal error: unknown exception");
  }
}

}  // namespace wia::api

using namespace wia;

extern "C" {

WIA_API wia_status_t wia_init(void) {
  return api::guard(__func__, [] { Runtime::get(); });
}

WIA_API wia_status_t wia_init_with_config(const char* yaml_path) {
  return api::guard(__func__, [&] {
    api::require_non_null(yaml_path, "yaml_path");
    Runtime::init(yaml_path);
  });
}

WIA_API wia_status_t wia_finalize(void) {
  return api::guard(__func__, [] {
    if (!Runtime::initialized()) return;
    api::wait_for_pending_checkpoints();  // their staging copies run on streams
    api::destroy_all_communicators();  // they hold device memory and stream tasks on streams
    // The bootstrap roots this process hosted for those communicators have
    // finished with them: join their threads rather than leave them to exit.
    bootstrap::reap_finished_hosted_roots();
    Runtime::finalize();
  });
}

WIA_API const char* wia_status_string(wia_status_t status) {
  // Static storage per known code; unknown codes share one text.
  static thread_local std::string text;
  text = std::string(status_name(status)) + ": " + status_description(status);
  return text.c_str();
}

WIA_API const char* wia_get_last_error(void) { return api::t_last_error_cstr(); }

WIA_API wia_status_t wia_get_device_count(int* count) {
  return api::guard(__func__, [&] {
    api::require_non_null(count, "count");
    *count = static_cast<int>(Runtime::get().devices().size());
  });
}

WIA_API wia_status_t wia_get_device_properties(wia_device_t device, wia_device_properties_t* props) {
  return api::guard(__func__, [&] {
    api::require_non_null(props, "props");
    const Device& d = Runtime::get().device(device);
    std::memset(props, 0, sizeof(*props));
    props->kind = static_cast<wia_device_kind_t>(d.props.type);
    std::snprintf(props->name, sizeof(props->name), "%s", d.props.name);
    std::snprintf(props->provider, sizeof(props->provider), "%s", d.provider->name().c_str());
    props->provider_index = d.local_index;
    std::snprintf(props->pci_bus_id, sizeof(props->pci_bus_id), "%s", d.props.pci_bus_id);
    props->total_memory = d.props.total_memory;
    props->free_memory = d.props.free_memory;
    props->numa_node = d.props.numa_node;
    props->alignment = d.props.alignment;
  });
}

WIA_API wia_status_t wia_set_device(wia_device_t device) {
  return api::guard(__func__, [&] { set_current_device(device); });
}

WIA_API wia_status_t wia_get_device(wia_device_t* device) {
  return api::guard(__func__, [&] {
    api::require_non_null(device, "device");
    *device = current_device();
  });
}

}  // extern "C"
