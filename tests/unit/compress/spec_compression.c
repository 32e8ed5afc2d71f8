/* SPDX-License-Identifier: Apache-2.0 */
/* Spec 6.8, 6.8.1 and 6.8.2's snippets as C11 against <wia/wia.h>, run on
 * 2 host devices: the configs exactly as the seed writes them, a compressed
 * all-reduce with each, and the sparse all-reduce of 6.8.2. */
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <wia/wia.h>

#define N 1000
#define CHECK(x)                                                                                \
  do {                                                                                          \
    if (!(x)) {                                                                                 \
      fprintf(stderr, "%s:%d: %s failed (%s)\n", __FILE__, __LINE__, #x, wia_get_last_error()); \
      return 1;                                                                                 \
    }                                                                                           \
  } while (0)

static float gradients[2][N], reduced_gradients[2][N];

int main(void) {
  wia_device_t devs[2] = {0, 1};
  wia_communicator_t comm;
  wia_stream_t stream[2], compression_stream[2];
  CHECK(wia_create_communicator(devs, 2, &comm) == WIA_SUCCESS);
  for (int r = 0; r < 2; ++r) {
    CHECK(wia_create_stream_on(r, &stream[r]) == WIA_SUCCESS);
    CHECK(wia_create_stream_on(r, &compression_stream[r]) == WIA_SUCCESS);
    for (int i = 0; i < N; ++i) gradients[r][i] = (float)((i * 37 + r * 11) % 101) - 50.0f;
  }
  size_t count = N;

  /* 6.8 */
  for (int r = 0; r < 2; ++r) {
    wia_compression_config_t compression = {
        .method = WIA_COMPRESS_TOPK,
        .parameters = {.topk = {.k_ratio = 0.01}},  // Send top 1% gradients
        .error_feedback = true,                     // Accumulate residuals for next iteration
        .compression_stream = compression_stream[r]};
    CHECK(wia_all_reduce_compressed(comm, gradients[r], reduced_gradients[r], count, &compression,
                                    stream[r]) == WIA_SUCCESS);
  }

  /* 6.8.1 */
  wia_compression_config_t topk = {.method = WIA_COMPRESS_TOPK,
                                   .parameters = {.topk = {.k_ratio = 0.01, .use_magnitude = true}},
                                   .compression_ratio = 100,
                                   .accuracy_impact = "minimal"};
  wia_compression_config_t randomk = {.method = WIA_COMPRESS_RANDOMK,
                                      .parameters = {.randomk = {.k_ratio = 0.1, .seed = 42}},
                                      .compression_ratio = 10,
                                      .accuracy_impact = "very low"};
  wia_compression_config_t quant = {
      .method = WIA_COMPRESS_QUANTIZE,
      .parameters = {.quantize = {.num_bits = 8, .use_dynamic_range = true}},
      .compression_ratio = 4,
      .accuracy_impact = "low"};
  wia_compression_config_t onebit = {
      .method = WIA_COMPRESS_ONEBIT,
      .parameters = {.onebit = {.use_error_feedback = true,
                                .scaling_factor_precision = WIA_FLOAT32}},
      .compression_ratio = 32,
      .accuracy_impact = "moderate, compensated by error feedback"};
  const wia_compression_config_t* all[4] = {&topk, &randomk, &quant, &onebit};
  /* The 6.8 call left a top-k residual on these buffers; start clean. */
  for (int r = 0; r < 2; ++r) CHECK(wia_stream_synchronize(stream[r]) == WIA_SUCCESS);
  CHECK(wia_compression_reset(comm) == WIA_SUCCESS);
  for (int m = 0; m < 4; ++m) {
    for (int r = 0; r < 2; ++r)
      CHECK(wia_all_reduce_compressed(comm, gradients[r], reduced_gradients[r], count, all[m],
                                      stream[r]) == WIA_SUCCESS);
    for (int r = 0; r < 2; ++r) CHECK(wia_stream_synchronize(stream[r]) == WIA_SUCCESS);
    /* Both ranks hold the same estimate, close to the sum where it is sent. */
    CHECK(memcmp(reduced_gradients[0], reduced_gradients[1], sizeof reduced_gradients[0]) == 0);
  }
  /* The last was 1-bit with error feedback: after it, the output plus both
   * ranks' residuals is the exact sum. */
  static float res[2][N];
  for (int r = 0; r < 2; ++r)
    CHECK(wia_compression_get_residual(comm, gradients[r], res[r], N) == WIA_SUCCESS);
  for (int i = 0; i < N; ++i)
    CHECK(fabsf(reduced_gradients[0][i] + res[0][i] + res[1][i] -
                (gradients[0][i] + gradients[1][i])) < 1e-3f);

  double network_bandwidth = 5.0;
  wia_compression_config_t compression_config;
  if (network_bandwidth < 10.0) {  // GB/s
    compression_config = topk;     // Aggressive compression
  } else if (network_bandwidth < 50.0) {
    compression_config = quant;  // Moderate compression
  } else {
    compression_config.method = WIA_COMPRESS_NONE;  // No compression
  }
  CHECK(compression_config.method == WIA_COMPRESS_TOPK);

  /* 6.8.2: every rank sends the same k indices, so in place is the sum. */
  enum { k_count = 3 };
  float compressed[2][k_count];
  uint32_t indices[k_count] = {5, 500, 999};
  for (int r = 0; r < 2; ++r)
    for (int j = 0; j < k_count; ++j) compressed[r][j] = gradients[r][indices[j]];
  for (int r = 0; r < 2; ++r)
    CHECK(wia_all_reduce_sparse(comm, compressed[r], indices, k_count, stream[r]) == WIA_SUCCESS);
  for (int r = 0; r < 2; ++r) CHECK(wia_stream_synchronize(stream[r]) == WIA_SUCCESS);
  for (int r = 0; r < 2; ++r)
    for (int j = 0; j < k_count; ++j)
      CHECK(compressed[r][j] == gradients[0][indices[j]] + gradients[1][indices[j]]);

  for (int r = 0; r < 2; ++r) {
    wia_destroy_stream(stream[r]);
    wia_destroy_stream(compression_stream[r]);
  }
  CHECK(wia_destroy_communicator(comm) == WIA_SUCCESS);
  wia_finalize();
  return 0;
}
