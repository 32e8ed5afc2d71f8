/* SPDX-License-Identifier: Apache-2.0 */
/* Process-based communicators across processes and nodes (WIA-AI-011 6.6,
 * 6.6.1, 6.10). Included by <wia/wia.h>; needs its types.
 *
 * One rank per process, on the calling thread's current device. Peers are
 * reached through transport providers: shm inside a node, tcp between
 * nodes, by default (WIA_TRANSPORT=tcp forces a transport; docs/processes.md
 * documents the rules, the launchers and the failure semantics).
 *
 * Three ways to create one, all collective over the job's processes:
 *   - wia_create_distributed_communicator: the launcher's variables
 *     (mpirun, srun, torchrun, or WIA_RANK/WIA_WORLD_SIZE/WIA_ROOT_ADDR);
 *   - wia_get_unique_id on one process, passed to the others by the
 *     application's own means, then wia_create_communicator_from_id (as
 *     with ncclGetUniqueId / ncclCommInitRank);
 *   - wia_comm_split of an existing process communicator.
 *
 * Failures: the first error of a process communicator (mismatched calls,
 * a dead or unreachable peer, a timeout) is reported on every surviving
 * rank within collectives.timeout_ms, and the communicator is unusable
 * afterwards (as after ncclCommAbort): destroy it. */
#ifndef WIA_DISTRIBUTED_H
#define WIA_DISTRIBUTED_H

#ifdef __cplusplus
extern "C" {
#endif

/* A job's rendezvous ticket: plain bytes, copy it with memcpy. It holds the
 * root's address and the job's secret: whoever has it can join the job. */
#define WIA_UNIQUE_ID_BYTES 128
typedef struct wia_unique_id {
  char internal[WIA_UNIQUE_ID_BYTES];
} wia_unique_id_t;

/* Starts the rendezvous root in this process and returns the id that leads
 * to it. */
WIA_API wia_status_t wia_get_unique_id(wia_unique_id_t* id);
/* Joins the job of `id` as `rank` of `nranks`; blocks until every rank has
 * joined and connected (bounded by bootstrap.timeout_ms). */
WIA_API wia_status_t wia_create_communicator_from_id(const wia_unique_id_t* id, int nranks,
                                                     int rank, wia_communicator_t* comm);

typedef enum {
  WIA_NET_AUTO = 0, /* the defaults: shm inside a node, best network between nodes */
  WIA_NET_TCP = 1,  /* tcp between nodes */
  WIA_NET_RDMA = 2, /* verbs, then ofi, between nodes (tcp with a warning when absent) */
  WIA_NET_SHM = 3   /* shared memory: every rank on one node */
} wia_net_backend_t;

typedef enum {
  WIA_NET_COMPRESS_NONE = 0,
  /* Plain float32 all-reduces of this communicator run int8 or bfloat16
   * between hosts where its cost model says that pays (lossy; dense inside
   * each host): config key compression.link_codec = auto for this
   * communicator, docs/compression.md "Compression between hosts". */
  WIA_NET_COMPRESS_AUTO = 1
} wia_net_compression_t;

typedef struct wia_distributed_config {
  int num_nodes;        /* expected nodes; 0 = whatever the launcher gives  */
  int devices_per_node; /* expected ranks per node; 0 = any                 */
  wia_net_backend_t network_backend;
  const char* rdma_device; /* RDMA NIC name ("mlx5_0"); NULL = any            */
  int rdma_port;
  bool use_gpu_direct_rdma;
  wia_net_compression_t compression;
} wia_distributed_config_t;

/* Joins the job the launcher started (docs/processes.md lists the
 * variables read, in order). `config` may be NULL for the defaults; a
 * num_nodes or devices_per_node that disagrees with the launch is
 * WIA_ERROR_INVALID_ARGUMENT naming both values. */
WIA_API wia_status_t wia_create_distributed_communicator(const wia_distributed_config_t* config,
                                                         wia_communicator_t* comm);

/* Spec 6.10.1 GPUDirect RDMA: how wia_send/wia_recv move device buffers.
 * Settings of the process (every communicator), kept until changed.
 * docs/point-to-point.md says what each field does in this release:
 *   enable_rdma          true: a device buffer goes to the NIC directly
 *                        when the link's transport registers that kind of
 *                        device memory (WIA_TRANSPORT_FLAG_DEVICE_MEMORY
 *                        and its memory interface; none of tcp, shm, ofi
 *                        does in this release), else it is staged through
 *                        pinned host memory. false: always staged.
 *   enable_async_copy    accepted; staging copies are synchronous copies
 *                        run in stream order (no effect yet).
 *   max_inline_size      bytes; a hint for transports with inline sends.
 *                        No transport takes it yet (recorded and logged).
 *   use_write_semantics  a hint to move data by RDMA write rather than
 *                        send/receive. No transport takes it yet.
 * Before any wia_enable_gpudirect_rdma call: {true, true, 0, false}. */
typedef struct wia_gpudirect_config {
  bool enable_rdma;
  bool enable_async_copy;
  size_t max_inline_size;
  bool use_write_semantics;
} wia_gpudirect_config_t;

/* Records `gpudirect` as the process's settings and sets
 * config->use_gpu_direct_rdma to gpudirect->enable_rdma (so a communicator
 * created later from `config` says the same). Either pointer NULL is
 * WIA_ERROR_INVALID_ARGUMENT. Communicators already created use the new
 * settings for their next wia_send/wia_recv. */
WIA_API wia_status_t wia_enable_gpudirect_rdma(wia_distributed_config_t* config,
                                               const wia_gpudirect_config_t* gpudirect);

/* Spec 6.10.1 point to point between processes, addressed as the spec
 * does: (node, device) is the rank whose wia_comm_node_rank is `node` and
 * whose wia_comm_local_rank is `device`. What the spec's call leaves out:
 *   - communicator: wia_send/wia_recv use the process communicator this
 *     process created last with wia_create_distributed_communicator or
 *     wia_create_communicator_from_id (not a split) that is still live;
 *     none is WIA_ERROR_INVALID_ARGUMENT. The _ex forms name it.
 *   - source: wia_recv names the sender the same way (src_node,
 *     src_device); there is no "any source".
 *   - tag: wia_send/wia_recv use tag 0; the _ex forms take one
 *     (0 .. 2^31-1). The n-th send from a to b with tag T meets the n-th
 *     receive on b from a with tag T. A rank runs its sends, receives and
 *     collectives in posting order, so a receive waits for its message
 *     before the rank's next operation starts: post them in an order in
 *     which every one can complete (as with MPI's blocking calls, never
 *     count on the transport buffering a message).
 *   - size: bytes, the same on both sides. A receive of another size is
 *     an error naming both sizes on the receiver (WIA_ERROR_MISMATCH for a
 *     smaller message; a larger one does not fit and is the transport's
 *     WIA_ERROR_REMOTE) and breaks the communicator, so the sender's next
 *     operation fails with that message (its send may have completed).
 *   - completion: posted on `stream` (a stream of the communicator's
 *     device; NULL = its default stream) and returns at once, like a
 *     collective; the data has left / arrived once the stream has passed
 *     it (wia_stream_synchronize, an event). A peer that dies or never
 *     posts the matching call is an error on the stream within
 *     collectives.timeout_ms, naming the peer, and breaks the communicator.
 *   - buffers: host memory, or memory of a device of this process
 *     (wia_malloc_on): a device buffer goes to the NIC directly or is
 *     staged through pinned host memory (wia_gpudirect_config_t); a staged
 *     send reads the device buffer when the stream reaches the send, with
 *     a synchronous device copy, so work of other streams that writes it
 *     must be finished (an event waited on by `stream`) before.
 * The path taken is logged at info the first time per peer and path, and
 * the profiling report counts each as its own entry ("send", "recv" for
 * host memory, "send_staged", "recv_staged", "send_direct",
 * "recv_direct"), its `algorithm` the path ("host", "staged", "direct").
 * Bad (node, device): WIA_ERROR_INVALID_ARGUMENT naming both values and
 * the communicator's shape. */
WIA_API wia_status_t wia_send(int dst_node, int dst_device, const void* buffer, size_t size,
                              wia_stream_t stream);
WIA_API wia_status_t wia_recv(int src_node, int src_device, void* buffer, size_t size,
                              wia_stream_t stream);
WIA_API wia_status_t wia_send_ex(wia_communicator_t comm, int dst_node, int dst_device,
                                 const void* buffer, size_t size, int tag, wia_stream_t stream);
WIA_API wia_status_t wia_recv_ex(wia_communicator_t comm, int src_node, int src_device,
                                 void* buffer, size_t size, int tag, wia_stream_t stream);

/* The node of the calling process's rank (0-based, in order of each node's
 * lowest rank), its rank inside the node, and the number of nodes; -1 on
 * error. Device communicators span one node: 0, the rank, 1. */
WIA_API int wia_comm_node_rank(wia_communicator_t comm);
WIA_API int wia_comm_local_rank(wia_communicator_t comm);
WIA_API int wia_comm_node_count(wia_communicator_t comm);

/* The topology of a communicator's ranks (spec 6.2 across processes):
 * collective over a process communicator. Every rank is a device of the
 * result, grouped by node, and every link carries the transport it uses
 * ("shared_memory", "tcp", ...) with the latency and bandwidth the tuner
 * uses for it (measured between nodes). For a device communicator, the
 * discovered topology of its devices in rank order. Release with
 * wia_free_topology. */
WIA_API wia_status_t wia_comm_discover_topology(wia_communicator_t comm,
                                                wia_topology_t* topology);

/* MPI_Comm_split: collective over comm. Ranks with the same color form a
 * new communicator, ordered by key, then by their rank in comm. A negative
 * color (WIA_COMM_SPLIT_NOCOLOR) joins none: *newcomm is set to NULL. */
#define WIA_COMM_SPLIT_NOCOLOR (-1)
WIA_API wia_status_t wia_comm_split(wia_communicator_t comm, int color, int key,
                                    wia_communicator_t* newcomm);

/* Spec 6.6.1: the communicators of a two-level hierarchy, built by
 * wia_comm_create_hierarchy (collective over comm): node_comms[my_node]
 * holds the ranks of this rank's node (other entries are NULL), and
 * inter_node_comm the first rank of every node (NULL on the other ranks).
 * Release with wia_comm_destroy_hierarchy. Note that all-reduce on comm
 * itself may already choose the built-in hierarchical algorithm
 * (WIA_ALGORITHM_HIERARCHICAL) when links between nodes are slow. */
#define WIA_MAX_HIERARCHY_NODES 64
typedef struct wia_comm_hierarchy {
  int num_nodes;
  int my_node;
  int node_representative_rank; /* rank of the node's leader in node_comms[my_node] (0) */
  bool is_node_representative;
  wia_communicator_t node_comms[WIA_MAX_HIERARCHY_NODES];
  wia_communicator_t inter_node_comm;
} wia_comm_hierarchy_t;
WIA_API wia_status_t wia_comm_create_hierarchy(wia_communicator_t comm,
                                               wia_comm_hierarchy_t* hierarchy);
WIA_API wia_status_t wia_comm_destroy_hierarchy(wia_comm_hierarchy_t* hierarchy);

#ifdef __cplusplus
}
#endif

#endif /* WIA_DISTRIBUTED_H */
