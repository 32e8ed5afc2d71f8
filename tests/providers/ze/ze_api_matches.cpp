// SPDX-License-Identifier: Apache-2.0
// providers/ze/ze_api.h (the Level Zero API the ze provider declares itself,
// to build without libze-dev) against Debian's level_zero/ze_api.h: every
// constant, every struct's size and field offsets, and every entry of
// WIA_ZE_ENTRIES, parameter by parameter. The checks are static_asserts, so
// a wrong value fails the build of this test; the run only confirms that it
// was built. The test double (tests/providers/fake-ze) is built from the
// same declarations and so cannot catch such a mistake.
#include <level_zero/ze_api.h>
// clang-format off
#include "ze_api.h"
// clang-format on

#include <doctest/doctest.h>

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "support/abi_canonical_types.hpp"

namespace {

#define WIA_SAME_CONSTANT(name) \
  static_assert(WIA_##name == name, "ze_api.h: WIA_" #name " differs from Level Zero's");
WIA_SAME_CONSTANT(ZE_RESULT_SUCCESS)
WIA_SAME_CONSTANT(ZE_RESULT_NOT_READY)
WIA_SAME_CONSTANT(ZE_RESULT_ERROR_DEVICE_LOST)
WIA_SAME_CONSTANT(ZE_RESULT_ERROR_OUT_OF_HOST_MEMORY)
WIA_SAME_CONSTANT(ZE_RESULT_ERROR_OUT_OF_DEVICE_MEMORY)
WIA_SAME_CONSTANT(ZE_RESULT_ERROR_DEVICE_REQUIRES_RESET)
WIA_SAME_CONSTANT(ZE_RESULT_ERROR_DEVICE_IN_LOW_POWER_STATE)
WIA_SAME_CONSTANT(ZE_RESULT_ERROR_DEPENDENCY_UNAVAILABLE)
WIA_SAME_CONSTANT(ZE_RESULT_ERROR_UNINITIALIZED)
WIA_SAME_CONSTANT(ZE_RESULT_ERROR_UNSUPPORTED_VERSION)
WIA_SAME_CONSTANT(ZE_RESULT_ERROR_UNSUPPORTED_FEATURE)
WIA_SAME_CONSTANT(ZE_RESULT_ERROR_INVALID_ARGUMENT)
WIA_SAME_CONSTANT(ZE_RESULT_ERROR_INVALID_NULL_HANDLE)
WIA_SAME_CONSTANT(ZE_RESULT_ERROR_HANDLE_OBJECT_IN_USE)
WIA_SAME_CONSTANT(ZE_RESULT_ERROR_INVALID_NULL_POINTER)
WIA_SAME_CONSTANT(ZE_RESULT_ERROR_INVALID_SIZE)
WIA_SAME_CONSTANT(ZE_RESULT_ERROR_UNSUPPORTED_SIZE)
WIA_SAME_CONSTANT(ZE_RESULT_ERROR_UNSUPPORTED_ALIGNMENT)
WIA_SAME_CONSTANT(ZE_RESULT_ERROR_INVALID_SYNCHRONIZATION_OBJECT)
WIA_SAME_CONSTANT(ZE_RESULT_ERROR_INVALID_ENUMERATION)
WIA_SAME_CONSTANT(ZE_RESULT_ERROR_OVERLAPPING_REGIONS)
WIA_SAME_CONSTANT(ZE_RESULT_ERROR_UNKNOWN)
WIA_SAME_CONSTANT(ZE_STRUCTURE_TYPE_DEVICE_PROPERTIES)
WIA_SAME_CONSTANT(ZE_STRUCTURE_TYPE_DEVICE_MEMORY_PROPERTIES)
WIA_SAME_CONSTANT(ZE_STRUCTURE_TYPE_CONTEXT_DESC)
WIA_SAME_CONSTANT(ZE_STRUCTURE_TYPE_COMMAND_QUEUE_DESC)
WIA_SAME_CONSTANT(ZE_STRUCTURE_TYPE_EVENT_POOL_DESC)
WIA_SAME_CONSTANT(ZE_STRUCTURE_TYPE_EVENT_DESC)
WIA_SAME_CONSTANT(ZE_STRUCTURE_TYPE_DEVICE_MEM_ALLOC_DESC)
WIA_SAME_CONSTANT(ZE_STRUCTURE_TYPE_HOST_MEM_ALLOC_DESC)
WIA_SAME_CONSTANT(ZE_STRUCTURE_TYPE_DEVICE_PROPERTIES_1_2)
WIA_SAME_CONSTANT(ZE_STRUCTURE_TYPE_DEVICE_EXTERNAL_MEMORY_PROPERTIES)
WIA_SAME_CONSTANT(ZE_STRUCTURE_TYPE_MEMORY_ALLOCATION_PROPERTIES)
WIA_SAME_CONSTANT(ZE_STRUCTURE_TYPE_EXTERNAL_MEMORY_EXPORT_DESC)
WIA_SAME_CONSTANT(ZE_STRUCTURE_TYPE_EXTERNAL_MEMORY_EXPORT_FD)
WIA_SAME_CONSTANT(ZE_EXTERNAL_MEMORY_TYPE_FLAG_DMA_BUF)
WIA_SAME_CONSTANT(ZE_MEMORY_TYPE_DEVICE)
WIA_SAME_CONSTANT(ZE_DEVICE_TYPE_GPU)
WIA_SAME_CONSTANT(ZE_DEVICE_TYPE_CPU)
WIA_SAME_CONSTANT(ZE_COMMAND_QUEUE_MODE_SYNCHRONOUS)
WIA_SAME_CONSTANT(ZE_COMMAND_QUEUE_MODE_ASYNCHRONOUS)
WIA_SAME_CONSTANT(ZE_COMMAND_QUEUE_PRIORITY_NORMAL)
WIA_SAME_CONSTANT(ZE_EVENT_POOL_FLAG_HOST_VISIBLE)
WIA_SAME_CONSTANT(ZE_EVENT_SCOPE_FLAG_HOST)
WIA_SAME_CONSTANT(ZE_MAX_IPC_HANDLE_SIZE)
WIA_SAME_CONSTANT(ZE_MAX_DEVICE_NAME)
WIA_SAME_CONSTANT(ZE_MAX_DEVICE_UUID_SIZE)
#undef WIA_SAME_CONSTANT
static_assert(WIA_ZE_MAKE_VERSION(1, 4) == ZE_MAKE_VERSION(1, 4), "ZE_MAKE_VERSION differs");

// Structs: the same size, and every field at the same offset with the same
// size (the provider fills them and the driver reads them, or back).
#define WIA_SAME_STRUCT(ours, theirs)                                                   \
  static_assert(sizeof(ours) == sizeof(theirs), #ours " has not the size of " #theirs); \
  static_assert(alignof(ours) == alignof(theirs), #ours " has not the alignment of " #theirs);
#define WIA_SAME_FIELD(ours, theirs, field)                           \
  static_assert(offsetof(ours, field) == offsetof(theirs, field),     \
                #ours "." #field " is not where " #theirs " has it"); \
  static_assert(sizeof(ours::field) == sizeof(theirs::field),         \
                #ours "." #field " has not the size " #theirs " gives it");
// The field lists stay as written (clang-format cannot lay out macro calls).
// clang-format off
WIA_SAME_STRUCT(wia_ze_device_properties_t, ze_device_properties_t)
#define F(field) WIA_SAME_FIELD(wia_ze_device_properties_t, ze_device_properties_t, field)
F(stype) F(pNext) F(type) F(vendorId) F(deviceId) F(flags) F(subdeviceId) F(coreClockRate)
F(maxMemAllocSize) F(maxHardwareContexts) F(maxCommandQueuePriority) F(numThreadsPerEU)
F(physicalEUSimdWidth) F(numEUsPerSubslice) F(numSubslicesPerSlice) F(numSlices)
F(timerResolution) F(timestampValidBits) F(kernelTimestampValidBits) F(uuid) F(name)
#undef F
WIA_SAME_STRUCT(wia_ze_device_memory_properties_t, ze_device_memory_properties_t)
#define F(field) \
  WIA_SAME_FIELD(wia_ze_device_memory_properties_t, ze_device_memory_properties_t, field)
F(stype) F(pNext) F(flags) F(maxClockRate) F(maxBusWidth) F(totalSize) F(name)
#undef F
WIA_SAME_STRUCT(wia_ze_context_desc_t, ze_context_desc_t)
#define F(field) WIA_SAME_FIELD(wia_ze_context_desc_t, ze_context_desc_t, field)
F(stype) F(pNext) F(flags)
#undef F
WIA_SAME_STRUCT(wia_ze_command_queue_desc_t, ze_command_queue_desc_t)
#define F(field) WIA_SAME_FIELD(wia_ze_command_queue_desc_t, ze_command_queue_desc_t, field)
F(stype) F(pNext) F(ordinal) F(index) F(flags) F(mode) F(priority)
#undef F
WIA_SAME_STRUCT(wia_ze_event_pool_desc_t, ze_event_pool_desc_t)
#define F(field) WIA_SAME_FIELD(wia_ze_event_pool_desc_t, ze_event_pool_desc_t, field)
F(stype) F(pNext) F(flags) F(count)
#undef F
WIA_SAME_STRUCT(wia_ze_event_desc_t, ze_event_desc_t)
#define F(field) WIA_SAME_FIELD(wia_ze_event_desc_t, ze_event_desc_t, field)
F(stype) F(pNext) F(index) F(signal) F(wait)
#undef F
WIA_SAME_STRUCT(wia_ze_device_mem_alloc_desc_t, ze_device_mem_alloc_desc_t)
#define F(field) WIA_SAME_FIELD(wia_ze_device_mem_alloc_desc_t, ze_device_mem_alloc_desc_t, field)
F(stype) F(pNext) F(flags) F(ordinal)
#undef F
WIA_SAME_STRUCT(wia_ze_host_mem_alloc_desc_t, ze_host_mem_alloc_desc_t)
#define F(field) WIA_SAME_FIELD(wia_ze_host_mem_alloc_desc_t, ze_host_mem_alloc_desc_t, field)
F(stype) F(pNext) F(flags)
#undef F
WIA_SAME_STRUCT(wia_ze_device_external_memory_properties_t, ze_device_external_memory_properties_t)
#define F(field) WIA_SAME_FIELD(wia_ze_device_external_memory_properties_t, \
                                ze_device_external_memory_properties_t, field)
F(stype) F(pNext) F(memoryAllocationImportTypes) F(memoryAllocationExportTypes)
F(imageImportTypes) F(imageExportTypes)
#undef F
WIA_SAME_STRUCT(wia_ze_external_memory_export_desc_t, ze_external_memory_export_desc_t)
#define F(field) \
  WIA_SAME_FIELD(wia_ze_external_memory_export_desc_t, ze_external_memory_export_desc_t, field)
F(stype) F(pNext) F(flags)
#undef F
WIA_SAME_STRUCT(wia_ze_external_memory_export_fd_t, ze_external_memory_export_fd_t)
#define F(field) \
  WIA_SAME_FIELD(wia_ze_external_memory_export_fd_t, ze_external_memory_export_fd_t, field)
F(stype) F(pNext) F(flags) F(fd)
#undef F
WIA_SAME_STRUCT(wia_ze_memory_allocation_properties_t, ze_memory_allocation_properties_t)
#define F(field) \
  WIA_SAME_FIELD(wia_ze_memory_allocation_properties_t, ze_memory_allocation_properties_t, field)
F(stype) F(pNext) F(type) F(id) F(pageSize)
#undef F
WIA_SAME_STRUCT(wia_ze_ipc_mem_handle_t, ze_ipc_mem_handle_t)
WIA_SAME_FIELD(wia_ze_ipc_mem_handle_t, ze_ipc_mem_handle_t, data)
// clang-format on
#undef WIA_SAME_FIELD
#undef WIA_SAME_STRUCT

}  // namespace

// Types, compared in the canonical form of support/abi_canonical_types.hpp:
// each pair of handles and of structs (whose layouts are checked above) is
// one tag, enums passed by value are the 32-bit integers ze_api.h uses.
namespace wia::test {
template <int kKind>
struct StructTag {};
WIA_CANON_AS(wia_ze_driver_handle_t, OpaquePointer<1>)
WIA_CANON_AS(ze_driver_handle_t, OpaquePointer<1>)
WIA_CANON_AS(wia_ze_device_handle_t, OpaquePointer<2>)
WIA_CANON_AS(ze_device_handle_t, OpaquePointer<2>)
WIA_CANON_AS(wia_ze_context_handle_t, OpaquePointer<3>)
WIA_CANON_AS(ze_context_handle_t, OpaquePointer<3>)
WIA_CANON_AS(wia_ze_command_list_handle_t, OpaquePointer<4>)
WIA_CANON_AS(ze_command_list_handle_t, OpaquePointer<4>)
WIA_CANON_AS(wia_ze_event_pool_handle_t, OpaquePointer<5>)
WIA_CANON_AS(ze_event_pool_handle_t, OpaquePointer<5>)
WIA_CANON_AS(wia_ze_event_handle_t, OpaquePointer<6>)
WIA_CANON_AS(ze_event_handle_t, OpaquePointer<6>)
WIA_CANON_AS(wia_ze_ipc_mem_handle_t, IpcHandleBytes)
WIA_CANON_AS(ze_ipc_mem_handle_t, IpcHandleBytes)
WIA_CANON_AS(wia_ze_device_properties_t, StructTag<1>)
WIA_CANON_AS(ze_device_properties_t, StructTag<1>)
WIA_CANON_AS(wia_ze_device_memory_properties_t, StructTag<2>)
WIA_CANON_AS(ze_device_memory_properties_t, StructTag<2>)
WIA_CANON_AS(wia_ze_context_desc_t, StructTag<3>)
WIA_CANON_AS(ze_context_desc_t, StructTag<3>)
WIA_CANON_AS(wia_ze_command_queue_desc_t, StructTag<4>)
WIA_CANON_AS(ze_command_queue_desc_t, StructTag<4>)
WIA_CANON_AS(wia_ze_event_pool_desc_t, StructTag<5>)
WIA_CANON_AS(ze_event_pool_desc_t, StructTag<5>)
WIA_CANON_AS(wia_ze_event_desc_t, StructTag<6>)
WIA_CANON_AS(ze_event_desc_t, StructTag<6>)
WIA_CANON_AS(wia_ze_device_mem_alloc_desc_t, StructTag<7>)
WIA_CANON_AS(ze_device_mem_alloc_desc_t, StructTag<7>)
WIA_CANON_AS(wia_ze_host_mem_alloc_desc_t, StructTag<8>)
WIA_CANON_AS(ze_host_mem_alloc_desc_t, StructTag<8>)
WIA_CANON_AS(wia_ze_device_external_memory_properties_t, StructTag<9>)
WIA_CANON_AS(ze_device_external_memory_properties_t, StructTag<9>)
WIA_CANON_AS(wia_ze_memory_allocation_properties_t, StructTag<10>)
WIA_CANON_AS(ze_memory_allocation_properties_t, StructTag<10>)
WIA_CANON_AS(ze_result_t, std::uint32_t)
WIA_CANON_AS(ze_api_version_t, std::uint32_t)
#undef WIA_CANON_AS
}  // namespace wia::test

namespace {
using wia::test::canon_t;

// Guard against a canonical form that hides a difference.
static_assert(!std::is_same_v<canon_t<wia_ze_event_handle_t>, canon_t<wia_ze_event_pool_handle_t>>);
static_assert(!std::is_same_v<canon_t<wia_ze_context_desc_t*>, canon_t<ze_event_desc_t*>>);
static_assert(!std::is_same_v<canon_t<const wia_ze_event_desc_t*>, canon_t<ze_event_desc_t*>>);

// A compile error here names the two types: wia_PFN_<entry> and Level Zero's.
template <class Ours, class Theirs>
consteval int same_entry() {
  static_assert(std::is_same_v<canon_t<Ours>, canon_t<Theirs>>,
                "an entry of ze_api.h differs from Level Zero's");
  return 1;
}
#define WIA_SAME_ENTRY(name) +same_entry<wia_PFN_##name, decltype(&name)>()
// Every entry of WIA_ZE_ENTRIES, once (kChecked == kEntries below).
constexpr int kChecked = 0 WIA_SAME_ENTRY(zeInit) WIA_SAME_ENTRY(zeDriverGet) WIA_SAME_ENTRY(
    zeDriverGetApiVersion) WIA_SAME_ENTRY(zeDeviceGet) WIA_SAME_ENTRY(zeDeviceGetProperties)
    WIA_SAME_ENTRY(zeDeviceGetMemoryProperties) WIA_SAME_ENTRY(zeDeviceCanAccessPeer)
        WIA_SAME_ENTRY(zeContextCreate) WIA_SAME_ENTRY(zeContextDestroy) WIA_SAME_ENTRY(
            zeCommandListCreateImmediate) WIA_SAME_ENTRY(zeCommandListDestroy)
            WIA_SAME_ENTRY(zeCommandListAppendMemoryCopy) WIA_SAME_ENTRY(
                zeCommandListAppendMemoryFill) WIA_SAME_ENTRY(zeCommandListAppendBarrier)
                WIA_SAME_ENTRY(zeCommandListAppendSignalEvent)
                    WIA_SAME_ENTRY(zeCommandListAppendWaitOnEvents) WIA_SAME_ENTRY(
                        zeCommandListAppendWriteGlobalTimestamp) WIA_SAME_ENTRY(zeEventPoolCreate)
                        WIA_SAME_ENTRY(zeEventPoolDestroy) WIA_SAME_ENTRY(zeEventCreate)
                            WIA_SAME_ENTRY(zeEventDestroy) WIA_SAME_ENTRY(zeEventHostSynchronize)
                                WIA_SAME_ENTRY(zeEventQueryStatus) WIA_SAME_ENTRY(zeEventHostSignal)
                                    WIA_SAME_ENTRY(zeEventHostReset)
                                        WIA_SAME_ENTRY(zeMemAllocDevice)
                                            WIA_SAME_ENTRY(zeMemAllocHost) WIA_SAME_ENTRY(zeMemFree)
                                                WIA_SAME_ENTRY(zeMemGetIpcHandle)
                                                    WIA_SAME_ENTRY(zeMemOpenIpcHandle)
                                                        WIA_SAME_ENTRY(zeMemCloseIpcHandle)
    // Added for mem_export_dmabuf.
    WIA_SAME_ENTRY(zeDeviceGetExternalMemoryProperties) WIA_SAME_ENTRY(zeMemGetAllocProperties);
#undef WIA_SAME_ENTRY

#define WIA_COUNT_ENTRY(name, params) +1
constexpr int kEntries = 0 WIA_ZE_ENTRIES(WIA_COUNT_ENTRY);
#undef WIA_COUNT_ENTRY
static_assert(kChecked == kEntries, "an entry of WIA_ZE_ENTRIES is not checked here");

}  // namespace

TEST_CASE("ze_api.h matches Level Zero's level_zero/ze_api.h (checked while compiling)") {
  MESSAGE("checked " << kEntries << " entries against Level Zero API "
                     << ZE_MAJOR_VERSION(ZE_API_VERSION_CURRENT) << "."
                     << ZE_MINOR_VERSION(ZE_API_VERSION_CURRENT));
  CHECK(kEntries > 0);
  CHECK(sizeof(wia_ze_device_properties_t) == sizeof(ze_device_properties_t));
}
