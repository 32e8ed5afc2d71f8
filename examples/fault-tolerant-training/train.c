/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Data-parallel least squares, trained the spec 6.9 way: every rank computes
 * the gradient of its shard of a fixed data set, an all-reduce sums them,
 * every rank applies the same update; every CKPT_EVERY iterations the
 * (replicated) parameters and the iteration are saved asynchronously; when
 * wia_detect_device_failure says a rank failed, the survivors agree on who
 * failed and re-form a smaller communicator in place
 * (wia_create_communicator_fault_tolerant), restore the latest checkpoint
 * and go on with the ranks that are left: no relaunch.
 *
 * Launch: one process per rank with RANK, WORLD_SIZE, MASTER_ADDR,
 * MASTER_PORT (torchrun style). Arguments: CHECKPOINT_DIR ITERATIONS
 * [OUT_FILE]. KILL_RANK/KILL_AT make that rank SIGKILL itself just before
 * the all-reduce of that iteration (the crash being recovered from).
 * Exit status: 0 finished (rank 0 wrote the parameters' bits to OUT_FILE),
 * 3 a failure was detected and the survivors could not recover in place
 * (relaunch from the latest checkpoint), 1 anything else.
 */
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <wia/wia.h>

#define FEATURES 64
#define SAMPLES 4096
#define CKPT_EVERY 10
#define LEARNING_RATE 0.05f

/* Sample s: its features, and its target from fixed true weights. */
static float feature(int s, int j) { return sinf(0.37f * (float)s + 1.3f * (float)j); }
static float target(int s) {
  float y = 0;
  for (int j = 0; j < FEATURES; ++j) y += feature(s, j) * (float)((j % 7) - 3) * 0.25f;
  return y;
}

/* Restores the latest checkpoint of cfg's directory, if there is one (saved
 * by any number of ranks), into model; returns the iteration to go on from
 * (0 when there is none), -1 on error. Collective over cfg->comm. */
static int resume(const wia_checkpoint_config_t* cfg, wia_model_t* model, int my_rank,
                  int num_ranks) {
  wia_checkpoint_t* latest = NULL;
  int saved = -1;
  if (wia_load_checkpoint_ex(NULL, cfg, &latest) != WIA_SUCCESS) return 0;
  const bool ok = wia_restore_model(model, latest) == WIA_SUCCESS &&
                  wia_get_checkpoint_metadata(latest, "iteration", &saved) == WIA_SUCCESS;
  wia_free_checkpoint(latest);
  if (!ok) return -1;
  if (my_rank == 0)
    fprintf(stderr, "rank 0: resumed from iteration %d with %d ranks\n", saved, num_ranks);
  return saved + 1;
}

static int fail(const char* what) {
  fprintf(stderr, "%s: %s\n", what, wia_get_last_error());
  return 1;
}

int main(int argc, char** argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: %s CHECKPOINT_DIR ITERATIONS [OUT_FILE]\n", argv[0]);
    return 1;
  }
  const int num_iterations = atoi(argv[2]);
  const int kill_rank = getenv("KILL_RANK") ? atoi(getenv("KILL_RANK")) : -1;
  const int kill_at = getenv("KILL_AT") ? atoi(getenv("KILL_AT")) : -1;

  wia_communicator_t comm;
  if (wia_create_distributed_communicator(NULL, &comm) != WIA_SUCCESS) return fail("join");
  int my_rank = wia_comm_rank(comm), num_ranks = wia_comm_size(comm);
  const int launch_rank = my_rank; /* KILL_RANK names a rank of the launch */

  static float weights[FEATURES], gradients[FEATURES];
  wia_tensor_ref_t params[] = {{"linear.weight", weights, FEATURES, WIA_FLOAT32}};
  wia_model_t model_storage = {0};
  model_storage.tensors = params;
  model_storage.num_tensors = 1;
  wia_model_t* model = &model_storage;

  wia_checkpoint_config_t ckpt_cfg = {
      .checkpoint_dir = argv[1],
      .checkpoint_interval = CKPT_EVERY,
      .async_checkpointing = true,
      .compression = WIA_CKPT_COMPRESS_LZ4,
      .shard_mode = WIA_CKPT_REPLICATED, /* data parallel: every rank holds the same weights */
      .comm = comm};
  wia_stream_t save_stream;
  if (wia_create_stream(&save_stream) != WIA_SUCCESS) return fail("stream");

  /* Resume from the latest checkpoint, if any (saved by any number of ranks). */
  int start = resume(&ckpt_cfg, model, my_rank, num_ranks);
  if (start < 0) return fail("restore");

  wia_checkpoint_t* pending = NULL;
  wia_collective_config_t sum = {.operation = WIA_COLLECTIVE_ALLREDUCE,
                                 .reduction_op = WIA_REDUCE_SUM,
                                 .datatype = WIA_FLOAT32};
  for (int iter = start; iter < num_iterations; iter++) {
    /* Regular training step: this rank's shard of the samples. */
    memset(gradients, 0, sizeof gradients);
    for (int s = my_rank; s < SAMPLES; s += num_ranks) {
      float err = -target(s);
      for (int j = 0; j < FEATURES; ++j) err += weights[j] * feature(s, j);
      for (int j = 0; j < FEATURES; ++j) gradients[j] += err * feature(s, j);
    }
    if (launch_rank == kill_rank && iter == kill_at) raise(SIGKILL);
    if (wia_all_reduce(comm, gradients, gradients, FEATURES, &sum, NULL) != WIA_SUCCESS ||
        wia_stream_synchronize(NULL) != WIA_SUCCESS || wia_detect_device_failure(comm)) {
      int failed[16], n = 0;
      wia_comm_get_failed(comm, failed, 16, &n);
      fprintf(stderr, "rank %d: device failure detected at iteration %d (%d rank(s) failed%s%d)\n",
              my_rank, iter, n, n > 0 ? ", first: " : "", n > 0 ? failed[0] : -1);
      if (pending) wia_free_checkpoint(pending); /* finishes (or fails) the save in flight */
      pending = NULL;
      /* Spec 6.9: go on without the failed rank. The survivors agree on the
       * failed set and re-form a communicator of themselves, renumbered. */
      wia_communicator_t smaller = NULL;
      if (wia_create_communicator_fault_tolerant(&smaller, comm) != WIA_SUCCESS) {
        fprintf(stderr, "rank %d: cannot recover in place: %s\n", my_rank, wia_get_last_error());
        wia_comm_abort(comm);
        return 3;
      }
      wia_destroy_communicator(comm);
      comm = smaller;
      my_rank = wia_comm_rank(comm);
      num_ranks = wia_comm_size(comm);
      ckpt_cfg.comm = comm;
      /* The failed step and those since the last checkpoint are redone. */
      iter = resume(&ckpt_cfg, model, my_rank, num_ranks);
      if (iter < 0) return fail("restore");
      --iter; /* the loop's increment */
      continue;
    }
    for (int j = 0; j < FEATURES; ++j) weights[j] -= LEARNING_RATE * gradients[j] / SAMPLES;

    /* Periodic checkpointing (the previous save must be done first). */
    if (iter % ckpt_cfg.checkpoint_interval == 0) {
      if (pending && wia_free_checkpoint(pending) != WIA_SUCCESS) return fail("save");
      wia_checkpoint_t* ckpt = wia_create_checkpoint();
      wia_checkpoint_add_model(ckpt, model);
      wia_checkpoint_add_metadata(ckpt, "iteration", &iter);
      if (wia_save_checkpoint_async(ckpt, &ckpt_cfg, save_stream) != WIA_SUCCESS)
        return fail("save");
      pending = ckpt;
    }
  }
  if (pending && wia_free_checkpoint(pending) != WIA_SUCCESS) return fail("save");

  double loss = 0;
  for (int s = 0; s < SAMPLES; ++s) {
    float err = -target(s);
    for (int j = 0; j < FEATURES; ++j) err += weights[j] * feature(s, j);
    loss += 0.5 * (double)err * err / SAMPLES;
  }
  if (my_rank == 0) {
    fprintf(stderr, "rank 0: finished %d iterations, loss %.6g\n", num_iterations, loss);
    if (argc > 3) {
      FILE* f = fopen(argv[3], "w");
      if (!f) return 1;
      for (int j = 0; j < FEATURES; ++j) {
        unsigned bits;
        memcpy(&bits, &weights[j], 4);
        fprintf(f, "%08x\n", bits);
      }
      fclose(f);
    }
  }
  wia_destroy_stream(save_stream);
  wia_destroy_communicator(comm);
  wia_finalize();
  return 0;
}
