// SPDX-License-Identifier: Apache-2.0
// The `host` provider's tables and devices: its parameters, init/fini, the
// virtual devices (NUMA nodes, memory facts, properties, peer access) and
// the descriptor the core loads. Memory is in host_memory.cpp, IPC in
// host_ipc.cpp, streams and events in host_stream.cpp.
//
// The `host` provider: CPU memory presented as N virtual devices.
//
// It is the embedded default device provider and the reference
// implementation of the device half of the ABI: every optional capability
// is offered, so the core's paths (peer copies, IPC, on-device reduction,
// events with timing) can all be exercised without accelerators.
//
// Decisions worth knowing (see also host_provider.hpp and the files above):
//  - Devices: one per NUMA node by default (host.devices overrides; more
//    devices than nodes share nodes round-robin). On multi-node machines
//    device memory prefers its node (mbind MPOL_PREFERRED).
//  - Device memory comes from a per-device memfd "arena", mapped MAP_SHARED
//    one allocation per mapping, so that any allocation can be exported to
//    another process (ipc_get_handle) without a descriptor per allocation.
//    Allocations are page-granular and page-aligned; the reported
//    alignment, 64, is the guarantee for both memory kinds (pinned host
//    memory below 256 KiB comes from posix_memalign(64)).
//  - Device memory is not inherited by fork() (MADV_DONTFORK), like GPU
//    memory: a forked child must not silently share writable buffers.
//  - Memory is committed lazily, like malloc: a huge allocation succeeds
//    when the OS would let malloc succeed, and first touch pays the page
//    faults. Callers that care pre-fault and reuse buffers.
//  - "Pinned" host memory is ordinary memory (no mlock): nothing DMAs here,
//    and RLIMIT_MEMLOCK would make large allocations fail for no benefit.
//  - host.memory_limit caps WIA_MEM_DEVICE bytes per device (the quantity a
//    GPU would run out of); pinned host memory does not count against it.
#include "wia_common/host_messages.hpp"
#include "host_provider.hpp"

#include <dirent.h>
#include <sys/mman.h>
#include <sys/sysinfo.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <sstream>
#include <string>

#include "wia_common/text.hpp"

#ifndef WIA_HOST_VERSION
#define WIA_HOST_VERSION "0.0.0"
#endif

namespace wia::host {

// ----------------------------------------------------------------------------
// Provider helpers

wia_status_t Provider::fail(wia_status_t st, const char* fmt, ...) const noexcept {
  va_list ap;
  va_start(ap, fmt);
  common::host_verror(host, fmt, ap);
  va_end(ap);
  return st;
}

void Provider::log(wia_log_level_t level, const char* fmt, ...) const noexcept {
  va_list ap;
  va_start(ap, fmt);
  common::host_vlog(host, level, fmt, ap);
  va_end(ap);
}

std::uint64_t Provider::now_ns() const noexcept {
  // The core's clock, so event times line up with its profiler.
  if (host != nullptr && host->clock_ns != nullptr) return host->clock_ns(host->host_ctx);
  return static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                        std::chrono::steady_clock::now().time_since_epoch())
                                        .count());
}

namespace {

using common::errno_text;

// --------------------------------------------------------------------------
// Parameters. The core validates values against the declarations before
// init, but a provider must not trust that blindly (a different core, a
// test harness): garbage fails init with WIA_ERROR_CONFIG.

using common::trim;

bool parse_int(const char* text, std::int64_t* out) {
  const std::string t(trim(text));
  if (t.empty()) return false;
  errno = 0;
  char* end = nullptr;
  const long long v = std::strtoll(t.c_str(), &end, 10);
  if (errno != 0 || end == t.c_str() || *end != '\0') return false;
  *out = v;
  return true;
}

bool parse_bool(const char* text, bool* out) {
  std::string t(trim(text));
  for (char& c : t) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (t == "true" || t == "1" || t == "yes" || t == "on") {
    *out = true;
    return true;
  }
  if (t == "false" || t == "0" || t == "no" || t == "off") {
    *out = false;
    return true;
  }
  return false;
}

const char* param_text(const wia_host_services_v1_t* host, const char* key, const char* def) {
  const char* v = host->get_param != nullptr ? host->get_param(host->host_ctx, key) : nullptr;
  return v != nullptr ? v : def;
}

// --------------------------------------------------------------------------
// Topology and memory facts.

std::vector<int> numa_node_ids() {
  std::vector<int> ids;
  DIR* dir = opendir("/sys/devices/system/node");
  if (dir == nullptr) return ids;
  while (const dirent* ent = readdir(dir)) {
    int id = -1;
    char tail = 0;
    // "node<N>" exactly (the directory also holds "online", "possible", ...).
    if (std::sscanf(ent->d_name, "node%d%c", &id, &tail) == 1 && id >= 0) ids.push_back(id);
  }
  closedir(dir);
  std::sort(ids.begin(), ids.end());
  return ids;
}

// Reads "<key>: <n> kB" from a meminfo-style file; 0 when absent. The
// per-node files prefix lines with "Node N ".
std::uint64_t meminfo_bytes(const std::string& path, const std::string& key) {
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    const auto pos = line.find(key + ":");
    if (pos == std::string::npos) continue;
    std::istringstream rest(line.substr(pos + key.size() + 1));
    std::uint64_t kb = 0;
    if (rest >> kb) return kb * 1024;
  }
  return 0;
}

struct MemoryFacts {
  std::uint64_t total = 0;
  std::uint64_t free = 0;
};

MemoryFacts memory_of(const Provider& p, const Device& d) {
  MemoryFacts m;
  if (p.numa_nodes > 1 && d.numa_node >= 0) {
    const std::string path =
        "/sys/devices/system/node/node" + std::to_string(d.numa_node) + "/meminfo";
    m.total = meminfo_bytes(path, "MemTotal");
    m.free = meminfo_bytes(path, "MemFree");
  }
  if (m.total == 0) {
    // One node (or none): the machine's view, where MemAvailable (free plus
    // reclaimable cache) is the honest "free".
    m.total = meminfo_bytes("/proc/meminfo", "MemTotal");
    m.free = meminfo_bytes("/proc/meminfo", "MemAvailable");
    struct sysinfo si {};
    if (m.total == 0 && sysinfo(&si) == 0) {
      m.total = static_cast<std::uint64_t>(si.totalram) * si.mem_unit;
      m.free = static_cast<std::uint64_t>(si.freeram) * si.mem_unit;
    }
  }
  return m;
}

}  // namespace

// --------------------------------------------------------------------------
// Entry points: discovery

wia_status_t device_count(void* ctx, std::int32_t* count) noexcept {
  return guarded(ctx, "device_count", [&](Provider& p) -> wia_status_t {
    if (count == nullptr) return p.fail(WIA_ERROR_INVALID_ARGUMENT, "device_count: count is NULL");
    *count = static_cast<std::int32_t>(p.devices.size());
    return WIA_SUCCESS;
  });
}

wia_status_t device_props(void* ctx, std::int32_t dev, wia_device_props_v1_t* props) noexcept {
  return guarded(ctx, "device_props", [&](Provider& p) -> wia_status_t {
    if (props == nullptr)
      return p.fail(WIA_ERROR_INVALID_ARGUMENT, "device_props on host device %d: props is NULL",
                    dev);
    if (!p.valid_device(dev))
      return p.fail(WIA_ERROR_INVALID_DEVICE, "device_props: no host device %d (have %zu)", dev,
                    p.devices.size());
    const std::uint32_t caller_size = props->struct_size;
    if (!WIA_ABI_HAS_FIELD(wia_device_props_v1_t, caller_size, type))
      return p.fail(WIA_ERROR_INVALID_ARGUMENT,
                    "device_props on host device %d: struct_size %u is too small", dev,
                    caller_size);
    Device& d = *p.devices[static_cast<std::size_t>(dev)];
    wia_device_props_v1_t full{};
    full.struct_size = caller_size;
    full.type = WIA_DEVICE_CPU;
    std::snprintf(full.name, sizeof(full.name), "%s", d.name.c_str());
    const MemoryFacts m = memory_of(p, d);
    full.total_memory = m.total;
    full.free_memory = m.free;
    if (p.memory_limit != 0) {
      std::lock_guard<std::mutex> lk(d.mu);
      full.total_memory = std::min(full.total_memory, p.memory_limit);
      const std::uint64_t left = p.memory_limit > d.used ? p.memory_limit - d.used : 0;
      full.free_memory = std::min(full.free_memory, left);
    }
    full.numa_node = d.numa_node;
    // Every stream has its own worker thread: a host function that waits
    // holds up that stream alone.
    full.flags = WIA_DEVICE_FLAG_UNIFIED_ADDRESS | WIA_DEVICE_FLAG_WAITING_HOST_FUNC;
    if (p.host_accessible) full.flags |= WIA_DEVICE_FLAG_HOST_ACCESSIBLE;
    full.alignment = kAlignment;
    // Fill only what the caller's (possibly older, shorter) struct holds.
    std::memcpy(props, &full, std::min<std::size_t>(caller_size, sizeof(full)));
    return WIA_SUCCESS;
  });
}

// --------------------------------------------------------------------------
// Entry points: peers

wia_status_t can_access_peer(void* ctx, std::int32_t dev, std::int32_t peer,
                             std::int32_t* can_access) noexcept {
  return guarded(ctx, "can_access_peer", [&](Provider& p) -> wia_status_t {
    if (can_access == nullptr)
      return p.fail(WIA_ERROR_INVALID_ARGUMENT, "can_access_peer: can_access is NULL");
    *can_access = 0;
    if (!p.valid_device(dev) || !p.valid_device(peer))
      return p.fail(WIA_ERROR_INVALID_DEVICE,
                    "can_access_peer: device pair %d -> %d out of range (have %zu)", dev, peer,
                    p.devices.size());
    // All host devices share one address space. A device is not its own
    // peer (as cudaDeviceCanAccessPeer answers).
    *can_access = (p.peer_access && dev != peer) ? 1 : 0;
    return WIA_SUCCESS;
  });
}

wia_status_t enable_peer_access(void* ctx, std::int32_t dev, std::int32_t peer) noexcept {
  return guarded(ctx, "enable_peer_access", [&](Provider& p) -> wia_status_t {
    if (!p.valid_device(dev) || !p.valid_device(peer))
      return p.fail(WIA_ERROR_INVALID_DEVICE,
                    "enable_peer_access: device pair %d -> %d out of range (have %zu)", dev, peer,
                    p.devices.size());
    if (!p.peer_access)
      return p.fail(WIA_ERROR_NOT_SUPPORTED,
                    "enable_peer_access from host device %d to %d: peer access is disabled "
                    "(host.peer_access=false)",
                    dev, peer);
    if (dev == peer)
      return p.fail(WIA_ERROR_INVALID_ARGUMENT,
                    "enable_peer_access: host device %d cannot be its own peer", dev);
    return WIA_SUCCESS;  // nothing to set up; idempotent by construction
  });
}

namespace {

// --------------------------------------------------------------------------
// init / fini

wia_status_t init(const wia_host_services_v1_t* host, void** ctx) noexcept {
  if (host == nullptr || ctx == nullptr) return WIA_ERROR_INVALID_ARGUMENT;
  *ctx = nullptr;
  // Refuse a host table older or shorter than v1 before calling into it.
  if (host->abi_version < WIA_HOST_SERVICES_VERSION ||
      !WIA_ABI_HAS_FIELD(wia_host_services_v1_t, host->struct_size, clock_ns))
    return WIA_ERROR_ABI_MISMATCH;
  try {
    auto p = std::make_unique<Provider>();
    p->host = host;

    std::int64_t devices = 0;
    const char* text = param_text(host, "devices", "0");
    if (!parse_int(text, &devices) || devices < 0 || devices > 64)
      return p->fail(WIA_ERROR_CONFIG,
                     "host.devices = '%s': expected an integer from 0 (one per NUMA node) to 64",
                     text);
    text = param_text(host, "memory_limit", "0");
    if (!common::parse_size(text, &p->memory_limit))
      return p->fail(WIA_ERROR_CONFIG,
                     "host.memory_limit = '%s': expected a size in bytes (e.g. 0, 65536, 64K, 4M, "
                     "1G)",
                     text);
    text = param_text(host, "peer_access", "true");
    if (!parse_bool(text, &p->peer_access))
      return p->fail(WIA_ERROR_CONFIG, "host.peer_access = '%s': expected true or false", text);
    text = param_text(host, "ipc_open", "auto");
    if (std::strcmp(text, "auto") == 0)
      p->ipc_open = Provider::IpcOpen::kAuto;
    else if (std::strcmp(text, "pidfd") == 0)
      p->ipc_open = Provider::IpcOpen::kPidfd;
    else if (std::strcmp(text, "proc") == 0)
      p->ipc_open = Provider::IpcOpen::kProc;
    else
      return p->fail(WIA_ERROR_CONFIG, "host.ipc_open = '%s': expected auto, pidfd or proc", text);
    text = param_text(host, "host_accessible", "true");
    if (!parse_bool(text, &p->host_accessible))
      return p->fail(WIA_ERROR_CONFIG, "host.host_accessible = '%s': expected true or false", text);

    const std::vector<int> nodes = numa_node_ids();
    p->numa_nodes = static_cast<int>(nodes.size());
    const int count = devices > 0 ? static_cast<int>(devices) : std::max(1, p->numa_nodes);
    const bool one_per_node = count == p->numa_nodes;
    for (int i = 0; i < count; ++i) {
      auto d = std::make_unique<Device>();
      d->index = i;
      d->numa_node = nodes.empty() ? -1 : nodes[static_cast<std::size_t>(i) % nodes.size()];
      char name[128];
      if (d->numa_node < 0)
        std::snprintf(name, sizeof(name), count == 1 ? "Host CPU" : "Host CPU %d", i);
      else if (one_per_node)
        std::snprintf(name, sizeof(name), "Host CPU (NUMA %d)", d->numa_node);
      else
        std::snprintf(name, sizeof(name), "Host CPU %d (NUMA %d)", i, d->numa_node);
      d->name = name;
      p->devices.push_back(std::move(d));
    }
    struct sysinfo si {};
    if (sysinfo(&si) == 0)
      p->physical_memory = (static_cast<std::uint64_t>(si.totalram) + si.totalswap) * si.mem_unit;

    p->log(WIA_LOG_INFO,
           "%d device(s) over %d NUMA node(s); memory_limit=%" PRIu64
           " B per device%s; "
           "peer_access=%s",
           count, p->numa_nodes, p->memory_limit, p->memory_limit == 0 ? " (none)" : "",
           p->peer_access ? "true" : "false");
    *ctx = p.release();
    return WIA_SUCCESS;
  } catch (const std::bad_alloc&) {
    if (host->set_error != nullptr) host->set_error(host->host_ctx, "host init: out of memory");
    return WIA_ERROR_OUT_OF_MEMORY;
  } catch (...) {
    if (host->set_error != nullptr)
      host->set_error(host->host_ctx, "host init: unexpected exception");
    return WIA_ERROR_INTERNAL;
  }
}

wia_status_t fini(void* ctx) noexcept {
  auto* p = static_cast<Provider*>(ctx);
  if (p == nullptr || p->magic != Provider::kMagic) return WIA_ERROR_INVALID_ARGUMENT;
  // Workers first: they may still be touching memory freed below.
  destroy_all_streams(*p);
  for (const auto& d : p->devices) {
    std::lock_guard<std::mutex> lk(d->mu);
    if (!d->allocs.empty())
      p->log(WIA_LOG_WARN, "fini: host device %d: freeing %zu allocation(s) never freed", d->index,
             d->allocs.size());
    for (const auto& [base, a] : d->allocs) release(*d, a);
    d->allocs.clear();
    for (const auto& [base, len] : d->imports) munmap(const_cast<void*>(base), len);
    d->imports.clear();
    if (d->arena_fd >= 0) close(d->arena_fd);
    d->arena_fd = -1;
  }
  p->magic = 0;  // a late call with this ctx is refused, not a use of freed state
  delete p;
  return WIA_SUCCESS;
}

// --------------------------------------------------------------------------
// The descriptor

const wia_param_decl_v1_t kParams[] = {
    {sizeof(wia_param_decl_v1_t), WIA_PARAM_INT, "devices", "0",
     "number of virtual CPU devices; 0 = one per NUMA node", 0, 64},
    {sizeof(wia_param_decl_v1_t), WIA_PARAM_SIZE, "memory_limit", "0",
     "cap on device memory per device, in bytes (0 = only the OS limits); exceeding it is "
     "out-of-memory",
     0, std::numeric_limits<std::int64_t>::max()},
    {sizeof(wia_param_decl_v1_t), WIA_PARAM_BOOL, "peer_access", "true",
     "offer direct copies between host devices; false makes the core stage through host memory", 0,
     1},
    {sizeof(wia_param_decl_v1_t), WIA_PARAM_STRING, "ipc_open", "auto",
     "how ipc_open_handle maps another process's memory: 'pidfd' (pidfd_getfd, needs "
     "ptrace-attach rights), 'proc' (reopen /proc/<pid>/fd/<fd>, needs ptrace-read rights), "
     "'auto' (pidfd, then proc)",
     0, 0},
    {sizeof(wia_param_decl_v1_t), WIA_PARAM_BOOL, "host_accessible", "true",
     "announce device memory as host-addressable; false makes the core treat it like accelerator "
     "memory it must not touch (exercises the device paths on machines without accelerators)",
     0, 1},
};

const wia_device_ops_v1_t kDeviceOps = {
    .struct_size = sizeof(wia_device_ops_v1_t),
    .abi_version = WIA_PROVIDER_ABI_VERSION,
    .caps = WIA_DEVICE_CAP_HOST_FUNC | WIA_DEVICE_CAP_EVENT_TIMING | WIA_DEVICE_CAP_PEER |
            WIA_DEVICE_CAP_IPC | WIA_DEVICE_CAP_REDUCE | WIA_DEVICE_CAP_PINNED_HOST,
    .must_understand = 0,
    .device_count = device_count,
    .device_props = device_props,
    .mem_alloc = mem_alloc,
    .mem_free = mem_free,
    .memset = memset_sync,
    .memcpy = memcpy_sync,
    .stream_create = stream_create,
    .stream_destroy = stream_destroy,
    .stream_synchronize = stream_synchronize,
    .stream_query = stream_query,
    .memset_async = memset_async,
    .memcpy_async = memcpy_async,
    .event_create = event_create,
    .event_destroy = event_destroy,
    .event_record = event_record,
    .event_query = event_query,
    .event_synchronize = event_synchronize,
    .stream_wait_event = stream_wait_event,
    .event_elapsed_ms = event_elapsed_ms,
    .launch_host_func = launch_host_func,
    .can_access_peer = can_access_peer,
    .enable_peer_access = enable_peer_access,
    .memcpy_peer_async = memcpy_peer_async,
    .ipc_get_handle = ipc_get_handle,
    .ipc_open_handle = ipc_open_handle,
    .ipc_close_handle = ipc_close_handle,
    .reduce_async = reduce_async,
    .scale_async = nullptr,  // host memory: the core scales it in place itself
    // No device code: a host function on a stream is wia_launch_host_func.
    .module_load = nullptr,
    .module_unload = nullptr,
    .module_function = nullptr,
    .launch_kernel = nullptr,
    .mem_export_dmabuf = nullptr,
};

}  // namespace
}  // namespace wia::host

extern "C" {
WIA_PROVIDER_EXPORT extern const wia_provider_v1_t wia_provider_v1;
const wia_provider_v1_t wia_provider_v1 = {
    .struct_size = sizeof(wia_provider_v1_t),
    .abi_version = WIA_PROVIDER_ABI_VERSION,
    .name = "host",
    .version = WIA_HOST_VERSION,
    .caps = WIA_PROVIDER_CAP_DEVICE,
    .host_services_version = WIA_HOST_SERVICES_VERSION,
    .num_params = sizeof(wia::host::kParams) / sizeof(wia::host::kParams[0]),
    .params = wia::host::kParams,
    .init = wia::host::init,
    .fini = wia::host::fini,
    .device = &wia::host::kDeviceOps,
    .transport = nullptr,
};
}
