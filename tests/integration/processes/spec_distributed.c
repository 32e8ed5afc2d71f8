/* SPDX-License-Identifier: Apache-2.0 */
/* Spec 6.10's snippet, compiled as C11 against wia.h nearly verbatim, run as
 * a one-process job (WIA_RANK=0, WIA_WORLD_SIZE=1). The snippet asks for 4
 * nodes of 8 devices over RDMA; this job is one process on one node, so the
 * call must fail with a message naming both values, and the same code with
 * the defaults must then give a working communicator. */
#include <wia/wia.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

/* The launcher's part: where rank 0's bootstrap root listens. */
static void set_root_address(void) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a;
  memset(&a, 0, sizeof a);
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  if (fd < 0 || bind(fd, (struct sockaddr*)&a, sizeof a) != 0 ||
      getsockname(fd, (struct sockaddr*)&a, &len) != 0) {
    perror("free port");
    exit(1);
  }
  close(fd);
  char addr[64];
  snprintf(addr, sizeof addr, "127.0.0.1:%d", ntohs(a.sin_port));
  setenv("WIA_ROOT_ADDR", addr, 1);
}

int main(void) {
  set_root_address();
  // Multi-node communicator spanning 4 nodes, 8 GPUs each
  wia_distributed_config_t dist_cfg = {
      .num_nodes = 4,
      .devices_per_node = 8,
      .network_backend = WIA_NET_RDMA,
      .rdma_device = "mlx5_0",
      .rdma_port = 1,

      .use_gpu_direct_rdma = true,  // RDMA directly to/from GPU memory
      .compression = WIA_NET_COMPRESS_AUTO};

  wia_communicator_t global_comm;
  wia_status_t st = wia_create_distributed_communicator(&dist_cfg, &global_comm);
  if (st != WIA_ERROR_INVALID_ARGUMENT ||
      strstr(wia_get_last_error(), "num_nodes is 4 but the launch spans 1 node") == NULL) {
    fprintf(stderr, "expected a num_nodes mismatch, got %d: %s\n", (int)st, wia_get_last_error());
    return 1;
  }

  dist_cfg.num_nodes = 0;  /* whatever the launcher gives */
  dist_cfg.devices_per_node = 0;
  if (wia_create_distributed_communicator(&dist_cfg, &global_comm) != WIA_SUCCESS) {
    fprintf(stderr, "create: %s\n", wia_get_last_error());
    return 1;
  }
  printf("Created distributed communicator:\n");
  printf("  Total devices: %d\n", wia_comm_size(global_comm));
  printf("  My global rank: %d\n", wia_comm_rank(global_comm));
  printf("  My node: %d\n", wia_comm_node_rank(global_comm));
  printf("  My local rank: %d\n", wia_comm_local_rank(global_comm));

  // Collective operates seamlessly across nodes
  float gradients[4] = {1, 2, 3, 4}, reduced_gradients[4] = {0};
  size_t count = 4;
  wia_collective_config_t config = {.datatype = WIA_FLOAT32, .reduction_op = WIA_REDUCE_SUM};
  wia_stream_t stream = NULL;
  wia_all_reduce(global_comm, gradients, reduced_gradients, count, &config, stream);
  if (wia_stream_synchronize(stream) != WIA_SUCCESS || reduced_gradients[3] != 4.0f) {
    fprintf(stderr, "all-reduce: %s\n", wia_get_last_error());
    return 1;
  }
  if (wia_comm_size(global_comm) != 1 || wia_comm_node_rank(global_comm) != 0) return 1;
  return wia_destroy_communicator(global_comm) == WIA_SUCCESS ? 0 : 1;
}
