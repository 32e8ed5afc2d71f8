/* SPDX-License-Identifier: Apache-2.0 */
/* Spec 6.3 (peer-to-peer) written as the chapter writes it, compiled as C11
 * against wia.h, run on two host devices (WIA_HOST_DEVICES=2). Changes from
 * the text: declarations the snippet leaves implicit, the copy event named
 * copy_complete, and a host function in place of wia_launch_kernel. */
#include <stdio.h>
#include <string.h>

#include <wia/wia.h>

#define CHECK_OK(call)                                                        \
  do {                                                                        \
    wia_status_t st_ = (call);                                                \
    if (st_ != WIA_SUCCESS) {                                                 \
      fprintf(stderr, "%s:%d: %s failed: %s (%s)\n", __FILE__, __LINE__,     \
              #call, wia_status_string(st_), wia_get_last_error());           \
      return 1;                                                               \
    }                                                                         \
  } while (0)

static int kernel_ran = 0;
static void kernel(void* arg) { *(int*)arg = 1; }

int main(void) {
  wia_device_t device0 = 0, device1 = 1;
  size_t size = 4096 * 1000;
  void *src_on_device0, *dst_on_device1;
  wia_stream_t stream, compute_stream;

  CHECK_OK(wia_set_device(device0));
  CHECK_OK(wia_malloc(&src_on_device0, size));
  CHECK_OK(wia_create_stream(&stream));
  CHECK_OK(wia_memset(src_on_device0, 0x5a, size));
  CHECK_OK(wia_set_device(device1));
  CHECK_OK(wia_malloc(&dst_on_device1, size));
  CHECK_OK(wia_create_stream(&compute_stream));

  /* --- spec 6.3 --- */
  // Enable P2P between devices
  wia_enable_peer_access(device0, device1);
  wia_enable_peer_access(device1, device0);

  // Verify P2P capability
  if (wia_can_access_peer(device0, device1)) {
    printf("P2P access enabled: device0 <-> device1\n");
  } else {
    printf("P2P not available, will use host staging\n");
  }

  // Direct P2P copy (zero CPU involvement)
  wia_memcpy_peer(dst_on_device1, src_on_device0, size, stream);

  // Asynchronous P2P with event synchronization
  wia_event_t copy_complete;
  wia_create_event(&copy_complete);

  wia_memcpy_peer_async(dst_on_device1, src_on_device0, size, stream);
  wia_event_record(copy_complete, stream);

  // Launch computation on destination device
  wia_set_device(device1);
  wia_stream_wait_event(compute_stream, copy_complete);
  wia_launch_host_func(compute_stream, kernel, &kernel_ran);

  // Verify completion
  wia_stream_synchronize(stream);
  /* --- end of spec text --- */

  CHECK_OK(wia_stream_synchronize(compute_stream));
  static unsigned char check[4096 * 1000];
  CHECK_OK(wia_memcpy(check, dst_on_device1, size));
  for (size_t i = 0; i < size; ++i) {
    if (check[i] != 0x5a) {
      fprintf(stderr, "byte %zu is 0x%02x, expected 0x5a\n", i, check[i]);
      return 1;
    }
  }
  if (!kernel_ran) {
    fprintf(stderr, "the host function on compute_stream did not run\n");
    return 1;
  }
  CHECK_OK(wia_destroy_event(copy_complete));
  CHECK_OK(wia_finalize());
  printf("spec 6.3 snippet: ok\n");
  return 0;
}
