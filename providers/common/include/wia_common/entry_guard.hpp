// SPDX-License-Identifier: Apache-2.0
// The guard around every entry point of the device providers (cuda, hip,
// ze, host), which each wrote out the same way: check the context, keep
// what must outlive the body (cuda: the caller's current context, hip: its
// current device, ze and host: nothing), and turn any exception into a
// status with a message, so that none crosses the ABI.
#pragma once

#include <wia/provider.h>

#include <exception>
#include <new>
#include <utility>

namespace wia::common {

// For a provider that keeps nothing around its entries.
struct NoKeeper {};

// `ctx` must be a Provider (P::kMagic in its `magic`), else
// INVALID_ARGUMENT. keep(p) is made before the body and destroyed after it
// (returned by value: it may be neither copyable nor movable). The body's
// std::bad_alloc is OUT_OF_MEMORY, any other exception INTERNAL, each
// through p.fail(status, fmt, ...) naming `call`.
template <class P, class Keep, class F>
wia_status_t guarded_entry(void* ctx, const char* call, Keep&& keep, F&& body) noexcept {
  auto* p = static_cast<P*>(ctx);
  if (p == nullptr || p->magic != P::kMagic) return WIA_ERROR_INVALID_ARGUMENT;
  const auto kept = std::forward<Keep>(keep)(*p);
  static_cast<void>(kept);
  try {
    return std::forward<F>(body)(*p);
  } catch (const std::bad_alloc&) {
    return p->fail(WIA_ERROR_OUT_OF_MEMORY, "%s: out of host memory", call);
  } catch (const std::exception& e) {
    return p->fail(WIA_ERROR_INTERNAL, "%s: unexpected exception: %s", call, e.what());
  } catch (...) {
    return p->fail(WIA_ERROR_INTERNAL, "%s: unexpected exception", call);
  }
}

}  // namespace wia::common
