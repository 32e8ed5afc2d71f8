/* SPDX-License-Identifier: Apache-2.0 */
/*
 * ze_api.h - the part of the oneAPI Level Zero core API the ze provider
 * uses, declared here so that the provider builds without Debian's
 * libze-dev (it includes no level_zero/ header) and links nothing of it:
 * it opens libze_loader.so.1 (then libze_loader.so) with dlopen at init and
 * takes every entry below with dlsym.
 *
 * Values, struct layouts and signatures are those of Level Zero API 1.4
 * (loader 1.8.12, what Debian 12 ships); the provider uses nothing newer,
 * so any 1.x loader and driver serves it. In particular not
 * zeCommandListHostSynchronize (1.6) nor in-order command lists (1.7):
 * see docs/provider-ze.md for what was done instead.
 *
 * tests/providers/ze/ze_api_matches checks every entry, constant and struct
 * field below against /usr/include/level_zero/ze_api.h; the test double
 * tests/providers/fake-ze implements exactly this list (and static_asserts
 * each of its definitions against the wia_PFN_ types).
 */
#ifndef WIA_ZE_API_H
#define WIA_ZE_API_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Enums of the real header are passed as 32-bit values. */
typedef uint32_t wia_ze_result_t;
typedef uint32_t wia_ze_structure_type_t;
typedef uint32_t wia_ze_api_version_t;
typedef uint8_t wia_ze_bool_t;

typedef struct wia_ze_driver* wia_ze_driver_handle_t;
typedef struct wia_ze_device* wia_ze_device_handle_t;
typedef struct wia_ze_context* wia_ze_context_handle_t;
typedef struct wia_ze_command_list* wia_ze_command_list_handle_t;
typedef struct wia_ze_event_pool* wia_ze_event_pool_handle_t;
typedef struct wia_ze_event* wia_ze_event_handle_t;

/* ze_result_t values the provider tells apart or names. */
#define WIA_ZE_RESULT_SUCCESS 0x0u
#define WIA_ZE_RESULT_NOT_READY 0x1u
#define WIA_ZE_RESULT_ERROR_DEVICE_LOST 0x70000001u
#define WIA_ZE_RESULT_ERROR_OUT_OF_HOST_MEMORY 0x70000002u
#define WIA_ZE_RESULT_ERROR_OUT_OF_DEVICE_MEMORY 0x70000003u
#define WIA_ZE_RESULT_ERROR_DEVICE_REQUIRES_RESET 0x70000006u
#define WIA_ZE_RESULT_ERROR_DEVICE_IN_LOW_POWER_STATE 0x70000007u
#define WIA_ZE_RESULT_ERROR_DEPENDENCY_UNAVAILABLE 0x70020000u
#define WIA_ZE_RESULT_ERROR_UNINITIALIZED 0x78000001u
#define WIA_ZE_RESULT_ERROR_UNSUPPORTED_VERSION 0x78000002u
#define WIA_ZE_RESULT_ERROR_UNSUPPORTED_FEATURE 0x78000003u
#define WIA_ZE_RESULT_ERROR_INVALID_ARGUMENT 0x78000004u
#define WIA_ZE_RESULT_ERROR_INVALID_NULL_HANDLE 0x78000005u
#define WIA_ZE_RESULT_ERROR_HANDLE_OBJECT_IN_USE 0x78000006u
#define WIA_ZE_RESULT_ERROR_INVALID_NULL_POINTER 0x78000007u
#define WIA_ZE_RESULT_ERROR_INVALID_SIZE 0x78000008u
#define WIA_ZE_RESULT_ERROR_UNSUPPORTED_SIZE 0x78000009u
#define WIA_ZE_RESULT_ERROR_UNSUPPORTED_ALIGNMENT 0x7800000au
#define WIA_ZE_RESULT_ERROR_INVALID_SYNCHRONIZATION_OBJECT 0x7800000bu
#define WIA_ZE_RESULT_ERROR_INVALID_ENUMERATION 0x7800000cu
#define WIA_ZE_RESULT_ERROR_OVERLAPPING_REGIONS 0x7800001au
#define WIA_ZE_RESULT_ERROR_UNKNOWN 0x7ffffffeu

/* ze_structure_type_t values of the structs below. */
#define WIA_ZE_STRUCTURE_TYPE_DEVICE_PROPERTIES 0x3u
#define WIA_ZE_STRUCTURE_TYPE_DEVICE_MEMORY_PROPERTIES 0x7u
#define WIA_ZE_STRUCTURE_TYPE_CONTEXT_DESC 0xdu
#define WIA_ZE_STRUCTURE_TYPE_COMMAND_QUEUE_DESC 0xeu
#define WIA_ZE_STRUCTURE_TYPE_EVENT_POOL_DESC 0x10u
#define WIA_ZE_STRUCTURE_TYPE_EVENT_DESC 0x11u
#define WIA_ZE_STRUCTURE_TYPE_DEVICE_MEM_ALLOC_DESC 0x15u
#define WIA_ZE_STRUCTURE_TYPE_HOST_MEM_ALLOC_DESC 0x16u
/* External memory (API 1.0): the dma-buf export of mem_export_dmabuf. */
#define WIA_ZE_STRUCTURE_TYPE_DEVICE_EXTERNAL_MEMORY_PROPERTIES 0xcu
#define WIA_ZE_STRUCTURE_TYPE_MEMORY_ALLOCATION_PROPERTIES 0x17u
#define WIA_ZE_STRUCTURE_TYPE_EXTERNAL_MEMORY_EXPORT_DESC 0x18u
#define WIA_ZE_STRUCTURE_TYPE_EXTERNAL_MEMORY_EXPORT_FD 0x1au
/* Asked for so that timerResolution is in cycles per second (API >= 1.2). */
#define WIA_ZE_STRUCTURE_TYPE_DEVICE_PROPERTIES_1_2 0x00020006u

/* Flags and enum values. */
#define WIA_ZE_MAKE_VERSION(major, minor) (((major) << 16) | ((minor)&0x0000ffff))
#define WIA_ZE_DEVICE_TYPE_GPU 1u
#define WIA_ZE_DEVICE_TYPE_CPU 2u
#define WIA_ZE_COMMAND_QUEUE_MODE_SYNCHRONOUS 1u
#define WIA_ZE_COMMAND_QUEUE_MODE_ASYNCHRONOUS 2u
#define WIA_ZE_COMMAND_QUEUE_PRIORITY_NORMAL 0u
#define WIA_ZE_EVENT_POOL_FLAG_HOST_VISIBLE 0x1u
#define WIA_ZE_EVENT_SCOPE_FLAG_HOST 0x4u
#define WIA_ZE_EXTERNAL_MEMORY_TYPE_FLAG_DMA_BUF 0x2u
#define WIA_ZE_MEMORY_TYPE_DEVICE 2u
#define WIA_ZE_MAX_IPC_HANDLE_SIZE 64
#define WIA_ZE_MAX_DEVICE_NAME 256
#define WIA_ZE_MAX_DEVICE_UUID_SIZE 16

typedef struct wia_ze_device_properties {
  wia_ze_structure_type_t stype;
  void* pNext;
  uint32_t type;
  uint32_t vendorId;
  uint32_t deviceId;
  uint32_t flags;
  uint32_t subdeviceId;
  uint32_t coreClockRate;
  uint64_t maxMemAllocSize;
  uint32_t maxHardwareContexts;
  uint32_t maxCommandQueuePriority;
  uint32_t numThreadsPerEU;
  uint32_t physicalEUSimdWidth;
  uint32_t numEUsPerSubslice;
  uint32_t numSubslicesPerSlice;
  uint32_t numSlices;
  uint64_t timerResolution; /* cycles/s with stype DEVICE_PROPERTIES_1_2 */
  uint32_t timestampValidBits;
  uint32_t kernelTimestampValidBits;
  uint8_t uuid[WIA_ZE_MAX_DEVICE_UUID_SIZE];
  char name[WIA_ZE_MAX_DEVICE_NAME];
} wia_ze_device_properties_t;

typedef struct wia_ze_device_memory_properties {
  wia_ze_structure_type_t stype;
  void* pNext;
  uint32_t flags;
  uint32_t maxClockRate;
  uint32_t maxBusWidth;
  uint64_t totalSize;
  char name[WIA_ZE_MAX_DEVICE_NAME];
} wia_ze_device_memory_properties_t;

typedef struct wia_ze_context_desc {
  wia_ze_structure_type_t stype;
  const void* pNext;
  uint32_t flags;
} wia_ze_context_desc_t;

typedef struct wia_ze_command_queue_desc {
  wia_ze_structure_type_t stype;
  const void* pNext;
  uint32_t ordinal;
  uint32_t index;
  uint32_t flags;
  uint32_t mode;
  uint32_t priority;
} wia_ze_command_queue_desc_t;

typedef struct wia_ze_event_pool_desc {
  wia_ze_structure_type_t stype;
  const void* pNext;
  uint32_t flags;
  uint32_t count;
} wia_ze_event_pool_desc_t;

typedef struct wia_ze_event_desc {
  wia_ze_structure_type_t stype;
  const void* pNext;
  uint32_t index;
  uint32_t signal;
  uint32_t wait;
} wia_ze_event_desc_t;

typedef struct wia_ze_device_mem_alloc_desc {
  wia_ze_structure_type_t stype;
  const void* pNext;
  uint32_t flags;
  uint32_t ordinal;
} wia_ze_device_mem_alloc_desc_t;

typedef struct wia_ze_host_mem_alloc_desc {
  wia_ze_structure_type_t stype;
  const void* pNext;
  uint32_t flags;
} wia_ze_host_mem_alloc_desc_t;

/* zeDeviceGetExternalMemoryProperties: which handle types a device's
 * allocations can be exported as (flags of ze_external_memory_type_flags_t). */
typedef struct wia_ze_device_external_memory_properties {
  wia_ze_structure_type_t stype;
  void* pNext;
  uint32_t memoryAllocationImportTypes;
  uint32_t memoryAllocationExportTypes;
  uint32_t imageImportTypes;
  uint32_t imageExportTypes;
} wia_ze_device_external_memory_properties_t;

/* Chained into zeMemAllocDevice's descriptor: the allocation may be
 * exported as `flags` later (Level Zero asks for it at allocation). */
typedef struct wia_ze_external_memory_export_desc {
  wia_ze_structure_type_t stype;
  const void* pNext;
  uint32_t flags;
} wia_ze_external_memory_export_desc_t;

/* Chained into zeMemGetAllocProperties' result: the driver fills `fd` with
 * a new descriptor of the allocation, of type `flags`. */
typedef struct wia_ze_external_memory_export_fd {
  wia_ze_structure_type_t stype;
  const void* pNext;
  uint32_t flags;
  int fd;
} wia_ze_external_memory_export_fd_t;

typedef struct wia_ze_memory_allocation_properties {
  wia_ze_structure_type_t stype;
  void* pNext;
  uint32_t type; /* ze_memory_type_t */
  uint64_t id;
  uint64_t pageSize;
} wia_ze_memory_allocation_properties_t;

typedef struct wia_ze_ipc_mem_handle {
  char data[WIA_ZE_MAX_IPC_HANDLE_SIZE];
} wia_ze_ipc_mem_handle_t;

/* Every entry the provider uses: X(name, (parameters)); all return
 * ze_result_t. The name is the exported symbol; the type is wia_PFN_<name>. */
#define WIA_ZE_ENTRIES(X)                                                                          \
  X(zeInit, (uint32_t flags))                                                                      \
  X(zeDriverGet, (uint32_t * count, wia_ze_driver_handle_t * drivers))                             \
  X(zeDriverGetApiVersion, (wia_ze_driver_handle_t driver, wia_ze_api_version_t * version))        \
  X(zeDeviceGet, (wia_ze_driver_handle_t driver, uint32_t * count, wia_ze_device_handle_t * devs)) \
  X(zeDeviceGetProperties, (wia_ze_device_handle_t dev, wia_ze_device_properties_t * props))       \
  X(zeDeviceGetMemoryProperties,                                                                   \
    (wia_ze_device_handle_t dev, uint32_t * count, wia_ze_device_memory_properties_t * props))     \
  X(zeDeviceGetExternalMemoryProperties,                                                           \
    (wia_ze_device_handle_t dev, wia_ze_device_external_memory_properties_t * props))              \
  X(zeDeviceCanAccessPeer,                                                                         \
    (wia_ze_device_handle_t dev, wia_ze_device_handle_t peer, wia_ze_bool_t * value))              \
  X(zeContextCreate, (wia_ze_driver_handle_t driver, const wia_ze_context_desc_t* desc,            \
                      wia_ze_context_handle_t* context))                                           \
  X(zeContextDestroy, (wia_ze_context_handle_t context))                                           \
  X(zeCommandListCreateImmediate,                                                                  \
    (wia_ze_context_handle_t context, wia_ze_device_handle_t dev,                                  \
     const wia_ze_command_queue_desc_t* desc, wia_ze_command_list_handle_t* list))                 \
  X(zeCommandListDestroy, (wia_ze_command_list_handle_t list))                                     \
  X(zeCommandListAppendMemoryCopy,                                                                 \
    (wia_ze_command_list_handle_t list, void* dst, const void* src, size_t size,                   \
     wia_ze_event_handle_t signal, uint32_t num_waits, wia_ze_event_handle_t* waits))              \
  X(zeCommandListAppendMemoryFill,                                                                 \
    (wia_ze_command_list_handle_t list, void* ptr, const void* pattern, size_t pattern_size,       \
     size_t size, wia_ze_event_handle_t signal, uint32_t num_waits, wia_ze_event_handle_t* waits)) \
  X(zeCommandListAppendBarrier, (wia_ze_command_list_handle_t list, wia_ze_event_handle_t signal,  \
                                 uint32_t num_waits, wia_ze_event_handle_t * waits))               \
  X(zeCommandListAppendSignalEvent, (wia_ze_command_list_handle_t list, wia_ze_event_handle_t ev)) \
  X(zeCommandListAppendWaitOnEvents,                                                               \
    (wia_ze_command_list_handle_t list, uint32_t num_events, wia_ze_event_handle_t * events))      \
  X(zeCommandListAppendWriteGlobalTimestamp,                                                       \
    (wia_ze_command_list_handle_t list, uint64_t * dst, wia_ze_event_handle_t signal,              \
     uint32_t num_waits, wia_ze_event_handle_t * waits))                                           \
  X(zeEventPoolCreate,                                                                             \
    (wia_ze_context_handle_t context, const wia_ze_event_pool_desc_t* desc, uint32_t num_devices,  \
     wia_ze_device_handle_t* devices, wia_ze_event_pool_handle_t* pool))                           \
  X(zeEventPoolDestroy, (wia_ze_event_pool_handle_t pool))                                         \
  X(zeEventCreate,                                                                                 \
    (wia_ze_event_pool_handle_t pool, const wia_ze_event_desc_t* desc, wia_ze_event_handle_t* ev)) \
  X(zeEventDestroy, (wia_ze_event_handle_t ev))                                                    \
  X(zeEventHostSynchronize, (wia_ze_event_handle_t ev, uint64_t timeout_ns))                       \
  X(zeEventQueryStatus, (wia_ze_event_handle_t ev))                                                \
  X(zeEventHostSignal, (wia_ze_event_handle_t ev))                                                 \
  X(zeEventHostReset, (wia_ze_event_handle_t ev))                                                  \
  X(zeMemAllocDevice, (wia_ze_context_handle_t context, const wia_ze_device_mem_alloc_desc_t* d,   \
                       size_t size, size_t alignment, wia_ze_device_handle_t dev, void** ptr))     \
  X(zeMemAllocHost, (wia_ze_context_handle_t context, const wia_ze_host_mem_alloc_desc_t* desc,    \
                     size_t size, size_t alignment, void** ptr))                                   \
  X(zeMemFree, (wia_ze_context_handle_t context, void* ptr))                                       \
  X(zeMemGetAllocProperties,                                                                       \
    (wia_ze_context_handle_t context, const void* ptr,                                             \
     wia_ze_memory_allocation_properties_t* props, wia_ze_device_handle_t* dev))                   \
  X(zeMemGetIpcHandle,                                                                             \
    (wia_ze_context_handle_t context, const void* ptr, wia_ze_ipc_mem_handle_t* handle))           \
  X(zeMemOpenIpcHandle, (wia_ze_context_handle_t context, wia_ze_device_handle_t dev,              \
                         wia_ze_ipc_mem_handle_t handle, uint32_t flags, void** ptr))              \
  X(zeMemCloseIpcHandle, (wia_ze_context_handle_t context, const void* ptr))

#define WIA_ZE_DECLARE_PFN(name, params) typedef wia_ze_result_t(*wia_PFN_##name) params;
WIA_ZE_ENTRIES(WIA_ZE_DECLARE_PFN)
#undef WIA_ZE_DECLARE_PFN

#ifdef __cplusplus
}
#endif

#endif /* WIA_ZE_API_H */
