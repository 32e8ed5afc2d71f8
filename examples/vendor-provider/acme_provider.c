/* SPDX-License-Identifier: Apache-2.0 */
/*
 * libwia-provider-acme.so: a minimal but complete device provider, written
 * to be copied. "acme" devices are host memory, and every stream operation
 * runs synchronously at enqueue time. That is legal (provider.h: async
 * entries "may return before [the work] runs", so they may also return
 * after) and keeps this file about the ABI, not about threads. A real
 * device replaces the memory and stream bodies with driver calls; the
 * shape - argument checks, set_error messages, declared parameters, the
 * descriptor - stays the same.
 *
 * Passes `wia-conformance --level 2`. It does not claim HOST_FUNC (a
 * synchronous host function would run inside launch_host_func, and
 * callers may legitimately enqueue one that waits for the caller), PEER,
 * IPC or REDUCE.
 */
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <wia/provider.h>

#define ACME_ALIGNMENT 256u

/* ---- the provider context ------------------------------------------------ */

typedef struct acme_alloc {
  void* ptr;
  uint64_t size;
} acme_alloc_t;

typedef struct acme_ctx {
  const wia_host_services_v1_t* host;
  int32_t devices;
  uint64_t memory_limit; /* per device, bytes */
  pthread_mutex_t mu;    /* guards everything below */
  uint64_t* used;        /* per device */
  acme_alloc_t* allocs;  /* live allocations of all devices (small: a linear table) */
  size_t nallocs, cap;
} acme_ctx_t;

typedef struct wia_provider_stream_s {
  int32_t dev;
} acme_stream_t;

typedef struct wia_provider_event_s {
  int32_t dev;
  int recorded;
  uint64_t time_ns; /* when the captured work completed */
} acme_event_t;

/* Every failure is explained: the core shows this text with the status. */
static wia_status_t fail(acme_ctx_t* c, wia_status_t st, const char* fmt, ...)
    __attribute__((format(printf, 3, 4)));
static wia_status_t fail(acme_ctx_t* c, wia_status_t st, const char* fmt, ...) {
  char msg[256];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);
  c->host->set_error(c->host->host_ctx, msg);
  return st;
}

static wia_status_t check_dev(acme_ctx_t* c, const char* call, int32_t dev) {
  if (dev < 0 || dev >= c->devices)
    return fail(c, WIA_ERROR_INVALID_DEVICE, "%s: no acme device %d (have %d)", call, dev,
                c->devices);
  return WIA_SUCCESS;
}

/* ---- init / fini ---------------------------------------------------------- */

/* Parameters arrive as text, already validated by the core against the
 * declarations below; a NULL answer (an older core) means the default. */
static const char* param(const wia_host_services_v1_t* host, const char* key, const char* def) {
  const char* v = host->get_param(host->host_ctx, key);
  return v != NULL ? v : def;
}

static wia_status_t acme_init(const wia_host_services_v1_t* host, void** out) {
  if (host == NULL || out == NULL) return WIA_ERROR_INVALID_ARGUMENT;
  /* Check the host-services version before touching any callback. */
  if (host->abi_version < WIA_HOST_SERVICES_VERSION ||
      !WIA_ABI_HAS_FIELD(wia_host_services_v1_t, host->struct_size, clock_ns))
    return WIA_ERROR_ABI_MISMATCH;
  acme_ctx_t* c = calloc(1, sizeof(*c));
  if (c == NULL) return WIA_ERROR_OUT_OF_MEMORY;
  c->host = host;
  const char* devices = param(host, "devices", "1");
  const char* limit = param(host, "memory_limit", "1073741824");
  char* end = NULL;
  c->devices = (int32_t)strtol(devices, &end, 10);
  if (*end != '\0' || c->devices < 0 || c->devices > 8) {
    fail(c, WIA_ERROR_CONFIG, "acme.devices = '%s': expected 0..8", devices);
    free(c);
    return WIA_ERROR_CONFIG;
  }
  c->memory_limit = strtoull(limit, &end, 10);
  if (*end != '\0') {
    fail(c, WIA_ERROR_CONFIG, "acme.memory_limit = '%s': expected bytes", limit);
    free(c);
    return WIA_ERROR_CONFIG;
  }
  c->used = calloc((size_t)c->devices + 1, sizeof(uint64_t));
  if (c->used == NULL) {
    free(c);
    return WIA_ERROR_OUT_OF_MEMORY;
  }
  pthread_mutex_init(&c->mu, NULL);
  host->log(host->host_ctx, WIA_LOG_DEBUG, "acme: initialised");
  *out = c;
  return WIA_SUCCESS;
}

static wia_status_t acme_fini(void* ctx) {
  acme_ctx_t* c = ctx;
  for (size_t i = 0; i < c->nallocs; ++i) free(c->allocs[i].ptr);
  free(c->allocs);
  free(c->used);
  pthread_mutex_destroy(&c->mu);
  free(c);
  return WIA_SUCCESS;
}

/* ---- discovery ------------------------------------------------------------- */

static wia_status_t device_count(void* ctx, int32_t* count) {
  *count = ((acme_ctx_t*)ctx)->devices;
  return WIA_SUCCESS;
}

static wia_status_t device_props(void* ctx, int32_t dev, wia_device_props_v1_t* props) {
  acme_ctx_t* c = ctx;
  wia_status_t st = check_dev(c, "device_props", dev);
  if (st != WIA_SUCCESS) return st;
  /* Build the full struct, then copy only what the caller's struct holds:
   * an older caller passes a shorter one. */
  wia_device_props_v1_t p;
  memset(&p, 0, sizeof(p));
  p.struct_size = props->struct_size;
  p.type = WIA_DEVICE_ACCELERATOR;
  snprintf(p.name, sizeof(p.name), "ACME Accelerator %d", dev);
  p.total_memory = c->memory_limit;
  pthread_mutex_lock(&c->mu);
  p.free_memory = c->memory_limit - c->used[dev];
  pthread_mutex_unlock(&c->mu);
  p.numa_node = -1;
  p.flags = WIA_DEVICE_FLAG_HOST_ACCESSIBLE | WIA_DEVICE_FLAG_UNIFIED_ADDRESS;
  p.alignment = ACME_ALIGNMENT;
  size_t n = props->struct_size < sizeof(p) ? props->struct_size : sizeof(p);
  memcpy(props, &p, n);
  return WIA_SUCCESS;
}

/* ---- memory --------------------------------------------------------------- */

static wia_status_t mem_alloc(void* ctx, int32_t dev, uint64_t size, uint32_t kind, void** ptr) {
  acme_ctx_t* c = ctx;
  wia_status_t st = check_dev(c, "mem_alloc", dev);
  if (st != WIA_SUCCESS) return st;
  if (kind != WIA_MEM_DEVICE && kind != WIA_MEM_HOST_PINNED)
    return fail(c, WIA_ERROR_INVALID_ARGUMENT, "mem_alloc: unknown kind %u", kind);
  pthread_mutex_lock(&c->mu);
  /* Out of memory is a status, never an abort; checked before any
   * arithmetic on `size` can overflow. */
  if (size > c->memory_limit - c->used[dev]) {
    uint64_t left = c->memory_limit - c->used[dev];
    pthread_mutex_unlock(&c->mu);
    return fail(c, WIA_ERROR_OUT_OF_MEMORY, "mem_alloc(%llu B) on acme device %d: %llu B left",
                (unsigned long long)size, dev, (unsigned long long)left);
  }
  if (c->nallocs == c->cap) {
    size_t cap = c->cap ? c->cap * 2 : 64;
    acme_alloc_t* grown = realloc(c->allocs, cap * sizeof(*grown));
    if (grown == NULL) {
      pthread_mutex_unlock(&c->mu);
      return fail(c, WIA_ERROR_OUT_OF_MEMORY, "mem_alloc: allocation table full");
    }
    c->allocs = grown;
    c->cap = cap;
  }
  /* Size 0 still gets a unique pointer (the ABI requires it). */
  uint64_t rounded = (size + ACME_ALIGNMENT) / ACME_ALIGNMENT * ACME_ALIGNMENT;
  void* p = aligned_alloc(ACME_ALIGNMENT, rounded);
  if (p == NULL) {
    pthread_mutex_unlock(&c->mu);
    return fail(c, WIA_ERROR_OUT_OF_MEMORY, "mem_alloc(%llu B): out of host memory",
                (unsigned long long)size);
  }
  c->allocs[c->nallocs].ptr = p;
  c->allocs[c->nallocs].size = size;
  ++c->nallocs;
  c->used[dev] += size;
  pthread_mutex_unlock(&c->mu);
  *ptr = p;
  return WIA_SUCCESS;
}

static wia_status_t mem_free(void* ctx, int32_t dev, void* ptr) {
  acme_ctx_t* c = ctx;
  wia_status_t st = check_dev(c, "mem_free", dev);
  if (st != WIA_SUCCESS) return st;
  pthread_mutex_lock(&c->mu);
  for (size_t i = 0; i < c->nallocs; ++i) {
    if (c->allocs[i].ptr == ptr) {
      c->used[dev] -= c->allocs[i].size;
      c->allocs[i] = c->allocs[--c->nallocs];
      pthread_mutex_unlock(&c->mu);
      free(ptr);
      return WIA_SUCCESS;
    }
  }
  pthread_mutex_unlock(&c->mu);
  /* A double free is the caller's bug; report it rather than crash. */
  return fail(c, WIA_ERROR_INVALID_ARGUMENT, "mem_free on acme device %d: %p is not allocated", dev,
              ptr);
}

static wia_status_t memset_sync(void* ctx, int32_t dev, void* ptr, int32_t value, uint64_t size) {
  wia_status_t st = check_dev(ctx, "memset", dev);
  if (st != WIA_SUCCESS) return st;
  if (size > 0) memset(ptr, (unsigned char)value, size);
  return WIA_SUCCESS;
}

static wia_status_t memcpy_sync(void* ctx, int32_t dev, void* dst, const void* src, uint64_t size) {
  wia_status_t st = check_dev(ctx, "memcpy", dev);
  if (st != WIA_SUCCESS) return st;
  if (size > 0) memmove(dst, src, size);
  return WIA_SUCCESS;
}

/* ---- streams (synchronous) ------------------------------------------------ */

static wia_status_t stream_create(void* ctx, int32_t dev, wia_provider_stream_t* stream) {
  wia_status_t st = check_dev(ctx, "stream_create", dev);
  if (st != WIA_SUCCESS) return st;
  acme_stream_t* s = calloc(1, sizeof(*s));
  if (s == NULL) return fail(ctx, WIA_ERROR_OUT_OF_MEMORY, "stream_create: out of host memory");
  s->dev = dev;
  *stream = s;
  return WIA_SUCCESS;
}

static wia_status_t stream_destroy(void* ctx, wia_provider_stream_t stream) {
  (void)ctx;
  free(stream);
  return WIA_SUCCESS;
}

/* All work completed when it was enqueued. */
static wia_status_t stream_synchronize(void* ctx, wia_provider_stream_t stream) {
  (void)ctx, (void)stream;
  return WIA_SUCCESS;
}

static wia_status_t stream_query(void* ctx, wia_provider_stream_t stream) {
  (void)ctx, (void)stream;
  return WIA_SUCCESS;
}

static wia_status_t memset_async(void* ctx, wia_provider_stream_t stream, void* ptr, int32_t value,
                                 uint64_t size) {
  return memset_sync(ctx, stream->dev, ptr, value, size);
}

static wia_status_t memcpy_async(void* ctx, wia_provider_stream_t stream, void* dst,
                                 const void* src, uint64_t size) {
  return memcpy_sync(ctx, stream->dev, dst, src, size);
}

/* ---- events --------------------------------------------------------------- */

static wia_status_t event_create(void* ctx, int32_t dev, wia_provider_event_t* event) {
  wia_status_t st = check_dev(ctx, "event_create", dev);
  if (st != WIA_SUCCESS) return st;
  acme_event_t* e = calloc(1, sizeof(*e));
  if (e == NULL) return fail(ctx, WIA_ERROR_OUT_OF_MEMORY, "event_create: out of host memory");
  e->dev = dev;
  *event = e;
  return WIA_SUCCESS;
}

static wia_status_t event_destroy(void* ctx, wia_provider_event_t event) {
  (void)ctx;
  free(event);
  return WIA_SUCCESS;
}

static wia_status_t event_record(void* ctx, wia_provider_event_t event,
                                 wia_provider_stream_t stream) {
  acme_ctx_t* c = ctx;
  if (event->dev != stream->dev)
    return fail(c, WIA_ERROR_INVALID_HANDLE,
                "event_record: event of device %d, stream of device %d", event->dev, stream->dev);
  /* The captured work is already done: the event completes now. */
  event->recorded = 1;
  event->time_ns = c->host->clock_ns(c->host->host_ctx);
  return WIA_SUCCESS;
}

static wia_status_t event_query(void* ctx, wia_provider_event_t event) {
  (void)ctx, (void)event;
  return WIA_SUCCESS;
}

static wia_status_t event_synchronize(void* ctx, wia_provider_event_t event) {
  (void)ctx, (void)event;
  return WIA_SUCCESS;
}

static wia_status_t stream_wait_event(void* ctx, wia_provider_stream_t stream,
                                      wia_provider_event_t event) {
  (void)ctx, (void)stream, (void)event;
  return WIA_SUCCESS;
}

static wia_status_t event_elapsed_ms(void* ctx, wia_provider_event_t start,
                                     wia_provider_event_t end, float* ms) {
  if (!start->recorded || !end->recorded)
    return fail(ctx, WIA_ERROR_INVALID_HANDLE, "event_elapsed_ms: event never recorded");
  *ms = (float)((double)(end->time_ns - start->time_ns) / 1e6);
  return WIA_SUCCESS;
}

/* ---- peers: required query, no peer access -------------------------------- */

static wia_status_t can_access_peer(void* ctx, int32_t dev, int32_t peer, int32_t* can_access) {
  wia_status_t st = check_dev(ctx, "can_access_peer", dev);
  if (st == WIA_SUCCESS) st = check_dev(ctx, "can_access_peer (peer)", peer);
  if (st != WIA_SUCCESS) return st;
  *can_access = 0;
  return WIA_SUCCESS;
}

/* ---- the descriptor --------------------------------------------------------- */

static const wia_param_decl_v1_t acme_params[] = {
    {sizeof(wia_param_decl_v1_t), WIA_PARAM_INT, "devices", "1", "number of ACME devices", 0, 8},
    {sizeof(wia_param_decl_v1_t), WIA_PARAM_SIZE, "memory_limit", "1073741824",
     "memory of each ACME device, in bytes", 0, INT64_MAX},
};

static const wia_device_ops_v1_t acme_device_ops = {
    .struct_size = sizeof(wia_device_ops_v1_t),
    .abi_version = WIA_PROVIDER_ABI_VERSION,
    .caps = WIA_DEVICE_CAP_EVENT_TIMING | WIA_DEVICE_CAP_PINNED_HOST,
    .must_understand = 0,
    .device_count = device_count,
    .device_props = device_props,
    .mem_alloc = mem_alloc,
    .mem_free = mem_free,
    .memset = memset_sync,
    .memcpy = memcpy_sync,
    .stream_create = stream_create,
    .stream_destroy = stream_destroy,
    .stream_synchronize = stream_synchronize,
    .stream_query = stream_query,
    .memset_async = memset_async,
    .memcpy_async = memcpy_async,
    .event_create = event_create,
    .event_destroy = event_destroy,
    .event_record = event_record,
    .event_query = event_query,
    .event_synchronize = event_synchronize,
    .stream_wait_event = stream_wait_event,
    .event_elapsed_ms = event_elapsed_ms,
    .can_access_peer = can_access_peer,
    /* Optional entries without their capability bit stay NULL. */
};

/* The one exported symbol. */
WIA_PROVIDER_EXPORT const wia_provider_v1_t wia_provider_v1 = {
    .struct_size = sizeof(wia_provider_v1_t),
    .abi_version = WIA_PROVIDER_ABI_VERSION,
    .name = "acme", /* must match the file name libwia-provider-acme.so */
    .version = "1.0.0",
    .caps = WIA_PROVIDER_CAP_DEVICE,
    .host_services_version = WIA_HOST_SERVICES_VERSION,
    .num_params = sizeof(acme_params) / sizeof(acme_params[0]),
    .params = acme_params,
    .init = acme_init,
    .fini = acme_fini,
    .device = &acme_device_ops,
    .transport = NULL,
};
