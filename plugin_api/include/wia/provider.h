/* SPDX-License-Identifier: Apache-2.0 */
/*
 * wia/provider.h - the libwia provider ABI, version 1.
 *
 * A provider is a shared object (libwia-provider-NAME.so) that the libwia
 * core loads at run time with dlopen(RTLD_NOW | RTLD_LOCAL). It exports ONE
 * data symbol per ABI version it implements:
 *
 *     WIA_PROVIDER_EXPORT const wia_provider_v1_t wia_provider_v1 = {...};
 *
 * and builds everything else with hidden visibility. The core probes the
 * newest symbol it knows first (wia_provider_v2, ...) and falls back to
 * older ones; a provider whose descriptor announces an abi_version newer
 * than the core knows is refused with a message naming both versions.
 *
 * Rules that keep the ABI growable (read before changing anything here):
 *  - A field appended to a struct the core passes IN to a provider (such
 *    as wia_reduce_args_v1_t) changes a call's meaning for new providers
 *    only; the core sets it only when a capability bit says the provider
 *    reads it. Host-service fields are append-only, never re-typed.
 *  - Plain C11: fixed-width integers, opaque handles, no C++ types, no
 *    exceptions. A provider written in C++ must catch everything at the
 *    boundary and return a status.
 *  - Every struct crossing the boundary starts with `struct_size` and (for
 *    tables) `abi_version`. The reader uses an entry only if struct_size
 *    says the writer's struct is long enough to contain it
 *    (WIA_ABI_HAS_FIELD). New fields are only ever appended.
 *  - Required entry points are never NULL (the loader refuses the provider
 *    and names the missing entry). Optional entry points are announced by a
 *    capability bit AND must be non-NULL when the bit is set; a caller never
 *    calls an optional entry without its bit.
 *  - Unsupported operations return WIA_ERROR_NOT_SUPPORTED, never crash.
 *  - A released version is frozen: an incompatible change is a new header
 *    (provider_v2.h), a new symbol and a new descriptor type, with v1 still
 *    accepted by the core through a small adapter.
 *
 * Threading: unless an entry says otherwise, entries on distinct handles may
 * be called concurrently from different threads; entries on the same handle
 * are serialised by the core. Nothing here may be called from inside a host
 * function running on a provider stream, except where said.
 *
 * Errors: every entry returns wia_status_t (status.h). To explain a failure,
 * a provider calls host->set_error(host->host_ctx, "...") on the calling
 * thread before returning the negative status; the core attaches that text
 * to the error it reports. Messages should name the device, peer or call
 * that failed ("cuMemAlloc(1 GiB) on device 0: CUDA_ERROR_OUT_OF_MEMORY").
 */
#ifndef WIA_PROVIDER_H
#define WIA_PROVIDER_H

#include <stddef.h>
#include <stdint.h>

#include <wia/status.h>

struct pollfd; /* <poll.h>; used by the optional wait_fds entry */

#ifdef __cplusplus
extern "C" {
#endif

#define WIA_PROVIDER_ABI_VERSION 1u
#define WIA_PROVIDER_SYMBOL_V1 "wia_provider_v1"

#if defined(__GNUC__)
#define WIA_PROVIDER_EXPORT __attribute__((visibility("default")))
#else
#define WIA_PROVIDER_EXPORT
#endif

/* True when a struct of `size` bytes written by the other side contains
 * `field`. Use before reading any field added after the first release. */
#define WIA_ABI_HAS_FIELD(type, size, field) \
  ((size_t)(size) >= offsetof(type, field) + sizeof(((type*)0)->field))

/* ------------------------------------------------------------------------ */
/* Host services: what the core offers a provider.                          */
/* ------------------------------------------------------------------------ */

#define WIA_HOST_SERVICES_VERSION 1u

typedef enum wia_log_level {
  WIA_LOG_TRACE = 0,
  WIA_LOG_DEBUG = 1,
  WIA_LOG_INFO = 2,
  WIA_LOG_WARN = 3,
  WIA_LOG_ERROR = 4
} wia_log_level_t;

/* Handed to provider init(). Owned by the core; valid until fini() returns.
 * All callbacks are thread-safe and never block for long. A provider checks
 * `abi_version` first: if it needs host services newer than offered, its
 * init returns WIA_ERROR_ABI_MISMATCH (the core, symmetrically, refuses a
 * provider that asks for host services it does not offer: see
 * wia_provider_v1_t.host_services_version). A changed callback signature is
 * therefore always a refusal, never a call through a wrong prototype. */
typedef struct wia_host_services_v1 {
  uint32_t struct_size;
  uint32_t abi_version; /* WIA_HOST_SERVICES_VERSION of the core */
  void* host_ctx;       /* pass back as first argument of every callback */

  /* Log one line under the provider's name. `message` is copied. */
  void (*log)(void* host_ctx, wia_log_level_t level, const char* message);

  /* Attach a message to the error the calling thread is about to return.
   * Copied; the last call before the return wins. */
  void (*set_error)(void* host_ctx, const char* message);

  /* The configured value of a parameter this provider declared in
   * wia_provider_v1_t.params, as text (YAML section named after the
   * provider, or WIA_<PROVIDER>_<KEY>), or the declared default. Returns
   * NULL for an undeclared key. The pointer stays valid until fini(). */
  const char* (*get_param)(void* host_ctx, const char* key);

  /* Monotonic clock in nanoseconds (the core's time base, so provider
   * timestamps line up with the core's profiler). */
  uint64_t (*clock_ns)(void* host_ctx);

  /* Appended (check struct_size with WIA_ABI_HAS_FIELD): nonzero when a
   * line at `level` would be written, so a provider can skip formatting
   * trace lines on its data path. Absent: assume every level is on. */
  int32_t (*log_enabled)(void* host_ctx, wia_log_level_t level);
} wia_host_services_v1_t;

/* ------------------------------------------------------------------------ */
/* Declared parameters                                                       */
/* ------------------------------------------------------------------------ */

typedef enum wia_param_type {
  WIA_PARAM_INT = 0,    /* signed 64-bit, bounded by [min, max]          */
  WIA_PARAM_BOOL = 1,   /* true/false                                    */
  WIA_PARAM_STRING = 2, /* free text                                     */
  WIA_PARAM_SIZE = 3    /* bytes; YAML may say 64K, 4M, 1G               */
} wia_param_type_t;

/* One configurable key of a provider. The core validates the YAML section
 * and environment variables against this list (unknown keys, types, ranges)
 * before init(), so a provider only ever sees valid values. */
typedef struct wia_param_decl_v1 {
  uint32_t struct_size;
  wia_param_type_t type;
  const char* key;           /* e.g. "devices" -> YAML host.devices, env WIA_HOST_DEVICES */
  const char* default_value; /* text form of the default */
  const char* description;   /* one line, shown by wia-info --config */
  int64_t min_value;         /* INT/SIZE only, inclusive */
  int64_t max_value;         /* INT/SIZE only, inclusive */
} wia_param_decl_v1_t;

/* ------------------------------------------------------------------------ */
/* Device interface                                                          */
/* ------------------------------------------------------------------------ */

typedef struct wia_provider_stream_s* wia_provider_stream_t; /* opaque */
typedef struct wia_provider_event_s* wia_provider_event_t;   /* opaque */
typedef struct wia_provider_module_s* wia_provider_module_t; /* opaque, WIA_DEVICE_CAP_KERNEL */
typedef struct wia_provider_function_s* wia_provider_function_t; /* opaque */

typedef enum wia_device_type {
  WIA_DEVICE_CPU = 0,
  WIA_DEVICE_GPU = 1,
  WIA_DEVICE_ACCELERATOR = 2
} wia_device_type_t;

/* Device property flags. */
#define WIA_DEVICE_FLAG_HOST_ACCESSIBLE (1u << 0) /* device memory is ordinary host memory   */
#define WIA_DEVICE_FLAG_UNIFIED_ADDRESS (1u << 1) /* pointers identify their device uniquely */
/* A host function (launch_host_func) may block until work on OTHER streams
 * of the provider completes: each stream runs its host functions on its own
 * thread, and a blocked stream holds up no other. CUDA forbids such waits
 * (host functions of a process share one thread, and a blocked stream can
 * stall others), so its provider leaves this clear; the core then never
 * parks a stream in a waiting host function. Added after the first v1
 * release: a provider that does not know it leaves it clear. */
#define WIA_DEVICE_FLAG_WAITING_HOST_FUNC (1u << 2)
/* mem_device (below) is set. Added after the first v1 release. */
#define WIA_DEVICE_FLAG_MEM_DEVICE (1u << 3)

typedef struct wia_device_props_v1 {
  uint32_t struct_size; /* set by the caller to sizeof its struct */
  wia_device_type_t type;
  char name[128];        /* "Host CPU (NUMA 0)", "NVIDIA H200"        */
  char pci_bus_id[32];   /* "0000:17:00.0", empty when not on PCI     */
  uint64_t total_memory; /* bytes                                     */
  uint64_t free_memory;  /* bytes, best effort at the time of query   */
  int32_t numa_node;     /* -1 when unknown                           */
  uint32_t flags;        /* WIA_DEVICE_FLAG_*                         */
  uint32_t alignment;    /* every allocation is aligned to this       */
  /* WIA_MEM_IFACE_* (below) a transport registers this device's memory as:
   * CUDA, ROCM or ZE. 0 (WIA_MEM_IFACE_HOST) for host-accessible devices,
   * and what a provider written before this field (then `reserved`, left
   * 0) reports: its device memory is then staged, never handed to a
   * transport. The core names no vendor: this is how it knows. */
  uint32_t mem_iface;
  /* The vendor's ordinal of the device whose memory this device allocates,
   * as a transport names it when registering that memory
   * (wia_mr_desc_v1_t.device_id: libfabric's FI_HMEM device.cuda, a
   * CUdevice; the HIP or Level Zero device index). Valid when flags has
   * WIA_DEVICE_FLAG_MEM_DEVICE. It differs from the provider's own device
   * index where the provider splits one GPU into several devices
   * (cuda.logical_devices_per_gpu). Without the flag (a provider written
   * before this field) the core passes the provider's device index.
   * Added after the first v1 release. */
  int32_t mem_device;
} wia_device_props_v1_t;

/* Memory kinds for mem_alloc. */
#define WIA_MEM_DEVICE 0u      /* memory of the device                       */
#define WIA_MEM_HOST_PINNED 1u /* host memory the device can DMA to/from     */

/* Device capability bits (wia_device_ops_v1_t.caps): each announces the
 * optional entries named after it. */
#define WIA_DEVICE_CAP_HOST_FUNC (1ull << 0)    /* launch_host_func                    */
#define WIA_DEVICE_CAP_EVENT_TIMING (1ull << 1) /* event_elapsed_ms                    */
#define WIA_DEVICE_CAP_PEER (1ull << 2)         /* enable_peer_access, memcpy_peer_async */
#define WIA_DEVICE_CAP_IPC (1ull << 3)          /* ipc_get_handle/open/close            */
#define WIA_DEVICE_CAP_REDUCE (1ull << 4)       /* reduce_async                        */
#define WIA_DEVICE_CAP_PINNED_HOST (1ull << 5)  /* mem_alloc(WIA_MEM_HOST_PINNED)      */
#define WIA_DEVICE_CAP_SCALE (1ull << 6)        /* scale_async (appended entry)        */
#define WIA_DEVICE_CAP_KERNEL (1ull << 7)       /* module_load .. launch_kernel (appended) */
#define WIA_DEVICE_CAP_DMABUF (1ull << 8)       /* mem_export_dmabuf (appended)        */

/* Opaque, fixed-size, copyable IPC memory handle (CUDA's and HIP's are 64
 * bytes; Level Zero's carries a file descriptor number plus metadata). */
#define WIA_IPC_HANDLE_SIZE 128
typedef struct wia_ipc_handle {
  uint8_t bytes[WIA_IPC_HANDLE_SIZE];
} wia_ipc_handle_t;

/* Arguments of an on-device reduction:
 *   dst[i] = srcs[0][i] op srcs[1][i] op ... op srcs[nsrcs-1][i]
 *   then, when divisor > 1, dst[i] /= divisor (integer division truncates).
 * AVG is SUM with divisor = nsrcs when divisor is 0.
 * dst may alias srcs[0] exactly (in place); no other overlap is allowed.
 * All buffers are memory this device can address. A struct so it can grow. */
typedef struct wia_reduce_args_v1 {
  uint32_t struct_size;
  wia_datatype_t dtype;
  wia_reduce_op_t op;
  uint32_t nsrcs; /* >= 1 */
  uint64_t count; /* elements */
  uint64_t divisor;
  void* dst;
  const void* const* srcs; /* nsrcs pointers; array read during the call only */
} wia_reduce_args_v1_t;

typedef void (*wia_host_fn_t)(void* user_data);

/* A launch of a caller's kernel (launch_kernel): geometry and arguments.
 * args[i] points at argument i's bytes (as CUDA's kernelParams); the
 * provider copies what it needs before launch_kernel returns. */
typedef struct wia_kernel_launch_v1 {
  uint32_t struct_size;
  uint32_t grid[3];
  uint32_t block[3];
  uint32_t shared_bytes;
  uint32_t num_args;
  void* const* args;
} wia_kernel_launch_v1_t;

/* Device operations. `ctx` is the value init() stored. `dev` is the
 * provider-local device index in [0, device_count). Streams and events
 * belong to the device they were created on.
 *
 * Ordering: work enqueued on one stream runs in enqueue order; work on
 * different streams is unordered unless joined with stream_wait_event.
 * "Async" entries return once the work is enqueued and may return before it
 * runs; buffers must stay valid until the work completes. Async errors are
 * reported by the next stream_synchronize / event_synchronize on that
 * stream. Sync entries return when the work is complete. */
typedef struct wia_device_ops_v1 {
  uint32_t struct_size;
  uint32_t abi_version;
  uint64_t caps; /* WIA_DEVICE_CAP_* */
  /* "Must understand" bits: semantics the caller has to honour. A core
   * refuses a table with a bit it does not know (none are defined for
   * devices in v1; the field exists so that every v1 core refuses safely). */
  uint64_t must_understand;

  /* --- discovery (required) -------------------------------------------- */
  /* Never blocks long. Zero devices is a valid answer (no hardware). */
  wia_status_t (*device_count)(void* ctx, int32_t* count);
  /* Fills props up to props->struct_size bytes. Must not create device
   * contexts (cheap discovery). free_memory 0 means unknown. */
  wia_status_t (*device_props)(void* ctx, int32_t dev, wia_device_props_v1_t* props);

  /* --- memory (required) ----------------------------------------------- */
  /* Size 0 yields a unique non-NULL pointer that mem_free accepts. Out of
   * memory is WIA_ERROR_OUT_OF_MEMORY, never an abort. */
  wia_status_t (*mem_alloc)(void* ctx, int32_t dev, uint64_t size, uint32_t kind, void** ptr);
  /* May block. The caller guarantees no enqueued work still uses ptr. */
  wia_status_t (*mem_free)(void* ctx, int32_t dev, void* ptr);
  /* Synchronous: complete (and visible to the host) on return. May block.
   * Not ordered with any stream: the caller synchronises first. memset
   * uses `value` as an unsigned char. memcpy infers the direction from the
   * pointers (host<->device, device<->device of this provider), so v1
   * device providers need unified addressing (every planned one has it). */
  wia_status_t (*memset)(void* ctx, int32_t dev, void* ptr, int32_t value, uint64_t size);
  wia_status_t (*memcpy)(void* ctx, int32_t dev, void* dst, const void* src, uint64_t size);

  /* --- streams (required) ---------------------------------------------- */
  wia_status_t (*stream_create)(void* ctx, int32_t dev, wia_provider_stream_t* stream);
  /* Waits for enqueued work, then releases the stream. */
  wia_status_t (*stream_destroy)(void* ctx, wia_provider_stream_t stream);
  /* Blocks until all enqueued work is done; returns the first async error. */
  wia_status_t (*stream_synchronize)(void* ctx, wia_provider_stream_t stream);
  /* WIA_SUCCESS when idle, WIA_IN_PROGRESS when work is pending. */
  wia_status_t (*stream_query)(void* ctx, wia_provider_stream_t stream);
  wia_status_t (*memset_async)(void* ctx, wia_provider_stream_t stream, void* ptr, int32_t value,
                               uint64_t size);
  wia_status_t (*memcpy_async)(void* ctx, wia_provider_stream_t stream, void* dst, const void* src,
                               uint64_t size);

  /* --- events (required) ----------------------------------------------- */
  wia_status_t (*event_create)(void* ctx, int32_t dev, wia_provider_event_t* event);
  wia_status_t (*event_destroy)(void* ctx, wia_provider_event_t event);
  /* Captures the work enqueued on `stream` so far; re-recording replaces
   * the capture. Recording an event of another device is INVALID_HANDLE. */
  wia_status_t (*event_record)(void* ctx, wia_provider_event_t event, wia_provider_stream_t stream);
  /* WIA_SUCCESS when the captured work is done (or never recorded),
   * WIA_IN_PROGRESS otherwise. Never blocks. */
  wia_status_t (*event_query)(void* ctx, wia_provider_event_t event);
  wia_status_t (*event_synchronize)(void* ctx, wia_provider_event_t event);
  /* Later work on `stream` waits until `event` completes. Non-blocking. */
  wia_status_t (*stream_wait_event)(void* ctx, wia_provider_stream_t stream,
                                    wia_provider_event_t event);

  /* --- optional: WIA_DEVICE_CAP_EVENT_TIMING ---------------------------- */
  /* Milliseconds between two completed events of one device. */
  wia_status_t (*event_elapsed_ms)(void* ctx, wia_provider_event_t start, wia_provider_event_t end,
                                   float* ms);

  /* --- optional: WIA_DEVICE_CAP_HOST_FUNC ------------------------------- */
  /* Runs fn(user_data) on a provider thread once earlier work on the stream
   * is done; later work waits for fn to return. fn must not call any entry
   * of the provider. */
  wia_status_t (*launch_host_func)(void* ctx, wia_provider_stream_t stream, wia_host_fn_t fn,
                                   void* user_data);

  /* --- optional: WIA_DEVICE_CAP_PEER ------------------------------------ */
  /* Peer queries are required (answer 0 when there is no peer support);
   * enable_peer_access and memcpy_peer_async need the capability bit.
   * can_access: 1 when `dev` can read/write memory of `peer` directly. */
  wia_status_t (*can_access_peer)(void* ctx, int32_t dev, int32_t peer, int32_t* can_access);
  /* Idempotent: enabling twice is WIA_SUCCESS. */
  wia_status_t (*enable_peer_access)(void* ctx, int32_t dev, int32_t peer);
  /* Copies between two devices of this provider, ordered on `stream`
   * (which belongs to either device). */
  wia_status_t (*memcpy_peer_async)(void* ctx, wia_provider_stream_t stream, void* dst,
                                    int32_t dst_dev, const void* src, int32_t src_dev,
                                    uint64_t size);

  /* --- optional: WIA_DEVICE_CAP_IPC ------------------------------------- */
  /* Export an allocation (start pointer returned by mem_alloc) to another
   * process of the same node; open maps it there; close unmaps. */
  wia_status_t (*ipc_get_handle)(void* ctx, int32_t dev, void* ptr, wia_ipc_handle_t* handle);
  wia_status_t (*ipc_open_handle)(void* ctx, int32_t dev, const wia_ipc_handle_t* handle,
                                  void** ptr);
  wia_status_t (*ipc_close_handle)(void* ctx, int32_t dev, void* ptr);

  /* --- optional: WIA_DEVICE_CAP_REDUCE ---------------------------------- */
  /* Enqueue a reduction (see wia_reduce_args_v1_t) on `stream`. Providers
   * that cannot do a (dtype, op) pair return NOT_SUPPORTED for it.
   * float16/bfloat16 accumulate in float32 and round once per element;
   * float MIN/MAX propagate NaN; integer SUM/PROD wrap modulo 2^bits. */
  wia_status_t (*reduce_async)(void* ctx, wia_provider_stream_t stream,
                               const wia_reduce_args_v1_t* args);

  /* --- appended after the first v1 release ------------------------------
   * The core reads these only when struct_size covers them
   * (WIA_ABI_HAS_FIELD); a provider built against the first v1 header has
   * none, and they read as absent. */

  /* --- optional: WIA_DEVICE_CAP_SCALE ----------------------------------- */
  /* Enqueue buf[i] = buf[i] * factor for `count` elements of `dtype` on
   * `stream` (wia_scale on memory the core cannot address itself). The
   * result equals the core's host computation: float32 in float; every
   * other type in double, then stored as float16/bfloat16 rounded once
   * from float, or integers truncated toward zero through int64 and
   * wrapped to their width. */
  wia_status_t (*scale_async)(void* ctx, wia_provider_stream_t stream, void* buf, uint64_t count,
                              wia_datatype_t dtype, double factor);

  /* --- optional: WIA_DEVICE_CAP_KERNEL ---------------------------------- */
  /* The caller's own device code (wia_launch_kernel). module_load takes an
   * image in the device's native form (cuda: PTX, cubin or fatbin) of
   * `size` bytes, copied during the call; module_function finds a kernel
   * by name; launch_kernel enqueues it on a stream of the module's device.
   * A bad image or an unknown name is an error naming it; unloading a
   * module while launches of it are pending is the caller's error. */
  wia_status_t (*module_load)(void* ctx, int32_t dev, const void* image, uint64_t size,
                              wia_provider_module_t* module);
  wia_status_t (*module_unload)(void* ctx, wia_provider_module_t module);
  wia_status_t (*module_function)(void* ctx, wia_provider_module_t module, const char* name,
                                  wia_provider_function_t* function);
  wia_status_t (*launch_kernel)(void* ctx, wia_provider_stream_t stream,
                                wia_provider_function_t function,
                                const wia_kernel_launch_v1_t* launch);

  /* --- optional: WIA_DEVICE_CAP_DMABUF ---------------------------------- */
  /* Export device memory as a Linux dma-buf so that a NIC can reach it
   * (a transport's reg_mr with wia_mr_desc_v1_t.dmabuf_fd; GPUDirect RDMA
   * without a vendor kernel module). [ptr, ptr + size) lies inside one
   * allocation of `dev`; the provider may export a larger, page-aligned
   * range holding it: *offset is where ptr lies in the exported dma-buf.
   * The caller owns *fd and closes it (a registration made from it keeps
   * its own reference). NOT_SUPPORTED, with the reason, where the driver
   * or the device cannot export this memory. */
  wia_status_t (*mem_export_dmabuf)(void* ctx, int32_t dev, void* ptr, uint64_t size, int32_t* fd,
                                    uint64_t* offset);
} wia_device_ops_v1_t;

/* ------------------------------------------------------------------------ */
/* Transport interface (shaped after NCCL's net plugins and libfabric RDM)   */
/* ------------------------------------------------------------------------ */

typedef struct wia_listener_s* wia_listener_t; /* opaque */
typedef struct wia_conn_s* wia_conn_t;         /* opaque */
typedef struct wia_mr_s* wia_mr_t;             /* opaque */
typedef struct wia_request_s* wia_request_t;   /* opaque */

/* Connection handle: produced by listen(), carried to the peer by the
 * core's bootstrap, consumed by connect(). Opaque bytes. */
#define WIA_TRANSPORT_HANDLE_SIZE 128
/* Remote-access key of a registered region, for put/get. */
#define WIA_RKEY_SIZE 64

#define WIA_TRANSPORT_FLAG_RMA (1u << 0)           /* put/get offered               */
#define WIA_TRANSPORT_FLAG_DEVICE_MEMORY (1u << 1) /* reg_mr accepts device memory   */
#define WIA_TRANSPORT_FLAG_INTRA_NODE (1u << 2)    /* reaches peers on this node     */
#define WIA_TRANSPORT_FLAG_INTER_NODE (1u << 3)    /* reaches peers on other nodes   */
#define WIA_TRANSPORT_FLAG_REG_REQUIRED (1u << 4)  /* isend/irecv need an mr         */
#define WIA_TRANSPORT_FLAG_DMABUF (1u << 5)        /* reg_mr accepts a dma-buf fd    */

typedef struct wia_transport_props_v1 {
  uint32_t struct_size;
  uint32_t flags;            /* WIA_TRANSPORT_FLAG_*                         */
  char name[64];             /* endpoint name: "lo", "mlx5_0:1", "shm"       */
  char pci_bus_id[32];       /* NIC location, empty when none                */
  uint64_t speed_mbps;       /* link speed, 0 when unknown                   */
  double latency_us;         /* one-way small-message latency estimate       */
  uint64_t max_message_size; /* largest single isend                         */
  uint32_t max_requests;     /* outstanding requests per connection          */
  int32_t numa_node;
  uint32_t tag_bits;         /* usable tag bits, 32..64; the core never sets higher ones */
  uint32_t mem_ifaces;       /* bit (1 << WIA_MEM_IFACE_*) per interface reg_mr accepts */
} wia_transport_props_v1_t;

/* Memory kinds for reg_mr. */
#define WIA_MR_HOST 0u
#define WIA_MR_DEVICE 1u

#define WIA_TRANSPORT_CAP_RMA (1ull << 0)    /* put, get, mr_rkey          */
#define WIA_TRANSPORT_CAP_INLINE (1ull << 1) /* send_inline, recv_inline   */
#define WIA_TRANSPORT_CAP_WAIT_FD (1ull << 2) /* wait_fds                  */
/* The most pollfd entries wait_fds may need for one connection. */
#define WIA_TRANSPORT_WAIT_FDS_MAX 32

/* Receives must be posted in the peer's send order (NCCL-style plugins
 * without tag matching). */
#define WIA_TRANSPORT_REQ_ORDERED_RECV (1ull << 0)

/* Memory interfaces a registration can name (wia_mr_desc_v1_t.iface). */
#define WIA_MEM_IFACE_HOST 0u
#define WIA_MEM_IFACE_CUDA 1u
#define WIA_MEM_IFACE_ROCM 2u
#define WIA_MEM_IFACE_ZE 3u

/* What to register. A struct so that it can grow (dma-buf offsets, ...). */
typedef struct wia_mr_desc_v1 {
  uint32_t struct_size;
  uint32_t kind;          /* WIA_MR_HOST or WIA_MR_DEVICE                   */
  void* ptr;
  uint64_t size;
  uint32_t iface;         /* WIA_MEM_IFACE_*                                */
  int32_t dmabuf_fd;      /* -1 unless WIA_TRANSPORT_FLAG_DMABUF and given  */
  uint64_t device_id;     /* vendor device ordinal for device memory        */
  uint64_t dmabuf_offset; /* offset of ptr inside the dma-buf               */
} wia_mr_desc_v1_t;

/* Transport operations. A connection is bidirectional and reliable.
 * Messages on one connection with the same tag are matched in order: the
 * n-th isend with tag T meets the n-th irecv with tag T. A receive buffer
 * larger than the message is fine (test() reports the size); a smaller
 * one is WIA_ERROR_REMOTE for that request, never an overflow.
 *
 * Non-blocking everywhere: connect/accept return WIA_IN_PROGRESS with the
 * out handle NULL until the connection is up (the core calls again);
 * isend/irecv may return WIA_SUCCESS with *request NULL to say "no
 * resources now, retry"; test() never blocks. The core drives progress by
 * calling test(); a provider may also progress from its own thread. */
typedef struct wia_transport_ops_v1 {
  uint32_t struct_size;
  uint32_t abi_version;
  uint64_t caps;     /* WIA_TRANSPORT_CAP_* */
  uint64_t must_understand; /* WIA_TRANSPORT_REQ_*: refused by a core that does not know a bit */

  /* Endpoints (NICs, shared-memory domain): zero is a valid answer. */
  wia_status_t (*endpoint_count)(void* ctx, int32_t* count);
  wia_status_t (*endpoint_props)(void* ctx, int32_t endpoint, wia_transport_props_v1_t* props);

  /* Fills `handle` (WIA_TRANSPORT_HANDLE_SIZE bytes) with what a peer needs
   * to connect. Never blocks. One listener serves many peers. */
  wia_status_t (*listen)(void* ctx, int32_t endpoint, void* handle, wia_listener_t* listener);
  /* Starts or continues connecting. `*conn` is in/out: NULL on the first
   * call; on WIA_IN_PROGRESS it holds a pending connection that the core
   * passes back on the next call (or close()s to abandon the attempt, so
   * a core that gives up leaks nothing). WIA_SUCCESS: established.
   * `cookie` (8 bytes chosen by the core) is delivered to the accepting
   * side so one listener can tell its peers apart. */
  wia_status_t (*connect)(void* ctx, int32_t endpoint, const void* handle, uint64_t cookie,
                          wia_conn_t* conn);
  /* Returns one established connection (WIA_SUCCESS, *conn set, *cookie =
   * the connector's cookie) or WIA_IN_PROGRESS with *conn NULL. */
  wia_status_t (*accept)(void* ctx, wia_listener_t listener, uint64_t* cookie, wia_conn_t* conn);
  /* Accepted connections stay open. */
  wia_status_t (*close_listener)(void* ctx, wia_listener_t listener);

  /* Register memory of an endpoint's domain for isend/irecv/put/get on any
   * connection of that endpoint. WIA_MR_DEVICE needs
   * WIA_TRANSPORT_FLAG_DEVICE_MEMORY and the iface bit in mem_ifaces; the
   * core registers each device allocation once per endpoint, through its
   * dma-buf (dmabuf_fd) when the transport sets WIA_TRANSPORT_FLAG_DMABUF,
   * else by address (dmabuf_fd -1), and passes that registration with every
   * transfer on device memory (never a bare device pointer).
   * WIA_ERROR_NOT_SUPPORTED: the core stages that allocation instead. */
  wia_status_t (*reg_mr)(void* ctx, int32_t endpoint, const wia_mr_desc_v1_t* desc, wia_mr_t* mr);
  wia_status_t (*dereg_mr)(void* ctx, wia_mr_t mr);

  /* Post a tagged send or receive. `mr` may be NULL unless the transport
   * sets WIA_TRANSPORT_FLAG_REG_REQUIRED. The buffer must stay valid until
   * test() reports completion. */
  wia_status_t (*isend)(void* ctx, wia_conn_t conn, const void* buf, uint64_t size, uint64_t tag,
                        wia_mr_t mr, wia_request_t* request);
  wia_status_t (*irecv)(void* ctx, wia_conn_t conn, void* buf, uint64_t size, uint64_t tag,
                        wia_mr_t mr, wia_request_t* request);
  /* *done = 1 when complete (the request is then released and must not be
   * used again); *size = bytes transferred. A failed request returns a
   * negative status and is released too. A peer that went away fails every
   * pending request on its connection with WIA_ERROR_REMOTE. A receive into
   * device memory is done only once the device sees the data (the provider
   * flushes). Zero-byte messages are valid. A completed put is visible at
   * the target before any later message on that connection arrives. */
  wia_status_t (*test)(void* ctx, wia_request_t request, int32_t* done, uint64_t* size);

  /* Closes a connection (or abandons a pending connect); pending requests
   * fail and are released. Never blocks long. */
  wia_status_t (*close)(void* ctx, wia_conn_t conn);

  /* --- optional: WIA_TRANSPORT_CAP_RMA ---------------------------------- */
  /* Serialise the remote-access key of `mr` (WIA_RKEY_SIZE bytes) so the
   * peer can put/get at addresses inside it. */
  wia_status_t (*mr_rkey)(void* ctx, wia_mr_t mr, void* rkey);
  wia_status_t (*put)(void* ctx, wia_conn_t conn, const void* local, uint64_t size, wia_mr_t mr,
                      uint64_t remote_addr, const void* rkey, wia_request_t* request);
  wia_status_t (*get)(void* ctx, wia_conn_t conn, void* local, uint64_t size, wia_mr_t mr,
                      uint64_t remote_addr, const void* rkey, wia_request_t* request);

  /* --- optional: WIA_TRANSPORT_CAP_INLINE ------------------------------- */
  /* Small messages without request objects, for latency-bound collectives
   * (a request's life - post, queue, test, release - costs as much as an
   * 8-byte message itself). Both entries are fast-path shortcuts: a
   * provider may decline any call, and the caller then uses isend/irecv.
   *
   * send_inline copies `size` bytes from `buf` and sends them now.
   * WIA_SUCCESS: sent, exactly as if an isend had been posted and completed
   * at once (ordered with the connection's isends), and delivered without
   * any further call on this side: no request is left to drive. WIA_IN_PROGRESS:
   * nothing was sent (too large for this path, or no room now); the caller
   * retries or uses isend. A failed connection is WIA_ERROR_REMOTE.
   *
   * recv_inline takes the next message of `tag` on `conn` if it has
   * arrived: *done = 1, *size = its bytes, copied to `buf`; *done = 0 when
   * it has not (progress is driven as by test()). A message larger than
   * `capacity` is consumed and fails the call with WIA_ERROR_REMOTE, as it
   * would an irecv. WIA_ERROR_NOT_SUPPORTED, consuming nothing: the next
   * message of `tag` is one only irecv can take (a large one), or an irecv
   * of `tag` is still pending on `conn`; the caller then posts irecv. A
   * message that arrived before the peer went away is still delivered. */
  wia_status_t (*send_inline)(void* ctx, wia_conn_t conn, const void* buf, uint64_t size,
                              uint64_t tag);
  wia_status_t (*recv_inline)(void* ctx, wia_conn_t conn, void* buf, uint64_t capacity,
                              uint64_t tag, int32_t* done, uint64_t* size);

  /* --- optional: WIA_TRANSPORT_CAP_WAIT_FD ------------------------------ */
  /* Lets a core with nothing to do sleep in poll(2) until `conn` can make
   * progress, instead of calling test() in a loop: with more ranks than
   * cores a polling rank holds a core its peers need (docs/provider-abi.md
   * measures it). Fills fds[0 .. *count) (struct pollfd from <poll.h>, at
   * most `capacity` entries; WIA_TRANSPORT_WAIT_FDS_MAX always suffices)
   * with descriptors and events that become ready when test() on `conn`
   * may make progress: a message arriving, room to send queued data, the
   * peer going away. The core polls them with a timeout of its own and
   * then calls test() as usual; a spurious wake-up is harmless.
   * WIA_IN_PROGRESS, *count = 0: do not wait now (progress is possible
   * without an event, or the connection is failing or being set up); call
   * test(). Never blocks. */
  wia_status_t (*wait_fds)(void* ctx, wia_conn_t conn, struct pollfd* fds, uint32_t capacity,
                           uint32_t* count);
} wia_transport_ops_v1_t;

/* ------------------------------------------------------------------------ */
/* The provider descriptor                                                   */
/* ------------------------------------------------------------------------ */

#define WIA_PROVIDER_CAP_DEVICE (1ull << 0)    /* `device` is set    */
#define WIA_PROVIDER_CAP_TRANSPORT (1ull << 1) /* `transport` is set */

/* Exported as `const wia_provider_v1_t wia_provider_v1`. */
typedef struct wia_provider_v1 {
  uint32_t struct_size; /* sizeof(wia_provider_v1_t) as the provider built it */
  uint32_t abi_version; /* WIA_PROVIDER_ABI_VERSION the provider was built for */
  /* Short, [a-z0-9_]+, unique, and equal to NAME in the file name
   * libwia-provider-NAME.so: "host", "tcp". */
  const char* name;
  const char* version;  /* the provider's own version text                */
  uint64_t caps;        /* WIA_PROVIDER_CAP_*                              */
  /* Lowest host-services version this provider can work with. The core
   * refuses the provider when it offers less. */
  uint32_t host_services_version;
  uint32_t num_params;
  /* num_params entries (NULL if 0), all of the size params[0].struct_size:
   * the core steps through the array by that stride. */
  const wia_param_decl_v1_t* params;

  /* Called once after loading. Returns WIA_ERROR_UNAVAILABLE (with a
   * set_error message such as "libcuda.so.1 not found") when the hardware
   * or driver is absent: the core records the provider as absent, not
   * broken. Stores the provider's context in *ctx. `host` stays valid until
   * fini() returns. May block (driver initialisation). */
  wia_status_t (*init)(const wia_host_services_v1_t* host, void** ctx);
  /* Releases everything init created. Called once, after all handles of
   * this provider are released. */
  wia_status_t (*fini)(void* ctx);

  const wia_device_ops_v1_t* device;       /* non-NULL iff CAP_DEVICE    */
  const wia_transport_ops_v1_t* transport; /* non-NULL iff CAP_TRANSPORT */
} wia_provider_v1_t;

#ifdef __cplusplus
}
#endif

#endif /* WIA_PROVIDER_H */
