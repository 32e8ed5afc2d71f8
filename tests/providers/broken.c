/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Deliberately broken providers for the loader tests. One source, compiled
 * once per defect (tests.cmake passes WIA_TEST_NAME and one
 * WIA_TEST_DEFECT_* macro), so every variant is a correct minimal device
 * provider except for the one thing the loader must catch.
 *
 * Without a defect macro the provider is valid and reports zero devices.
 */
#include <stddef.h>
#include <wia/provider.h>

#ifndef WIA_TEST_NAME
#error "WIA_TEST_NAME must name the provider"
#endif

#if defined(WIA_TEST_DEFECT_UNDEF)
/* Defined nowhere: the library links (undefined symbols allowed) but
 * dlopen(RTLD_NOW) must fail to resolve it. */
extern int wia_test_undefined_function(void);
#elif defined(WIA_TEST_DEFECT_DEP)
/* Lives in a library the loader cannot find (no RPATH, not on the
 * system search path). */
extern int wia_test_missing_dep_function(void);
#endif

static wia_status_t test_init(const wia_host_services_v1_t* host, void** ctx) {
  (void)host;
  *ctx = NULL;
#if defined(WIA_TEST_DEFECT_UNDEF)
  if (wia_test_undefined_function() != 0) return WIA_ERROR_INTERNAL;
#elif defined(WIA_TEST_DEFECT_DEP)
  if (wia_test_missing_dep_function() != 0) return WIA_ERROR_INTERNAL;
#elif defined(WIA_TEST_DEFECT_INITFAIL)
  host->set_error(host->host_ctx, "simulated failure: firmware handshake timed out");
  return WIA_ERROR_INTERNAL;
#elif defined(WIA_TEST_DEFECT_ABSENT)
  host->set_error(host->host_ctx, "no such hardware");
  return WIA_ERROR_UNAVAILABLE;
#endif
  return WIA_SUCCESS;
}

static wia_status_t test_fini(void* ctx) {
  (void)ctx;
  return WIA_SUCCESS;
}

/* Stubs with the exact prototypes of the table: nothing here is ever
 * called by the loader tests beyond discovery. */
static wia_status_t device_count(void* ctx, int32_t* count) {
  (void)ctx;
  *count = 0;
  return WIA_SUCCESS;
}
static wia_status_t device_props(void* ctx, int32_t dev, wia_device_props_v1_t* props) {
  (void)ctx, (void)dev, (void)props;
  return WIA_ERROR_INVALID_DEVICE;
}
static wia_status_t mem_alloc(void* ctx, int32_t dev, uint64_t size, uint32_t kind, void** ptr) {
  (void)ctx, (void)dev, (void)size, (void)kind, (void)ptr;
  return WIA_ERROR_INVALID_DEVICE;
}
static wia_status_t mem_free(void* ctx, int32_t dev, void* ptr) {
  (void)ctx, (void)dev, (void)ptr;
  return WIA_ERROR_INVALID_DEVICE;
}
static wia_status_t memset_sync(void* ctx, int32_t dev, void* ptr, int32_t value, uint64_t size) {
  (void)ctx, (void)dev, (void)ptr, (void)value, (void)size;
  return WIA_ERROR_INVALID_DEVICE;
}
static wia_status_t memcpy_sync(void* ctx, int32_t dev, void* dst, const void* src, uint64_t size) {
  (void)ctx, (void)dev, (void)dst, (void)src, (void)size;
  return WIA_ERROR_INVALID_DEVICE;
}
#if !defined(WIA_TEST_DEFECT_REQUIRED)
static wia_status_t stream_create(void* ctx, int32_t dev, wia_provider_stream_t* stream) {
  (void)ctx, (void)dev, (void)stream;
  return WIA_ERROR_INVALID_DEVICE;
}
#define TEST_STREAM_CREATE stream_create
#else
/* A required entry left NULL. */
#define TEST_STREAM_CREATE NULL
#endif
static wia_status_t stream_op(void* ctx, wia_provider_stream_t stream) {
  (void)ctx, (void)stream;
  return WIA_ERROR_INVALID_HANDLE;
}
static wia_status_t memset_async(void* ctx, wia_provider_stream_t stream, void* ptr, int32_t value,
                                 uint64_t size) {
  (void)ctx, (void)stream, (void)ptr, (void)value, (void)size;
  return WIA_ERROR_INVALID_HANDLE;
}
static wia_status_t memcpy_async(void* ctx, wia_provider_stream_t stream, void* dst,
                                 const void* src, uint64_t size) {
  (void)ctx, (void)stream, (void)dst, (void)src, (void)size;
  return WIA_ERROR_INVALID_HANDLE;
}
static wia_status_t event_create(void* ctx, int32_t dev, wia_provider_event_t* event) {
  (void)ctx, (void)dev, (void)event;
  return WIA_ERROR_INVALID_DEVICE;
}
static wia_status_t event_op(void* ctx, wia_provider_event_t event) {
  (void)ctx, (void)event;
  return WIA_ERROR_INVALID_HANDLE;
}
static wia_status_t event_record(void* ctx, wia_provider_event_t event,
                                 wia_provider_stream_t stream) {
  (void)ctx, (void)event, (void)stream;
  return WIA_ERROR_INVALID_HANDLE;
}
static wia_status_t stream_wait_event(void* ctx, wia_provider_stream_t stream,
                                      wia_provider_event_t event) {
  (void)ctx, (void)stream, (void)event;
  return WIA_ERROR_INVALID_HANDLE;
}
static wia_status_t can_access_peer(void* ctx, int32_t dev, int32_t peer, int32_t* can_access) {
  (void)ctx, (void)dev, (void)peer;
  *can_access = 0;
  return WIA_SUCCESS;
}

#if defined(WIA_TEST_DEFECT_OPTIONAL)
/* Announces event timing but leaves event_elapsed_ms NULL. */
#define TEST_DEVICE_CAPS WIA_DEVICE_CAP_EVENT_TIMING
#else
#define TEST_DEVICE_CAPS 0
#endif

#if defined(WIA_TEST_DEFECT_TABLEVER)
#define TEST_TABLE_ABI 7u
#else
#define TEST_TABLE_ABI WIA_PROVIDER_ABI_VERSION
#endif

#if defined(WIA_TEST_DEFECT_MUSTUNDERSTAND)
/* Demands semantics no core knows yet. */
#define TEST_MUST_UNDERSTAND (1ull << 63)
#else
#define TEST_MUST_UNDERSTAND 0
#endif

/* Unused only by the CAPS variant, which announces the device interface
 * but does not point at this table. */
__attribute__((unused)) static const wia_device_ops_v1_t kDeviceOps = {
    .struct_size = sizeof(wia_device_ops_v1_t),
    .abi_version = TEST_TABLE_ABI,
    .caps = TEST_DEVICE_CAPS,
    .must_understand = TEST_MUST_UNDERSTAND,
    .device_count = device_count,
    .device_props = device_props,
    .mem_alloc = mem_alloc,
    .mem_free = mem_free,
    .memset = memset_sync,
    .memcpy = memcpy_sync,
    .stream_create = TEST_STREAM_CREATE,
    .stream_destroy = stream_op,
    .stream_synchronize = stream_op,
    .stream_query = stream_op,
    .memset_async = memset_async,
    .memcpy_async = memcpy_async,
    .event_create = event_create,
    .event_destroy = event_op,
    .event_record = event_record,
    .event_query = event_op,
    .event_synchronize = event_op,
    .stream_wait_event = stream_wait_event,
    .can_access_peer = can_access_peer,
};

#if defined(WIA_TEST_DEFECT_ABI)
#define TEST_ABI 99u
#else
#define TEST_ABI WIA_PROVIDER_ABI_VERSION
#endif

#if defined(WIA_TEST_DEFECT_HOSTSVC)
#define TEST_HOST_SERVICES 99u
#else
#define TEST_HOST_SERVICES WIA_HOST_SERVICES_VERSION
#endif

#if defined(WIA_TEST_DEFECT_SIZE)
/* As if built against a truncated, pre-release header. */
#define TEST_STRUCT_SIZE 24u
#else
#define TEST_STRUCT_SIZE sizeof(wia_provider_v1_t)
#endif

#if defined(WIA_TEST_DEFECT_NAME)
#define TEST_DESCRIPTOR_NAME "Broken-Name"
#elif defined(WIA_TEST_DEFECT_MISMATCH)
#define TEST_DESCRIPTOR_NAME "renamed"
#else
#define TEST_DESCRIPTOR_NAME WIA_TEST_NAME
#endif

#if defined(WIA_TEST_DEFECT_CAPS)
/* Announces a device interface without a table. */
#define TEST_DEVICE_TABLE NULL
#else
#define TEST_DEVICE_TABLE &kDeviceOps
#endif

#if defined(WIA_TEST_DEFECT_NOSYM)
/* A plausible typo: the loader looks for wia_provider_v1 only. */
#define TEST_SYMBOL wia_provider
#else
#define TEST_SYMBOL wia_provider_v1
#endif

WIA_PROVIDER_EXPORT const wia_provider_v1_t TEST_SYMBOL = {
    .struct_size = TEST_STRUCT_SIZE,
    .abi_version = TEST_ABI,
    .name = TEST_DESCRIPTOR_NAME,
    .version = "0.0-test",
    .caps = WIA_PROVIDER_CAP_DEVICE,
    .host_services_version = TEST_HOST_SERVICES,
    .num_params = 0,
    .params = NULL,
    .init = test_init,
    .fini = test_fini,
    .device = TEST_DEVICE_TABLE,
    .transport = NULL,
};
