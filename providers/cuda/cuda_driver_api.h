/* SPDX-License-Identifier: Apache-2.0 */
/*
 * cuda_driver_api.h - the part of the CUDA Driver API the cuda provider uses,
 * declared here so that the provider builds on a machine without any CUDA
 * toolkit (a user's fresh Debian) and links nothing of the driver: it opens
 * libcuda.so.1 with dlopen and takes every entry below through
 * cuGetProcAddress, asking for the ABI of WIA_CUDA_API_VERSION.
 *
 * Values and signatures are copied from the driver's documented ABI; where
 * the toolkit's cuda.h is present at build time, the test
 * cuda_driver_api_matches (tests/providers/cuda/) checks every constant,
 * struct size and function type below against it, so a typo here fails the
 * build's tests instead of corrupting a call.
 *
 * The test double tests/providers/fake-cuda implements exactly this list.
 * Add an entry here, in the X-macro list, and in the double together.
 */
#ifndef WIA_CUDA_DRIVER_API_H
#define WIA_CUDA_DRIVER_API_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The driver ABI version whose variants of each entry we ask for (12.0:
 * cuMemAlloc is cuMemAlloc_v2, cuStreamDestroy is _v2, and so on). */
#define WIA_CUDA_API_VERSION 12000

typedef int wia_CUresult;
typedef int wia_CUdevice;
typedef unsigned long long wia_CUdeviceptr;
typedef struct wia_CUctx_st* wia_CUcontext;
typedef struct wia_CUstream_st* wia_CUstream;
typedef struct wia_CUevent_st* wia_CUevent;
typedef struct wia_CUmod_st* wia_CUmodule;
typedef struct wia_CUfunc_st* wia_CUfunction;
typedef void (*wia_CUhostFn)(void* user_data);

#define WIA_CU_IPC_HANDLE_SIZE 64
typedef struct wia_CUipcMemHandle {
  unsigned char reserved[WIA_CU_IPC_HANDLE_SIZE];
} wia_CUipcMemHandle;

/* CUresult values the provider tells apart (cuGetErrorName names the rest). */
#define WIA_CUDA_SUCCESS 0
#define WIA_CUDA_ERROR_INVALID_VALUE 1
#define WIA_CUDA_ERROR_OUT_OF_MEMORY 2
#define WIA_CUDA_ERROR_NOT_INITIALIZED 3
#define WIA_CUDA_ERROR_DEINITIALIZED 4
#define WIA_CUDA_ERROR_STUB_LIBRARY 34
#define WIA_CUDA_ERROR_NO_DEVICE 100
#define WIA_CUDA_ERROR_INVALID_DEVICE 101
#define WIA_CUDA_ERROR_INVALID_IMAGE 200
#define WIA_CUDA_ERROR_INVALID_CONTEXT 201
#define WIA_CUDA_ERROR_NO_BINARY_FOR_GPU 209
#define WIA_CUDA_ERROR_UNSUPPORTED_PTX_VERSION 222
#define WIA_CUDA_ERROR_PEER_ACCESS_UNSUPPORTED 217
#define WIA_CUDA_ERROR_INVALID_HANDLE 400
#define WIA_CUDA_ERROR_NOT_FOUND 500
#define WIA_CUDA_ERROR_NOT_READY 600
#define WIA_CUDA_ERROR_ILLEGAL_ADDRESS 700
#define WIA_CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED 704
#define WIA_CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED 712
#define WIA_CUDA_ERROR_LAUNCH_FAILED 719
#define WIA_CUDA_ERROR_NOT_SUPPORTED 801
#define WIA_CUDA_ERROR_UNKNOWN 999

/* CUdevice_attribute values. */
#define WIA_CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK 1
#define WIA_CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT 16
#define WIA_CU_DEVICE_ATTRIBUTE_PCI_BUS_ID 33
#define WIA_CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID 34
#define WIA_CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING 41
#define WIA_CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID 50
#define WIA_CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR 75
#define WIA_CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR 76
#define WIA_CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED 116
#define WIA_CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED 124
#define WIA_CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID 134

/* CUpointer_attribute and CUmemorytype values. */
#define WIA_CU_POINTER_ATTRIBUTE_MEMORY_TYPE 2
#define WIA_CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL 9
#define WIA_CU_POINTER_ATTRIBUTE_RANGE_START_ADDR 11
#define WIA_CU_POINTER_ATTRIBUTE_RANGE_SIZE 12
#define WIA_CU_MEMORYTYPE_HOST 1
#define WIA_CU_MEMORYTYPE_DEVICE 2

/* Flags. */
#define WIA_CU_STREAM_NON_BLOCKING 0x1
#define WIA_CU_EVENT_DEFAULT 0x0
#define WIA_CU_EVENT_DISABLE_TIMING 0x2
#define WIA_CU_MEMHOSTALLOC_PORTABLE 0x01
#define WIA_CU_MEMHOSTREGISTER_PORTABLE 0x01
#define WIA_CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS 0x1
#define WIA_CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD 0x1
#define WIA_CU_GET_PROC_ADDRESS_DEFAULT 0

/* The one entry found with dlsym; everything else comes through it.
 * Exported by the driver as "cuGetProcAddress_v2" (CUDA >= 12.0). */
typedef wia_CUresult (*wia_PFN_cuGetProcAddress)(const char* symbol, void** pfn, int cuda_version,
                                                 uint64_t flags, int* symbol_status);
#define WIA_CUDA_GET_PROC_ADDRESS_SYMBOL "cuGetProcAddress_v2"

/* Every other entry the provider uses: X(name, (parameters)). The name is
 * the one passed to cuGetProcAddress; the type is wia_PFN_<name>. */
#define WIA_CUDA_DRIVER_ENTRIES(X)                                                              \
  X(cuInit, (unsigned int flags))                                                               \
  X(cuDriverGetVersion, (int* version))                                                         \
  X(cuGetErrorName, (wia_CUresult error, const char** name))                                    \
  X(cuGetErrorString, (wia_CUresult error, const char** text))                                  \
  X(cuDeviceGetCount, (int* count))                                                             \
  X(cuDeviceGet, (wia_CUdevice * device, int ordinal))                                          \
  X(cuDeviceGetName, (char* name, int len, wia_CUdevice dev))                                   \
  X(cuDeviceTotalMem, (size_t * bytes, wia_CUdevice dev))                                       \
  X(cuDeviceGetAttribute, (int* value, int attribute, wia_CUdevice dev))                        \
  X(cuDeviceGetPCIBusId, (char* bus_id, int len, wia_CUdevice dev))                             \
  X(cuDeviceCanAccessPeer, (int* can_access, wia_CUdevice dev, wia_CUdevice peer))              \
  X(cuDevicePrimaryCtxRetain, (wia_CUcontext * ctx, wia_CUdevice dev))                          \
  X(cuDevicePrimaryCtxRelease, (wia_CUdevice dev))                                              \
  X(cuCtxSetCurrent, (wia_CUcontext ctx))                                                       \
  X(cuCtxGetCurrent, (wia_CUcontext * ctx))                                                     \
  X(cuCtxEnablePeerAccess, (wia_CUcontext peer_ctx, unsigned int flags))                        \
  X(cuMemGetInfo, (size_t * free_bytes, size_t * total_bytes))                                  \
  X(cuMemAlloc, (wia_CUdeviceptr * dptr, size_t bytes))                                         \
  X(cuMemFree, (wia_CUdeviceptr dptr))                                                          \
  X(cuMemHostAlloc, (void** ptr, size_t bytes, unsigned int flags))                             \
  X(cuMemFreeHost, (void* ptr))                                                                 \
  X(cuMemHostRegister, (void* ptr, size_t bytes, unsigned int flags))                           \
  X(cuMemHostUnregister, (void* ptr))                                                           \
  X(cuPointerGetAttribute, (void* data, int attribute, wia_CUdeviceptr ptr))                    \
  X(cuMemsetD8, (wia_CUdeviceptr dst, unsigned char value, size_t count))                       \
  X(cuMemsetD8Async, (wia_CUdeviceptr dst, unsigned char value, size_t count, wia_CUstream s))  \
  X(cuMemcpy, (wia_CUdeviceptr dst, wia_CUdeviceptr src, size_t bytes))                         \
  X(cuMemcpyAsync, (wia_CUdeviceptr dst, wia_CUdeviceptr src, size_t bytes, wia_CUstream s))    \
  X(cuMemcpyPeerAsync, (wia_CUdeviceptr dst, wia_CUcontext dst_ctx, wia_CUdeviceptr src,        \
                        wia_CUcontext src_ctx, size_t bytes, wia_CUstream s))                   \
  X(cuStreamCreate, (wia_CUstream * stream, unsigned int flags))                                \
  X(cuStreamDestroy, (wia_CUstream stream))                                                     \
  X(cuStreamSynchronize, (wia_CUstream stream))                                                 \
  X(cuStreamQuery, (wia_CUstream stream))                                                       \
  X(cuStreamWaitEvent, (wia_CUstream stream, wia_CUevent event, unsigned int flags))            \
  X(cuLaunchHostFunc, (wia_CUstream stream, wia_CUhostFn fn, void* user_data))                 \
  X(cuEventCreate, (wia_CUevent * event, unsigned int flags))                                   \
  X(cuEventDestroy, (wia_CUevent event))                                                        \
  X(cuEventRecord, (wia_CUevent event, wia_CUstream stream))                                    \
  X(cuEventQuery, (wia_CUevent event))                                                          \
  X(cuEventSynchronize, (wia_CUevent event))                                                    \
  X(cuEventElapsedTime, (float* ms, wia_CUevent start, wia_CUevent end))                        \
  X(cuIpcGetMemHandle, (wia_CUipcMemHandle * handle, wia_CUdeviceptr dptr))                     \
  X(cuIpcOpenMemHandle, (wia_CUdeviceptr * dptr, wia_CUipcMemHandle handle, unsigned int flags)) \
  X(cuIpcCloseMemHandle, (wia_CUdeviceptr dptr))                                                \
  X(cuModuleLoadData, (wia_CUmodule * module, const void* image))                               \
  X(cuModuleUnload, (wia_CUmodule module))                                                      \
  X(cuModuleGetFunction, (wia_CUfunction * fn, wia_CUmodule module, const char* name))          \
  X(cuLaunchKernel, (wia_CUfunction fn, unsigned int grid_x, unsigned int grid_y,               \
                     unsigned int grid_z, unsigned int block_x, unsigned int block_y,            \
                     unsigned int block_z, unsigned int shared_bytes, wia_CUstream stream,       \
                     void** params, void** extra))                                              \
  X(cuMemGetHandleForAddressRange, (void* handle, wia_CUdeviceptr dptr, size_t size,            \
                                    int handle_type, unsigned long long flags))

#define WIA_CUDA_DECLARE_PFN(name, params) typedef wia_CUresult(*wia_PFN_##name) params;
WIA_CUDA_DRIVER_ENTRIES(WIA_CUDA_DECLARE_PFN)
#undef WIA_CUDA_DECLARE_PFN

#ifdef __cplusplus
}
#endif

#endif /* WIA_CUDA_DRIVER_API_H */
