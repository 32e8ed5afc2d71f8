// SPDX-License-Identifier: Apache-2.0
// "testdev": a small, self-contained device provider (CPU memory, one
// worker thread per stream) that is correct unless a WIA_TESTDEV_DEFECT_*
// macro injects exactly one defect. tests.cmake builds it once per defect
// so the conformance self-tests can check that wia-conformance flags each
// defect with the right test ids. Without a defect it must pass L0-L2.
// WIA_TESTDEV_TRANSPORT adds an empty transport table.
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>
#include <wia/provider.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#ifndef WIA_TESTDEV_NAME
#error "WIA_TESTDEV_NAME must name the provider"
#endif

namespace {

constexpr std::uint32_t kAlignment = 64;
constexpr std::uint64_t kTailThreshold = 1ull << 20;

std::uint64_t now_ns() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<std::uint64_t>(ts.tv_sec) * 1000000000ull +
         static_cast<std::uint64_t>(ts.tv_nsec);
}

struct Provider {
  const wia_host_services_v1_t* host = nullptr;
  int devices = 1;
  std::uint64_t limit = 0;  // bytes of device memory per provider
  std::mutex mu;
  std::unordered_map<void*, std::uint64_t> live;  // ptr -> accounted bytes
  std::uint64_t used = 0;

  wia_status_t fail(wia_status_t st, const std::string& message) const {
    host->set_error(host->host_ctx, message.c_str());
    return st;
  }
  bool valid(std::int32_t dev) const { return dev >= 0 && dev < devices; }
  wia_status_t bad_device(const char* call, std::int32_t dev) const {
    return fail(WIA_ERROR_INVALID_DEVICE, std::string(call) + ": no testdev device " +
                                              std::to_string(dev) + " (have " +
                                              std::to_string(devices) + ")");
  }
};

void copy_bytes(void* dst, const void* src, std::uint64_t size) {
  std::memmove(dst, src, size);
#if defined(WIA_TESTDEV_DEFECT_TAIL)
  // Defect: the last 64 bytes of large copies are garbage.
  if (size > kTailThreshold) std::memset(static_cast<char*>(dst) + size - 64, 0xCD, 64);
#else
  (void)kTailThreshold;
#endif
}

struct EventState {
  std::atomic<bool> done{false};
  std::atomic<std::uint64_t> ts{0};
};

struct Event {
  std::int32_t dev = 0;
  std::shared_ptr<EventState> state;  // NULL until recorded
};

class Stream {
 public:
  explicit Stream(std::int32_t dev) : dev_(dev), worker_([this] { run(); }) {}
  ~Stream() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    work_cv_.notify_all();
    worker_.join();
  }
  void enqueue(std::function<void()> op) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      queue_.push_back(std::move(op));
      ++enqueued_;
    }
    work_cv_.notify_one();
  }
  void synchronize() {
    std::unique_lock<std::mutex> lock(mu_);
    done_cv_.wait(lock, [this] { return completed_ == enqueued_; });
  }
  bool idle() {
    std::lock_guard<std::mutex> lock(mu_);
    return completed_ == enqueued_;
  }
  std::int32_t dev() const { return dev_; }

 private:
  void run() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      work_cv_.wait(lock, [this] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stop_ and drained
      std::vector<std::function<void()>> batch;
#if defined(WIA_TESTDEV_DEFECT_LIFO)
      // Defect: let work pile up, then run the pile newest first.
      lock.unlock();
      usleep(2000);
      lock.lock();
      batch.assign(std::make_move_iterator(queue_.begin()), std::make_move_iterator(queue_.end()));
      queue_.clear();
      std::reverse(batch.begin(), batch.end());
#else
      batch.push_back(std::move(queue_.front()));
      queue_.pop_front();
#endif
      lock.unlock();
      for (auto& op : batch) op();
      lock.lock();
      completed_ += batch.size();
      done_cv_.notify_all();
    }
  }

  const std::int32_t dev_;
  std::mutex mu_;
  std::condition_variable work_cv_, done_cv_;
  std::deque<std::function<void()>> queue_;
  std::uint64_t enqueued_ = 0, completed_ = 0;
  bool stop_ = false;
  std::thread worker_;  // last: starts after every member above exists
};

Provider* P(void* ctx) { return static_cast<Provider*>(ctx); }
Stream* S(wia_provider_stream_t s) { return reinterpret_cast<Stream*>(s); }
Event* E(wia_provider_event_t e) { return reinterpret_cast<Event*>(e); }

// No exception crosses the ABI.
template <typename F>
wia_status_t guarded(void* ctx, const char* call, F&& f) noexcept {
  try {
    return f();
  } catch (const std::bad_alloc&) {
    return P(ctx)->fail(WIA_ERROR_OUT_OF_MEMORY, std::string(call) + ": out of host memory");
  } catch (const std::exception& e) {
    return P(ctx)->fail(WIA_ERROR_INTERNAL, std::string(call) + ": " + e.what());
  }
}

bool parse_u64(const char* text, std::uint64_t* out) {
  if (text == nullptr || *text == '\0') return false;
  char* end = nullptr;
  *out = std::strtoull(text, &end, 10);
  return *end == '\0';
}

wia_status_t td_init(const wia_host_services_v1_t* host, void** ctx) {
  if (host == nullptr || ctx == nullptr || host->abi_version < 1) return WIA_ERROR_ABI_MISMATCH;
  try {
    auto p = std::make_unique<Provider>();
    p->host = host;
    // NULL from get_param (an older or stricter core): use the defaults.
    std::uint64_t devices = 1, limit = 512ull << 20;
    const char* text = host->get_param(host->host_ctx, "devices");
    if (text != nullptr && (!parse_u64(text, &devices) || devices > 16))
      return p->fail(WIA_ERROR_CONFIG,
                     std::string("testdev.devices = '") + text + "': expected 0..16");
    text = host->get_param(host->host_ctx, "memory_limit");
    if (text != nullptr && !parse_u64(text, &limit))
      return p->fail(WIA_ERROR_CONFIG,
                     std::string("testdev.memory_limit = '") + text + "': expected bytes");
    p->devices = static_cast<int>(devices);
    p->limit = limit;
    *ctx = p.release();
    return WIA_SUCCESS;
  } catch (...) {
    return WIA_ERROR_OUT_OF_MEMORY;
  }
}

wia_status_t td_fini(void* ctx) {
  auto* p = P(ctx);
  for (auto& [ptr, size] : p->live) std::free(ptr);
  delete p;
  return WIA_SUCCESS;
}

wia_status_t device_count(void* ctx, std::int32_t* count) {
  if (count == nullptr) return P(ctx)->fail(WIA_ERROR_INVALID_ARGUMENT, "device_count: NULL");
  *count = P(ctx)->devices;
  return WIA_SUCCESS;
}

wia_status_t device_props(void* ctx, std::int32_t dev, wia_device_props_v1_t* out) {
  Provider* p = P(ctx);
  if (!p->valid(dev)) return p->bad_device("device_props", dev);
  if (out == nullptr || out->struct_size < sizeof(std::uint32_t))
    return p->fail(WIA_ERROR_INVALID_ARGUMENT, "device_props: bad props struct");
  wia_device_props_v1_t v{};
  v.struct_size = out->struct_size;
  v.type = WIA_DEVICE_CPU;
  std::snprintf(v.name, sizeof(v.name), "testdev %d", dev);
  {
    std::lock_guard<std::mutex> lock(p->mu);
    v.total_memory = p->limit;
    v.free_memory = p->limit - std::min(p->used, p->limit);
  }
  v.numa_node = -1;
  v.flags = WIA_DEVICE_FLAG_HOST_ACCESSIBLE | WIA_DEVICE_FLAG_UNIFIED_ADDRESS;
  v.alignment = kAlignment;
  // Fill no more than the caller's struct holds.
  std::memcpy(out, &v, std::min<std::size_t>(out->struct_size, sizeof(v)));
  return WIA_SUCCESS;
}

wia_status_t mem_alloc(void* ctx, std::int32_t dev, std::uint64_t size, std::uint32_t kind,
                       void** ptr) {
  Provider* p = P(ctx);
  if (!p->valid(dev)) return p->bad_device("mem_alloc", dev);
  if (ptr == nullptr || kind > WIA_MEM_HOST_PINNED)
    return p->fail(WIA_ERROR_INVALID_ARGUMENT, "mem_alloc: NULL ptr or unknown kind");
  std::lock_guard<std::mutex> lock(p->mu);
  if (size > p->limit - std::min(p->used, p->limit))
    return p->fail(WIA_ERROR_OUT_OF_MEMORY,
                   "mem_alloc(" + std::to_string(size) + " B) on testdev " + std::to_string(dev) +
                       ": " + std::to_string(p->limit - p->used) + " B left of memory_limit");
  const std::uint64_t rounded =
      (std::max<std::uint64_t>(size, 1) + kAlignment - 1) / kAlignment * kAlignment;
  void* mem = std::aligned_alloc(kAlignment, rounded);
  if (mem == nullptr)
    return p->fail(WIA_ERROR_OUT_OF_MEMORY, "mem_alloc(" + std::to_string(size) + " B): malloc");
  p->live[mem] = size;
  p->used += size;
  *ptr = mem;
  return WIA_SUCCESS;
}

wia_status_t mem_free(void* ctx, std::int32_t dev, void* ptr) {
  Provider* p = P(ctx);
  if (!p->valid(dev)) return p->bad_device("mem_free", dev);
  std::lock_guard<std::mutex> lock(p->mu);
  const auto it = p->live.find(ptr);
  if (it == p->live.end())
    return p->fail(WIA_ERROR_INVALID_ARGUMENT,
                   "mem_free on testdev: pointer not allocated here or already freed");
#if defined(WIA_TESTDEV_DEFECT_LEAK)
  // Defect: forgets the pointer but never returns the memory.
  p->live.erase(it);
#else
  p->used -= it->second;
  std::free(it->first);
  p->live.erase(it);
#endif
  return WIA_SUCCESS;
}

wia_status_t memset_sync(void* ctx, std::int32_t dev, void* ptr, std::int32_t value,
                         std::uint64_t size) {
  Provider* p = P(ctx);
  if (!p->valid(dev)) return p->bad_device("memset", dev);
#if defined(WIA_TESTDEV_DEFECT_CRASH)
  // Defect: a wild store, as a driver bug would make.
  void* page = mmap(nullptr, 4096, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  *static_cast<volatile int*>(page) = value;
#endif
  if (size > 0) std::memset(ptr, value, size);
  return WIA_SUCCESS;
}

wia_status_t memcpy_sync(void* ctx, std::int32_t dev, void* dst, const void* src,
                         std::uint64_t size) {
  Provider* p = P(ctx);
  if (!p->valid(dev)) return p->bad_device("memcpy", dev);
#if defined(WIA_TESTDEV_DEFECT_NOCOPY)
  // Defect: claims success, copies nothing.
  (void)dst, (void)src, (void)size;
#else
  if (size > 0) copy_bytes(dst, src, size);
#endif
  return WIA_SUCCESS;
}

wia_status_t stream_create(void* ctx, std::int32_t dev, wia_provider_stream_t* out) {
  Provider* p = P(ctx);
  if (!p->valid(dev)) return p->bad_device("stream_create", dev);
  return guarded(ctx, "stream_create", [&] {
    *out = reinterpret_cast<wia_provider_stream_t>(new Stream(dev));
    return WIA_SUCCESS;
  });
}

wia_status_t stream_destroy(void*, wia_provider_stream_t s) {
  delete S(s);  // the destructor drains the queue
  return WIA_SUCCESS;
}

wia_status_t stream_synchronize(void*, wia_provider_stream_t s) {
  S(s)->synchronize();
  return WIA_SUCCESS;
}

wia_status_t stream_query(void*, wia_provider_stream_t s) {
  return S(s)->idle() ? WIA_SUCCESS : WIA_IN_PROGRESS;
}

wia_status_t memset_async(void* ctx, wia_provider_stream_t s, void* ptr, std::int32_t value,
                          std::uint64_t size) {
  return guarded(ctx, "memset_async", [&] {
    S(s)->enqueue([=] { std::memset(ptr, value, size); });
    return WIA_SUCCESS;
  });
}

wia_status_t memcpy_async(void* ctx, wia_provider_stream_t s, void* dst, const void* src,
                          std::uint64_t size) {
  return guarded(ctx, "memcpy_async", [&] {
    S(s)->enqueue([=] { copy_bytes(dst, src, size); });
    return WIA_SUCCESS;
  });
}

wia_status_t event_create(void* ctx, std::int32_t dev, wia_provider_event_t* out) {
  Provider* p = P(ctx);
  if (!p->valid(dev)) return p->bad_device("event_create", dev);
  return guarded(ctx, "event_create", [&] {
    auto* e = new Event;
    e->dev = dev;
    *out = reinterpret_cast<wia_provider_event_t>(e);
    return WIA_SUCCESS;
  });
}

wia_status_t event_destroy(void*, wia_provider_event_t e) {
  delete E(e);  // a pending record marker keeps its state alive
  return WIA_SUCCESS;
}

wia_status_t event_record(void* ctx, wia_provider_event_t e, wia_provider_stream_t s) {
  if (E(e)->dev != S(s)->dev())
    return P(ctx)->fail(WIA_ERROR_INVALID_HANDLE, "event_record: event and stream of two devices");
  return guarded(ctx, "event_record", [&] {
    auto state = std::make_shared<EventState>();
    E(e)->state = state;
    S(s)->enqueue([state] {
      state->ts = now_ns();
      state->done = true;
    });
    return WIA_SUCCESS;
  });
}

wia_status_t event_query(void*, wia_provider_event_t e) {
#if defined(WIA_TESTDEV_DEFECT_HANG)
  // Defect: never returns.
  for (;;) pause();
#endif
  const auto& st = E(e)->state;
  return st == nullptr || st->done ? WIA_SUCCESS : WIA_IN_PROGRESS;
}

void wait_done(const std::shared_ptr<EventState>& st) {
  while (st != nullptr && !st->done) usleep(50);
}

wia_status_t event_synchronize(void*, wia_provider_event_t e) {
  wait_done(E(e)->state);
  return WIA_SUCCESS;
}

wia_status_t stream_wait_event(void* ctx, wia_provider_stream_t s, wia_provider_event_t e) {
  return guarded(ctx, "stream_wait_event", [&] {
    std::shared_ptr<EventState> st = E(e)->state;
    S(s)->enqueue([st] { wait_done(st); });
    return WIA_SUCCESS;
  });
}

wia_status_t event_elapsed_ms(void* ctx, wia_provider_event_t a, wia_provider_event_t b,
                              float* ms) {
  const auto &sa = E(a)->state, &sb = E(b)->state;
  if (sa == nullptr || sb == nullptr || !sa->done || !sb->done)
    return P(ctx)->fail(WIA_ERROR_INVALID_HANDLE, "event_elapsed_ms: events not completed");
  *ms = static_cast<float>(static_cast<double>(sb->ts - sa->ts) / 1e6);
  return WIA_SUCCESS;
}

wia_status_t launch_host_func(void* ctx, wia_provider_stream_t s, wia_host_fn_t fn, void* data) {
  return guarded(ctx, "launch_host_func", [&] {
    S(s)->enqueue([fn, data] { fn(data); });
    return WIA_SUCCESS;
  });
}

wia_status_t can_access_peer(void* ctx, std::int32_t dev, std::int32_t peer, std::int32_t* can) {
  Provider* p = P(ctx);
  if (!p->valid(dev)) return p->bad_device("can_access_peer", dev);
  if (!p->valid(peer)) return p->bad_device("can_access_peer (peer)", peer);
  *can = 0;  // no CAP_PEER
  return WIA_SUCCESS;
}

const wia_param_decl_v1_t kParams[] = {
    {sizeof(wia_param_decl_v1_t), WIA_PARAM_INT, "devices", "1", "number of test devices", 0, 16},
    {sizeof(wia_param_decl_v1_t), WIA_PARAM_SIZE, "memory_limit", "536870912",
     "device memory of the provider, in bytes", 0, INT64_MAX},
};

const wia_device_ops_v1_t kOps = {
    .struct_size = sizeof(wia_device_ops_v1_t),
    .abi_version = WIA_PROVIDER_ABI_VERSION,
    .caps = WIA_DEVICE_CAP_HOST_FUNC | WIA_DEVICE_CAP_EVENT_TIMING | WIA_DEVICE_CAP_PINNED_HOST,
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
    .enable_peer_access = nullptr,
    .memcpy_peer_async = nullptr,
    .ipc_get_handle = nullptr,
    .ipc_open_handle = nullptr,
    .ipc_close_handle = nullptr,
    .reduce_async = nullptr,
    .scale_async = nullptr,
    .module_load = nullptr,
    .module_unload = nullptr,
    .module_function = nullptr,
    .launch_kernel = nullptr,
    .mem_export_dmabuf = nullptr,
};

#if defined(WIA_TESTDEV_TRANSPORT)
// A transport table of the right shape with no endpoints, so that the
// suite's handling of transport providers (L0 shape checks, L4/L5 listed as
// not implemented) is exercised. Every operation is NOT_SUPPORTED.
wia_status_t tp_endpoint_count(void*, std::int32_t* count) {
  *count = 0;
  return WIA_SUCCESS;
}
wia_status_t tp_endpoint_props(void*, std::int32_t, wia_transport_props_v1_t*) {
  return WIA_ERROR_NOT_SUPPORTED;
}
wia_status_t tp_listen(void*, std::int32_t, void*, wia_listener_t*) {
  return WIA_ERROR_NOT_SUPPORTED;
}
wia_status_t tp_connect(void*, std::int32_t, const void*, std::uint64_t, wia_conn_t*) {
  return WIA_ERROR_NOT_SUPPORTED;
}
wia_status_t tp_accept(void*, wia_listener_t, std::uint64_t*, wia_conn_t*) {
  return WIA_ERROR_NOT_SUPPORTED;
}
wia_status_t tp_close_listener(void*, wia_listener_t) { return WIA_ERROR_NOT_SUPPORTED; }
wia_status_t tp_reg_mr(void*, std::int32_t, const wia_mr_desc_v1_t*, wia_mr_t*) {
  return WIA_ERROR_NOT_SUPPORTED;
}
wia_status_t tp_dereg_mr(void*, wia_mr_t) { return WIA_ERROR_NOT_SUPPORTED; }
wia_status_t tp_isend(void*, wia_conn_t, const void*, std::uint64_t, std::uint64_t, wia_mr_t,
                      wia_request_t*) {
  return WIA_ERROR_NOT_SUPPORTED;
}
wia_status_t tp_irecv(void*, wia_conn_t, void*, std::uint64_t, std::uint64_t, wia_mr_t,
                      wia_request_t*) {
  return WIA_ERROR_NOT_SUPPORTED;
}
wia_status_t tp_test(void*, wia_request_t, std::int32_t*, std::uint64_t*) {
  return WIA_ERROR_NOT_SUPPORTED;
}
wia_status_t tp_close(void*, wia_conn_t) { return WIA_ERROR_NOT_SUPPORTED; }

const wia_transport_ops_v1_t kTransportOps = {
    .struct_size = sizeof(wia_transport_ops_v1_t),
    .abi_version = WIA_PROVIDER_ABI_VERSION,
    .caps = 0,
    .must_understand = 0,
    .endpoint_count = tp_endpoint_count,
    .endpoint_props = tp_endpoint_props,
    .listen = tp_listen,
    .connect = tp_connect,
    .accept = tp_accept,
    .close_listener = tp_close_listener,
    .reg_mr = tp_reg_mr,
    .dereg_mr = tp_dereg_mr,
    .isend = tp_isend,
    .irecv = tp_irecv,
    .test = tp_test,
    .close = tp_close,
    .mr_rkey = nullptr,
    .put = nullptr,
    .get = nullptr,
    .send_inline = nullptr,
    .recv_inline = nullptr,
    .wait_fds = nullptr,
};
constexpr std::uint64_t kProviderCaps = WIA_PROVIDER_CAP_DEVICE | WIA_PROVIDER_CAP_TRANSPORT;
constexpr const wia_transport_ops_v1_t* kTransport = &kTransportOps;
#else
constexpr std::uint64_t kProviderCaps = WIA_PROVIDER_CAP_DEVICE;
constexpr const wia_transport_ops_v1_t* kTransport = nullptr;
#endif

}  // namespace

extern "C" {
WIA_PROVIDER_EXPORT extern const wia_provider_v1_t wia_provider_v1;
const wia_provider_v1_t wia_provider_v1 = {
    .struct_size = sizeof(wia_provider_v1_t),
    .abi_version = WIA_PROVIDER_ABI_VERSION,
    .name = WIA_TESTDEV_NAME,
    .version = "1.0-test",
    .caps = kProviderCaps,
    .host_services_version = WIA_HOST_SERVICES_VERSION,
    .num_params = sizeof(kParams) / sizeof(kParams[0]),
    .params = kParams,
    .init = td_init,
    .fini = td_fini,
    .device = &kOps,
    .transport = kTransport,
};
}
