/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A valid, minimal transport provider for the loader tests. It declares
 * parameters (so the validation of its YAML section is tested), reads them
 * through host services, and makes what it saw observable:
 *  - endpoint 0 is named "level-<level>", so tests see get_param() work;
 *  - listen() fails with a set_error() message, so tests see that text
 *    reach check_provider();
 *  - init() and fini() log through host services, so tests see the log
 *    callback and the order of fini() calls.
 * Compiled twice (test_params, test_order) to check unload order.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <wia/provider.h>

#ifndef WIA_TEST_NAME
#error "WIA_TEST_NAME must name the provider"
#endif

typedef struct test_ctx {
  const wia_host_services_v1_t* host;
  long level;
} test_ctx_t;

static wia_status_t fail(const wia_host_services_v1_t* host, wia_status_t status,
                         const char* message) {
  host->set_error(host->host_ctx, message);
  return status;
}

static wia_status_t test_init(const wia_host_services_v1_t* host, void** ctx) {
  if (host->abi_version < WIA_HOST_SERVICES_VERSION ||
      !WIA_ABI_HAS_FIELD(wia_host_services_v1_t, host->struct_size, clock_ns))
    return WIA_ERROR_ABI_MISMATCH;
  /* Exercise every service once; any surprise fails init with a message
   * the test prints. */
  uint64_t t0 = host->clock_ns(host->host_ctx);
  uint64_t t1 = host->clock_ns(host->host_ctx);
  if (t0 == 0 || t1 < t0) return fail(host, WIA_ERROR_INTERNAL, "clock_ns is not monotonic");
  if (host->get_param(host->host_ctx, "no_such_key") != NULL)
    return fail(host, WIA_ERROR_INTERNAL, "get_param answered an undeclared key");
  const char* level = host->get_param(host->host_ctx, "level");
  if (level == NULL) return fail(host, WIA_ERROR_INTERNAL, "get_param(level) returned NULL");

  test_ctx_t* c = (test_ctx_t*)calloc(1, sizeof(*c));
  if (c == NULL) return WIA_ERROR_OUT_OF_MEMORY;
  c->host = host;
  c->level = strtol(level, NULL, 10);
  char line[96];
  snprintf(line, sizeof(line), "init " WIA_TEST_NAME " level=%ld", c->level);
  host->log(host->host_ctx, WIA_LOG_INFO, line);
  *ctx = c;
  return WIA_SUCCESS;
}

static wia_status_t test_fini(void* ctx) {
  test_ctx_t* c = (test_ctx_t*)ctx;
  /* Host services stay valid until fini returns. */
  c->host->log(c->host->host_ctx, WIA_LOG_INFO, "fini " WIA_TEST_NAME);
  free(c);
  return WIA_SUCCESS;
}

static wia_status_t endpoint_count(void* ctx, int32_t* count) {
  (void)ctx;
  *count = 1;
  return WIA_SUCCESS;
}

static wia_status_t endpoint_props(void* ctx, int32_t endpoint, wia_transport_props_v1_t* props) {
  test_ctx_t* c = (test_ctx_t*)ctx;
  if (endpoint != 0) return fail(c->host, WIA_ERROR_INVALID_ARGUMENT, "only endpoint 0 exists");
  if (!WIA_ABI_HAS_FIELD(wia_transport_props_v1_t, props->struct_size, name))
    return WIA_ERROR_INVALID_ARGUMENT;
  snprintf(props->name, sizeof(props->name), "level-%ld", c->level);
  return WIA_SUCCESS;
}

static wia_status_t listen_(void* ctx, int32_t endpoint, void* handle, wia_listener_t* listener) {
  test_ctx_t* c = (test_ctx_t*)ctx;
  (void)endpoint, (void)handle, (void)listener;
  return fail(c->host, WIA_ERROR_NOT_SUPPORTED, "listen is not offered by " WIA_TEST_NAME);
}

/* The rest is never called by the loader tests. */
static wia_status_t connect_(void* ctx, int32_t endpoint, const void* handle, uint64_t cookie,
                             wia_conn_t* conn) {
  (void)ctx, (void)endpoint, (void)handle, (void)cookie, (void)conn;
  return WIA_ERROR_NOT_SUPPORTED;
}
static wia_status_t accept_(void* ctx, wia_listener_t listener, uint64_t* cookie,
                            wia_conn_t* conn) {
  (void)ctx, (void)listener, (void)cookie, (void)conn;
  return WIA_ERROR_NOT_SUPPORTED;
}
static wia_status_t close_listener(void* ctx, wia_listener_t listener) {
  (void)ctx, (void)listener;
  return WIA_ERROR_NOT_SUPPORTED;
}
static wia_status_t reg_mr(void* ctx, int32_t endpoint, const wia_mr_desc_v1_t* desc,
                           wia_mr_t* mr) {
  (void)ctx, (void)endpoint, (void)desc, (void)mr;
  return WIA_ERROR_NOT_SUPPORTED;
}
static wia_status_t dereg_mr(void* ctx, wia_mr_t mr) {
  (void)ctx, (void)mr;
  return WIA_ERROR_NOT_SUPPORTED;
}
static wia_status_t isend(void* ctx, wia_conn_t conn, const void* buf, uint64_t size, uint64_t tag,
                          wia_mr_t mr, wia_request_t* request) {
  (void)ctx, (void)conn, (void)buf, (void)size, (void)tag, (void)mr, (void)request;
  return WIA_ERROR_NOT_SUPPORTED;
}
static wia_status_t irecv(void* ctx, wia_conn_t conn, void* buf, uint64_t size, uint64_t tag,
                          wia_mr_t mr, wia_request_t* request) {
  (void)ctx, (void)conn, (void)buf, (void)size, (void)tag, (void)mr, (void)request;
  return WIA_ERROR_NOT_SUPPORTED;
}
static wia_status_t test_(void* ctx, wia_request_t request, int32_t* done, uint64_t* size) {
  (void)ctx, (void)request, (void)done, (void)size;
  return WIA_ERROR_NOT_SUPPORTED;
}
static wia_status_t close_(void* ctx, wia_conn_t conn) {
  (void)ctx, (void)conn;
  return WIA_ERROR_NOT_SUPPORTED;
}

static const wia_transport_ops_v1_t kTransportOps = {
    .struct_size = sizeof(wia_transport_ops_v1_t),
    .abi_version = WIA_PROVIDER_ABI_VERSION,
    .caps = 0,
    .endpoint_count = endpoint_count,
    .endpoint_props = endpoint_props,
    .listen = listen_,
    .connect = connect_,
    .accept = accept_,
    .close_listener = close_listener,
    .reg_mr = reg_mr,
    .dereg_mr = dereg_mr,
    .isend = isend,
    .irecv = irecv,
    .test = test_,
    .close = close_,
};

static const wia_param_decl_v1_t kParams[] = {
    {.struct_size = sizeof(wia_param_decl_v1_t),
     .type = WIA_PARAM_INT,
     .key = "level",
     .default_value = "3",
     .description = "Test level, reported as the endpoint name",
     .min_value = 0,
     .max_value = 10},
    {.struct_size = sizeof(wia_param_decl_v1_t),
     .type = WIA_PARAM_BOOL,
     .key = "verbose",
     .default_value = "false",
     .description = "Unused; a second key for suggestions to choose from"},
};

WIA_PROVIDER_EXPORT const wia_provider_v1_t wia_provider_v1 = {
    .struct_size = sizeof(wia_provider_v1_t),
    .abi_version = WIA_PROVIDER_ABI_VERSION,
    .name = WIA_TEST_NAME,
    .version = "0.0-test",
    .caps = WIA_PROVIDER_CAP_TRANSPORT,
    .host_services_version = WIA_HOST_SERVICES_VERSION,
    .num_params = sizeof(kParams) / sizeof(kParams[0]),
    .params = kParams,
    .init = test_init,
    .fini = test_fini,
    .device = NULL,
    .transport = &kTransportOps,
};
