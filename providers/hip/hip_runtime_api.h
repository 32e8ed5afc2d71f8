/* SPDX-License-Identifier: Apache-2.0 */
/*
 * hip_runtime_api.h - the part of the HIP runtime API the hip provider uses,
 * declared here so that the provider builds on a machine without ROCm or
 * Debian's libamdhip64-dev (it includes no hip/ header) and links nothing
 * of HIP: it opens libamdhip64.so.5 (then libamdhip64.so) with dlopen at
 * init and takes every entry below with dlsym.
 *
 * Values and signatures are those of HIP's documented ABI (hip_runtime_api.h
 * of ROCm 5.x and 6.x, which agree on every entry and constant below). Only
 * entries whose signature is the same in ROCm 5 and 6 are used: in
 * particular not hipGetDeviceProperties, whose struct changed in ROCm 6
 * (hipGetDevicePropertiesR0600), nor hipDeviceGetAttribute, whose enum
 * values were renumbered in ROCm 5.0.
 *
 * The test double tests/providers/fake-hip implements exactly this list (and
 * static_asserts each of its definitions against the wia_PFN_ types).
 */
#ifndef WIA_HIP_RUNTIME_API_H
#define WIA_HIP_RUNTIME_API_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef int wia_hipError_t;
typedef struct wia_ihipStream_t* wia_hipStream_t;
typedef struct wia_ihipEvent_t* wia_hipEvent_t;
typedef void (*wia_hipHostFn_t)(void* user_data);
typedef void (*wia_hipStreamCallback_t)(wia_hipStream_t stream, wia_hipError_t status,
                                        void* user_data);

#define WIA_HIP_IPC_HANDLE_SIZE 64
typedef struct wia_hipIpcMemHandle {
  char reserved[WIA_HIP_IPC_HANDLE_SIZE];
} wia_hipIpcMemHandle_t;

/* hipError_t values the provider tells apart (hipGetErrorName names the rest). */
#define WIA_hipSuccess 0
#define WIA_hipErrorInvalidValue 1
#define WIA_hipErrorOutOfMemory 2
#define WIA_hipErrorNotInitialized 3
#define WIA_hipErrorDeinitialized 4
#define WIA_hipErrorInsufficientDriver 35
#define WIA_hipErrorNoDevice 100
#define WIA_hipErrorInvalidDevice 101
#define WIA_hipErrorInvalidContext 201
#define WIA_hipErrorPeerAccessUnsupported 217
#define WIA_hipErrorInvalidHandle 400
#define WIA_hipErrorNotReady 600
#define WIA_hipErrorIllegalAddress 700
#define WIA_hipErrorPeerAccessAlreadyEnabled 704
#define WIA_hipErrorLaunchFailure 719
#define WIA_hipErrorNotSupported 801
#define WIA_hipErrorUnknown 999

/* Flags and enum values. */
#define WIA_hipMemcpyDefault 4 /* direction from the pointers (unified addressing) */
#define WIA_hipStreamNonBlocking 0x1
#define WIA_hipEventDefault 0x0
#define WIA_hipHostMallocPortable 0x1
/* hipMemRangeHandleType (ROCm 7 headers; not in ROCm 5.2's or 6.4's). */
#define WIA_hipMemRangeHandleTypeDmaBufFd 1
/* hipIpcOpenMemHandle's only flag was 0 in ROCm 5 and is 0x01 from ROCm 6
 * on (each runtime refuses the other's value): pass
 * wia_hip_ipc_lazy_flag(hipRuntimeGetVersion's answer). */
#define WIA_hipIpcMemLazyEnablePeerAccess_ROCM5 0x0
#define WIA_hipIpcMemLazyEnablePeerAccess_ROCM6 0x1
static inline unsigned int wia_hip_ipc_lazy_flag(int runtime_version) {
  /* HIP_VERSION: major * 10000000 + minor * 100000 + patch */
  return runtime_version >= 60000000 ? WIA_hipIpcMemLazyEnablePeerAccess_ROCM6
                                     : WIA_hipIpcMemLazyEnablePeerAccess_ROCM5;
}

/* Every entry the provider uses: X(return type, name, (parameters)). The
 * name is the exported symbol; the type is wia_PFN_<name>. */
#define WIA_HIP_RUNTIME_ENTRIES(X)                                                              \
  X(wia_hipError_t, hipInit, (unsigned int flags))                                              \
  X(wia_hipError_t, hipRuntimeGetVersion, (int* version))                                       \
  X(const char*, hipGetErrorName, (wia_hipError_t error))                                       \
  X(wia_hipError_t, hipGetDeviceCount, (int* count))                                            \
  X(wia_hipError_t, hipGetDevice, (int* device))                                                \
  X(wia_hipError_t, hipSetDevice, (int device))                                                 \
  X(wia_hipError_t, hipDeviceGetName, (char* name, int len, int device))                        \
  X(wia_hipError_t, hipDeviceTotalMem, (size_t * bytes, int device))                            \
  X(wia_hipError_t, hipDeviceGetPCIBusId, (char* bus_id, int len, int device))                  \
  X(wia_hipError_t, hipDeviceCanAccessPeer, (int* can_access, int device, int peer))            \
  X(wia_hipError_t, hipDeviceEnablePeerAccess, (int peer, unsigned int flags))                  \
  X(wia_hipError_t, hipMemGetInfo, (size_t * free_bytes, size_t * total_bytes))                 \
  X(wia_hipError_t, hipMalloc, (void** ptr, size_t bytes))                                      \
  X(wia_hipError_t, hipFree, (void* ptr))                                                       \
  X(wia_hipError_t, hipHostMalloc, (void** ptr, size_t bytes, unsigned int flags))              \
  X(wia_hipError_t, hipHostFree, (void* ptr))                                                   \
  X(wia_hipError_t, hipMemsetAsync, (void* dst, int value, size_t bytes, wia_hipStream_t s))    \
  X(wia_hipError_t, hipMemcpyAsync,                                                             \
    (void* dst, const void* src, size_t bytes, int kind, wia_hipStream_t s))                    \
  X(wia_hipError_t, hipMemcpyPeerAsync,                                                         \
    (void* dst, int dst_device, const void* src, int src_device, size_t bytes,                  \
     wia_hipStream_t s))                                                                        \
  X(wia_hipError_t, hipStreamCreateWithFlags, (wia_hipStream_t * stream, unsigned int flags))   \
  X(wia_hipError_t, hipStreamDestroy, (wia_hipStream_t stream))                                 \
  X(wia_hipError_t, hipStreamSynchronize, (wia_hipStream_t stream))                             \
  X(wia_hipError_t, hipStreamQuery, (wia_hipStream_t stream))                                   \
  X(wia_hipError_t, hipStreamWaitEvent,                                                         \
    (wia_hipStream_t stream, wia_hipEvent_t event, unsigned int flags))                         \
  X(wia_hipError_t, hipStreamAddCallback,                                                       \
    (wia_hipStream_t stream, wia_hipStreamCallback_t callback, void* data, unsigned int flags))  \
  X(wia_hipError_t, hipEventCreateWithFlags, (wia_hipEvent_t * event, unsigned int flags))      \
  X(wia_hipError_t, hipEventDestroy, (wia_hipEvent_t event))                                    \
  X(wia_hipError_t, hipEventRecord, (wia_hipEvent_t event, wia_hipStream_t stream))             \
  X(wia_hipError_t, hipEventQuery, (wia_hipEvent_t event))                                      \
  X(wia_hipError_t, hipEventSynchronize, (wia_hipEvent_t event))                                \
  X(wia_hipError_t, hipEventElapsedTime, (float* ms, wia_hipEvent_t start, wia_hipEvent_t end)) \
  X(wia_hipError_t, hipIpcGetMemHandle, (wia_hipIpcMemHandle_t * handle, void* ptr))            \
  X(wia_hipError_t, hipIpcOpenMemHandle,                                                        \
    (void** ptr, wia_hipIpcMemHandle_t handle, unsigned int flags))                             \
  X(wia_hipError_t, hipIpcCloseMemHandle, (void* ptr))

/* Entries a runtime may lack: ROCm 5.2 (Debian 12's libamdhip64.so.5)
 * declares hipLaunchHostFunc in its header but does not export it; the
 * provider then runs host functions through hipStreamAddCallback. */
#define WIA_HIP_RUNTIME_OPTIONAL_ENTRIES(X) \
  X(wia_hipError_t, hipLaunchHostFunc, (wia_hipStream_t stream, wia_hipHostFn_t fn, void* data))

/* Optional entries newer than the ROCm headers of Debian 12 (5.2), so
 * hip_runtime_api_matches checks them only against a header that declares
 * them (HIP 7): hipMemGetHandleForAddressRange, the dma-buf export of
 * mem_export_dmabuf (handle_type is hipMemRangeHandleType, dptr
 * hipDeviceptr_t = void*). Where the runtime lacks it, mem_export_dmabuf
 * answers NOT_SUPPORTED naming it. */
#define WIA_HIP_RUNTIME_NEWER_ENTRIES(X)            \
  X(wia_hipError_t, hipMemGetHandleForAddressRange, \
    (void* handle, void* dptr, size_t size, int handle_type, unsigned long long flags))

#define WIA_HIP_DECLARE_PFN(ret, name, params) typedef ret(*wia_PFN_##name) params;
WIA_HIP_RUNTIME_ENTRIES(WIA_HIP_DECLARE_PFN)
WIA_HIP_RUNTIME_OPTIONAL_ENTRIES(WIA_HIP_DECLARE_PFN)
WIA_HIP_RUNTIME_NEWER_ENTRIES(WIA_HIP_DECLARE_PFN)
#undef WIA_HIP_DECLARE_PFN

#ifdef __cplusplus
}
#endif

#endif /* WIA_HIP_RUNTIME_API_H */
