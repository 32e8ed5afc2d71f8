/* SPDX-License-Identifier: Apache-2.0 */
/*
 * wia/fault_tolerance.h - going on without a failed rank (spec 6.9):
 * revoke, agree, shrink, as ULFM's
 * MPI_Comm_revoke / MPIX_Comm_agree / MPI_Comm_shrink and NCCL's
 * ncclCommShrink. Included by <wia/wia.h>. docs/fault-tolerance.md,
 * "Revoke, agree, shrink".
 *
 * The usual loop: a collective fails or wia_detect_device_failure(comm)
 * turns true on a rank; it calls wia_comm_revoke(comm) so that every
 * other rank stops too, and every survivor then calls
 * wia_comm_shrink(comm, &new_comm) (or the spec's
 * wia_create_communicator_fault_tolerant), destroys comm and goes on with
 * new_comm.
 *
 * Agreement and shrink do not use comm's connections (a failure closes
 * them): each rank listens on a TCP socket of its own from the
 * communicator's creation on (loopback on one node; else the interface
 * WIA_SOCKET_IFNAME / bootstrap.ifname chooses), and they run as a star
 * around the lowest rank not known to have failed. They need nothing of a
 * dead rank, the bootstrap root (rank 0 of the job) included. Every wait
 * is bounded by collectives.timeout_ms.
 *
 * Device-based communicators (one process drives every rank): a rank
 * fails when its device reports an error; one call of revoke, agree or
 * shrink acts for every rank (agree returns the flag and the failed set;
 * shrink keeps the devices that did not fail).
 */
#ifndef WIA_FAULT_TOLERANCE_H
#define WIA_FAULT_TOLERANCE_H

/* Revokes comm on every rank it can reach. Every operation of comm running
 * or queued on this rank, and every later one, fails with
 * WIA_ERROR_ABORTED; the other ranks are told at once over the control
 * channel and their operations of comm fail with WIA_ERROR_ABORTED too,
 * naming this rank (an idle rank's wia_detect_device_failure turns true
 * within a heartbeat tick). Unlike wia_comm_abort, comm stays valid:
 * wia_comm_agree, wia_comm_shrink, wia_comm_get_failed and
 * wia_destroy_communicator still work on it. Blocks only until this
 * rank's running operation, if any, next looks at the control channel
 * (well under a millisecond while it waits on a peer; bounded by
 * collectives.timeout_ms), plus up to 200 ms telling the peers; when it
 * returns, every later post of comm on this rank fails. Any thread may
 * call it; calling it again, or on a communicator that a failure already
 * broke (its ranks were told then), does nothing and returns WIA_SUCCESS.
 */
WIA_API wia_status_t wia_comm_revoke(wia_communicator_t comm);

/* Fault-tolerant agreement among the ranks of comm that are alive:
 * collective over them (every survivor must call it, in the same order as
 * its other agreements and shrinks of comm); works on a revoked or failed
 * comm and when any rank, rank 0 included, has died.
 * On return *flag is the bitwise AND of the flags of the ranks that took
 * part, the same on each of them. A rank counts as failed when it was
 * already known to (wia_comm_get_failed on some participant), when it is
 * gone (its socket refuses connections), or when it did not call within
 * collectives.timeout_ms; the agreed failed set is added to each
 * participant's wia_comm_get_failed. Blocks, at most
 * collectives.timeout_ms (one deadline for the whole agreement, a
 * coordinator's failover included); a dead coordinator costs no wait.
 * Returns WIA_SUCCESS even when ranks failed (the set says which);
 * WIA_ERROR_TIMEOUT when the coordinator never answered; WIA_ERROR_REMOTE
 * when the others counted this rank as failed (it was too late);
 * WIA_ERROR_MISMATCH when the ranks' agreements and shrinks of comm are out
 * of step. Not a full consensus: if the coordinator dies while sending the
 * decision, the ranks it reached return it and the others an error. */
WIA_API wia_status_t wia_comm_agree(wia_communicator_t comm, int* flag);

/* wia_comm_agree that also returns the agreed failed ranks, ascending: at
 * most `capacity` into `failed_ranks` (may be NULL when capacity is 0),
 * how many there are into *failed_count; the same set on every
 * participant. */
WIA_API wia_status_t wia_comm_agree_failed(wia_communicator_t comm, int* flag, int* failed_ranks,
                                           int capacity, int* failed_count);

/* A new communicator of comm's surviving ranks: agrees on the failed set
 * (as wia_comm_agree), then sets up a communicator of the others, numbered
 * densely in their order in comm (rank r of comm becomes r minus the
 * failed ranks below it), with node and local ranks recomputed, fresh
 * connections (shm inside a node, tcp between nodes, chosen as at
 * creation), node-shared windows, heartbeats and a cost model of its own.
 * Collective over the survivors; comm is unchanged (destroy it after). If
 * a rank fails during the shrink, every survivor's call fails (at once
 * while the set-up records are exchanged, within collectives.timeout_ms
 * while connecting) and may be retried on comm.
 * *newcomm is NULL on failure. Blocks; errors as wia_comm_agree, plus
 * those of creating a communicator. */
WIA_API wia_status_t wia_comm_shrink(wia_communicator_t comm, wia_communicator_t* newcomm);

/* Spec 6.9: the communicator without the failed devices, after
 * wia_detect_device_failure(comm): wia_comm_shrink(comm, new_comm). */
WIA_API wia_status_t wia_create_communicator_fault_tolerant(wia_communicator_t* new_comm,
                                                            wia_communicator_t comm);

#endif /* WIA_FAULT_TOLERANCE_H */
