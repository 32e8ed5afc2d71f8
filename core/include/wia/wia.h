/* SPDX-License-Identifier: Apache-2.0 */
/*
 * wia/wia.h - the public C API of libwia (WIA-AI-011 chapter 6).
 *
 * Function and type names follow the specification. Every function that
 * returns wia_status_t validates its arguments and returns a negative
 * status on failure; the message explaining the most recent failure on the
 * calling thread is wia_get_last_error(). Nothing here aborts the process.
 *
 * The library initialises itself on first use (configuration from the file
 * named by WIA_CONFIG, or the embedded defaults, plus WIA_* environment
 * variables). wia_init_with_config() chooses a file explicitly.
 *
 * Thread safety: every function may be called from any thread. The
 * "current device" (wia_set_device) is per thread, as in CUDA.
 */
#ifndef WIA_WIA_H
#define WIA_WIA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <wia/status.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define WIA_API __attribute__((visibility("default")))
#else
#define WIA_API
#endif

#define WIA_VERSION_MAJOR 0
#define WIA_VERSION_MINOR 1
#define WIA_VERSION_PATCH 0

/* ---------------------------------------------------------------------- */
/* Library, errors                                                         */
/* ---------------------------------------------------------------------- */

/* Explicit initialisation (optional: any call initialises lazily).
 * Idempotent while the library is up. */
WIA_API wia_status_t wia_init(void);
/* Initialise from a YAML file instead of WIA_CONFIG. Fails with
 * WIA_ERROR_INVALID_ARGUMENT if the library is already initialised. */
WIA_API wia_status_t wia_init_with_config(const char* yaml_path);
/* Releases every device, stream, event and provider. Handles become
 * invalid. A later call initialises again. */
WIA_API wia_status_t wia_finalize(void);

/* "WIA_ERROR_TIMEOUT: a bounded wait expired" style text. Never NULL. */
WIA_API const char* wia_status_string(wia_status_t status);
/* Message of the last failed call on this thread ("" when none). The
 * pointer stays valid until the next failing call on this thread. */
WIA_API const char* wia_get_last_error(void);

/* ---------------------------------------------------------------------- */
/* Devices                                                                 */
/* ---------------------------------------------------------------------- */

/* A device is a global index over the devices of all loaded device
 * providers, in provider load order: 0 .. wia_get_device_count()-1. */
typedef int32_t wia_device_t;

typedef enum wia_device_kind {
  WIA_DEVICE_KIND_CPU = 0,
  WIA_DEVICE_KIND_GPU = 1,
  WIA_DEVICE_KIND_ACCELERATOR = 2
} wia_device_kind_t;

typedef struct wia_device_properties {
  wia_device_kind_t kind;
  char name[128];
  char provider[32];     /* "host", "cuda", ...                         */
  int32_t provider_index; /* index of the device inside its provider    */
  char pci_bus_id[32];
  uint64_t total_memory;
  uint64_t free_memory;
  int32_t numa_node;
  uint32_t alignment;
} wia_device_properties_t;

WIA_API wia_status_t wia_get_device_count(int* count);
WIA_API wia_status_t wia_get_device_properties(wia_device_t device, wia_device_properties_t* props);
/* Sets the calling thread's current device (default 0). */
WIA_API wia_status_t wia_set_device(wia_device_t device);
WIA_API wia_status_t wia_get_device(wia_device_t* device);

/* ---------------------------------------------------------------------- */
/* Memory                                                                  */
/* ---------------------------------------------------------------------- */

/* Allocate on the current device. size 0 gives a valid, unique pointer. */
WIA_API wia_status_t wia_malloc(void** ptr, size_t size);
/* Allocate on a given device. */
WIA_API wia_status_t wia_malloc_on(wia_device_t device, void** ptr, size_t size);
/* Page-locked host memory usable for fast transfers with the current
 * device (ordinary aligned memory on host devices). */
WIA_API wia_status_t wia_malloc_host(void** ptr, size_t size);
/* Frees memory from any wia_malloc*. A pointer not from wia_malloc*, or
 * freed twice, is WIA_ERROR_INVALID_ARGUMENT (never a crash). */
WIA_API wia_status_t wia_free(void* ptr);
/* The device an allocation belongs to (any address inside it). */
WIA_API wia_status_t wia_pointer_get_device(const void* ptr, wia_device_t* device);

/* ---------------------------------------------------------------------- */
/* Streams and events                                                      */
/* ---------------------------------------------------------------------- */

typedef struct wia_stream_s* wia_stream_t; /* NULL = current device's default stream */
typedef struct wia_event_s* wia_event_t;

/* A stream on the current device / on a given device. */
WIA_API wia_status_t wia_create_stream(wia_stream_t* stream);
WIA_API wia_status_t wia_create_stream_on(wia_device_t device, wia_stream_t* stream);
/* Waits for the stream's work, then destroys it. */
WIA_API wia_status_t wia_destroy_stream(wia_stream_t stream);
WIA_API wia_status_t wia_stream_get_device(wia_stream_t stream, wia_device_t* device);
/* Blocks until all work on the stream is done; returns its first error. */
WIA_API wia_status_t wia_stream_synchronize(wia_stream_t stream);
/* WIA_SUCCESS if idle, WIA_IN_PROGRESS if work is pending. */
WIA_API wia_status_t wia_stream_query(wia_stream_t stream);
/* Later work on `stream` waits for the event's captured work. */
WIA_API wia_status_t wia_stream_wait_event(wia_stream_t stream, wia_event_t event);
/* Later work on `waiting` waits for everything enqueued on `waited` so
 * far (an event recorded on `waited`, waited on by `waiting`). */
WIA_API wia_status_t wia_stream_wait_stream(wia_stream_t waiting, wia_stream_t waited);

/* Events may be recorded on a stream of any device. */
WIA_API wia_status_t wia_create_event(wia_event_t* event);
WIA_API wia_status_t wia_destroy_event(wia_event_t event);
WIA_API wia_status_t wia_event_record(wia_event_t event, wia_stream_t stream);
/* WIA_SUCCESS if complete (or never recorded), WIA_IN_PROGRESS otherwise. */
WIA_API wia_status_t wia_event_query(wia_event_t event);
WIA_API wia_status_t wia_event_synchronize(wia_event_t event);
/* Milliseconds between two completed events recorded on one device. */
WIA_API wia_status_t wia_event_elapsed_time(float* ms, wia_event_t start, wia_event_t end);

/* Run fn(user_data) on a runtime thread once earlier work on the stream is
 * done; later work on the stream waits for it. fn must not synchronise on
 * its own stream. */
typedef void (*wia_host_fn_t)(void* user_data);
WIA_API wia_status_t wia_launch_host_func(wia_stream_t stream, wia_host_fn_t fn, void* user_data);

/* Copies within / between devices, ordered on a stream (async) or complete
 * on return (sync). The devices are found from the pointers; host memory
 * not from wia_malloc is accepted as plain host memory. */
WIA_API wia_status_t wia_memcpy(void* dst, const void* src, size_t size);
WIA_API wia_status_t wia_memcpy_async(void* dst, const void* src, size_t size,
                                      wia_stream_t stream);
WIA_API wia_status_t wia_memset(void* ptr, int value, size_t size);
WIA_API wia_status_t wia_memset_async(void* ptr, int value, size_t size, wia_stream_t stream);

/* ---------------------------------------------------------------------- */
/* Peer-to-peer (spec 6.3)                                                 */
/* ---------------------------------------------------------------------- */

/* Lets `device` access memory of `peer` directly. Idempotent. Returns
 * WIA_ERROR_NOT_SUPPORTED when the pair cannot peer (copies between them
 * still work, staged through host memory). */
WIA_API wia_status_t wia_enable_peer_access(wia_device_t device, wia_device_t peer);
/* true when direct access is possible (enabled or not). false on error,
 * with wia_get_last_error() saying why. */
WIA_API bool wia_can_access_peer(wia_device_t device, wia_device_t peer);

/* Copy between allocations of two devices: direct when the devices can
 * peer, staged through pinned host memory otherwise. The sync form returns
 * when the copy is complete; the async form is ordered on `stream`. */
WIA_API wia_status_t wia_memcpy_peer(void* dst, const void* src, size_t size, wia_stream_t stream);
WIA_API wia_status_t wia_memcpy_peer_async(void* dst, const void* src, size_t size,
                                           wia_stream_t stream);

typedef struct wia_memcpy_peer_batched {
  void* dst;
  const void* src;
  size_t size;
} wia_memcpy_peer_batched_t;

/* Many peer copies as one submission (ordered on `stream`, asynchronous).
 * Either all entries are valid and enqueued, or none is and the error
 * names the first bad entry index. */
WIA_API wia_status_t wia_memcpy_peer_batched(const wia_memcpy_peer_batched_t* batch, size_t count,
                                             wia_stream_t stream);

/* Spec 6.4.1: buffer[i] *= factor for `count` float32 elements, posted on
 * `stream` after its earlier work (e.g. to average an all-reduced sum).
 * _ex takes any datatype: half types round once per element, integers
 * truncate. Memory the host can address (host memory, or device memory of
 * host-accessible devices), or memory of a device whose provider has a
 * scale kernel (cuda); other devices: WIA_ERROR_NOT_SUPPORTED. */
WIA_API wia_status_t wia_scale(void* buffer, double factor, size_t count, wia_stream_t stream);
WIA_API wia_status_t wia_scale_ex(void* buffer, double factor, size_t count,
                                  wia_datatype_t datatype, wia_stream_t stream);

/* Spec 6.3: wia_launch_kernel(kernel, stream). The seed leaves out what a
 * kernel is; in libwia it is a function of a module the caller loads for
 * one device, with its launch geometry and arguments bound to it, so the
 * launch itself needs nothing else:
 *
 *   wia_module_t m;  wia_kernel_t k;
 *   wia_module_load(device, ptx, strlen(ptx) + 1, &m);   // cuda: PTX, cubin or fatbin
 *   wia_kernel_create(m, "scale_by", &k);                 // an extern "C" __global__
 *   wia_kernel_set_launch(k, (uint32_t[3]){blocks, 1, 1}, (uint32_t[3]){256, 1, 1}, 0);
 *   wia_kernel_set_arg(k, 0, &ptr, sizeof ptr);           // copied now
 *   wia_kernel_set_arg(k, 1, &n, sizeof n);
 *   wia_launch_kernel(k, stream);                         // stream of the module's device
 *
 * Devices whose provider runs no device code (host devices: use
 * wia_launch_host_func) answer WIA_ERROR_NOT_SUPPORTED naming the device.
 * A kernel launches with the arguments set when wia_launch_kernel is
 * called; every argument up to the highest index set must be set. */
typedef struct wia_module_s* wia_module_t;
typedef struct wia_kernel_s* wia_kernel_t;
WIA_API wia_status_t wia_module_load(wia_device_t device, const void* image, size_t size,
                                     wia_module_t* module);
/* Kernels of the module must be destroyed first, and no launch pending. */
WIA_API wia_status_t wia_module_unload(wia_module_t module);
WIA_API wia_status_t wia_kernel_create(wia_module_t module, const char* name,
                                       wia_kernel_t* kernel);
WIA_API wia_status_t wia_kernel_set_launch(wia_kernel_t kernel, const uint32_t grid[3],
                                           const uint32_t block[3], uint32_t shared_bytes);
WIA_API wia_status_t wia_kernel_set_arg(wia_kernel_t kernel, uint32_t index, const void* value,
                                        size_t size);
WIA_API wia_status_t wia_launch_kernel(wia_kernel_t kernel, wia_stream_t stream);
WIA_API wia_status_t wia_kernel_destroy(wia_kernel_t kernel);

/* ---------------------------------------------------------------------- */
/* Communicators and collectives (spec 6.4 - 6.6)                          */
/* ---------------------------------------------------------------------- */

typedef struct wia_communicator_s* wia_communicator_t;

typedef enum wia_collective_op {
  WIA_COLLECTIVE_ALLREDUCE = 0,
  WIA_COLLECTIVE_BROADCAST = 1,
  WIA_COLLECTIVE_REDUCE = 2,
  WIA_COLLECTIVE_ALLGATHER = 3,
  WIA_COLLECTIVE_REDUCE_SCATTER = 4,
  WIA_COLLECTIVE_ALLTOALL = 5,
  WIA_COLLECTIVE_SENDRECV = 6
} wia_collective_op_t;

/* Algorithms. One id per idea, valid for every collective that has it
 * (docs/collectives.md lists which). The WIA_ALLREDUCE_* names are the
 * spec's spellings of the same ids. */
typedef enum wia_algorithm_id {
  WIA_ALGORITHM_AUTO = 0, /* the tuner chooses (cost model, YAML, WIA_ALGO) */
  WIA_ALGORITHM_RING = 1,
  WIA_ALGORITHM_TREE = 2,
  WIA_ALGORITHM_BINOMIAL = 3,
  WIA_ALGORITHM_RABENSEIFNER = 4,
  WIA_ALGORITHM_RECURSIVE_DOUBLING = 5,
  WIA_ALGORITHM_RECURSIVE_HALVING = 6,
  WIA_ALGORITHM_BRUCK = 7,
  WIA_ALGORITHM_CHAIN = 8,
  WIA_ALGORITHM_SCATTER_ALLGATHER = 9,
  WIA_ALGORITHM_DIRECT = 10,
  WIA_ALGORITHM_PAIRWISE = 11,
  WIA_ALGORITHM_HIERARCHICAL = 12, /* all-reduce: reduce in node, leaders, broadcast */
  WIA_ALGORITHM_ONE_SHOT = 13,     /* all-reduce: every rank sends its vector to all */
  WIA_ALLREDUCE_RING = WIA_ALGORITHM_RING,
  WIA_ALLREDUCE_TREE = WIA_ALGORITHM_TREE,
  WIA_ALLREDUCE_RABENSEIFNER = WIA_ALGORITHM_RABENSEIFNER
} wia_algorithm_id_t;

/* Options of one collective call. Zero-initialised fields mean defaults:
 * algorithm AUTO, num_chunks chosen by the tuner, timeout from the
 * configuration (collectives.timeout_ms). `operation` is checked against
 * the function called when set (non-zero) or always for ALLREDUCE (0). */
typedef struct wia_collective_config {
  wia_collective_op_t operation;
  wia_reduce_op_t reduction_op;
  wia_datatype_t datatype;
  wia_algorithm_id_t algorithm;
  uint32_t num_chunks; /* pipeline depth; 0 = tuner's choice */
  uint32_t timeout_ms; /* 0 = configured default */
} wia_collective_config_t;

/* What AUTO chose for the last collective posted on a communicator. */
typedef struct wia_algorithm {
  wia_algorithm_id_t id;
  const char* name;         /* "ring", "tree", ... static storage */
  const char* collective;   /* "allreduce", ... static storage */
  double estimated_time_ms; /* cost-model estimate for that call */
} wia_algorithm_t;

/* Spec 6.5's descriptive record of an algorithm's cost. */
typedef struct wia_algorithm_profile {
  const char* name;
  double latency;
  double bandwidth_cost;
  const char* optimal_for;
  wia_algorithm_id_t algorithm;
} wia_algorithm_profile_t;

/* A communicator over devices of this process: rank i is devices[i].
 * Devices must be distinct. The rank of a call is the rank of the device
 * its stream belongs to (NULL stream: the current device). */
WIA_API wia_status_t wia_create_communicator(const wia_device_t* devices, int ndevices,
                                             wia_communicator_t* comm);
/* Waits for posted collectives, then releases the communicator. */
WIA_API wia_status_t wia_destroy_communicator(wia_communicator_t comm);
/* Number of ranks; -1 on error. */
WIA_API int wia_comm_size(wia_communicator_t comm);
/* Rank of the calling thread's current device in comm; -1 if it is not a
 * member (or on error). */
WIA_API int wia_comm_rank(wia_communicator_t comm);
/* Rank of a device in comm; -1 if it is not a member. */
WIA_API int wia_comm_rank_of_device(wia_communicator_t comm, wia_device_t device);
/* The first asynchronous error of comm (WIA_SUCCESS if none): a peer that
 * never posted within the timeout, mismatched calls, a failed copy. */
WIA_API wia_status_t wia_comm_get_async_error(wia_communicator_t comm);
/* ncclCommAbort: stops every operation of comm on this rank (running or
 * queued ones fail with WIA_ERROR_ABORTED, reported by the streams they
 * were posted on), closes its connections, so that the other ranks fail at
 * once naming this one instead of waiting for their timeout, and releases
 * comm, which is invalid afterwards. Any thread may call it, e.g. a
 * watchdog while another thread waits on a stream. */
WIA_API wia_status_t wia_comm_abort(wia_communicator_t comm);
/* Spec 6.9: whether comm has failed: a member died, lost its connection or
 * did not answer within the timeout, or another error (a mismatch, an
 * abort) made comm unusable. Cheap (no communication), so it may be called
 * every iteration; failures are found by the operations that meet them,
 * within collectives.timeout_ms, and every surviving rank learns of them;
 * a rank reported by wia_report_failure counts too.
 * false for a NULL or unknown comm (wia_get_last_error says why). */
WIA_API bool wia_detect_device_failure(wia_communicator_t comm);
/* The ranks of comm known to have failed (died, lost their connection, or
 * did not answer within the timeout), ascending: at most `capacity` into
 * `ranks` (may be NULL when capacity is 0), how many there are into *count.
 * Device communicators (one process) report none. */
WIA_API wia_status_t wia_comm_get_failed(wia_communicator_t comm, int* ranks, int capacity,
                                         int* count);

/* Collectives are posted on `stream` and return at once; they start when
 * the stream's earlier work is done, and later work on the stream waits
 * for them. Every rank must post the same sequence of collectives with the
 * same count, datatype, op and root: a mismatch is WIA_ERROR_MISMATCH on
 * every rank (returned by the call that completes the set, and by
 * wia_stream_synchronize / wia_comm_get_async_error on the others).
 * In place: recvbuf == sendbuf (all-gather: sendbuf == recvbuf +
 * rank * count elements; reduce-scatter: recvbuf == sendbuf + rank * count
 * elements). */
WIA_API wia_status_t wia_all_reduce(wia_communicator_t comm, const void* sendbuf, void* recvbuf,
                                    size_t count, const wia_collective_config_t* config,
                                    wia_stream_t stream);
WIA_API wia_status_t wia_broadcast(wia_communicator_t comm, void* buf, size_t count, int root_rank,
                                   wia_datatype_t datatype, wia_stream_t stream);
/* Out-of-place broadcast with options (NCCL's ncclBroadcast). */
WIA_API wia_status_t wia_broadcast_ex(wia_communicator_t comm, const void* sendbuf, void* recvbuf,
                                      size_t count, int root_rank,
                                      const wia_collective_config_t* config, wia_stream_t stream);
WIA_API wia_status_t wia_reduce(wia_communicator_t comm, const void* sendbuf, void* recvbuf,
                                size_t count, int root_rank, const wia_collective_config_t* config,
                                wia_stream_t stream);
/* count = elements each rank contributes; recvbuf holds size * count. */
WIA_API wia_status_t wia_all_gather(wia_communicator_t comm, const void* sendbuf, void* recvbuf,
                                    size_t count, wia_datatype_t datatype, wia_stream_t stream);
WIA_API wia_status_t wia_all_gather_ex(wia_communicator_t comm, const void* sendbuf, void* recvbuf,
                                       size_t count, const wia_collective_config_t* config,
                                       wia_stream_t stream);
/* recvcount = elements each rank receives; sendbuf holds size * recvcount. */
WIA_API wia_status_t wia_reduce_scatter(wia_communicator_t comm, const void* sendbuf,
                                        void* recvbuf, size_t recvcount,
                                        const wia_collective_config_t* config,
                                        wia_stream_t stream);
/* Spec 6.4.5 form: send_shards and recv_shards each point to an array of
 * size() buffer pointers (e.g. `float* input_shards[n]`); shard j of this
 * rank goes to rank j, shard j received comes from rank j. */
WIA_API wia_status_t wia_all_to_all(wia_communicator_t comm, void* send_shards, void* recv_shards,
                                    size_t shard_count, const wia_collective_config_t* config,
                                    wia_stream_t stream);
/* NCCL form: contiguous buffers of size() * shard_count elements. */
WIA_API wia_status_t wia_all_to_all_contiguous(wia_communicator_t comm, const void* sendbuf,
                                               void* recvbuf, size_t shard_count,
                                               const wia_collective_config_t* config,
                                               wia_stream_t stream);

/* Point-to-point between two ranks (NCCL's ncclSend/ncclRecv): the n-th
 * send from rank a to rank b matches the n-th receive on b from a; count
 * and datatype must agree (WIA_ERROR_MISMATCH on both sides otherwise).
 * Posted on the stream like a collective; the sender's buffer is reusable
 * once its stream has passed the send. timeout_ms 0 = configured default. */
WIA_API wia_status_t wia_comm_send(wia_communicator_t comm, const void* buf, size_t count,
                                   wia_datatype_t datatype, int peer, wia_stream_t stream);
WIA_API wia_status_t wia_comm_recv(wia_communicator_t comm, void* buf, size_t count,
                                   wia_datatype_t datatype, int peer, wia_stream_t stream);

/* Group calls, as NCCL users write them. Posting never blocks here, so the
 * deadlock NCCL groups exist to prevent cannot happen; calls inside a group
 * still post at once, and wia_group_end returns the first error any of them
 * returned (so a loop over devices can be checked once). Groups nest. */
WIA_API wia_status_t wia_group_start(void);
WIA_API wia_status_t wia_group_end(void);

WIA_API wia_algorithm_t wia_get_selected_algorithm(wia_communicator_t comm);

/* Topology discovery and analysis (spec 6.2, 6.2.1). */
#include <wia/topology.h>
/* Communicators across processes and nodes (spec 6.6, 6.10). */
#include <wia/distributed.h>
/* Gradient compression (spec 6.8). */
#include <wia/compression.h>
/* Checkpoints (spec 6.9). */
#include <wia/checkpoint.h>
/* Redundant gradient computation (spec 6.9.1). */
#include <wia/redundancy.h>
/* Communication profiling (spec 6.11). */
#include <wia/profiling.h>
/* Revoke, agree, shrink: going on without a failed rank (spec 6.9). */
#include <wia/fault_tolerance.h>

#ifdef __cplusplus
}
#endif

#endif /* WIA_WIA_H */
