// SPDX-License-Identifier: Apache-2.0
// providers/hip/hip_runtime_api.h (the HIP runtime API the hip provider
// declares itself, to build without ROCm) against Debian's ROCm header
// hip/hip_runtime_api.h: every constant, the IPC handle size, and every
// entry of WIA_HIP_RUNTIME_ENTRIES, parameter by parameter. The checks are
// static_asserts, so a wrong value fails the build of this test; the run
// only confirms that it was built. The test double (tests/providers/fake-hip)
// is built from the same declarations and so cannot catch such a mistake.
#include <hip/hip_runtime_api.h>
// clang-format off
#include "hip_runtime_api.h"
// clang-format on

#include <doctest/doctest.h>

#include "support/abi_canonical_types.hpp"

#include <type_traits>

namespace {

#define WIA_SAME_CONSTANT(name) \
  static_assert(WIA_##name == name, "hip_runtime_api.h: WIA_" #name " differs from ROCm's");
WIA_SAME_CONSTANT(hipSuccess)
WIA_SAME_CONSTANT(hipErrorInvalidValue)
WIA_SAME_CONSTANT(hipErrorOutOfMemory)
WIA_SAME_CONSTANT(hipErrorNotInitialized)
WIA_SAME_CONSTANT(hipErrorDeinitialized)
WIA_SAME_CONSTANT(hipErrorInsufficientDriver)
WIA_SAME_CONSTANT(hipErrorNoDevice)
WIA_SAME_CONSTANT(hipErrorInvalidDevice)
WIA_SAME_CONSTANT(hipErrorInvalidContext)
WIA_SAME_CONSTANT(hipErrorPeerAccessUnsupported)
WIA_SAME_CONSTANT(hipErrorInvalidHandle)
WIA_SAME_CONSTANT(hipErrorNotReady)
WIA_SAME_CONSTANT(hipErrorIllegalAddress)
WIA_SAME_CONSTANT(hipErrorPeerAccessAlreadyEnabled)
WIA_SAME_CONSTANT(hipErrorLaunchFailure)
WIA_SAME_CONSTANT(hipErrorNotSupported)
WIA_SAME_CONSTANT(hipErrorUnknown)
WIA_SAME_CONSTANT(hipMemcpyDefault)
WIA_SAME_CONSTANT(hipStreamNonBlocking)
WIA_SAME_CONSTANT(hipEventDefault)
WIA_SAME_CONSTANT(hipHostMallocPortable)
#undef WIA_SAME_CONSTANT
// The IPC open flag changed value between ROCm 5 (0) and 6 (0x01); the
// provider passes the one of the runtime it loaded.
#if HIP_VERSION_MAJOR < 6
static_assert(WIA_hipIpcMemLazyEnablePeerAccess_ROCM5 == hipIpcMemLazyEnablePeerAccess,
              "hipIpcMemLazyEnablePeerAccess of ROCm 5 differs");
#else
static_assert(WIA_hipIpcMemLazyEnablePeerAccess_ROCM6 == hipIpcMemLazyEnablePeerAccess,
              "hipIpcMemLazyEnablePeerAccess of ROCm 6 differs");
#endif
static_assert(WIA_HIP_IPC_HANDLE_SIZE == HIP_IPC_HANDLE_SIZE, "IPC handle size differs");
static_assert(sizeof(wia_hipIpcMemHandle_t) == sizeof(hipIpcMemHandle_t),
              "wia_hipIpcMemHandle_t has not the size of hipIpcMemHandle_t");

// Types, compared in the canonical form of support/abi_canonical_types.hpp.
}  // namespace

namespace wia::test {
WIA_CANON_AS(wia_hipStream_t, OpaquePointer<1>)
WIA_CANON_AS(hipStream_t, OpaquePointer<1>)
WIA_CANON_AS(wia_hipEvent_t, OpaquePointer<2>)
WIA_CANON_AS(hipEvent_t, OpaquePointer<2>)
WIA_CANON_AS(wia_hipIpcMemHandle_t, IpcHandleBytes)
WIA_CANON_AS(hipIpcMemHandle_t, IpcHandleBytes)
WIA_CANON_AS(hipError_t, int)
WIA_CANON_AS(hipMemcpyKind, int)
#undef WIA_CANON_AS
}  // namespace wia::test

namespace {
using wia::test::canon_t;

static_assert(std::is_same_v<canon_t<wia_hipHostFn_t>, canon_t<hipHostFn_t>>,
              "wia_hipHostFn_t is not hipHostFn_t");
static_assert(std::is_same_v<canon_t<wia_hipStreamCallback_t>, canon_t<hipStreamCallback_t>>,
              "wia_hipStreamCallback_t is not hipStreamCallback_t");

// Guard against a canonical form that hides a difference.
static_assert(!std::is_same_v<canon_t<int>, canon_t<unsigned int>>);
static_assert(!std::is_same_v<canon_t<wia_hipStream_t>, canon_t<wia_hipEvent_t>>);
static_assert(!std::is_same_v<canon_t<wia_hipStream_t*>, canon_t<wia_hipStream_t>>);

// Entries. ROCm's C++ header adds template overloads of hipMalloc and
// hipHostMalloc, whose address cannot be taken by name alone: for those
// the C overload is picked by its ROCm signature, which must exist.
// A compile error here names the two types: wia_PFN_<entry> and ROCm's.
template <class Ours, class Theirs>
consteval int same_entry() {
  static_assert(std::is_same_v<canon_t<Ours>, canon_t<Theirs>>,
                "an entry of hip_runtime_api.h differs from ROCm's");
  return 1;
}
#define WIA_SAME_ENTRY(name) +same_entry<wia_PFN_##name, decltype(&name)>()
#define WIA_SAME_OVERLOADED_ENTRY(name, rocm_type) \
  +same_entry<wia_PFN_##name, decltype(static_cast<std::add_pointer_t<rocm_type>>(&name))>()
// Every entry of WIA_HIP_RUNTIME_ENTRIES, once (kChecked == kEntries below).
constexpr int kChecked = 0
    WIA_SAME_ENTRY(hipInit) WIA_SAME_ENTRY(hipRuntimeGetVersion) WIA_SAME_ENTRY(hipGetErrorName)
    WIA_SAME_ENTRY(hipGetDeviceCount) WIA_SAME_ENTRY(hipGetDevice) WIA_SAME_ENTRY(hipSetDevice)
    WIA_SAME_ENTRY(hipDeviceGetName) WIA_SAME_ENTRY(hipDeviceTotalMem)
    WIA_SAME_ENTRY(hipDeviceGetPCIBusId) WIA_SAME_ENTRY(hipDeviceCanAccessPeer)
    WIA_SAME_ENTRY(hipDeviceEnablePeerAccess) WIA_SAME_ENTRY(hipMemGetInfo)
    WIA_SAME_OVERLOADED_ENTRY(hipMalloc, hipError_t(void**, size_t)) WIA_SAME_ENTRY(hipFree)
    WIA_SAME_OVERLOADED_ENTRY(hipHostMalloc, hipError_t(void**, size_t, unsigned int))
    WIA_SAME_ENTRY(hipHostFree) WIA_SAME_ENTRY(hipMemsetAsync) WIA_SAME_ENTRY(hipMemcpyAsync)
    WIA_SAME_ENTRY(hipMemcpyPeerAsync) WIA_SAME_ENTRY(hipStreamCreateWithFlags)
    WIA_SAME_ENTRY(hipStreamDestroy) WIA_SAME_ENTRY(hipStreamSynchronize)
    WIA_SAME_ENTRY(hipStreamQuery) WIA_SAME_ENTRY(hipStreamWaitEvent)
    WIA_SAME_ENTRY(hipLaunchHostFunc) WIA_SAME_ENTRY(hipStreamAddCallback)
    WIA_SAME_ENTRY(hipEventCreateWithFlags)
    WIA_SAME_ENTRY(hipEventDestroy) WIA_SAME_ENTRY(hipEventRecord) WIA_SAME_ENTRY(hipEventQuery)
    WIA_SAME_ENTRY(hipEventSynchronize) WIA_SAME_ENTRY(hipEventElapsedTime)
    WIA_SAME_ENTRY(hipIpcGetMemHandle) WIA_SAME_ENTRY(hipIpcOpenMemHandle)
    WIA_SAME_ENTRY(hipIpcCloseMemHandle);
#undef WIA_SAME_ENTRY
#undef WIA_SAME_OVERLOADED_ENTRY

#define WIA_COUNT_ENTRY(ret, name, params) +1
constexpr int kEntries =
    0 WIA_HIP_RUNTIME_ENTRIES(WIA_COUNT_ENTRY) WIA_HIP_RUNTIME_OPTIONAL_ENTRIES(WIA_COUNT_ENTRY);
#undef WIA_COUNT_ENTRY
static_assert(kChecked == kEntries,
              "an entry of WIA_HIP_RUNTIME_ENTRIES or _OPTIONAL_ENTRIES is not checked here");

// WIA_HIP_RUNTIME_NEWER_ENTRIES: only a header that declares them can
// check them (ROCm 7; Debian 12's 5.2 does not).
#if HIP_VERSION_MAJOR >= 7
static_assert(WIA_hipMemRangeHandleTypeDmaBufFd == hipMemRangeHandleTypeDmaBufFd,
              "hipMemRangeHandleTypeDmaBufFd differs");
// Ours passes the enum as int and hipDeviceptr_t as void*.
static_assert(std::is_same_v<hipDeviceptr_t, void*> && sizeof(hipMemRangeHandleType) == sizeof(int),
              "hipMemGetHandleForAddressRange's types are not passed as hip_runtime_api.h does");
static_assert(std::is_same_v<wia_PFN_hipMemGetHandleForAddressRange,
                             wia_hipError_t (*)(void*, void*, size_t, int, unsigned long long)>);
static_assert(std::is_same_v<decltype(&hipMemGetHandleForAddressRange),
                             hipError_t (*)(void*, void*, size_t, hipMemRangeHandleType,
                                            unsigned long long)>,
              "ROCm's hipMemGetHandleForAddressRange is not the one declared in "
              "hip_runtime_api.h (handle, dptr, size, handle type, flags)");
constexpr bool kNewerChecked = true;
#else
constexpr bool kNewerChecked = false;
#endif

}  // namespace

TEST_CASE("hip_runtime_api.h matches ROCm's hip/hip_runtime_api.h (checked while compiling)") {
  MESSAGE("checked " << kEntries << " runtime entries against HIP " << HIP_VERSION_MAJOR << "."
                     << HIP_VERSION_MINOR);
  CHECK(kEntries > 0);
  CHECK(sizeof(wia_hipIpcMemHandle_t) == sizeof(hipIpcMemHandle_t));
  if (!kNewerChecked)
    MESSAGE("hipMemGetHandleForAddressRange not checked: HIP " << HIP_VERSION_MAJOR
                                                               << " does not declare it");
}
