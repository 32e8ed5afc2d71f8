// SPDX-License-Identifier: Apache-2.0
// WIA_HOT_TLS marks a small thread_local that every API call reads (the
// per-thread lookup caches): the initial-exec model makes a read one
// instruction instead of a __tls_get_addr call from this shared library.
// The price is a few bytes of the static TLS block, which glibc reserves
// room for even when the library is dlopen'ed; keep such variables few
// and small.
#pragma once

#if defined(__GNUC__)
#define WIA_HOT_TLS __attribute__((tls_model("initial-exec")))
#else
#define WIA_HOT_TLS
#endif
