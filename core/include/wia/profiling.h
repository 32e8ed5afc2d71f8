/* SPDX-License-Identifier: Apache-2.0 */
/*
 * wia/profiling.h - communication profiling (spec 6.11). Included by
 * <wia/wia.h>; docs/profiling.md says what every number means.
 *
 * Process communicators (one rank per process) profile themselves: each
 * rank reports its own collectives. Device communicators: not yet
 * (WIA_ERROR_NOT_SUPPORTED).
 */
#ifndef WIA_PROFILING_H
#define WIA_PROFILING_H

typedef struct wia_comm_profiling {
  bool enable_bandwidth_tracking; /* bytes and GB/s per collective, utilization */
  bool enable_latency_tracking;   /* min / p50 / p99 / max times per collective */
  bool enable_overlap_analysis;   /* compute time and the share of comm hidden under it */
} wia_comm_profiling_t;

typedef struct wia_collective_profile {
  /* "allreduce", "broadcast", ..., "send", "recv"; wia_send/wia_recv of
   * device memory: "send_staged", "recv_staged", "send_direct",
   * "recv_direct" (docs/point-to-point.md). Static storage. */
  const char* name;
  int invocation_count;
  double total_time;    /* s */
  double avg_time;      /* s: total_time / invocation_count */
  double avg_bandwidth; /* GB/s: bytes of one rank's input / time, averaged over calls */
  /* Extensions (latency tracking): seconds. */
  double min_time, p50_time, p99_time, max_time;
  uint64_t bytes;        /* one rank's input bytes, summed over calls */
  /* What the tuner chose for the last call; point to point: the path its
   * data took, "host", "staged" or "direct" (static storage). */
  const char* algorithm;
  /* Extension: the transport(s) the last call's links used: a provider's
   * name ("shm", "tcp", "ofi", ...), several joined by '+' in alphabetical
   * order when its peers are reached over different ones ("shm+tcp"),
   * "windows" when it ran through the node-shared windows (no link), "host"
   * when it needed no other process (one rank). Storage that lives as long
   * as the process. */
  const char* transport;
} wia_collective_profile_t;

typedef struct wia_comm_profile_report {
  double total_comm_time;    /* s: collectives of this rank, from start to end, summed */
  double total_compute_time; /* s: host functions run on streams of comm's device */
  double overlap_efficiency; /* share of total_comm_time during which compute ran, 0..1 */
  /* Mean over calls of achieved bus bandwidth / the slowest link's bandwidth
   * in the cost model (nccl-tests' busbw factors), 0..1 (may exceed 1 when
   * the model underrates a link). 0 without bandwidth tracking. */
  double avg_bandwidth_utilization;
  int num_collectives;
  wia_collective_profile_t* collectives;
  /* What to change, each costed by the communicator's cost model, the
   * estimated speedup in its text ("... estimated 168.7x faster (cost
   * model: ...)"). Today: fusing many small all-reduces into buckets, and
   * the tuner's algorithm where a forced one is slower (docs/profiling.md
   * says when). NULL when there are none. */
  int num_suggestions;
  const char** suggestions;
  /* Extension: seconds since profiling was enabled or reset. */
  double window_time;
} wia_comm_profile_report_t;

/* Starts (or restarts with new settings, keeping what was recorded). */
WIA_API wia_status_t wia_enable_comm_profiling(wia_communicator_t comm,
                                               const wia_comm_profiling_t* profiling);
WIA_API wia_status_t wia_disable_comm_profiling(wia_communicator_t comm);
/* Forgets what was recorded; the window starts again now. */
WIA_API wia_status_t wia_reset_comm_profile(wia_communicator_t comm);
/* A snapshot; NULL on error (wia_get_last_error says why). Free it with
 * wia_free_comm_profile. Collectives still running are not in it. */
WIA_API wia_comm_profile_report_t* wia_get_comm_profile(wia_communicator_t comm);
WIA_API void wia_free_comm_profile(wia_comm_profile_report_t* report);

/* Extension: writes this rank's timeline of `comm` to `path` as Chrome /
 * Perfetto trace JSON (load it in ui.perfetto.dev or chrome://tracing; the
 * files of all ranks can be loaded together). One complete event ("ph":"X")
 * per operation recorded while profiling was enabled or WIA_TRACE set, ts
 * and dur in microseconds (ts since the Unix epoch), pid = rank, tid = the
 * communicator's number in its process, args: bytes, algorithm, transport,
 * and nranks (collectives) or peer (send/receive). At most 65536 events are
 * kept; later ones are counted in "otherData": {"dropped_events": N}.
 * Blocks while writing; call it from any thread. The file is written whole
 * under `path`.tmp and renamed. Returns WIA_ERROR_INVALID_ARGUMENT for a
 * NULL or empty path, WIA_ERROR_IO (naming the path and the system's
 * reason) when it cannot be written, WIA_ERROR_NOT_SUPPORTED for a device
 * communicator.
 *
 * WIA_TRACE=pattern in the environment: each process communicator records
 * its timeline from creation and writes it when destroyed (wia_finalize
 * included), to `pattern` with "%r" replaced by the rank and "%c" by the
 * communicator's number; without "%r", ".rank<N>" is appended (and, for a
 * process's second and later communicators without "%c", ".comm<K>" before
 * it). A failure to write is logged, not returned. docs/profiling.md. */
WIA_API wia_status_t wia_profile_write_trace(wia_communicator_t comm, const char* path);

#endif /* WIA_PROFILING_H */
