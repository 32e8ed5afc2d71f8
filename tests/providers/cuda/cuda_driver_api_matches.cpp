// SPDX-License-Identifier: Apache-2.0
// providers/cuda/cuda_driver_api.h (the driver API the cuda provider
// declares itself, to build without CUDA) against the toolkit's cuda.h:
// every constant, the IPC handle size, and every entry of
// WIA_CUDA_DRIVER_ENTRIES, parameter by parameter. The checks are
// static_asserts, so a typo fails the build of this test; the run only
// confirms that it was built.
//
// cuda.h comes first: its macros (cuMemAlloc -> cuMemAlloc_v2, ...) then
// also rename the entries where this file names them, which is exactly
// the versioned function cuGetProcAddress returns for
// WIA_CUDA_API_VERSION.
#include <cuda.h>
// clang-format off
#include "cuda_driver_api.h"
// clang-format on

#include <doctest/doctest.h>

#include "support/abi_canonical_types.hpp"

#include <cstdint>
#include <type_traits>

namespace {

// --------------------------------------------------------------------------
// Constants: each WIA_<name> equals cuda.h's <name>.

#define WIA_SAME_CONSTANT(name) \
  static_assert(WIA_##name == name, "cuda_driver_api.h: WIA_" #name " differs from cuda.h");
WIA_SAME_CONSTANT(CUDA_SUCCESS)
WIA_SAME_CONSTANT(CUDA_ERROR_INVALID_VALUE)
WIA_SAME_CONSTANT(CUDA_ERROR_OUT_OF_MEMORY)
WIA_SAME_CONSTANT(CUDA_ERROR_NOT_INITIALIZED)
WIA_SAME_CONSTANT(CUDA_ERROR_DEINITIALIZED)
WIA_SAME_CONSTANT(CUDA_ERROR_STUB_LIBRARY)
WIA_SAME_CONSTANT(CUDA_ERROR_NO_DEVICE)
WIA_SAME_CONSTANT(CUDA_ERROR_INVALID_DEVICE)
WIA_SAME_CONSTANT(CUDA_ERROR_INVALID_IMAGE)
WIA_SAME_CONSTANT(CUDA_ERROR_INVALID_CONTEXT)
WIA_SAME_CONSTANT(CUDA_ERROR_NO_BINARY_FOR_GPU)
WIA_SAME_CONSTANT(CUDA_ERROR_UNSUPPORTED_PTX_VERSION)
WIA_SAME_CONSTANT(CUDA_ERROR_PEER_ACCESS_UNSUPPORTED)
WIA_SAME_CONSTANT(CUDA_ERROR_INVALID_HANDLE)
WIA_SAME_CONSTANT(CUDA_ERROR_NOT_FOUND)
WIA_SAME_CONSTANT(CUDA_ERROR_NOT_READY)
WIA_SAME_CONSTANT(CUDA_ERROR_ILLEGAL_ADDRESS)
WIA_SAME_CONSTANT(CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED)
WIA_SAME_CONSTANT(CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED)
WIA_SAME_CONSTANT(CUDA_ERROR_LAUNCH_FAILED)
WIA_SAME_CONSTANT(CUDA_ERROR_NOT_SUPPORTED)
WIA_SAME_CONSTANT(CUDA_ERROR_UNKNOWN)
WIA_SAME_CONSTANT(CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK)
WIA_SAME_CONSTANT(CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
WIA_SAME_CONSTANT(CU_DEVICE_ATTRIBUTE_PCI_BUS_ID)
WIA_SAME_CONSTANT(CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID)
WIA_SAME_CONSTANT(CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING)
WIA_SAME_CONSTANT(CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID)
WIA_SAME_CONSTANT(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)
WIA_SAME_CONSTANT(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)
WIA_SAME_CONSTANT(CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED)
WIA_SAME_CONSTANT(CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED)
WIA_SAME_CONSTANT(CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID)
WIA_SAME_CONSTANT(CU_POINTER_ATTRIBUTE_MEMORY_TYPE)
WIA_SAME_CONSTANT(CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL)
WIA_SAME_CONSTANT(CU_POINTER_ATTRIBUTE_RANGE_START_ADDR)
WIA_SAME_CONSTANT(CU_POINTER_ATTRIBUTE_RANGE_SIZE)
WIA_SAME_CONSTANT(CU_MEMORYTYPE_HOST)
WIA_SAME_CONSTANT(CU_MEMORYTYPE_DEVICE)
WIA_SAME_CONSTANT(CU_STREAM_NON_BLOCKING)
WIA_SAME_CONSTANT(CU_EVENT_DEFAULT)
WIA_SAME_CONSTANT(CU_EVENT_DISABLE_TIMING)
WIA_SAME_CONSTANT(CU_MEMHOSTALLOC_PORTABLE)
WIA_SAME_CONSTANT(CU_MEMHOSTREGISTER_PORTABLE)
WIA_SAME_CONSTANT(CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS)
WIA_SAME_CONSTANT(CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD)
WIA_SAME_CONSTANT(CU_GET_PROC_ADDRESS_DEFAULT)
WIA_SAME_CONSTANT(CU_IPC_HANDLE_SIZE)
#undef WIA_SAME_CONSTANT

// The ABI version we ask cuGetProcAddress for exists in this toolkit.
static_assert(WIA_CUDA_API_VERSION <= CUDA_VERSION, "WIA_CUDA_API_VERSION is newer than cuda.h");

// --------------------------------------------------------------------------
// Types, compared in the canonical form of support/abi_canonical_types.hpp.
}  // namespace

namespace wia::test {
// Handles: pointers to incomplete structs on both sides.
WIA_CANON_AS(wia_CUcontext, OpaquePointer<1>)
WIA_CANON_AS(CUcontext, OpaquePointer<1>)
WIA_CANON_AS(wia_CUstream, OpaquePointer<2>)
WIA_CANON_AS(CUstream, OpaquePointer<2>)
WIA_CANON_AS(wia_CUevent, OpaquePointer<3>)
WIA_CANON_AS(CUevent, OpaquePointer<3>)
WIA_CANON_AS(wia_CUmodule, OpaquePointer<4>)
WIA_CANON_AS(CUmodule, OpaquePointer<4>)
WIA_CANON_AS(wia_CUfunction, OpaquePointer<5>)
WIA_CANON_AS(CUfunction, OpaquePointer<5>)
WIA_CANON_AS(wia_CUipcMemHandle, IpcHandleBytes)
WIA_CANON_AS(CUipcMemHandle, IpcHandleBytes)
// cuda.h's enums are passed as int; ours are int.
WIA_CANON_AS(CUresult, int)
WIA_CANON_AS(CUdevice_attribute, int)
WIA_CANON_AS(CUpointer_attribute, int)
WIA_CANON_AS(CUmemRangeHandleType, int)
WIA_CANON_AS(CUdriverProcAddressQueryResult, int)
#undef WIA_CANON_AS

}  // namespace wia::test

namespace {
using wia::test::canon_t;

static_assert(sizeof(wia_CUipcMemHandle) == sizeof(CUipcMemHandle),
              "wia_CUipcMemHandle has not the size of CUipcMemHandle");
static_assert(sizeof(wia_CUcontext) == sizeof(CUcontext) &&
                  sizeof(wia_CUstream) == sizeof(CUstream) &&
                  sizeof(wia_CUevent) == sizeof(CUevent) &&
                  sizeof(wia_CUmodule) == sizeof(CUmodule) &&
                  sizeof(wia_CUfunction) == sizeof(CUfunction),
              "opaque handles differ in size");
static_assert(std::is_same_v<wia_CUdevice, CUdevice>, "wia_CUdevice is not CUdevice");
static_assert(std::is_same_v<wia_CUdeviceptr, CUdeviceptr>, "wia_CUdeviceptr is not CUdeviceptr");
static_assert(std::is_same_v<wia_CUhostFn, CUhostFn>, "wia_CUhostFn is not CUhostFn");
static_assert(std::is_same_v<uint64_t, cuuint64_t>, "cuuint64_t is not uint64_t");

// Guard against a canonical form that hides a difference: distinct widths
// and pointer depths must stay distinct.
static_assert(!std::is_same_v<canon_t<int>, canon_t<unsigned int>>);
static_assert(!std::is_same_v<canon_t<wia_CUcontext*>, canon_t<wia_CUcontext>>);
static_assert(!std::is_same_v<canon_t<wia_CUstream>, canon_t<wia_CUevent>>);
static_assert(!std::is_same_v<canon_t<wia_CUresult (*)(int)>, canon_t<wia_CUresult (*)(int, int)>>);

// --------------------------------------------------------------------------
// Entries: the type cuGetProcAddress hands back for each name is cuda.h's
// declaration of the same name (renamed to its versioned symbol by cuda.h's
// macros, since `name` is expanded where it is not pasted).

static_assert(
    std::is_same_v<canon_t<wia_PFN_cuGetProcAddress>, canon_t<decltype(&cuGetProcAddress)>>,
    "wia_PFN_cuGetProcAddress differs from cuda.h");

#define WIA_SAME_ENTRY(name, params)                                               \
  static_assert(std::is_same_v<canon_t<wia_PFN_##name>, canon_t<decltype(&name)>>, \
                "wia_PFN_" #name " (cuda_driver_api.h) differs from cuda.h");
WIA_CUDA_DRIVER_ENTRIES(WIA_SAME_ENTRY)
#undef WIA_SAME_ENTRY

#define WIA_COUNT_ENTRY(name, params) +1
constexpr int kEntries = 0 WIA_CUDA_DRIVER_ENTRIES(WIA_COUNT_ENTRY);
#undef WIA_COUNT_ENTRY

}  // namespace

TEST_CASE("cuda_driver_api.h matches the toolkit's cuda.h (checked while compiling)") {
  MESSAGE("checked " << kEntries << " driver entries against CUDA " << CUDA_VERSION);
  CHECK(kEntries > 0);
  CHECK(sizeof(wia_CUipcMemHandle) == sizeof(CUipcMemHandle));
}
