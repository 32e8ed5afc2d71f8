/* SPDX-License-Identifier: Apache-2.0 */
/*
 * wia/status.h - status codes and element types shared by the public C API
 * (wia.h) and the provider ABI (provider.h).
 *
 * This header is part of the frozen provider ABI v1: values are never
 * renumbered; new codes are only appended.
 *
 * Convention (learned from UCC and NCCL): 0 is success, a positive value
 * means "not finished yet, call again", a negative value is an error. A
 * human-readable message for the last error is retrievable separately
 * (wia_get_last_error() in the public API, host services set_error() for
 * providers).
 */
#ifndef WIA_STATUS_H
#define WIA_STATUS_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef int32_t wia_status_t;

enum {
  WIA_SUCCESS = 0,
  WIA_IN_PROGRESS = 1,             /* operation posted, not complete yet      */

  WIA_ERROR_INVALID_ARGUMENT = -1, /* NULL pointer, bad size, bad enum value  */
  WIA_ERROR_NOT_SUPPORTED = -2,    /* entry point or combination not offered  */
  WIA_ERROR_OUT_OF_MEMORY = -3,    /* host or device allocation failed        */
  WIA_ERROR_INVALID_DEVICE = -4,   /* device index out of range               */
  WIA_ERROR_INVALID_HANDLE = -5,   /* unknown, destroyed or foreign handle    */
  WIA_ERROR_NOT_INITIALIZED = -6,  /* wia_init() not called / provider not up */
  WIA_ERROR_UNAVAILABLE = -7,      /* hardware or driver absent on this host  */
  WIA_ERROR_ABI_MISMATCH = -8,     /* provider / host ABI versions disagree   */
  WIA_ERROR_TIMEOUT = -9,          /* a bounded wait expired                  */
  WIA_ERROR_REMOTE = -10,          /* the peer failed, closed or misbehaved   */
  WIA_ERROR_MISMATCH = -11,        /* ranks called different collectives      */
  WIA_ERROR_CONFIG = -12,          /* invalid configuration value or file     */
  WIA_ERROR_IO = -13,              /* operating-system I/O error              */
  WIA_ERROR_INTERNAL = -14,        /* a bug in libwia or in a provider        */
  WIA_ERROR_ABORTED = -15,         /* communicator aborted by the user        */
  WIA_ERROR_CORRUPT = -16          /* stored data failed its checksum/format  */
};

/* Element types. Numbering is shared by the public API and the ABI. */
typedef enum wia_datatype {
  WIA_INT8 = 0,
  WIA_UINT8 = 1,
  WIA_INT32 = 2,
  WIA_UINT32 = 3,
  WIA_INT64 = 4,
  WIA_UINT64 = 5,
  WIA_FLOAT16 = 6,  /* IEEE 754 binary16                                 */
  WIA_BFLOAT16 = 7, /* upper 16 bits of an IEEE 754 binary32             */
  WIA_FLOAT32 = 8,
  WIA_FLOAT64 = 9,
  WIA_DATATYPE_COUNT = 10
} wia_datatype_t;

/* Reduction operators. AVG is SUM followed by division by the divisor the
 * caller states (the number of contributions for a collective). */
typedef enum wia_reduce_op {
  WIA_REDUCE_SUM = 0,
  WIA_REDUCE_PROD = 1,
  WIA_REDUCE_MIN = 2,
  WIA_REDUCE_MAX = 3,
  WIA_REDUCE_AVG = 4,
  WIA_REDUCE_OP_COUNT = 5
} wia_reduce_op_t;

#ifdef __cplusplus
}
#endif

#endif /* WIA_STATUS_H */
