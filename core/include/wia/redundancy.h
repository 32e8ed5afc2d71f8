/* SPDX-License-Identifier: Apache-2.0 */
/*
 * wia/redundancy.h - redundant gradient computation (spec 6.9.1).
 * Included by <wia/wia.h>. docs/fault-tolerance.md.
 *
 * Pairs of ranks compute the same gradient and cross-check it: a mismatch
 * means one of the two produced a wrong value (a silent data error, a bad
 * device), and both report it. The spec's wia_send_receive_gradients
 * leaves out the communicator and the size: wia_set_gradient_exchange gives
 * them for the calling thread, and wia_send_receive_gradients_ex names them
 * per call.
 */
#ifndef WIA_REDUNDANCY_H
#define WIA_REDUNDANCY_H

typedef enum wia_recovery_mode {
  /* The partner's copy stands in for a failed rank's (no restart). */
  WIA_RECOVERY_INSTANT = 0,
  /* Recover from the latest checkpoint (docs/checkpoints.md). */
  WIA_RECOVERY_CHECKPOINT = 1
} wia_recovery_mode_t;

typedef struct wia_redundancy_config {
  int redundancy_factor; /* devices computing each gradient; 2 = pairs */
  wia_recovery_mode_t failure_recovery;
} wia_redundancy_config_t;

/* Exchanges `count` elements with `partner` (both ranks call it with each
 * other): sends `gradients`, receives the partner's into
 * `partner_gradients`. Posted on `stream` like wia_comm_send/recv; the
 * buffers are ready when the stream has passed it. */
WIA_API wia_status_t wia_send_receive_gradients_ex(wia_communicator_t comm, int partner,
                                                   const void* gradients, void* partner_gradients,
                                                   size_t count, wia_datatype_t datatype,
                                                   wia_stream_t stream);
/* What the spec's 3-argument form uses on this thread: comm, count,
 * datatype and stream (NULL: the current device's default stream). */
WIA_API wia_status_t wia_set_gradient_exchange(wia_communicator_t comm, size_t count,
                                               wia_datatype_t datatype, wia_stream_t stream);
/* Spec 6.9.1: wia_send_receive_gradients_ex with the thread's settings,
 * then waits for the stream, so partner_gradients is ready on return. */
WIA_API wia_status_t wia_send_receive_gradients(int partner, const void* gradients,
                                                void* partner_gradients);

/* Whether a and b agree: every element within tolerance * max(1, |a|, |b|)
 * (0: equal values; NaN only matches NaN). Host memory. false on a bad
 * argument (wia_get_last_error says which). */
WIA_API bool wia_gradients_match(const void* a, const void* b, size_t count,
                                 wia_datatype_t datatype, double tolerance);
/* The checksum mode: exchanges an XXH3-64 of the bytes instead of the
 * gradient (8 bytes on the wire) and sets *match to whether the partner's
 * is the same: bit-identical results only. Blocks until known. */
WIA_API wia_status_t wia_gradients_checksum_match(wia_communicator_t comm, int partner,
                                                  const void* gradients, size_t count,
                                                  wia_datatype_t datatype, wia_stream_t stream,
                                                  bool* match);
/* Spec 6.9.1: my_rank and partner computed different gradients. Records
 * partner as failed in this rank's view of comm (wia_comm_get_failed,
 * wia_detect_device_failure) and logs both ranks; no communication. */
WIA_API wia_status_t wia_report_failure(wia_communicator_t comm, int my_rank, int partner);

/* The rank that member `rank` of comm had in the communicator comm was
 * shrunk from (wia_comm_shrink, wia_create_communicator_fault_tolerant,
 * shrinks of shrinks; never a split), and that one's size: shrinks
 * renumber densely, the origin's numbering stays. A communicator no shrink
 * made answers `rank` and its own size. */
WIA_API wia_status_t wia_comm_origin_rank(wia_communicator_t comm, int rank, int* origin_rank,
                                          int* origin_size);

/* What redundancy gives one rank of comm. With S = origin size /
 * redundancy_factor, origin ranks o, o + S, o + 2S ... compute data shard
 * o (a factor of 2: the spec's partner (my_rank + num_devices / 2) %
 * num_devices). */
typedef struct wia_redundancy_view {
  int shard;         /* the data shard this rank computes, 0..num_shards-1 */
  int num_shards;    /* S */
  int live_replicas; /* members of comm computing this shard, this rank included */
  int partner;       /* a live replica to cross-check with (a rank of comm), -1 if none */
  /* WIA_RECOVERY_INSTANT: redundancy_factor / live_replicas. Every rank
   * scaling its gradient by it before a sum over comm gives the sum the
   * whole original job would have (a failed rank's partner counts twice),
   * so training goes on without a restart. 1 while no replica is lost. */
  double gradient_scale;
} wia_redundancy_view_t;

/* Spec 6.9.1's "if one device fails, partner continues with same
 * gradient": `rank`'s view after any number of shrinks (every survivor
 * computes the same from the membership, no communication). Errors:
 * WIA_ERROR_INVALID_ARGUMENT for a factor that does not divide the origin
 * size; WIA_ERROR_REMOTE when every replica of some shard failed (named),
 * or, under WIA_RECOVERY_CHECKPOINT, when any rank failed: restore the
 * latest checkpoint then. docs/fault-tolerance.md. */
WIA_API wia_status_t wia_get_redundancy_view(wia_communicator_t comm,
                                             const wia_redundancy_config_t* config, int rank,
                                             wia_redundancy_view_t* view);

#endif /* WIA_REDUNDANCY_H */
