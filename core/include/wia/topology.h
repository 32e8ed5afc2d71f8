/* SPDX-License-Identifier: Apache-2.0 */
/* Topology discovery and analysis (WIA-AI-011 6.2, 6.2.1).
 *
 * A topology is a matrix of link properties between every ordered pair of
 * devices (i, j): the spec's fields are read as topology.bandwidth_gbps[i][j]
 * and so on. The matrices are rows of arrays owned by the library; release
 * them with wia_free_topology(). docs/topology.md documents the discovery
 * rules, the default figures per link type, the YAML schema and the
 * analysis (diameter, bisection bandwidth, strategy rule).
 *
 * Thread safety: every function here may be called from any thread; a
 * topology object itself is not synchronised (read it concurrently, do not
 * free it while others read). None of these functions block on devices. */
#ifndef WIA_TOPOLOGY_H
#define WIA_TOPOLOGY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <wia/status.h>

#ifdef __cplusplus
extern "C" {
#endif

#ifndef WIA_API
#if defined(__GNUC__)
#define WIA_API __attribute__((visibility("default")))
#else
#define WIA_API
#endif
#endif

struct wia_topology_store_s; /* opaque: the library's storage behind the rows */

typedef struct wia_topology {
  int num_devices;               /* devices in the matrix, n                     */
  const char* interconnect_name; /* fastest link type present ("nvlink",
                                    "shared_memory", ...); "none" when n < 2   */
  /* n x n matrices, [i][j] = the link from device i to device j. The
   * diagonal is the device itself: link_type "self", hop_count 0,
   * latency 0, bandwidth 0 (not a link), p2p_capable true. */
  double** bandwidth_gbps; /* GB/s (10^9 bytes/s), one direction             */
  double** latency_us;     /* one-way small-message latency, microseconds    */
  int** hop_count;         /* >= 1 off the diagonal (see docs/topology.md)  */
  const char*** link_type; /* "nvlink", "peer", "shared_memory", ...         */
  bool** p2p_capable;      /* i can address j's memory directly              */

  /* Beyond the spec: where each device sits. */
  int num_nodes;             /* machines (hosts); 1 for a discovered topology */
  const int* node_of_device; /* [n] node index of each device; NULL = all in 0 */
  const char** device_names; /* [n] "node0/host0", ...; may be NULL          */
  const char** node_names;   /* [num_nodes] "node0", ...; may be NULL         */

  struct wia_topology_store_s* store; /* library-owned; NULL for a caller-built
                                         topology (never freed then)         */
} wia_topology_t;

/* Discovers the devices of the runtime (initialising it if needed) and the
 * machine they sit in (hwloc: packages, NUMA nodes, PCI devices), and fills
 * every pair. Overwrites *topology without reading it: a topology filled
 * earlier must be released with wia_free_topology() first, or it leaks.
 * Link figures are the documented defaults per link type, not measurements. */
WIA_API wia_status_t wia_discover_topology(wia_topology_t* topology);

/* Releases what the library allocated for *topology and zeroes it. Safe on
 * a zeroed topology and on one already freed; does nothing to a
 * caller-built one (store == NULL) except zeroing it. */
WIA_API wia_status_t wia_free_topology(wia_topology_t* topology);

/* Writes a topology as YAML (schema in docs/topology.md), every pair
 * explicit, so that wia_load_topology_yaml() reads back an equal topology.
 * Works on discovered, loaded and caller-built topologies. */
WIA_API wia_status_t wia_export_topology_yaml(const wia_topology_t* topology, const char* path);

/* Reads a topology file instead of discovering one (same schema as the
 * export; class rules such as `between: inter_node` are expanded to every
 * pair). Overwrites *topology as wia_discover_topology() does. A malformed
 * file is WIA_ERROR_CONFIG with "file:line:column" and the key in
 * wia_get_last_error(); *topology is zeroed then. */
WIA_API wia_status_t wia_load_topology_yaml(const char* path, wia_topology_t* topology);

typedef struct wia_topology_analysis {
  const char* topology_type;        /* "single_node" or "multi_node"            */
  int diameter;                     /* max over pairs of the fewest total hops;
                                       -1 when some pair has no path          */
  double bisection_bandwidth;       /* GB/s, see docs/topology.md             */
  const char* recommended_strategy; /* "data_parallel", "pipeline_parallel",
                                       "hybrid"                               */
  char reason[256];                 /* why that strategy, with the figures    */
  bool bisection_exact;             /* false above 16 devices (heuristic)     */
  double min_bandwidth_gbps;        /* slowest link between distinct devices  */
  double max_bandwidth_gbps;        /* fastest link between distinct devices  */
} wia_topology_analysis_t;

/* Analyses a topology (discovered, loaded or caller-built). The strings are
 * static storage. Bisection: the minimum, over splits of the devices into
 * halves of floor(n/2) and ceil(n/2), of the sum of bandwidth_gbps[i][j]
 * for i in the half holding device 0 and j in the other (each pair counted
 * once, one direction). Exact for n <= 16; above, an upper bound found by
 * node-aligned and greedy swap refinement (docs/topology.md). */
WIA_API wia_status_t wia_analyze_topology(const wia_topology_t* topology,
                                          wia_topology_analysis_t* analysis);

/* ---------------------------------------------------------------------- */
/* Placement (6.2.1): parts of a model onto devices                        */
/* ---------------------------------------------------------------------- */

typedef enum wia_placement_strategy {
  /* Minimise the time the model's traffic spends on links:
   * sum over part pairs of traffic_bytes[a][b] / bandwidth(dev a, dev b);
   * parts on one device exchange for free. */
  WIA_PLACEMENT_BANDWIDTH_OPTIMAL = 0,
  /* Minimise the sum, over part pairs that exchange anything, of the link
   * latency between their devices (small-message, tightly coupled parts). */
  WIA_PLACEMENT_LATENCY_OPTIMAL = 1,
  /* Part k onto device k (packed in listing order): the baseline. */
  WIA_PLACEMENT_SEQUENTIAL = 2
} wia_placement_strategy_t;

typedef struct wia_model_part {
  const char* name;      /* optional, for messages                          */
  uint64_t memory_bytes; /* checked against device_memory_bytes             */
} wia_model_part_t;

/* One named tensor of a model or an optimizer (checkpoints, spec 6.9).
 * Names are unique within a model (or optimizer) and at most
 * WIA_CHECKPOINT_NAME_MAX (255) bytes. */
typedef struct wia_tensor_ref {
  const char* name;
  void* data; /* host memory or wia_malloc'd device memory */
  size_t count;
  wia_datatype_t datatype;
} wia_tensor_ref_t;

/* A model. Placement (wia_place_model) reads its parts and the traffic
 * between them; checkpoints (wia_checkpoint_add_model, wia_restore_model)
 * read its named tensors: parameters and buffers (torch:
 * named_parameters() and named_buffers()). Either half may be left zero
 * when only the other is used. */
typedef struct wia_model {
  int num_parts;
  const wia_model_part_t* parts; /* [num_parts]; NULL = unnamed, 0 bytes      */
  /* [num_parts * num_parts], row-major: bytes part a sends to part b per
   * step (any consistent unit; only ratios matter). Diagonal ignored. */
  const double* traffic_bytes;
  /* [num_parts] output: the device index (into the topology) of each part. */
  int* device_of_part;
  /* --- checkpoints --- */
  const wia_tensor_ref_t* tensors; /* [num_tensors] */
  size_t num_tensors;
} wia_model_t;

typedef struct wia_placement_config {
  /* --- input --- */
  wia_placement_strategy_t strategy;
  const wia_topology_t* topology;
  /* First minimise the bytes that cross nodes, then the strategy's cost. */
  bool minimize_cross_node_traffic;
  int max_parts_per_device;     /* 0 = ceil(num_parts / num_devices)         */
  uint64_t device_memory_bytes; /* 0 = no memory limit                       */
  /* --- output, filled by wia_place_model --- */
  double cost;             /* the strategy's objective (seconds per step for
                              BANDWIDTH, microseconds for LATENCY)          */
  double cross_node_bytes; /* traffic between parts on different nodes      */
  bool optimal;            /* proven optimal by exhaustive search           */
  char method[128];        /* how it was found, with the objective          */
} wia_placement_config_t;

/* Places model's parts on the devices of placement->topology: fills
 * model->device_of_part and the output fields of *placement. Capacity:
 * at most max_parts_per_device parts and device_memory_bytes of part
 * memory per device. Exhaustive (optimal) for small searches, otherwise
 * greedy plus swap/move refinement (docs/placement.md).
 * WIA_ERROR_INVALID_ARGUMENT when the parts cannot fit, naming why. */
WIA_API wia_status_t wia_place_model(wia_model_t* model, wia_placement_config_t* placement);

/* ---------------------------------------------------------------------- */
/* Bandwidth benchmark (6.2.2)                                             */
/* ---------------------------------------------------------------------- */

typedef struct wia_bandwidth_benchmark {
  double unidirectional_gbps; /* GB/s (1e9 B/s) copying dev_a -> dev_b, 64 MiB */
  double bidirectional_gbps;  /* GB/s summed over both directions at once     */
  double latency_small;       /* us for one 4 KiB copy a -> b (median)         */
  double latency_large;       /* us for one 1 MiB copy a -> b (median)         */
} wia_bandwidth_benchmark_t;

/* Measures copies between two devices through the public peer-copy API
 * (wia_memcpy_peer_async on streams of both devices): warm-up, then the
 * median of repeats. Blocks for tens of milliseconds. dev_a == dev_b
 * measures copies within one device. */
WIA_API wia_status_t wia_benchmark_bandwidth(int32_t dev_a, int32_t dev_b,
                                             wia_bandwidth_benchmark_t* bench);

#ifdef __cplusplus
}
#endif

#endif /* WIA_TOPOLOGY_H */
