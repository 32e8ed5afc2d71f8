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
  WIA_NET_COMPRESS_AUTO = 1 /* no per-link compression yet; see wia_all_reduce_compressed */
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
