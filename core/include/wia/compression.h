/* SPDX-License-Identifier: Apache-2.0 */
/* Gradient compression (WIA-AI-011 6.8, 6.8.1, 6.8.2). Included by
 * <wia/wia.h>; needs its types. docs/compression.md gives each method's
 * wire format and error bound and the decisions taken where the seed is
 * silent.
 *
 * A compressed all-reduce is posted on a stream like wia_all_reduce: it
 * returns at once, later work on the stream waits for it, and every rank
 * must post the same sequence with the same count, datatype and
 * configuration (a different count or method usually changes the size of
 * what is exchanged, which is WIA_ERROR_MISMATCH like any collective).
 * Compression runs on the CPU, so input and output must be host-accessible
 * memory (host devices, wia_malloc_host, plain host memory); memory of
 * another device kind is WIA_ERROR_NOT_SUPPORTED.
 *
 * Error feedback: the library keeps one fp32 residual per (communicator,
 * input buffer address). Before compressing, the residual is added to the
 * input; after, it becomes what compression dropped (the corrected input
 * minus what this rank's compressed message decodes to). */
#ifndef WIA_COMPRESSION_H
#define WIA_COMPRESSION_H

#ifdef __cplusplus
extern "C" {
#endif

typedef enum wia_compression_method {
  WIA_COMPRESS_NONE = 0,     /* a plain all-reduce                                  */
  WIA_COMPRESS_TOPK = 1,     /* the k largest entries, as (index, value) pairs      */
  WIA_COMPRESS_RANDOMK = 2,  /* k entries at indices every rank draws from a seed   */
  WIA_COMPRESS_QUANTIZE = 3, /* num_bits per entry, per-chunk range, unbiased       */
  WIA_COMPRESS_ONEBIT = 4,   /* sign per entry + one scale per chunk (DeepSpeed)    */
  WIA_COMPRESS_LOWRANK = 5,  /* PowerSGD: rank-r factors P and Q, warm-started Q   */
  WIA_COMPRESS_FP16 = 6,     /* cast to IEEE binary16, all-reduce, cast back        */
  WIA_COMPRESS_BF16 = 7,     /* cast to bfloat16, all-reduce, cast back             */
  WIA_COMPRESS_METHOD_COUNT = 8
} wia_compression_method_t;

typedef struct wia_compression_config {
  wia_compression_method_t method;
  union {
    struct {
      double k_ratio;     /* fraction of entries sent, in (0, 1]; k = ceil(k_ratio * count) */
      bool use_magnitude; /* true: the k largest |x|; false: the k largest x (signed)     */
    } topk;
    struct {
      double k_ratio; /* in (0, 1]                                                     */
      uint64_t seed;  /* must be equal on every rank: all draw the same indices        */
    } randomk;
    struct {
      int num_bits;           /* 1, 4, 8 or 16                                          */
      bool use_dynamic_range; /* true: a [min, max] per chunk of 256; false: one for all */
    } quantize;
    struct {
      bool use_error_feedback; /* either this or error_feedback must be set           */
      /* WIA_FLOAT32, WIA_FLOAT16 or WIA_BFLOAT16; 0 (zero-initialised) = FLOAT32 */
      wia_datatype_t scaling_factor_precision;
    } onebit;
    struct {
      int rank;      /* r >= 1: columns of P and Q (clamped to min(rows, cols))   */
      uint64_t rows; /* the vector as a rows x ceil(count / rows) row-major matrix,
                      * zero-padded; 0 = ceil(sqrt(count)) (near square)         */
    } lowrank;
  } parameters;
  bool error_feedback; /* keep and re-add what compression dropped (6.8.2)   */
  /* Stream the compression runs on (same device as the call's stream);
   * NULL = the call's stream. The call's stream waits for it, and it for the
   * call's stream, so results are ordered exactly as without it. */
  wia_stream_t compression_stream;
  /* Descriptive only, as the seed uses them; the library reads neither. */
  double compression_ratio;
  const char* accuracy_impact;
} wia_compression_config_t;

/* Compressed all-reduce (sum) of `count` float32 values: output receives an
 * estimate of the sum over ranks of input (exact for NONE). In place when
 * output == input. config must not be NULL. Errors: WIA_ERROR_INVALID_ARGUMENT
 * naming the field (k_ratio outside (0, 1], num_bits not in {1, 4, 8, 16},
 * scaling_factor_precision not a float type, 1-bit without error feedback,
 * a compression_stream of another device, a lowrank rank < 1 or rows >
 * count), WIA_ERROR_NOT_SUPPORTED (device memory, more than 2^32-1 entries
 * for TOPK or RANDOMK). */
WIA_API wia_status_t wia_all_reduce_compressed(wia_communicator_t comm, const void* input,
                                               void* output, size_t count,
                                               const wia_compression_config_t* config,
                                               wia_stream_t stream);
/* The same for datatype WIA_FLOAT32, WIA_FLOAT16 or WIA_BFLOAT16 (halves are
 * widened to float32 to compress and reduce) and op WIA_REDUCE_SUM or
 * WIA_REDUCE_AVG (sum divided by the number of ranks). */
WIA_API wia_status_t wia_all_reduce_compressed_ex(wia_communicator_t comm, const void* input,
                                                  void* output, size_t count,
                                                  wia_datatype_t datatype, wia_reduce_op_t op,
                                                  const wia_compression_config_t* config,
                                                  wia_stream_t stream);

/* Spec 6.8.2's sparse all-reduce, in place: each rank passes k (index,
 * value) pairs; afterwards values[j] holds the sum, over every rank, of
 * every value given at index indices[j] (a rank's duplicates included).
 * k must be equal on every rank. Indices are uint32_t, so a dense vector of
 * up to 2^32-1 entries: half the bytes of 64-bit indices on the wire. */
WIA_API wia_status_t wia_all_reduce_sparse(wia_communicator_t comm, float* values,
                                           const uint32_t* indices, size_t k, wia_stream_t stream);
/* The dense form: output (dense_count entries of datatype, WIA_FLOAT32,
 * WIA_FLOAT16 or WIA_BFLOAT16, like values) receives the sum over ranks of
 * the scattered inputs, zero where no rank gave a value. An index >=
 * dense_count is dropped and reported as WIA_ERROR_INVALID_ARGUMENT by the
 * next compressed or sparse call on comm (the indices are read when the
 * stream reaches the call, not when it is posted). */
WIA_API wia_status_t wia_all_reduce_sparse_ex(wia_communicator_t comm, const void* values,
                                              const uint32_t* indices, size_t k, void* output,
                                              size_t dense_count, wia_datatype_t datatype,
                                              wia_stream_t stream);

/* Bytes one rank sends in a compressed all-reduce of count entries of
 * datatype with this config on a communicator of nranks, counted with the
 * bandwidth-optimal pattern of its exchange (nranks - 1 copies of a
 * gathered message, 2 (nranks - 1) / nranks of an all-reduced vector) and
 * headers included; NONE gives the plain ring all-reduce, so the ratio of
 * the two is the compression on the wire. 0 for nranks 1. */
WIA_API wia_status_t wia_compression_wire_bytes(size_t count, wia_datatype_t datatype,
                                                const wia_compression_config_t* config,
                                                int nranks, size_t* bytes);

/* Fills *config from a method spelled as wia-bench --compress, wia_torch's
 * DDP hook and configuration files spell it: "none", "topk[:R]",
 * "randomk[:R]", "int8", "int4", "onebit", "lowrank[:r]", "fp16", "bf16".
 * R is the fraction k_ratio in (0, 1] (default 0.01 for topk, 0.1 for
 * randomk); r is the rank, an integer >= 1 (default 4). topk ranks by
 * magnitude; randomk's seed is 1; int8/int4 use a range per chunk.
 * error_feedback is set for topk, onebit and lowrank, the methods that lose
 * most without it (onebit refuses to run without it). Every other field is
 * zero. WIA_ERROR_INVALID_ARGUMENT names the spec and what is wrong. */
WIA_API wia_status_t wia_compression_config_from_string(const char* spec,
                                                        wia_compression_config_t* config);

/* Forgets every error-feedback residual and random-k step counter of comm
 * (as at creation). Call it with no compressed call of comm in flight. */
WIA_API wia_status_t wia_compression_reset(wia_communicator_t comm);
/* The residual kept for `buffer` (the input address of compressed calls),
 * count float32 values; zeros when none is kept yet. count must equal the
 * count of the calls on that buffer once one has run. For checkpoints:
 * synchronise the stream first. */
WIA_API wia_status_t wia_compression_get_residual(wia_communicator_t comm, const void* buffer,
                                                  float* residual, size_t count);
/* Replaces (or creates) the residual kept for `buffer`. */
WIA_API wia_status_t wia_compression_set_residual(wia_communicator_t comm, const void* buffer,
                                                  const float* residual, size_t count);

#ifdef __cplusplus
}
#endif

#endif /* WIA_COMPRESSION_H */
