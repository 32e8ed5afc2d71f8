// SPDX-License-Identifier: Apache-2.0
// The double's one exported symbol, cuGetProcAddress_v2, the gate every
// entry passes, and initialisation, devices and primary contexts.
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string_view>

#include "fake_cuda.hpp"

namespace wia::fake_cuda {
namespace {

thread_local Context* t_current = nullptr;
thread_local bool t_in_host_function = false;

std::atomic<bool> g_initialized{false};
std::atomic<bool> g_device_lost{false};
std::atomic<long> g_calls{0};

Faults parse_faults() {
  Faults f;
  if (const char* list = std::getenv("WIA_FAKE_CUDA_FAULT")) {
    std::string_view rest(list);
    while (!rest.empty()) {
      const std::size_t comma = rest.find(',');
      const std::string_view name = rest.substr(0, comma);
      if (name == "no_device")
        f.no_device = true;
      else if (name == "oom")
        f.oom = true;
      else if (name == "stream_error")
        f.stream_error = true;
      else if (name == "device_lost")
        f.device_lost = true;
      else if (name == "no_dmabuf")
        f.no_dmabuf = true;
      else if (!name.empty())
        diagnose("WIA_FAKE_CUDA_FAULT: unknown fault '" + std::string(name) + "'");
      rest = comma == std::string_view::npos ? std::string_view{} : rest.substr(comma + 1);
    }
  }
  if (const char* after = std::getenv("WIA_FAKE_CUDA_FAULT_AFTER")) f.lost_after = std::atol(after);
  if (const char* dev = std::getenv("WIA_FAKE_CUDA_LOST_DEVICE")) f.lost_device = std::atoi(dev);
  return f;
}

int parse_device_count() {
  const char* text = std::getenv("WIA_FAKE_CUDA_DEVICES");
  if (text == nullptr || *text == '\0') return 2;
  const int n = std::atoi(text);
  return n < 0 ? 0 : (n > 16 ? 16 : n);
}

// Every entry but the error-text ones goes through here. Order matters:
// a lost device is sticky for every call (as after a real illegal-address
// fault, the context is unusable); host functions may not call the driver
// (CUDA returns NOT_PERMITTED); nothing works before cuInit.
CUresult gate(bool needs_init, bool switches_context) {
  if (t_in_host_function) return kErrorNotPermitted;
  Driver& d = driver();
  // One lost device: calls made while its context is current fail (the
  // calls that change the current context still work, as on a machine
  // where one GPU fell off the bus and the others go on).
  const bool on_lost_device = d.faults.lost_device < 0 ||
                              (!switches_context && t_current != nullptr &&
                               t_current->device == d.faults.lost_device);
  if (d.faults.device_lost && on_lost_device) {
    if (g_device_lost.load()) return WIA_CUDA_ERROR_ILLEGAL_ADDRESS;
    if (g_calls.fetch_add(1) >= d.faults.lost_after) {
      g_device_lost = true;
      diagnose("device_lost: every call from now on returns CUDA_ERROR_ILLEGAL_ADDRESS");
      return WIA_CUDA_ERROR_ILLEGAL_ADDRESS;
    }
  }
  if (needs_init && !g_initialized.load()) return WIA_CUDA_ERROR_NOT_INITIALIZED;
  return WIA_CUDA_SUCCESS;
}

// gated<fake_x>::call has fake_x's exact signature; the table below
// converts it to wia_PFN_x, which only compiles when the types agree.
template <auto Impl>
struct gated;
template <typename... Args, CUresult (*Impl)(Args...)>
struct gated<Impl> {
  static CUresult call(Args... args) {
    const void* self = reinterpret_cast<const void*>(Impl);
    const bool needs_init = self != reinterpret_cast<const void*>(&fake_cuInit) &&
                            self != reinterpret_cast<const void*>(&fake_cuDriverGetVersion);
    const bool switches_context = self == reinterpret_cast<const void*>(&fake_cuCtxSetCurrent) ||
                                  self == reinterpret_cast<const void*>(&fake_cuCtxGetCurrent);
    if (const CUresult st = gate(needs_init, switches_context); st != WIA_CUDA_SUCCESS) return st;
    return Impl(args...);
  }
};

struct Entry {
  const char* name;
  void* fn;
};

// cuGetErrorName/String stay ungated: the real driver answers them in
// every state, and a provider needs them most after a failure.
template <typename Pfn>
void* ungated_or_gated(Pfn gated_fn, Pfn plain_fn, const char* name) {
  const bool ungated =
      std::strcmp(name, "cuGetErrorName") == 0 || std::strcmp(name, "cuGetErrorString") == 0;
  return reinterpret_cast<void*>(ungated ? plain_fn : gated_fn);
}

#define WIA_FAKE_CUDA_ENTRY(name, params) \
  {#name, ungated_or_gated<wia_PFN_##name>(&gated<&fake_##name>::call, &fake_##name, #name)},
const Entry kEntries[] = {WIA_CUDA_DRIVER_ENTRIES(WIA_FAKE_CUDA_ENTRY)};
#undef WIA_FAKE_CUDA_ENTRY

bool valid_device(wia_CUdevice dev) { return dev >= 0 && dev < driver().device_count; }

}  // namespace

Driver& driver() {
  static Driver instance;
  return instance;
}

// The faults are read when the library is first used, so that cuInit is
// the first call WIA_FAKE_CUDA_FAULT_AFTER counts.
Driver::Driver() : faults(parse_faults()) {}

Driver::~Driver() {
  // Runs at exit or when the last dlopen handle goes: nothing may outlive
  // the code, so every worker is joined before the memory goes.
  for (auto& ctx : contexts) destroy_context_resources(*ctx);
  streams.clear();
  retired_streams.clear();
  for (auto& entry : allocations) release_allocation(entry.second);
  allocations.clear();
}

Context* current_context() {
  Context* c = t_current;
  return c != nullptr && c->refcount > 0 ? c : nullptr;
}
void set_current_context(Context* ctx) { t_current = ctx; }
bool in_host_function() { return t_in_host_function; }
void set_in_host_function(bool value) { t_in_host_function = value; }

void diagnose(const std::string& message) {
  std::fprintf(stderr, "fake-cuda: %s\n", message.c_str());
}

}  // namespace wia::fake_cuda

using namespace wia::fake_cuda;

extern "C" __attribute__((visibility("default"))) wia_CUresult cuGetProcAddress_v2(
    const char* symbol, void** pfn, int cuda_version, uint64_t flags, int* symbol_status) {
  // CUdriverProcAddressQueryResult: 0 found, 1 no such symbol, 2 the
  // version asked for is older than the first one with this entry.
  if (symbol == nullptr || pfn == nullptr) return WIA_CUDA_ERROR_INVALID_VALUE;
  *pfn = nullptr;
  if (flags != WIA_CU_GET_PROC_ADDRESS_DEFAULT) return WIA_CUDA_ERROR_INVALID_VALUE;
  if (cuda_version < WIA_CUDA_API_VERSION) {
    // The double implements the 12.0 ABI of each entry only; an older
    // request would get a different signature from the real driver.
    if (symbol_status != nullptr) *symbol_status = 2;
    return WIA_CUDA_ERROR_NOT_FOUND;
  }
  for (const Entry& e : kEntries) {
    if (std::strcmp(e.name, symbol) == 0) {
      *pfn = e.fn;
      if (symbol_status != nullptr) *symbol_status = 0;
      return WIA_CUDA_SUCCESS;
    }
  }
  if (symbol_status != nullptr) *symbol_status = 1;
  return WIA_CUDA_ERROR_NOT_FOUND;
}

wia_CUresult fake_cuInit(unsigned int flags) {
  if (flags != 0) return WIA_CUDA_ERROR_INVALID_VALUE;
  Driver& d = driver();
  std::lock_guard<std::mutex> lk(d.mu);
  if (!d.initialized) {
    if (d.faults.no_device) return WIA_CUDA_ERROR_NO_DEVICE;
    d.device_count = parse_device_count();
    if (d.device_count == 0) return WIA_CUDA_ERROR_NO_DEVICE;
    for (int i = 0; i < d.device_count; ++i) {
      d.contexts.push_back(std::make_unique<Context>());
      d.contexts.back()->device = i;
    }
    d.initialized = true;
    g_initialized = true;
  }
  return WIA_CUDA_SUCCESS;
}

wia_CUresult fake_cuDriverGetVersion(int* version) {
  if (version == nullptr) return WIA_CUDA_ERROR_INVALID_VALUE;
  *version = kDriverVersion;
  return WIA_CUDA_SUCCESS;
}

wia_CUresult fake_cuDeviceGetCount(int* count) {
  if (count == nullptr) return WIA_CUDA_ERROR_INVALID_VALUE;
  *count = driver().device_count;
  return WIA_CUDA_SUCCESS;
}

wia_CUresult fake_cuDeviceGet(wia_CUdevice* device, int ordinal) {
  if (device == nullptr) return WIA_CUDA_ERROR_INVALID_VALUE;
  if (!valid_device(ordinal)) return WIA_CUDA_ERROR_INVALID_DEVICE;
  *device = ordinal;
  return WIA_CUDA_SUCCESS;
}

wia_CUresult fake_cuDeviceGetName(char* name, int len, wia_CUdevice dev) {
  if (name == nullptr || len <= 0) return WIA_CUDA_ERROR_INVALID_VALUE;
  if (!valid_device(dev)) return WIA_CUDA_ERROR_INVALID_DEVICE;
  std::snprintf(name, static_cast<std::size_t>(len), "Fake CUDA Device %d", dev);
  return WIA_CUDA_SUCCESS;
}

wia_CUresult fake_cuDeviceTotalMem(size_t* bytes, wia_CUdevice dev) {
  if (bytes == nullptr) return WIA_CUDA_ERROR_INVALID_VALUE;
  if (!valid_device(dev)) return WIA_CUDA_ERROR_INVALID_DEVICE;
  *bytes = kDeviceMemory;
  return WIA_CUDA_SUCCESS;
}

wia_CUresult fake_cuDeviceGetAttribute(int* value, int attribute, wia_CUdevice dev) {
  if (value == nullptr) return WIA_CUDA_ERROR_INVALID_VALUE;
  if (!valid_device(dev)) return WIA_CUDA_ERROR_INVALID_DEVICE;
  switch (attribute) {
    case WIA_CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK:
      *value = 1024;
      break;
    case WIA_CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT:
      *value = 132;
      break;
    case WIA_CU_DEVICE_ATTRIBUTE_PCI_BUS_ID:
      *value = dev;
      break;
    case WIA_CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID:
      *value = 0;
      break;
    case WIA_CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID:
      *value = 0;
      break;
    case WIA_CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING:
      *value = 1;
      break;
    case WIA_CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR:
      *value = 9;
      break;
    case WIA_CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR:
      *value = 0;
      break;
    case WIA_CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED:
      *value = 1;
      break;
    case WIA_CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED:
      *value = driver().faults.no_dmabuf ? 0 : 1;
      break;
    case WIA_CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID:
      *value = 0;
      break;
    default:
      return WIA_CUDA_ERROR_INVALID_VALUE;
  }
  return WIA_CUDA_SUCCESS;
}

wia_CUresult fake_cuDeviceGetPCIBusId(char* bus_id, int len, wia_CUdevice dev) {
  if (bus_id == nullptr || len < 13) return WIA_CUDA_ERROR_INVALID_VALUE;
  if (!valid_device(dev)) return WIA_CUDA_ERROR_INVALID_DEVICE;
  std::snprintf(bus_id, static_cast<std::size_t>(len), "0000:%02X:00.0", dev);
  return WIA_CUDA_SUCCESS;
}

wia_CUresult fake_cuDeviceCanAccessPeer(int* can_access, wia_CUdevice dev, wia_CUdevice peer) {
  if (can_access == nullptr) return WIA_CUDA_ERROR_INVALID_VALUE;
  if (!valid_device(dev) || !valid_device(peer)) return WIA_CUDA_ERROR_INVALID_DEVICE;
  *can_access = dev != peer ? 1 : 0;  // the real driver answers 0 for a device and itself
  return WIA_CUDA_SUCCESS;
}

wia_CUresult fake_cuDevicePrimaryCtxRetain(wia_CUcontext* ctx, wia_CUdevice dev) {
  if (ctx == nullptr) return WIA_CUDA_ERROR_INVALID_VALUE;
  if (!valid_device(dev)) return WIA_CUDA_ERROR_INVALID_DEVICE;
  Driver& d = driver();
  std::lock_guard<std::mutex> lk(d.mu);
  Context* c = d.contexts[static_cast<std::size_t>(dev)].get();
  ++c->refcount;
  *ctx = reinterpret_cast<wia_CUcontext>(c);
  return WIA_CUDA_SUCCESS;
}

wia_CUresult fake_cuDevicePrimaryCtxRelease(wia_CUdevice dev) {
  if (!valid_device(dev)) return WIA_CUDA_ERROR_INVALID_DEVICE;
  Driver& d = driver();
  Context* c = d.contexts[static_cast<std::size_t>(dev)].get();
  {
    std::lock_guard<std::mutex> lk(d.mu);
    if (c->refcount == 0) return WIA_CUDA_ERROR_INVALID_CONTEXT;
    if (--c->refcount > 0) return WIA_CUDA_SUCCESS;
  }
  // The last reference: like the real driver, the context's streams,
  // events, modules and memory go with it (and its worker threads end).
  destroy_context_resources(*c);
  return WIA_CUDA_SUCCESS;
}

wia_CUresult fake_cuCtxSetCurrent(wia_CUcontext ctx) {
  if (ctx != nullptr) {
    Driver& d = driver();
    std::lock_guard<std::mutex> lk(d.mu);
    auto* c = reinterpret_cast<Context*>(ctx);
    bool known = false;
    for (auto& owned : d.contexts) known = known || owned.get() == c;
    if (!known || c->refcount == 0) return WIA_CUDA_ERROR_INVALID_CONTEXT;
  }
  set_current_context(reinterpret_cast<Context*>(ctx));
  return WIA_CUDA_SUCCESS;
}

wia_CUresult fake_cuCtxGetCurrent(wia_CUcontext* ctx) {
  if (ctx == nullptr) return WIA_CUDA_ERROR_INVALID_VALUE;
  *ctx = reinterpret_cast<wia_CUcontext>(current_context());
  return WIA_CUDA_SUCCESS;
}

wia_CUresult fake_cuCtxEnablePeerAccess(wia_CUcontext peer_ctx, unsigned int flags) {
  if (flags != 0) return WIA_CUDA_ERROR_INVALID_VALUE;
  Driver& d = driver();
  std::lock_guard<std::mutex> lk(d.mu);
  Context* self = current_context();
  auto* peer = reinterpret_cast<Context*>(peer_ctx);
  if (self == nullptr || peer == nullptr || peer->refcount == 0)
    return WIA_CUDA_ERROR_INVALID_CONTEXT;
  if (peer == self) return WIA_CUDA_ERROR_INVALID_DEVICE;
  if (!self->peers.insert(peer->device).second) return WIA_CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED;
  return WIA_CUDA_SUCCESS;
}
