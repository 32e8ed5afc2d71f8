// SPDX-License-Identifier: Apache-2.0
// WIA_THREAD_SANITIZER: 1 when built with -fsanitize=thread. GCC refuses
// std::atomic_thread_fence there (-Werror=tsan: TSan does not model
// fences), so code that relies on a fence gives TSan builds an equivalent
// it can see (an acquire load or a read-modify-write on the same atomic).
// GCC defines __SANITIZE_THREAD__, clang answers __has_feature.
#pragma once

#if defined(__SANITIZE_THREAD__)
#define WIA_THREAD_SANITIZER 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define WIA_THREAD_SANITIZER 1
#endif
#endif
#ifndef WIA_THREAD_SANITIZER
#define WIA_THREAD_SANITIZER 0
#endif
