/* SPDX-License-Identifier: Apache-2.0 */
/* Copies a buffer between two devices and checks it: the smallest complete
 * libwia program. Run with WIA_HOST_DEVICES=2 on a machine without GPUs. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <wia/wia.h>

static int fail(const char* what, wia_status_t st) {
  fprintf(stderr, "%s: %s: %s\n", what, wia_status_string(st), wia_get_last_error());
  return 1;
}

int main(void) {
  int n = 0;
  wia_status_t st = wia_get_device_count(&n);
  if (st != WIA_SUCCESS) return fail("wia_get_device_count", st);
  if (n < 2) {
    fprintf(stderr, "need two devices (try WIA_HOST_DEVICES=2), have %d\n", n);
    return 1;
  }
  const size_t size = 1 << 20;
  void *a = NULL, *b = NULL;
  if ((st = wia_malloc_on(0, &a, size)) || (st = wia_malloc_on(1, &b, size)))
    return fail("wia_malloc_on", st);
  if ((st = wia_memset(a, 42, size))) return fail("wia_memset", st);
  if ((st = wia_memcpy_peer(b, a, size, NULL))) return fail("wia_memcpy_peer", st);
  unsigned char* check = malloc(size);
  if ((st = wia_memcpy(check, b, size))) return fail("wia_memcpy", st);
  for (size_t i = 0; i < size; ++i)
    if (check[i] != 42) {
      fprintf(stderr, "byte %zu wrong\n", i);
      return 1;
    }
  free(check);
  wia_free(a);
  wia_free(b);
  printf("p2p-copy: %zu bytes copied device 0 -> device 1 and verified\n", size);
  return wia_finalize() == WIA_SUCCESS ? 0 : 1;
}
