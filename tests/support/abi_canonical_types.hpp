// SPDX-License-Identifier: Apache-2.0
// Comparing a provider's own declarations of a vendor API with the
// vendor's header (cuda_driver_api_matches, hip_runtime_api_matches):
// both headers' types mapped to one canonical form, so that types that must
// be identical are compared as such (int, size_t, pointer depth and
// constness), while each side's opaque handles and enums, which are
// different C++ types by construction, compare by what the ABI sees: an
// opaque pointer, or an int. Included as "support/abi_canonical_types.hpp".
#pragma once

#include <type_traits>

namespace wia::test {

// One tag per kind of handle, so that passing a stream where the vendor
// takes an event still fails; IpcHandleBytes: 64 bytes passed by value.
template <int kKind>
struct OpaquePointer {};
struct IpcHandleBytes {};

template <class T>
struct Canon {
  using type = T;
};
template <class T>
using canon_t = typename Canon<T>::type;

template <class T>
struct Canon<T*> {
  using type = canon_t<T>*;
};
template <class T>
struct Canon<const T> {
  using type = const canon_t<T>;
};
template <class R, class... Args>
struct Canon<R (*)(Args...)> {
  using type = canon_t<R> (*)(canon_t<Args>...);
};

// Guards against a canonical form that hides a difference.
static_assert(!std::is_same_v<canon_t<int>, canon_t<unsigned int>>);
static_assert(!std::is_same_v<canon_t<int*>, canon_t<int>>);

}  // namespace wia::test

// WIA_CANON_AS(type, canonical): `type` compares as `canonical`; at
// namespace wia::test scope.
#define WIA_CANON_AS(type_name, canonical)                                            \
  template <>                                                                         \
  struct Canon<type_name> {                                                           \
    using type = canonical;                                                           \
  };                                                                                  \
  static_assert(std::is_empty_v<canonical> || sizeof(type_name) == sizeof(canonical), \
                #type_name " does not have the size of its ABI form");
