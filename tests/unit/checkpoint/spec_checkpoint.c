/* SPDX-License-Identifier: Apache-2.0 */
/* Spec 6.9's checkpoint snippet as C11 against <wia/wia.h>: the config as
 * the seed writes it (in a temporary directory instead of
 * /shared/checkpoints), a training loop that saves asynchronously every
 * checkpoint_interval iterations, then a simulated failure that loads the
 * latest checkpoint, restores model and optimizer and resumes at the
 * iteration its metadata records. The restored state is checked against
 * the state recomputed for that iteration. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <wia/wia.h>

#define N 4096
#define CHECK(x)                                                                                \
  do {                                                                                          \
    if (!(x)) {                                                                                 \
      fprintf(stderr, "%s:%d: %s failed (%s)\n", __FILE__, __LINE__, #x, wia_get_last_error()); \
      return 1;                                                                                 \
    }                                                                                           \
  } while (0)

static float weights[N], momentum[N];

/* A deterministic "training step": the state after iteration iter. */
static float weight_at(int iter, int i) { return (float)((i * 31 + iter * 7) % 1009) * 0.125f; }
static void train_step(int iter) {
  for (int i = 0; i < N; ++i) {
    weights[i] = weight_at(iter, i);
    momentum[i] = (float)iter - (float)(i % 17);
  }
}

int main(void) {
  char dir[] = "/tmp/wia_spec_ckpt_XXXXXX";
  CHECK(mkdtemp(dir) != NULL);
  wia_tensor_ref_t params[] = {{"fc.weight", weights, N, WIA_FLOAT32}};
  wia_tensor_ref_t state[] = {{"fc.weight.momentum", momentum, N, WIA_FLOAT32}};
  wia_model_t model_storage = {0};
  model_storage.tensors = params;
  model_storage.num_tensors = 1;
  wia_optimizer_t optimizer_storage = {state, 1};
  wia_model_t* model = &model_storage;
  wia_optimizer_t* optimizer = &optimizer_storage;
  wia_stream_t save_stream;
  CHECK(wia_create_stream(&save_stream) == WIA_SUCCESS);

  // Checkpoint configuration
  wia_checkpoint_config_t ckpt_cfg = {.checkpoint_dir = dir,
                                      .checkpoint_interval = 100,  // iterations
                                      .async_checkpointing = true,
                                      .compression = WIA_CKPT_COMPRESS_LZ4};

  const int num_iterations = 450;
  const int fail_at = 333;
  wia_checkpoint_t* pending[8] = {0};
  int npending = 0;
  int recovered = 0;
  for (int iter = 0; iter < num_iterations; iter++) {
    train_step(iter);
    if (iter % ckpt_cfg.checkpoint_interval == 0) {
      wia_checkpoint_t* ckpt = wia_create_checkpoint();
      CHECK(ckpt != NULL);
      CHECK(wia_checkpoint_add_model(ckpt, model) == WIA_SUCCESS);
      CHECK(wia_checkpoint_add_optimizer(ckpt, optimizer) == WIA_SUCCESS);
      CHECK(wia_checkpoint_add_metadata(ckpt, "iteration", &iter) == WIA_SUCCESS);
      CHECK(wia_save_checkpoint_async(ckpt, &ckpt_cfg, save_stream) == WIA_SUCCESS);
      pending[npending++] = ckpt;
    }
    if (iter == fail_at && !recovered) {
      /* The seed's recovery: everything saved so far has committed. */
      for (int k = 0; k < npending; ++k) CHECK(wia_checkpoint_wait(pending[k]) == WIA_SUCCESS);
      memset(weights, 0, sizeof weights);
      memset(momentum, 0, sizeof momentum);
      wia_checkpoint_t* latest = wia_load_latest_checkpoint(&ckpt_cfg);
      CHECK(latest != NULL);
      CHECK(wia_restore_model(model, latest) == WIA_SUCCESS);
      CHECK(wia_restore_optimizer(optimizer, latest) == WIA_SUCCESS);
      CHECK(wia_get_checkpoint_metadata(latest, "iteration", &iter) == WIA_SUCCESS);
      CHECK(iter == 300);
      for (int i = 0; i < N; ++i) {
        CHECK(weights[i] == weight_at(300, i));
        CHECK(momentum[i] == 300.0f - (float)(i % 17));
      }
      CHECK(wia_free_checkpoint(latest) == WIA_SUCCESS);
      fprintf(stderr, "Recovered from checkpoint, resuming at iteration %d\n", iter);
      recovered = 1;
    }
  }
  for (int k = 0; k < npending; ++k) CHECK(wia_free_checkpoint(pending[k]) == WIA_SUCCESS);
  CHECK(recovered);
  CHECK(wia_destroy_stream(save_stream) == WIA_SUCCESS);
  CHECK(wia_finalize() == WIA_SUCCESS);
  char cmd[64];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  return system(cmd) == 0 ? 0 : 1;
}
