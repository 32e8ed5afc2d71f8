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
   * model: ...)"). Today: fusing small all-reduces into buckets, the
   * tuner's algorithm where a forced one is slower, compression where a
   * link is slow (docs/profiling.md says when). NULL when none. */
  int num_suggestions;
  const char** suggestions;
  /* Extension: seconds since profiling was enabled or reset. */
  double window_time;
  /* Extension: the job-wide summary, filled by wia_get_comm_profile_job
   * only (wia_get_comm_profile leaves these 0 and NULL): one entry per
   * collective any rank recorded, in order of first appearance (rank 0's
   * first, then the others'). */
  int job_nranks; /* the communicator's size */
  int num_job_collectives;
  struct wia_job_collective_profile* job_collectives;
} wia_comm_profile_report_t;

/* Extension: one collective (or send/receive kind) across the ranks of a
 * process communicator (wia_get_comm_profile_job). Times in seconds. */
typedef struct wia_job_collective_profile {
  const char* name; /* as wia_collective_profile_t's */
  int nranks;       /* entries of ranks[]: the communicator's size */
  /* ranks[r]: rank r's own entry for this collective, as its
   * wia_get_comm_profile reports it (with its settings: no bytes without
   * bandwidth tracking, no min/p50/p99/max without latency tracking);
   * invocation_count 0 and times 0 where rank r never ran it. */
  wia_collective_profile_t* ranks;
  /* The rank that spent the most time in this collective (total_time;
   * the lowest such rank on ties) and the one that spent the least. In a
   * collective the ranks wait for each other: when they arrive at
   * different times, the first to arrive waits longest and the last
   * (a straggler whose compute is slower) waits least, so a large spread
   * with one rank far below the others names that rank as the late one;
   * with a slow link or device the slowest rank is where the time went.
   * docs/profiling.md, "Job-wide summary". */
  int slowest_rank;
  double slowest_total_time;
  int fastest_rank;
  double fastest_total_time;
  double mean_total_time; /* over all ranks, those that never ran it as 0 */
} wia_job_collective_profile_t;

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

/* Extension: wia_get_comm_profile plus the job-wide summary
 * (job_nranks, job_collectives[]): every rank's per-collective entries,
 * the slowest and fastest rank of each. Collective: every rank of the
 * process communicator `comm` calls it, in the same order relative to
 * its other operations on `comm` (it runs two all-gathers over `comm`'s
 * links after every operation posted before it, on the calling thread;
 * nothing is exchanged at any other time, and those all-gathers are not
 * recorded in any profile or timeline). Every rank gets the summary.
 * Blocks until done or until `timeout_ms` (0 = collectives.timeout_ms)
 * passes; a rank that does not call it in time fails it like any
 * collective: the waiting ranks return NULL after the timeout, the
 * communicator is unusable after that and the late rank's call (or next
 * operation) fails at once with the reason. Returns NULL on error,
 * wia_get_last_error saying why ("rank 0: gathering every rank's profile:
 * collective #N timed out after 300 ms ..."); a device communicator is
 * refused (not supported). Free the report with wia_free_comm_profile. */
WIA_API wia_comm_profile_report_t* wia_get_comm_profile_job(wia_communicator_t comm,
                                                            uint32_t timeout_ms);

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
