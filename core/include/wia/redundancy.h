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

#endif /* WIA_REDUNDANCY_H */
