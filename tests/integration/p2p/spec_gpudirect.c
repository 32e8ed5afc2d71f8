/* SPDX-License-Identifier: Apache-2.0 */
/* Spec 6.10.1's snippet, compiled as C11 against wia.h verbatim (the
 * timing printouts aside: they measure functions of the reader's), run as
 * a one-process job (WIA_RANK=0, WIA_WORLD_SIZE=1). A job of one rank has
 * no one to send to: wia_send must say so, naming the (node, device) and
 * the communicator's shape. p2p_send_test.cpp runs it between processes. */
#include <wia/wia.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

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
  wia_distributed_config_t dist_cfg = {.network_backend = WIA_NET_RDMA,
                                       .rdma_device = "mlx5_0",
                                       .rdma_port = 1,
                                       .use_gpu_direct_rdma = false,
                                       .compression = WIA_NET_COMPRESS_AUTO};
  wia_communicator_t global_comm;
  if (wia_create_distributed_communicator(&dist_cfg, &global_comm) != WIA_SUCCESS) {
    fprintf(stderr, "create: %s\n", wia_get_last_error());
    return 1;
  }
  int dst_node = 0, dst_device = 1;
  char gpu_buffer[256] = {0};
  size_t size = sizeof gpu_buffer;
  wia_stream_t stream = NULL;

  // Enable GPUDirect RDMA
  wia_gpudirect_config_t gpudirect = {
      .enable_rdma = true,
      .enable_async_copy = true,
      .max_inline_size = 256,  // bytes
      .use_write_semantics = true};

  wia_enable_gpudirect_rdma(&dist_cfg, &gpudirect);

  // Transfers automatically use GPUDirect when available
  wia_status_t st = wia_send(dst_node, dst_device, gpu_buffer, size, stream);

  if (!dist_cfg.use_gpu_direct_rdma) {
    fprintf(stderr, "wia_enable_gpudirect_rdma did not set use_gpu_direct_rdma\n");
    return 1;
  }
  const char* want =
      "wia_send: (dst_node 0, dst_device 1) names no rank of the communicator, which has 1 "
      "rank(s) on 1 node(s): node 0 has devices 0..0";
  if (st != WIA_ERROR_INVALID_ARGUMENT || strstr(wia_get_last_error(), want) == NULL) {
    fprintf(stderr, "expected '%s', got %d: %s\n", want, (int)st, wia_get_last_error());
    return 1;
  }
  if (wia_send(0, 0, gpu_buffer, size, stream) != WIA_ERROR_INVALID_ARGUMENT ||
      strstr(wia_get_last_error(), "is the calling rank 0 itself") == NULL) {
    fprintf(stderr, "sending to itself: %s\n", wia_get_last_error());
    return 1;
  }
  if (wia_enable_gpudirect_rdma(NULL, &gpudirect) != WIA_ERROR_INVALID_ARGUMENT ||
      wia_enable_gpudirect_rdma(&dist_cfg, NULL) != WIA_ERROR_INVALID_ARGUMENT) {
    fprintf(stderr, "NULL arguments were accepted\n");
    return 1;
  }
  printf("spec 6.10.1 snippet: compiled as C11, wia_send refused clearly in a 1-rank job\n");
  return wia_destroy_communicator(global_comm) == WIA_SUCCESS ? 0 : 1;
}
