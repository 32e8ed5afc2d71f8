/* SPDX-License-Identifier: Apache-2.0 */
/*
 * wia/checkpoint.h - checkpoints that survive crashes (spec 6.9).
 * Included by <wia/wia.h>. docs/checkpoints.md describes the files on disk
 * and the commit protocol.
 *
 * A checkpoint is a set of named tensors (host memory or any wia_malloc'd
 * device memory) plus typed metadata. Saving copies every tensor to a
 * staging buffer before it returns, so the originals may change as soon as
 * it has; the files are then compressed, checksummed and written (in the
 * background for an async save), and a
 * checkpoint becomes visible only when all of it is durable: it is
 * loadable or invisible, never half written. Loading checks every
 * checksum: a flipped byte, a truncated file or a missing shard is
 * WIA_ERROR_CORRUPT naming the file.
 *
 * Across processes (config.comm a process communicator) saving is a
 * collective call: every rank writes its own shard in parallel, and rank 0
 * commits the checkpoint once every shard is durable. checkpoint_dir must
 * then be one directory that every rank sees (a shared file system).
 */
#ifndef WIA_CHECKPOINT_H
#define WIA_CHECKPOINT_H

/* Compression of the data files (liblz4, libzstd). */
typedef enum wia_checkpoint_compression {
  WIA_CKPT_COMPRESS_NONE = 0,
  WIA_CKPT_COMPRESS_LZ4 = 1,
  WIA_CKPT_COMPRESS_ZSTD = 2
} wia_checkpoint_compression_t;

/* Who writes what across the ranks of config.comm. */
typedef enum wia_checkpoint_shard_mode {
  /* Every rank saves the tensors it added; every rank restores its own. */
  WIA_CKPT_SHARDED = 0,
  /* Every rank holds the same tensors (data-parallel replicas): rank 0
   * writes them and every rank, of any communicator size, restores them. */
  WIA_CKPT_REPLICATED = 1
} wia_checkpoint_shard_mode_t;

/* Zero-initialised fields mean defaults. */
typedef struct wia_checkpoint_config {
  /* Directory of the checkpoints; created (with its parents) on the first
   * save. One job at a time may save to it (a lock file). */
  const char* checkpoint_dir;
  /* Iterations between saves. The application's loop reads it (spec 6.9);
   * the library does not. */
  int checkpoint_interval;
  /* wia_save_checkpoint_async returns before the file I/O when true; when
   * false it writes and commits before returning, as wia_save_checkpoint. */
  bool async_checkpointing;
  wia_checkpoint_compression_t compression;
  /* Committed checkpoints kept: after a commit the oldest beyond this many
   * are deleted. 0 = keep every one. */
  int keep_last;
  wia_checkpoint_shard_mode_t shard_mode;
  /* NULL: this process alone. A process communicator: saving and loading
   * are collective over it (see above). A device communicator counts as
   * one process. */
  wia_communicator_t comm;
  /* Codec level: 0 = the codec's default (LZ4 1 = fastest, ZSTD 3). */
  int compression_level;
  /* How long a save waits for the other ranks' shards (rank 0) or for the
   * commit (the others) before failing with WIA_ERROR_TIMEOUT; the
   * checkpoint then stays invisible. 0 = 600000 (10 minutes). */
  uint32_t timeout_ms;
} wia_checkpoint_config_t;

typedef struct wia_checkpoint_s wia_checkpoint_t;

/* wia_model_t (its tensors) and wia_tensor_ref_t are in <wia/topology.h>. */

/* An optimizer's state as named tensors: moments, step counters, ... */
typedef struct wia_optimizer {
  const wia_tensor_ref_t* tensors;
  size_t num_tensors;
} wia_optimizer_t;

#define WIA_CHECKPOINT_NAME_MAX 255

/* An empty checkpoint to fill and save. NULL on failure
 * (wia_get_last_error says why). */
WIA_API wia_checkpoint_t* wia_create_checkpoint(void);
/* Waits for a pending save of ckpt, then releases it. Returns that save's
 * status (WIA_SUCCESS when none was pending). NULL is accepted. */
WIA_API wia_status_t wia_free_checkpoint(wia_checkpoint_t* ckpt);

/* What to save: references, read when a save is called (not now). */
WIA_API wia_status_t wia_checkpoint_add_model(wia_checkpoint_t* ckpt, const wia_model_t* model);
WIA_API wia_status_t wia_checkpoint_add_optimizer(wia_checkpoint_t* ckpt,
                                                  const wia_optimizer_t* optimizer);
WIA_API wia_status_t wia_checkpoint_add_tensor(wia_checkpoint_t* ckpt, const char* name,
                                               const void* data, size_t count,
                                               wia_datatype_t datatype);

/* The error-feedback residual the compression API keeps for `buffer` on
 * comm (wia_compression_get_residual; synchronise the stream first),
 * copied now and saved under `name`, so a resumed job compresses as the
 * interrupted one would have. wia_restore_compression_residual puts it back
 * for `buffer` (which may be another address in the new process). */
WIA_API wia_status_t wia_checkpoint_add_compression_residual(wia_checkpoint_t* ckpt,
                                                             wia_communicator_t comm,
                                                             const char* name, const void* buffer,
                                                             size_t count);
WIA_API wia_status_t wia_restore_compression_residual(const wia_checkpoint_t* ckpt,
                                                      wia_communicator_t comm, const char* name,
                                                      const void* buffer, size_t count);

/* Typed metadata, copied now. A name already set is replaced. */
WIA_API wia_status_t wia_checkpoint_add_metadata_int(wia_checkpoint_t* ckpt, const char* name,
                                                     const int* value);
WIA_API wia_status_t wia_checkpoint_add_metadata_int64(wia_checkpoint_t* ckpt, const char* name,
                                                       const int64_t* value);
WIA_API wia_status_t wia_checkpoint_add_metadata_double(wia_checkpoint_t* ckpt, const char* name,
                                                        const double* value);
WIA_API wia_status_t wia_checkpoint_add_metadata_string(wia_checkpoint_t* ckpt, const char* name,
                                                        const char* value);
WIA_API wia_status_t wia_checkpoint_add_metadata_bytes(wia_checkpoint_t* ckpt, const char* name,
                                                       const void* data, size_t size);

/* Saves ckpt to config->checkpoint_dir and commits it before returning. */
WIA_API wia_status_t wia_save_checkpoint(wia_checkpoint_t* ckpt,
                                         const wia_checkpoint_config_t* config);
/* Copies every tensor to host staging memory on save_stream (NULL: the
 * current device's default stream; the copies follow its earlier work),
 * waits for those copies only, and returns: the tensors may change at once.
 * A background thread then compresses, writes and commits;
 * wia_checkpoint_wait gives the outcome. One save per ckpt at a time. */
WIA_API wia_status_t wia_save_checkpoint_async(wia_checkpoint_t* ckpt,
                                               const wia_checkpoint_config_t* config,
                                               wia_stream_t save_stream);
/* Waits for ckpt's pending save (bounded by config.timeout_ms) and returns
 * its status: WIA_SUCCESS once the checkpoint is committed. */
WIA_API wia_status_t wia_checkpoint_wait(wia_checkpoint_t* ckpt);
/* The directory of ckpt's last save or of the checkpoint it was loaded
 * from ("" before either). Valid while ckpt lives. */
WIA_API const char* wia_checkpoint_path(const wia_checkpoint_t* ckpt);

/* The newest committed checkpoint of config->checkpoint_dir, this rank's
 * shard (config->comm). NULL when there is none or it is damaged:
 * wia_get_last_error says which. */
WIA_API wia_checkpoint_t* wia_load_latest_checkpoint(const wia_checkpoint_config_t* config);
/* The checkpoint directory `path` (one ckpt-NNNNNNNN), shard of rank 0. */
WIA_API wia_checkpoint_t* wia_load_checkpoint(const char* path);
/* Either of the above with a status: path NULL = the latest of
 * config->checkpoint_dir; config NULL = one process. *ckpt is NULL and the
 * status WIA_ERROR_UNAVAILABLE when no checkpoint was ever committed, and
 * WIA_ERROR_CORRUPT when a file fails its checks. */
WIA_API wia_status_t wia_load_checkpoint_ex(const char* path, const wia_checkpoint_config_t* config,
                                            wia_checkpoint_t** ckpt);

/* Copy saved tensors back into the caller's buffers. Every tensor of the
 * model (optimizer) must be in the checkpoint with the same datatype and
 * count, else nothing is written and the error names the tensor. */
WIA_API wia_status_t wia_restore_model(const wia_model_t* model, const wia_checkpoint_t* ckpt);
WIA_API wia_status_t wia_restore_optimizer(const wia_optimizer_t* optimizer,
                                           const wia_checkpoint_t* ckpt);
WIA_API wia_status_t wia_restore_tensor(const wia_checkpoint_t* ckpt, const char* name, void* data,
                                        size_t count, wia_datatype_t datatype);

/* Metadata of a loaded (or filled) checkpoint. Integers convert between
 * int and int64 when the value fits; a string is valid while ckpt lives. */
WIA_API wia_status_t wia_get_checkpoint_metadata_int(const wia_checkpoint_t* ckpt, const char* name,
                                                     int* value);
WIA_API wia_status_t wia_get_checkpoint_metadata_int64(const wia_checkpoint_t* ckpt,
                                                       const char* name, int64_t* value);
WIA_API wia_status_t wia_get_checkpoint_metadata_double(const wia_checkpoint_t* ckpt,
                                                        const char* name, double* value);
WIA_API wia_status_t wia_get_checkpoint_metadata_string(const wia_checkpoint_t* ckpt,
                                                        const char* name, const char** value);
WIA_API wia_status_t wia_get_checkpoint_metadata_bytes(const wia_checkpoint_t* ckpt,
                                                       const char* name, const void** data,
                                                       size_t* size);

/* Spec 6.9 spellings: the type of the value pointer picks the form, so
 * wia_checkpoint_add_metadata(ckpt, "iteration", &iter) works for int,
 * int64_t and double, and a char pointer is a string. */
#if defined(__cplusplus)
} /* extern "C" */
inline wia_status_t wia_checkpoint_add_metadata(wia_checkpoint_t* c, const char* n, const int* v) {
  return wia_checkpoint_add_metadata_int(c, n, v);
}
inline wia_status_t wia_checkpoint_add_metadata(wia_checkpoint_t* c, const char* n,
                                                const int64_t* v) {
  return wia_checkpoint_add_metadata_int64(c, n, v);
}
inline wia_status_t wia_checkpoint_add_metadata(wia_checkpoint_t* c, const char* n,
                                                const double* v) {
  return wia_checkpoint_add_metadata_double(c, n, v);
}
inline wia_status_t wia_checkpoint_add_metadata(wia_checkpoint_t* c, const char* n, const char* v) {
  return wia_checkpoint_add_metadata_string(c, n, v);
}
inline wia_status_t wia_get_checkpoint_metadata(const wia_checkpoint_t* c, const char* n, int* v) {
  return wia_get_checkpoint_metadata_int(c, n, v);
}
inline wia_status_t wia_get_checkpoint_metadata(const wia_checkpoint_t* c, const char* n,
                                                int64_t* v) {
  return wia_get_checkpoint_metadata_int64(c, n, v);
}
inline wia_status_t wia_get_checkpoint_metadata(const wia_checkpoint_t* c, const char* n,
                                                double* v) {
  return wia_get_checkpoint_metadata_double(c, n, v);
}
inline wia_status_t wia_get_checkpoint_metadata(const wia_checkpoint_t* c, const char* n,
                                                const char** v) {
  return wia_get_checkpoint_metadata_string(c, n, v);
}
extern "C" {
#else
#define wia_checkpoint_add_metadata(ckpt, name, value) \
  _Generic((value),                                           \
      int*: wia_checkpoint_add_metadata_int,                  \
      const int*: wia_checkpoint_add_metadata_int,            \
      int64_t*: wia_checkpoint_add_metadata_int64,            \
      const int64_t*: wia_checkpoint_add_metadata_int64,      \
      double*: wia_checkpoint_add_metadata_double,            \
      const double*: wia_checkpoint_add_metadata_double,      \
      char*: wia_checkpoint_add_metadata_string,              \
      const char*: wia_checkpoint_add_metadata_string)(ckpt, name, value)
#define wia_get_checkpoint_metadata(ckpt, name, out) \
  _Generic((out),                                             \
      int*: wia_get_checkpoint_metadata_int,                  \
      int64_t*: wia_get_checkpoint_metadata_int64,            \
      double*: wia_get_checkpoint_metadata_double,            \
      const char**: wia_get_checkpoint_metadata_string)(ckpt, name, out)
#endif

#endif /* WIA_CHECKPOINT_H */
