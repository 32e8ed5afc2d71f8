/* SPDX-License-Identifier: Apache-2.0 */
/* Spec 6.4 - 6.6 (collectives, algorithms, communicators) compiled as C11
 * against wia.h and run on 8 host devices. The spec shows one rank's view;
 * in one process every rank is driven from one thread, so each snippet is
 * wrapped in a loop over the devices with wia_set_device(d) and the
 * default stream (NULL) of the current device. Results are checked. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <wia/wia.h>

#define NUM_DEVICES 8
#define CHECK_OK(call)                                                                  \
  do {                                                                                  \
    wia_status_t st_ = (call);                                                          \
    if (st_ != WIA_SUCCESS) {                                                           \
      fprintf(stderr, "%s:%d: %s: %s (%s)\n", __FILE__, __LINE__, #call,               \
              wia_status_string(st_), wia_get_last_error());                            \
      exit(1);                                                                          \
    }                                                                                   \
  } while (0)
#define EXPECT(cond)                                                       \
  do {                                                                     \
    if (!(cond)) {                                                         \
      fprintf(stderr, "%s:%d: expected %s\n", __FILE__, __LINE__, #cond); \
      exit(1);                                                             \
    }                                                                      \
  } while (0)

static float* allocate_on(int device, size_t count) {
  void* p = NULL;
  CHECK_OK(wia_malloc_on(device, &p, count * sizeof(float)));
  return (float*)p;
}

static void synchronize_all(void) {
  for (int d = 0; d < NUM_DEVICES; ++d) {
    CHECK_OK(wia_set_device(d));
    CHECK_OK(wia_stream_synchronize(NULL));
  }
}

int main(void) {
  wia_device_t devices[NUM_DEVICES] = {0, 1, 2, 3, 4, 5, 6, 7};
  const int num_devices = NUM_DEVICES;
  wia_stream_t stream = NULL; /* the current device's default stream */
  const size_t num_params = 1000;

  /* --- 6.6: communicator over devices 0-7 --- */
  wia_communicator_t comm;
  CHECK_OK(wia_create_communicator(devices, 8, &comm));
  EXPECT(wia_comm_size(comm) == 8);
  CHECK_OK(wia_set_device(3));
  EXPECT(wia_comm_rank(comm) == 3);
  wia_communicator_t communicator = comm;

  /* --- 6.4.1: all-reduce, then average --- */
  float* local_gradients[NUM_DEVICES];
  float* summed_gradients[NUM_DEVICES];
  for (int d = 0; d < num_devices; ++d) {
    local_gradients[d] = allocate_on(d, num_params);
    summed_gradients[d] = allocate_on(d, num_params);
    for (size_t i = 0; i < num_params; ++i) local_gradients[d][i] = (float)(d + i % 7);
  }
  wia_collective_config_t config = {
      .operation = WIA_COLLECTIVE_ALLREDUCE,
      .reduction_op = WIA_REDUCE_SUM,
      .datatype = WIA_FLOAT32,
      .algorithm = WIA_ALLREDUCE_RING,  // or TREE, RABENSEIFNER
      .num_chunks = 8                   // Pipeline parameter
  };
  for (int d = 0; d < num_devices; ++d) {
    CHECK_OK(wia_set_device(d));
    CHECK_OK(wia_all_reduce(communicator, local_gradients[d], summed_gradients[d], num_params,
                            &config, stream));
  }
  synchronize_all();
  for (int d = 0; d < num_devices; ++d)
    for (size_t i = 0; i < num_params; ++i)
      EXPECT(summed_gradients[d][i] == (float)(28 + 8 * (i % 7)));
  // Now each device has the sum, compute average
  for (int d = 0; d < num_devices; ++d) {
    CHECK_OK(wia_set_device(d));
    CHECK_OK(wia_scale(summed_gradients[d], 1.0 / num_devices, num_params, stream));
  }
  synchronize_all();
  for (int d = 0; d < num_devices; ++d)
    for (size_t i = 0; i < num_params; ++i)
      EXPECT(summed_gradients[d][i] == (float)(28 + 8 * (i % 7)) / 8.0f);

  /* --- 6.4.2: broadcast model weights from rank 0 --- */
  float* model_weights[NUM_DEVICES];
  for (int d = 0; d < num_devices; ++d) {
    model_weights[d] = allocate_on(d, num_params);
    for (size_t i = 0; i < num_params; ++i) model_weights[d][i] = d == 0 ? (float)i : -1.0f;
  }
  for (int d = 0; d < num_devices; ++d) {
    CHECK_OK(wia_set_device(d));
    CHECK_OK(wia_broadcast(communicator, model_weights[d], num_params,
                           /*root_rank=*/0, WIA_FLOAT32, stream));
  }
  synchronize_all();
  for (int d = 1; d < num_devices; ++d)
    EXPECT(memcmp(model_weights[d], model_weights[0], num_params * sizeof(float)) == 0);

  /* --- 6.4.3: all-gather of batch shards --- */
  const int global_batch_size = 64;
  int local_batch_size = global_batch_size / num_devices;
  float* local_predictions[NUM_DEVICES];
  float* all_predictions[NUM_DEVICES];
  for (int d = 0; d < num_devices; ++d) {
    local_predictions[d] = allocate_on(d, local_batch_size);
    all_predictions[d] = allocate_on(d, global_batch_size);
    for (int i = 0; i < local_batch_size; ++i) local_predictions[d][i] = (float)(d * 100 + i);
  }
  for (int d = 0; d < num_devices; ++d) {
    CHECK_OK(wia_set_device(d));
    CHECK_OK(wia_all_gather(communicator, local_predictions[d], all_predictions[d],
                            local_batch_size, WIA_FLOAT32, stream));
  }
  synchronize_all();
  for (int d = 0; d < num_devices; ++d)
    for (int q = 0; q < num_devices; ++q)
      for (int i = 0; i < local_batch_size; ++i)
        EXPECT(all_predictions[d][q * local_batch_size + i] == (float)(q * 100 + i));

  /* --- 6.4.4: reduce-scatter --- */
  wia_collective_config_t rs_config = {.operation = WIA_COLLECTIVE_REDUCE_SCATTER,
                                       .reduction_op = WIA_REDUCE_SUM,
                                       .datatype = WIA_FLOAT32};
  const int total_size = 8 * 16;
  int slice_size = total_size / num_devices;
  float* full_input[NUM_DEVICES];
  float* my_slice[NUM_DEVICES];
  for (int d = 0; d < num_devices; ++d) {
    full_input[d] = allocate_on(d, total_size);
    my_slice[d] = allocate_on(d, slice_size);
    for (int i = 0; i < total_size; ++i) full_input[d][i] = (float)i;
  }
  for (int d = 0; d < num_devices; ++d) {
    CHECK_OK(wia_set_device(d));
    CHECK_OK(wia_reduce_scatter(communicator, full_input[d], my_slice[d], slice_size, &rs_config,
                                stream));
  }
  synchronize_all();
  for (int d = 0; d < num_devices; ++d)
    for (int i = 0; i < slice_size; ++i) EXPECT(my_slice[d][i] == 8.0f * (d * slice_size + i));

  /* --- 6.4.5: all-to-all with per-peer shard arrays --- */
  wia_collective_config_t a2a_config = {.operation = WIA_COLLECTIVE_ALLTOALL,
                                        .datatype = WIA_FLOAT32};
  int shard_size = 4;
  float* input_shards[NUM_DEVICES][NUM_DEVICES];
  float* output_shards[NUM_DEVICES][NUM_DEVICES];
  for (int d = 0; d < num_devices; ++d)
    for (int j = 0; j < num_devices; ++j) {
      input_shards[d][j] = allocate_on(d, shard_size);
      output_shards[d][j] = allocate_on(d, shard_size);
      for (int i = 0; i < shard_size; ++i) input_shards[d][j][i] = (float)(d * 1000 + j * 10 + i);
    }
  for (int d = 0; d < num_devices; ++d) {
    CHECK_OK(wia_set_device(d));
    // Transpose sharding: device i sends shard j to device j
    CHECK_OK(wia_all_to_all(communicator, input_shards[d], output_shards[d], shard_size,
                            &a2a_config, stream));
  }
  synchronize_all();
  for (int d = 0; d < num_devices; ++d)
    for (int j = 0; j < num_devices; ++j)
      for (int i = 0; i < shard_size; ++i)
        EXPECT(output_shards[d][j][i] == (float)(j * 1000 + d * 10 + i));

  /* --- 6.5.3: automatic selection and the report of it --- */
  wia_collective_config_t auto_cfg = {.operation = WIA_COLLECTIVE_ALLREDUCE,
                                      .reduction_op = WIA_REDUCE_SUM,
                                      .datatype = WIA_FLOAT32,
                                      .algorithm = WIA_ALGORITHM_AUTO};
  for (int d = 0; d < num_devices; ++d) {
    CHECK_OK(wia_set_device(d));
    CHECK_OK(wia_all_reduce(comm, local_gradients[d], summed_gradients[d], num_params, &auto_cfg,
                            stream));
  }
  synchronize_all();
  wia_algorithm_t selected = wia_get_selected_algorithm(comm);
  printf("Auto-selected algorithm: %s\n", selected.name);
  printf("Expected time: %.3f ms\n", selected.estimated_time_ms);
  EXPECT(selected.estimated_time_ms > 0);

  /* --- 6.6: stage communicators run independent collectives --- */
  wia_device_t stage_0_devices[4] = {0, 1, 2, 3};
  wia_communicator_t stage_0_comm;
  CHECK_OK(wia_create_communicator(stage_0_devices, 4, &stage_0_comm));
  wia_device_t stage_1_devices[4] = {4, 5, 6, 7};
  wia_communicator_t stage_1_comm;
  CHECK_OK(wia_create_communicator(stage_1_devices, 4, &stage_1_comm));
  for (int d = 0; d < num_devices; ++d) {
    CHECK_OK(wia_set_device(d));
    CHECK_OK(wia_all_reduce(d < 4 ? stage_0_comm : stage_1_comm, local_gradients[d],
                            summed_gradients[d], num_params, &config, stream));
  }
  synchronize_all();
  for (int d = 0; d < num_devices; ++d)
    for (size_t i = 0; i < num_params; ++i)
      EXPECT(summed_gradients[d][i] == (float)((d < 4 ? 6 : 22) + 4 * (i % 7)));

  CHECK_OK(wia_destroy_communicator(stage_0_comm));
  CHECK_OK(wia_destroy_communicator(stage_1_comm));
  CHECK_OK(wia_destroy_communicator(comm));
  CHECK_OK(wia_finalize());
  printf("spec 6.4-6.6 snippets: ok\n");
  return 0;
}
